//! The admin's `carma.yaml`: raw form (mirrors the file, unknown keys
//! rejected) and the validated [`Config`]. A missing file means defaults.

use crate::activity::ActivityMetric;
use crate::gpu_owner::GpuOwner;
use crate::policy::Policy;
use crate::scope::{self, JobScopeFacts, Scope};
use crate::sharing::Sharing;
use crate::units::{parse_duration, parse_size_mib};
use serde::Deserialize;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const DEFAULT_CONFIG_PATH: &str = "/etc/slurm/carma.yaml";
/// carma.yaml is small; anything bigger is a mistake or an attack.
const MAX_CONFIG_BYTES: u64 = 256 * 1024;

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
    /// excluded (at most `max_hand_backs` times). Other steps fail.
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

/// carma.yaml's default `estimator.runtime` (docs/estimator.md says what
/// it rests on).
pub const DEFAULT_RUNTIME_MIB: u64 = 1024;

impl Default for LearnRuntime {
    /// A user's value is used from their 3rd finished job on this node.
    /// The largest of their latest 32: the estimator's model part is mostly
    /// an over-estimate, so most observations fall below the stack's fixed
    /// part and a lower quantile leaves later jobs short (the H100 replay
    /// with 900 MiB more fixed memory: 19 of 76 at the upper quartile, 4 by
    /// at most 4 % at the largest; docs/estimator.md).
    fn default() -> LearnRuntime {
        LearnRuntime { min_jobs: 3, window: 32, quantile: 1.0, max_mib: 4096 }
    }
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
    /// Placement reads the published readings (falling back to a direct
    /// read when they are missing or stale) instead of opening the GPU source.
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

/// carma-monitor's metrics address unless carma.yaml says otherwise:
/// loopback only (a Prometheus on the node, or a tunnel/proxy, reads it).
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9402";

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
    /// How often one job is handed back (`no_fit: hand_back`) before its
    /// next refusal fails it.
    pub max_hand_backs: u32,
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

/// Output lines of the common frameworks when the GPU runs out of memory,
/// taken from their sources (docs/oom-messages.md says where each comes
/// from; tools/src/recovery/oom.rs tests each verbatim).
pub const DEFAULT_OOM_PATTERNS: &[&str] = &[
    // PyTorch's caching allocator (1.x RuntimeError, 2.x OutOfMemoryError, ROCm "HIP out of memory").
    "CUDA out of memory",
    "torch.OutOfMemoryError",
    "torch.cuda.OutOfMemoryError",
    // PyTorch's CUDA-error path (runtime and driver API): a context that
    // cannot be created on a full GPU; older releases print no hint line.
    "CUDA error: out of memory",
    "CUDA driver error: out of memory",
    // TensorFlow / Keras (TF backend).
    "ResourceExhaustedError",
    "OOM when allocating tensor",
    // XLA (JAX, Keras on JAX, TF with XLA).
    "RESOURCE_EXHAUSTED: Out of memory",
    "RESOURCE_EXHAUSTED: Failed to allocate request for",
    // The CUDA driver API's name: JAX and TF at start on a full GPU, CuPy's driver calls, Numba.
    "CUDA_ERROR_OUT_OF_MEMORY",
    // CuPy's memory pool.
    "OutOfMemoryError: Out of memory allocating",
    // The CUDA runtime's name (PyTorch's hint line, CuPy's runtime calls).
    "cudaErrorMemoryAllocation",
    // CUDA libraries.
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUSOLVER_STATUS_ALLOC_FAILED",
    "CUSPARSE_STATUS_ALLOC_FAILED",
    "CUFFT_ALLOC_FAILED",
    // NCCL: runtime calls ("Cuda failure 'out of memory'") and driver calls (code 2).
    "Cuda failure 'out of memory'",
    "Cuda failure 2 'out of memory'",
    // Hugging Face Accelerate / transformers: every batch size down to 1 ran out of memory.
    "No executable batch size found, reached zero",
];

impl Default for Config {
    fn default() -> Config {
        Config {
            path: PathBuf::from(DEFAULT_CONFIG_PATH),
            default_policy: Policy::Magm,
            activity_metric: ActivityMetric::Sm,
            sm_activity_cap: 0.80,
            busy_cap: 0.80,
            headroom_mib: 2048,
            monitor_window: Duration::from_secs(60),
            monitor: MonitorConfig {
                published: false,
                interval: Duration::from_secs(1),
                stale_after: Duration::from_secs(10),
                dcgm_exporter: None,
                slurm_node: None,
                admission_interval: Duration::from_secs(10),
                metrics: DEFAULT_METRICS_ADDR.parse().ok(),
            },
            sharing: Sharing::Timeslice,
            gpu_owner: GpuOwner::Slurm,
            mps: MpsConfig {
                pipe_dir: PathBuf::from("/run/nvidia-mps"),
                log_dir: PathBuf::from("/var/log/nvidia-mps"),
            },
            gpu_source: GpuSource::Nvml { library: None },
            gpu_indices: None,
            state_dir: PathBuf::from("/run/carma"),
            log_file: None,
            slurm_bin_dir: option_env!("CARMA_SLURM_BIN_DIR").filter(|d| !d.is_empty()).map(PathBuf::from),
            unknown_estimate: UnknownEstimate::Exclusive,
            no_fit: NoFitAction::Wait,
            max_hand_backs: 3,
            recovery_mode: RecoveryMode::Exclusive,
            max_recoveries: 1,
            looser_margin_mib: 2048,
            oom_patterns: DEFAULT_OOM_PATTERNS.iter().map(|s| s.to_string()).collect(),
            timeouts: Timeouts {
                lock: Duration::from_secs(5),
                // A waiting step holds slurmd's launch RPC: slurmctld saw a
                // node stop responding during a 60 s wait (#37).
                wait: Duration::from_secs(30),
                poll: Duration::from_secs(2),
                // An H100 node answers a full read in ~30 ms per GPU; the
                // reader holds the state lock, whose waiters give up at 5 s.
                gpu_read: Duration::from_secs(3),
            },
            // The CUDA context, cuBLAS/cuDNN workspaces and the framework's own
            // allocations: a property of the software stack, not of the
            // model. 1 GiB: PyTorch 2.11 on an H100 (760 MiB outside its
            // allocator + what the allocator holds at any batch), the most
            // a current stack needed in data/h100; a larger stack is
            // learned per user from finished jobs (docs/estimator.md).
            estimator: EstimatorConfig {
                runtime_mib: DEFAULT_RUNTIME_MIB,
                method: EstimatorMethod::Continuous,
                learn_runtime: LearnRuntime::default(),
            },
            transparent: Vec::new(),
            admission: Vec::new(),
        }
    }
}

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

/// A YAML scalar that may be written as a number or as text (`2048` or `2G`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Scalar {
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
struct RawRecovery {
    mode: Option<String>,
    max_recoveries: Option<u32>,
    looser_margin: Option<Scalar>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawEstimator {
    runtime: Option<Scalar>,
    method: Option<String>,
    learn_runtime: Option<RawLearnRuntime>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLearnRuntime {
    min_jobs: Option<u32>,
    window: Option<u32>,
    quantile: Option<f64>,
    max: Option<Scalar>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawMps {
    pipe_dir: Option<String>,
    log_dir: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawMonitor {
    published: Option<bool>,
    interval: Option<Scalar>,
    stale_after: Option<Scalar>,
    dcgm_exporter: Option<String>,
    slurm_node: Option<String>,
    admission_interval: Option<Scalar>,
    metrics: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawTimeouts {
    lock: Option<Scalar>,
    wait: Option<Scalar>,
    poll: Option<Scalar>,
    gpu_read: Option<Scalar>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawScope {
    partition: Option<String>,
    account: Option<String>,
    qos: Option<String>,
    policy: Option<String>,
    default_mem: Option<Scalar>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    default_policy: Option<String>,
    activity_metric: Option<String>,
    sm_activity_cap: Option<f64>,
    busy_cap: Option<f64>,
    headroom: Option<Scalar>,
    monitor_window: Option<Scalar>,
    monitor: Option<RawMonitor>,
    sharing: Option<String>,
    gpu_owner: Option<String>,
    mps: Option<RawMps>,
    gpu_source: Option<serde_yaml::Value>,
    gpu_indices: Option<Vec<u32>>,
    state_dir: Option<String>,
    log_file: Option<String>,
    slurm_bin_dir: Option<String>,
    unknown_estimate: Option<Scalar>,
    no_fit: Option<String>,
    max_hand_backs: Option<u32>,
    recovery: Option<RawRecovery>,
    oom_patterns: Option<Vec<String>>,
    extra_oom_patterns: Option<Vec<String>>,
    timeouts: Option<RawTimeouts>,
    estimator: Option<RawEstimator>,
    transparent: Option<Vec<RawScope>>,
    admission: Option<Vec<RawScope>>,
}

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
}

impl RawConfig {
    fn validate(self, path: &Path) -> Result<Config, ConfigError> {
        let bad = |key: &str, message: String| ConfigError { path: path.to_path_buf(), key: key.to_string(), message };
        let size = |key: &str, v: &Scalar| {
            parse_size_mib(&v.to_string()).map_err(|e| bad(key, format!("{e}; write a size like 2G or 2048M")))
        };
        let duration = |key: &str, v: &Scalar| {
            parse_duration(&v.to_string()).map_err(|e| bad(key, format!("{e}; write a duration like 60s or 5m")))
        };
        let abs_path = |key: &str, v: &str| {
            let p = PathBuf::from(v);
            if p.is_absolute() { Ok(p) } else { Err(bad(key, format!("'{v}' is not an absolute path"))) }
        };

        let mut c = Config { path: path.to_path_buf(), ..Config::default() };
        if let Some(p) = self.default_policy {
            c.default_policy = p.parse().map_err(|e| bad("default_policy", e))?;
        }
        if let Some(m) = &self.activity_metric {
            c.activity_metric = ActivityMetric::parse(m).map_err(|e| bad("activity_metric", e))?;
        }
        for (key, value, field) in [
            ("sm_activity_cap", self.sm_activity_cap, &mut c.sm_activity_cap),
            ("busy_cap", self.busy_cap, &mut c.busy_cap),
        ] {
            if let Some(cap) = value {
                if !(0.05..=1.0).contains(&cap) {
                    return Err(bad(key, format!("{cap} is out of range; use a fraction from 0.05 to 1.0")));
                }
                *field = cap;
            }
        }
        if let Some(v) = &self.headroom {
            c.headroom_mib = size("headroom", v)?;
        }
        if let Some(v) = &self.monitor_window {
            c.monitor_window = duration("monitor_window", v)?;
            if c.monitor_window < Duration::from_secs(1) {
                return Err(bad("monitor_window", "must be at least 1s".into()));
            }
        }
        if let Some(m) = &self.monitor {
            if let Some(p) = m.published {
                c.monitor.published = p;
            }
            if let Some(v) = &m.interval {
                c.monitor.interval = duration("monitor.interval", v)?;
                if !(Duration::from_millis(100)..=Duration::from_secs(60)).contains(&c.monitor.interval) {
                    return Err(bad("monitor.interval", "use 100ms to 60s".into()));
                }
            }
            if let Some(v) = &m.stale_after {
                c.monitor.stale_after = duration("monitor.stale_after", v)?;
            }
            if let Some(url) = &m.dcgm_exporter {
                c.monitor.dcgm_exporter = Some(HttpEndpoint::parse(url).map_err(|e| bad("monitor.dcgm_exporter", e))?);
            }
            if let Some(n) = &m.slurm_node {
                scope::valid_name(n).map_err(|e| bad("monitor.slurm_node", e))?;
                c.monitor.slurm_node = Some(n.clone());
            }
            if let Some(v) = &m.admission_interval {
                c.monitor.admission_interval = duration("monitor.admission_interval", v)?;
                if !(Duration::from_secs(1)..=Duration::from_secs(600)).contains(&c.monitor.admission_interval) {
                    return Err(bad("monitor.admission_interval", "use 1s to 600s".into()));
                }
            }
            if let Some(m) = &m.metrics {
                c.monitor.metrics = match m.as_str() {
                    "off" => None,
                    a => match a.parse::<std::net::SocketAddr>() {
                        Ok(addr) if addr.port() != 0 => Some(addr),
                        _ => {
                            return Err(bad(
                                "monitor.metrics",
                                format!(
                                    "'{a}' is not IP:PORT; write e.g. {DEFAULT_METRICS_ADDR} (or 0.0.0.0:9402 for every interface), or off"
                                ),
                            ));
                        }
                    },
                };
            }
            if c.monitor.stale_after < 2 * c.monitor.interval {
                return Err(bad("monitor.stale_after", "must be at least twice monitor.interval".into()));
            }
        }
        if let Some(m) = &self.sharing {
            c.sharing = Sharing::parse(m).map_err(|e| bad("sharing", e))?;
        }
        if let Some(m) = &self.gpu_owner {
            c.gpu_owner = GpuOwner::parse(m).map_err(|e| bad("gpu_owner", e))?;
        }
        if let Some(m) = self.mps {
            if let Some(d) = m.pipe_dir {
                c.mps.pipe_dir = abs_path("mps.pipe_dir", &d)?;
            }
            if let Some(d) = m.log_dir {
                c.mps.log_dir = abs_path("mps.log_dir", &d)?;
            }
        }
        if let Some(list) = self.gpu_indices {
            let mut seen = std::collections::BTreeSet::new();
            if list.is_empty() || !list.iter().all(|i| *i < 1024 && seen.insert(*i)) {
                return Err(bad(
                    "gpu_indices",
                    format!("{list:?}: list each GPU index gres.conf gives Slurm once, e.g. [0, 1, 3]"),
                ));
            }
            c.gpu_indices = Some(list);
        }
        if let Some(v) = self.gpu_source {
            c.gpu_source = parse_gpu_source(&v).map_err(|m| bad("gpu_source", m))?;
            match &c.gpu_source {
                GpuSource::Simulated(p) => {
                    abs_path("gpu_source.simulated", &p.to_string_lossy())?;
                }
                GpuSource::Nvml { library: Some(p) } => {
                    abs_path("gpu_source.nvml.library", &p.to_string_lossy())?;
                }
                GpuSource::Nvml { library: None } => {}
            }
        }
        if let Some(d) = self.state_dir {
            c.state_dir = abs_path("state_dir", &d)?;
        }
        if let Some(f) = self.log_file {
            c.log_file = Some(abs_path("log_file", &f)?);
        }
        if let Some(d) = self.slurm_bin_dir {
            c.slurm_bin_dir = Some(abs_path("slurm_bin_dir", &d)?);
        }
        if let Some(v) = &self.unknown_estimate {
            c.unknown_estimate = match v {
                Scalar::Text(t) if t == "exclusive" => UnknownEstimate::Exclusive,
                other => UnknownEstimate::Mib(size("unknown_estimate", other).map_err(|_| {
                    bad("unknown_estimate", format!("'{other}' is neither 'exclusive' nor a size like 8G"))
                })?),
            };
        }
        if let Some(a) = self.no_fit {
            c.no_fit = match a.as_str() {
                "wait" => NoFitAction::Wait,
                "fail" => NoFitAction::Fail,
                "hand_back" => NoFitAction::HandBack,
                _ => {
                    return Err(bad("no_fit", format!("'{a}' is not an action; use wait, fail or hand_back")));
                }
            };
        }
        if let Some(n) = self.max_hand_backs {
            if n > 10 {
                return Err(bad("max_hand_backs", format!("{n} is out of range; use 0 to 10")));
            }
            c.max_hand_backs = n;
        }
        if let Some(r) = self.recovery {
            if let Some(m) = r.mode {
                c.recovery_mode = RecoveryMode::parse(&m).ok_or_else(|| {
                    bad("recovery.mode", format!("'{m}' is not a mode; use exclusive, none or looser"))
                })?;
            }
            if let Some(n) = r.max_recoveries {
                if n > 10 {
                    return Err(bad("recovery.max_recoveries", format!("{n} is out of range; use 0 to 10")));
                }
                c.max_recoveries = n;
            }
            if let Some(v) = &r.looser_margin {
                c.looser_margin_mib = size("recovery.looser_margin", v)?;
            }
        }
        if let Some(p) = self.oom_patterns {
            c.oom_patterns = p;
        }
        c.oom_patterns.extend(self.extra_oom_patterns.unwrap_or_default());
        if let Some(i) = c.oom_patterns.iter().position(|p| p.trim().len() < 4) {
            return Err(bad(
                "oom_patterns",
                format!("pattern {} is shorter than 4 characters and would match almost anything", i + 1),
            ));
        }
        if let Some(t) = self.timeouts {
            if let Some(v) = &t.lock {
                c.timeouts.lock = duration("timeouts.lock", v)?;
            }
            if let Some(v) = &t.wait {
                c.timeouts.wait = duration("timeouts.wait", v)?;
            }
            if let Some(v) = &t.poll {
                c.timeouts.poll = duration("timeouts.poll", v)?;
            }
            if let Some(v) = &t.gpu_read {
                c.timeouts.gpu_read = duration("timeouts.gpu_read", v)?;
                if !(Duration::from_millis(100)..=Duration::from_secs(60)).contains(&c.timeouts.gpu_read) {
                    return Err(bad("timeouts.gpu_read", "give 100ms to 60s".into()));
                }
            }
            if c.timeouts.lock.is_zero() || c.timeouts.poll.is_zero() {
                return Err(bad("timeouts", "lock and poll must be longer than 0".into()));
            }
        }
        if let Some(e) = self.estimator {
            if let Some(v) = &e.runtime {
                c.estimator.runtime_mib = size("estimator.runtime", v)?;
                if c.estimator.runtime_mib > 64 * 1024 {
                    return Err(bad("estimator.runtime", "more than 64G is not a runtime overhead".into()));
                }
            }
            if let Some(m) = e.method.as_deref() {
                c.estimator.method = match m {
                    "continuous" => EstimatorMethod::Continuous,
                    "gpumemnet" => EstimatorMethod::Gpumemnet,
                    _ => return Err(bad("estimator.method", format!("'{m}' is unknown; use continuous or gpumemnet"))),
                };
            }
            if let Some(l) = e.learn_runtime {
                let d = &mut c.estimator.learn_runtime;
                let key = |f: &str| format!("estimator.learn_runtime.{f}");
                d.min_jobs = l.min_jobs.unwrap_or(d.min_jobs);
                d.window = l.window.unwrap_or(d.window);
                if !(1..=256).contains(&d.window) {
                    return Err(bad(&key("window"), format!("{} is out of range; use 1 to 256 jobs", d.window)));
                }
                if d.min_jobs > d.window {
                    let m = format!("{} is more than window ({}); use at most the window", d.min_jobs, d.window);
                    return Err(bad(&key("min_jobs"), m));
                }
                if let Some(q) = l.quantile {
                    if !(0.5..=1.0).contains(&q) {
                        return Err(bad(
                            &key("quantile"),
                            format!("{q} is out of range; use 0.5 to 1 (0.75: the upper quartile)"),
                        ));
                    }
                    d.quantile = q;
                }
                if let Some(v) = &l.max {
                    d.max_mib = size(&key("max"), v)?;
                    if d.max_mib > 64 * 1024 {
                        return Err(bad(&key("max"), "more than 64G is not a runtime overhead".into()));
                    }
                }
            }
        }
        for (i, raw) in self.transparent.into_iter().flatten().enumerate() {
            let key = |field: &str| format!("transparent[{i}].{field}");
            let name = |field: &str, v: Option<String>| -> Result<Option<String>, ConfigError> {
                v.map(|v| scope::valid_name(&v).map(|()| v).map_err(|e| bad(&key(field), e))).transpose()
            };
            let s = Scope {
                partition: name("partition", raw.partition)?,
                account: name("account", raw.account)?,
                qos: name("qos", raw.qos)?,
                policy: raw.policy.map(|p| p.parse().map_err(|e| bad(&key("policy"), e))).transpose()?,
                default_mib: raw.default_mem.as_ref().map(|v| size(&key("default_mem"), v)).transpose()?,
            };
            if s.partition.is_none() && s.account.is_none() && s.qos.is_none() {
                return Err(bad(
                    &format!("transparent[{i}]"),
                    "names no partition, account or qos; give at least one (an entry for every job would collocate the whole cluster)".into(),
                ));
            }
            c.transparent.push(s);
        }
        for (i, raw) in self.admission.into_iter().flatten().enumerate() {
            let key = |field: &str| format!("admission[{i}].{field}");
            let name = |field: &str, v: Option<String>| -> Result<Option<String>, ConfigError> {
                v.map(|v| scope::valid_name(&v).map(|()| v).map_err(|e| bad(&key(field), e))).transpose()
            };
            if raw.policy.is_some() || raw.default_mem.is_some() {
                let field = if raw.policy.is_some() { "policy" } else { "default_mem" };
                return Err(bad(
                    &key(field),
                    "admission scopes name only partition, account or qos (policies and sizes belong to transparent:)"
                        .into(),
                ));
            }
            let s = Scope {
                partition: name("partition", raw.partition)?,
                account: name("account", raw.account)?,
                qos: name("qos", raw.qos)?,
                policy: None,
                default_mib: None,
            };
            if s.partition.is_none() && s.account.is_none() && s.qos.is_none() {
                return Err(bad(
                    &format!("admission[{i}]"),
                    "names no partition, account or qos; give at least one".into(),
                ));
            }
            c.admission.push(s);
        }
        Ok(c)
    }
}

impl Config {
    /// The transparent-collocation scope covering a job, if any.
    pub fn transparent_scope(&self, job: &JobScopeFacts<'_>) -> Option<&Scope> {
        scope::find(&self.transparent, job)
    }
}

fn parse_gpu_source(v: &serde_yaml::Value) -> Result<GpuSource, String> {
    const HINT: &str =
        "use 'nvml', '{nvml: {library: /path/to/libnvidia-ml.so.1}}' or '{simulated: /path/to/gpus.yaml}'";
    match v {
        serde_yaml::Value::String(s) if s == "nvml" => Ok(GpuSource::Nvml { library: None }),
        serde_yaml::Value::Mapping(m) if m.len() == 1 => match (m.get("simulated"), m.get("nvml")) {
            (Some(serde_yaml::Value::String(p)), _) => Ok(GpuSource::Simulated(PathBuf::from(p))),
            (_, Some(serde_yaml::Value::Mapping(n))) if n.len() == 1 => match n.get("library") {
                Some(serde_yaml::Value::String(p)) => Ok(GpuSource::Nvml { library: Some(PathBuf::from(p)) }),
                _ => Err(format!("nvml: the only key is library; {HINT}")),
            },
            _ => Err(format!("unknown source; {HINT}")),
        },
        _ => Err(format!("unknown source; {HINT}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("/etc/slurm/carma.yaml"))
    }

    /// The example admins copy must stay valid and say what the defaults are.
    #[test]
    fn the_example_carma_yaml_is_valid_and_states_the_defaults() {
        let c = parse(include_str!("../../slurm-conf-examples/carma.yaml")).unwrap();
        let d = Config::default();
        assert_eq!(
            (c.default_policy, c.sm_activity_cap, c.headroom_mib, c.state_dir, c.estimator, c.timeouts),
            (d.default_policy, d.sm_activity_cap, d.headroom_mib, d.state_dir, d.estimator, d.timeouts)
        );
    }

    #[test]
    fn estimator_section() {
        let c = parse("estimator:\n  runtime: 1G\n  method: gpumemnet\n").unwrap();
        assert_eq!(
            c.estimator,
            EstimatorConfig {
                runtime_mib: 1024,
                method: EstimatorMethod::Gpumemnet,
                learn_runtime: LearnRuntime::default()
            }
        );
        let c = parse("estimator:\n  learn_runtime: {min_jobs: 3, window: 3, quantile: 1, max: 2G}\n").unwrap();
        let l = c.estimator.learn_runtime;
        assert_eq!((l.min_jobs, l.window, l.quantile, l.max_mib), (3, 3, 1.0, 2048));
        for (yaml, key) in [
            ("{window: 0}", "learn_runtime.window: 0 is out of range"),
            ("{min_jobs: 9, window: 4}", "learn_runtime.min_jobs: 9 is more than window"),
            ("{quantile: 0.2}", "learn_runtime.quantile: 0.2 is out of range"),
            ("{max: 100G}", "learn_runtime.max: more than 64G"),
            ("{max: lots}", "learn_runtime.max"),
        ] {
            let e = parse(&format!("estimator:\n  learn_runtime: {yaml}\n")).unwrap_err().to_string();
            assert!(e.contains(key) && !e.contains('\n'), "{yaml}: {e}");
        }
        assert!(parse("estimator:\n  learn_runtime: {minjobs: 3}\n").is_err());
        let e = parse("estimator:\n  method: magic\n").unwrap_err().to_string();
        assert!(e.contains("estimator.method: 'magic' is unknown"), "{e}");
        let e = parse("estimator:\n  runtime: lots\n").unwrap_err().to_string();
        assert!(e.contains("estimator.runtime") && e.contains("2G"), "{e}");
        assert!(parse("estimator:\n  runtme: 1G\n").is_err());
    }

    #[test]
    fn the_capped_reading_is_named() {
        let c = parse("activity_metric: busy\nbusy_cap: 0.9\n").unwrap();
        assert_eq!((c.activity_metric, c.busy_cap, c.sm_activity_cap), (ActivityMetric::Busy, 0.9, 0.80));
        assert_eq!(parse("").unwrap().activity_metric, ActivityMetric::Sm);
        let e = parse("activity_metric: utilization\n").unwrap_err().to_string();
        assert!(e.contains("activity_metric: unknown metric 'utilization'") && e.contains("sm (SM activity)"), "{e}");
    }

    /// Root refuses a carma.yaml, NVML library or log file a user could
    /// write, in one line naming the path and the fix; it says which file
    /// it read, or that there was none.
    #[test]
    fn root_refuses_files_users_could_write() {
        if !crate::ownership::running_as_root() {
            return println!("not root: the check applies to root only; skipped");
        }
        let dir = |base: &str| {
            let d = PathBuf::from(format!("{base}/carma-cfgtest-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
            d
        };
        let (good, tmp) = (dir("/run"), dir("/tmp"));
        // A world-writable directory without the sticky bit (unlike /tmp,
        // where root's own directory is judged on its own).
        let open = tmp.join("open");
        std::fs::create_dir_all(&open).unwrap();
        std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        let bad = format!("{} is writable by every user", open.display());
        let write = |p: &Path, text: &str| std::fs::write(p, text).unwrap();
        // Even a root-owned 0644 file there.
        write(&open.join("carma.yaml"), "");
        let e = Config::load(&open.join("carma.yaml")).unwrap_err().to_string();
        assert!(e.contains(&bad) && e.contains("chmod go-w") && !e.contains('\n'), "{e}");
        // Root's own 0755 directory under /tmp is trusted.
        write(&tmp.join("carma.yaml"), "");
        assert!(Config::load(&tmp.join("carma.yaml")).is_ok());
        let f = good.join("carma.yaml");
        write(&f, &format!("log_file: {}/carma.log\n", open.display()));
        let e = Config::load(&f).unwrap_err().to_string();
        assert!(e.contains(&format!("log_file: {bad}")), "{e}");
        write(&f, &format!("gpu_source: {{nvml: {{library: {}/libnvidia-ml.so.1}}}}\n", open.display()));
        let e = Config::load(&f).unwrap_err().to_string();
        assert!(e.contains(&format!("gpu_source.nvml.library: {bad}")), "{e}");
        // The file itself, writable by its group.
        write(&f, "");
        std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o664)).unwrap();
        std::os::unix::fs::chown(&f, None, Some(100)).unwrap();
        let e = Config::load(&f).unwrap_err().to_string();
        assert!(e.contains("carma.yaml is writable by group 100"), "{e}");
        std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        write(&f, &format!("log_file: {}/log/carma.log\n", good.display()));
        let (_, note) = Config::load_noted(&f).unwrap();
        assert_eq!(
            note,
            format!("config {}: loaded (48 bytes)", f.display())
                .replace("48", &std::fs::metadata(&f).unwrap().len().to_string())
        );
        let (_, note) = Config::load_noted(&good.join("missing.yaml")).unwrap();
        assert!(note.contains("not found, built-in defaults in force") && note.contains("configless"), "{note}");
        let _ = std::fs::remove_dir_all(&good);
        let _ = std::fs::remove_dir_all(&tmp);
    }

    #[test]
    fn empty_and_missing_give_defaults() {
        assert_eq!(parse("").unwrap(), Config::default());
        let c = Config::load(Path::new("/nonexistent/carma.yaml")).unwrap();
        assert_eq!(c.sm_activity_cap, 0.80);
        assert_eq!(c.headroom_mib, 2048);
        assert_eq!(c.gpu_source, GpuSource::Nvml { library: None });
    }

    #[test]
    fn full_file() {
        let c = parse(
            "default_policy: bf\nsm_activity_cap: 0.7\nheadroom: 1G\nmonitor_window: 30s\n\
             gpu_source: {simulated: /var/lib/carma-sim/gpus.yaml}\nstate_dir: /var/lib/carma\n\
             unknown_estimate: 8G\nno_fit: hand_back\nmax_hand_backs: 2\nrecovery: {mode: looser, max_recoveries: 2, looser_margin: 1024}\n\
             extra_oom_patterns: [\"MyFramework OOM\"]\ntimeouts: {lock: 2s, wait: 5m, poll: 500ms}\n",
        )
        .unwrap();
        assert_eq!(c.default_policy, Policy::BestFit);
        assert_eq!(c.headroom_mib, 1024);
        assert_eq!(c.gpu_source, GpuSource::Simulated("/var/lib/carma-sim/gpus.yaml".into()));
        let n = parse("gpu_source: {nvml: {library: /opt/nvidia/lib64/libnvidia-ml.so.1}}\n").unwrap();
        assert_eq!(n.gpu_source, GpuSource::Nvml { library: Some("/opt/nvidia/lib64/libnvidia-ml.so.1".into()) });
        let s = parse("slurm_bin_dir: /opt/slurm/bin\n").unwrap();
        assert_eq!(s.slurm_bin_dir, Some(PathBuf::from("/opt/slurm/bin")));
        assert_eq!(c.unknown_estimate, UnknownEstimate::Mib(8192));
        assert_eq!(c.no_fit, NoFitAction::HandBack);
        assert_eq!(c.max_hand_backs, 2);
        assert_eq!(parse("no_fit: fail\n").unwrap().no_fit, NoFitAction::Fail);
        assert_eq!(c.recovery_mode, RecoveryMode::Looser);
        assert_eq!(c.max_recoveries, 2);
        assert_eq!(c.looser_margin_mib, 1024);
        assert!(c.oom_patterns.contains(&"MyFramework OOM".to_string()));
        assert!(c.oom_patterns.contains(&"CUDA out of memory".to_string()));
        assert_eq!(c.timeouts.poll, Duration::from_millis(500));
    }

    #[test]
    fn dcgm_exporter_endpoint() {
        let c = parse("monitor: {dcgm_exporter: 'http://127.0.0.1:9400/metrics'}\n").unwrap();
        let e = c.monitor.dcgm_exporter.unwrap();
        assert_eq!((e.host.as_str(), e.port, e.path.as_str()), ("127.0.0.1", 9400, "/metrics"));
        assert_eq!(e.to_string(), "http://127.0.0.1:9400/metrics");
        let e = HttpEndpoint::parse("http://gpu-node-7:9400").unwrap();
        assert_eq!((e.host.as_str(), e.path.as_str()), ("gpu-node-7", "/"));
        assert_eq!(Config::default().monitor.dcgm_exporter, None);
        assert_eq!(Config::default().monitor.metrics, Some("127.0.0.1:9402".parse().unwrap()));
        assert_eq!(parse("monitor: {metrics: off}\n").unwrap().monitor.metrics, None);
        assert_eq!(
            parse("monitor: {metrics: '[::]:9500'}\n").unwrap().monitor.metrics,
            Some("[::]:9500".parse().unwrap())
        );
    }

    #[test]
    fn errors_name_the_key_on_one_line() {
        let cases = [
            ("sm_activity_cap: 1.5\n", "sm_activity_cap"),
            ("busy_cap: 0\n", "busy_cap"),
            ("activity_metric: smact\n", "activity_metric"),
            ("headroom: lots\n", "headroom"),
            ("default_policy: fastest\n", "default_policy"),
            ("gpu_source: cuda\n", "gpu_source"),
            ("gpu_source: {simulated: relative.yaml}\n", "gpu_source.simulated"),
            ("gpu_source: {nvml: {library: libnvidia-ml.so.1}}\n", "gpu_source.nvml.library"),
            ("timeouts: {gpu_read: 10ms}\n", "timeouts.gpu_read"),
            ("monitor: {metrics: 'localhost:9402'}\n", "monitor.metrics"),
            ("monitor: {metrics: '127.0.0.1:0'}\n", "monitor.metrics"),
            ("gpu_source: {nvml: {path: /usr/lib/libnvidia-ml.so.1}}\n", "the only key is library"),
            ("state_dir: var/lib\n", "state_dir"),
            ("slurm_bin_dir: opt/slurm/bin\n", "slurm_bin_dir"),
            ("no_fit: pray\n", "no_fit"),
            ("max_hand_backs: 11\n", "max_hand_backs"),
            ("recovery: {mode: twice}\n", "recovery.mode"),
            ("timeouts: {lock: 0s}\n", "timeouts"),
            ("oom_patterns: [\"\"]\n", "oom_patterns"),
            ("sm_activity_cup: 0.5\n", "sm_activity_cup"),
            ("recovery: {retries: 3}\n", "retries"),
            ("transparent: [{policy: magm}]\n", "transparent[0]"),
            ("transparent: [{partition: gpu}, {partition: \"a b\"}]\n", "transparent[1].partition"),
            ("transparent: [{partition: gpu, default_mem: lots}]\n", "transparent[0].default_mem"),
            ("transparent: [{partition: gpu, policy: fastest}]\n", "transparent[0].policy"),
            ("transparent: [{partitions: gpu}]\n", "partitions"),
            ("admission: [{qos: \"\"}]\n", "admission[0].qos"),
            ("admission: [{partition: gpu, policy: ff}]\n", "admission[0].policy"),
            ("admission: [{account: ml, default_mem: 4G}]\n", "admission[0].default_mem"),
            ("admission: [{}]\n", "admission[0]"),
            ("monitor: {interval: 2s, stale_after: 3s}\n", "monitor.stale_after"),
            ("monitor: {interval: 10ms}\n", "monitor.interval"),
            (
                "monitor: {dcgm_exporter: https://h:9400/metrics}\n",
                "monitor.dcgm_exporter: 'https://h:9400/metrics' is not an http:// URL",
            ),
            ("monitor: {dcgm_exporter: 'http://h/metrics'}\n", "names no port"),
            ("monitor: {dcgm_exporter: 'http://h:0/metrics'}\n", "bad port"),
            ("monitor: {dcgm_exporter: 'http://h x:9400/metrics'}\n", "bad host"),
            ("monitor: {publish: true}\n", "publish"),
            ("sharing: spatial\n", "sharing"),
            ("gpu_owner: node\n", "gpu_owner"),
            ("mps: {pipe_dir: run/mps}\n", "mps.pipe_dir"),
        ];
        for (text, key) in cases {
            let line = parse(text).unwrap_err().to_string();
            assert!(line.starts_with("config /etc/slurm/carma.yaml: "), "{line}");
            assert!(line.contains(key), "{text:?} -> {line}");
            assert!(!line.contains('\n'), "{line}");
        }
    }

    #[test]
    fn values_spanning_lines_still_give_one_line() {
        // Found by the config_yaml fuzz target.
        let line = parse("monitor_window: \"5s\\nmemory\"\n").unwrap_err().to_string();
        assert!(line.contains("monitor_window") && !line.chars().any(char::is_control), "{line:?}");
    }

    #[test]
    fn hostile_yaml_is_an_error_not_a_panic() {
        for text in ["[1, 2", "{{{{", "\u{0}\u{1}", "- a\n- b\n", "a: &x [*x]\n", ": :"] {
            assert!(parse(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn transparent_scopes_are_read_in_order() {
        let c =
            parse("transparent:\n  - {partition: shared, default_mem: 10G}\n  - {account: ml, qos: low, policy: ff}\n")
                .unwrap();
        assert_eq!(c.transparent.len(), 2);
        assert_eq!(c.transparent[0].default_mib, Some(10240));
        assert_eq!(c.transparent[1].policy, Some(Policy::FirstFit));
        let job = |p| JobScopeFacts { partition: Some(p), account: Some("ml"), qos: Some("low") };
        assert_eq!(c.transparent_scope(&job("shared")).map(Scope::selectors).as_deref(), Some("partition:shared"));
        assert_eq!(c.transparent_scope(&job("other")).map(Scope::selectors).as_deref(), Some("account:ml,qos:low"));
        assert!(parse("").unwrap().transparent.is_empty());
    }

    #[test]
    fn admission_scopes_are_selectors_only() {
        let c = parse("admission:\n  - {partition: wide}\n  - {account: ml}\n").unwrap();
        assert_eq!(c.admission.len(), 2);
        assert_eq!(c.admission[0].selectors(), "partition:wide");
        assert_eq!(c.admission[1].to_string(), "scope partition=* account=ml qos=*");
        assert!(parse("").unwrap().admission.is_empty());
    }
}
