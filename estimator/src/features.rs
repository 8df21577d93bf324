//! What a layer list says about training memory: the parameter count, the
//! activation elements autograd keeps per sample, and the network family.
//! The retention rule must match `estimator/train/train.py`, which fits the
//! shipped coefficients with it.

use crate::input::Network;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    Mlp,
    Cnn,
    Transformer,
}

impl Family {
    pub fn name(self) -> &'static str {
        match self {
            Family::Mlp => "mlp",
            Family::Cnn => "cnn",
            Family::Transformer => "transformer",
        }
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Profile {
    pub family: Family,
    pub params: u64,
    /// Elements kept per sample at least, for descriptions whose rows fold
    /// blocks (torchinfo): [`PARAM_LEAF_RETENTION`] per output element of
    /// every leaf module with parameters. 0 where rows are complete.
    pub param_leaf_floor: f64,
    pub layers: usize,
    /// GPUMemNet's features.
    pub total_activations: u64,
    pub counts: KindCounts,
    pub activation: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct KindCounts {
    pub conv: u32,
    pub norm: u32,
    pub dropout: u32,
    pub pool: u32,
    pub linear: u32,
    pub activation: u32,
}

/// The activation functions GPUMemNet's features encode, in its order
/// (`estimator/train/train.py` ACTIVATIONS).
pub const ACTIVATIONS: [&str; 12] =
    ["relu", "gelu", "silu", "leakyrelu", "prelu", "tanh", "softplus", "selu", "elu", "mish", "identity", "none"];

fn group(lower: &str) -> Option<usize> {
    Some(if lower.starts_with("conv") {
        0
    } else if lower.starts_with("batchnorm") || lower == "batch_normalization" || lower.contains("norm") {
        1
    } else if lower == "dropout" {
        2
    } else if lower.contains("pool") {
        3
    } else if lower == "linear" || lower == "gemm" {
        4
    } else if ACTIVATIONS.contains(&lower) || matches!(lower, "relu6" | "sigmoid" | "hardswish" | "softmax") {
        5
    } else {
        return None;
    })
}

/// Elements autograd keeps per output element of a leaf module with
/// parameters, for descriptions that count only those (torchinfo's
/// footer): at least the highest ratio of what [`crate::kept`] counts to
/// that one over the paper's torchsummary tables (a torchinfo test checks).
pub const PARAM_LEAF_RETENTION: f64 = 3.0;

/// Output elements per sample of the layers with parameters.
pub fn param_leaf_elems(net: &Network) -> u64 {
    net.layers.iter().filter(|l| l.params > 0).map(|l| l.out_elems).fold(0u64, u64::saturating_add)
}

pub fn profile(net: &Network) -> Profile {
    let mut total = 0u64;
    let mut counts = [0u32; 6];
    let mut acts: Vec<(String, u32)> = Vec::new();
    for l in &net.layers {
        let lower = l.kind.to_ascii_lowercase();
        total = total.saturating_add(l.out_elems);
        if let Some(g) = group(&lower) {
            counts[g] += 1;
        }
        if ACTIVATIONS.contains(&lower.as_str()) {
            match acts.iter_mut().find(|(k, _)| *k == lower) {
                Some((_, n)) => *n += 1,
                None => acts.push((lower, 1)),
            }
        }
    }
    let activation = acts.into_iter().max_by_key(|(_, n)| *n).map_or_else(|| "none".to_string(), |(k, _)| k);
    let family = if counts[0] > 0 { Family::Cnn } else { Family::Mlp };
    Profile {
        family,
        params: net.params(),
        param_leaf_floor: net.param_leaf_elems.map_or(0.0, |e| PARAM_LEAF_RETENTION * e as f64),
        layers: net.layers.len(),
        total_activations: total,
        counts: KindCounts {
            conv: counts[0],
            norm: counts[1],
            dropout: counts[2],
            pool: counts[3],
            linear: counts[4],
            activation: counts[5],
        },
        activation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::Layer;

    fn layer(kind: &str, out_elems: u64, params: u64) -> Layer {
        Layer { kind: kind.into(), out_elems, params, channels: 0, folded_elems: 0 }
    }

    #[test]
    fn counts_kinds_and_the_common_activation() {
        let net = Network {
            layers: vec![
                layer("Conv2d", 100, 10),
                layer("ReLU", 100, 0),
                layer("MaxPool2d", 25, 0),
                layer("Flatten", 25, 0),
                layer("Dropout", 25, 0),
                layer("Linear", 10, 260),
            ],
            ..Default::default()
        };
        let p = profile(&net);
        assert_eq!(p.family, Family::Cnn);
        assert_eq!(p.params, 270);
        assert_eq!(p.total_activations, 285);
        assert_eq!(p.activation, "relu");
        assert_eq!((p.counts.conv, p.counts.pool, p.counts.dropout, p.counts.linear), (1, 1, 1, 1));
        assert_eq!(p.param_leaf_floor, 0.0);
    }

    #[test]
    fn no_convolution_is_an_mlp() {
        let net = Network { layers: vec![layer("Linear", 10, 110), layer("GELU", 10, 0)], ..Default::default() };
        let p = profile(&net);
        assert_eq!((p.family, p.activation.as_str()), (Family::Mlp, "gelu"));
    }
}
