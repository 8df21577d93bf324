//! A running job: where it runs, what it allocates, how far it is.

use carma_placement::slowdown::Profile;

pub(super) struct Run {
    pub(super) job: usize,
    pub(super) pid: u32,
    pub(super) node: usize,
    pub(super) gpus: Vec<u32>,
    /// Shards slurmctld allocated on each of `slurm_gpus`.
    pub(super) shards: u32,
    pub(super) slurm_gpus: Vec<u32>,
    /// The node-level memory count slurmctld allocated (node-memory).
    pub(super) node_gib: u32,
    pub(super) start: f64,
    pub(super) peak: f64,
    /// Solo readings: share of time a kernel runs, SM activity.
    pub(super) busy: f64,
    pub(super) sm: f64,
    pub(super) solo_s: f64,
    pub(super) progress: f64,
    /// A client of its GPU's MPS server (sharing mps, one GPU, not whole):
    /// it pays MPS's own cost even alone.
    pub(super) mps_client: bool,
}

impl Run {
    /// What the job does to a GPU alone: its true solo readings.
    pub(super) fn profile(&self) -> Profile {
        Profile { busy: self.busy, sm: self.sm }
    }

    pub(super) fn alloc(&self, t: f64, ramp: f64) -> f64 {
        if ramp <= 0.0 { self.peak } else { self.peak * ((t - self.start) / ramp).clamp(0.0, 1.0) }
    }
}
