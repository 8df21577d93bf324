//! The analytic estimate for transformer training: weights, gradients and
//! Adam's two moments per parameter, plus what autograd keeps per token,
//! tensor by tensor (PyTorch's `derivatives.yaml`; `kept.rs` does the same
//! for layer lists). Per block and token, with `a` bytes for tensors made
//! by matrix products (4 in fp32, 2 under autocast or in bf16) and `n` for
//! normalisations (4, and 4 under autocast, whose fp32 list has them):
//! - 7 hidden-wide tensors saved by matrix products and attention: the
//!   block's input (saved by the Q/K/V projections), Q, K and V (saved by
//!   attention), attention's output (saved by it) and its head-merged copy
//!   (saved by the output projection), the MLP's input (saved by its first
//!   projection);
//! - the normalisations' inputs: 2 LayerNorms; RMSNorm, written out as
//!   Llama's and T5's are, keeps its input and the normalised tensor: 4;
//! - two dropout masks of 1 byte;
//! - `ff_kept` feed-forward-wide tensors: 2 for one fused activation (its
//!   input, and its output for the second projection); 4 for a gated MLP
//!   (gate, its activation, up, their product); 3 more for a tanh GELU
//!   written as separate operations (GPT-2's `gelu_new`: tanh, 1 + tanh and
//!   x/2), two of which autocast computes in fp32 (`pow` is on its fp32
//!   list, so everything after it is promoted);
//! - attention itself: the fused kernels PyTorch's `scaled_dot_product_attention`
//!   runs for the families transformers sends to it (flash and
//!   memory-efficient attention) keep no probabilities, only 4 bytes of
//!   log-sum-exp per head. In fp32 with grouped-query attention neither
//!   fused kernel applies (flash has no fp32; the memory-efficient kernel
//!   takes no grouped heads) and PyTorch's math path keeps the fp32
//!   probabilities and the mask: 5 bytes per head and key position.
//!   Families without the fused path (T5's relative attention, XLNet, and
//!   any family we do not know) keep probabilities, dropout mask and
//!   dropout output: 9 bytes (5 in bf16);
//! - the language-model head: 16 bytes per vocabulary entry in every
//!   precision: the logits, their fp32 log-softmax, and the two gradients
//!   of that size the loss's backward pass holds (bf16 logits: 2 + the fp32
//!   copy the loss makes); an MLM head's transform keeps 3 hidden tensors;
//! - the embeddings' sum, LayerNorm and dropout mask (fp32: embeddings are
//!   not autocast).
//!
//! Parameters: 16 bytes in fp32; under autocast also the bf16 copy of each
//! weight it caches (18); a bf16 model with bf16 Adam state, 8.
//!
//! Without a sequence length the model's maximum positions are used: the
//! worst case a training script can feed.

use crate::layers_model::{Parts, param_bytes};
use carma_config::Precision;

const MIB: f64 = 1024.0 * 1024.0;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Shape {
    pub blocks: u64,
    pub hidden: u64,
    pub heads: u64,
    pub intermediate: u64,
    pub vocab: u64,
    pub seq: u64,
    pub params: u64,
    /// Feed-forward-wide tensors kept per token and block (module doc).
    pub ff_kept: u64,
    /// Of those, the ones autocast computes in fp32 (`gelu_new`'s).
    pub ff_fp32: u64,
    /// Key/value heads (grouped-query attention: fewer than `heads`).
    pub kv_heads: u64,
    /// The family runs PyTorch's fused attention (module doc).
    pub fused_attention: bool,
    /// RMSNorm written out (Llama, T5): 2 tensors kept per norm, not 1.
    pub rms_norm: bool,
}

impl Shape {
    /// Heads are not in module listings; 64 per head is what BERT, GPT-2
    /// and XLNet use.
    pub fn default_heads(hidden: u64) -> u64 {
        (hidden / 64).max(1)
    }

    /// `ff_kept` for an MLP: gated or not, and its activation function by
    /// its Hugging Face name (`hidden_act`), where known.
    pub fn ff_kept(gated: bool, activation: Option<&str>) -> u64 {
        let composite = match activation.unwrap_or("") {
            // x/2, tanh and 1 + tanh kept beside the input.
            "gelu_new" | "gelu_fast" => 3,
            // sigmoid(1.702 x) kept beside the input.
            "quick_gelu" => 1,
            _ => 0,
        };
        if gated { 4 + composite } else { 2 + composite }
    }

    /// Of [`Shape::ff_kept`], the tensors autocast computes in fp32: tanh
    /// and 1 + tanh of a GELU written with `pow`.
    pub fn ff_fp32(activation: Option<&str>) -> u64 {
        match activation.unwrap_or("") {
            "gelu_new" | "gelu_fast" => 2,
            _ => 0,
        }
    }
}

/// Bytes per vocabulary entry and token of a language-model head: the
/// logits, their fp32 log-softmax and the two gradients of that size the
/// loss's backward pass holds (16), and two more blocks of that size the
/// caching allocator holds beside them (8; see `layers_model::transient`).
pub const HEAD_BYTES: f64 = 24.0;

pub fn parts(s: &Shape, runtime_mib: u64, precision: Precision) -> Parts {
    let (h, i, v, seq, heads) = (s.hidden as f64, s.intermediate as f64, s.vocab as f64, s.seq as f64, s.heads as f64);
    // Bytes per tensor element made by a matrix product, by a
    // normalisation, and by a composite GELU's fp32 part (module doc).
    let (a, n, composite) = match precision {
        Precision::Fp32 => (4.0, 4.0, 4.0),
        Precision::Mixed => (2.0, 4.0, 4.0),
        Precision::Bf16 => (2.0, 2.0, 2.0),
    };
    let norms = if s.rms_norm { 4.0 } else { 2.0 };
    let ff = (s.ff_kept.saturating_sub(s.ff_fp32)) as f64 * a + s.ff_fp32 as f64 * composite;
    let grouped = s.kv_heads < s.heads;
    let attention = match (s.fused_attention, precision) {
        (true, Precision::Fp32) if grouped => 5.0 * heads * seq,
        (true, _) => 4.0 * heads,
        (false, Precision::Bf16) => 5.0 * heads * seq,
        (false, _) => 9.0 * heads * seq,
    };
    let block_per_token = 7.0 * a * h + norms * n * h + 2.0 * h + ff * i + attention;
    let head_per_token = HEAD_BYTES * v + a * 3.0 * h;
    let embed_per_token = n * 2.25 * h;
    let per_sample = seq * (s.blocks as f64 * block_per_token + head_per_token + embed_per_token);
    // The embedding's backward pass makes a dense gradient of the whole
    // table before it is accumulated into the weight's (the head's, where
    // tied): 4 bytes per element in flight once (2 for a bf16 model); under
    // autocast it arrives in bf16 and is copied to fp32: 6.
    let embed_grad = match precision {
        Precision::Fp32 => 4.0,
        Precision::Mixed => 6.0,
        Precision::Bf16 => 2.0,
    } * v
        * h;
    Parts {
        runtime_mib,
        params_mib: (param_bytes(precision) * s.params as f64 + embed_grad) / MIB,
        per_sample_mib: per_sample / MIB,
        // Counted per token above, the head's blocks in flight included.
        saved_mib: per_sample / MIB,
        largest_mib: 0.0,
        step_mib: crate::layers_model::step_bytes(precision) * s.params as f64 / MIB,
        // The loss's output object keeps the logits through the step.
        step_per_sample_mib: 4.0 * v * seq / MIB,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bert_base(seq: u64) -> Shape {
        Shape {
            blocks: 12,
            hidden: 768,
            heads: 12,
            intermediate: 3072,
            vocab: 30522,
            seq,
            params: 110_000_000,
            ff_kept: 2,
            ff_fp32: 0,
            kv_heads: 12,
            fused_attention: false,
            rms_norm: false,
        }
    }

    #[test]
    fn attention_grows_quadratically_with_sequence() {
        let short = parts(&bert_base(128), 0, Precision::Fp32).per_sample_mib;
        let long = parts(&bert_base(512), 0, Precision::Fp32).per_sample_mib;
        // 4x the tokens, each attending to 4x the positions: more than 4x.
        assert!(long > 4.0 * short, "{short} {long}");
        assert!(long < 16.0 * short, "{short} {long}");
    }

    #[test]
    fn weights_gradients_and_adam_are_16_bytes_per_parameter() {
        let p = parts(&bert_base(512), 700, Precision::Fp32);
        // and the embedding's dense gradient in flight (4 B per element).
        assert!((p.params_mib - (110e6 * 16.0 + 4.0 * 30522.0 * 768.0) / MIB).abs() < 1e-6);
        assert!(p.at_batch(2) > p.at_batch(1));
    }

    #[test]
    fn lower_precision_needs_less_but_the_loss_stays_fp32() {
        let s = bert_base(512);
        let (f, m, b) =
            (parts(&s, 700, Precision::Fp32), parts(&s, 700, Precision::Mixed), parts(&s, 700, Precision::Bf16));
        assert!(b.at_batch(8) < m.at_batch(8) && m.at_batch(8) < f.at_batch(8));
        // A model that is all head: the same per sample in every precision.
        let head_only = Shape { blocks: 0, hidden: 1, ..s };
        let per_sample = |p| parts(&head_only, 0, p).per_sample_mib;
        assert!((per_sample(Precision::Fp32) - per_sample(Precision::Bf16)).abs() < 0.01);
        // Mixed keeps fp32 master weights: more per parameter than fp32.
        assert!(m.params_mib > f.params_mib && b.params_mib < f.params_mib);
    }
}
