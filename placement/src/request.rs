//! What a placement is asked and what it answers: shared by the placer,
//! the queue of waiting requests (which stores them) and the resolution
//! that builds requests. A leaf: it depends on no other module of the crate
//! but the GPU index list.

use carma_config::Policy;
use std::fmt;

/// A step of a job on this node; `holder` is its slurmstepd's pid, whose
/// death releases what the step held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepRef {
    pub job: u32,
    pub holder: u32,
}

/// What the job asks for, with its estimate already resolved.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Request {
    pub policy: Policy,
    pub count: u32,
    /// Per-GPU estimate; `None` = unknown, so whole GPUs.
    pub estimate_mib: Option<u64>,
    /// Which source decided the estimate, for logs and status.
    pub estimate_source: String,
    /// The step shares its GPUs (shards or no Slurm GPUs): a whole-GPU
    /// record the prolog made for the job is dropped in the same update.
    pub shares: bool,
    /// The job's signature (model file and batch size), for the history.
    pub signature: Option<String>,
    /// The job declared nothing (transparent collocation): its history on
    /// this node is its estimate, even below `estimate_mib` (a scope's
    /// default) or where that is unknown. Otherwise history only raises.
    #[serde(default)]
    pub history_first: bool,
    /// The job's user when it shares a GPU as an MPS client (`sharing: mps`).
    #[serde(default)]
    pub mps_uid: Option<u32>,
    /// The software stack's fixed part included in `estimate_mib`, where the
    /// estimate came from a model (the rest is the model's): the node's
    /// learned fixed memory replaces it where larger.
    #[serde(default)]
    pub runtime_mib: Option<u64>,
    /// The job's batch step: its promise is the job's, which an srun step
    /// inside the script shares (see `decide::join`).
    #[serde(default)]
    pub batch_step: bool,
    /// The job's user as Slurm says it: whose learned fixed part applies,
    /// and whose the job's observation becomes.
    #[serde(default)]
    pub uid: Option<u32>,
    /// The GPUs Slurm allocated to the job on this node (its shards' GPU,
    /// or its gres/gpu), as the job prolog recorded them: the step is
    /// placed among these only, so that every GPU it uses is one Slurm
    /// counts as the job's and never one Slurm may hand whole to another
    /// job. `None`: any GPU of the node (tools, benches, the simulator).
    #[serde(default)]
    pub within: Option<Vec<u32>>,
    /// Under which key the job's profile (what it does to a GPU alone) is
    /// learned and looked up: `uid:` and its model signature, or its job
    /// script's digest. `None`: it has none, and counts as filling a GPU.
    #[serde(default)]
    pub profile_key: Option<String>,
}

impl Request {
    /// One GPU, shared, with a declared per-GPU estimate and nothing else
    /// known: what `--carma-mem` alone asks for (tools, benches, tests).
    pub fn declared(policy: Policy, estimate_mib: u64) -> Request {
        Request {
            policy,
            count: 1,
            estimate_mib: Some(estimate_mib),
            estimate_source: "declared".into(),
            shares: true,
            signature: None,
            history_first: false,
            mps_uid: None,
            runtime_mib: None,
            batch_step: false,
            uid: None,
            within: None,
            profile_key: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Decision {
    pub gpus: Vec<u32>,
    pub exclusive: bool,
    /// Per-GPU memory the reservation promises.
    pub reserve_mib: u64,
    /// The job already held these GPUs (an earlier step placed it).
    pub reused: bool,
    /// Set when this node's history of the job's signature raised the estimate.
    pub history_mib: Option<u64>,
    /// Effective free memory of each chosen GPU when chosen (empty if reused).
    pub free_mib: Vec<u64>,
    /// The capped reading (`metric`) of each chosen GPU when chosen (empty if reused).
    pub metric: carma_config::ActivityMetric,
    pub activity: Vec<f64>,
    /// The worst predicted slowdown of each chosen GPU's jobs with this one
    /// (empty if reused).
    #[serde(default)]
    pub slowdown: Vec<f64>,
    /// Set when a learned fixed memory replaced the estimate's (and history
    /// did not decide instead), with whose it was: the user's or the node's.
    #[serde(default)]
    pub learned_runtime_mib: Option<u64>,
    #[serde(default)]
    pub learned_from: Option<crate::learned::Whose>,
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Indices and count named apart: "gpus=3" read both ways.
        write!(
            f,
            "gpu_count={} gpu_indices={} reserve={}M exclusive={}",
            self.gpus.len(),
            crate::gpu::index_list(&self.gpus),
            self.reserve_mib,
            self.exclusive
        )?;
        if self.reused {
            write!(f, " reused=yes")
        } else {
            let free: Vec<String> = self.free_mib.iter().map(|m| format!("{m}M")).collect();
            let act: Vec<String> = self.activity.iter().map(|a| format!("{a:.2}")).collect();
            write!(f, " effective_free={} {}={}", free.join(","), self.metric, act.join(","))?;
            if !self.exclusive && !self.slowdown.is_empty() {
                let s: Vec<String> = self.slowdown.iter().map(|x| format!("{x:.2}")).collect();
                write!(f, " predicted_slowdown={}", s.join(","))?;
            }
            Ok(())
        }
    }
}
