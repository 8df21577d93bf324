//! The users' `--carma-*` options: names, environment fallbacks and
//! validation. Shared by the SPANK plugin (srun/sbatch/slurmstepd) and the
//! command-line tools so that every context accepts exactly the same values.

use crate::file::RecoveryMode;
use crate::policy::Policy;
use crate::units::parse_size_mib;
use std::fmt;
use std::path::PathBuf;

/// Largest accepted `--carma-gpus`: more GPUs than any node carries.
pub const MAX_GPUS: u32 = 64;
/// Largest accepted `--carma-batch-size`.
pub const MAX_BATCH_SIZE: u32 = 1 << 20;
/// Longest accepted `--carma-seq-len` (tokens).
pub const MAX_SEQ_LEN: u32 = 1 << 20;
/// Longest accepted option value in bytes (paths included).
pub const MAX_VALUE_LEN: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OptionName {
    Policy,
    Model,
    BatchSize,
    Mem,
    Gpus,
    Recovery,
    SeqLen,
    Precision,
}

/// The numeric precision a job trains in, for the memory estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// Everything in fp32.
    #[default]
    Fp32,
    /// Automatic mixed precision (autocast): fp32 weights and Adam, half-precision activations.
    Mixed,
    /// The model itself in bf16 (weights, gradients and optimizer state).
    Bf16,
}

impl Precision {
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Mixed => "mixed",
            Precision::Bf16 => "bf16",
        }
    }

    pub fn parse(s: &str) -> Option<Precision> {
        match s {
            "fp32" => Some(Precision::Fp32),
            "mixed" | "amp" => Some(Precision::Mixed),
            "bf16" => Some(Precision::Bf16),
            _ => None,
        }
    }
}

impl OptionName {
    pub const ALL: [OptionName; 8] = [
        OptionName::Policy,
        OptionName::Model,
        OptionName::BatchSize,
        OptionName::Mem,
        OptionName::Gpus,
        OptionName::Recovery,
        OptionName::SeqLen,
        OptionName::Precision,
    ];

    /// The long option without dashes, as registered with SPANK.
    pub fn flag(self) -> &'static str {
        match self {
            OptionName::Policy => "carma-policy",
            OptionName::Model => "carma-model",
            OptionName::BatchSize => "carma-batch-size",
            OptionName::Mem => "carma-mem",
            OptionName::Gpus => "carma-gpus",
            OptionName::Recovery => "carma-recovery",
            OptionName::SeqLen => "carma-seq-len",
            OptionName::Precision => "carma-precision",
        }
    }

    /// The environment variable read when the option is absent; also the
    /// name under which the resolved value travels to the job
    /// (`SLURM_SPANK_<env>` in the job, `SPANK_<env>` in prolog/epilog).
    pub fn env(self) -> &'static str {
        match self {
            OptionName::Policy => "CARMA_POLICY",
            OptionName::Model => "CARMA_MODEL",
            OptionName::BatchSize => "CARMA_BATCH_SIZE",
            OptionName::Mem => "CARMA_MEM",
            OptionName::Gpus => "CARMA_GPUS",
            OptionName::Recovery => "CARMA_RECOVERY",
            OptionName::SeqLen => "CARMA_SEQ_LEN",
            OptionName::Precision => "CARMA_PRECISION",
        }
    }

    pub fn arginfo(self) -> &'static str {
        match self {
            OptionName::Policy => "POLICY",
            OptionName::Model => "PATH",
            OptionName::BatchSize => "N",
            OptionName::Mem => "SIZE",
            OptionName::Gpus => "N",
            OptionName::Recovery => "MODE",
            OptionName::SeqLen => "N",
            OptionName::Precision => "MODE",
        }
    }

    pub fn usage(self) -> &'static str {
        match self {
            OptionName::Policy => "CARMA GPU placement policy: exclusive, rr, magm, ff, bf or lug (env CARMA_POLICY)",
            OptionName::Model => {
                "CARMA: model file (ONNX, torchsummary text, HF config.json or model directory) used to estimate GPU memory (env CARMA_MODEL)"
            }
            OptionName::BatchSize => "CARMA: training batch size per GPU for the estimate (env CARMA_BATCH_SIZE)",
            OptionName::Mem => "CARMA: declared GPU memory need per GPU, e.g. 12G or 12000M (env CARMA_MEM)",
            OptionName::Gpus => "CARMA: number of GPUs the job uses (default 1) (env CARMA_GPUS)",
            OptionName::Recovery => {
                "CARMA: after a GPU out-of-memory crash: exclusive (rerun on own GPU), looser or none (env CARMA_RECOVERY)"
            }
            OptionName::SeqLen => {
                "CARMA: training sequence length for transformer estimates (default: the model's maximum) (env CARMA_SEQ_LEN)"
            }
            OptionName::Precision => {
                "CARMA: training precision for the estimate: fp32, mixed (autocast) or bf16 (env CARMA_PRECISION)"
            }
        }
    }

    pub fn expected(self) -> String {
        match self {
            OptionName::Policy => format!("one of {}", Policy::ACCEPTED),
            OptionName::Model => "a readable file or model directory path".into(),
            OptionName::BatchSize => format!("an integer from 1 to {MAX_BATCH_SIZE}"),
            OptionName::Mem => "a size such as 12G, 12000M or 512M".into(),
            OptionName::Gpus => format!("an integer from 1 to {MAX_GPUS}"),
            OptionName::Recovery => "one of exclusive, none, looser".into(),
            OptionName::SeqLen => format!("an integer from 1 to {MAX_SEQ_LEN}"),
            OptionName::Precision => "one of fp32, mixed, bf16".into(),
        }
    }

    /// Stable small integer used as the SPANK option `val`.
    pub fn id(self) -> i32 {
        OptionName::ALL.iter().position(|o| *o == self).unwrap_or(0) as i32
    }

    pub fn from_id(id: i32) -> Option<OptionName> {
        usize::try_from(id).ok().and_then(|i| OptionName::ALL.get(i).copied())
    }
}

/// One bad option value: prints as a single line naming the option, the
/// value (truncated, control characters escaped) and what is accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionError {
    pub option: OptionName,
    /// Where the value came from: `--carma-policy` or `CARMA_POLICY`.
    pub source: String,
    pub value: String,
    pub reason: String,
}

impl fmt::Display for OptionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {}={}: {}; expected {}", self.source, self.value, self.reason, self.option.expected())
    }
}

impl std::error::Error for OptionError {}

/// Makes a user-supplied value safe to print on one log line.
fn shown(raw: &[u8]) -> String {
    let mut s: String = String::from_utf8_lossy(&raw[..raw.len().min(80)])
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if raw.len() > 80 {
        s.push_str("...");
    }
    s
}

/// What the user asked CARMA for. Every field is optional: a job without
/// any `--carma-*` option or `CARMA_*` variable is not touched by CARMA.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobRequest {
    pub policy: Option<Policy>,
    pub model: Option<PathBuf>,
    pub batch_size: Option<u32>,
    pub mem_mib: Option<u64>,
    pub gpus: Option<u32>,
    pub recovery: Option<RecoveryMode>,
    pub seq_len: Option<u32>,
    pub precision: Option<Precision>,
}

impl JobRequest {
    /// True when the user asked for CARMA in any way.
    pub fn is_empty(&self) -> bool {
        *self == JobRequest::default()
    }

    /// Validates one raw value and stores it. `source` names where it came
    /// from for the error line (`--carma-mem`, `CARMA_MEM`, ...).
    pub fn set(&mut self, option: OptionName, raw: &[u8], source: &str) -> Result<(), OptionError> {
        // Parsers quote the value in their reasons: clean those too.
        let err = |reason: String| OptionError {
            option,
            source: source.to_string(),
            value: shown(raw),
            reason: shown(reason.as_bytes()),
        };
        if raw.len() > MAX_VALUE_LEN {
            return Err(err(format!("value longer than {MAX_VALUE_LEN} bytes")));
        }
        let text = std::str::from_utf8(raw).map_err(|_| err("value is not UTF-8".into()))?;
        if text.is_empty() {
            return Err(err("empty value".into()));
        }
        match option {
            OptionName::Policy => {
                self.policy = Some(text.parse().map_err(|_| err("unknown policy".into()))?);
            }
            OptionName::Model => {
                if text.contains('\0') || text.chars().any(char::is_control) {
                    return Err(err("path contains control characters".into()));
                }
                self.model = Some(PathBuf::from(text));
            }
            OptionName::BatchSize => {
                self.batch_size = Some(bounded_int(text, MAX_BATCH_SIZE).map_err(err)?);
            }
            OptionName::Mem => {
                let mib = parse_size_mib(text).map_err(err)?;
                if mib == 0 {
                    return Err(err("size must be positive".into()));
                }
                self.mem_mib = Some(mib);
            }
            OptionName::Gpus => {
                self.gpus = Some(bounded_int(text, MAX_GPUS).map_err(err)?);
            }
            OptionName::Recovery => {
                self.recovery = Some(RecoveryMode::parse(text).ok_or_else(|| err("unknown mode".into()))?);
            }
            OptionName::SeqLen => {
                self.seq_len = Some(bounded_int(text, MAX_SEQ_LEN).map_err(err)?);
            }
            OptionName::Precision => {
                self.precision = Some(Precision::parse(text).ok_or_else(|| err("unknown precision".into()))?);
            }
        }
        Ok(())
    }

    /// Fills every option still unset from `lookup(env name)`. Command-line
    /// values always win over the environment.
    pub fn fill_from_env(&mut self, mut lookup: impl FnMut(&str) -> Option<Vec<u8>>) -> Result<(), OptionError> {
        for option in OptionName::ALL {
            if self.get(option).is_none()
                && let Some(raw) = lookup(option.env())
            {
                self.set(option, &raw, option.env())?;
            }
        }
        Ok(())
    }

    /// The value in canonical text form, as it travels to the job.
    pub fn get(&self, option: OptionName) -> Option<String> {
        match option {
            OptionName::Policy => self.policy.map(|p| p.name().to_string()),
            OptionName::Model => self.model.as_ref().map(|p| p.to_string_lossy().into_owned()),
            OptionName::BatchSize => self.batch_size.map(|n| n.to_string()),
            OptionName::Mem => self.mem_mib.map(|m| format!("{m}M")),
            OptionName::Gpus => self.gpus.map(|n| n.to_string()),
            OptionName::Recovery => self.recovery.map(|m| m.name().to_string()),
            OptionName::SeqLen => self.seq_len.map(|n| n.to_string()),
            OptionName::Precision => self.precision.map(|p| p.name().to_string()),
        }
    }

    /// Number of GPUs the job wants CARMA to place (default 1).
    pub fn gpu_count(&self) -> u32 {
        self.gpus.unwrap_or(1)
    }
}

fn bounded_int(text: &str, max: u32) -> Result<u32, String> {
    let n: u64 = text.parse().map_err(|_| format!("'{text}' is not a whole number"))?;
    if n == 0 || n > u64::from(max) {
        return Err(format!("{n} is out of range"));
    }
    Ok(n as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_good_values() {
        let mut r = JobRequest::default();
        assert!(r.is_empty());
        r.set(OptionName::Policy, b"magm", "--carma-policy").unwrap();
        r.set(OptionName::Mem, b"12G", "--carma-mem").unwrap();
        r.set(OptionName::Gpus, b"2", "--carma-gpus").unwrap();
        r.set(OptionName::BatchSize, b"64", "--carma-batch-size").unwrap();
        r.set(OptionName::Model, b"/home/u/net.onnx", "--carma-model").unwrap();
        assert_eq!(r.policy, Some(Policy::Magm));
        assert_eq!(r.mem_mib, Some(12288));
        assert_eq!(r.gpu_count(), 2);
        assert_eq!(r.get(OptionName::Mem).as_deref(), Some("12288M"));
        assert!(!r.is_empty());
        r.set(OptionName::SeqLen, b"2048", "--carma-seq-len").unwrap();
        r.set(OptionName::Precision, b"amp", "--carma-precision").unwrap();
        assert_eq!((r.seq_len, r.precision), (Some(2048), Some(Precision::Mixed)));
        assert_eq!(r.get(OptionName::Precision).as_deref(), Some("mixed"));
    }

    #[test]
    fn rejects_bad_values_with_one_line_naming_the_option() {
        let cases: [(OptionName, &[u8]); 12] = [
            (OptionName::SeqLen, b"0"),
            (OptionName::SeqLen, b"2k"),
            (OptionName::Precision, b"fp16"),
            (OptionName::Policy, b"fastest"),
            (OptionName::Policy, b""),
            (OptionName::Gpus, b"0"),
            (OptionName::Gpus, b"-1"),
            (OptionName::Gpus, b"65"),
            (OptionName::BatchSize, b"99999999999999999999999"),
            (OptionName::Mem, b"lots"),
            (OptionName::Mem, b"0G"),
            (OptionName::Policy, b"\xff\xfe"),
        ];
        for (option, raw) in cases {
            let mut r = JobRequest::default();
            let source = format!("--{}", option.flag());
            let e = r.set(option, raw, &source).unwrap_err();
            let line = e.to_string();
            assert!(line.starts_with(&format!("invalid --{}=", option.flag())), "{line}");
            assert!(line.contains("expected"), "{line}");
            assert!(!line.contains('\n'));
            assert!(r.is_empty(), "a rejected value must not be stored");
        }
    }

    #[test]
    fn long_and_control_values_are_not_echoed_raw() {
        let mut r = JobRequest::default();
        let long = vec![b'a'; 10_000];
        let line = r.set(OptionName::Model, &long, "--carma-model").unwrap_err().to_string();
        assert!(line.len() < 400);
        let line = r.set(OptionName::Policy, b"x\ny\x1b[31m", "--carma-policy").unwrap_err().to_string();
        assert!(!line.contains('\n') && !line.contains('\x1b'));
        // A reason that quotes the value must not echo it raw either.
        let line = r.set(OptionName::Mem, b"\x05\x7f", "--carma-mem").unwrap_err().to_string();
        assert!(!line.chars().any(char::is_control), "{line:?}");
    }

    #[test]
    fn command_line_wins_over_environment() {
        let mut r = JobRequest::default();
        r.set(OptionName::Policy, b"ff", "--carma-policy").unwrap();
        r.fill_from_env(|name| match name {
            "CARMA_POLICY" => Some(b"magm".to_vec()),
            "CARMA_GPUS" => Some(b"3".to_vec()),
            _ => None,
        })
        .unwrap();
        assert_eq!(r.policy, Some(Policy::FirstFit));
        assert_eq!(r.gpus, Some(3));
        let e = JobRequest::default().fill_from_env(|n| (n == "CARMA_MEM").then(|| b"12Q".to_vec())).unwrap_err();
        assert!(e.to_string().starts_with("invalid CARMA_MEM=12Q"), "{e}");
    }

    #[test]
    fn ids_round_trip() {
        for o in OptionName::ALL {
            assert_eq!(OptionName::from_id(o.id()), Some(o));
        }
        assert_eq!(OptionName::from_id(-1), None);
        assert_eq!(OptionName::from_id(99), None);
    }
}

/// The estimate made at submit time (from `--carma-model`, as the user)
/// travels to slurmstepd in this variable as
/// `<MiB>M:<source>:<signature>[:<fixed>M]`, the signature being 16 hex
/// digits naming the model file and batch size (for the node's history of
/// observed peaks), `<fixed>` the part of the estimate that is the software
/// stack's, not the model's (`estimator.runtime`; a node may have learned a
/// larger one). Like `--carma-mem` it is the user's own statement about the job.
pub const ESTIMATE_ENV: &str = "CARMA_ESTIMATE";
const ESTIMATE_SOURCES: [&str; 3] = ["layers", "analytic", "gpumemnet"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmitEstimate {
    pub mib: u64,
    pub source: &'static str,
    pub signature: Option<String>,
    /// The stack's fixed part included in `mib` (absent from older submissions).
    pub runtime_mib: Option<u64>,
}

impl SubmitEstimate {
    /// What the model itself needs: the estimate less its fixed part.
    pub fn model_mib(&self) -> Option<u64> {
        self.runtime_mib.map(|r| self.mib - r)
    }
}

pub fn format_estimate(mib: u64, source: &str, signature: u64, runtime_mib: Option<u64>) -> String {
    match runtime_mib {
        Some(r) => format!("{mib}M:{source}:{signature:016x}:{r}M"),
        None => format!("{mib}M:{source}:{signature:016x}"),
    }
}

/// Parses a `CARMA_ESTIMATE` value.
pub fn parse_estimate(raw: &[u8]) -> Result<SubmitEstimate, String> {
    let bad = || format!("'{}' is not <MiB>M:<source>:<signature>[:<fixed>M]", shown(raw));
    let text = std::str::from_utf8(raw).map_err(|_| bad())?;
    let mut parts = text.split(':');
    let (size, source, signature, runtime) =
        (parts.next().unwrap_or(""), parts.next().ok_or_else(bad)?, parts.next(), parts.next());
    if parts.next().is_some() {
        return Err(bad());
    }
    let mib_of = |s: &str| s.strip_suffix('M').and_then(|n| n.parse::<u64>().ok());
    let mib = mib_of(size).filter(|n| (1..=1 << 24).contains(n)).ok_or_else(bad)?;
    let source =
        ESTIMATE_SOURCES.iter().find(|s| **s == source).ok_or_else(|| format!("unknown source in '{}'", shown(raw)))?;
    let signature = match signature {
        Some(s) if s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit()) => Some(s.to_ascii_lowercase()),
        Some(_) => return Err(bad()),
        None => None,
    };
    // The fixed part is a part: never more than the whole.
    let runtime_mib = match runtime {
        Some(r) => Some(mib_of(r).filter(|r| *r <= mib).ok_or_else(bad)?),
        None => None,
    };
    Ok(SubmitEstimate { mib, source, signature, runtime_mib })
}

#[cfg(test)]
mod estimate_tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let e = parse_estimate(format_estimate(5230, "layers", 0xabc, None).as_bytes()).unwrap();
        assert_eq!((e.mib, e.source, e.signature.as_deref()), (5230, "layers", Some("0000000000000abc")));
        assert_eq!((e.runtime_mib, e.model_mib()), (None, None));
        let e = parse_estimate(format_estimate(5230, "analytic", 0xabc, Some(700)).as_bytes()).unwrap();
        assert_eq!((e.mib, e.runtime_mib, e.model_mib()), (5230, Some(700), Some(4530)));
        assert!(parse_estimate(b"12M:analytic:0000000000000abc:13M").is_err(), "a part above the whole");
        assert!(parse_estimate(b"12M:analytic:0000000000000abc:7").is_err());
        assert!(parse_estimate(b"12M:analytic:0000000000000abc:7M:1").is_err());
        assert_eq!(parse_estimate(b"12M:analytic").unwrap().signature, None);
        assert!(parse_estimate(b"12M:analytic:xyz").is_err());
        assert!(parse_estimate(b"5230M").is_err());
        assert!(parse_estimate(b"0M:layers").is_err());
        assert!(parse_estimate(b"99999999999M:layers").is_err());
        assert!(parse_estimate(b"12M:declared").is_err());
        assert!(parse_estimate(b"\xff").is_err());
        let e = parse_estimate(b"1M:x\ny").unwrap_err();
        assert!(!e.contains('\n'), "{e}");
    }
}
