//! torchsummary's table (`Layer (type)  Output Shape  Param #` and its
//! footer), the format of the CNN descriptions in the CARMA artifacts:
//!
//! ```text
//!             Conv2d-1         [32, 64, 112, 112]           9,408
//! ================================================================
//! Total params: 25,557,032
//! ```
//! The first shape dimension is the batch size (or -1).

use crate::input::{Layer, Network, ParseError};

/// Parses the table; `name` is used in error messages.
pub fn parse(text: &str, name: &str) -> Result<Network, ParseError> {
    let err = |line: usize, m: String| ParseError { file: name.to_string(), line, message: m };
    let header =
        text.lines().position(|l| l.contains("Layer (type)") && l.contains("Output Shape") && l.contains("Param #"));
    let Some(header) = header else {
        return Err(err(0, "no torchsummary table (expected a 'Layer (type)  Output Shape  Param #' header)".into()));
    };
    let mut net = Network::default();
    let mut in_table = false;
    // Parameters of windowed attention, which the table's rows and footer miss.
    let mut hidden_params = 0u64;
    for (i, line) in text.lines().enumerate().skip(header + 1) {
        let n = i + 1;
        let t = line.trim();
        if t.starts_with("====") {
            if in_table {
                break;
            }
            in_table = true;
            continue;
        }
        if !in_table || t.is_empty() {
            continue;
        }
        let (layer, batch, last_dim) = parse_row(t).map_err(|m| err(n, m))?;
        if net.layers.is_empty() {
            // -1 means "any batch size".
            net.batch_in_file = u64::try_from(batch).ok().filter(|b| *b > 0);
        }
        // Its row shows 0 parameters: torchsummary sees no `weight` or `bias`.
        match windowed_attention(&layer, last_dim).filter(|_| layer.params == 0) {
            Some(rows) => {
                hidden_params += rows.iter().map(|l| l.params).sum::<u64>();
                net.attention_blocks += 1;
                net.layers.extend(rows);
            }
            None => net.layers.push(layer),
        }
        if net.layers.len() > 100_000 {
            return Err(err(n, "more than 100000 layers".into()));
        }
    }
    if net.layers.is_empty() {
        return Err(err(header + 1, "the table has no layer rows".into()));
    }
    for (i, line) in text.lines().enumerate() {
        if let Some(v) = line.trim().strip_prefix("Total params:") {
            let total = number(v).map_err(|m| err(i + 1, format!("Total params: {m}")))?;
            net.total_params = Some(total.saturating_add(hidden_params));
        }
        // torchsummary's input size is fp32 MB for the batch it was made
        // with (or 1 for -1): the data batch's elements per sample.
        if let Some(v) = line.trim().strip_prefix("Input size (MB):") {
            let mb: f64 = v.trim().parse().unwrap_or(0.0);
            let per = mb * 1024.0 * 1024.0 / 4.0 / net.batch_in_file.unwrap_or(1) as f64;
            if (0.0..1e15).contains(&per) {
                net.input_elems = Some(per.round() as u64);
            }
        }
    }
    Ok(net)
}

/// `Kind-N  [b, d1, d2, ...]  params` → the layer and its batch dimension
/// A row of windowed attention whose weights torchsummary cannot see:
/// torchvision's Swin (`ShiftedWindowAttention`, `...V2`) passes its
/// `qkv` and `proj` weights to a function instead of calling them, so the
/// table has no rows for them, and the row itself shows 0 parameters (its
/// relative-position bias table is neither a `weight` nor a `bias`). What
/// that function runs, per token of the `[batch, H, W, C]` output, as rows
/// the chain rule of `kept.rs` counts: the QKV projection (saves its input,
/// 3C out), Q·Kᵀ (saves Q and K; V is in the same tensor) with the bias
/// table's parameters, the softmax over the window (kept: its result,
/// fp32 under autocast), attention·V (saves the probabilities, with a bf16
/// copy under autocast) and the output projection. Swin's heads are 32
/// channels wide; a window is 7×7 (8×8 for V2). torchinfo's tables show
/// the same row with no child rows (`torchinfo.rs`).
pub(crate) fn windowed_attention(row: &Layer, channels_last: u64) -> Option<Vec<Layer>> {
    let kind = row.kind.to_ascii_lowercase();
    if !(kind.ends_with("windowattention") || kind.ends_with("windowattentionv2")) {
        return None;
    }
    let c = channels_last;
    if c == 0 || !row.out_elems.is_multiple_of(c) {
        return None;
    }
    let tokens = row.out_elems / c;
    let heads = (c / 32).max(1);
    let (window, area) = if kind.ends_with("v2") { (8u64, 64u64) } else { (7, 49) };
    let scores = heads.checked_mul(area)?.checked_mul(tokens)?;
    let bias_table = (2 * window - 1) * (2 * window - 1) * heads;
    let row = |kind: &str, out_elems: u64, params: u64| Layer {
        kind: kind.into(),
        out_elems,
        params,
        channels: 0,
        folded_elems: 0,
    };
    Some(vec![
        row("Linear", 3 * c * tokens, 3 * c * c + 3 * c),
        row("MatMul", scores, bias_table),
        row("Softmax", scores, 0),
        row("MatMul", c * tokens, 0),
        row("Linear", c * tokens, c * c + c),
    ])
}

fn parse_row(t: &str) -> Result<(Layer, i64, u64), String> {
    let open = t.find('[').ok_or("expected an output shape like [32, 64, 112, 112]")?;
    let close = t.rfind(']').filter(|&c| c > open).ok_or("expected ']' closing the output shape")?;
    let name = t[..open].trim();
    let (kind, index) =
        name.rsplit_once('-').ok_or_else(|| format!("expected 'Kind-N' before the shape, found '{name}'"))?;
    if kind.is_empty() || index.parse::<u32>().is_err() {
        return Err(format!("expected 'Kind-N' before the shape, found '{name}'"));
    }
    // Several outputs ([[-1, 1000], [-1, 1000]]) count together.
    let shapes = t[open..=close].replace(['[', ']'], " ");
    let dims: Vec<i64> = shapes
        .split([',', ' '])
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<i64>().map_err(|_| format!("'{s}' is not a dimension")))
        .collect::<Result<_, _>>()?;
    let (&batch, rest) = dims.split_first().ok_or("empty output shape")?;
    let mut elems: u64 = 1;
    for &d in rest {
        let d = u64::try_from(d).map_err(|_| format!("negative dimension {d}"))?;
        elems = elems.checked_mul(d).ok_or("output shape overflows")?;
    }
    let params = number(t[close + 1..].trim())?;
    // One feature map ([b, c, h, w] or [b, c, l]): its channels.
    let single = !t[open + 1..close].contains('[');
    let channels = if single && rest.len() >= 2 { u64::try_from(rest[0]).unwrap_or(0) } else { 0 };
    let last = rest.last().and_then(|&d| u64::try_from(d).ok()).filter(|_| single).unwrap_or(0);
    Ok((Layer { kind: kind.to_string(), out_elems: elems, params, channels, folded_elems: 0 }, batch, last))
}

/// `25,557,032` → 25557032
fn number(s: &str) -> Result<u64, String> {
    let digits: String = s.trim().chars().filter(|c| *c != ',').collect();
    digits.parse::<u64>().map_err(|_| format!("'{}' is not a count", s.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const RESNET_HEAD: &str = "----------------------------------------------------------------
        Layer (type)               Output Shape         Param #
================================================================
            Conv2d-1         [32, 64, 112, 112]           9,408
       BatchNorm2d-2         [32, 64, 112, 112]             128
              ReLU-3         [32, 64, 112, 112]               0
            Linear-4                 [32, 1000]       2,049,000
================================================================
Total params: 2,058,536
";

    #[test]
    fn parses_rows_and_footer() {
        let n = parse(RESNET_HEAD, "r.model").unwrap();
        assert_eq!(n.layers.len(), 4);
        assert_eq!(
            n.layers[0],
            Layer { kind: "Conv2d".into(), out_elems: 64 * 112 * 112, params: 9408, channels: 64, folded_elems: 0 }
        );
        assert_eq!(n.layers[3].out_elems, 1000);
        assert_eq!(n.total_params, Some(2_058_536));
        assert_eq!(n.params(), 2_058_536);
        assert_eq!(n.batch_in_file, Some(32));
        assert_eq!(parse(&RESNET_HEAD.replace("[32,", "[-1,"), "r").unwrap().batch_in_file, None);
    }

    /// torchvision's Swin-T, first block: the attention row shows 0
    /// parameters and no child rows. Its QKV and output projections (4C² +
    /// 4C), the bias table (13² × 3 heads) and the window scores are counted.
    #[test]
    fn windowed_attention_rows_count_their_hidden_weights_and_scores() {
        let table = "        Layer (type)               Output Shape         Param #
================================================================
            Conv2d-1           [-1, 96, 56, 56]           4,704
           Permute-2           [-1, 56, 56, 96]               0
         LayerNorm-3           [-1, 56, 56, 96]             192
         LayerNorm-4           [-1, 56, 56, 96]             192
ShiftedWindowAttention-5           [-1, 56, 56, 96]               0
   StochasticDepth-6           [-1, 56, 56, 96]               0
================================================================
Total params: 5,088
";
        let n = parse(table, "swin.model").unwrap();
        let tokens = 56 * 56;
        assert_eq!(n.attention_blocks, 1);
        assert_eq!(n.params(), 5088 + 4 * 96 * 96 + 4 * 96 + 13 * 13 * 3);
        let kinds: Vec<&str> = n.layers.iter().map(|l| l.kind.as_str()).collect();
        assert_eq!(kinds[4..9], ["Linear", "MatMul", "Softmax", "MatMul", "Linear"]);
        assert_eq!(n.layers[6].out_elems, 3 * 49 * tokens, "3 heads x a 7x7 window per token");
        let k = crate::kept::kept(&n, carma_config::Precision::Fp32);
        let without = crate::kept::kept(
            &parse(&table.replace("ShiftedWindowAttention", "Identity"), "t").unwrap(),
            carma_config::Precision::Fp32,
        );
        // The QKV output and the probabilities at least, 4 B each.
        let more = (3 * 96 + 3 * 49) as f64 * tokens as f64 * 4.0;
        assert!(k.saved_bytes - without.saved_bytes >= more, "{} {}", k.saved_bytes, without.saved_bytes);
    }

    #[test]
    fn bad_input_names_file_and_line() {
        let cases = [
            ("", "no torchsummary table"),
            ("\u{0}\u{1}binary", "no torchsummary table"),
            (&RESNET_HEAD[..RESNET_HEAD.find("ReLU").unwrap()], ""),
            (
                &RESNET_HEAD.replace("[32, 64, 112, 112]           9,408", "[32, 64, x]  1"),
                "line 4: 'x' is not a dimension",
            ),
            (&RESNET_HEAD.replace("9,408", "lots"), "line 4: 'lots' is not a count"),
            (&RESNET_HEAD.replace("[32, 1000]", "[32, -5]"), "line 7: negative dimension -5"),
            (&RESNET_HEAD.replace("[32, 1000]", "[32, 99999999999, 99999999999]"), "overflows"),
        ];
        for (text, needle) in cases {
            match parse(text, "m.model") {
                Ok(n) => assert!(needle.is_empty(), "{text:?} parsed: {n:?}"),
                Err(e) => {
                    let line = e.to_string();
                    assert!(line.starts_with("m.model") && line.contains(needle) && !line.contains('\n'), "{line}");
                }
            }
        }
    }

    #[test]
    fn every_torchsummary_file_of_the_paper_parses() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/carma/model-summaries");
        let mut parsed = 0;
        for e in std::fs::read_dir(&dir).expect("the repository's data/carma/model-summaries").flatten() {
            let text = crate::input::read_bounded(&e.path()).unwrap();
            if !text.contains("Layer (type)  ") {
                continue; // torchinfo trees and transformer listings
            }
            let n = parse(&text, &e.path().display().to_string()).unwrap();
            let sum: u64 = n.layers.iter().map(|l| l.params).sum();
            // Rows count shared or container parameters at most twice; the
            // footer is what torchsummary reports.
            assert!(
                n.total_params.is_some_and(|t| t > 0 && sum >= t / 2),
                "{}: {sum} vs {:?}",
                e.path().display(),
                n.total_params
            );
            parsed += 1;
        }
        assert_eq!(parsed, 23, "torchsummary files in data/carma/model-summaries");
    }

    #[test]
    fn hostile_files_are_refused_without_blocking() {
        use crate::input::read_bounded;
        let d = std::env::temp_dir().join(format!("carma-est-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let fifo = d.join("fifo");
        let status = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(status.success());
        let t = std::time::Instant::now();
        assert!(read_bounded(&fifo).unwrap_err().to_string().contains("not a regular file"));
        assert!(t.elapsed() < std::time::Duration::from_secs(2));
        assert!(
            read_bounded(std::path::Path::new("/dev/zero")).unwrap_err().to_string().contains("not a regular file")
        );
        // A directory is read as a model directory: without config.json, refused.
        assert!(read_bounded(&d).unwrap_err().to_string().contains("read through its config.json"));
        let big = d.join("big");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(crate::input::MAX_MODEL_BYTES + 1).unwrap();
        assert!(read_bounded(&big).unwrap_err().to_string().contains("larger than"));
        std::fs::write(d.join("bin"), [0xff, 0xfe, 0x00]).unwrap();
        assert!(read_bounded(&d.join("bin")).unwrap_err().to_string().contains("not a text file"));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
