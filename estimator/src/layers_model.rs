//! The continuous estimate for CNNs and MLPs: a fixed runtime part, 16 bytes
//! per parameter (weights, gradients, Adam's two moments) and a per-sample
//! part proportional to the activations autograd keeps. Linear in batch
//! size, as the paper's measurements are. `alpha` (per family) comes from
//! `estimator/models/layers.json`, fitted on GPUMemNet's data by
//! `estimator/train/train.py` with a safety factor.

use crate::features::{Family, Profile};
use once_cell::sync::Lazy;

const MIB: f64 = 1024.0 * 1024.0;

#[derive(Debug, serde::Deserialize)]
struct Shipped {
    version: u32,
    bytes_per_param: f64,
    alpha: Alpha,
}

#[derive(Debug, serde::Deserialize)]
struct Alpha {
    cnn: f64,
    mlp: f64,
}

static SHIPPED: Lazy<Shipped> = Lazy::new(|| {
    let s: Shipped = serde_json::from_str(include_str!("../models/layers.json")).expect("layers.json is valid");
    assert_eq!(s.version, 1, "layers.json version");
    s
});

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Parts {
    pub runtime_mib: u64,
    pub params_mib: f64,
    pub per_sample_mib: f64,
    pub alpha: f64,
}

impl Parts {
    pub fn at_batch(&self, batch: u64) -> u64 {
        (self.runtime_mib as f64 + self.params_mib + self.per_sample_mib * batch as f64).ceil() as u64
    }
}

pub fn parts(p: &Profile, runtime_mib: u64) -> Parts {
    let s = &*SHIPPED;
    let alpha = match p.family {
        Family::Cnn => s.alpha.cnn,
        Family::Mlp | Family::Transformer => s.alpha.mlp,
    };
    Parts {
        runtime_mib,
        params_mib: s.bytes_per_param * p.params as f64 / MIB,
        per_sample_mib: alpha * 4.0 * p.retained_per_sample / MIB,
        alpha,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::KindCounts;

    fn cnn(params: u64, retained: f64) -> Profile {
        Profile {
            family: Family::Cnn,
            params,
            retained_per_sample: retained,
            layers: 1,
            total_activations: 0,
            counts: KindCounts::default(),
            activation: "relu".into(),
        }
    }

    #[test]
    fn linear_and_monotone_in_batch() {
        let parts = parts(&cnn(25_000_000, 30e6), 700);
        let m: Vec<u64> = [1, 2, 32, 64, 96].iter().map(|&b| parts.at_batch(b)).collect();
        assert!(m.windows(2).all(|w| w[0] < w[1]), "{m:?}");
        // equal steps for equal batch increments (up to rounding)
        assert!((m[4] - m[3]).abs_diff(m[3] - m[2]) <= 1, "{m:?}");
        assert!(m[0] > 700 + 381, "runtime and 16 B per parameter come first: {m:?}");
    }

    #[test]
    fn shipped_alphas_are_fitted_values_not_placeholders() {
        let s = &*SHIPPED;
        assert!(s.alpha.cnn > 0.5 && s.alpha.cnn < 3.0, "{}", s.alpha.cnn);
        assert!(s.alpha.mlp > 0.5 && s.alpha.mlp < 5.0, "{}", s.alpha.mlp);
        assert_eq!(s.bytes_per_param, 16.0);
    }
}
