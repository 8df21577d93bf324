//! Estimator speed on one core: parsing the paper's resnet50 and BERT
//! descriptions and the resnet50/BERT ONNX exports, and inference (the
//! continuous model and GPUMemNet's classifier on tract) on a parsed
//! network. Prints median and p99 of repeated runs.
//! Run: cargo bench -p carma-estimator --bench estimate  (reads the repository's data/)

use carma_estimator::{features, layers_model, listing, onnx, torchsummary};
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data")
}

fn time<T>(name: &str, runs: usize, mut f: impl FnMut() -> T) {
    // Warm up (lazy model loading, caches), then measure.
    for _ in 0..runs.min(10) {
        std::hint::black_box(f());
    }
    let mut t: Vec<Duration> = (0..runs)
        .map(|_| {
            let s = Instant::now();
            std::hint::black_box(f());
            s.elapsed()
        })
        .collect();
    t.sort();
    let p = |q: f64| t[((t.len() - 1) as f64 * q).round() as usize];
    println!("{name:<44} median {:>9.1} us   p99 {:>9.1} us   ({runs} runs)", us(p(0.5)), us(p(0.99)));
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    let summaries = data().join("carma/model-summaries");
    let resnet = std::fs::read_to_string(summaries.join("resnet50_32.model")).expect("data/carma/model-summaries");
    let bert = std::fs::read_to_string(summaries.join("BERT_base.model")).unwrap();
    let resnet_onnx = std::fs::read(data().join("onnx/resnet50.onnx")).unwrap();
    let bert_onnx = std::fs::read(data().join("onnx/bert_base_mlm.onnx")).unwrap();
    println!("parse (text read from memory; file reads excluded)");
    time("torchsummary resnet50_32.model", 2000, || torchsummary::parse(&resnet, "r").unwrap());
    time("module listing BERT_base.model", 2000, || listing::parse(&bert, "b").unwrap());
    time(&format!("ONNX resnet50.onnx ({} KB)", resnet_onnx.len() / 1024), 500, || {
        onnx::parse(&resnet_onnx, "r").unwrap()
    });
    time(&format!("ONNX bert_base_mlm.onnx ({} KB)", bert_onnx.len() / 1024), 100, || {
        onnx::parse(&bert_onnx, "b").unwrap()
    });
    let net = torchsummary::parse(&resnet, "r").unwrap();
    println!("inference (resnet50, batch 128)");
    time("layer model (features + what autograd keeps + formula)", 20000, || {
        let p = features::profile(&net);
        let k = carma_estimator::kept::kept(&net, carma_config::Precision::Fp32);
        layers_model::parts(&p, &k, 700, carma_config::Precision::Fp32).at_batch(128)
    });
    #[cfg(feature = "gpumemnet")]
    {
        let act = features::profile(&net).activation;
        time("GPUMemNet classifier (tract-onnx)", 20000, || {
            carma_estimator::gpumemnet::classify(&net, 128, &act, true).unwrap()
        });
    }
}
