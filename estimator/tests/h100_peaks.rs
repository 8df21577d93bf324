//! The estimator against Adam training peaks measured per process on an
//! H100 (`data/h100/training-peaks.csv`, NVML, CUDA context included), from
//! the files a user would pass (`data/h100/models/`) with the options a user
//! would give (`--carma-batch-size`, `--carma-seq-len`, `--carma-precision`).
//! Every row must be covered (no estimate under the measured peak) and, per
//! file kind and precision, the median over-provision must be at most 1.15x.
//! Prints every ratio.

mod common;
use carma_estimator::{Settings, estimate, read_bounded_bytes};
use common::*;
use std::collections::BTreeMap;

/// The fixed part of the measured stack (PyTorch 2.11, CUDA 13, H100) is
/// carma.yaml's default `estimator.runtime`: 760 MiB outside PyTorch's
/// allocator (NVML minus torch's reserved bytes: 758–762 MiB on every row,
/// the data's README) plus what the allocator holds at any batch size
/// (cuBLAS and cuDNN workspaces, its first segments): 1 GiB in all.
const RUNTIME_MIB: u64 = carma_config::DEFAULT_RUNTIME_MIB;

use common::H100Case as Case;

fn cases() -> Vec<Case> {
    h100_cases()
}

/// Rows of data/h100/training-peaks.csv and the cases they give (a row
/// gives one case per model file of it in data/h100/models): a missing or
/// renamed file fails the test instead of shrinking it.
const ROWS: usize = 52;
const CASES: usize = 79;

#[test]
fn every_row_covered_and_tight_per_kind_and_precision() {
    let dir = data().join("h100/models");
    let rows = csv("h100/training-peaks.csv").len();
    let cases = cases();
    println!("{rows} rows, {} cases", cases.len());
    assert_eq!(rows, ROWS, "rows of h100/training-peaks.csv");
    // Every row is estimated from at least one of its files, and every file is used.
    for r in csv("h100/training-peaks.csv") {
        let batch = num(&r, "batch_size") as u64;
        assert!(
            cases.iter().any(|c| c.model == r["model"] && c.batch == batch),
            "row {} batch {batch}: no model file in {}",
            r["model"],
            dir.display()
        );
    }
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        assert!(cases.iter().any(|c| c.file == name), "{name} in {} is in no case", dir.display());
    }
    assert_eq!(cases.len(), CASES, "cases run (rows x their model files)");
    let mut ratios: BTreeMap<(&str, &str), Vec<f64>> = BTreeMap::new();
    let mut under = Vec::new();
    for c in cases {
        let mut s = Settings { runtime_mib: RUNTIME_MIB, seq_len: c.seq, ..Settings::default() };
        s.precision = carma_config::Precision::parse(c.precision).unwrap();
        let bytes = read_bounded_bytes(&dir.join(&c.file)).unwrap();
        let e = estimate(bytes, &c.file, Some(c.batch), &s).unwrap_or_else(|err| panic!("{}: {err}", c.file));
        let ratio = e.mib as f64 / c.measured;
        println!(
            "{:<16} {:<12} {:<6} batch {:>3}: estimate {:>6} MiB, measured {:>6.0} MiB, {ratio:.2}x",
            c.model, c.kind, c.precision, c.batch, e.mib, c.measured
        );
        if ratio < 1.0 {
            under.push(format!("{} {} {} batch {}: {ratio:.3}x ({})", c.model, c.kind, c.precision, c.batch, e.why));
        }
        ratios.entry((c.kind, c.precision)).or_default().push(ratio);
    }
    let mut loose = Vec::new();
    for ((kind, precision), r) in &mut ratios {
        r.sort_by(f64::total_cmp);
        let median = if r.len() % 2 == 1 { r[r.len() / 2] } else { (r[r.len() / 2 - 1] + r[r.len() / 2]) / 2.0 };
        println!(
            "{kind:<12} {precision:<6} rows {:>2}: median {median:.2}x, min {:.2}x, max {:.2}x",
            r.len(),
            r[0],
            r[r.len() - 1]
        );
        if median > 1.15 {
            loose.push(format!("{kind} {precision}: median {median:.2}x"));
        }
    }
    assert!(under.is_empty(), "estimates under the measured H100 peak:\n{}", under.join("\n"));
    assert!(loose.is_empty(), "median over-provision above 1.15x: {}", loose.join("; "));
}
