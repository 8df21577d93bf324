//! The neutral description every parser produces, bounded reading, and
//! one-line parse errors (file, line, what was expected).

use std::fmt;
use std::io::Read;
use std::path::Path;

/// Model descriptions are kilobytes; an ONNX export without weights is at
/// most a few MB. Anything larger is refused before parsing.
pub const MAX_MODEL_BYTES: u64 = 16 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    /// The module kind as the description names it (`Conv2d`, `ReLU`, ...).
    pub kind: String,
    /// Output elements per sample (batch dimension removed).
    pub out_elems: u64,
    pub params: u64,
    /// The first dimension after the batch of a feature map (rank 3 or
    /// more, one output); 0 where the description does not give one.
    pub channels: u64,
    /// For a row that folds a block (torchinfo's depth limit): the most
    /// elements per sample one tensor inside it can have, its widest
    /// channels at its finest resolution, from its input and output
    /// shapes. 0 where the row's children are listed or shapes are missing.
    pub folded_elems: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Network {
    pub layers: Vec<Layer>,
    /// The batch size the description was made with, if it says.
    pub batch_in_file: Option<u64>,
    /// The footer's total, where there is one.
    pub total_params: Option<u64>,
    /// Output elements per sample of every leaf module with parameters,
    /// where the description counts them beyond its rows (torchinfo's
    /// footer, which covers blocks its depth limit folds).
    pub param_leaf_elems: Option<u64>,
    /// Attention blocks (rank-4 softmaxes) of an image model: a vision
    /// transformer, estimated by its layers like a CNN, not as a language
    /// model (ONNX graphs only).
    pub attention_blocks: u32,
    /// Per layer, the layers whose outputs it consumes (empty: the data
    /// batch), where the description has a graph (ONNX). `None`: a table
    /// listing modules in the order they ran, each consuming the row before.
    pub edges: Option<Vec<Vec<usize>>>,
    /// Elements per sample of the data batch, where the description says.
    pub input_elems: Option<u64>,
}

impl Network {
    pub fn params(&self) -> u64 {
        self.total_params.unwrap_or_else(|| self.layers.iter().map(|l| l.params).sum())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub file: String,
    /// 1-based; 0 when the problem is the file as a whole.
    pub line: usize,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let message: String = self.message.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
        if self.line == 0 {
            write!(f, "{}: {message}", self.file)
        } else {
            write!(f, "{} line {}: {message}", self.file, self.line)
        }
    }
}

impl std::error::Error for ParseError {}

/// Reads a regular file of at most MAX_MODEL_BYTES. A FIFO, a device or a
/// directory is refused without blocking.
pub fn read_bounded_bytes(path: &Path) -> Result<Vec<u8>, ParseError> {
    // A Hugging Face model directory: its config.json describes the model
    // (the weights beside it are never read).
    if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
        let config = path.join("config.json");
        return read_file(&config).map_err(|e| ParseError {
            message: format!("{} (a model directory is read through its config.json)", e.message),
            ..e
        });
    }
    read_file(path)
}

fn read_file(path: &Path) -> Result<Vec<u8>, ParseError> {
    use std::os::unix::fs::OpenOptionsExt;
    let err = |m: String| ParseError { file: path.display().to_string(), line: 0, message: m };
    let f = std::fs::OpenOptions::new()
        .read(true)
        // O_NONBLOCK: opening a FIFO must not wait for a writer.
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| err(format!("cannot open: {e}")))?;
    let meta = f.metadata().map_err(|e| err(format!("cannot stat: {e}")))?;
    if !meta.is_file() {
        return Err(err("not a regular file".into()));
    }
    if meta.len() > MAX_MODEL_BYTES {
        return Err(err(format!(
            "{} bytes is larger than the {MAX_MODEL_BYTES}-byte limit for model files",
            meta.len()
        )));
    }
    let mut bytes = Vec::new();
    f.take(MAX_MODEL_BYTES + 1).read_to_end(&mut bytes).map_err(|e| err(format!("cannot read: {e}")))?;
    if bytes.len() as u64 > MAX_MODEL_BYTES {
        return Err(err(format!("larger than the {MAX_MODEL_BYTES}-byte limit for model files")));
    }
    Ok(bytes)
}

/// `read_bounded_bytes`, and binary content refused as not UTF-8.
pub fn read_bounded(path: &Path) -> Result<String, ParseError> {
    text(read_bounded_bytes(path)?, &path.display().to_string())
}

pub fn text(bytes: Vec<u8>, name: &str) -> Result<String, ParseError> {
    String::from_utf8(bytes).map_err(|e| ParseError {
        file: name.to_string(),
        line: 0,
        message: format!("not a text file (invalid UTF-8 at byte {})", e.utf8_error().valid_up_to()),
    })
}

#[cfg(test)]
mod tests {
    use super::read_bounded_bytes;

    #[test]
    fn a_model_directory_is_read_through_its_config_json() {
        let d = std::env::temp_dir().join(format!("carma-hfdir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("nested/config.json")).unwrap();
        // No config.json: the error names it and says why it was looked for.
        let e = read_bounded_bytes(&d).unwrap_err().to_string();
        assert!(e.contains("config.json") && e.contains("model directory"), "{e}");
        std::fs::write(d.join("config.json"), br#"{"model_type": "gpt2"}"#).unwrap();
        assert_eq!(read_bounded_bytes(&d).unwrap(), br#"{"model_type": "gpt2"}"#);
        // A directory named config.json inside is refused, not followed further.
        let e = read_bounded_bytes(&d.join("nested")).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
