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

/// One H100-measured training peak with one of its model files
/// (data/h100/training-peaks.csv x data/h100/models): a row gives a case
/// per file kind there is for it.
pub struct H100Case {
    pub model: String,
    pub kind: &'static str,
    pub file: String,
    pub batch: u64,
    pub seq: Option<u64>,
    pub precision: &'static str,
    pub measured: f64,
}

impl H100Case {
    pub fn label(&self) -> String {
        format!("{} {} {} batch {}", self.model, self.kind, self.precision, self.batch)
    }
}

pub fn h100_cases() -> Vec<H100Case> {
    let dir = data().join("h100/models");
    let mut out = Vec::new();
    for r in csv("h100/training-peaks.csv") {
        let model = r["model"].clone();
        let batch = num(&r, "batch_size") as u64;
        let precision: &'static str = if r["precision"] == "mixed" { "mixed" } else { "fp32" };
        let measured = num(&r, "nvml_process_peak_mib");
        let seq = r["seq_len"].parse().ok();
        for (kind, file) in [
            ("torchsummary", format!("{model}_{batch}.model")),
            ("onnx", format!("{model}.onnx")),
            ("hf-config", format!("{model}.config.json")),
        ] {
            if dir.join(&file).is_file() {
                out.push(H100Case { model: model.clone(), kind, file, batch, seq, precision, measured });
            }
        }
    }
    out
}
