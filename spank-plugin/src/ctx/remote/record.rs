//! The job's record (its AdminComment, `crate::record`), written by the
//! step that holds the job's GPUs on this node last.

use super::Granted;
use crate::error::{Context as _, Error};
use crate::log;
use crate::options;
use crate::spank::{Item, Spank};
use carma_config::Config;
use carma_placement::{Placer, Reservation};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// Tasks of this step that have exited on this node.
static TASKS_EXITED: AtomicU32 = AtomicU32::new(0);
/// The job's record was written by this slurmstepd.
static RECORDED: AtomicBool = AtomicBool::new(false);

/// Once the step's last task on this node has exited, and before
/// slurmstepd reports the exits to srun: writes the job's record if this
/// step is the job's last hold on the node. `exit` comes too late for a
/// job srun started, since srun ends the job as soon as its tasks are
/// reported and slurmctld then refuses the update ("Job has already
/// finished"). Never fails; costs the step's end a few scontrol calls,
/// bounded in time.
pub(super) fn at_task_exit(sp: &Spank, d: &Granted) {
    let exited = TASKS_EXITED.fetch_add(1, Ordering::SeqCst) + 1;
    if exited < sp.item_u32(Item::LocalTaskCount).unwrap_or(1) {
        return;
    }
    let record = || -> Result<(), Error> {
        let cfg = options::config()?;
        let st = Placer::from_config(cfg, log::event).context("record")?.state().context("record")?;
        // Another step still holding the job's GPUs here writes it instead.
        if let Some(r) = st.job(d.step.job).filter(|r| r.holders == [d.step.holder]) {
            RECORDED.store(record_job(sp, cfg, d, r), Ordering::SeqCst);
        }
        Ok(())
    };
    if let Err(e) = record() {
        log::error(&format!("task_exit: {e}"));
    }
}

/// At the step's exit, once its release freed the job's GPUs here (`r`):
/// the record, unless it was written at the last task's exit (this step
/// was the last hold then); a batch job is still running here now.
pub(super) fn after_release(sp: &Spank, d: &Granted, r: &Reservation) -> Result<(), Error> {
    if !RECORDED.load(Ordering::SeqCst) {
        record_job(sp, options::config()?, d, r);
    }
    Ok(())
}

/// Writes the job's record in its AdminComment (crate::record): the
/// decision without its moment's readings, and the peak its processes were
/// seen at. False if it could not (logged).
fn record_job(sp: &Spank, cfg: &Config, d: &Granted, r: &Reservation) -> bool {
    let one_node = sp.getenv("SLURM_JOB_NUM_NODES").ok().flatten().is_some_and(|n| n.trim() == "1");
    let node = cfg.monitor.node_name();
    let kept: Vec<&str> = d
        .summary
        .split_whitespace()
        .filter(|t| !["effective_free=", "sm=", "busy="].iter().any(|p| t.starts_with(p)))
        .collect();
    let peak = if r.observed_mib > 0 { format!("{}M", r.observed_mib) } else { "unseen".into() };
    let entry = format!("carma@{node}: {} peak={peak}", kept.join(" "));
    match crate::record::write(cfg.slurm_bin_dir.as_deref(), r.job, &node, &entry, one_node) {
        Ok(()) => true,
        Err(e) => {
            log::error(&format!("job {}: record not written to AdminComment: {e}", r.job));
            false
        }
    }
}
