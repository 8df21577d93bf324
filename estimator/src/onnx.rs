//! An ONNX export of the user's network (`torch.onnx.export`, weights
//! optional), walked with tract-onnx's shape inference: every operator's
//! output whose shape has the batch dimension is an activation; weight
//! inputs and initializers are parameters.

use crate::input::{Layer, Network, ParseError};
use crate::transformer::Shape;
use tract_onnx::pb;
use tract_onnx::prelude::*;
use tract_onnx::tract_hir::infer::Factoid;

/// What a walk found beyond the layer list.
#[derive(Debug, Clone, PartialEq)]
pub struct Graph {
    pub net: Network,
    /// The batch size the file fixes, when the first input's first
    /// dimension is a number rather than a name.
    pub fixed_batch: Option<u64>,
    /// Attention found (softmax over [batch, heads, query, key]): the
    /// transformer's shape, read off the graph, for the analytic model.
    pub transformer: Option<Shape>,
}

pub fn looks_like_onnx(bytes: &[u8]) -> bool {
    // A ModelProto starts with field 1 (ir_version, varint): tag 0x08.
    bytes.first() == Some(&0x08)
}

pub fn parse(bytes: &[u8], name: &str) -> Result<Graph, ParseError> {
    parse_with(bytes, name, true)
}

/// `fast`: try the fast shape walk before tract's (off only in tests that
/// compare the two).
fn parse_with(bytes: &[u8], name: &str, fast: bool) -> Result<Graph, ParseError> {
    let err = |m: String| ParseError { file: name.to_string(), line: 0, message: m };
    let proto = <pb::ModelProto as prost::Message>::decode(bytes).map_err(|e| {
        err(format!("not an ONNX model ({})", e.to_string().split_whitespace().collect::<Vec<_>>().join(" ")))
    })?;
    let graph = proto.graph.as_ref().ok_or_else(|| err("the ONNX model has no graph".into()))?;
    // External data would make tract open other files named by the model.
    if graph.initializer.iter().any(|t| t.data_location == Some(pb::tensor_proto::DataLocation::External as i32)) {
        return Err(err("ONNX external data is not supported: export with weights inside or without them".into()));
    }
    let initialized: std::collections::HashSet<&str> = graph.initializer.iter().map(|t| t.name.as_str()).collect();
    let data_input = graph
        .input
        .iter()
        .position(|i| !initialized.contains(i.name.as_str()))
        .ok_or_else(|| err("the ONNX graph has no input".into()))?;
    // The fast walk knows the operators training exports use; anything
    // else goes to tract's general (and much slower) shape inference.
    if let Some(w) = crate::onnx_shapes::walk(graph, data_input).filter(|_| fast) {
        return finish(w.ops, w.input_elems, w.params, w.fixed_batch, &err);
    }
    let (ops, input_elems, params, fixed_batch) = tract_walk(&tract_onnx::onnx(), &proto, data_input, &err)?;
    finish(ops, input_elems, params, fixed_batch, &err)
}

/// The fast shape walk alone on any bytes, for the fuzz target: this
/// crate's own code on hostile input, without tract's fallback.
#[doc(hidden)]
pub fn fuzz_fast_walk(bytes: &[u8]) {
    let Ok(proto) = <pb::ModelProto as prost::Message>::decode(bytes) else { return };
    let Some(graph) = proto.graph.as_ref() else { return };
    for input in 0..graph.input.len().min(4) {
        let _ = crate::onnx_shapes::walk(graph, input);
    }
}

use crate::kept::FOLDED_BATCHNORM;
use crate::onnx_shapes::BatchedOp;

/// Operator outputs that carry the batch.
type Ops = Vec<BatchedOp>;

/// The operator outputs, weight elements and the batch fixed in the file,
/// by tract's shape inference.
fn tract_walk(
    onnx: &tract_onnx::Onnx,
    proto: &pb::ModelProto,
    data_input: usize,
    err: &dyn Fn(String) -> ParseError,
) -> Result<(Ops, Option<u64>, u64, Option<u64>), ParseError> {
    let graph = proto.graph.as_ref().ok_or_else(|| err("the ONNX model has no graph".into()))?;
    let mut model =
        onnx.model_for_proto_model(proto).map_err(|e| err(format!("cannot read the ONNX graph ({})", one_line(&e))))?;
    // tract lists only the inputs that are not initializers: find ours by name.
    let data_name = graph.input[data_input].name.as_str();
    let data_input = model
        .input_outlets()
        .map_err(|e| err(one_line(&e)))?
        .iter()
        .position(|o| model.node(o.node).name == data_name)
        .ok_or_else(|| err(format!("the data input '{data_name}' is not a graph input")))?;
    let batch = model.symbols.sym("carma_batch");
    // The data input's first dimension becomes the batch symbol, whatever
    // the file calls it (or a number, which is remembered).
    let fixed_batch = {
        let outlet = model.input_outlets().map_err(|e| err(one_line(&e)))?[data_input];
        let fact = model.outlet_fact(outlet).map_err(|e| err(one_line(&e)))?.clone();
        let mut dims: Vec<TDim> = fact
            .shape
            .concretize()
            .ok_or_else(|| err("the data input's shape is not declared".into()))?
            .into_iter()
            .collect();
        if dims.is_empty() {
            return Err(err("the data input is a scalar; expected a batch dimension first".into()));
        }
        let fixed = dims[0].as_i64().and_then(|b| u64::try_from(b).ok());
        dims[0] = batch.clone().into();
        let dt = fact.datum_type.concretize().unwrap_or(DatumType::F32);
        model.set_input_fact(data_input, InferenceFact::dt_shape(dt, dims)).map_err(|e| err(one_line(&e)))?;
        fixed
    };
    model.analyse(false).map_err(|e| err(format!("shape inference failed ({})", one_line(&e))))?;
    let one = SymbolValues::default().with(&batch, 1);
    let mut ops = Vec::new();
    let mut params: u64 = 0;
    let data_node = model.input_outlets().map_err(|e| err(one_line(&e)))?[data_input].node;
    let mut input_elems = None;
    // Which batched operator each tract node is.
    let mut producer: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
    for node in model.nodes() {
        // tract's names for the views our retention rule skips.
        let op = match node.op.name().as_ref() {
            "Squeeze13" => "Squeeze".to_string(),
            "Unsqueeze13" => "Unsqueeze".to_string(),
            name => name.to_string(),
        };
        let Some(shape) = node.outputs.first().and_then(|o| o.fact.shape.concretize()) else { continue };
        let batched = shape.iter().any(|d| d.symbols().contains(&batch));
        if op == "Source" || op == "Const" {
            // Graph inputs other than the data: weights exported as inputs.
            let n = shape.iter().try_fold(1u64, |acc, d| acc.checked_mul(u64::try_from(d.as_i64()?).ok()?));
            let weight = if op == "Source" { !batched && node.id != data_node } else { n.is_some_and(|n| n > 1) };
            if weight {
                params = params.saturating_add(n.unwrap_or(0));
            }
            if node.id == data_node {
                input_elems =
                    shape.iter().try_fold(1u64, |acc, d| acc.checked_mul(u64::try_from(d.eval(&one).as_i64()?).ok()?));
            }
            continue;
        }
        if !batched {
            continue;
        }
        let dims = shape
            .iter()
            .map(|d| d.eval(&one).as_i64().and_then(|v| u64::try_from(v).ok()))
            .collect::<Option<Vec<u64>>>()
            .ok_or_else(|| err(format!("cannot size the output of {}", node.name)))?;
        let mut inputs: Vec<usize> = node.inputs.iter().filter_map(|o| producer.get(&o.node).copied()).collect();
        inputs.dedup();
        producer.insert(node.id, ops.len());
        ops.push(BatchedOp { op, dims, inputs });
    }
    Ok((ops, input_elems, params, fixed_batch))
}

/// The layer list, the transformer's shape and the folded BatchNorms.
fn finish(
    ops: Ops,
    input_elems: Option<u64>,
    params: u64,
    fixed_batch: Option<u64>,
    err: &dyn Fn(String) -> ParseError,
) -> Result<Graph, ParseError> {
    if ops.len() > 1_000_000 {
        return Err(err("more than 1000000 operators".into()));
    }
    let mut net = Network::default();
    let mut seen = Seen::default();
    let mut edges = Vec::with_capacity(ops.len());
    for BatchedOp { op: kind, dims, inputs } in ops {
        seen.note(&kind, &dims);
        edges.push(inputs);
        let out_elems = dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| err(format!("the output of a {kind} operator is too large")))?;
        net.layers.push(Layer { kind, out_elems, params: 0, channels: 0, folded_elems: 0 });
    }
    net.total_params = Some(params);
    net.batch_in_file = fixed_batch;
    // An eval-mode export folds each BatchNormalization into the Conv
    // before it: the Conv's output stands for the BatchNorm's, and training
    // also keeps the convolution's own output (the BatchNorm's input).
    // Every Conv that does not feed a BatchNormalization is taken to have
    // had one (DenseNet keeps its pre-activation BatchNorms, which cannot
    // fold; VGG never had any, and is over-counted: the safe side). Each is
    // one more tensor of the Conv's size.
    let feeds_batchnorm: std::collections::HashSet<usize> = (0..net.layers.len())
        .filter(|&j| net.layers[j].kind.contains("BatchNorm"))
        .flat_map(|j| edges[j].iter().copied())
        .collect();
    let convs: Vec<usize> = (0..net.layers.len())
        .filter(|&i| net.layers[i].kind.starts_with("Conv") && !feeds_batchnorm.contains(&i))
        .collect();
    for i in convs {
        net.layers.push(Layer {
            kind: FOLDED_BATCHNORM.into(),
            out_elems: net.layers[i].out_elems,
            params: 0,
            channels: 0,
            folded_elems: 0,
        });
        edges.push(vec![i]);
    }
    net.edges = Some(edges);
    net.input_elems = input_elems;
    let transformer = seen.shape(params);
    if seen.conv {
        net.attention_blocks = seen.softmax.len() as u32;
    }
    Ok(Graph { net, fixed_batch, transformer })
}

/// What a transformer's operators reveal of its shape (batch = 1).
#[derive(Default)]
struct Seen {
    /// (heads, key positions) of each rank-4 softmax: one per block.
    softmax: Vec<(u64, u64)>,
    norm_width: Vec<u64>,
    act_width: Vec<u64>,
    widest: u64,
    /// A convolution: an image model (ViT's and Swin's patch embeddings,
    /// ConvNeXt), whatever attention it has. Token transformers have none
    /// (GPT-2's `Conv1D` exports as MatMul).
    conv: bool,
}

impl Seen {
    fn note(&mut self, op: &str, dims: &[u64]) {
        let last = dims.last().copied().unwrap_or(0);
        match op {
            "Softmax" if dims.len() == 4 => self.softmax.push((dims[1], dims[3])),
            "LayerNorm" | "LayerNormalization" => self.norm_width.push(last),
            _ if op.starts_with("Gelu") || op == "Relu" || op == "Erf" => self.act_width.push(last),
            _ => {}
        }
        self.conv |= op.starts_with("Conv");
        if op.starts_with("MatMul") || op == "Gemm" || op == "Add" {
            self.widest = self.widest.max(last);
        }
    }

    /// The token transformer's shape, for the analytic model; `None` for
    /// anything else, image transformers included: their tokens are image
    /// patches or windows (Swin's softmax is per 7×7 window, its batch axis
    /// batch × windows), not a sequence of a vocabulary, and the layer walk
    /// counts their actual activations, attention matrices included.
    fn shape(&self, params: u64) -> Option<Shape> {
        if self.conv {
            return None;
        }
        let &(heads, seq) = self.softmax.first()?;
        let hidden = most_common(&self.norm_width)?;
        let intermediate = most_common(&self.act_width).filter(|i| *i > hidden).unwrap_or(4 * hidden);
        // A language-model head is the widest output; without one, none.
        let vocab = if self.widest > intermediate { self.widest } else { 0 };
        // Exports fuse or decompose the activation alike: counted as fused.
        // How PyTorch ran attention cannot be read from an export: the
        // probabilities are counted as kept.
        Some(Shape {
            blocks: self.softmax.len() as u64,
            hidden,
            heads,
            intermediate,
            vocab,
            seq,
            params,
            ff_kept: 2,
            ff_fp32: 0,
            kv_heads: heads,
            fused_attention: false,
            rms_norm: false,
        })
    }
}

fn most_common(v: &[u64]) -> Option<u64> {
    let mut counts = std::collections::BTreeMap::new();
    for &x in v.iter().filter(|x| **x > 0) {
        *counts.entry(x).or_insert(0u32) += 1;
    }
    counts.into_iter().max_by_key(|(_, n)| *n).map(|(x, _)| x)
}

fn one_line(e: &TractError) -> String {
    let s = format!("{e:#}");
    s.split_whitespace().collect::<Vec<_>>().join(" ").chars().take(300).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped GPUMemNet classifier: an ONNX file in the repository.
    const CLASSIFIER: &[u8] = include_bytes!("../models/gpumemnet_cnn.onnx");

    #[test]
    fn walks_a_small_graph() {
        let g = parse(CLASSIFIER, "gpumemnet_cnn.onnx").unwrap();
        // 12 -> 64 -> 32 -> 6 with biases, plus the 12-wide mean and std.
        let params = 12 * 64 + 64 + 64 * 32 + 32 + 32 * 6 + 6 + 2 * 12;
        assert_eq!(g.net.total_params, Some(params));
        assert_eq!(g.fixed_batch, Some(1), "the classifier's input is [1, 12]");
        assert!(g.transformer.is_none());
        let relu: Vec<u64> =
            g.net.layers.iter().filter(|l| l.kind == "Relu" || l.kind == "Clip").map(|l| l.out_elems).collect();
        assert_eq!(relu, vec![64, 32], "{:?}", g.net.layers);
    }

    /// The fast walk and tract agree on every shipped export of the paper's
    /// networks (tract names some operators differently).
    #[test]
    fn fast_walk_matches_tract_on_the_paper_networks() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/onnx");
        let mut files: Vec<_> =
            std::fs::read_dir(&dir).expect("the repository's data/onnx").flatten().map(|e| e.path()).collect();
        files.sort();
        assert!(files.len() >= 9, "{files:?}");
        let canon = |k: &str| -> String {
            match k {
                "ConvHir" => "Conv",
                "Relu" => "Clip", // tract's name for Relu
                "GlobalAvgPool" => "GlobalAveragePool",
                "SumPool" => "AveragePool",
                "InferenceConcat" => "Concat",
                "MatMulInference" => "MatMul",
                "PermuteAxes" => "Transpose",
                "GeluExact" => "Gelu",
                "StridedSlice" => "Slice",
                "LayerNorm" => "LayerNormalization",
                "MultiBroadcastTo" => "Expand",
                k => k,
            }
            .to_string()
        };
        for f in files {
            let bytes = std::fs::read(&f).unwrap();
            let name = f.file_name().unwrap().to_string_lossy().to_string();
            assert!(
                crate::onnx_shapes::walk(
                    tract_onnx::onnx().proto_model_for_read(&mut &bytes[..]).unwrap().graph.as_ref().unwrap(),
                    0
                )
                .is_some(),
                "{name}: the fast walk gave up"
            );
            let (fast, slow) = (parse_with(&bytes, &name, true).unwrap(), parse_with(&bytes, &name, false).unwrap());
            assert_eq!(fast.net.total_params, slow.net.total_params, "{name}: parameters");
            assert_eq!(fast.fixed_batch, slow.fixed_batch, "{name}");
            assert_eq!(fast.transformer, slow.transformer, "{name}: transformer shape");
            let summary = |g: &Graph, canon: &dyn Fn(&str) -> String| {
                let mut v: Vec<(String, u64)> = g.net.layers.iter().map(|l| (canon(&l.kind), l.out_elems)).collect();
                v.sort();
                v
            };
            let (a, b) = (summary(&fast, &canon), summary(&slow, &canon));
            // Compare as multisets of (operator, output size).
            let only_fast: Vec<_> = a.iter().filter(|x| !b.contains(x)).collect();
            let only_slow: Vec<_> = b.iter().filter(|x| !a.contains(x)).collect();
            assert!(
                only_fast.is_empty() && only_slow.is_empty(),
                "{name}: only fast {only_fast:?}; only tract {only_slow:?}"
            );
            let elems = |g: &Graph| g.net.layers.iter().map(|l| l.out_elems).sum::<u64>();
            assert_eq!(elems(&fast), elems(&slow), "{name}: activation elements");
        }
    }

    #[test]
    fn truncated_and_corrupted_files_are_errors_not_panics() {
        for cut in (0..CLASSIFIER.len()).step_by(61) {
            let r = std::panic::catch_unwind(|| parse(&CLASSIFIER[..cut], "cut.onnx"));
            assert!(r.is_ok(), "panic on a file cut at {cut} bytes");
            if let Ok(Err(e)) = r {
                assert!(e.to_string().starts_with("cut.onnx: "), "{e}");
            }
        }
        let mut flipped = CLASSIFIER.to_vec();
        for i in (0..flipped.len()).step_by(37) {
            flipped[i] ^= 0x5a;
        }
        assert!(std::panic::catch_unwind(|| parse(&flipped, "x.onnx")).is_ok());
        // The fast walk on a real network, mutated: shapes and attributes
        // become hostile values (overflow checks are on in test builds).
        let mlp = include_bytes!("../models/gpumemnet_mlp.onnx");
        let mut x: u64 = 0x9e3779b97f4a7c15;
        for _ in 0..300 {
            let mut m = mlp.to_vec();
            for _ in 0..4 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let i = (x % m.len() as u64) as usize;
                m[i] = (x >> 32) as u8;
            }
            assert!(std::panic::catch_unwind(|| parse(&m, "m.onnx")).is_ok(), "panic on a mutated file");
        }
        assert!(parse(b"\x08garbage", "g.onnx").unwrap_err().to_string().contains("not an ONNX model"));
    }
}
