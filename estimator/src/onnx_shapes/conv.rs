//! Convolution, pooling and the batch-wise normalisations that follow them.

use super::T;
use super::node::{Ins, attr, input, int, ints};
use tract_onnx::pb;

pub(super) fn conv(node: &pb::NodeProto, ins: &Ins) -> Option<Vec<T>> {
    let (x, w) = (input(ins, 0)?, input(ins, 1)?);
    let kernel = ints(node, "kernel_shape").unwrap_or_else(|| w.shape.get(2..).unwrap_or(&[]).to_vec());
    let mut shape = vec![*x.shape.first()?, *w.shape.first()?];
    shape.extend(pool_dims(node, &x.shape, &kernel)?);
    Some(vec![T::shape(shape)])
}

/// MaxPool, AveragePool and LpPool (MaxPool's second output: its indices).
pub(super) fn pool(node: &pb::NodeProto, ins: &Ins) -> Option<Vec<T>> {
    let x = input(ins, 0)?;
    let kernel = ints(node, "kernel_shape")?;
    let mut shape = x.shape.get(..2)?.to_vec();
    shape.extend(pool_dims(node, &x.shape, &kernel)?);
    let mut out = vec![T::shape(shape.clone())];
    out.extend((1..node.output.len()).map(|_| T::shape(shape.clone())));
    Some(out)
}

pub(super) fn global_pool(ins: &Ins) -> Option<Vec<T>> {
    let x = input(ins, 0)?;
    let shape = x.shape.iter().enumerate().map(|(i, &d)| if i < 2 { d } else { 1 }).collect();
    Some(vec![T::shape(shape)])
}

/// BatchNormalization and InstanceNormalization: the input's shape, and
/// per-channel statistics as further outputs.
pub(super) fn batch_norm(node: &pb::NodeProto, ins: &Ins) -> Option<Vec<T>> {
    let x = input(ins, 0)?;
    let c = *x.shape.get(1)?;
    let mut out = vec![T::shape(x.shape.clone())];
    out.extend((1..node.output.len()).map(|_| T::shape(vec![c])));
    Some(out)
}

/// The spatial output dims of a convolution or pooling over `x`.
fn pool_dims(node: &pb::NodeProto, x: &[i64], kernel: &[i64]) -> Option<Vec<i64>> {
    let spatial = x.len().checked_sub(2)?;
    if kernel.len() != spatial {
        return None;
    }
    let strides = ints(node, "strides").unwrap_or_else(|| vec![1; spatial]);
    let dil = ints(node, "dilations").unwrap_or_else(|| vec![1; spatial]);
    let pads = ints(node, "pads").unwrap_or_else(|| vec![0; 2 * spatial]);
    let auto = attr(node, "auto_pad").map(|a| a.s.as_slice()).unwrap_or(b"NOTSET");
    let ceil = int(node, "ceil_mode", 0) == 1;
    if strides.len() != spatial || dil.len() != spatial || pads.len() != 2 * spatial {
        return None;
    }
    (0..spatial)
        .map(|i| {
            // i128: hostile attributes cannot overflow.
            let [h, k, s, d] = [x[i + 2], kernel[i], strides[i], dil[i]].map(i128::from);
            let (p0, p1) = (i128::from(pads[i]), i128::from(pads[i + spatial]));
            if s <= 0 || d <= 0 || k <= 0 || p0 < 0 || p1 < 0 {
                return None;
            }
            let out = match auto {
                b"SAME_UPPER" | b"SAME_LOWER" => (h + s - 1) / s,
                b"VALID" | b"NOTSET" | b"" => {
                    let span = h + if auto == b"VALID" { 0 } else { p0 + p1 } - d * (k - 1) - 1;
                    if span < 0 {
                        return None;
                    }
                    (if ceil { (span + s - 1) / s } else { span / s }) + 1
                }
                _ => return None,
            };
            i64::try_from(out).ok()
        })
        .collect()
}
