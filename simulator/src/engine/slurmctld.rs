//! slurmctld's side of admission: the shards it has allocated, what a job
//! asks of each GPU, and the node (and GPUs) it sends the job to.

use super::node::{NodeView, Run};
use super::window::Windowed;
use super::{Admission, Cluster, SimConfig};
use carma_config::GpuOwner;

/// What slurmctld has allocated: shards on each GPU (node-major) and the
/// node-level memory count, taken when a run starts and given back when it
/// ends.
pub(super) struct SlurmAlloc {
    pub(super) shards: Vec<u32>,
    pub(super) node_gib: Vec<u32>,
    pub(super) gpus_per_node: u32,
}

impl SlurmAlloc {
    pub(super) fn new(cl: Cluster) -> SlurmAlloc {
        SlurmAlloc { shards: vec![0; cl.gpus()], node_gib: vec![0; cl.nodes as usize], gpus_per_node: cl.gpus_per_node }
    }

    pub(super) fn shards(&self, node: usize, g: u32) -> u32 {
        self.shards[node * self.gpus_per_node as usize + g as usize]
    }

    /// Takes what a job waiting on `node` for a GPU holds there.
    pub(super) fn hold(&mut self, node: usize, gpus: &[u32], shards: u32, node_gib: u32) {
        for &g in gpus {
            self.shards[node * self.gpus_per_node as usize + g as usize] += shards;
        }
        self.node_gib[node] += node_gib;
    }

    /// Gives back what [`SlurmAlloc::hold`] took.
    pub(super) fn unhold(&mut self, node: usize, gpus: &[u32], shards: u32, node_gib: u32) {
        for &g in gpus {
            self.shards[node * self.gpus_per_node as usize + g as usize] -= shards;
        }
        self.node_gib[node] -= node_gib;
    }

    pub(super) fn take(&mut self, r: &Run) {
        for &g in &r.slurm_gpus {
            self.shards[r.node * self.gpus_per_node as usize + g as usize] += r.shards;
        }
        self.node_gib[r.node] += r.node_gib;
    }

    pub(super) fn give_back(&mut self, r: &Run) {
        for &g in &r.slurm_gpus {
            self.shards[r.node * self.gpus_per_node as usize + g as usize] -= r.shards;
        }
        self.node_gib[r.node] -= r.node_gib;
    }
}

/// Shards a GPU offers where shards count jobs, not memory (gres.conf
/// `Count=8` per GPU; node-memory admission keeps them beside `carmamem`).
const JOB_SHARDS_PER_GPU: u32 = 8;

fn shards_per_gpu(admission: Admission, cl: Cluster) -> u32 {
    match admission {
        Admission::Anywhere => 0,
        Admission::Shards { per_gpu, .. } => per_gpu,
        Admission::MemoryShards { .. } | Admission::Informed | Admission::NodeMemory { .. } => {
            (cl.mem_mib / 1024) as u32
        }
    }
}

/// Shards a job asks for on each GPU: one, or its estimate plus headroom in
/// GiB (a whole GPU's worth when the estimate is unknown or larger).
fn shards_needed(cfg: &SimConfig, cl: Cluster, estimate_mib: Option<u64>) -> u32 {
    let per_gpu = shards_per_gpu(cfg.admission, cl);
    match cfg.admission {
        Admission::Anywhere => 0,
        Admission::Shards { .. } => 1,
        Admission::MemoryShards { .. } | Admission::Informed | Admission::NodeMemory { .. } => estimate_mib
            .map_or(per_gpu, |e| (e + cfg.params.headroom_mib).div_ceil(1024).min(u64::from(per_gpu)) as u32),
    }
}

/// What a job asks slurmctld for on each of its GPUs.
pub(super) struct Ask {
    /// Its estimate plus headroom, in shards (see [`shards_needed`]).
    pub(super) need: u32,
    /// The shards it takes of each GPU slurmctld gives it.
    pub(super) shards: u32,
    /// The shards a GPU offers.
    pub(super) gpu_shards: u32,
}

impl Ask {
    pub(super) fn new(cfg: &SimConfig, gpus: u32, estimate_mib: Option<u64>) -> Ask {
        let cl = cfg.cluster;
        let need = shards_needed(cfg, cl, estimate_mib);
        // Under Slurm's ownership a job of several GPUs on job-count
        // shards asks whole GPUs (`--gres=gpu:N`: Slurm takes one job's
        // shards from one GPU; job_submit.lua keeps such jobs whole).
        // Memory shards assume MULTIPLE_SHARING_GRES_PJ instead.
        let whole = cfg.gpu_owner == GpuOwner::Slurm
            && gpus > 1
            && matches!(cfg.admission, Admission::Shards { .. } | Admission::NodeMemory { .. });
        // Shards a GPU offers and the job asks of each of its GPUs (node
        // memory counts GiB per node, beside one job shard per GPU; a
        // whole GPU takes all its shards).
        let node_memory = matches!(cfg.admission, Admission::NodeMemory { .. });
        let gpu_shards = if node_memory { JOB_SHARDS_PER_GPU } else { shards_per_gpu(cfg.admission, cl) };
        let shards = match (whole, node_memory) {
            (true, _) => gpu_shards,
            (false, true) => 1,
            (false, false) => need,
        };
        Ask { need, shards, gpu_shards }
    }

    /// The node-level memory count (GiB) a job of `gpus` GPUs takes under
    /// node-memory admission; none otherwise.
    pub(super) fn node_gib(&self, cfg: &SimConfig, gpus: u32) -> u32 {
        if matches!(cfg.admission, Admission::NodeMemory { .. }) { self.need * gpus } else { 0 }
    }
}

/// What slurmctld knows when it picks a job's node: its own allocations
/// and, where the monitors tell it, which GPUs are over the activity cap.
pub(super) struct Slurmctld<'a> {
    pub(super) cfg: &'a SimConfig,
    pub(super) alloc: &'a SlurmAlloc,
    pub(super) runs: &'a [Run],
    pub(super) by_node: &'a [Vec<usize>],
    pub(super) t: f64,
    pub(super) window: &'a Windowed,
    /// Each node's admission count, where monitors set it.
    pub(super) counts: &'a [(f64, u32)],
}

impl Slurmctld<'_> {
    /// Slurm's choice for a job of `gpus` GPUs: the first node that has
    /// what it asks, past the nodes that handed it back, with the GPUs
    /// slurmctld gives it there (none where CARMA picks them). `None`: the
    /// job pends.
    pub(super) fn pick(&self, excluded: &[usize], gpus: u32, ask: &Ask) -> Option<(usize, Vec<u32>)> {
        (0..self.cfg.cluster.nodes as usize)
            .filter(|n| !excluded.contains(n))
            .find_map(|n| self.fits(n, gpus, ask).map(|g| (n, g)))
    }

    /// The order slurmctld tries a node's GPUs in for shards.
    fn tried(&self, node: usize) -> Vec<u32> {
        let mut g: Vec<u32> = (0..self.cfg.cluster.gpus_per_node).collect();
        if self.cfg.least_loaded {
            g.sort_by_key(|&g| self.alloc.shards(node, g));
        }
        g
    }

    /// The GPUs of `node` slurmctld would give the job, if it has enough.
    fn fits(&self, node: usize, gpus: u32, ask: &Ask) -> Option<Vec<u32>> {
        let (cfg, cl) = (self.cfg, self.cfg.cluster);
        let admission = cfg.admission;
        let per_gpu = shards_per_gpu(admission, cl);
        // Informed, node memory: GPUs over the cap offer none.
        let mut over: Vec<bool> = if matches!(admission, Admission::Informed | Admission::NodeMemory { .. }) {
            let view = NodeView {
                cluster: cl,
                node,
                runs: self.runs,
                on_node: &self.by_node[node],
                t: self.t,
                assumptions: &cfg.assumptions,
                window: self.window,
            };
            view.read_now().iter().map(|g| g.activity(cfg.params.metric) > cfg.params.cap()).collect()
        } else {
            vec![false; cl.gpus_per_node as usize]
        };
        if matches!(admission, Admission::NodeMemory { .. }) {
            let capacity = if cfg.assumptions.count_interval_s > 0.0 {
                self.counts[node].1
            } else {
                over.iter().filter(|o| !**o).count() as u32 * per_gpu
            };
            let free = capacity.saturating_sub(self.alloc.node_gib[node]);
            if free < ask.need * gpus {
                return None;
            }
            if cfg.gpu_owner == GpuOwner::Carma {
                return Some(Vec::new());
            }
            // The job's shard of each GPU, whatever its memory or activity
            // (Slurm sees neither per GPU).
            over = vec![false; cl.gpus_per_node as usize];
        }
        let free: Vec<u32> = self
            .tried(node)
            .into_iter()
            .filter(|&g| !over[g as usize] && self.alloc.shards(node, g) + ask.shards <= ask.gpu_shards)
            .take(gpus as usize)
            .collect();
        (free.len() == gpus as usize).then_some(free)
    }
}
