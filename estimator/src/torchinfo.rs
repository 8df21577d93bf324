//! torchinfo's table (torchsummary's maintained successor): a tree of
//! `Kind: depth-idx` rows under a `Layer (type:depth-idx)` header, columns
//! named in the header (`Input Shape`, `Output Shape`, `Param #`, ...), and
//! a footer:
//!
//! ```text
//! │    └─Conv2d: 2-1        [8, 3, 512, 512]    [8, 64, 256, 256]    9,408
//! Total params: 24,439,269
//! Forward/backward pass size (MB): 4932.50
//! ```
//!
//! Its depth limit folds blocks into one row, so the rows cannot give the
//! activations; the footer can. torchinfo computes it over every leaf
//! module with parameters, folded or not: 2 (forward and backward) × 4 bytes
//! × their output elements. That count, per sample, becomes the network's
//! `param_leaf_elems`.

use crate::input::{Layer, Network, ParseError};
use std::collections::BTreeMap;

const HEADER: &str = "Layer (type:depth-idx)";

pub fn is_torchinfo(text: &str) -> bool {
    text.lines().any(|l| l.contains(HEADER))
}

/// Parses the table; `name` is used in error messages.
pub fn parse(text: &str, name: &str) -> Result<Network, ParseError> {
    let err = |line: usize, m: String| ParseError { file: name.to_string(), line, message: m };
    let lines: Vec<&str> = text.lines().collect();
    let header =
        lines.iter().position(|l| l.contains(HEADER)).ok_or_else(|| err(0, format!("no '{HEADER}' header")))?;
    let rows = rows(&lines, header, &err)?;
    if rows.layers.is_empty() {
        return Err(err(header + 1, "the table has no rows".into()));
    }
    let mut net = Network::default();
    // Windowed attention with no child rows (torchvision's Swin calls its
    // projections as functions) runs what `windowed_attention` lists; its
    // parameters are already in the row and the footer's total. A window
    // attention whose projections are modules (timm's) has child rows.
    let depths = &rows.depths;
    for (i, layer) in rows.layers.into_iter().enumerate() {
        let leaf = depths.get(i + 1).is_none_or(|d| *d <= depths[i]);
        match crate::torchsummary::windowed_attention(&layer, rows.last_dims[i]).filter(|_| leaf) {
            Some(expanded) => {
                net.attention_blocks += 1;
                net.layers.extend(expanded);
            }
            None => net.layers.push(layer),
        }
    }
    let pass_mb = footer(&lines, &mut net, &err)?;
    // The most common first dimension: the root row may show a list of
    // images without one (Mask R-CNN's [3, 800, 1333]) or a final [100, 4].
    let batch = rows
        .batches
        .iter()
        .max_by_key(|(b, n)| (**n, **b))
        .map(|(b, _)| *b)
        .ok_or_else(|| err(header + 1, "no row has a batched output shape".into()))?;
    net.batch_in_file = Some(batch);
    let mb = pass_mb.ok_or_else(|| err(0, "no 'Forward/backward pass size (MB)' line in the footer".into()))?;
    if !(mb.is_finite() && mb >= 0.0) {
        return Err(err(0, "Forward/backward pass size: out of range".into()));
    }
    // torchinfo's MB are 10^6 bytes; 2 passes × 4 bytes per element.
    net.param_leaf_elems = Some((mb * 1e6 / 8.0 / batch as f64).ceil() as u64);
    Ok(net)
}

/// A line number (1-based) and a message to an error.
type ErrAt<'a> = dyn Fn(usize, String) -> ParseError + 'a;

/// The table's rows, before windowed attention is expanded.
struct Rows {
    layers: Vec<Layer>,
    /// Each row's depth (`Kind: depth-idx`) and its output's last dimension.
    depths: Vec<u32>,
    last_dims: Vec<u64>,
    /// First dimension of each output shape -> rows that have it.
    batches: BTreeMap<u64, usize>,
}

/// The rows under the header at line index `header`, up to the `====`
/// line that ends them.
fn rows(lines: &[&str], header: usize, err: &ErrAt) -> Result<Rows, ParseError> {
    let columns = columns(lines[header]);
    let col = |name: &str| columns.iter().position(|(n, _)| n == name);
    let (Some(out_col), Some(param_col)) = (col("Output Shape"), col("Param #")) else {
        return Err(err(header + 1, "the header names no 'Output Shape' and 'Param #' columns".into()));
    };
    let in_col = col("Input Shape");
    let mut rows = Rows { layers: Vec::new(), depths: Vec::new(), last_dims: Vec::new(), batches: BTreeMap::new() };
    for (i, line) in lines.iter().enumerate().skip(header + 2) {
        let n = i + 1;
        let t = line.trim();
        if t.starts_with("====") {
            break;
        }
        if t.is_empty() {
            continue;
        }
        let chars: Vec<char> = line.chars().collect();
        let field = |c: usize| -> String {
            let start = columns[c].1.min(chars.len());
            let end = columns.get(c + 1).map_or(chars.len(), |next| next.1).min(chars.len());
            chars[start..end].iter().collect::<String>().trim().to_string()
        };
        let label: String = field(0);
        let kind =
            label.trim_start_matches(['│', '├', '└', '─', ' ']).split(':').next().unwrap_or("").trim().to_string();
        if kind.is_empty() {
            return Err(err(n, "expected a 'Kind: depth-idx' row".into()));
        }
        let params = match field(param_col).as_str() {
            "--" | "" | "(recursive)" => 0,
            p => p.replace(',', "").parse::<u64>().map_err(|_| err(n, format!("Param # '{p}' is not a number")))?,
        };
        let depth = label.split(':').nth(1).and_then(|d| d.trim().split('-').next()?.parse().ok()).unwrap_or(0);
        let (batch, out_elems, channels) = shape(&field(out_col));
        // A block folded into this row may widen, then resample (a U-Net
        // decoder block up-samples its input before convolving it).
        let folded_elems = match in_col.map(|c| shape(&field(c))) {
            Some((_, in_elems, in_channels)) if params > 0 && in_channels > 0 && channels > 0 => {
                let spatial = (in_elems / in_channels).max(out_elems / channels);
                spatial.saturating_mul(in_channels.max(channels))
            }
            _ => 0,
        };
        if let Some(b) = batch.filter(|b| *b > 0) {
            *rows.batches.entry(b).or_insert(0) += 1;
        }
        rows.layers.push(Layer { kind, out_elems, params, channels, folded_elems });
        rows.depths.push(depth);
        rows.last_dims.push(last_dim(&field(out_col)));
        if rows.layers.len() > 100_000 {
            return Err(err(n, "more than 100000 rows".into()));
        }
    }
    // A row whose children follow it (one level deeper) is not folded.
    for i in 1..rows.depths.len() {
        if rows.depths[i] > rows.depths[i - 1] {
            rows.layers[i - 1].folded_elems = 0;
        }
    }
    Ok(rows)
}

/// Reads the footer's total parameters into `net`; returns its
/// `Forward/backward pass size (MB)`.
fn footer(lines: &[&str], net: &mut Network, err: &ErrAt) -> Result<Option<f64>, ParseError> {
    let mut pass_mb = None;
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim();
        if let Some(v) = t.strip_prefix("Total params:") {
            net.total_params =
                Some(v.trim().replace(',', "").parse().map_err(|_| err(i + 1, "Total params: not a number".into()))?);
        } else if let Some(v) = t.strip_prefix("Forward/backward pass size (MB):") {
            pass_mb = Some(
                v.trim().parse::<f64>().map_err(|_| err(i + 1, "Forward/backward pass size: not a number".into()))?,
            );
        }
    }
    Ok(pass_mb)
}

/// The header's column names and the char offsets where they start.
fn columns(header: &str) -> Vec<(String, usize)> {
    let chars: Vec<char> = header.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == ' ' {
            i += 1;
            continue;
        }
        // A name runs until two blanks in a row.
        let start = i;
        while i < chars.len() && !(chars[i] == ' ' && chars.get(i + 1).is_none_or(|c| *c == ' ')) {
            i += 1;
        }
        out.push((chars[start..i].iter().collect::<String>(), start));
    }
    out
}

/// `[8, 64, 256, 256]` → (batch 8, 64·256·256 per sample); anything else
/// (`--`, lists of shapes) → no batch, no elements.
fn shape(s: &str) -> (Option<u64>, u64, u64) {
    let Some(inner) = s.strip_prefix('[').and_then(|r| r.strip_suffix(']')) else { return (None, 0, 0) };
    let dims: Option<Vec<u64>> = inner.split(',').map(|d| d.trim().parse().ok()).collect();
    match dims.as_deref() {
        Some([b, rest @ ..]) if !rest.is_empty() => {
            let elems = rest.iter().try_fold(1u64, |acc, d| acc.checked_mul(*d)).unwrap_or(0);
            // A feature map ([b, c, h, w] or [b, c, l]): its channels.
            let channels = if rest.len() >= 2 { rest[0] } else { 0 };
            (Some(*b), elems, channels)
        }
        _ => (None, 0, 0),
    }
}

/// The last dimension of `[8, 56, 56, 96]` (channels-last maps: Swin's).
fn last_dim(s: &str) -> u64 {
    s.strip_suffix(']').and_then(|r| r.rsplit(',').next()).and_then(|d| d.trim().parse().ok()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::{PARAM_LEAF_RETENTION, param_leaf_elems};

    fn data(name: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/carma/model-summaries").join(name)
    }

    #[test]
    fn a_folded_row_bounds_its_insides_by_its_widest_channels_at_its_finest_resolution() {
        let text = std::fs::read_to_string(data("UNet.model")).unwrap();
        let net = parse(&text, "UNet.model").unwrap();
        let row = |kind: &str| net.layers.iter().rfind(|l| l.kind == kind).unwrap();
        // UnetDecoderBlock 3-21: [8, 32, 256, 256] -> [8, 16, 512, 512]: it
        // up-samples 32 channels to 512 x 512 before convolving them.
        assert_eq!(row("UnetDecoderBlock").folded_elems, 32 * 512 * 512);
        // The encoder's rows list their children: not folded.
        assert_eq!(row("ResNetEncoder").folded_elems, 0);
        assert_eq!(row("Sequential").folded_elems, 0);
    }

    #[test]
    fn the_papers_torchinfo_tables_parse_with_their_footers() {
        for (file, batch, params, pass_mb) in [
            ("UNet.model", 8, 24_439_269, 4932.50),
            ("maskrcnn.model", 8, 44_454_513, 38090.84),
            ("dlrm.model", 32768, 909_313, 772.01),
        ] {
            let text = crate::input::read_bounded(&data(file)).unwrap();
            assert!(is_torchinfo(&text), "{file}");
            let n = parse(&text, file).unwrap();
            assert_eq!((n.batch_in_file, n.params()), (Some(batch), params), "{file}");
            let per_sample = n.param_leaf_elems.unwrap() as f64;
            assert!((per_sample * 8.0 * batch as f64 / 1e6 - pass_mb).abs() < 0.01, "{file}: {per_sample}");
            assert!(n.layers.len() > 10 && n.layers.iter().any(|l| l.kind == "Conv2d" || l.kind == "Linear"), "{file}");
        }
    }

    /// The constant turning torchinfo's count into autograd's retained
    /// elements must cover every network whose full table we have.
    #[test]
    fn the_retention_constant_covers_every_torchsummary_table_of_the_paper() {
        let dir = data("");
        let mut worst: (f64, String) = (0.0, String::new());
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let text = crate::input::read_bounded(&e.path()).unwrap();
            if !text.contains("Layer (type)  ") {
                continue;
            }
            let n = crate::torchsummary::parse(&text, "t").unwrap();
            let kept_elems = crate::kept::kept(&n, carma_config::Precision::Fp32).saved_bytes / 4.0;
            let ratio = kept_elems / param_leaf_elems(&n) as f64;
            if ratio > worst.0 {
                worst = (ratio, e.file_name().to_string_lossy().into_owned());
            }
        }
        println!("highest retained / parametrised-leaf ratio: {:.3} ({})", worst.0, worst.1);
        assert!(worst.0 > 1.0 && PARAM_LEAF_RETENTION >= worst.0, "{worst:?}");
    }

    /// torchvision's Swin-T in torchinfo: the attention row carries its
    /// parameters (QKV and output projections, 4C² + 4C, and the 13² × 3
    /// bias table) but no child rows, since it calls its projections as
    /// functions. Its QKV output and window scores are counted; the same
    /// row with child rows (timm's modules) is left to them.
    #[test]
    fn windowed_attention_without_child_rows_counts_its_scores() {
        let row = |label: &str, shape: &str, params: &str| format!("{label:<46}{shape:<26}{params}\n");
        let attn = 4 * 96 * 96 + 4 * 96 + 13 * 13 * 3;
        let mut t = "=".repeat(80) + "\n";
        t += &row("Layer (type:depth-idx)", "Output Shape", "Param #");
        t += &("=".repeat(80) + "\n");
        t += &row("SwinTransformer", "[8, 1000]", "--");
        t += &row("├─Sequential: 1-1", "--", "--");
        t += &row("│    └─Sequential: 2-1", "[8, 56, 56, 96]", "--");
        t += &row("│    │    └─Conv2d: 3-1", "[8, 96, 56, 56]", "4,704");
        t += &row("│    │    └─Permute: 3-2", "[8, 56, 56, 96]", "--");
        t += &row("│    │    └─LayerNorm: 3-3", "[8, 56, 56, 96]", "192");
        t += &row("│    └─SwinTransformerBlock: 2-2", "[8, 56, 56, 96]", "--");
        t += &row("│    │    └─LayerNorm: 3-4", "[8, 56, 56, 96]", "192");
        t += &row("│    │    └─ShiftedWindowAttention: 3-5", "[8, 56, 56, 96]", &attn.to_string());
        let child = row("│    │    │    └─Linear: 4-1", "[8, 3136, 288]", "27,936");
        t += "CHILD";
        t += &row("│    │    └─StochasticDepth: 3-6", "[8, 56, 56, 96]", "--");
        t += &("=".repeat(80) + "\n");
        t += &format!("Total params: {}\n", 4704 + 192 + 192 + attn);
        t += "Forward/backward pass size (MB): 77.07\n";
        let n = parse(&t.replace("CHILD", ""), "swin.model").unwrap();
        let tokens = 56 * 56;
        assert_eq!(n.attention_blocks, 1);
        assert_eq!(n.params(), 4704 + 192 + 192 + attn, "the footer's total, not counted twice");
        let kinds: Vec<&str> = n.layers.iter().map(|l| l.kind.as_str()).collect();
        assert_eq!(kinds[8..13], ["Linear", "MatMul", "Softmax", "MatMul", "Linear"], "{kinds:?}");
        assert_eq!(n.layers[10].out_elems, 3 * 49 * tokens, "3 heads x a 7x7 window per token");
        let kept = |text: &str| crate::kept::kept(&parse(text, "t").unwrap(), carma_config::Precision::Fp32);
        let without = kept(&t.replace("CHILD", "").replace("ShiftedWindowAttention", "Identity"));
        let more = (3 * 96 + 3 * 49) as f64 * tokens as f64 * 4.0;
        assert!(kept(&t.replace("CHILD", "")).saved_bytes - without.saved_bytes >= more);
        // With its projections as child rows, the rows are the count.
        let with_child = parse(&t.replace("CHILD", &child), "t").unwrap();
        assert_eq!(with_child.attention_blocks, 0);
        assert!(with_child.layers.iter().any(|l| l.kind == "ShiftedWindowAttention"));
    }

    #[test]
    fn malformed_tables_are_one_line_errors() {
        let head = "Layer (type:depth-idx)                   Output Shape              Param #\n====\n";
        for (text, want) in [
            ("Layer (type:depth-idx)   Kernel Shape\n====\nNet: 1  --\n====\n", "no 'Output Shape'"),
            (
                &format!("{head}Net                                      [8, 10]                   x1\n====\n") as &str,
                "Param #",
            ),
            (
                &format!("{head}Net                                      [8, 10]                   10\n====\n"),
                "Forward/backward",
            ),
            (&format!("{head}====\n"), "no rows"),
        ] {
            let e = parse(text, "m.model").unwrap_err().to_string();
            assert!(e.contains(want) && !e.contains('\n'), "{e}");
        }
    }
}
