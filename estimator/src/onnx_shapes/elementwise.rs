//! Constants and element-wise operators: their output has the broadcast
//! shape of their inputs, and small integer values are computed (shape
//! arithmetic).

use super::arith::{broadcast, zip_vals};
use super::node::{Ins, input};
use super::{T, tensor};
use tract_onnx::pb;

pub(super) fn constant(node: &pb::NodeProto) -> Option<Vec<T>> {
    let a = node.attribute.first()?;
    Some(match a.name.as_str() {
        "value" => vec![tensor(a.t.as_ref()?)?],
        "value_int" => vec![T { shape: vec![], val: Some(vec![a.i]) }],
        "value_ints" => vec![T { shape: vec![a.ints.len() as i64], val: Some(a.ints.clone()) }],
        "value_float" => vec![T::shape(vec![])],
        "value_floats" => vec![T::shape(vec![a.floats.len() as i64])],
        _ => return None,
    })
}

/// Identity, Cast, Neg and Abs: values carried through.
pub(super) fn unary(node: &pb::NodeProto, ins: &Ins) -> Option<Vec<T>> {
    let x = input(ins, 0)?;
    let val = match node.op_type.as_str() {
        "Neg" => x.val.as_ref().and_then(|v| v.iter().map(|a| a.checked_neg()).collect()),
        "Abs" => x.val.as_ref().and_then(|v| v.iter().map(|a| a.checked_abs()).collect()),
        _ => x.val.clone(),
    };
    Some(vec![T { shape: x.shape.clone(), val }])
}

/// Activations and the like: every output of the input's shape, no values.
pub(super) fn same_shape(node: &pb::NodeProto, ins: &Ins) -> Option<Vec<T>> {
    Some(vec![T::shape(input(ins, 0)?.shape.clone()); node.output.len().max(1)])
}

pub(super) fn binary(node: &pb::NodeProto, ins: &Ins) -> Option<Vec<T>> {
    let (a, b) = (input(ins, 0)?, input(ins, 1)?);
    let shape = broadcast(&[&a.shape, &b.shape])?;
    let f: Option<fn(i64, i64) -> Option<i64>> = match node.op_type.as_str() {
        "Add" => Some(|a, b| a.checked_add(b)),
        "Sub" => Some(|a, b| a.checked_sub(b)),
        "Mul" => Some(|a, b| a.checked_mul(b)),
        "Div" => Some(|a, b| a.checked_div(b)),
        "Equal" => Some(|a, b| Some((a == b) as i64)),
        "Max" => Some(|a, b| Some(a.max(b))),
        "Min" => Some(|a, b| Some(a.min(b))),
        // Integer Mod (fmod 0): the sign of the divisor (Swin's
        // padding to a multiple of its window).
        "Mod" => Some(|a: i64, b: i64| {
            let r = a.checked_rem(b)?;
            Some(if r != 0 && (r < 0) != (b < 0) { r + b } else { r })
        }),
        _ => None,
    };
    let val = f.and_then(|f| zip_vals(a, b, f));
    Some(vec![T { shape, val }])
}

/// `Where(condition, a, b)`.
pub(super) fn select(ins: &Ins) -> Option<Vec<T>> {
    let (c, a, b) = (input(ins, 0)?, input(ins, 1)?, input(ins, 2)?);
    let shape = broadcast(&[&c.shape, &a.shape, &b.shape])?;
    let val = (|| {
        let (c, a, b) = (c.val.as_ref()?, a.val.as_ref()?, b.val.as_ref()?);
        let n = c.len().max(a.len()).max(b.len());
        let at = |v: &Vec<i64>, i: usize| if v.len() == 1 { Some(v[0]) } else { v.get(i).copied() };
        (0..n).map(|i| if at(c, i)? != 0 { at(a, i) } else { at(b, i) }).collect()
    })();
    Some(vec![T { shape, val }])
}
