//! How the jobs sharing a GPU slow each other, and what the GPU then reads:
//! each job's own slowdown from `carma_placement::slowdown::Model`, the
//! model the plugin's guard predicts with, over the true solo profiles of
//! the jobs on each GPU.

use super::Cluster;
use super::run::Run;
use carma_placement::slowdown::Model;
use std::collections::BTreeMap;

/// The slowdown against running alone as a plain process of each run in
/// `which` (indices into `runs`, in that order): on each GPU, its slowdown
/// among that GPU's jobs; a job on several GPUs goes at its slowest GPU's
/// pace. Only an MPS client pays MPS's own cost (`Model::base`): a job
/// that is not one (exclusive, or on several GPUs) runs as a plain process.
pub(super) fn slowdowns(model: &Model, cl: Cluster, runs: &[Run], which: &[usize]) -> Vec<f64> {
    let mut on: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (k, &i) in which.iter().enumerate() {
        for &g in &runs[i].gpus {
            on.entry(cl.slot(runs[i].node, g)).or_default().push(k);
        }
    }
    let mut out = vec![1.0; which.len()];
    for ks in on.values() {
        let profiles: Vec<_> = ks.iter().map(|&k| runs[which[k]].profile()).collect();
        for (&k, s) in ks.iter().zip(model.slowdowns(&profiles)) {
            let s = if runs[which[k]].mps_client { s } else { s / model.base };
            out[k] = f64::max(out[k], s);
        }
    }
    out
}

/// What a GPU reads `(SM activity, busy)` whose jobs run at these
/// slowdowns: each job's solo SM activity and busy share at its slowed
/// pace (the work it does per second), added up. Time-sliced, that is the
/// share of time each job's kernels hold the GPU; the busy sum leaves out
/// what context switches add to NVML's utilization (two tiny MLPs read
/// 0.89 busy together on the H100, 0.12 alone): only a cap on busy
/// reads a shared GPU's busy share, and profiles are learned alone.
pub(super) fn reading<'a>(jobs: impl Iterator<Item = (&'a Run, f64)>) -> (f64, f64) {
    let (mut sm, mut busy) = (0.0, 0.0);
    for (r, s) in jobs {
        sm += r.sm / s;
        busy += r.busy / s;
    }
    (f64::min(sm, 1.0), f64::min(busy, 1.0))
}
