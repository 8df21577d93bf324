//! What autograd keeps for the backward pass, tensor by tensor, in bytes.
//!
//! Each operator saves what its derivative needs (PyTorch's
//! `derivatives.yaml`): a convolution, a linear layer, a normalisation or
//! a pooling saves its *input*; ReLU, sigmoid, tanh and softmax save their
//! *result*; additions, concatenations and views save nothing; max-pooling
//! adds its int64 indices, dropout its bool mask. A tensor is kept once,
//! whoever saves it (a Conv → BatchNorm → ReLU → Conv chain keeps the
//! convolution's output for the BatchNorm and the ReLU's result for both
//! the ReLU and the next convolution, whether the ReLU ran in place or
//! not: two tensors, not three). Views (flatten, reshape) alias their
//! input: saving a view keeps its input.
//!
//! Under autocast (`mixed`), convolutions and matrix products compute in
//! bf16, 2 bytes per element, and save a bf16 copy of an fp32 input;
//! normalisations other than BatchNorm, softmax and the other ops of
//! autocast's fp32 list produce fp32; element-wise operators produce the
//! wider of their inputs. The data batch is fp32.
//!
//! Descriptions without edges (torchsummary and torchinfo tables list
//! modules in the order they ran) are taken as a chain: each row consumes
//! the row before it. ONNX graphs give the real edges.

use crate::input::Network;
use carma_config::Precision;

/// What an operator's backward needs of its forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Saves {
    /// Its input(s): convolutions, matrix products, normalisations, pooling,
    /// SiLU/GELU/Hardswish and other activations whose derivative reads x.
    Input,
    /// Its own output: ReLU, sigmoid, tanh, softmax.
    Result,
    /// Nothing of the activations (add, concat, pad; dropout's mask aside).
    Nothing,
    /// An alias of its input (flatten, reshape, transpose, identity).
    View,
    /// Not known: counted as saving both input and output.
    Unknown,
}

/// How an operator's output dtype follows from its inputs under autocast.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Computes {
    /// bf16 under autocast: convolutions and matrix products.
    Half,
    /// fp32 under autocast (its fp32 list: layer/group norm, softmax, pow,
    /// exp, log, reductions, losses).
    Single,
    /// The widest of its inputs (element-wise operators, BatchNorm, pooling).
    Follows,
}

struct Op {
    saves: Saves,
    computes: Computes,
    /// Extra bytes kept per output element: max-pooling's int64 indices,
    /// dropout's bool mask.
    extra_bytes: f64,
}

/// The convolution output an eval-mode ONNX export folded away with its
/// BatchNorm: a tensor of the Conv's size that training keeps.
pub const FOLDED_BATCHNORM: &str = "BatchNorm(folded)";

fn op(kind: &str) -> Op {
    if kind == FOLDED_BATCHNORM {
        return Op { saves: Saves::Result, computes: Computes::Follows, extra_bytes: 0.0 };
    }
    let k = kind.to_ascii_lowercase();
    let k = k.as_str();
    let (saves, computes, extra_bytes) =
        if k.starts_with("conv") || matches!(k, "linear" | "gemm" | "matmul" | "conv1d") {
            (Saves::Input, Computes::Half, 0.0)
        } else if k.starts_with("batchnorm") || k == "batchnormalization" {
            (Saves::Input, Computes::Follows, 0.0)
        } else if k.contains("layernorm")
            || k == "layernormalization"
            || k.starts_with("groupnorm")
            || k.starts_with("instancenorm")
            || k == "groupnormalization"
            || k == "instancenormalization"
        {
            (Saves::Input, Computes::Single, 0.0)
        } else if k.starts_with("maxpool") {
            (Saves::Input, Computes::Follows, 8.0)
        } else if k.contains("avgpool") || k.contains("averagepool") || k == "globalaveragepool" {
            (Saves::Input, Computes::Follows, 0.0)
        } else if matches!(k, "relu" | "sigmoid" | "tanh" | "elu") {
            (Saves::Result, Computes::Follows, 0.0)
        } else if matches!(k, "softmax" | "logsoftmax" | "softmin" | "exp") {
            (Saves::Result, Computes::Single, 0.0)
        } else if matches!(k, "pow" | "log" | "sqrt" | "reciprocal" | "softplus" | "reducemean" | "reducesum") {
            (Saves::Input, Computes::Single, 0.0)
        } else if matches!(
            k,
            "silu"
                | "swish"
                | "gelu"
                | "hardswish"
                | "hardsigmoid"
                | "mish"
                | "leakyrelu"
                | "prelu"
                | "relu6"
                | "hardtanh"
                | "clip"
                | "erf"
                | "mul"
                | "div"
                | "selu"
                | "celu"
                | "glu"
        ) {
            (Saves::Input, Computes::Follows, 0.0)
        } else if k.starts_with("dropout") {
            (Saves::Nothing, Computes::Follows, 1.0)
        } else if matches!(
            k,
            "add"
                | "sub"
                | "stochasticdepth"
                | "concat"
                | "cat"
                | "pad"
                | "zeropad2d"
                | "constantpad2d"
                | "neg"
                | "where"
                | "expand"
                | "tile"
        ) || k.starts_with("upsample")
            || k == "resize"
        {
            (Saves::Nothing, Computes::Follows, 0.0)
        } else if matches!(
            k,
            "flatten"
                | "identity"
                | "reshape"
                | "squeeze"
                | "unsqueeze"
                | "view"
                | "transpose"
                | "slice"
                | "split"
                | "gather"
                | "shape"
                | "permute"
                | "cast"
        ) {
            (Saves::View, Computes::Follows, 0.0)
        } else {
            (Saves::Unknown, Computes::Follows, 0.0)
        };
    Op { saves, computes, extra_bytes }
}

/// `Mul(x, Sigmoid(x))` pairs of a graph: SiLU written out by an exporter.
#[derive(Default)]
struct Silu {
    sigmoids: std::collections::HashSet<usize>,
    muls: std::collections::HashSet<usize>,
}

fn silu_pairs(net: &Network, ops: &[Op]) -> Silu {
    let mut out = Silu::default();
    let Some(edges) = &net.edges else { return out };
    let mut consumers = vec![0u32; net.layers.len()];
    for ins in edges {
        for &i in ins {
            if let Some(c) = consumers.get_mut(i) {
                *c += 1;
            }
        }
    }
    for (k, ins) in edges.iter().enumerate() {
        if !net.layers[k].kind.eq_ignore_ascii_case("mul") || ins.len() != 2 {
            continue;
        }
        for (a, b) in [(ins[0], ins[1]), (ins[1], ins[0])] {
            let sigmoid = b < net.layers.len()
                && net.layers[b].kind.eq_ignore_ascii_case("sigmoid")
                && ops[b].saves == Saves::Result
                && consumers[b] == 1
                && edges.get(b).is_some_and(|e| e.as_slice() == [a]);
            if sigmoid {
                out.sigmoids.insert(b);
                out.muls.insert(k);
            }
        }
    }
    out
}

/// The scores, their scaling and the softmax of each plain scaled
/// dot-product attention in a graph: `MatMul(q, k) -> [Mul|Div]* ->
/// Softmax -> MatMul(., v)`. PyTorch runs such attention fused (flash or
/// memory-efficient `scaled_dot_product_attention`, which torchvision's
/// ViT reaches through `nn.MultiheadAttention` with `need_weights=False`):
/// it keeps q, k, v, the output and a log-sum-exp, never the scores. An
/// additive bias or mask before the softmax (Swin's relative positions)
/// marks attention written out by hand, whose probabilities are kept.
fn fused_attention(net: &Network) -> std::collections::HashSet<usize> {
    let mut out = std::collections::HashSet::new();
    let Some(edges) = &net.edges else { return out };
    for (j, l) in net.layers.iter().enumerate() {
        if l.kind != "Softmax" || edges[j].len() != 1 {
            continue;
        }
        let mut chain = vec![j];
        let mut at = edges[j][0];
        while matches!(net.layers[at].kind.as_str(), "Mul" | "Div") && edges[at].len() == 1 {
            chain.push(at);
            at = edges[at][0];
        }
        if net.layers[at].kind == "MatMul" && edges[at].len() == 2 {
            out.extend(chain);
        }
    }
    out
}

/// What a network keeps per sample, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Kept {
    /// Saved activations, masks and indices.
    pub saved_bytes: f64,
    /// The largest output of one operator (a gradient of its size is what
    /// the backward pass holds in flight).
    pub largest_bytes: f64,
    /// Bytes per element the analysis used for half-precision tensors.
    pub half_bytes: f64,
    /// The network max-pools (whose backward pass scatters into a zeroed
    /// gradient of its input's size).
    pub max_pools: bool,
}

/// Per-element bytes of a tensor: 4 for fp32, 2 for bf16 under autocast.
fn width(precision: Precision, half: bool) -> f64 {
    match precision {
        Precision::Fp32 => 4.0,
        Precision::Mixed if half => 2.0,
        Precision::Mixed => 4.0,
        Precision::Bf16 => 2.0,
    }
}

/// The layers as the analysis sees them.
struct Flow<'n> {
    net: &'n Network,
    ops: Vec<Op>,
    /// The operator is one `op` knows (before table containers are resolved).
    known: Vec<bool>,
    /// Views alias their input: each layer's storage's producer (`None`:
    /// the data batch).
    storage: Vec<Option<usize>>,
    /// Output is half precision (bf16) under autocast.
    half: Vec<bool>,
}

impl Flow<'_> {
    fn new(net: &Network) -> Flow<'_> {
        let n = net.layers.len();
        let mut ops: Vec<Op> = net.layers.iter().map(|l| op(&l.kind)).collect();
        let known: Vec<bool> = ops.iter().map(|o| o.saves != Saves::Unknown).collect();
        if net.edges.is_none() {
            table_containers(net, &mut ops);
        }
        let mut flow = Flow { net, ops, known, storage: (0..n).map(Some).collect(), half: vec![false; n] };
        for j in 0..n {
            let ins = flow.inputs(j);
            flow.half[j] = match flow.ops[j].computes {
                Computes::Half => true,
                Computes::Single => false,
                Computes::Follows => ins.iter().all(|i| i.is_some_and(|i| flow.half[i])),
            };
            if flow.ops[j].saves == Saves::View {
                // A view of the data batch is the data batch (`None`).
                flow.storage[j] = ins.first().copied().flatten().and_then(|i| flow.storage[i]);
            }
        }
        flow
    }

    /// Layer `j`'s inputs; `None`: the data batch (fp32 images, 4 bytes).
    fn inputs(&self, j: usize) -> Vec<Option<usize>> {
        match &self.net.edges {
            Some(e) => {
                let v: Vec<Option<usize>> =
                    e.get(j).map_or_else(Vec::new, |ins| ins.iter().map(|&i| Some(i)).collect());
                if v.is_empty() { vec![None] } else { v }
            }
            None => vec![j.checked_sub(1)],
        }
    }
}

/// A table's rows include containers (torchvision's Bottleneck,
/// InvertedResidual, ...), listed after their children. A container as
/// large as the row before it returns that row's tensor; one of another
/// size returns what a functional call made (a scaling or a sum the table
/// does not list), which keeps nothing itself.
fn table_containers(net: &Network, ops: &mut [Op]) {
    for (j, o) in ops.iter_mut().enumerate() {
        if o.saves == Saves::Unknown && net.layers[j].params == 0 {
            let alias = j > 0 && net.layers[j - 1].out_elems == net.layers[j].out_elems;
            o.saves = if alias { Saves::View } else { Saves::Nothing };
        }
    }
}

/// A table lists modules only: a shape-keeping row (dropout, a norm, an
/// activation) smaller than the row before it follows a call the table
/// does not show (`F.max_pool2d` in pytorch/examples' MNIST net). It is
/// counted as max-pooling, the most such a call keeps: the row before it,
/// and int64 indices of its output's size. Marks the row before.
fn unlisted_poolings(f: &Flow) -> Vec<bool> {
    let (net, n) = (f.net, f.net.layers.len());
    let mut unlisted = vec![false; n];
    if net.edges.is_none() {
        for j in 1..n {
            let shape_keeping = f.known[j]
                && matches!(f.ops[j].saves, Saves::Nothing | Saves::Result | Saves::Input)
                && f.ops[j].computes != Computes::Half
                && !net.layers[j].kind.to_ascii_lowercase().contains("pool");
            if shape_keeping && net.layers[j].out_elems < net.layers[j - 1].out_elems {
                unlisted[j - 1] = true;
            }
        }
    }
    unlisted
}

/// What the joins of parallel branches in a table keep beyond their rows.
#[derive(Default)]
struct Joins {
    /// Per join: the block input's storage (`None`: the data batch), of
    /// which one tensor is counted.
    inputs: Vec<Option<usize>>,
    /// The storage of each join's last branch, kept.
    tails: Vec<usize>,
}

/// A table shows a block that joins parallel branches only by its modules
/// and its container row: a parameter-free container that keeps the
/// spatial size of the row before it and adds channels is a concatenation
/// of branches that each read the block's input. A branch may open with a
/// call the table does not list (torchvision's Inception-v3:
/// `F.avg_pool2d` on the block input in its A, C and E blocks,
/// `F.max_pool2d` in B and D), whose result the branch's convolution
/// keeps. One tensor of the block input's size is counted per join: the
/// most one such pooling keeps (an average pooling's result of the input's
/// size; a strided max-pooling's int64 indices are a quarter of its input
/// at twice the width). The row before the join ends the last branch; the
/// activation that made it may be a call the table does not list either
/// (Inception's `F.relu`), which keeps its result: that row is kept too.
fn branch_joins(f: &Flow) -> Joins {
    let mut out = Joins::default();
    if f.net.edges.is_some() {
        return out;
    }
    let l = &f.net.layers;
    let join = |j: usize| {
        j > 0
            && !f.known[j]
            && l[j].params == 0
            && l[j - 1].channels > 0
            && l[j].channels > l[j - 1].channels
            && l[j].out_elems / l[j].channels == l[j - 1].out_elems / l[j - 1].channels
    };
    let joins: Vec<usize> = (0..l.len()).filter(|&j| join(j)).collect();
    for &j in &joins {
        // The block's input: the last join or pooling row before it.
        let start = (0..j).rev().find(|&r| joins.contains(&r) || l[r].kind.to_ascii_lowercase().contains("pool"));
        out.inputs.push(start.and_then(|r| f.storage[r]));
        out.tails.extend(f.storage[j - 1]);
    }
    out
}

/// Which tensors the backward pass keeps.
struct Marks {
    /// kept[i]: layer i's own storage; cast[i]: a bf16 copy of it.
    kept: Vec<bool>,
    cast: Vec<bool>,
    data_kept: bool,
    data_cast: bool,
    /// Bytes of masks and indices.
    extra: f64,
}

/// Marks what each operator saves (`unlisted`: rows before an unlisted
/// pooling; `tails`: storage kept by table joins).
fn mark_saved(f: &Flow, precision: Precision, unlisted: &[bool], tails: &[usize]) -> Marks {
    let (net, ops, n) = (f.net, &f.ops, f.net.layers.len());
    // SiLU exported as x * sigmoid(x): PyTorch's SiLU keeps x alone.
    let silu = silu_pairs(net, ops);
    // Plain scaled dot-product attention runs fused: no scores kept.
    let fused = fused_attention(net);
    let saves = |j: usize| if fused.contains(&j) { Saves::Nothing } else { ops[j].saves };
    let mut m = Marks { kept: vec![false; n], cast: vec![false; n], data_kept: false, data_cast: false, extra: 0.0 };
    for &t in tails {
        m.kept[t] = true;
    }
    for j in 0..n {
        let o = &ops[j];
        m.extra += o.extra_bytes * net.layers[j].out_elems as f64;
        if unlisted[j] {
            if let Some(s) = f.storage[j] {
                m.kept[s] = true;
            }
            m.extra += 8.0 * net.layers[j + 1].out_elems as f64;
        }
        if silu.sigmoids.contains(&j) {
            continue;
        }
        if let (Saves::Result | Saves::Unknown, Some(s)) = (saves(j), f.storage[j]) {
            m.kept[s] = true;
        }
        if !matches!(saves(j), Saves::Input | Saves::Unknown) {
            continue;
        }
        for i in f.inputs(j) {
            if silu.muls.contains(&j) && i.is_some_and(|i| silu.sigmoids.contains(&i)) {
                continue;
            }
            if i.is_some_and(|i| fused.contains(&i) && net.layers[i].kind == "Softmax") {
                continue;
            }
            let s = i.and_then(|i| f.storage[i]);
            let src_half = s.is_some_and(|s| f.half[s]);
            // A half-precision operator under autocast saves the bf16
            // copy it made of an fp32 input.
            let copy = precision == Precision::Mixed && o.computes == Computes::Half && !src_half;
            match (s, copy) {
                (Some(s), false) => m.kept[s] = true,
                (Some(s), true) => m.cast[s] = true,
                (None, false) => m.data_kept = true,
                (None, true) => m.data_cast = true,
            }
        }
    }
    m
}

pub fn kept(net: &Network, precision: Precision) -> Kept {
    let f = Flow::new(net);
    let unlisted = unlisted_poolings(&f);
    let joins = branch_joins(&f);
    let m = mark_saved(&f, precision, &unlisted, &joins.tails);
    let data_elems = net.input_elems.unwrap_or(0) as f64;
    let mut saved = m.extra;
    let mut largest = 0f64;
    for i in 0..net.layers.len() {
        let e = net.layers[i].out_elems as f64;
        let w = width(precision, f.half[i]);
        if f.storage[i] == Some(i) {
            largest = largest.max(e * w);
        }
        // A folded block's insides are not listed: its widest tensor at its
        // finest resolution bounds what it makes (and the gradient of it).
        if !f.known[i] {
            largest = largest.max(net.layers[i].folded_elems as f64 * w);
        }
        if m.kept[i] {
            saved += e * w;
        }
        if m.cast[i] {
            saved += e * 2.0;
        }
    }
    for b in &joins.inputs {
        saved += match *b {
            Some(b) => net.layers[b].out_elems as f64 * width(precision, f.half[b]),
            None => data_elems * 4.0,
        };
    }
    if m.data_kept {
        saved += data_elems * 4.0;
    }
    if m.data_cast {
        saved += data_elems * 2.0;
    }
    let max_pools = net.layers.iter().any(|l| l.kind.to_ascii_lowercase().starts_with("maxpool"));
    Kept { saved_bytes: saved, largest_bytes: largest, half_bytes: width(precision, true), max_pools }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::Layer;

    fn layer(kind: &str, out_elems: u64) -> Layer {
        Layer { kind: kind.into(), out_elems, params: 0, channels: 0, folded_elems: 0 }
    }

    fn chain(kinds: &[(&str, u64)]) -> Network {
        Network { layers: kinds.iter().map(|&(k, e)| layer(k, e)).collect(), ..Default::default() }
    }

    #[test]
    fn conv_bn_relu_keeps_two_tensors_in_place_or_not() {
        let net = chain(&[("Conv2d", 100), ("BatchNorm2d", 100), ("ReLU", 100), ("Conv2d", 50)]);
        // conv output (BatchNorm's input) and the ReLU's result (kept by
        // the ReLU and the next convolution); the last output is unused.
        assert_eq!(kept(&net, Precision::Fp32).saved_bytes, 2.0 * 100.0 * 4.0);
    }

    #[test]
    fn pool_indices_dropout_masks_and_views() {
        let net = chain(&[("MaxPool2d", 25), ("Flatten", 25), ("Dropout", 25), ("Linear", 10)]);
        let k = kept(&net, Precision::Fp32);
        // maxpool output (kept by nobody: dropout saves only its mask) +
        // 8 B indices; the dropout output kept by the linear layer; a 1 B mask.
        assert_eq!(k.saved_bytes, 25.0 * 8.0 + 25.0 * 4.0 + 25.0 * 1.0);
    }

    #[test]
    fn autocast_halves_matmul_tensors_and_keeps_norms_in_fp32() {
        let net = chain(&[
            ("Conv2d", 100),
            ("BatchNorm2d", 100),
            ("ReLU", 100),
            ("Conv2d", 100),
            ("LayerNorm", 100),
            ("Linear", 10),
        ]);
        let f = kept(&net, Precision::Fp32).saved_bytes;
        let m = kept(&net, Precision::Mixed).saved_bytes;
        // fp32: conv, relu, conv (LayerNorm input), LayerNorm output: 400 x 4.
        assert_eq!(f, 1600.0);
        // mixed: conv, relu, conv in bf16; the LayerNorm's fp32 output is
        // kept as the linear layer's bf16 copy.
        assert_eq!(m, 3.0 * 200.0 + 200.0);
    }

    #[test]
    fn a_size_change_the_table_does_not_explain_is_an_unlisted_pooling() {
        // Conv -> (F.relu, F.max_pool2d: not listed) -> Dropout -> Linear.
        let net = chain(&[("Conv2d", 100), ("Dropout", 25), ("Linear", 10)]);
        // the conv output (the pooling's input), 8 B indices per pooled
        // element, the dropout mask and its output (the linear's input).
        assert_eq!(kept(&net, Precision::Fp32).saved_bytes, 400.0 + 25.0 * 8.0 + 25.0 + 100.0);
        // Without the size change, nothing of the conv output is kept.
        let net = chain(&[("Conv2d", 25), ("Dropout", 25), ("Linear", 10)]);
        assert_eq!(kept(&net, Precision::Fp32).saved_bytes, 25.0 + 100.0);
    }

    #[test]
    fn a_table_join_of_branches_keeps_a_pooled_block_input_and_the_last_branch() {
        let row = |kind: &str, out_elems: u64, channels: u64| Layer {
            kind: kind.into(),
            out_elems,
            params: 0,
            channels,
            folded_elems: 0,
        };
        // pool -> [conv | conv] -> join (4 channels = 2 + 2) -> conv.
        let mut net = Network {
            layers: vec![
                row("MaxPool2d", 100, 4),
                row("Conv2d", 50, 2),
                row("Conv2d", 50, 2),
                row("InceptionA", 100, 4),
                row("Conv2d", 10, 1),
            ],
            ..Default::default()
        };
        // Pool indices (800), the pool's output read by the first conv
        // (400), the first conv's output as the chain reads it (200), the
        // join read by the last conv (400); then a pooled copy of the block
        // input (400) and the last branch's output (200).
        assert_eq!(kept(&net, Precision::Fp32).saved_bytes, 1800.0 + 400.0 + 200.0);
        // Without shapes the container is no join: nothing more.
        for l in &mut net.layers {
            l.channels = 0;
        }
        assert_eq!(kept(&net, Precision::Fp32).saved_bytes, 1800.0);
    }

    #[test]
    fn graph_edges_decide_what_is_kept() {
        // x -> conv(a) -> add(a, x): the add saves nothing, the conv saves x.
        let mut net = chain(&[("Conv2d", 10), ("Add", 10)]);
        net.edges = Some(vec![vec![], vec![0]]);
        net.input_elems = Some(10);
        assert_eq!(kept(&net, Precision::Fp32).saved_bytes, 40.0);
    }
}
