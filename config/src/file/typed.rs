//! The validated configuration: [`Config`] and the typed values of its
//! sections, as the rest of CARMA reads them.

use crate::activity::ActivityMetric;
use crate::gpu_owner::GpuOwner;
use crate::policy::Policy;
use crate::scope::Scope;
use crate::sharing::Sharing;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// Where live GPU readings come from.
#[derive(Debug, Clone, PartialEq)]
pub enum GpuSource {
    /// NVIDIA's NVML, loaded at run time: `libnvidia-ml.so.1` from the
    /// loader's path, or the file `library` names (a driver installed
    /// outside the loader's path; the test cluster's GPU stand-in).
    Nvml { library: Option<PathBuf> },
    /// A file describing simulated GPUs (nodes without GPUs: CI, demos).
    Simulated(PathBuf),
}

/// What a step does when no GPU passes the preconditions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoFitAction {
    /// Re-check with back-off until `timeouts.wait`, then fail the step.
    Wait,
    /// Fail the step at once with the reason.
    Fail,
    /// Re-check like `Wait`; then a batch step is handed back to Slurm:
    /// it fails, and carma-epilog requeues its job with this node
    /// excluded (at most `max_hand_backs` times between pauses; then it waits
    /// `hand_back_pause` and may run on any node). Other steps fail.
    HandBack,
}

/// How an OOM-crashed job is rerun.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryMode {
    /// On GPU(s) no other CARMA job shares.
    Exclusive,
    /// Not at all.
    None,
    /// On a GPU with the crashed run's peak plus a margin free.
    Looser,
}

impl RecoveryMode {
    pub fn name(self) -> &'static str {
        match self {
            RecoveryMode::Exclusive => "exclusive",
            RecoveryMode::None => "none",
            RecoveryMode::Looser => "looser",
        }
    }

    pub fn parse(s: &str) -> Option<RecoveryMode> {
        match s {
            "exclusive" => Some(RecoveryMode::Exclusive),
            "none" => Some(RecoveryMode::None),
            "looser" => Some(RecoveryMode::Looser),
            _ => None,
        }
    }
}

/// What to assume for a job that declared neither a model nor `--carma-mem`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownEstimate {
    /// Give it whole GPU(s).
    Exclusive,
    /// Assume this many MiB.
    Mib(u64),
}

/// How model files become estimates (the estimator crate applies it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EstimatorMethod {
    /// The continuous per-sample model (CNN/MLP) and the analytic one
    /// (transformers).
    Continuous,
    /// The paper's GPUMemNet bins for CNNs and MLPs.
    Gpumemnet,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EstimatorConfig {
    /// The software stack's fixed memory (CUDA context, libraries).
    pub runtime_mib: u64,
    pub method: EstimatorMethod,
    pub learn_runtime: LearnRuntime,
}

/// How a node learns its stack's fixed memory from finished jobs (each
/// one's observed peak minus the model part of its estimate). The learned
/// value replaces a job's fixed part only where it is larger.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LearnRuntime {
    /// Observations needed before the learned value is used; 0 = never.
    pub min_jobs: u32,
    /// How many of the user's latest observations count.
    pub window: u32,
    /// Which quantile of them is the learned value (0.5–1; 1, the default,
    /// is their largest).
    pub quantile: f64,
    /// The learned value never exceeds this.
    pub max_mib: u64,
}

/// NVIDIA MPS on this node (with `sharing: mps`): one control daemon per
/// GPU, whose pipe and log directories are `<pipe_dir>/<index>` and
/// `<log_dir>/<index>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsConfig {
    pub pipe_dir: PathBuf,
    pub log_dir: PathBuf,
}

/// carma-monitor: a root daemon per node that samples the GPUs every
/// `interval` and publishes windowed readings in `state_dir`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonitorConfig {
    /// Placement reads the published readings instead of opening the GPU
    /// source; missing or stale ones refuse CARMA steps with the reason
    /// (slurmstepd never falls back to the driver).
    pub published: bool,
    pub interval: Duration,
    /// Published readings older than this are stale.
    pub stale_after: Duration,
    /// Where carma-monitor reads SM activity and occupancy on GPUs without
    /// NVML GPM (Ampere and older): a dcgm-exporter's metrics endpoint.
    pub dcgm_exporter: Option<HttpEndpoint>,
    /// This node's name in Slurm (default: the short host name), whose
    /// admission count carma-monitor keeps (docs/admission.md).
    pub slurm_node: Option<String>,
    /// How often carma-monitor sets the node's admission count in slurmctld
    /// when it changed.
    pub admission_interval: Duration,
    /// Where carma-monitor serves its metrics (Prometheus text, GET
    /// /metrics); `None`: not served.
    pub metrics: Option<std::net::SocketAddr>,
}

impl MonitorConfig {
    /// This node's name in Slurm: `slurm_node`, else the short host name
    /// (Slurm's default node name).
    pub fn node_name(&self) -> String {
        self.slurm_node.clone().unwrap_or_else(|| {
            let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
            name.trim().split('.').next().unwrap_or("").to_string()
        })
    }
}

/// A plain-HTTP endpoint, `http://HOST:PORT/PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpEndpoint {
    pub host: String,
    pub port: u16,
    pub path: String,
}

impl HttpEndpoint {
    pub fn parse(url: &str) -> Result<HttpEndpoint, String> {
        let bad = |why: &str| format!("'{url}' {why}; write it like http://127.0.0.1:9400/metrics");
        let rest = url.strip_prefix("http://").ok_or_else(|| bad("is not an http:// URL"))?;
        let (authority, path) = rest.find('/').map_or((rest, "/"), |i| (&rest[..i], &rest[i..]));
        let (host, port) = authority.rsplit_once(':').ok_or_else(|| bad("names no port"))?;
        let port = port.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| bad("has a bad port"))?;
        let host_ok = !host.is_empty() && host.chars().all(|c| c.is_ascii_alphanumeric() || ".-_[]:".contains(c));
        if !host_ok || !path.chars().all(|c| c.is_ascii_graphic()) {
            return Err(bad("has a bad host or path"));
        }
        Ok(HttpEndpoint { host: host.to_string(), port, path: path.to_string() })
    }
}

impl fmt::Display for HttpEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}:{}{}", self.host, self.port, self.path)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Timeouts {
    /// Longest wait for the node state lock.
    pub lock: Duration,
    /// Longest wait for a GPU when none fits (with `no_fit: wait`).
    pub wait: Duration,
    /// First re-check interval while waiting; doubles up to 8x.
    pub poll: Duration,
    /// Longest wait for one reading of the node's GPUs (a driver call that
    /// hangs fails the read, not the step's slurmstepd).
    pub gpu_read: Duration,
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Where this config was read from (or would have been).
    pub path: PathBuf,
    pub default_policy: Policy,
    /// Which reading the precondition caps: SM activity (default) or busy time.
    pub activity_metric: ActivityMetric,
    /// A GPU whose windowed SM activity exceeds this is not a collocation
    /// target (with `activity_metric: sm`).
    pub sm_activity_cap: f64,
    /// The same for busy time (with `activity_metric: busy`).
    pub busy_cap: f64,
    /// The slowdown guard: no job of a GPU may be predicted (from the
    /// jobs' learned profiles) to run more than this many times slower
    /// than alone. Infinite: `off`.
    pub max_slowdown: f64,
    /// The bound on the worst case of a job not yet seen alone (counted as
    /// filling its GPU); at least `max_slowdown`.
    pub max_slowdown_unprofiled: f64,
    /// Collocating policies take an idle GPU before a busy one.
    pub idle_first: bool,
    /// Free memory that must remain after a job's estimate.
    pub headroom_mib: u64,
    /// Averaging window for SM activity.
    pub monitor_window: Duration,
    pub monitor: MonitorConfig,
    /// How collocated jobs share a GPU on this node.
    pub sharing: Sharing,
    /// Who chooses a CARMA job's GPU here: Slurm (its allocation) or CARMA.
    pub gpu_owner: GpuOwner,
    pub mps: MpsConfig,
    pub gpu_source: GpuSource,
    /// The GPUs (NVML indices) CARMA may place on: those gres.conf gives
    /// Slurm on this node. `None`: every GPU the source reads.
    pub gpu_indices: Option<Vec<u32>>,
    /// Root-owned directory for node-local state. Default /run/carma: on
    /// tmpfs, fast to fsync, and empty after a reboot, like the jobs it tracks.
    pub state_dir: PathBuf,
    /// Optional log file in addition to syslog/Slurm's log.
    pub log_file: Option<PathBuf>,
    /// Where Slurm's commands (scontrol, squeue) are, for every one CARMA
    /// runs; `None`: found through PATH. Defaults to the build's
    /// `CARMA_SLURM_BIN_DIR` (a site's Slurm under its own prefix, such as
    /// `/opt/slurm/bin`): slurmd runs the prolog and epilog without the
    /// admin's PATH.
    pub slurm_bin_dir: Option<PathBuf>,
    pub unknown_estimate: UnknownEstimate,
    pub no_fit: NoFitAction,
    /// How often one job is handed back (`no_fit: hand_back`) between pauses
    /// before its next refusal pauses it (or fails it: `hand_back_pause` 0).
    pub max_hand_backs: u32,
    /// How long a job that was handed back `max_hand_backs` times since it last paused (or
    /// has no other node to go to) is requeued to wait before it may run
    /// again, on any node of its own choosing; 0: it fails instead.
    pub hand_back_pause: Duration,
    /// How many pauses one job may take; at the next, it fails with why
    /// (a job no node has had room for in all of them).
    pub max_pauses: u32,
    pub recovery_mode: RecoveryMode,
    pub max_recoveries: u32,
    pub looser_margin_mib: u64,
    /// Substrings that mark an out-of-memory crash in a job's output.
    pub oom_patterns: Vec<String>,
    pub timeouts: Timeouts,
    pub estimator: EstimatorConfig,
    /// Where jobs that ask for whole GPUs are collocated without asking
    /// (`transparent:`); empty = nowhere.
    pub transparent: Vec<Scope>,
    /// Where slurmctld admits CARMA jobs by GPU memory (`admission:`):
    /// job_submit.lua adds the count-only GRES [`ADMISSION_GRES`] (GiB per
    /// node: the job's estimate and headroom per GPU, times its GPUs);
    /// empty = nowhere. Scopes name partitions, accounts or QOS only.
    pub admission: Vec<Scope>,
}

/// The count-only GRES (gres.conf `Name=carmamem Count=<GiB>`, no `File=`)
/// that admission asks for, in GiB.
pub const ADMISSION_GRES: &str = "carmamem";
