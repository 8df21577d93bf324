//! The estimate for networks described by their layers (CNNs, MLPs, image
//! transformers): a fixed runtime part, bytes per parameter (weights,
//! gradients, Adam's two moments, autocast's bf16 copies), and a per-sample
//! part: what autograd keeps for the backward pass (`kept.rs`, tensor by
//! tensor, in the job's precision) plus the largest operator's output
//! [`transient`] times. Linear in batch size, as measured.

use crate::features::Profile;
use crate::kept::Kept;
use carma_config::Precision;

const MIB: f64 = 1024.0 * 1024.0;

/// Blocks of the largest operator's output size held at the peak beyond the
/// saved tensors: the gradient arriving at that operator and the one it
/// hands back, and the blocks of that size the caching allocator keeps
/// reserved beside them (cuDNN's workspaces for it; freed blocks of the
/// forward pass that later requests of other sizes cannot reuse), as
/// reserved minus live bytes show (data/h100/training-peaks.csv, the
/// paper's A100 rows). Networks that max-pool their largest activations
/// hold more: their backward pass scatters into a zeroed gradient of the
/// pool's input size.
pub fn transient(k: &Kept) -> f64 {
    if k.max_pools { 7.0 } else { 6.0 }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Parts {
    pub runtime_mib: u64,
    pub params_mib: f64,
    pub per_sample_mib: f64,
    /// What is saved for the backward pass per sample (MiB): what the
    /// rows keep, or a folded table's footer count where that is more.
    pub saved_mib: f64,
    /// The largest single operator output per sample (MiB), which sizes
    /// the gradients in flight; 0 for the analytic transformer model.
    pub largest_mib: f64,
    /// The optimizer step's peak beyond the runtime, once the backward
    /// pass has freed the activations ([`step_bytes`] per parameter), and
    /// what stays alive through it per sample (a language model's logits).
    pub step_mib: f64,
    pub step_per_sample_mib: f64,
}

impl Parts {
    /// The larger of the backward pass's peak and the optimizer step's.
    pub fn at_batch(&self, batch: u64) -> u64 {
        let b = batch as f64;
        let backward = self.params_mib + self.per_sample_mib * b;
        let step = self.step_mib + self.step_per_sample_mib * b;
        (self.runtime_mib as f64 + backward.max(step)).ceil() as u64
    }
}

/// Bytes per parameter at Adam's step: weights, gradients, the two moments
/// and the square-root temporary PyTorch's default (foreach) Adam makes of
/// every second moment at once (`torch._foreach_sqrt(exp_avg_sqs)`): 20 in
/// fp32 and under autocast (whose bf16 weight copies are gone by then),
/// 10 for a bf16 model. It binds where a model's activations are smaller
/// than a quarter of its weights' footprint: large models at short
/// sequences or small batches.
pub fn step_bytes(precision: Precision) -> f64 {
    match precision {
        Precision::Fp32 | Precision::Mixed => 20.0,
        Precision::Bf16 => 10.0,
    }
}

/// Bytes per parameter: fp32 weights, gradients and Adam's two moments
/// (16); under autocast also the bf16 copy of each weight it caches for
/// the forward pass (18); a bf16 model with bf16 Adam state (8).
pub fn param_bytes(precision: Precision) -> f64 {
    match precision {
        Precision::Fp32 => 16.0,
        Precision::Mixed => 18.0,
        Precision::Bf16 => 8.0,
    }
}

/// What [`param_bytes`] counts beyond fp32 weights, gradients and Adam,
/// for an estimate's `why`.
pub fn param_note(precision: Precision) -> &'static str {
    match precision {
        Precision::Mixed => ": fp32 master weights and Adam, bf16 copies",
        Precision::Fp32 | Precision::Bf16 => "",
    }
}

pub fn parts(p: &Profile, k: &Kept, runtime_mib: u64, precision: Precision) -> Parts {
    // Rows folded by a depth limit hide activations; a footer count of
    // every leaf module with parameters does not (fp32 bytes: safe).
    let saved = k.saved_bytes.max(p.param_leaf_floor * 4.0);
    Parts {
        runtime_mib,
        params_mib: param_bytes(precision) * p.params as f64 / MIB,
        per_sample_mib: (saved + transient(k) * k.largest_bytes) / MIB,
        saved_mib: saved / MIB,
        largest_mib: k.largest_bytes / MIB,
        step_mib: step_bytes(precision) * p.params as f64 / MIB,
        step_per_sample_mib: 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::{Family, KindCounts};

    fn cnn(params: u64) -> Profile {
        Profile {
            family: Family::Cnn,
            params,
            param_leaf_floor: 0.0,
            layers: 1,
            total_activations: 0,
            counts: KindCounts::default(),
            activation: "relu".into(),
        }
    }

    #[test]
    fn linear_and_monotone_in_batch() {
        let k = Kept { saved_bytes: 100.0 * MIB, largest_bytes: 3.0 * MIB, half_bytes: 4.0, max_pools: false };
        let parts = parts(&cnn(25_000_000), &k, 700, Precision::Fp32);
        let m: Vec<u64> = [1, 2, 32, 64, 96].iter().map(|&b| parts.at_batch(b)).collect();
        assert!(m.windows(2).all(|w| w[0] < w[1]), "{m:?}");
        // equal steps for equal batch increments (up to rounding)
        assert!((m[4] - m[3]).abs_diff(m[3] - m[2]) <= 1, "{m:?}");
        assert_eq!(parts.per_sample_mib, 100.0 + 6.0 * 3.0);
        assert!(m[0] > 700 + 381, "runtime and 16 B per parameter come first: {m:?}");
    }

    #[test]
    fn autocast_keeps_fp32_master_weights_beside_bf16_copies() {
        assert_eq!(
            (param_bytes(Precision::Fp32), param_bytes(Precision::Mixed), param_bytes(Precision::Bf16)),
            (16.0, 18.0, 8.0)
        );
    }

    #[test]
    fn a_folded_table_is_held_to_its_footer() {
        let k = Kept { saved_bytes: 0.0, largest_bytes: 0.0, half_bytes: 4.0, max_pools: false };
        let p = Profile { param_leaf_floor: 1_000_000.0, ..cnn(0) };
        let parts = parts(&p, &k, 0, Precision::Fp32);
        assert!((parts.per_sample_mib - 4e6 / MIB).abs() < 1e-9);
    }
}
