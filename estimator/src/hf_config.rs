//! A Hugging Face `config.json`: the transformer's shape and its exact
//! parameter count, per model family (`model_type`): BERT/RoBERTa,
//! DistilBERT, GPT-2, the Llama family (Llama, Mistral, Qwen2, Gemma, Phi-3:
//! grouped-query attention, gated MLPs, RMSNorm, tied or untied heads, no
//! position embeddings), Phi-2, T5 and BART. Unknown types are counted as a
//! BERT-like encoder. The sequence length is the model's maximum positions
//! unless given.

use crate::input::ParseError;
use crate::transformer::Shape;
use serde_json::Value;

/// The families whose parameters are counted exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Bert,
    DistilBert,
    Gpt2,
    Llama,
    Phi,
    T5,
    Bart,
}

fn family(v: &Value) -> Family {
    match v.get("model_type").and_then(Value::as_str).unwrap_or("") {
        "distilbert" => Family::DistilBert,
        "gpt2" => Family::Gpt2,
        "llama" | "mistral" | "qwen2" | "gemma" | "gemma2" | "phi3" => Family::Llama,
        "phi" => Family::Phi,
        "t5" | "mt5" => Family::T5,
        "bart" | "mbart" => Family::Bart,
        _ if v.get("n_embd").is_some() => Family::Gpt2,
        _ if v.get("dim").is_some() && v.get("n_layers").is_some() => Family::DistilBert,
        _ => Family::Bert,
    }
}

/// Reads the numbers of one config, each bounded.
struct Keys<'a> {
    v: &'a Value,
    name: &'a str,
}

impl Keys<'_> {
    fn err(&self, m: String) -> ParseError {
        ParseError { file: self.name.to_string(), line: 0, message: m }
    }

    fn opt(&self, keys: &[&str]) -> Result<Option<u128>, ParseError> {
        match keys.iter().find_map(|k| self.v.get(*k).filter(|x| !x.is_null())) {
            None => Ok(None),
            Some(x) => x
                .as_u64()
                .filter(|n| (1..=1 << 20).contains(n))
                .map(|n| Some(u128::from(n)))
                .ok_or_else(|| self.err(format!("'{}' must be a whole number from 1 to 1048576", keys[0]))),
        }
    }

    fn need(&self, keys: &[&str]) -> Result<u128, ParseError> {
        self.opt(keys)?.ok_or_else(|| {
            self.err(format!("expected a positive integer '{}' (a Hugging Face config.json)", keys.join("' or '")))
        })
    }

    fn flag(&self, key: &str, default: bool) -> bool {
        self.v.get(key).and_then(Value::as_bool).unwrap_or(default)
    }
}

/// Shape fields before the parameter count.
struct Counted {
    blocks: u128,
    hidden: u128,
    heads: u128,
    kv_heads: u128,
    intermediate: u128,
    vocab: u128,
    seq: u128,
    params: u128,
}

/// A BERT/GPT-2-style block: biased Q, K, V and output projections, a
/// two-matrix feed-forward with biases, two LayerNorms.
fn classic_block(h: u128, i: u128) -> u128 {
    4 * (h * h + h) + (h * i + i) + (i * h + h) + 2 * 2 * h
}

fn count(k: &Keys, fam: Family) -> Result<Counted, ParseError> {
    Ok(match fam {
        Family::Bert => {
            let (h, l) = (k.need(&["hidden_size", "d_model"])?, k.need(&["num_hidden_layers", "num_layers"])?);
            let heads = k.need(&["num_attention_heads", "n_head"])?;
            let (v, p) = (k.need(&["vocab_size"])?, k.need(&["max_position_embeddings", "n_positions"])?);
            let i = k.opt(&["intermediate_size"])?.unwrap_or(4 * h);
            let types = k.opt(&["type_vocab_size"])?.unwrap_or(2);
            // embeddings + LayerNorm, blocks, pooler (as published: the base model)
            let params = (v + p + types) * h + 2 * h + l * classic_block(h, i) + h * h + h;
            Counted { blocks: l, hidden: h, heads, kv_heads: heads, intermediate: i, vocab: v, seq: p, params }
        }
        Family::DistilBert => {
            let (h, l) = (k.need(&["dim", "hidden_size"])?, k.need(&["n_layers", "num_hidden_layers"])?);
            let heads = k.need(&["n_heads", "num_attention_heads"])?;
            let (v, p) = (k.need(&["vocab_size"])?, k.need(&["max_position_embeddings"])?);
            let i = k.opt(&["hidden_dim", "intermediate_size"])?.unwrap_or(4 * h);
            let params = (v + p) * h + 2 * h + l * classic_block(h, i);
            Counted { blocks: l, hidden: h, heads, kv_heads: heads, intermediate: i, vocab: v, seq: p, params }
        }
        Family::Gpt2 => {
            let (h, l) = (k.need(&["n_embd", "hidden_size"])?, k.need(&["n_layer", "num_hidden_layers"])?);
            let heads = k.need(&["n_head", "num_attention_heads"])?;
            let (v, p) = (k.need(&["vocab_size"])?, k.need(&["n_positions", "n_ctx", "max_position_embeddings"])?);
            let i = k.opt(&["n_inner", "intermediate_size"])?.unwrap_or(4 * h);
            // token and position embeddings, blocks, final LayerNorm; the LM head is tied
            let params = (v + p) * h + l * classic_block(h, i) + 2 * h;
            Counted { blocks: l, hidden: h, heads, kv_heads: heads, intermediate: i, vocab: v, seq: p, params }
        }
        Family::Llama => {
            let (h, l) = (k.need(&["hidden_size"])?, k.need(&["num_hidden_layers"])?);
            let heads = k.need(&["num_attention_heads"])?;
            let kv = k.opt(&["num_key_value_heads"])?.unwrap_or(heads);
            let hd = k.opt(&["head_dim"])?.unwrap_or(h / heads);
            let (v, i) = (k.need(&["vocab_size"])?, k.need(&["intermediate_size"])?);
            let p = k.need(&["max_position_embeddings"])?;
            let (q, kvd) = (heads * hd, kv * hd);
            // Qwen2 biases Q, K and V; Llama and Mistral may (attention_bias).
            let qwen = k.v.get("model_type").and_then(Value::as_str) == Some("qwen2");
            let bias = if qwen || k.flag("attention_bias", false) { q + 2 * kvd } else { 0 };
            let block = h * q + 2 * h * kvd + q * h + bias + 3 * h * i + 2 * h;
            // transformers ties the head unless the config says otherwise.
            let head = if k.flag("tie_word_embeddings", true) { 0 } else { v * h };
            let params = v * h + l * block + h + head;
            Counted { blocks: l, hidden: h, heads, kv_heads: kv, intermediate: i, vocab: v, seq: p, params }
        }
        Family::Phi => {
            let (h, l) = (k.need(&["hidden_size"])?, k.need(&["num_hidden_layers"])?);
            let heads = k.need(&["num_attention_heads"])?;
            let (v, i, p) =
                (k.need(&["vocab_size"])?, k.need(&["intermediate_size"])?, k.need(&["max_position_embeddings"])?);
            // attention and MLP side by side after one LayerNorm; biased LM head
            let block = 4 * (h * h + h) + (h * i + i) + (i * h + h) + 2 * h;
            let head = if k.flag("tie_word_embeddings", true) { 0 } else { v * h } + v;
            let params = v * h + l * block + 2 * h + head;
            Counted { blocks: l, hidden: h, heads, kv_heads: heads, intermediate: i, vocab: v, seq: p, params }
        }
        Family::T5 => {
            let (d, heads) = (k.need(&["d_model"])?, k.need(&["num_heads"])?);
            let kvd = k.opt(&["d_kv"])?.unwrap_or(d / heads);
            let enc = k.need(&["num_layers"])?;
            let dec = k.opt(&["num_decoder_layers"])?.unwrap_or(enc);
            let (f, v) = (k.need(&["d_ff"])?, k.need(&["vocab_size"])?);
            let buckets = k.opt(&["relative_attention_num_buckets"])?.unwrap_or(32);
            let inner = heads * kvd;
            let attn = 4 * d * inner + d; // Q, K, V, O (no biases) + RMS-style LayerNorm
            let ff = if gated(k.v, Family::T5) { 3 } else { 2 } * d * f + d;
            // per stack: blocks, relative position buckets (first block), final LayerNorm
            let encoder = enc * (attn + ff) + buckets * heads + d;
            let decoder = dec * (2 * attn + ff) + buckets * heads + d;
            let head = if k.flag("tie_word_embeddings", true) { 0 } else { v * d };
            let params = v * d + encoder + decoder + head;
            let seq = k.opt(&["n_positions"])?.unwrap_or(512);
            Counted { blocks: enc + dec, hidden: d, heads, kv_heads: heads, intermediate: f, vocab: v, seq, params }
        }
        Family::Bart => {
            let d = k.need(&["d_model"])?;
            let heads = k.need(&["encoder_attention_heads", "num_attention_heads"])?;
            let (enc, dec) = (k.need(&["encoder_layers"])?, k.need(&["decoder_layers"])?);
            let (fe, fd) = (k.need(&["encoder_ffn_dim"])?, k.need(&["decoder_ffn_dim"])?);
            let (v, p) = (k.need(&["vocab_size"])?, k.need(&["max_position_embeddings"])?);
            let attn = 4 * (d * d + d) + 2 * d;
            let ffn = |f: u128| (d * f + f) + (f * d + d) + 2 * d;
            // learned positions carry an offset of 2; a LayerNorm on each side's embeddings
            let params = v * d + 2 * ((p + 2) * d + 2 * d) + enc * (attn + ffn(fe)) + dec * (2 * attn + ffn(fd));
            Counted { blocks: enc + dec, hidden: d, heads, kv_heads: heads, intermediate: fe, vocab: v, seq: p, params }
        }
    })
}

pub fn parse(text: &str, name: &str) -> Result<Shape, ParseError> {
    let err = |line: usize, m: String| ParseError { file: name.to_string(), line, message: m };
    let v: Value = serde_json::from_str(text).map_err(|e| err(e.line(), format!("not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(err(1, "expected a JSON object (a Hugging Face config.json)".into()));
    }
    let fam = family(&v);
    let c = count(&Keys { v: &v, name }, fam)?;
    let small = |x: u128, what: &str| u64::try_from(x).map_err(|_| err(0, format!("{what} {x} is implausible")));
    let params = u64::try_from(c.params)
        .ok()
        .filter(|p| *p < 1 << 44)
        .ok_or_else(|| err(0, format!("{} parameters is implausible", c.params)))?;
    Ok(Shape {
        blocks: small(c.blocks, "layers")?,
        hidden: small(c.hidden, "hidden size")?,
        heads: small(c.heads, "heads")?,
        intermediate: small(c.intermediate, "intermediate size")?,
        vocab: small(c.vocab, "vocabulary")?,
        seq: small(c.seq, "positions")?,
        params,
        ff_kept: Shape::ff_kept(gated(&v, fam), activation(&v, fam).as_deref()),
        ff_fp32: Shape::ff_fp32(activation(&v, fam).as_deref()),
        kv_heads: small(c.kv_heads, "key/value heads")?,
        fused_attention: fused_attention(&v, fam),
        rms_norm: matches!(fam, Family::Llama | Family::T5),
    })
}

/// Whether transformers runs this family's attention through PyTorch's
/// `scaled_dot_product_attention` (its default since 4.36 for these):
/// named families only, and not where the config asks for `eager`. T5's
/// relative attention and families we do not know keep probabilities.
fn fused_attention(v: &Value, fam: Family) -> bool {
    let named = v.get("model_type").and_then(Value::as_str).is_some_and(|t| {
        matches!(
            t,
            "bert"
                | "roberta"
                | "distilbert"
                | "gpt2"
                | "llama"
                | "mistral"
                | "qwen2"
                | "gemma"
                | "gemma2"
                | "phi3"
                | "phi"
                | "bart"
                | "mbart"
        )
    });
    let eager = ["attn_implementation", "_attn_implementation"]
        .iter()
        .any(|k| v.get(*k).and_then(Value::as_str).is_some_and(|s| s == "eager"));
    named && !eager && fam != Family::T5
}

/// Whether the MLP is gated: the Llama family's always is; T5's where
/// `feed_forward_proj` says `gated-...`.
fn gated(v: &Value, fam: Family) -> bool {
    fam == Family::Llama
        || (fam == Family::T5
            && v.get("feed_forward_proj").and_then(Value::as_str).is_some_and(|s| s.starts_with("gated")))
}

/// The MLP's activation by its Hugging Face name, with each family's
/// default where the config leaves it out (GPT-2's is `gelu_new`).
fn activation(v: &Value, fam: Family) -> Option<String> {
    let named = ["hidden_act", "activation_function", "hidden_activation", "dense_act_fn"]
        .iter()
        .find_map(|k| v.get(*k).and_then(Value::as_str));
    match (named, fam) {
        (Some(a), _) => Some(a.to_string()),
        (None, Family::Gpt2) => Some("gelu_new".into()),
        // T5's `gated-gelu` is `gelu_new` (transformers' T5Config).
        (None, Family::T5) => v
            .get("feed_forward_proj")
            .and_then(Value::as_str)
            .map(|p| if p == "gated-gelu" { "gelu_new".into() } else { p.trim_start_matches("gated-").into() }),
        (None, _) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(json: &str) -> u64 {
        parse(json, "config.json").unwrap().params
    }

    /// The counts `transformers` reports for the published checkpoints'
    /// configs (`model.num_parameters()` of the base model class; the
    /// checkpoints' model cards round them: 110 M, 66 M, 124 M, 1.1 B,
    /// 6.74 B, 7.24 B, 494 M, 2.51 B, 3.82 B, 2.78 B, 223 M, 139 M).
    #[test]
    fn published_checkpoints_count_exactly() {
        let cases: &[(&str, u64, &str)] = &[
            (
                "bert-base-uncased",
                109_482_240,
                r#"{"model_type": "bert", "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                   "intermediate_size": 3072, "vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2}"#,
            ),
            (
                "distilbert-base-uncased",
                66_362_880,
                r#"{"model_type": "distilbert", "dim": 768, "n_layers": 6, "n_heads": 12, "hidden_dim": 3072,
                   "vocab_size": 30522, "max_position_embeddings": 512}"#,
            ),
            (
                "gpt2",
                124_439_808,
                r#"{"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
                   "n_positions": 1024, "n_inner": null}"#,
            ),
            (
                "TinyLlama-1.1B",
                1_100_048_384,
                r#"{"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 22, "num_attention_heads": 32,
                   "num_key_value_heads": 4, "intermediate_size": 5632, "vocab_size": 32000,
                   "max_position_embeddings": 2048, "tie_word_embeddings": false}"#,
            ),
            (
                "Llama-2-7b",
                6_738_415_616,
                r#"{"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                   "num_key_value_heads": 32, "intermediate_size": 11008, "vocab_size": 32000,
                   "max_position_embeddings": 4096, "tie_word_embeddings": false}"#,
            ),
            (
                "Mistral-7B-v0.1",
                7_241_732_096,
                r#"{"model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                   "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000,
                   "max_position_embeddings": 32768, "tie_word_embeddings": false}"#,
            ),
            (
                "Qwen2-0.5B",
                494_032_768,
                r#"{"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
                   "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
                   "max_position_embeddings": 32768, "tie_word_embeddings": true}"#,
            ),
            (
                "gemma-2b",
                2_506_172_416,
                r#"{"model_type": "gemma", "hidden_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 8,
                   "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 16384, "vocab_size": 256000,
                   "max_position_embeddings": 8192}"#,
            ),
            (
                "Phi-3-mini-4k",
                3_821_079_552,
                r#"{"model_type": "phi3", "hidden_size": 3072, "num_hidden_layers": 32, "num_attention_heads": 32,
                   "num_key_value_heads": 32, "intermediate_size": 8192, "vocab_size": 32064,
                   "max_position_embeddings": 4096, "tie_word_embeddings": false}"#,
            ),
            (
                "phi-2",
                2_779_683_840,
                r#"{"model_type": "phi", "hidden_size": 2560, "num_hidden_layers": 32, "num_attention_heads": 32,
                   "intermediate_size": 10240, "vocab_size": 51200, "max_position_embeddings": 2048,
                   "tie_word_embeddings": false}"#,
            ),
            (
                "t5-base",
                222_903_552,
                r#"{"model_type": "t5", "d_model": 768, "d_kv": 64, "d_ff": 3072, "num_heads": 12, "num_layers": 12,
                   "num_decoder_layers": 12, "vocab_size": 32128, "relative_attention_num_buckets": 32,
                   "feed_forward_proj": "relu", "is_encoder_decoder": true, "n_positions": 512}"#,
            ),
            (
                "bart-base",
                139_420_416,
                r#"{"model_type": "bart", "d_model": 768, "encoder_layers": 6, "decoder_layers": 6,
                   "encoder_attention_heads": 12, "decoder_attention_heads": 12, "encoder_ffn_dim": 3072,
                   "decoder_ffn_dim": 3072, "vocab_size": 50265, "max_position_embeddings": 1024,
                   "is_encoder_decoder": true}"#,
            ),
        ];
        for (name, want, json) in cases {
            assert_eq!(params(json), *want, "{name}");
        }
    }

    #[test]
    fn the_shape_keeps_what_the_memory_model_reads() {
        let s = parse(
            r#"{"model_type": "distilbert", "dim": 768, "n_layers": 6, "n_heads": 12, "hidden_dim": 3072,
               "vocab_size": 30522, "max_position_embeddings": 512}"#,
            "c",
        )
        .unwrap();
        assert_eq!((s.blocks, s.hidden, s.heads, s.intermediate, s.seq), (6, 768, 12, 3072, 512));
        // Encoder and decoder blocks both count.
        let t5 = parse(
            r#"{"model_type": "t5", "d_model": 512, "d_ff": 2048, "num_heads": 8, "num_layers": 6, "vocab_size": 32128}"#,
            "c",
        )
        .unwrap();
        assert_eq!((t5.blocks, t5.seq), (12, 512));
        // Without a model_type, GPT-2's keys name the family.
        let g =
            parse(r#"{"n_embd": 1280, "n_layer": 36, "n_head": 20, "vocab_size": 50257, "n_positions": 1024}"#, "c")
                .unwrap();
        assert_eq!((g.intermediate, g.seq, g.params), (5120, 1024, 774_030_080));
    }

    #[test]
    fn the_mlp_kind_is_read_from_the_config() {
        let kept = |json: &str| parse(json, "c").unwrap().ff_kept;
        let gpt2 = r#"{"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024"#;
        // GPT-2's default activation is gelu_new, written as separate operations.
        assert_eq!(kept(&format!("{gpt2}}}")), 5);
        assert_eq!(kept(&format!(r#"{gpt2}, "activation_function": "gelu"}}"#)), 2);
        let llama = r#"{"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 2, "num_attention_heads": 32,
                       "intermediate_size": 5632, "vocab_size": 32000, "max_position_embeddings": 2048"#;
        assert_eq!(kept(&format!(r#"{llama}, "hidden_act": "silu"}}"#)), 4);
        let bert = r#"{"model_type": "bert", "hidden_size": 768, "num_hidden_layers": 2, "num_attention_heads": 12,
                      "intermediate_size": 3072, "vocab_size": 30522, "max_position_embeddings": 512"#;
        assert_eq!(kept(&format!(r#"{bert}, "hidden_act": "gelu"}}"#)), 2);
        let t5 = r#"{"model_type": "t5", "d_model": 512, "num_heads": 8, "d_kv": 64, "num_layers": 2, "d_ff": 1024,
                    "vocab_size": 32128"#;
        // T5 v1.1's gated-gelu is a gated gelu_new.
        assert_eq!(kept(&format!(r#"{t5}, "feed_forward_proj": "gated-gelu"}}"#)), 7);
        assert_eq!(kept(&format!(r#"{t5}, "feed_forward_proj": "relu"}}"#)), 2);
    }

    #[test]
    fn bad_configs_name_the_key() {
        let e = parse(r#"{"hidden_size": 768}"#, "c.json").unwrap_err().to_string();
        assert!(e.contains("num_hidden_layers"), "{e}");
        let e = parse("{\"hidden_size\": ", "c.json").unwrap_err().to_string();
        assert!(e.starts_with("c.json line 1: not valid JSON"), "{e}");
        let e = parse(r#"{"hidden_size": -1}"#, "c.json").unwrap_err().to_string();
        assert!(e.contains("hidden_size"), "{e}");
        let e = parse(r#"{"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 32000}"#, "c.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains("intermediate_size"), "{e}");
        assert!(parse("[1]", "c").is_err());
    }
}
