//! A fast shape walk over an ONNX graph for the operators that exported
//! training networks use. tract's general shape inference costs ~2 ms on
//! resnet50 (symbolic solving); this walk evaluates shapes concretely
//! twice, at batch 1 and at batch 3, and a tensor whose shape differs
//! between the two carries the batch. Small integer tensors (shape
//! arithmetic: Shape -> Gather -> Concat -> Reshape) are evaluated too.
//!
//! Anything it does not know — an operator, an attribute, a symbolic
//! dimension other than the batch — makes it return `None`, and the caller
//! falls back to tract. It never guesses.

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

fn attr<'n>(node: &'n pb::NodeProto, name: &str) -> Option<&'n pb::AttributeProto> {
    node.attribute.iter().find(|a| a.name == name)
}
fn int(node: &pb::NodeProto, name: &str, default: i64) -> i64 {
    attr(node, name).map_or(default, |a| a.i)
}
fn ints(node: &pb::NodeProto, name: &str) -> Option<Vec<i64>> {
    attr(node, name).map(|a| a.ints.clone())
}

/// Negative axes count from the end.
fn axis(a: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if a < 0 { a + r } else { a };
    (0..r).contains(&a).then_some(a as usize)
}

fn broadcast(shapes: &[&[i64]]) -> Option<Vec<i64>> {
    let rank = shapes.iter().map(|s| s.len()).max()?;
    (0..rank)
        .map(|i| {
            let mut d = 1;
            for s in shapes {
                let Some(k) = (i + s.len()).checked_sub(rank) else { continue };
                match (d, s[k]) {
                    (_, 1) => {}
                    (1, x) => d = x,
                    (a, b) if a == b => {}
                    _ => return None,
                }
            }
            Some(d)
        })
        .collect()
}

/// Elementwise on values (scalars broadcast), for shape arithmetic.
fn zip_vals(a: &T, b: &T, f: impl Fn(i64, i64) -> Option<i64>) -> Option<Vec<i64>> {
    let (x, y) = (a.val.as_ref()?, b.val.as_ref()?);
    let n = x.len().max(y.len());
    if !(x.len() == n || x.len() == 1) || !(y.len() == n || y.len() == 1) {
        return None;
    }
    (0..n).map(|i| f(x[if x.len() == 1 { 0 } else { i }], y[if y.len() == 1 { 0 } else { i }])).collect()
}

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

/// The values of a small tensor of `out` shape, each taken from `src`
/// (row-major, of `src_shape`) at the multi-index `from` gives for it.
fn remap(src: &[i64], src_shape: &[i64], out: &[i64], from: impl Fn(&[i64]) -> Vec<i64>) -> Option<Vec<i64>> {
    let n = product(out)?;
    if n > MAX_VALUE_ELEMS as i64 {
        return None;
    }
    let mut idx = vec![0i64; out.len()];
    let mut vals = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let at = from(&idx);
        let mut flat = 0i64;
        for (d, &i) in src_shape.iter().zip(&at) {
            if !(0..*d).contains(&i) {
                return None;
            }
            flat = flat * d + i;
        }
        vals.push(*src.get(flat as usize)?);
        // The next multi-index, last axis fastest.
        for a in (0..out.len()).rev() {
            idx[a] += 1;
            if idx[a] < out[a] {
                break;
            }
            idx[a] = 0;
        }
    }
    Some(vals)
}

fn product(dims: &[i64]) -> Option<i64> {
    dims.iter().try_fold(1i64, |a, &d| a.checked_mul(d))
}

/// Output tensors of one node, or `None` when unsure.
fn infer(node: &pb::NodeProto, ins: &[Option<&T>]) -> Option<Vec<T>> {
    let input = |i: usize| ins.get(i).copied().flatten();
    let x = input(0);
    let same = |n: usize| -> Option<Vec<T>> { Some(vec![T::shape(x?.shape.clone()); n.max(1)]) };
    let nout = node.output.len();
    Some(match node.op_type.as_str() {
        "Constant" => {
            let a = node.attribute.first()?;
            match a.name.as_str() {
                "value" => vec![tensor(a.t.as_ref()?)?],
                "value_int" => vec![T { shape: vec![], val: Some(vec![a.i]) }],
                "value_ints" => vec![T { shape: vec![a.ints.len() as i64], val: Some(a.ints.clone()) }],
                "value_float" => vec![T::shape(vec![])],
                "value_floats" => vec![T::shape(vec![a.floats.len() as i64])],
                _ => return None,
            }
        }
        "Identity" | "Cast" | "Neg" | "Abs" => {
            let x = x?;
            let val = match node.op_type.as_str() {
                "Neg" => x.val.as_ref().and_then(|v| v.iter().map(|a| a.checked_neg()).collect()),
                "Abs" => x.val.as_ref().and_then(|v| v.iter().map(|a| a.checked_abs()).collect()),
                _ => x.val.clone(),
            };
            vec![T { shape: x.shape.clone(), val }]
        }
        "Relu" | "Sigmoid" | "Tanh" | "Clip" | "Sqrt" | "Gelu" | "Erf" | "Softmax" | "LogSoftmax" | "LeakyRelu"
        | "Elu" | "Selu" | "HardSigmoid" | "HardSwish" | "Exp" | "Log" | "Reciprocal" | "Not" | "Softplus" | "Mish"
        | "PRelu" | "Dropout" => same(nout)?,
        "BatchNormalization" | "InstanceNormalization" => {
            let x = x?;
            let c = *x.shape.get(1)?;
            let mut out = vec![T::shape(x.shape.clone())];
            out.extend((1..nout).map(|_| T::shape(vec![c])));
            out
        }
        "LayerNormalization" => {
            let x = x?;
            let ax = axis(int(node, "axis", -1), x.shape.len())?;
            let stat: Vec<i64> = x.shape.iter().enumerate().map(|(i, &d)| if i < ax { d } else { 1 }).collect();
            let mut out = vec![T::shape(x.shape.clone())];
            out.extend((1..nout).map(|_| T::shape(stat.clone())));
            out
        }
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Equal" | "Less" | "Greater" | "And" | "Or" | "Max" | "Min" | "Mod" => {
            let (a, b) = (x?, input(1)?);
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
            vec![T { shape, val }]
        }
        "Where" => {
            let (c, a, b) = (x?, input(1)?, input(2)?);
            let shape = broadcast(&[&c.shape, &a.shape, &b.shape])?;
            let val = (|| {
                let (c, a, b) = (c.val.as_ref()?, a.val.as_ref()?, b.val.as_ref()?);
                let n = c.len().max(a.len()).max(b.len());
                let at = |v: &Vec<i64>, i: usize| if v.len() == 1 { Some(v[0]) } else { v.get(i).copied() };
                (0..n).map(|i| if at(c, i)? != 0 { at(a, i) } else { at(b, i) }).collect()
            })();
            vec![T { shape, val }]
        }
        "Conv" => {
            let (x, w) = (x?, input(1)?);
            let kernel = ints(node, "kernel_shape").unwrap_or_else(|| w.shape.get(2..).unwrap_or(&[]).to_vec());
            let mut shape = vec![*x.shape.first()?, *w.shape.first()?];
            shape.extend(pool_dims(node, &x.shape, &kernel)?);
            vec![T::shape(shape)]
        }
        "MaxPool" | "AveragePool" | "LpPool" => {
            let x = x?;
            let kernel = ints(node, "kernel_shape")?;
            let mut shape = x.shape.get(..2)?.to_vec();
            shape.extend(pool_dims(node, &x.shape, &kernel)?);
            let mut out = vec![T::shape(shape.clone())];
            out.extend((1..nout).map(|_| T::shape(shape.clone())));
            out
        }
        "GlobalAveragePool" | "GlobalMaxPool" => {
            let x = x?;
            let shape = x.shape.iter().enumerate().map(|(i, &d)| if i < 2 { d } else { 1 }).collect();
            vec![T::shape(shape)]
        }
        "Flatten" => {
            let x = x?;
            let r = x.shape.len() as i64;
            let a = int(node, "axis", 1);
            let a = if a < 0 { a + r } else { a };
            if !(0..=r).contains(&a) {
                return None;
            }
            let (head, tail) = x.shape.split_at(a as usize);
            vec![T::shape(vec![product(head)?, product(tail)?])]
        }
        "Gemm" => {
            let (a, b) = (x?, input(1)?);
            if a.shape.len() != 2 || b.shape.len() != 2 {
                return None;
            }
            let m = if int(node, "transA", 0) == 1 { a.shape[1] } else { a.shape[0] };
            let n = if int(node, "transB", 0) == 1 { b.shape[0] } else { b.shape[1] };
            vec![T::shape(vec![m, n])]
        }
        "MatMul" => {
            let (a, b) = (x?, input(1)?);
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
            vec![T::shape(shape)]
        }
        "Transpose" => {
            let x = x?;
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
            vec![T { shape, val }]
        }
        "Reshape" => {
            let (x, s) = (x?, input(1)?);
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
            vec![T { shape, val: x.val.clone() }]
        }
        "Unsqueeze" | "Squeeze" => {
            let x = x?;
            let axes = match input(1) {
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
            vec![T { shape, val: x.val.clone() }]
        }
        "Concat" => {
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
            vec![T { shape, val }]
        }
        "Gather" => {
            let (d, idx) = (x?, input(1)?);
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
            vec![T { shape, val }]
        }
        "GatherElements" => vec![T::shape(input(1)?.shape.clone())],
        "Shape" => {
            let x = x?;
            let r = x.shape.len() as i64;
            let clamp = |a: i64| (if a < 0 { a + r } else { a }).clamp(0, r) as usize;
            let (s, e) = (clamp(int(node, "start", 0)), clamp(int(node, "end", r)));
            let v = x.shape.get(s..e.max(s))?.to_vec();
            vec![T { shape: vec![v.len() as i64], val: Some(v) }]
        }
        "ConstantOfShape" => {
            let shape = x?.val.clone()?;
            // The fill value (default: float 0) matters only for shape arithmetic.
            let fill = attr(node, "value").and_then(|a| tensor(a.t.as_ref()?)).and_then(|t| t.val?.first().copied());
            let n = product(&shape)?;
            let val = fill.filter(|_| (0..=MAX_VALUE_ELEMS as i64).contains(&n)).map(|f| vec![f; n as usize]);
            vec![T { shape, val }]
        }
        "Range" => {
            let one = |i: usize| -> Option<i64> { input(i)?.val.as_ref().filter(|v| v.len() == 1).map(|v| v[0]) };
            let (start, limit, delta) = (one(0)?, one(1)?, one(2)?);
            if delta == 0 {
                return None;
            }
            let span = limit.checked_sub(start)?;
            let n = span.checked_add(delta - delta.signum())?.checked_div(delta)?.max(0);
            let val = (n <= MAX_VALUE_ELEMS as i64).then(|| (0..n).map(|i| start + i * delta).collect());
            vec![T { shape: vec![n], val }]
        }
        // Swin's shifted windows: padding to a multiple of the window, and
        // the attention mask written into a zero tensor.
        "Pad" => {
            let x = x?;
            let r = x.shape.len();
            let pads = input(1)?.val.clone()?;
            let axes: Vec<usize> = match input(3) {
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
            vec![T::shape(shape)]
        }
        "ScatterND" => vec![T::shape(x?.shape.clone())],
        "Expand" => {
            let (x, s) = (x?, input(1)?);
            vec![T::shape(broadcast(&[&x.shape, s.val.as_ref()?])?)]
        }
        "Slice" => {
            let x = x?;
            let r = x.shape.len();
            let starts = input(1)?.val.clone()?;
            let ends = input(2)?.val.clone()?;
            let axes = match input(3) {
                Some(a) => a.val.clone()?,
                None => (0..starts.len() as i64).collect(),
            };
            let steps = match input(4) {
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
            vec![T { shape, val }]
        }
        "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" => {
            let x = x?;
            let r = x.shape.len();
            let axes = match input(1) {
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
            vec![T::shape(shape)]
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
