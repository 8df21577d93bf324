//! Validation on the CARMA paper's measured workloads (never used for
//! training): the default estimator must not under-estimate any usable
//! single-GPU row, from the torchsummary and torchinfo tables the paper
//! used or from ONNX exports of the same architectures; its median
//! over-provision must be at most 1.30x.
//! Prints our ratios next to the paper's three estimators.

mod common;
use carma_estimator::{Settings, estimate, read_bounded_bytes};
use common::*;

/// Known-bad summaries (data/README.md).
const SKIP: [(&str, &str); 3] = [
    ("mobilenet_cifar100.model", "known bad: a copy of the efficientnet summary"),
    ("mnist_cnn_64.model", "known bad: made for another batch size"),
    ("dlrm.model", "known bad: the table is for batch 32768, the measured row for batch 8"),
];

struct Row {
    workload: String,
    batch: u64,
    gpus: u32,
    measured: f64,
    paper: [f64; 3],
    summary: String,
    model: String,
}

fn rows() -> Vec<Row> {
    let text = std::fs::read_to_string(data().join("carma/workloads.csv")).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap_or_else(|| panic!("column {name}"));
    let c = [
        "workload",
        "batch_size",
        "gpus",
        "measured_peak_mib",
        "horus_estimate_mib",
        "faketensor_estimate_mib",
        "gpumemnet_estimate_mib",
        "model_summary",
        "model",
    ]
    .map(col);
    lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            Row {
                workload: f[c[0]].into(),
                batch: f[c[1]].parse().unwrap(),
                gpus: f[c[2]].parse().unwrap(),
                measured: f[c[3]].parse().unwrap(),
                paper: [f[c[4]].parse().unwrap(), f[c[5]].parse().unwrap(), f[c[6]].parse().unwrap()],
                summary: f[c[7]].into(),
                model: f[c[8]].into(),
            }
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

fn summarize(name: &str, ratios: &[f64]) -> String {
    let under = ratios.iter().filter(|r| **r < 1.0).count();
    let worst = ratios.iter().cloned().fold(0.0, f64::max);
    format!(
        "{name:<12} median {:.2}x  worst over {:.2}x  under-estimated {under}/{}",
        median(ratios.to_vec()),
        worst,
        ratios.len()
    )
}

#[test]
fn default_estimator_never_underestimates_the_papers_workloads() {
    let dir = data().join("carma/model-summaries");
    let (mut ours, mut paper) = (Vec::new(), [Vec::new(), Vec::new(), Vec::new()]);
    let mut skipped = Vec::new();
    let mut torchinfo = 0;
    println!("{:<30} {:>6} {:>8} {:>6}  source", "workload", "batch", "measured", "ours");
    for r in rows().into_iter().filter(|r| r.gpus == 1) {
        if let Some((_, why)) = SKIP.iter().find(|(f, _)| *f == r.summary) {
            skipped.push(format!("{} ({why})", r.workload));
            continue;
        }
        let path = dir.join(&r.summary);
        let e = estimate(read_bounded_bytes(&path).unwrap(), &r.summary, Some(r.batch), &Settings::default())
            .unwrap_or_else(|e| panic!("{}: {e}", r.workload));
        let ratio = e.mib as f64 / r.measured;
        println!("{:<30} {:>6} {:>8} {:>6}  {} {:.2}x", r.workload, r.batch, r.measured, e.mib, e.source, ratio);
        torchinfo += usize::from(e.format == "torchinfo");
        assert!(ratio >= 1.0, "{}: {} MiB estimated, {} measured", r.workload, e.mib, r.measured);
        ours.push(ratio);
        for (p, est) in paper.iter_mut().zip(r.paper) {
            p.push(est / r.measured);
        }
    }
    println!("skipped: {}", skipped.join(", "));
    println!("{}", summarize("ours", &ours));
    for (name, p) in ["Horus", "FakeTensor", "GPUMemNet"].iter().zip(&paper) {
        println!("{}", summarize(name, p));
    }
    assert!(ours.len() >= 37, "only {} usable rows", ours.len());
    assert_eq!(torchinfo, 2, "UNet and Mask R-CNN from their torchinfo tables");
    // 1.30, not the paper stack's 1.25: the default fixed part (1 GiB) is
    // today's PyTorch 2.x on Hopper (docs/estimator.md), above what the
    // paper's stack kept; learning brings it down to a node's own.
    assert!(median(ours.clone()) <= 1.30, "{}", summarize("ours", &ours));
}

/// The weight-free ONNX exports of the same architectures (data/onnx).
#[test]
fn onnx_exports_never_underestimate_the_same_workloads() {
    let arch = [
        ("resnet50.onnx", "resnet50"),
        ("vgg16.onnx", "vgg16"),
        ("mobilenet_v2.onnx", "mobilenet_v2"),
        ("efficientnet_b0.onnx", "efficientnet_b0"),
        ("inception_v3.onnx", "inception"),
        ("resnet18_cifar100.onnx", "resnet18_cifar100"),
        ("resnet34_cifar100.onnx", "resnet34_cifar100"),
        ("bert_base_mlm.onnx", "BERT_base"),
        ("bert_large_mlm.onnx", "BERT_large"),
    ];
    let rows = rows();
    let mut ratios = Vec::new();
    for (file, model) in arch {
        let bytes = read_bounded_bytes(&data().join("onnx").join(file)).unwrap();
        for r in rows.iter().filter(|r| r.model == model && r.gpus == 1) {
            let e = estimate(bytes.clone(), file, Some(r.batch), &Settings::default())
                .unwrap_or_else(|e| panic!("{file}: {e}"));
            let ratio = e.mib as f64 / r.measured;
            println!(
                "{file:<24} {:<28} batch {:>4} measured {:>6} ours {:>6} {:.2}x  {}",
                r.workload, r.batch, r.measured, e.mib, ratio, e.source
            );
            ratios.push(ratio);
        }
    }
    println!("{}", summarize("ours (ONNX)", &ratios));
    assert_eq!(ratios.len(), 29, "rows matched by architecture");
    assert!(ratios.iter().all(|r| *r >= 1.0), "{}", summarize("ours (ONNX)", &ratios));
}
