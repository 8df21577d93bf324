//! The analytic estimate for transformer training (no training set exists
//! for them): weights, gradients and Adam's two moments at 16 bytes per
//! parameter, plus what autograd keeps per token in fp32:
//! - per block, 8.5 x hidden floats (LayerNorm inputs and outputs, Q, K, V,
//!   attention context, two dropout masks), `ff_kept` x feed-forward width
//!   floats and 9 bytes per head and key position (softmax output, dropout
//!   mask, dropout output);
//! - `ff_kept` counts the feed-forward-wide tensors autograd keeps: 2 for
//!   one fused activation (its input, and its output for the second
//!   matmul); 4 for a gated MLP (gate, its activation, up, their product);
//!   3 more for a tanh GELU written as separate operations (GPT-2's
//!   `gelu_new`: tanh, 1 + tanh and x/2 are kept for the backward pass).
//!   Measured on a CPU (data/cpu/lm-training-memory.csv): GPT-2 at 2 kept
//!   tensors fell below its measured need;
//! - the language-model head: 16 bytes per vocabulary entry in every
//!   precision. The logits stay alive with the model's output (training
//!   loops keep it through the backward pass); the loss takes their
//!   log-softmax in fp32 (transformers upcasts causal-LM logits; autocast
//!   runs it in fp32), and its backward pass holds two fp32 gradients of
//!   that size at once. fp32: 4 + 4 + 4 + 4; bf16 logits: 2 + 4 + 4 + 4
//!   and the 2-byte gradient handed back to them;
//! - the embeddings' sum, LayerNorm and dropout mask.
//!
//! Without a sequence length the model's maximum positions are used: the
//! worst case a training script can feed.
//!
//! Precision (`--carma-precision`), an analytic assumption not yet checked
//! on a GPU (docs/estimator.md):
//! - fp32: 16 B per parameter, 4 B per kept activation;
//! - mixed (autocast): fp32 weights, gradients and Adam plus the half
//!   copies autocast caches (18 B per parameter); matmul inputs and outputs
//!   are kept in half while LayerNorm and softmax stay fp32: 3 B per kept
//!   hidden activation on average, attention probabilities and the head's
//!   log-softmax unchanged;
//! - bf16 (the model itself in bf16, Adam state in bf16 too): 8 B per
//!   parameter, 2 B per kept activation, 5 B per head and key position.

use crate::layers_model::Parts;
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
}

pub fn parts(s: &Shape, runtime_mib: u64, precision: Precision) -> Parts {
    let (h, i, v, seq) = (s.hidden as f64, s.intermediate as f64, s.vocab as f64, s.seq as f64);
    // Bytes per parameter, per kept hidden activation, per attention
    // (head, key position), per vocabulary entry of the head (module doc).
    let (param_b, act_b, attn_b, vocab_b) = match precision {
        Precision::Fp32 => (16.0, 4.0, 9.0, 16.0),
        Precision::Mixed => (18.0, 3.0, 9.0, 16.0),
        Precision::Bf16 => (8.0, 2.0, 5.0, 16.0),
    };
    let block_per_token = act_b * (8.5 * h + s.ff_kept as f64 * i) + attn_b * s.heads as f64 * seq;
    let head_per_token = vocab_b * v + act_b * 3.0 * h;
    let embed_per_token = act_b * 2.25 * h;
    let per_sample = seq * (s.blocks as f64 * block_per_token + head_per_token + embed_per_token);
    Parts { runtime_mib, params_mib: param_b * s.params as f64 / MIB, per_sample_mib: per_sample / MIB, alpha: 1.0 }
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
        assert!((p.params_mib - 110e6 * 16.0 / MIB).abs() < 1e-6);
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
