//! What a simulation yields: each job's fate, the per-GPU timeline and the
//! time-averaged figures, with the statistics the reports take of them.

use carma_config::Policy;

#[derive(Debug, Clone, PartialEq)]
pub struct JobResult {
    pub seq: u32,
    pub workload: String,
    pub submit_s: f64,
    pub start_s: Option<f64>,
    pub end_s: Option<f64>,
    pub ooms: u32,
    /// Never placeable (more GPUs than a node has).
    pub rejected: bool,
    /// Sent by slurmctld to a node where CARMA could not place it: failed.
    pub failed_no_fit: bool,
    /// ... while another node could have placed it.
    pub wrong_node: bool,
    /// Where its last run ran: the node's index and the GPUs CARMA chose.
    pub placed: Option<(usize, Vec<u32>)>,
    /// How long the run that finished it took, and how long it takes
    /// alone as a plain process.
    pub run_s: Option<f64>,
    pub solo_s: f64,
    /// Its last run was placed to share a GPU while its node had no
    /// profile of it (the guard counted it as filling the GPU).
    pub unprofiled: bool,
}

impl JobResult {
    /// How many times slower than alone its finishing run went (its wait
    /// in the queue and any run an OOM ended left out).
    pub fn slowdown(&self) -> Option<f64> {
        self.run_s.map(|r| r / self.solo_s)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub t: f64,
    pub sm: Vec<f64>,
    pub mem_mib: Vec<f64>,
}

#[derive(Debug, Clone)]
pub struct Outcome {
    pub policy: Policy,
    pub makespan_s: f64,
    pub jobs: Vec<JobResult>,
    /// Time-averaged over the makespan, per GPU (node-major).
    pub gpu_sm: Vec<f64>,
    pub gpu_mem_mib: Vec<f64>,
    pub energy_j: f64,
    /// Most jobs that ever ran at once on each GPU.
    pub max_jobs_per_gpu: Vec<u32>,
    pub ooms: u32,
    pub recoveries: u32,
    /// Placements whose estimate the node's history of the job raised.
    pub history_raised: u32,
    /// Placements whose estimate the node's learned fixed part raised.
    pub learned_raised: u32,
    /// Shared placements of a job the node had no profile of (the first
    /// run of its signature there): the guard counted it as filling a GPU.
    pub unprofiled: u32,
    /// Times a node handed a job back to slurmctld (it could not place it).
    pub handed_back: u32,
    /// Times a job out of hand-backs paused in the queue (`hand_back_pause_s`).
    pub paused: u32,
    pub timeline: Vec<Sample>,
}

impl Outcome {
    fn finished(&self) -> impl Iterator<Item = &JobResult> {
        self.jobs.iter().filter(|j| j.end_s.is_some())
    }

    pub fn jct(&self) -> Vec<f64> {
        self.finished().map(|j| j.end_s.unwrap_or(0.0) - j.submit_s).collect()
    }

    pub fn waits(&self) -> Vec<f64> {
        self.jobs.iter().filter_map(|j| j.start_s.map(|s| s - j.submit_s)).collect()
    }

    /// Each finished job's slowdown ([`JobResult::slowdown`]).
    pub fn job_slowdowns(&self) -> Vec<f64> {
        self.jobs.iter().filter_map(JobResult::slowdown).collect()
    }

    pub fn mean_sm(&self) -> f64 {
        mean(&self.gpu_sm)
    }
}

pub fn mean(v: &[f64]) -> f64 {
    if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 }
}

/// Nearest-rank percentile of unsorted values.
pub fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[((p * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1]
}
