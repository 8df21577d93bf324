//! What the estimator's tests share: where the repository's data lives and
//! how its CSV tables read.
#![allow(dead_code)] // each test uses its part

use std::collections::HashMap;
use std::path::PathBuf;

/// The repository root (model files under `data/` are named from it).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn data() -> PathBuf {
    let dir = repo().join("data");
    assert!(dir.join("carma/workloads.csv").is_file(), "no {}: the repository's data/ is missing", dir.display());
    dir
}

/// A table under `data/` as rows of column name → text (`#` lines skipped).
pub fn csv(rel: &str) -> Vec<HashMap<String, String>> {
    let text = std::fs::read_to_string(data().join(rel)).unwrap();
    let mut lines = text.lines().filter(|l| !l.starts_with('#'));
    let header: Vec<String> = lines.next().unwrap().split(',').map(str::to_string).collect();
    lines.map(|l| header.iter().cloned().zip(l.split(',').map(str::to_string)).collect()).collect()
}

pub fn num(r: &HashMap<String, String>, k: &str) -> f64 {
    r[k].parse().unwrap_or_else(|_| panic!("{k} in {r:?}"))
}

/// The paper's measured A100 peak of each workload (`carma/workloads.csv`), MiB.
pub fn measured_peaks() -> HashMap<String, f64> {
    csv("carma/workloads.csv").iter().map(|r| (r["workload"].clone(), num(r, "measured_peak_mib"))).collect()
}
