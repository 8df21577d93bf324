//! Matrix products: Gemm and MatMul (batched, with NumPy's broadcasting).

use super::T;
use super::arith::broadcast;
use super::node::{Ins, input, int};
use tract_onnx::pb;

pub(super) fn gemm(node: &pb::NodeProto, ins: &Ins) -> Option<Vec<T>> {
    let (a, b) = (input(ins, 0)?, input(ins, 1)?);
    if a.shape.len() != 2 || b.shape.len() != 2 {
        return None;
    }
    let m = if int(node, "transA", 0) == 1 { a.shape[1] } else { a.shape[0] };
    let n = if int(node, "transB", 0) == 1 { b.shape[0] } else { b.shape[1] };
    Some(vec![T::shape(vec![m, n])])
}

pub(super) fn matmul(ins: &Ins) -> Option<Vec<T>> {
    let (a, b) = (input(ins, 0)?, input(ins, 1)?);
    let (mut sa, mut sb) = (a.shape.clone(), b.shape.clone());
    let (va, vb) = (sa.len() == 1, sb.len() == 1);
    if va {
        sa.insert(0, 1);
    }
    if vb {
        sb.push(1);
    }
    let (ra, rb) = (sa.len(), sb.len());
    if ra < 2 || rb < 2 || sa[ra - 1] != sb[rb - 2] {
        return None;
    }
    let mut shape = broadcast(&[&sa[..ra - 2], &sb[..rb - 2]]).unwrap_or_default();
    if !va {
        shape.push(sa[ra - 2]);
    }
    if !vb {
        shape.push(sb[rb - 1]);
    }
    Some(vec![T::shape(shape)])
}
