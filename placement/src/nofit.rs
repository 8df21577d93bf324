//! Why no GPU fits a request: each GPU's reason, kept structured and
//! formatted only when shown. Below the policy and the state: the lock
//! holder answers a queued launch with it (`slots`).

use carma_config::ActivityMetric;
use std::fmt;

/// Why a GPU was passed over. Kept structured and formatted only when
/// shown: a busy node (or the simulator) refuses far more often than it logs.
/// Serialised into a queued launch's answer (slots.rs).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Reject {
    SlurmWhole(u32),
    Exclusive(u32),
    NotIdleJob(u32),
    NotIdleProcesses {
        count: usize,
        used_mib: u64,
    },
    Activity {
        metric: ActivityMetric,
        /// The reading plus what recently placed jobs will add.
        value: f64,
        cap: f64,
        /// Jobs placed within the window, counted in `value`.
        recent: usize,
    },
    Memory {
        free_mib: u64,
        estimate_mib: u64,
        headroom_mib: u64,
    },
    /// MPS serves one user per GPU at a time.
    MpsUser(u32),
    /// A later step of a job asks for more GPUs than the job holds here.
    JobHolds {
        job: u32,
        held: u32,
    },
    /// One of the job's Slurm GPUs (`gpu_owner: slurm`) that no reading
    /// has: Slurm's GPU indices and the readings' differ.
    NotRead,
    /// With the job, some job of the GPU would run more than the bound
    /// slower than alone (the slowdown model over the jobs' profiles).
    Slowdown {
        predicted: f64,
        bound: f64,
        /// Jobs on the GPU with the newcomer.
        jobs: usize,
        /// Of them, jobs with no profile yet (counted as filling the GPU).
        unknown: usize,
    },
}

impl fmt::Display for Reject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reject::SlurmWhole(job) => write!(f, "held whole by Slurm job {job}"),
            Reject::Exclusive(job) => write!(f, "held exclusively by job {job}"),
            Reject::NotIdleJob(job) => write!(f, "not idle (job {job} placed here)"),
            Reject::NotIdleProcesses { count, used_mib } => {
                write!(f, "not idle ({count} processes, {used_mib} MiB used)")
            }
            Reject::Activity { metric, value, cap, recent: 0 } => {
                write!(f, "{} {value:.2} > cap {cap:.2}", metric.label())
            }
            Reject::Activity { metric, value, cap, recent } => write!(
                f,
                "{} {value:.2} (with {recent} job{} placed within the window, not yet in its readings) > cap {cap:.2}",
                metric.label(),
                if *recent == 1 { "" } else { "s" }
            ),
            Reject::Memory { free_mib, estimate_mib, headroom_mib } => {
                write!(f, "effective free {free_mib} MiB < {estimate_mib} MiB estimate + {headroom_mib} MiB headroom")
            }
            Reject::MpsUser(uid) => write!(f, "its MPS server serves another user (uid {uid}) until their jobs end"),
            Reject::JobHolds { job, held } => write!(
                f,
                "held by job {job}, whose steps share the {held} GPU(s) its first step was given here (ask for more GPUs in the job's own options, sbatch/salloc --carma-gpus)"
            ),
            Reject::Slowdown { predicted, bound, jobs, unknown } => {
                write!(f, "predicted slowdown {predicted:.2}x > bound {bound:.2}x with {jobs} jobs")?;
                match unknown {
                    0 => Ok(()),
                    n => write!(f, " ({n} not yet profiled, counted as filling the GPU)"),
                }
            }
            Reject::NotRead => write!(
                f,
                "Slurm gave the job this GPU, but no GPU with this index was read (gres.conf's order or carma.yaml gpu_indices differ from NVML's: docs/isolation.md)"
            ),
        }
    }
}

/// Why each GPU was passed over (`None`: it qualified); prints as one line.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NoFit {
    pub wanted: u32,
    pub reasons: Vec<(u32, Option<Reject>)>,
}

impl NoFit {
    /// The reason most GPUs were passed over, as a metric label: `gpu_count`
    /// (the node has fewer GPUs than asked), `memory`, `activity`, `held`
    /// (whole, exclusive or not idle for an exclusive job), `mps_user` or
    /// `slowdown` (the guard's bound).
    pub fn class(&self) -> &'static str {
        if (self.reasons.len() as u32) < self.wanted || self.reasons.iter().any(|(_, w)| *w == Some(Reject::NotRead)) {
            return "gpu_count";
        }
        let mut counts = [0usize; 5];
        for why in self.reasons.iter().filter_map(|(_, w)| w.as_ref()) {
            let i = match why {
                Reject::Memory { .. } => 0,
                Reject::Activity { .. } => 1,
                Reject::MpsUser(_) => 3,
                Reject::SlurmWhole(_)
                | Reject::JobHolds { .. }
                | Reject::Exclusive(_)
                | Reject::NotIdleJob(_)
                | Reject::NotIdleProcesses { .. } => 2,
                Reject::NotRead => 0,
                Reject::Slowdown { .. } => 4,
            };
            counts[i] += 1;
        }
        let most = (0..5).max_by_key(|&i| (counts[i], 4 - i)).unwrap_or(0);
        ["memory", "activity", "held", "mps_user", "slowdown"][most]
    }
}

impl fmt::Display for NoFit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let eligible = self.reasons.iter().filter(|(_, r)| r.is_none()).count();
        write!(f, "{eligible} of {} GPUs qualify, {} needed", self.reasons.len(), self.wanted)?;
        for (gpu, why) in &self.reasons {
            if let Some(why) = why {
                write!(f, "; GPU{gpu}: {why}")?;
            }
        }
        Ok(())
    }
}
