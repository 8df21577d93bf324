//! slurmstepd (remote): which SPANK hook does what with a step's placement.
//! The decision is made once per step in `init_post_opt`, the last hook
//! that runs as root before tasks fork (`user_init` already runs as the
//! job's user and could not write the root-owned state); `task_post_fork`
//! (in slurmstepd, root, once the task plugin has constrained the task's
//! cgroups and before the task execs) lets the task open its placement's
//! GPUs and no other (`carma_placement::devices`); `task_init` (in each
//! forked task, as the user) only copies the decision into the task's
//! environment; `task_exit` (root, as each task ends) writes the job's
//! record; `exit` (root again) releases the step's hold on its GPUs.
//!
//! One way through: [`facts`] (read from Slurm once) → [`place`] (plan,
//! wait in [`wait`], decide, [`mps`] client) → [`Granted`] → [`isolate`]
//! (the task's devices) and [`record`] (the job's record).

mod facts;
mod isolate;
mod mps;
mod place;
mod record;
mod wait;

use crate::error::Error;
use crate::log;
use crate::spank::Spank;
use carma_placement::StepRef;
use once_cell::sync::OnceCell;

/// What the step was granted (the placer's decision, its device minors and
/// the task's environment), made in init_post_opt, read after fork (lock-free).
struct Granted {
    gpus: Vec<u32>,
    /// The device minor number of each of `gpus` (`/dev/nvidia<minor>`).
    minors: Vec<u32>,
    summary: String,
    /// More of the task's environment (an MPS client's pipe and fence).
    env: Vec<(&'static str, String)>,
    step: StepRef,
    /// As Slurm names it: `batch`, `extern`, `interactive` or the number.
    step_name: String,
}
/// `Err` holds why a CARMA step could not be placed. It is reported by
/// task_init, in the task: a failing init_post_opt would make slurmd drain
/// the node for a batch step, and the user would never see the reason.
static GRANTED: OnceCell<Result<Granted, String>> = OnceCell::new();

/// init_post_opt: places the step ([`place::place`]); never fails.
pub fn place(sp: &Spank) -> Result<(), Error> {
    if let Some(granted) = place::place(sp) {
        let _ = GRANTED.set(granted);
    }
    Ok(())
}

pub fn task_init(sp: &Spank) -> Result<(), Error> {
    // Runs in the forked task: no locks, no NVML, no logging on success.
    match GRANTED.get() {
        // No decision for a step that asked for CARMA (placement never ran
        // in this slurmstepd): it must not run unplaced beside others.
        None if facts::is_carma_step(sp) => {
            let why = "no CARMA placement decision was made for this step (slurmd's log says why)";
            eprintln!("carma: this step was not started: {why}");
            Err(Error::msg(why))
        }
        None => Ok(()),
        Some(Ok(d)) => {
            isolate::number_gpus(sp, d)?;
            for (var, value) in &d.env {
                sp.setenv(var, value)?;
            }
            sp.setenv("CARMA_DECISION", &d.summary)
        }
        Some(Err(why)) => {
            // The task's stderr is the job's: the user sees why.
            eprintln!("carma: this step was not started: {why}");
            Err(Error::msg(why.clone()))
        }
    }
}

/// The task may open exactly its placement's GPUs ([`isolate::confine`]).
pub fn task_post_fork(sp: &Spank) -> Result<(), Error> {
    let Some(Ok(d)) = GRANTED.get() else { return Ok(()) };
    isolate::confine(sp, d)
}

/// The job's record, once the step's last task here has exited
/// ([`record::at_task_exit`]); never fails.
pub fn task_exit(sp: &Spank) -> Result<(), Error> {
    let Some(Ok(d)) = GRANTED.get() else { return Ok(()) };
    record::at_task_exit(sp, d);
    Ok(())
}

/// Releases the step's hold; failures are logged only (garbage collection
/// reclaims the reservation once this slurmstepd is gone).
pub fn exit(sp: &Spank) -> Result<(), Error> {
    let Some(Ok(d)) = GRANTED.get() else { return Ok(()) };
    let release = || -> Result<(), Error> {
        if let Some(r) = place::release(d)? {
            record::after_release(sp, d, &r)?;
        }
        Ok(())
    };
    if let Err(e) = release() {
        log::error(&format!("exit: {e}"));
    }
    Ok(())
}
