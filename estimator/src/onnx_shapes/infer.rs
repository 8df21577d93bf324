//! Which function infers each operator's outputs.

use super::node::{Ins, input};
use super::{T, conv, elementwise, layout, matmul, reduce, shape_values};
use tract_onnx::pb;

/// Output tensors of one node, or `None` when unsure.
pub(super) fn infer(node: &pb::NodeProto, ins: &Ins) -> Option<Vec<T>> {
    match node.op_type.as_str() {
        "Constant" => elementwise::constant(node),
        "Identity" | "Cast" | "Neg" | "Abs" => elementwise::unary(node, ins),
        "Relu" | "Sigmoid" | "Tanh" | "Clip" | "Sqrt" | "Gelu" | "Erf" | "Softmax" | "LogSoftmax" | "LeakyRelu"
        | "Elu" | "Selu" | "HardSigmoid" | "HardSwish" | "Exp" | "Log" | "Reciprocal" | "Not" | "Softplus" | "Mish"
        | "PRelu" | "Dropout" => elementwise::same_shape(node, ins),
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Equal" | "Less" | "Greater" | "And" | "Or" | "Max" | "Min" | "Mod" => {
            elementwise::binary(node, ins)
        }
        "Where" => elementwise::select(ins),
        "BatchNormalization" | "InstanceNormalization" => conv::batch_norm(node, ins),
        "Conv" => conv::conv(node, ins),
        "MaxPool" | "AveragePool" | "LpPool" => conv::pool(node, ins),
        "GlobalAveragePool" | "GlobalMaxPool" => conv::global_pool(ins),
        "Gemm" => matmul::gemm(node, ins),
        "MatMul" => matmul::matmul(ins),
        "LayerNormalization" => reduce::layer_norm(node, ins),
        "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" => reduce::reduce(node, ins),
        "Flatten" => layout::flatten(node, ins),
        "Transpose" => layout::transpose(node, ins),
        "Reshape" => layout::reshape(node, ins),
        "Unsqueeze" | "Squeeze" => layout::squeeze(node, ins),
        "Concat" => layout::concat(node, ins),
        "Gather" => layout::gather(node, ins),
        "GatherElements" => Some(vec![T::shape(input(ins, 1)?.shape.clone())]),
        "Pad" => layout::pad(ins),
        "ScatterND" => Some(vec![T::shape(input(ins, 0)?.shape.clone())]),
        "Expand" => layout::expand(ins),
        "Slice" => layout::slice(ins),
        "Shape" => shape_values::shape(node, ins),
        "ConstantOfShape" => shape_values::constant_of_shape(node, ins),
        "Range" => shape_values::range(ins),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx_shapes::arith::broadcast;

    #[test]
    fn broadcasting_and_conv_arithmetic() {
        assert_eq!(broadcast(&[&[3, 1, 5], &[4, 1]]), Some(vec![3, 4, 5]));
        assert_eq!(broadcast(&[&[3], &[4]]), None);
        let conv = pb::NodeProto {
            op_type: "Conv".into(),
            attribute: vec![
                pb::AttributeProto { name: "strides".into(), ints: vec![2, 2], ..Default::default() },
                pb::AttributeProto { name: "pads".into(), ints: vec![3, 3, 3, 3], ..Default::default() },
            ],
            output: vec!["y".into()],
            ..Default::default()
        };
        let x = T::shape(vec![1, 3, 224, 224]);
        let w = T::shape(vec![64, 3, 7, 7]);
        assert_eq!(infer(&conv, &[Some(&x), Some(&w)]).unwrap()[0].shape, vec![1, 64, 112, 112]);
        let unknown = pb::NodeProto { op_type: "FancyNewOp".into(), ..Default::default() };
        assert!(infer(&unknown, &[Some(&x)]).is_none(), "unknown operators defer to tract");
    }

    fn node(op: &str) -> pb::NodeProto {
        pb::NodeProto { op_type: op.into(), output: vec!["y".into()], ..Default::default() }
    }

    fn val(shape: Vec<i64>, v: Vec<i64>) -> T {
        T { shape, val: Some(v) }
    }

    fn one(v: i64) -> T {
        val(vec![], vec![v])
    }

    /// What Swin's export computes its padding and windows with.
    #[test]
    fn range_mod_pad_and_backward_slices() {
        let run = |n: &pb::NodeProto, ins: &[&T]| infer(n, &ins.iter().map(|t| Some(*t)).collect::<Vec<_>>());
        let r = run(&node("Range"), &[&one(0), &one(10), &one(3)]).unwrap();
        assert_eq!(r[0], val(vec![4], vec![0, 3, 6, 9]));
        let r = run(&node("Range"), &[&one(5), &one(0), &one(-2)]).unwrap();
        assert_eq!(r[0], val(vec![3], vec![5, 3, 1]));
        assert!(run(&node("Range"), &[&one(0), &one(1), &one(0)]).is_none(), "a zero step");
        assert!(run(&node("Range"), &[&one(i64::MIN), &one(i64::MAX), &one(1)]).is_none(), "overflow: no panic");
        // Integer Mod takes the divisor's sign (Python's %), as ONNX's fmod=0.
        let m = |a, b| run(&node("Mod"), &[&one(a), &one(b)]).unwrap()[0].val.clone().unwrap()[0];
        assert_eq!((m(-7, 3), m(7, -3), m(7, 3), m(56, 7)), (2, -2, 1, 0));
        // F.pad's pad list, reversed pairwise: a [4, 2] tensor read backwards.
        let x = val(vec![4, 2], (0..8).collect());
        let ints = |v: Vec<i64>| val(vec![v.len() as i64], v);
        let back =
            run(&node("Slice"), &[&x, &ints(vec![-1]), &ints(vec![i64::MIN + 1]), &ints(vec![0]), &ints(vec![-1])]);
        assert_eq!(back.unwrap()[0], val(vec![4, 2], vec![6, 7, 4, 5, 2, 3, 0, 1]));
        let every_other = run(&node("Slice"), &[&x, &ints(vec![3]), &ints(vec![-9]), &ints(vec![0]), &ints(vec![-2])]);
        assert_eq!(every_other.unwrap()[0], val(vec![2, 2], vec![6, 7, 2, 3]));
        let mut t = node("Transpose");
        t.attribute = vec![pb::AttributeProto { name: "perm".into(), ints: vec![1, 0], ..Default::default() }];
        assert_eq!(run(&t, &[&x]).unwrap()[0], val(vec![2, 4], vec![0, 2, 4, 6, 1, 3, 5, 7]));
        let pad = run(&node("Pad"), &[&T::shape(vec![1, 56, 56, 96]), &ints(vec![0, 0, 0, 0, 0, 1, 2, 0])]);
        // ONNX order: every axis's begin, then every axis's end.
        assert_eq!(pad.unwrap()[0].shape, vec![1, 57, 58, 96]);
        assert!(run(&node("Pad"), &[&T::shape(vec![2, 3]), &ints(vec![0, -4, 0, 0])]).is_none(), "a negative size");
    }
}
