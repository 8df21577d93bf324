//! One reservation of the node's GPUs and what kind of holding it is.

use carma_config::Policy;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Holding {
    /// Placed by CARMA.
    Carma,
    /// Whole GPUs Slurm gave a job that does not use CARMA: never shared.
    SlurmWhole,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reservation {
    pub job: u32,
    /// The node's GPU indices (never a count); older state files say `gpus`.
    #[serde(rename = "gpu_indices", alias = "gpus")]
    pub gpus: Vec<u32>,
    /// Memory held per GPU, MiB: the promise (estimate and headroom), or the
    /// whole GPU for exclusive holdings. On disk still `estimate_mib`, the name
    /// older builds read and write.
    #[serde(rename = "estimate_mib")]
    pub reserved_mib: u64,
    /// Which estimator source decided the estimate (declared, gpumemnet, ...).
    pub estimate_source: String,
    /// No other job may be placed on these GPUs.
    pub exclusive: bool,
    pub holding: Holding,
    pub policy: Option<Policy>,
    /// Unix seconds.
    pub since: u64,
    /// slurmstepd pids of the job's running steps on this node; a
    /// reservation without live holders is released. Empty = a job-level
    /// record (made by the prolog before any step), kept while the job runs.
    pub holders: Vec<u32>,
    /// The job's signature (model file and batch size, from srun/sbatch),
    /// under which its observed peak is remembered.
    #[serde(default)]
    pub signature: Option<String>,
    /// Highest per-GPU memory its processes were seen using (at placement
    /// decisions on this node): a lower bound of its peak.
    #[serde(default)]
    pub observed_mib: u64,
    /// Set for a job placed as an MPS client: its user, whom the GPU's MPS
    /// server will serve (no other user's MPS job may join until it ends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps_uid: Option<u32>,
    /// The model's part of the estimate it came with (the estimate less the
    /// stack's fixed part), where srun/sbatch estimated it from a model:
    /// with its observed peak, an observation of the node's fixed part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_mib: Option<u64>,
    /// The job's user as Slurm says it: whose learned fixed part its
    /// observation moves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// What the job does to a GPU alone, as far as this node has seen it
    /// (its signature's learned profile, raised by readings of windows in
    /// which it ran alone): the slowdown guard's view of it. None: unknown,
    /// counted as filling the GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<crate::slowdown::Profile>,
    /// Under which key its profile is learned: `uid:` and its model
    /// signature, or its job script's digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile_key: Option<String>,
    /// Since when (Unix seconds) it has run alone on its GPUs, as last
    /// seen: what its profile may be learned from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alone_since: Option<u64>,
}

impl Reservation {
    /// The job prolog's record of GPUs Slurm allocated to `job` whole.
    pub fn slurm_whole(job: u32, gpus: Vec<u32>, since: u64) -> Reservation {
        Reservation {
            job,
            gpus,
            reserved_mib: 0,
            estimate_source: "slurm".into(),
            exclusive: true,
            holding: Holding::SlurmWhole,
            policy: None,
            since,
            holders: vec![],
            signature: None,
            observed_mib: 0,
            mps_uid: None,
            model_mib: None,
            uid: None,
            profile: None,
            profile_key: None,
            alone_since: None,
        }
    }
}
