//! GPUMemNet (arXiv 2508.19073): a classifier over 8 GB bins of peak
//! memory, one per family, trained by `estimator/train/train.py` on the
//! paper's measurements and shipped as ONNX. Run with tract-onnx.

use crate::features::ACTIVATIONS;
use crate::input::Network;
use once_cell::sync::Lazy;
use tract_onnx::prelude::*;

pub const BIN_MIB: u64 = 8000;
pub const BINS: usize = 6;

type Plan = std::sync::Arc<TypedRunnableModel>;

fn load(bytes: &[u8]) -> Result<Plan, String> {
    tract_onnx::onnx()
        .model_for_read(&mut &bytes[..])
        .and_then(|m| m.into_optimized())
        .and_then(|m| m.into_runnable())
        .map_err(|e| format!("{e:#}"))
}

static CNN: Lazy<Result<Plan, String>> = Lazy::new(|| load(include_bytes!("../models/gpumemnet_cnn.onnx")));
static MLP: Lazy<Result<Plan, String>> = Lazy::new(|| load(include_bytes!("../models/gpumemnet_mlp.onnx")));

/// GPUMemNet's kind groups, as train.py's `kind_group`.
fn group(kind: &str) -> usize {
    let k = kind.to_ascii_lowercase();
    if k.starts_with("conv") {
        0
    } else if k.starts_with("batchnorm") || k == "batch_normalization" {
        1
    } else if k == "dropout" {
        2
    } else if k.contains("pool") {
        3
    } else if k == "linear" {
        4
    } else {
        5
    }
}

/// train.py's `features`: counts by kind, log activations, log activations
/// x batch, log parameters, batch, activation function on the unit circle.
pub fn features(net: &Network, batch: u64, activation: &str) -> [f32; 12] {
    let mut counts = [0f32; 6];
    let mut total = 0f64;
    for l in &net.layers {
        counts[group(&l.kind)] += 1.0;
        total += l.out_elems as f64;
    }
    let a = ACTIVATIONS.iter().position(|x| *x == activation).unwrap_or(ACTIVATIONS.len() - 1);
    let angle = 2.0 * std::f64::consts::PI * a as f64 / ACTIVATIONS.len() as f64;
    let b = batch as f64;
    let tail = [total.ln_1p(), (total * b).ln_1p(), (net.params() as f64).ln_1p(), b, angle.sin(), angle.cos()];
    let mut out = [0f32; 12];
    out[..6].copy_from_slice(&counts);
    for (o, t) in out[6..].iter_mut().zip(tail) {
        *o = t as f32;
    }
    out
}

/// The predicted bin's upper edge in MiB; the last bin ("more than the
/// device") reads as 48000.
pub fn classify(net: &Network, batch: u64, activation: &str, cnn: bool) -> Result<u64, String> {
    let plan = if cnn { &*CNN } else { &*MLP };
    let plan = plan.as_ref().map_err(|e| format!("GPUMemNet model: {e}"))?;
    let x = tract_ndarray::Array2::from_shape_vec((1, 12), features(net, batch, activation).to_vec())
        .map_err(|e| e.to_string())?;
    let out = plan.run(tvec!(Tensor::from(x).into())).map_err(|e| format!("GPUMemNet inference: {e:#}"))?;
    let logits = out[0].to_plain_array_view::<f32>().map_err(|e| e.to_string())?;
    let class = logits
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i)
        .ok_or("GPUMemNet returned no logits")?;
    Ok((class as u64 + 1) * BIN_MIB)
}
