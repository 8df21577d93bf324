//! The readers of a node's inputs and attributes every operator shares.

use super::T;
use tract_onnx::pb;

/// A node's inputs; `None` for an omitted optional input.
pub(super) type Ins<'t> = [Option<&'t T>];

/// Input `i`, when given.
pub(super) fn input<'t>(ins: &Ins<'t>, i: usize) -> Option<&'t T> {
    ins.get(i).copied().flatten()
}

pub(super) fn attr<'n>(node: &'n pb::NodeProto, name: &str) -> Option<&'n pb::AttributeProto> {
    node.attribute.iter().find(|a| a.name == name)
}

pub(super) fn int(node: &pb::NodeProto, name: &str, default: i64) -> i64 {
    attr(node, name).map_or(default, |a| a.i)
}

pub(super) fn ints(node: &pb::NodeProto, name: &str) -> Option<Vec<i64>> {
    attr(node, name).map(|a| a.ints.clone())
}
