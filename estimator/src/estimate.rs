//! One entry point: a model file's bytes and a batch size in, an estimate
//! with its source and explanation out. The rule (docs/estimator.md):
//! - transformers (module listing, config.json, ONNX with attention):
//!   the analytic model;
//! - CNNs and MLPs: the continuous per-sample model, or GPUMemNet's bin
//!   when the admin chose `method: gpumemnet` (its weights are read only then).
//!
//! A declared `--carma-mem` and an observed history are applied by the
//! caller (they need no model file).

use crate::features::{self, Family};
use crate::input::{Network, ParseError, text};
use crate::layers_model::{self, Parts};
use crate::transformer::{self, Shape};
use crate::{hf_config, kept, listing, torchinfo, torchsummary};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Continuous,
    Gpumemnet,
}

#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub runtime_mib: u64,
    pub method: Method,
    /// The job's sequence length (`--carma-seq-len`); `None`: the model's maximum.
    pub seq_len: Option<u64>,
    /// The job's training precision (`--carma-precision`).
    pub precision: carma_config::Precision,
}

impl Settings {
    /// carma.yaml's `estimator:` section.
    pub fn from_config(c: &carma_config::EstimatorConfig) -> Settings {
        Settings {
            runtime_mib: c.runtime_mib,
            method: match c.method {
                carma_config::EstimatorMethod::Continuous => Method::Continuous,
                carma_config::EstimatorMethod::Gpumemnet => Method::Gpumemnet,
            },
            seq_len: None,
            precision: carma_config::Precision::Fp32,
        }
    }
}

impl Settings {
    /// carma.yaml's settings for a job's own `--carma-seq-len` and
    /// `--carma-precision` (srun/sbatch and `carma estimate` alike).
    pub fn for_job(c: &carma_config::EstimatorConfig, job: &carma_config::JobRequest) -> Settings {
        Settings {
            seq_len: job.seq_len.map(u64::from),
            precision: job.precision.unwrap_or_default(),
            ..Settings::from_config(c)
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        // carma.yaml's defaults (the runtime: `carma_config::DEFAULT_RUNTIME_MIB`)
        Settings::from_config(&carma_config::Config::default().estimator)
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Estimate {
    pub mib: u64,
    /// `layers`, `analytic` or `gpumemnet`.
    pub source: &'static str,
    /// `onnx`, `torchsummary`, `torchinfo`, `module-listing` or `hf-config`.
    pub format: &'static str,
    pub family: Family,
    pub batch: u64,
    pub params: u64,
    pub parts: Parts,
    /// GPUMemNet's bin for CNNs and MLPs, with `estimator.method: gpumemnet` only.
    pub gpumemnet_mib: Option<u64>,
    pub why: String,
}

enum Described {
    Layers(Network),
    Transformer(Shape),
}

fn no_batch(name: &str) -> ParseError {
    ParseError {
        file: name.into(),
        line: 0,
        message: "the file does not fix a batch size: give --carma-batch-size (or CARMA_BATCH_SIZE)".into(),
    }
}

pub fn estimate(bytes: Vec<u8>, name: &str, batch: Option<u64>, s: &Settings) -> Result<Estimate, ParseError> {
    let (described, format) = describe(bytes, name)?;
    match described {
        Described::Transformer(shape) => {
            let batch = batch.ok_or_else(|| no_batch(name))?;
            Ok(analytic_estimate(shape, batch, format, s))
        }
        Described::Layers(net) => {
            let batch = batch.or(net.batch_in_file).ok_or_else(|| no_batch(name))?;
            Ok(layers_estimate(&net, batch, format, s))
        }
    }
}

/// A transformer's estimate by the analytic model.
fn analytic_estimate(mut shape: Shape, batch: u64, format: &'static str, s: &Settings) -> Estimate {
    let seq_from = match s.seq_len {
        Some(n) => {
            shape.seq = n;
            "--carma-seq-len"
        }
        None => "the model's maximum; set --carma-seq-len",
    };
    let parts = transformer::parts(&shape, s.runtime_mib, s.precision);
    let mib = parts.at_batch(batch);
    let why = format!(
        "analytic transformer: {} blocks, hidden {}, {} heads ({} key/value), feed-forward {} ({} kept per token), \
         vocabulary {}, sequence {} ({seq_from}), precision {}, {:.0} M parameters, batch {batch}: {} MiB runtime \
         + {:.0} MiB weights/gradients/Adam ({} B per parameter{}) + {:.1} MiB per sample (activations at {} B \
         for matmul outputs; attention {}; head {} B per vocabulary entry)",
        shape.blocks,
        shape.hidden,
        shape.heads,
        shape.kv_heads,
        shape.intermediate,
        shape.ff_kept,
        shape.vocab,
        shape.seq,
        s.precision.name(),
        shape.params as f64 / 1e6,
        parts.runtime_mib,
        parts.params_mib,
        layers_model::param_bytes(s.precision),
        layers_model::param_note(s.precision),
        parts.per_sample_mib,
        if s.precision == carma_config::Precision::Fp32 { 4 } else { 2 },
        if shape.fused_attention { "fused, no probabilities kept" } else { "probabilities kept" },
        transformer::HEAD_BYTES,
    );
    Estimate {
        mib,
        source: "analytic",
        format,
        family: Family::Transformer,
        batch,
        params: shape.params,
        parts,
        gpumemnet_mib: None,
        why,
    }
}

/// A CNN's or MLP's estimate by the continuous per-sample model (or
/// GPUMemNet's bin, where the admin chose it).
fn layers_estimate(net: &Network, batch: u64, format: &'static str, s: &Settings) -> Estimate {
    let profile = features::profile(net);
    let kept = kept::kept(net, s.precision);
    let parts = layers_model::parts(&profile, &kept, s.runtime_mib, s.precision);
    let continuous = parts.at_batch(batch);
    // GPUMemNet's classifiers were trained on data published without
    // a licence (docs/estimator.md): run only where the admin chose them.
    let gpumemnet = match s.method {
        Method::Gpumemnet => gpumemnet(net, batch, &profile.activation, profile.family == Family::Cnn),
        Method::Continuous => Err("not used (estimator.method: continuous)".into()),
    };
    let (mib, source) = match (s.method, &gpumemnet) {
        (Method::Gpumemnet, Ok(bin)) => (*bin, "gpumemnet"),
        _ => (continuous, "layers"),
    };
    let why = format!(
        "{} of {} layers, {:.1} M parameters, batch {batch}, precision {}: {} MiB runtime + {:.0} MiB \
         weights/gradients/Adam ({} B per parameter{}) + {:.1} MiB per sample ({:.1} MiB saved for the backward pass: \
         activations at {} B{}, pooling indices, dropout masks{}; {:.1} MiB gradients and allocator blocks in flight) = {continuous} MiB; \
         GPUMemNet bin {}",
        if net.attention_blocks > 0 {
            format!("image transformer ({} attention blocks)", net.attention_blocks)
        } else {
            profile.family.name().to_string()
        },
        profile.layers,
        profile.params as f64 / 1e6,
        s.precision.name(),
        parts.runtime_mib,
        parts.params_mib,
        layers_model::param_bytes(s.precision),
        layers_model::param_note(s.precision),
        parts.per_sample_mib,
        parts.saved_mib,
        kept.half_bytes,
        if s.precision == carma_config::Precision::Mixed {
            " for convolutions and matmuls, 4 B for norms and softmax"
        } else {
            ""
        },
        if parts.saved_mib > kept.saved_bytes / (1024.0 * 1024.0) {
            format!(
                "; the table folds blocks, so the footer's {:.1} M output elements of layers with parameters \
                 x {} at 4 B, above the {:.1} MiB its rows show",
                profile.param_leaf_floor / features::PARAM_LEAF_RETENTION / 1e6,
                features::PARAM_LEAF_RETENTION,
                kept.saved_bytes / (1024.0 * 1024.0)
            )
        } else {
            String::new()
        },
        layers_model::transient(&kept) * kept.largest_bytes / (1024.0 * 1024.0),
        match &gpumemnet {
            Ok(b) => format!("<= {b} MiB"),
            Err(e) => e.clone(),
        }
    );
    Estimate {
        mib,
        source,
        format,
        family: profile.family,
        batch,
        params: profile.params,
        parts,
        gpumemnet_mib: gpumemnet.ok(),
        why,
    }
}

#[cfg(feature = "gpumemnet")]
fn gpumemnet(net: &Network, batch: u64, activation: &str, cnn: bool) -> Result<u64, String> {
    crate::gpumemnet::classify(net, batch, activation, cnn)
}

#[cfg(not(feature = "gpumemnet"))]
fn gpumemnet(_: &Network, _: u64, _: &str, _: bool) -> Result<u64, String> {
    Err("GPUMemNet unavailable: built without the gpumemnet feature".into())
}

fn describe(bytes: Vec<u8>, name: &str) -> Result<(Described, &'static str), ParseError> {
    #[cfg(feature = "onnx")]
    if crate::onnx::looks_like_onnx(&bytes) {
        let g = crate::onnx::parse(&bytes, name)?;
        return Ok((g.transformer.map_or(Described::Layers(g.net), Described::Transformer), "onnx"));
    }
    let t = text(bytes, name)?;
    let trimmed = t.trim_start();
    if trimmed.starts_with('{') {
        return Ok((Described::Transformer(hf_config::parse(&t, name)?), "hf-config"));
    }
    if torchinfo::is_torchinfo(&t) {
        return Ok((Described::Layers(torchinfo::parse(&t, name)?), "torchinfo"));
    }
    if t.contains("Layer (type)") {
        return Ok((Described::Layers(torchsummary::parse(&t, name)?), "torchsummary"));
    }
    if t.lines().any(|l| l.trim_end().ends_with(" params")) {
        let l = listing::parse(&t, name)?;
        return Ok((Described::Transformer(listing_shape(&l, &t, name)?), "module-listing"));
    }
    Err(ParseError {
        file: name.into(),
        line: 0,
        message:
            "not a model description: expected an ONNX file, a torchsummary or torchinfo table, a module listing with \
                  'N params' per line, or a Hugging Face config.json"
                .into(),
    })
}

/// The shape a parsed listing describes; `text` is the listing itself,
/// whose module classes say how its MLP keeps memory.
fn listing_shape(l: &listing::Listing, text: &str, name: &str) -> Result<Shape, ParseError> {
    let err = |m: &str| ParseError { file: name.into(), line: 0, message: m.into() };
    let hidden = l.hidden.ok_or_else(|| err("the module listing has no Embedding: cannot tell the hidden size"))?;
    if l.blocks == 0 {
        return Err(err(
            "the module listing has no repeated transformer blocks; for other networks give a torchsummary table or an ONNX file",
        ));
    }
    let heads = Shape::default_heads(hidden);
    let activation = listing_activation(text);
    // A listing names the attention class transformers chose: `...Sdpa...`
    // or `...FlashAttention...` runs fused (no probabilities kept); any
    // other (eager, XLNet's relative attention) keeps them.
    Ok(Shape {
        blocks: l.blocks.into(),
        hidden,
        heads,
        intermediate: l.intermediate.unwrap_or(4 * hidden),
        vocab: l.vocab.unwrap_or(0),
        seq: l.max_positions.unwrap_or(512),
        params: l.root_params,
        ff_kept: Shape::ff_kept(text.contains("(gate_proj)"), activation),
        ff_fp32: Shape::ff_fp32(activation),
        kv_heads: heads,
        fused_attention: text.contains("Sdpa") || text.contains("FlashAttention"),
        rms_norm: text.contains("RMSNorm"),
    })
}

/// The MLP's activation from the module classes a listing names
/// (`NewGELUActivation` is GPT-2's `gelu_new`).
fn listing_activation(text: &str) -> Option<&'static str> {
    if text.contains("NewGELUActivation") {
        Some("gelu_new")
    } else if text.contains("FastGELUActivation") {
        Some("gelu_fast")
    } else if text.contains("QuickGELUActivation") {
        Some("quick_gelu")
    } else {
        None
    }
}
