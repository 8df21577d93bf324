//! Reductions over axes, and LayerNormalization's statistics.

use super::T;
use super::arith::axis;
use super::node::{Ins, input, int, ints};
use tract_onnx::pb;

/// The input's shape, and statistics over the axes from `axis` on as
/// further outputs.
pub(super) fn layer_norm(node: &pb::NodeProto, ins: &Ins) -> Option<Vec<T>> {
    let x = input(ins, 0)?;
    let ax = axis(int(node, "axis", -1), x.shape.len())?;
    let stat: Vec<i64> = x.shape.iter().enumerate().map(|(i, &d)| if i < ax { d } else { 1 }).collect();
    let mut out = vec![T::shape(x.shape.clone())];
    out.extend((1..node.output.len()).map(|_| T::shape(stat.clone())));
    Some(out)
}

/// ReduceMean, ReduceSum, ReduceMax and ReduceMin.
pub(super) fn reduce(node: &pb::NodeProto, ins: &Ins) -> Option<Vec<T>> {
    let x = input(ins, 0)?;
    let r = x.shape.len();
    let axes = match input(ins, 1) {
        Some(a) => a.val.clone()?,
        None => ints(node, "axes").unwrap_or_else(|| (0..r as i64).collect()),
    };
    let ax: Vec<usize> = axes.iter().map(|&a| axis(a, r)).collect::<Option<_>>()?;
    let keep = int(node, "keepdims", 1) == 1;
    let shape = x
        .shape
        .iter()
        .enumerate()
        .filter_map(|(i, &d)| if ax.contains(&i) { keep.then_some(1) } else { Some(d) })
        .collect();
    Some(vec![T::shape(shape)])
}
