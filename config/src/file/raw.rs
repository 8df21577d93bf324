//! carma.yaml as read: serde structs that mirror the file, every key
//! optional, unknown keys rejected. [`super::validate`] turns them into
//! the typed [`super::Config`].

use serde::Deserialize;
use std::fmt;

/// A YAML scalar that may be written as a number or as text (`2048` or `2G`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum Scalar {
    Int(u64),
    Float(f64),
    Text(String),
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Int(n) => write!(f, "{n}"),
            Scalar::Float(x) => write!(f, "{x}"),
            Scalar::Text(s) => f.write_str(s),
        }
    }
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRecovery {
    pub(super) mode: Option<String>,
    pub(super) max_recoveries: Option<u32>,
    pub(super) looser_margin: Option<Scalar>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEstimator {
    pub(super) runtime: Option<Scalar>,
    pub(super) method: Option<String>,
    pub(super) learn_runtime: Option<RawLearnRuntime>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLearnRuntime {
    pub(super) min_jobs: Option<u32>,
    pub(super) window: Option<u32>,
    pub(super) quantile: Option<f64>,
    pub(super) max: Option<Scalar>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMps {
    pub(super) pipe_dir: Option<String>,
    pub(super) log_dir: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMonitor {
    pub(super) published: Option<bool>,
    pub(super) interval: Option<Scalar>,
    pub(super) stale_after: Option<Scalar>,
    pub(super) dcgm_exporter: Option<String>,
    pub(super) slurm_node: Option<String>,
    pub(super) admission_interval: Option<Scalar>,
    pub(super) metrics: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTimeouts {
    pub(super) lock: Option<Scalar>,
    pub(super) wait: Option<Scalar>,
    pub(super) poll: Option<Scalar>,
    pub(super) gpu_read: Option<Scalar>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawScope {
    pub(super) partition: Option<String>,
    pub(super) account: Option<String>,
    pub(super) qos: Option<String>,
    pub(super) policy: Option<String>,
    pub(super) default_mem: Option<Scalar>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) default_policy: Option<String>,
    pub(super) activity_metric: Option<String>,
    pub(super) sm_activity_cap: Option<f64>,
    pub(super) busy_cap: Option<f64>,
    pub(super) max_slowdown: Option<Scalar>,
    pub(super) max_slowdown_unprofiled: Option<Scalar>,
    pub(super) idle_first: Option<bool>,
    pub(super) headroom: Option<Scalar>,
    pub(super) monitor_window: Option<Scalar>,
    pub(super) monitor: Option<RawMonitor>,
    pub(super) sharing: Option<String>,
    pub(super) gpu_owner: Option<String>,
    pub(super) mps: Option<RawMps>,
    pub(super) gpu_source: Option<serde_yaml::Value>,
    pub(super) gpu_indices: Option<Vec<u32>>,
    pub(super) state_dir: Option<String>,
    pub(super) log_file: Option<String>,
    pub(super) slurm_bin_dir: Option<String>,
    pub(super) unknown_estimate: Option<Scalar>,
    pub(super) no_fit: Option<String>,
    pub(super) max_hand_backs: Option<u32>,
    pub(super) hand_back_pause: Option<Scalar>,
    pub(super) max_pauses: Option<u32>,
    pub(super) recovery: Option<RawRecovery>,
    pub(super) oom_patterns: Option<Vec<String>>,
    pub(super) extra_oom_patterns: Option<Vec<String>>,
    pub(super) timeouts: Option<RawTimeouts>,
    pub(super) estimator: Option<RawEstimator>,
    pub(super) transparent: Option<Vec<RawScope>>,
    pub(super) admission: Option<Vec<RawScope>>,
}
