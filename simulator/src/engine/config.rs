//! What a simulation is asked to run: the cluster, where memory estimates
//! come from, how slurmctld picks a job's node, and the whole
//! configuration.

use carma_config::{GpuOwner, Policy};
use carma_placement::Params;
use std::collections::HashMap;

use super::Assumptions;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cluster {
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub mem_mib: u64,
}

impl Cluster {
    /// `NxGxMEM` (`1x4x40G`), `NxG` (40 GiB GPUs) or `G` (one node).
    pub fn parse(s: &str) -> Result<Cluster, String> {
        let parts: Vec<&str> = s.split('x').collect();
        let int = |p: &str| {
            p.parse::<u32>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("cluster '{s}': '{p}' is not a positive number"))
        };
        let (nodes, gpus, mem) = match parts.as_slice() {
            [g] => (1, int(g)?, 40960),
            [n, g] => (int(n)?, int(g)?, 40960),
            [n, g, m] => {
                (int(n)?, int(g)?, carma_config::parse_size_mib(m).map_err(|e| format!("cluster '{s}': {e}"))?)
            }
            _ => return Err(format!("cluster '{s}': write NODESxGPUSxMEM, e.g. 1x4x40G")),
        };
        Ok(Cluster { nodes, gpus_per_node: gpus, mem_mib: mem })
    }

    pub fn gpus(&self) -> usize {
        (self.nodes * self.gpus_per_node) as usize
    }

    /// Index of GPU `g` of `node` among all the cluster's GPUs (node-major).
    pub(super) fn slot(&self, node: usize, g: u32) -> usize {
        node * self.gpus_per_node as usize + g as usize
    }
}

/// Where a job's memory estimate comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Estimator {
    /// The measured peak: a perfect estimator.
    Oracle,
    /// A column `<name>_estimate_mib` of the workload table. The paper uses
    /// 40000 for "failed or capped": such jobs get whole GPUs.
    Column(String),
    /// Estimates made elsewhere, by workload (`carma simulate --estimator
    /// carma` runs carma-estimator on each workload's model file, as
    /// srun/sbatch would); `None` = no estimate, so whole GPUs.
    Given(HashMap<String, Option<u64>>),
}

/// Which node (and GPU) slurmctld sends a job to before CARMA decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Admission {
    /// CARMA's decision on every node, the first that fits: a cluster-wide
    /// CARMA no Slurm has (the best collocation could do, for comparison).
    #[default]
    Anywhere,
    /// Today's slurmctld: each GPU offers `per_gpu` shards, a job asks one
    /// per GPU, and goes to the first node with that many GPUs holding a
    /// free shard; CARMA then decides on that node only.
    Shards { per_gpu: u32, hand_back: u32 },
    /// Shards as memory: each GPU offers its memory in GiB; a job asks its
    /// estimate plus headroom in GiB (a whole GPU's worth when unknown) on
    /// each GPU, and slurmctld picks the node and the GPUs (the first that
    /// have them free); CARMA checks its preconditions on those GPUs.
    MemoryShards { hand_back: u32 },
    /// Shards as memory, and each node's carma-monitor withdraws the shards
    /// of a GPU over the activity cap from slurmctld (gives them back when it
    /// falls under): Slurm sees both of CARMA's preconditions.
    Informed,
    /// What Slurm can be told at run time: a node-level memory count (a
    /// GRES without device files, `carmamem`, in GiB), which each node's
    /// carma-monitor sets to the memory of its GPUs under the activity cap;
    /// a job asks its estimate plus headroom per GPU. slurmctld picks the
    /// node, CARMA the GPUs (its policy, granting their devices itself); a
    /// node where no GPU fits after all hands the job back.
    NodeMemory { hand_back: u32 },
}

/// With `hand_back` 0 a job CARMA cannot place where Slurm sent it fails
/// (after `timeouts.wait`, as on a real node). Otherwise the node hands it
/// back: requeued with that node excluded (the exclusion stays with the
/// job), at most `hand_back` times; the next refusal fails it.
const HAND_BACK: u32 = 3;

impl Admission {
    pub fn parse(s: &str) -> Result<Admission, String> {
        match s {
            "anywhere" => Ok(Admission::Anywhere),
            "shards" => Ok(Admission::Shards { per_gpu: 8, hand_back: 0 }),
            "shards+handback" => Ok(Admission::Shards { per_gpu: 8, hand_back: HAND_BACK }),
            "memory-shards" => Ok(Admission::MemoryShards { hand_back: 0 }),
            "memory-shards+handback" => Ok(Admission::MemoryShards { hand_back: HAND_BACK }),
            "informed" => Ok(Admission::Informed),
            "node-memory" => Ok(Admission::NodeMemory { hand_back: HAND_BACK }),
            _ => Err(format!(
                "admission '{s}': expected anywhere, shards, shards+handback, memory-shards, memory-shards+handback, informed or node-memory"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Admission::Anywhere => "anywhere",
            Admission::Shards { hand_back: 0, .. } => "shards",
            Admission::Shards { .. } => "shards+handback",
            Admission::MemoryShards { hand_back: 0 } => "memory-shards",
            Admission::MemoryShards { .. } => "memory-shards+handback",
            Admission::Informed => "informed",
            Admission::NodeMemory { .. } => "node-memory",
        }
    }

    pub(super) fn hand_back(self) -> u32 {
        match self {
            Admission::Anywhere | Admission::Informed => 0,
            Admission::Shards { hand_back, .. }
            | Admission::MemoryShards { hand_back }
            | Admission::NodeMemory { hand_back } => hand_back,
        }
    }
}

#[derive(Debug, Clone)]
pub struct SimConfig {
    pub cluster: Cluster,
    pub policy: Policy,
    pub estimator: Estimator,
    pub params: Params,
    pub assumptions: Assumptions,
    pub admission: Admission,
    /// Whose choice of GPU stands where slurmctld allocates shards
    /// (carma.yaml `gpu_owner`): `Slurm` keeps CARMA to the GPUs of the
    /// job's shards (the first GPUs with one free); `Carma` lets its policy
    /// pick any GPU of the node. Shards sized in memory are Slurm's choice
    /// either way; `anywhere` is CARMA's.
    pub gpu_owner: GpuOwner,
    /// slurm.conf `SelectTypeParameters=...,LL_SHARED_GRES` (Slurm 23.11
    /// and later): slurmctld takes shards from the GPU with the fewest
    /// allocated, not from the first with one free.
    pub least_loaded: bool,
}
