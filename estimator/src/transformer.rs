//! The analytic estimate for transformer training (no training set exists
//! for them): weights, gradients and Adam's two moments at 16 bytes per
//! parameter, plus what autograd keeps per token in fp32:
//! - per block, 8.5 x hidden + 2 x feed-forward width floats (LayerNorm
//!   inputs and outputs, Q, K, V, attention context, the two feed-forward
//!   activations, two dropout masks) and 9 bytes per head and key position
//!   (softmax output, dropout mask, dropout output);
//! - the language-model head: logits, their log-softmax and their gradient
//!   (3 x vocabulary floats);
//! - the embeddings' sum, LayerNorm and dropout mask.
//! Without a sequence length the model's maximum positions are used: the
//! worst case a training script can feed.

use crate::layers_model::Parts;

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
}

impl Shape {
    /// Heads are not in module listings; 64 per head is what BERT, GPT-2
    /// and XLNet use.
    pub fn default_heads(hidden: u64) -> u64 {
        (hidden / 64).max(1)
    }
}

pub fn parts(s: &Shape, runtime_mib: u64) -> Parts {
    let (h, i, v, seq) = (s.hidden as f64, s.intermediate as f64, s.vocab as f64, s.seq as f64);
    let block_per_token = 4.0 * (8.5 * h + 2.0 * i) + 9.0 * s.heads as f64 * seq;
    let head_per_token = 4.0 * (3.0 * v + 3.0 * h);
    let embed_per_token = 4.0 * 2.25 * h;
    let per_sample = seq * (s.blocks as f64 * block_per_token + head_per_token + embed_per_token);
    Parts { runtime_mib, params_mib: 16.0 * s.params as f64 / MIB, per_sample_mib: per_sample / MIB, alpha: 1.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bert_base(seq: u64) -> Shape {
        Shape { blocks: 12, hidden: 768, heads: 12, intermediate: 3072, vocab: 30522, seq, params: 110_000_000 }
    }

    #[test]
    fn attention_grows_quadratically_with_sequence() {
        let short = parts(&bert_base(128), 0).per_sample_mib;
        let long = parts(&bert_base(512), 0).per_sample_mib;
        // 4x the tokens, each attending to 4x the positions: more than 4x.
        assert!(long > 4.0 * short, "{short} {long}");
        assert!(long < 16.0 * short, "{short} {long}");
    }

    #[test]
    fn weights_gradients_and_adam_are_16_bytes_per_parameter() {
        let p = parts(&bert_base(512), 700);
        assert!((p.params_mib - 110e6 * 16.0 / MIB).abs() < 1e-6);
        assert!(p.at_batch(2) > p.at_batch(1));
    }
}
