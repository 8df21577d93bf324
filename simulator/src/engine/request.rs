//! A queued job's request as the plugin resolves it.

use super::{Estimator, SimConfig};
use crate::input::Workload;
use carma_config::{Config, JobRequest, RecoveryMode};
use carma_placement::jobfiles::Recovery;
use carma_placement::resolve::{self, NodeFacts, Resolution, StepFacts};

/// Every simulated job is one user's.
const SIM_UID: u32 = 1000;

/// A queued job's request as the plugin resolves it: the estimator's
/// figure as srun/sbatch would pass it (a model-based one with its fixed
/// part and a signature, so history and the learned fixed part apply; a
/// measured or column figure as declared memory), and a recovering rerun
/// as carma-epilog's marker says.
pub(super) fn plan(
    w: &Workload,
    from_recovery: bool,
    cfg: &SimConfig,
    resolve_cfg: &Config,
) -> Result<resolve::Plan, String> {
    let mut request = JobRequest { policy: Some(cfg.policy), gpus: Some(w.gpus), ..JobRequest::default() };
    let mut estimate = None;
    match &cfg.estimator {
        Estimator::Oracle => request.mem_mib = Some(w.peak_mib),
        Estimator::Column(c) => request.mem_mib = w.estimates.get(c).copied().filter(|&e| e < 40000),
        Estimator::Given(m) => {
            if let Some(mib) = m.get(&w.name).copied().flatten() {
                let runtime = carma_estimator::Settings::default().runtime_mib;
                let signature = carma_config::fnv1a(w.name.as_bytes());
                estimate = Some(carma_config::format_estimate(mib, "layers", signature, Some(runtime.min(mib))));
            }
        }
    }
    // The job script's digest, as the plugin takes it from Slurm's copy:
    // one per workload. The node learns what a job does to a GPU under its
    // model's signature where the estimate has one, else under this.
    let job_signature = Some(format!("job:{:016x}", carma_config::fnv1a(format!("script:{}", w.name).as_bytes())));
    let facts = StepFacts { job: 0, uid: SIM_UID, request, estimate, job_signature, ..StepFacts::default() };
    // slurmctld charged every simulated job as many GPUs as it asks for
    // (which ones: CARMA's policy picks, see `SimConfig::gpu_owner`).
    let charged: Vec<u32> = (0..w.gpus).collect();
    let node = if from_recovery {
        NodeFacts {
            recovery: Some(Recovery { mode: RecoveryMode::Exclusive, need_mib: Some(w.peak_mib), count: 1 }),
            slurm_gpus: charged,
        }
    } else {
        NodeFacts { slurm_gpus: charged, ..NodeFacts::default() }
    };
    match resolve::resolve(&facts, &node, resolve_cfg)? {
        Resolution::Place(plan) => Ok(*plan),
        other => Err(format!("{}: not a CARMA job ({other:?})", w.name)),
    }
}
