//! The admin's `carma.yaml`, read in two steps: [`raw`] mirrors the file
//! (unknown keys rejected), [`validate`] turns it into the [`typed`]
//! [`Config`], filling what the file leaves out from [`defaults`]. A
//! missing file means defaults.

mod defaults;
mod raw;
mod typed;
mod validate;

#[cfg(test)]
mod tests;

pub use defaults::{DEFAULT_METRICS_ADDR, DEFAULT_RUNTIME_MIB};
pub use typed::{
    ADMISSION_GRES, Config, EstimatorConfig, EstimatorMethod, GpuSource, HttpEndpoint, LearnRuntime, MonitorConfig,
    MpsConfig, NoFitAction, RecoveryMode, Timeouts, UnknownEstimate,
};

use crate::scope::{self, JobScopeFacts, Scope};
use raw::RawConfig;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

pub const DEFAULT_CONFIG_PATH: &str = "/etc/slurm/carma.yaml";
/// carma.yaml is small; anything bigger is a mistake or an attack.
const MAX_CONFIG_BYTES: u64 = 256 * 1024;

/// One line: the file, the key and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub path: PathBuf,
    pub key: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Messages quote values from the file, which may span lines
        // (multi-line YAML scalars): keep the error on one line.
        let message: String = self.message.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
        if self.key.is_empty() {
            write!(f, "config {}: {}", self.path.display(), message)
        } else {
            write!(f, "config {}: {}: {}", self.path.display(), self.key, message)
        }
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// Reads and validates `path`. A missing file gives the documented
    /// defaults; any other problem is an error naming the key.
    ///
    /// Run as root, it refuses a carma.yaml (or a directory above it) that
    /// a non-root user could write, and likewise the NVML library and the
    /// log file it names: root loads the one and appends to the other.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Config::load_noted(path).map(|(c, _)| c)
    }

    /// [`Config::load`], and one line for the log saying which file was
    /// read, or that none was found and the defaults are in force.
    pub fn load_noted(path: &Path) -> Result<(Config, String), ConfigError> {
        let err = |key: &str, message: String| ConfigError { path: path.to_path_buf(), key: key.into(), message };
        let root = crate::ownership::running_as_root();
        if root && let Some(why) = crate::ownership::writable_by_others(path) {
            return Err(err("", why));
        }
        let file = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let note = format!(
                    "config {}: not found, built-in defaults in force (install carma.yaml at this path on every node: configless Slurm does not send it; or name it with config= in plugstack.conf)",
                    path.display()
                );
                return Ok((Config { path: path.to_path_buf(), ..Config::default() }, note));
            }
            Err(e) => return Err(err("", format!("cannot open: {e}"))),
        };
        let mut text = String::new();
        file.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text).map_err(|e| err("", format!("cannot read: {e}")))?;
        if text.len() as u64 > MAX_CONFIG_BYTES {
            return Err(err("", format!("larger than {MAX_CONFIG_BYTES} bytes")));
        }
        let c = Config::parse(&text, path)?;
        if root {
            let library = match &c.gpu_source {
                GpuSource::Nvml { library: Some(l) } => Some(("gpu_source.nvml.library", l)),
                _ => None,
            };
            for (key, p) in library.into_iter().chain(c.log_file.as_ref().map(|l| ("log_file", l))) {
                if let Some(why) = crate::ownership::writable_by_others(p) {
                    return Err(err(key, why));
                }
            }
        }
        Ok((c, format!("config {}: loaded ({} bytes)", path.display(), text.len())))
    }

    /// Parses and validates YAML text; `path` is only used in messages.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let raw: RawConfig = if text.trim().is_empty() {
            RawConfig::default()
        } else {
            serde_yaml::from_str(text).map_err(|e| ConfigError {
                path: path.to_path_buf(),
                key: String::new(),
                message: e.to_string().replace('\n', " "),
            })?
        };
        raw.validate(path)
    }

    /// The transparent-collocation scope covering a job, if any.
    pub fn transparent_scope(&self, job: &JobScopeFacts<'_>) -> Option<&Scope> {
        scope::find(&self.transparent, job)
    }
}
