//! The built-in defaults: what a missing carma.yaml, or a key it leaves
//! out, means.

use super::DEFAULT_CONFIG_PATH;
use super::typed::{
    Config, EstimatorConfig, EstimatorMethod, GpuSource, LearnRuntime, MonitorConfig, MpsConfig, NoFitAction,
    RecoveryMode, Timeouts, UnknownEstimate,
};
use crate::activity::ActivityMetric;
use crate::gpu_owner::GpuOwner;
use crate::policy::Policy;
use crate::sharing::Sharing;
use std::path::PathBuf;
use std::time::Duration;

/// carma.yaml's default `estimator.runtime` (docs/estimator.md says what
/// it rests on).
pub const DEFAULT_RUNTIME_MIB: u64 = 1024;

impl Default for LearnRuntime {
    /// A user's value is used from their 3rd finished job on this node.
    /// The largest of their latest 32: the estimator's model part is mostly
    /// an over-estimate, so most observations fall below the stack's fixed
    /// part and a lower quantile leaves later jobs short (docs/estimator.md).
    fn default() -> LearnRuntime {
        LearnRuntime { min_jobs: 3, window: 32, quantile: 1.0, max_mib: 4096 }
    }
}

/// carma-monitor's metrics address unless carma.yaml says otherwise:
/// loopback only (a Prometheus on the node, or a tunnel/proxy, reads it).
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9402";

/// Output lines of the common frameworks when the GPU runs out of memory,
/// taken from their sources (docs/oom-messages.md says where each comes
/// from; prolog/src/oom.rs tests each verbatim).
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
            max_slowdown: 1.6,
            max_slowdown_unprofiled: 2.0,
            idle_first: true,
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
            hand_back_pause: Duration::from_secs(60),
            // 60 s doubling to an hour: about 19 h in the queue in all.
            max_pauses: 24,
            recovery_mode: RecoveryMode::Exclusive,
            max_recoveries: 1,
            looser_margin_mib: 2048,
            oom_patterns: DEFAULT_OOM_PATTERNS.iter().map(|s| s.to_string()).collect(),
            timeouts: Timeouts {
                lock: Duration::from_secs(5),
                // A waiting step holds slurmd's launch RPC: wait much longer
                // and slurmctld takes the node for one that stopped responding.
                wait: Duration::from_secs(30),
                poll: Duration::from_secs(2),
                // Far above a healthy full read, and below the state lock's
                // 5 s: the reader holds that lock while its waiters wait.
                gpu_read: Duration::from_secs(3),
            },
            // The CUDA context, cuBLAS/cuDNN workspaces and the framework's own
            // allocations: a property of the software stack, not of the
            // model. A larger stack is learned per user from finished jobs
            // (docs/estimator.md says what the default rests on).
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
