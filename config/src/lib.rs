//! Configuration for CARMA: the admin's `carma.yaml`, the plugstack.conf
//! arguments and the users' `--carma-*` option values.
//!
//! Everything is parsed in two steps, ripgrep-style: a raw form that mirrors
//! the text, then validation into typed values. Every error is a single line
//! that names the offending key or option and says what is accepted.
#![forbid(unsafe_code)]

mod activity;
mod digest;
mod file;
mod gpu_owner;
mod options;
pub mod ownership;
mod plugstack;
mod policy;
mod scope;
mod sharing;
mod units;

pub use activity::ActivityMetric;
pub use digest::fnv1a;
pub use file::{
    ADMISSION_GRES, Config, ConfigError, DEFAULT_CONFIG_PATH, DEFAULT_METRICS_ADDR, DEFAULT_RUNTIME_MIB,
    EstimatorConfig, EstimatorMethod, GpuSource, HttpEndpoint, LearnRuntime, MonitorConfig, MpsConfig, NoFitAction,
    RecoveryMode, Timeouts, UnknownEstimate,
};
pub use gpu_owner::GpuOwner;
pub use options::{
    ESTIMATE_ENV, JobRequest, OptionError, OptionName, Precision, SubmitEstimate, format_estimate, parse_estimate,
};
pub use plugstack::{PluginArgs, PluginArgsError};
pub use policy::Policy;
pub use scope::{JobScopeFacts, Scope};
pub use sharing::{MPS_SOLO_SLOWDOWN, Sharing};
pub use units::{parse_duration, parse_size_mib};
