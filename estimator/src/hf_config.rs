//! A Hugging Face `config.json`: the transformer's shape. Parameters are
//! counted from it (embeddings, blocks, LM head transform); the sequence
//! length is the model's maximum positions unless given.

use crate::input::ParseError;
use crate::transformer::Shape;
use serde_json::Value;

fn pick(v: &Value, keys: &[&str]) -> Option<u64> {
    keys.iter().find_map(|k| v.get(*k).and_then(Value::as_u64))
}

pub fn parse(text: &str, name: &str) -> Result<Shape, ParseError> {
    let err = |line: usize, m: String| ParseError { file: name.to_string(), line, message: m };
    let v: Value = serde_json::from_str(text).map_err(|e| err(e.line(), format!("not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(err(1, "expected a JSON object (a Hugging Face config.json)".into()));
    }
    if v.get("is_encoder_decoder").and_then(Value::as_bool) == Some(true) {
        return Err(err(0, "encoder-decoder models are not supported yet: give --carma-mem".into()));
    }
    let need = |keys: &[&str]| {
        pick(&v, keys).filter(|n| (1..=1 << 20).contains(n)).ok_or_else(|| {
            err(0, format!("expected a positive integer '{}' (a Hugging Face config.json)", keys.join("' or '")))
        })
    };
    let hidden = need(&["hidden_size", "n_embd", "d_model"])?;
    let blocks = need(&["num_hidden_layers", "n_layer", "num_layers"])?;
    let heads = need(&["num_attention_heads", "n_head"])?;
    let vocab = need(&["vocab_size"])?;
    let positions = need(&["max_position_embeddings", "n_positions", "n_ctx"])?;
    let intermediate = pick(&v, &["intermediate_size", "n_inner", "d_inner"]).unwrap_or(4 * hidden);
    if intermediate > 1 << 20 {
        return Err(err(0, format!("intermediate_size {intermediate} is implausible")));
    }
    // embeddings (tokens, positions, 2 token types) + per block (QKV and
    // output projections, feed-forward, two LayerNorms) + LM head transform
    let (h, i) = (u128::from(hidden), u128::from(intermediate));
    let per_block = 4 * h * h + 4 * h + 2 * h * i + i + h + 4 * h;
    let total = (u128::from(vocab + positions) + 2) * h
        + 2 * h
        + u128::from(blocks) * per_block
        + h * h
        + 3 * h
        + u128::from(vocab);
    let params = u64::try_from(total)
        .ok()
        .filter(|p| *p < 1 << 44)
        .ok_or_else(|| err(0, format!("{total} parameters is implausible")))?;
    Ok(Shape { blocks, hidden, heads, intermediate, vocab, seq: positions, params })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BERT_BASE: &str = r#"{"architectures": ["BertForMaskedLM"], "hidden_size": 768,
        "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
        "vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2}"#;

    #[test]
    fn bert_base_counts_its_published_parameters() {
        let s = parse(BERT_BASE, "config.json").unwrap();
        assert_eq!((s.blocks, s.hidden, s.heads, s.intermediate, s.seq), (12, 768, 12, 3072, 512));
        // BertForMaskedLM bert-base-uncased: 109.5 M (110 M as published)
        assert!((108_000_000..112_000_000).contains(&s.params), "{}", s.params);
    }

    #[test]
    fn gpt2_keys_and_default_feed_forward() {
        let s =
            parse(r#"{"n_embd": 1280, "n_layer": 36, "n_head": 20, "vocab_size": 50257, "n_positions": 1024}"#, "c")
                .unwrap();
        assert_eq!((s.intermediate, s.seq), (5120, 1024));
        // GPT-2 large: 774 M
        assert!((760_000_000..800_000_000).contains(&s.params), "{}", s.params);
    }

    #[test]
    fn bad_configs_name_the_key() {
        let e = parse(r#"{"hidden_size": 768}"#, "c.json").unwrap_err().to_string();
        assert!(e.contains("num_hidden_layers"), "{e}");
        let e = parse("{\"hidden_size\": ", "c.json").unwrap_err().to_string();
        assert!(e.starts_with("c.json line 1: not valid JSON"), "{e}");
        let e = parse(r#"{"hidden_size": -1}"#, "c.json").unwrap_err().to_string();
        assert!(e.contains("hidden_size"), "{e}");
        assert!(parse("[1]", "c").is_err());
    }
}
