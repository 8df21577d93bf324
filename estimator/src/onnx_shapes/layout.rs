//! Operators that move or select elements: views (Flatten, Reshape,
//! Transpose, Squeeze), Concat, Gather, Pad, Expand and Slice. Small
//! integer tensors keep their values through them (shape arithmetic).

use super::T;
use super::arith::{axis, broadcast, product, remap};
use super::node::{Ins, input, int, ints};
use tract_onnx::pb;

pub(super) fn flatten(node: &pb::NodeProto, ins: &Ins) -> Option<Vec<T>> {
    let x = input(ins, 0)?;
    let r = x.shape.len() as i64;
    let a = int(node, "axis", 1);
    let a = if a < 0 { a + r } else { a };
    if !(0..=r).contains(&a) {
        return None;
    }
    let (head, tail) = x.shape.split_at(a as usize);
    Some(vec![T::shape(vec![product(head)?, product(tail)?])])
}

pub(super) fn transpose(node: &pb::NodeProto, ins: &Ins) -> Option<Vec<T>> {
    let x = input(ins, 0)?;
    let r = x.shape.len();
    let perm = ints(node, "perm").unwrap_or_else(|| (0..r as i64).rev().collect());
    if perm.len() != r {
        return None;
    }
    let perm: Vec<usize> = perm.iter().map(|&p| axis(p, r)).collect::<Option<_>>()?;
    let shape: Vec<i64> = perm.iter().map(|&p| x.shape[p]).collect();
    // Small integer tensors keep their values (F.pad's pad lists).
    let val = x.val.as_ref().and_then(|v| {
        remap(v, &x.shape, &shape, |out| {
            let mut src = vec![0; r];
            for (j, &p) in perm.iter().enumerate() {
                src[p] = out[j];
            }
            src
        })
    });
    Some(vec![T { shape, val }])
}

pub(super) fn reshape(node: &pb::NodeProto, ins: &Ins) -> Option<Vec<T>> {
    let (x, s) = (input(ins, 0)?, input(ins, 1)?);
    let target = s.val.as_ref()?;
    let keep_zero = int(node, "allowzero", 0) == 1;
    let mut shape: Vec<i64> = target
        .iter()
        .enumerate()
        .map(|(i, &d)| if d == 0 && !keep_zero { x.shape.get(i).copied().unwrap_or(-2) } else { d })
        .collect();
    let total = x.numel()? as i64;
    if shape.iter().any(|&d| d < -1) {
        return None;
    }
    let known = product(&shape.iter().copied().filter(|&d| d != -1).collect::<Vec<_>>())?;
    match shape.iter().filter(|&&d| d == -1).count() {
        0 if known == total => {}
        1 if known > 0 && total % known == 0 => {
            *shape.iter_mut().find(|d| **d == -1)? = total / known;
        }
        _ => return None,
    }
    Some(vec![T { shape, val: x.val.clone() }])
}

/// Unsqueeze and Squeeze: axes from the second input (opset 13) or the attribute.
pub(super) fn squeeze(node: &pb::NodeProto, ins: &Ins) -> Option<Vec<T>> {
    let x = input(ins, 0)?;
    let axes = match input(ins, 1) {
        Some(a) => Some(a.val.clone()?),
        None => ints(node, "axes"),
    };
    let shape = if node.op_type == "Unsqueeze" {
        let axes = axes?;
        let r = x.shape.len() + axes.len();
        let mut ax: Vec<usize> = axes.iter().map(|&a| axis(a, r)).collect::<Option<_>>()?;
        ax.sort_unstable();
        let mut dims = x.shape.iter();
        (0..r).map(|i| if ax.contains(&i) { Some(1) } else { dims.next().copied() }).collect::<Option<_>>()?
    } else {
        let r = x.shape.len();
        match axes {
            Some(axes) => {
                let ax: Vec<usize> = axes.iter().map(|&a| axis(a, r)).collect::<Option<_>>()?;
                x.shape.iter().enumerate().filter(|(i, _)| !ax.contains(i)).map(|(_, &d)| d).collect()
            }
            None => x.shape.iter().copied().filter(|&d| d != 1).collect(),
        }
    };
    Some(vec![T { shape, val: x.val.clone() }])
}

pub(super) fn concat(node: &pb::NodeProto, ins: &Ins) -> Option<Vec<T>> {
    let parts: Vec<&T> = ins.iter().copied().collect::<Option<_>>()?;
    let first = parts.first()?;
    let ax = axis(int(node, "axis", 0), first.shape.len())?;
    let mut shape = first.shape.clone();
    shape[ax] = 0;
    for p in &parts {
        if p.shape.len() != shape.len() {
            return None;
        }
        shape[ax] = shape[ax].checked_add(p.shape[ax])?;
    }
    let val = if shape.len() == 1 {
        parts.iter().try_fold(Vec::new(), |mut v, p| {
            v.extend_from_slice(p.val.as_ref()?);
            Some(v)
        })
    } else {
        None
    };
    Some(vec![T { shape, val }])
}

pub(super) fn gather(node: &pb::NodeProto, ins: &Ins) -> Option<Vec<T>> {
    let (d, idx) = (input(ins, 0)?, input(ins, 1)?);
    let ax = axis(int(node, "axis", 0), d.shape.len())?;
    let mut shape = d.shape[..ax].to_vec();
    shape.extend_from_slice(&idx.shape);
    shape.extend_from_slice(&d.shape[ax + 1..]);
    let val = match (&d.val, &idx.val) {
        (Some(v), Some(i)) if d.shape.len() == 1 => {
            i.iter().map(|&k| v.get(axis(k, v.len())?).copied()).collect::<Option<Vec<i64>>>()
        }
        _ => None,
    };
    Some(vec![T { shape, val }])
}

/// Swin's shifted windows: padding to a multiple of the window, and the
/// attention mask written into a zero tensor.
pub(super) fn pad(ins: &Ins) -> Option<Vec<T>> {
    let x = input(ins, 0)?;
    let r = x.shape.len();
    let pads = input(ins, 1)?.val.clone()?;
    let axes: Vec<usize> = match input(ins, 3) {
        Some(a) => a.val.clone()?.into_iter().map(|a| axis(a, r)).collect::<Option<_>>()?,
        None => (0..r).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return None;
    }
    let mut shape = x.shape.clone();
    for (i, &a) in axes.iter().enumerate() {
        shape[a] = shape[a].checked_add(pads[i])?.checked_add(pads[i + axes.len()])?;
        if shape[a] < 0 {
            return None;
        }
    }
    Some(vec![T::shape(shape)])
}

pub(super) fn expand(ins: &Ins) -> Option<Vec<T>> {
    let (x, s) = (input(ins, 0)?, input(ins, 1)?);
    Some(vec![T::shape(broadcast(&[&x.shape, s.val.as_ref()?])?)])
}

pub(super) fn slice(ins: &Ins) -> Option<Vec<T>> {
    let x = input(ins, 0)?;
    let r = x.shape.len();
    let starts = input(ins, 1)?.val.clone()?;
    let ends = input(ins, 2)?.val.clone()?;
    let axes = match input(ins, 3) {
        Some(a) => a.val.clone()?,
        None => (0..starts.len() as i64).collect(),
    };
    let steps = match input(ins, 4) {
        Some(s) => s.val.clone()?,
        None => vec![1; starts.len()],
    };
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return None;
    }
    let mut shape = x.shape.clone();
    // Per axis: the first source index and the step.
    let mut first_step: Vec<(i64, i64)> = vec![(0, 1); r];
    for i in 0..starts.len() {
        let a = axis(axes[i], r)?;
        let (dim, step) = (shape[a], steps[i]);
        let wrap = |v: i64| if v < 0 { v.saturating_add(dim) } else { v };
        if step > 0 {
            let (s, e) = (wrap(starts[i]).clamp(0, dim), wrap(ends[i]).clamp(0, dim));
            shape[a] = if e > s { (e - s - 1) / step + 1 } else { 0 };
            first_step[a] = (s, step);
        } else if step < 0 {
            // Backwards (F.pad's exports reverse their pad list):
            // from start down to, not including, end.
            let (s, e) = (wrap(starts[i]).clamp(-1, dim - 1), wrap(ends[i]).clamp(-1, dim - 1));
            let back = step.checked_neg()?;
            shape[a] = if s > e { (s - e - 1) / back + 1 } else { 0 };
            first_step[a] = (s, step);
        } else {
            return None;
        }
    }
    let val = x.val.as_ref().and_then(|v| {
        remap(v, &x.shape, &shape, |out| out.iter().zip(&first_step).map(|(&k, &(f, st))| f + k * st).collect())
    });
    Some(vec![T { shape, val }])
}
