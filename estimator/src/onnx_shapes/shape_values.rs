//! Operators that make the small integer tensors of shape arithmetic:
//! Shape, ConstantOfShape and Range.

use super::arith::product;
use super::node::{Ins, attr, input, int};
use super::{MAX_VALUE_ELEMS, T, tensor};
use tract_onnx::pb;

pub(super) fn shape(node: &pb::NodeProto, ins: &Ins) -> Option<Vec<T>> {
    let x = input(ins, 0)?;
    let r = x.shape.len() as i64;
    let clamp = |a: i64| (if a < 0 { a + r } else { a }).clamp(0, r) as usize;
    let (s, e) = (clamp(int(node, "start", 0)), clamp(int(node, "end", r)));
    let v = x.shape.get(s..e.max(s))?.to_vec();
    Some(vec![T { shape: vec![v.len() as i64], val: Some(v) }])
}

pub(super) fn constant_of_shape(node: &pb::NodeProto, ins: &Ins) -> Option<Vec<T>> {
    let shape = input(ins, 0)?.val.clone()?;
    // The fill value (default: float 0) matters only for shape arithmetic.
    let fill = attr(node, "value").and_then(|a| tensor(a.t.as_ref()?)).and_then(|t| t.val?.first().copied());
    let n = product(&shape)?;
    let val = fill.filter(|_| (0..=MAX_VALUE_ELEMS as i64).contains(&n)).map(|f| vec![f; n as usize]);
    Some(vec![T { shape, val }])
}

pub(super) fn range(ins: &Ins) -> Option<Vec<T>> {
    let one = |i: usize| -> Option<i64> { input(ins, i)?.val.as_ref().filter(|v| v.len() == 1).map(|v| v[0]) };
    let (start, limit, delta) = (one(0)?, one(1)?, one(2)?);
    if delta == 0 {
        return None;
    }
    let span = limit.checked_sub(start)?;
    let n = span.checked_add(delta - delta.signum())?.checked_div(delta)?.max(0);
    let val = (n <= MAX_VALUE_ELEMS as i64).then(|| (0..n).map(|i| start + i * delta).collect());
    Some(vec![T { shape: vec![n], val }])
}
