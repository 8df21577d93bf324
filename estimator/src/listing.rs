//! Hierarchical module listings with `N params` per line (how the
//! transformers of the CARMA artifacts are described):
//!
//! ```text
//! BertForMaskedLM(
//!   (bert): BertModel(
//!     (embeddings): BertEmbeddings(
//!       (word_embeddings): Embedding(28996, 768, padding_idx=0), 22,268,928 params
//!     ...
//! ), 130,638,728 params
//! Total params: 130,638,728
//! ```
//! The root module's own count is used: the footer can disagree with it
//! (GPT-2: 3.5 B vs 838 M; XLNet: 82 M vs 117 M in the paper's files).

use crate::input::{Layer, ParseError};

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Listing {
    pub root_type: String,
    /// The root module's own parameter count.
    pub root_params: u64,
    pub footer_params: Option<u64>,
    /// Leaf modules (one line each), in order; output sizes are unknown here.
    pub leaves: Vec<Layer>,
    /// Repeated transformer blocks (`(N): BertLayer(`, `GPT2Block(`, ...).
    pub blocks: u32,
    /// From the largest Embedding: vocabulary and hidden size.
    pub vocab: Option<u64>,
    pub hidden: Option<u64>,
    /// From a position embedding (`position_embeddings`, `wpe`).
    pub max_positions: Option<u64>,
    /// The feed-forward width: the most frequent widening Linear output
    /// (one per block; a wider vocabulary decoder appears only once).
    pub intermediate: Option<u64>,
}

fn count(s: &str) -> Option<u64> {
    let digits: String = s.trim().chars().filter(|c| *c != ',').collect();
    digits.parse().ok()
}

/// `(name): Kind(args), N params` → (name, kind, args, N)
fn leaf(t: &str) -> Option<(&str, &str, &str, u64)> {
    let rest = t.strip_prefix('(')?;
    let (name, rest) = rest.split_once("): ")?;
    let (module, n) = rest.rsplit_once(", ")?;
    let n = count(n.strip_suffix(" params")?)?;
    let open = module.find('(')?;
    let args = module[open + 1..].strip_suffix(')')?;
    Some((name, &module[..open], args, n))
}

fn widen(widening: &mut Vec<(u64, u32)>, width: u64) {
    match widening.iter_mut().find(|(w, _)| *w == width) {
        Some((_, n)) => *n += 1,
        None => widening.push((width, 1)),
    }
}

fn first_ints(args: &str) -> Vec<u64> {
    args.split(',').map_while(|a| a.trim().parse::<u64>().ok()).collect()
}

fn named(args: &str, key: &str) -> Option<u64> {
    args.split(',').find_map(|a| a.trim().strip_prefix(key)?.strip_prefix('=')?.trim().parse().ok())
}

pub fn parse(text: &str, name: &str) -> Result<Listing, ParseError> {
    let err = |line: usize, m: &str| ParseError { file: name.to_string(), line, message: m.to_string() };
    let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
    let (_, first) = lines.next().ok_or_else(|| err(0, "empty file"))?;
    let root_type =
        first.trim().strip_suffix('(').filter(|t| !t.is_empty() && t.chars().all(|c| c.is_alphanumeric() || c == '_'));
    let root_type = root_type.ok_or_else(|| err(1, "expected the root module, e.g. 'BertForMaskedLM('"))?;
    let mut out = Listing { root_type: root_type.to_string(), ..Listing::default() };
    let mut root_params = None;
    let mut widening: Vec<(u64, u32)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if let Some(v) = t.strip_prefix("Total params:") {
            out.footer_params = Some(count(v).ok_or_else(|| err(i + 1, "Total params: expected a count"))?);
            continue;
        }
        // The root closes at column 0: "), N params".
        if let Some(n) = line.strip_prefix("), ").and_then(|r| r.strip_suffix(" params")) {
            root_params = Some(count(n).ok_or_else(|| err(i + 1, "expected '), N params'"))?);
            continue;
        }
        if let Some((lname, kind, args, n)) = leaf(t) {
            out.leaves.push(Layer { kind: kind.to_string(), out_elems: 0, params: n, channels: 0, folded_elems: 0 });
            if out.leaves.len() > 1_000_000 {
                return Err(err(i + 1, "more than 1000000 modules"));
            }
            match kind {
                "Embedding" => {
                    if let [rows, dim, ..] = first_ints(args)[..] {
                        if lname.contains("position") || lname == "wpe" {
                            out.max_positions = Some(rows);
                        } else if out.vocab.is_none_or(|v| rows > v) {
                            out.vocab = Some(rows);
                            out.hidden = Some(dim);
                        }
                    }
                }
                "Linear" => {
                    if let (Some(inp), Some(outf)) = (named(args, "in_features"), named(args, "out_features"))
                        && outf > inp
                    {
                        widen(&mut widening, outf);
                    }
                }
                // GPT-2's MLP up-projection prints as a bare `Conv1D()`: its
                // width comes from its count, hidden × width weights + width
                // biases. (Its `c_attn` is 3 × hidden wide: not the MLP.)
                "Conv1D" if lname == "c_fc" => {
                    if let Some(h) = out.hidden
                        && n % (h + 1) == 0
                        && n / (h + 1) > h
                    {
                        widen(&mut widening, n / (h + 1));
                    }
                }
                _ => {}
            }
        } else if let Some(rest) = t.strip_prefix('(') {
            // "(12): BertLayer(" opens a repeated block.
            if let Some((idx, module)) = rest.split_once("): ") {
                let kind = module.strip_suffix('(').unwrap_or("");
                if idx.bytes().all(|b| b.is_ascii_digit()) && (kind.ends_with("Layer") || kind.ends_with("Block")) {
                    out.blocks += 1;
                }
            }
        }
    }
    out.intermediate = widening.iter().max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0))).map(|(w, _)| *w);
    out.root_params =
        root_params.ok_or_else(|| err(0, "no closing '), N params' line for the root module (truncated?)"))?;
    if out.leaves.is_empty() {
        return Err(err(0, "no '(name): Module(...), N params' lines"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(file: &str) -> Listing {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/carma/model-summaries").join(file);
        let text = crate::input::read_bounded(&p).unwrap();
        parse(&text, file).unwrap()
    }

    #[test]
    fn the_papers_transformers() {
        let b = shared("BERT_base.model");
        assert_eq!(
            (b.root_params, b.blocks, b.hidden, b.vocab, b.max_positions, b.intermediate),
            (130_638_728, 12, Some(768), Some(28996), Some(512), Some(3072))
        );
        let l = shared("BERT_large.model");
        assert_eq!((l.blocks, l.hidden, l.intermediate), (24, Some(1024), Some(4096)));
        let g = shared("gpt2_large.model");
        assert_eq!(
            (g.root_type.as_str(), g.root_params, g.footer_params),
            ("DataParallel", 838_359_040, Some(3_504_431_104))
        );
        assert_eq!((g.blocks, g.hidden, g.vocab, g.max_positions), (36, Some(1280), Some(50257), Some(1024)));
        // Not the vocabulary decoder (the only widening Linear in the file):
        // the MLP's `Conv1D` c_fc, 6,558,720 = (1280 + 1) × 5120.
        assert_eq!(g.intermediate, Some(5120));
        let x = shared("xlnet_base_cased.model");
        assert_eq!((x.root_params, x.footer_params), (117_310_466, Some(81_874_178)), "root count, not the footer");
        assert_eq!((x.blocks, x.hidden), (12, Some(768)));
        assert_eq!(shared("xlnet_large_cased.model").blocks, 24);
    }

    #[test]
    fn bad_input_names_file_and_line() {
        let ok = "Net(\n  (fc): Linear(in_features=4, out_features=8, bias=True), 40 params\n), 40 params\n";
        assert_eq!(parse(ok, "n").unwrap().root_params, 40);
        for (text, needle) in [
            ("", "empty file"),
            ("garbage here\n", "line 1: expected the root module"),
            ("Net(\n  (fc): Linear(in_features=4, out_features=8, bias=True), 40 params\n", "truncated"),
            ("Net(\n), 40 params\n", "no '(name)"),
            ("Net(\n  (fc): Linear(), 40 params\n), lots params\n", "line 3: expected '), N params'"),
            ("\u{0}\u{ff}(", "expected the root module"),
        ] {
            let e = parse(text, "m.model").unwrap_err().to_string();
            assert!(e.starts_with("m.model") && e.contains(needle) && !e.contains('\n'), "{text:?}: {e}");
        }
    }
}
