//! The step's placement: facts → a plan (`carma_placement::resolve`) →
//! the placer's decision (waiting for a GPU) → what the task is granted;
//! and the hold's release when the step ends.

use super::facts::{self, Step};
use super::{Granted, mps, wait};
use crate::error::{Context as _, Error};
use crate::log;
use crate::options;
use crate::spank::Spank;
use carma_config::Config;
use carma_placement::resolve::{self, Plan, Resolution};
use carma_placement::{Decision, PlaceError, Placer, Reservation, StepRef, jobfiles};
use std::time::Instant;

/// Never fails: a CARMA step's failure is kept (`Some(Err)`) for task_init
/// to report, anything else is logged (the step runs as without CARMA). A
/// panic is a failure like any other: it must neither fail this hook (a
/// batch step's failure here drains the node) nor leave a CARMA step
/// without a decision. `None`: no decision to keep.
pub(super) fn place(sp: &Spank) -> Option<Result<Granted, String>> {
    let mut carma = false;
    let started = Instant::now();
    let placed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| try_place(sp, &mut carma, started)))
        .unwrap_or_else(|p| Err(Error::msg(crate::guard::internal_error(p.as_ref()))));
    let e = match placed {
        Ok(granted) => return granted.map(Ok),
        Err(e) => e,
    };
    let msg = format!("{}: {e}", facts::step_label(sp));
    log::error(&format!("init_post_opt: {msg}"));
    if !carma {
        return None;
    }
    // The admin finds every CARMA step in carma.log, placed or not
    // (wherever the failure came before carma.yaml was read).
    if let Ok(cfg) = options::config() {
        log::set_log_file(cfg.log_file.clone());
    }
    // How long the step was held here: tests/hook-times.sh prints the
    // longest over a run.
    log::record_failure(&format!("not placed: {msg} in_hook={}ms", started.elapsed().as_millis()));
    Some(Err(msg))
}

/// Slurm's facts → a plan → the placer's decision → what the task will be
/// given (`None` where the step gets nothing).
fn try_place(sp: &Spank, carma: &mut bool, started: Instant) -> Result<Option<Granted>, Error> {
    let Some(step) = facts::read_step(sp, carma)? else { return Ok(None) };
    let (cfg, job) = (step.cfg, step.facts.job);
    // The state directory first: where it is unsafe or full, the job
    // prolog could not record the job's Slurm GPUs either, and that, not
    // a missing GPU, is the reason to give.
    let mut placer = Placer::from_config(cfg, log::event).context("placement")?;
    if *carma && step.facts.batch_step {
        // A hand-back mark is this run's only: one an earlier run left (its
        // epilog lost) must not make this run's other failure a hand-back.
        // (After from_config: the state directory is checked safe.)
        jobfiles::forget_hand_back(&cfg.state_dir, job);
    }
    let Some(plan) = plan(&step, &placer)? else { return Ok(None) };
    for note in &plan.notes {
        log::info(note);
    }
    let step_name = crate::spank::step_name(step.step_id);
    let holder = StepRef { job, holder: std::process::id() };
    let decision = placer
        .place(holder, &plan.request, plan.wait, cfg.timeouts.poll, &mut wait::job_alive_asker(cfg, job))
        .map_err(|e| Error::msg(refused(cfg, &plan, job, &e)))?;
    let granted = grant(cfg, &mut placer, &plan, decision, holder, step_name)?;
    let Granted { step_name, summary, .. } = &granted;
    log::event(&format!("job {job} step {step_name}: {summary} in_hook={}ms", started.elapsed().as_millis()));
    Ok(Some(granted))
}

/// The step's plan, or `None` where nothing is to be placed.
fn plan(step: &Step, placer: &Placer) -> Result<Option<Box<Plan>>, Error> {
    let cfg = step.cfg;
    let resolution = resolve::resolve(&step.facts, &step.node, cfg).map_err(|e| {
        match (e.as_str() == resolve::UNACCOUNTED).then(|| unwritable(&cfg.state_dir)).flatten() {
            Some(why) => Error::msg(format!("the job prolog could not record the job's Slurm GPUs: {why}")),
            None => Error::msg(e),
        }
    })?;
    match resolution {
        Resolution::Nothing => Ok(None),
        Resolution::DropWhole => {
            // A shard step without CARMA: only forget the prolog's record.
            placer.drop_whole(step.facts.job).context("placement")?;
            Ok(None)
        }
        Resolution::Place(plan) => Ok(Some(plan)),
    }
}

/// What the task will be given for `decision`: its GPUs' device numbers,
/// an MPS client's environment; the transparent mark written. On failure
/// the placement is released.
fn grant(
    cfg: &Config,
    placer: &mut Placer,
    plan: &Plan,
    decision: Decision,
    step: StepRef,
    step_name: String,
) -> Result<Granted, Error> {
    let job = step.job;
    if let Some(mark) = plan.transparent.as_ref().filter(|_| !decision.reused) {
        // carma-epilog recovers only CARMA jobs: this mark says it is one,
        // and under which signature to remember what an OOM needed. The
        // step that decided writes it (a batch job's batch step): later
        // steps, with their own command lines, must not re-key it.
        if let Err(e) = jobfiles::write_transparent(&cfg.state_dir, job, mark) {
            log::error(&format!("job {job}: cannot mark it transparent in {}: {e}", cfg.state_dir.display()));
        }
    }
    let (env, sharing) = match (plan.request.mps_uid, decision.gpus.as_slice()) {
        (Some(_), [gpu]) if !decision.exclusive => mps::client(cfg, *gpu, decision.reserve_mib, job),
        _ => (Vec::new(), String::new()),
    };
    let minors = match device_minors(placer, &decision.gpus) {
        Ok(m) => m,
        Err(e) => {
            // Placed but not grantable: give the promise back now, since
            // no decision is kept for exit() to release.
            if let Err(r) = placer.release(step) {
                log::error(&format!("job {job} step {step_name}: releasing after a failed grant: {r}"));
            }
            return Err(Error::msg(e));
        }
    };
    let summary = plan.summary(&decision, &sharing);
    Ok(Granted { gpus: decision.gpus, minors, summary, env, step, step_name })
}

/// Why the step was not placed; for a batch step with `no_fit: hand_back`
/// that found no GPU, the mark that has carma-epilog requeue the job away
/// from this node (Slurm's choice of node, not a wait here, tries again).
fn refused(cfg: &Config, plan: &Plan, job: u32, e: &PlaceError) -> String {
    let why = plan.failure(e);
    if !(plan.hand_back && e.is_no_fit()) {
        return why;
    }
    match jobfiles::write_hand_back(&cfg.state_dir, job, &why) {
        Ok(()) => {
            let then = match cfg.hand_back_pause.as_secs() {
                0 => "it fails".to_string(),
                s => format!("it waits {s}s or more in Slurm's queue (hand_back_pause), then may run on any node"),
            };
            format!(
                "{why}; handed back to Slurm (no_fit: hand_back): carma-epilog requeues the job to another node, at most {} time(s); past them, or with no other node, {then}",
                cfg.max_hand_backs
            )
        }
        Err(w) => {
            log::error(&format!("job {job}: cannot hand it back ({}: {w})", cfg.state_dir.display()));
            why
        }
    }
}

/// Why root cannot write a byte in `dir` now (a full disk), if it cannot.
fn unwritable(dir: &std::path::Path) -> Option<String> {
    let probe = dir.join(format!(".write-probe.{}", std::process::id()));
    let r = carma_placement::fsutil::write_private(&probe, b"x");
    let _ = std::fs::remove_file(&probe);
    r.err().map(|e| format!("{}: {e}", dir.display()))
}

/// The device minor number of each GPU of `gpus` (node indices), as the
/// GPU source reads it (carma-monitor's publication: no driver call here);
/// the index where the source does not know it.
fn device_minors(placer: &mut Placer, gpus: &[u32]) -> Result<Vec<u32>, String> {
    let readings = placer.status().map_err(|e| format!("the placed GPUs' device numbers: {e}"))?.readings;
    gpus.iter()
        .map(|&i| {
            let g = readings.iter().find(|g| g.index == i);
            g.map(|g| g.device_minor()).ok_or_else(|| format!("GPU {i} is gone from the GPU readings"))
        })
        .collect()
}

/// Releases `d`'s hold on its GPUs; the job's reservation where the job's
/// GPUs were freed by it (no other step holds them).
pub(super) fn release(d: &Granted) -> Result<Option<Reservation>, Error> {
    let placer = Placer::from_config(options::config()?, log::event).context("release")?;
    let released = placer.release(d.step).context("release")?;
    if let Some(r) = &released {
        log::event(&format!(
            "job {} step {} released gpu_indices={}",
            r.job,
            d.step_name,
            carma_placement::index_list(&r.gpus)
        ));
    }
    Ok(released)
}
