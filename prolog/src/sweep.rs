//! The sweep of stale job files: the recovery files (and whole-GPU
//! records) of jobs that will not run on this node again.

use crate::slurm::slurm_output;
use carma_config::Config;
use carma_placement::command::SQUEUE_LOCAL;
use carma_placement::jobfiles;
use std::time::Duration;

/// How long a job's recovery files may sit before the epilog asks Slurm
/// whether the job can still need them (a requeued job normally restarts
/// within seconds), and how often it asks at most.
const STALE_JOBFILES_AGE: Duration = Duration::from_secs(600);
const STALE_JOBFILES_SWEEP: Duration = Duration::from_secs(600);
/// Jobs looked up per sweep (one squeue call), bounding the epilog's time.
const STALE_JOBFILES_MAX: usize = 256;

/// Slurm's states of a job that has ended for good.
const ENDED_STATES: [&str; 10] = [
    "COMPLETED",
    "CANCELLED",
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
    "REVOKED",
];

/// Removes the recovery files of jobs that will not run again: ones Slurm
/// no longer knows or that reached a final state (cancelled while waiting
/// to rerun, or rerun and ended elsewhere). Jobs still pending or running
/// keep theirs; when Slurm cannot be asked, everything is kept.
pub fn sweep_stale_jobfiles(cfg: &Config, log: &dyn Fn(&str)) {
    if !jobfiles::sweep_due(&cfg.state_dir, STALE_JOBFILES_SWEEP) {
        return;
    }
    let jobs = jobfiles::older_than(&cfg.state_dir, STALE_JOBFILES_AGE, STALE_JOBFILES_MAX);
    if jobs.is_empty() {
        return;
    }
    let list: Vec<String> = jobs.iter().map(u32::to_string).collect();
    // squeue lists the jobs it knows and fails only if it knows none.
    let known = match slurm_output(
        cfg.slurm_bin_dir.as_deref(),
        "squeue",
        &[SQUEUE_LOCAL, "-h", "-t", "all", "-o", "%A %T", "-j", &list.join(",")],
    ) {
        Ok(out) => out,
        Err(e) if e.contains("Invalid job id") => String::new(),
        Err(e) => return log(&format!("stale recovery files: cannot ask Slurm about their jobs ({e}); kept")),
    };
    let state_of = |job: u32| {
        known.lines().find_map(|l| l.split_once(' ').filter(|(id, _)| id.parse() == Ok(job)).map(|(_, s)| s.trim()))
    };
    let ended_jobs: Vec<(u32, Option<&str>)> = jobs
        .into_iter()
        .map(|job| (job, state_of(job)))
        .filter(|(_, state)| state.is_none_or(|s| ENDED_STATES.contains(&s)))
        .collect();
    // First the prolog's records of their whole GPUs, which only a job's
    // epilog releases otherwise (slurmd may have lost that), in one pass
    // under the state lock: the files go only once that is done, or the
    // next sweep would no longer find the jobs.
    let ids: Vec<u32> = ended_jobs.iter().map(|(j, _)| *j).collect();
    match carma_placement::Placer::from_config(cfg, |m| eprintln!("carma-epilog: {m}"))
        .and_then(|p| p.drop_whole_of(&ids))
    {
        Ok(dropped) => {
            for job in dropped {
                log(&format!("released job {job}'s whole GPUs: Slurm says it ended"));
            }
        }
        Err(e) => {
            return log(&format!("stale job files: whole-GPU records not released ({e}); kept for the next sweep"));
        }
    }
    for (job, state) in ended_jobs {
        jobfiles::forget(&cfg.state_dir, job);
        log(&format!(
            "removed the recovery files of job {job}: {}",
            state.map_or("Slurm no longer knows it".to_string(), |s| format!("it is {s}"))
        ));
    }
}
