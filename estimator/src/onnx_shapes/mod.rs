//! A fast shape walk over an ONNX graph for the operators that exported
//! training networks use. tract's general shape inference solves shapes
//! symbolically, which is slow; this walk evaluates shapes concretely
//! twice, at batch 1 and at batch 3, and a tensor whose shape differs
//! between the two carries the batch. Small integer tensors (shape
//! arithmetic: Shape -> Gather -> Concat -> Reshape) are evaluated too.
//!
//! Anything it does not know — an operator, an attribute, a symbolic
//! dimension other than the batch — makes it return `None`, and the caller
//! falls back to tract. It never guesses.

mod arith;
mod conv;
mod elementwise;
mod infer;
mod layout;
mod matmul;
mod node;
mod reduce;
mod shape_values;

use infer::infer;

use std::collections::HashMap;
use tract_onnx::pb;
use tract_onnx::pb::tensor_shape_proto::dimension::Value as Dim;
use tract_onnx::pb::type_proto::Value as TypeValue;

/// An operator output that carries the batch.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchedOp {
    pub op: String,
    /// Its dims at batch 1.
    pub dims: Vec<u64>,
    /// The batched operators (indices in the walk's list) whose outputs it
    /// consumes; none: it reads only the data batch and weights.
    pub inputs: Vec<usize>,
}

pub struct Walk {
    pub ops: Vec<BatchedOp>,
    /// Elements of the data input at batch 1.
    pub input_elems: Option<u64>,
    /// Elements of weights: graph inputs other than the data, initializers
    /// and constants of more than one element.
    pub params: u64,
    pub fixed_batch: Option<u64>,
}

/// Values of integer tensors up to this many elements are tracked.
const MAX_VALUE_ELEMS: usize = 64;
/// Bounds what a hostile file can make us allocate or compute.
const MAX_RANK: usize = 16;
const MAX_ELEMS: u128 = 1 << 62;

#[derive(Clone, Debug, PartialEq)]
struct T {
    shape: Vec<i64>,
    val: Option<Vec<i64>>,
}

impl T {
    fn shape(shape: Vec<i64>) -> T {
        T { shape, val: None }
    }
    fn numel(&self) -> Option<u64> {
        let n = self.shape.iter().try_fold(1u128, |a, &d| a.checked_mul(u128::try_from(d).ok()?))?;
        (n <= MAX_ELEMS).then_some(n as u64)
    }
}

pub fn walk(graph: &pb::GraphProto, data_input: usize) -> Option<Walk> {
    let data = &graph.input[data_input];
    let dims = input_dims(data)?;
    let fixed_batch = match dims.first()? {
        Dim::DimValue(v) => Some(u64::try_from(*v).ok()?),
        Dim::DimParam(_) => None,
    };
    // The data input's first dimension is the batch whatever the file
    // says (a name or a number); other inputs may name it too.
    let batch_param = match dims.first()? {
        Dim::DimParam(p) => Some(p.as_str()),
        Dim::DimValue(_) => None,
    };
    let index = Index::new(graph);
    let one = Pass::run(graph, &index, data_input, batch_param, 1)?;
    let three = Pass::run(graph, &index, data_input, batch_param, 3)?;
    let mut ops = Vec::new();
    // Which batched operator produced each tensor slot.
    let mut producer: Vec<Option<usize>> = vec![None; index.slots];
    for ((node, outs), ins) in graph.node.iter().zip(&index.node_outs).zip(&index.node_ins) {
        let Some(&out) = outs.first() else { continue };
        let (a, b) = (one.tensors[out].as_ref()?, three.tensors[out].as_ref()?);
        if a.shape != b.shape && node.op_type != "Constant" && node.op_type != "Shape" {
            let dims = a.shape.iter().map(|&d| u64::try_from(d).ok()).collect::<Option<Vec<u64>>>()?;
            let mut inputs: Vec<usize> = ins.iter().flatten().filter_map(|&s| producer[s]).collect();
            inputs.dedup();
            for &o in outs {
                producer[o] = Some(ops.len());
            }
            ops.push(BatchedOp { op: node.op_type.clone(), dims, inputs });
        }
    }
    let input_elems = one.tensors[index.inputs[data_input]].as_ref().and_then(T::numel);
    Some(Walk { ops, input_elems, params: one.params, fixed_batch })
}

fn input_dims(v: &pb::ValueInfoProto) -> Option<Vec<&Dim>> {
    let Some(TypeValue::TensorType(t)) = v.r#type.as_ref()?.value.as_ref() else { return None };
    t.shape.as_ref()?.dim.iter().map(|d| d.value.as_ref()).collect()
}

/// Tensor names resolved to slots once, for both passes.
struct Index {
    slots: usize,
    inits: Vec<usize>,
    inputs: Vec<usize>,
    /// Per node: its inputs (`None`: an omitted optional input) and outputs.
    node_ins: Vec<Vec<Option<usize>>>,
    node_outs: Vec<Vec<usize>>,
}

impl Index {
    fn new(graph: &pb::GraphProto) -> Index {
        let mut names: HashMap<&str, usize> = HashMap::with_capacity(graph.node.len() * 2 + graph.input.len());
        let mut slot = |n| -> usize {
            let next = names.len();
            *names.entry(n).or_insert(next)
        };
        let inits = graph.initializer.iter().map(|t| slot(t.name.as_str())).collect();
        let inputs = graph.input.iter().map(|i| slot(i.name.as_str())).collect();
        let mut node_ins = Vec::with_capacity(graph.node.len());
        let mut node_outs = Vec::with_capacity(graph.node.len());
        for node in &graph.node {
            node_ins.push(node.input.iter().map(|n| (!n.is_empty()).then(|| slot(n))).collect());
            node_outs.push(node.output.iter().map(|n| slot(n)).collect());
        }
        Index { slots: names.len(), inits, inputs, node_ins, node_outs }
    }
}

struct Pass {
    tensors: Vec<Option<T>>,
    params: u64,
}

impl Pass {
    fn run(
        graph: &pb::GraphProto,
        index: &Index,
        data_input: usize,
        batch_param: Option<&str>,
        batch: i64,
    ) -> Option<Pass> {
        let mut p = Pass { tensors: vec![None; index.slots], params: 0 };
        for (init, &slot) in graph.initializer.iter().zip(&index.inits) {
            let t = tensor(init)?;
            p.params = p.params.saturating_add(t.numel()?);
            p.tensors[slot] = Some(t);
        }
        for (i, (input, &slot)) in graph.input.iter().zip(&index.inputs).enumerate() {
            if p.tensors[slot].is_some() {
                continue;
            }
            let shape = input_dims(input)?
                .into_iter()
                .enumerate()
                .map(|(k, d)| match d {
                    _ if i == data_input && k == 0 => Some(batch),
                    Dim::DimValue(v) => Some(*v),
                    Dim::DimParam(s) if Some(s.as_str()) == batch_param => Some(batch),
                    Dim::DimParam(_) => None,
                })
                .collect::<Option<Vec<i64>>>()?;
            let t = T::shape(shape);
            if i != data_input {
                // Weights exported as graph inputs.
                if t.shape.iter().any(|&d| d < 0) {
                    return None;
                }
                p.params = p.params.saturating_add(t.numel()?);
            }
            p.tensors[slot] = Some(t);
        }
        for ((node, in_slots), out_slots) in graph.node.iter().zip(&index.node_ins).zip(&index.node_outs) {
            if !node.domain.is_empty() && node.domain != "ai.onnx" {
                return None;
            }
            let mut ins: Vec<Option<&T>> = Vec::with_capacity(in_slots.len());
            for s in in_slots {
                ins.push(match s {
                    None => None,
                    Some(s) => Some(p.tensors[*s].as_ref()?),
                });
            }
            let outs = infer(node, &ins)?;
            if node.op_type == "Constant" {
                let n = outs.first()?.numel()?;
                if n > 1 {
                    p.params = p.params.saturating_add(n);
                }
            }
            for (&slot, t) in out_slots.iter().zip(outs) {
                if t.shape.len() > MAX_RANK || t.shape.iter().any(|&d| d < 0) {
                    return None;
                }
                t.numel()?;
                p.tensors[slot] = Some(t);
            }
        }
        Some(p)
    }
}

fn tensor(t: &pb::TensorProto) -> Option<T> {
    let shape = t.dims.clone();
    if shape.len() > MAX_RANK || shape.iter().any(|&d| d < 0) {
        return None;
    }
    let mut out = T::shape(shape);
    let n = out.numel()? as usize;
    if n <= MAX_VALUE_ELEMS {
        out.val = match t.data_type {
            7 if t.int64_data.len() == n => Some(t.int64_data.clone()),
            7 if t.raw_data.len() == 8 * n => {
                Some(t.raw_data.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect())
            }
            6 if t.int32_data.len() == n => Some(t.int32_data.iter().map(|&v| v as i64).collect()),
            6 if t.raw_data.len() == 4 * n => {
                Some(t.raw_data.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64).collect())
            }
            _ => None,
        };
    }
    Some(out)
}
