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
        let (layer, batch) = parse_row(t).map_err(|m| err(n, m))?;
        if net.layers.is_empty() {
            // -1 means "any batch size".
            net.batch_in_file = u64::try_from(batch).ok().filter(|b| *b > 0);
        }
        net.layers.push(layer);
        if net.layers.len() > 100_000 {
            return Err(err(n, "more than 100000 layers".into()));
        }
    }
    if net.layers.is_empty() {
        return Err(err(header + 1, "the table has no layer rows".into()));
    }
    for (i, line) in text.lines().enumerate() {
        if let Some(v) = line.trim().strip_prefix("Total params:") {
            net.total_params = Some(number(v).map_err(|m| err(i + 1, format!("Total params: {m}")))?);
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
fn parse_row(t: &str) -> Result<(Layer, i64), String> {
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
    Ok((Layer { kind: kind.to_string(), out_elems: elems, params, channels, folded_elems: 0 }, batch))
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
