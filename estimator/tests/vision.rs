//! Vision transformers and ConvNeXt from their ONNX exports (data/onnx,
//! made by estimator/train/export_vision.py): estimated from their layers'
//! actual activations, never as language models, and not below what their
//! training needs.
//!
//! No GPU has measured them yet, so the bound comes from a CPU measurement
//! (data/cpu/training-memory.csv, estimator/train/cpu_peaks.py): the peak
//! of live tensor bytes in one Adam step. The same measurement of the
//! paper's CNNs, against their A100 peaks, gives how much more a GPU used
//! than the CPU measurement (after the 700 MiB runtime): the largest such
//! ratio bounds the new rows' GPU peak from above.

mod common;
use carma_estimator::{Settings, estimate, read_bounded_bytes};
use common::*;

#[test]
fn vision_transformers_are_estimated_from_their_layers_above_their_measured_need() {
    let cpu = csv("cpu/training-memory.csv");
    let measured = measured_peaks();
    // How much more an A100 used than the CPU measurement, at worst.
    let mut ratio: f64 = 0.0;
    for r in cpu.iter().filter(|r| !r["workload"].is_empty()) {
        let gpu = measured[&r["workload"]];
        let x = (gpu - 700.0) / num(r, "cpu_peak_mib");
        println!("{} batch {}: A100 {gpu:.0} MiB, CPU {} MiB: ratio {x:.2}", r["model"], r["batch"], r["cpu_peak_mib"]);
        ratio = ratio.max(x);
    }
    assert!(ratio > 1.0, "calibration rows missing: {ratio}");
    let mut checked = 0;
    for r in cpu.iter().filter(|r| r["workload"].is_empty()) {
        let file = data().join(format!("onnx/{}.onnx", r["model"]));
        let bytes = read_bounded_bytes(&file).unwrap();
        let batch = num(r, "batch") as u64;
        let e = estimate(bytes, &r["model"], Some(batch), &Settings::default()).unwrap();
        let bound = 700.0 + ratio * num(r, "cpu_peak_mib");
        println!(
            "{} batch {batch}: estimate {} MiB, bound {bound:.0} MiB ({:.2}x): {}",
            r["model"],
            e.mib,
            e.mib as f64 / bound,
            e.why
        );
        assert_eq!(e.source, "layers", "{}: {}", r["model"], e.why);
        assert!(!e.why.contains("vocabulary"), "{}: taken for a language model: {}", r["model"], e.why);
        assert!(e.mib as f64 >= bound, "{} batch {batch}: {} MiB < {bound:.0} MiB", r["model"], e.mib);
        checked += 1;
    }
    assert_eq!(checked, 6, "vit_b_16, swin_t and convnext_tiny at two batch sizes");
}
