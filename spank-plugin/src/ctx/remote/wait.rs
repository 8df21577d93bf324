//! While a step waits for a GPU: whether its job still runs, asked of
//! slurmctld at a bounded rate.

use carma_config::Config;
use carma_placement::command::SQUEUE_LOCAL;
use std::time::{Duration, Instant};

/// How often a waiting step asks slurmctld whether its job still runs:
/// every ALIVE_EVERY in its first ALIVE_FAST_FOR of waiting, then every
/// ALIVE_LATER (a cancel of a long wait ends it within that).
const ALIVE_EVERY: Duration = Duration::from_millis(1500);
const ALIVE_FAST_FOR: Duration = Duration::from_secs(10);
const ALIVE_LATER: Duration = Duration::from_secs(5);

/// The placer's `job_alive` for a step of `job` that begins to wait now.
/// Slurm is asked while the step waits, first ALIVE_EVERY after it began,
/// then every ALIVE_EVERY, and every ALIVE_LATER once it has waited
/// ALIVE_FAST_FOR: a cancel ends it within about that, at a bounded cost
/// to slurmctld (2 RPCs a question; tests/scale.sh).
pub(super) fn job_alive_asker(cfg: &Config, job: u32) -> impl FnMut() -> bool {
    let began = Instant::now();
    let mut asked = (began, true);
    move || {
        let every = if began.elapsed() < ALIVE_FAST_FOR { ALIVE_EVERY } else { ALIVE_LATER };
        if asked.0.elapsed() >= every {
            asked = (Instant::now(), job_alive(cfg.slurm_bin_dir.as_deref(), job));
        }
        asked.1
    }
}

/// Whether slurmctld still runs the job, asked while its step waits for a
/// GPU: slurmstepd shows a hook nothing of a cancel (its terminate handler
/// first waits for the step to start, Slurm's slurmstepd/req.c), and slurmd
/// stops answering while it waits. An unanswered question keeps waiting
/// (the wait is bounded anyway).
fn job_alive(bin_dir: Option<&std::path::Path>, job: u32) -> bool {
    let job = job.to_string();
    let args = [SQUEUE_LOCAL, "-h", "-j", &job, "-o", "%T"];
    let squeue = carma_placement::command::slurm_program(bin_dir, "squeue");
    match carma_placement::command::run(&squeue, &args, Duration::from_secs(1)) {
        Ok(state) => {
            let state = state.trim();
            state.is_empty() || ["RUNNING", "CONFIGURING"].contains(&state)
        }
        Err(_) => true,
    }
}
