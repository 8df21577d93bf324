//! The epilog's flow at a job's end: a job slurmstepd handed back is
//! requeued away from this node (`hand_back`); a CARMA job that failed has
//! this run's output scanned and, for a GPU OOM, is requeued (bounded by
//! recovery.max_recoveries) with the verdict its next run is placed by.

use crate::hand_back::hand_back;
use crate::helper::{TAIL_BYTES, append_to_job_output};
use crate::job_env::env;
use crate::oom;
use crate::scan::scan_output;
use crate::slurm::{FollowUp, SCONTROL_TIMEOUT, requeue};
use crate::sweep::sweep_stale_jobfiles;
use crate::verdict::{Facts, Verdict, decide, needs_scan};
use carma_config::{Config, JobRequest, OptionName, RecoveryMode};
use carma_placement::admin_comment::JobRef;
use carma_placement::jobfiles;
use std::time::Instant;

/// This run of the job, as acting on its verdict needs it.
struct Run<'a> {
    job: &'a str,
    job_no: u32,
    /// Slurm's restart count of this run (slurmd's environment; `None`
    /// where Slurm did not say).
    restart: Option<u32>,
    /// Where the OOM line was looked for (" in FILE"), or "".
    from: String,
}

/// The epilog for the job in slurmd's environment. An error is logged by
/// the caller; the epilog still exits 0.
pub fn run(cfg: &Config, log: &dyn Fn(&str)) -> Result<(), String> {
    let job = env("SLURM_JOB_ID");
    if job.is_empty() || !job.bytes().all(|b| b.is_ascii_digit()) {
        return Err("SLURM_JOB_ID missing: not run by slurmd as Epilog?".into());
    }
    let job_no: u32 = job.parse().map_err(|_| "SLURM_JOB_ID is not a number")?;
    // The job's CARMA options, as the submit host resolved them; or the
    // mark slurmstepd left when it collocated the job transparently.
    let mut req = JobRequest::default();
    let status: i32 = env("SLURM_JOB_EXIT_CODE").parse().unwrap_or(0);
    let earlier = jobfiles::read_output_ends(&cfg.state_dir, job_no);
    let restart: Option<u32> = env("SLURM_JOB_RESTART_COUNT").parse().ok();
    // slurmstepd found no GPU here for the batch step and failed it
    // (no_fit: hand_back): the job never ran, so there is no OOM to look for.
    if let Some(reason) = jobfiles::read_hand_back(&cfg.state_dir, job_no).filter(|_| status != 0) {
        let ends = scan_output(cfg, &job, &earlier, 0).ends;
        end_run(cfg, job_no, &ends, log);
        hand_back(cfg, &job, job_no, &reason, status, restart, log);
        sweep_stale_jobfiles(cfg, log);
        return Ok(());
    }
    let transparent = jobfiles::read_transparent(&cfg.state_dir, job_no);
    let carma = OptionName::ALL.iter().any(|o| std::env::var_os(format!("SPANK_{}", o.env())).is_some())
        || transparent.is_some();
    let _ = req.fill_from_env(|name| std::env::var(format!("SPANK_{name}")).ok().map(String::into_bytes));
    let mut facts = Facts {
        carma,
        status,
        recoveries: 0,
        mode: req.recovery.unwrap_or(cfg.recovery_mode),
        max_recoveries: cfg.max_recoveries,
        oom_line: None,
    };
    let mut scanned = None;
    let mut ends = None;
    if needs_scan(carma, status) {
        let scan = scan_output(cfg, &job, &earlier, TAIL_BYTES);
        // Where this run's output ended, even if the scan failed on a file.
        ends = Some(scan.ends);
        let (line, file) = scan.result?;
        facts.oom_line = line;
        scanned = file;
    } else if carma && status != 0 {
        // Killed (preempted, requeued, cancelled): a rerun may follow.
        ends = Some(scan_output(cfg, &job, &earlier, 0).ends);
    }
    let from = scanned.map(|f| format!(" in {}", f.display())).unwrap_or_default();
    // Earlier recoveries matter only to a run that ran out of GPU memory
    // (and may ask slurmctld): counted only for one.
    facts.recoveries = recoveries_so_far(cfg, job_no, restart, facts.oom_line.is_some(), log);
    let verdict = decide(&facts);
    // The job's per-run files are done with, unless it is requeued below.
    end_run(cfg, job_no, &ends.unwrap_or_default(), log);
    let this = Run { job: &job, job_no, restart, from };
    act_on(cfg, &this, &facts, verdict, transparent.as_ref(), log);
    sweep_stale_jobfiles(cfg, log);
    Ok(())
}

/// Forgets the run's job files, keeping where its output files ended:
/// the next run's output starts there (--open-mode=append).
fn end_run(cfg: &Config, job: u32, ends: &[jobfiles::OutputEnd], log: &dyn Fn(&str)) {
    jobfiles::remove(&cfg.state_dir, job);
    if !ends.is_empty()
        && let Err(e) = jobfiles::write_output_ends(&cfg.state_dir, job, ends)
    {
        log(&format!("job {job}: cannot record where its output ended in {}: {e}", cfg.state_dir.display()));
    }
}

/// Logs the verdict, tells the user where a recovery is refused, and
/// requeues the job where it is due.
fn act_on(
    cfg: &Config,
    this: &Run,
    facts: &Facts,
    verdict: Verdict,
    transparent: Option<&jobfiles::Transparent>,
    log: &dyn Fn(&str),
) {
    let Run { job, from, .. } = this;
    let (status, recoveries) = (facts.status, facts.recoveries);
    match verdict {
        Verdict::NotCarma | Verdict::Succeeded => {}
        Verdict::Signaled(sig) => log(&format!("job {job} ended by signal {sig}: not requeued")),
        Verdict::NotOom => {
            log(&format!("job {job} failed (status {status}) without a GPU OOM message{from}: not requeued"))
        }
        Verdict::RecoveryOff => {
            log(&format!("job {job} ran out of GPU memory{from}; --carma-recovery=none: not requeued"))
        }
        Verdict::LimitReached { max } => {
            let msg = format!(
                "carma: job {job} ran out of GPU memory again after {recoveries} recovery(ies); not requeued (recovery.max_recoveries={max})"
            );
            log(&format!("{msg}; matched: {}", facts.oom_line.as_deref().unwrap_or("")));
            append_to_job_output(&msg, log);
        }
        Verdict::Requeue => requeue_oom(cfg, this, facts, transparent, log),
    }
}

/// Requeues a job that ran out of GPU memory, with the verdict its next
/// run is placed by: here (state_dir) and in its AdminComment.
fn requeue_oom(
    cfg: &Config,
    this: &Run,
    facts: &Facts,
    transparent: Option<&jobfiles::Transparent>,
    log: &dyn Fn(&str),
) {
    let Run { job, job_no, restart, from } = this;
    let recoveries = facts.recoveries;
    let line = facts.oom_line.as_deref().unwrap_or("");
    let needed = oom::needed_mib(line);
    if let Some((sig, mib)) = transparent.and_then(|t| t.signature.as_deref()).zip(needed) {
        // A job that declares nothing learns from its crash: its
        // next submission asks for at least what this run needed.
        remember_peak(cfg, sig, mib, log);
    }
    let need_mib = if facts.mode == RecoveryMode::Looser { needed } else { None };
    // Before the requeue: the next run may start on this node at once.
    let verdict = jobfiles::Recovery { mode: facts.mode, need_mib, count: recoveries + 1 };
    // For the next run: this run's restart count plus one.
    let next = restart.unwrap_or(0).saturating_add(1);
    if let Err(e) = jobfiles::write_recovery(&cfg.state_dir, *job_no, verdict, next) {
        log(&format!("job {job}: cannot record its recovery mode in {}: {e}", cfg.state_dir.display()));
    }
    // A task of a job array is named ARRAY_TASK: the id of the
    // task whose id is the array's would requeue every task.
    let deadline = Instant::now() + SCONTROL_TIMEOUT;
    // Unresolved, the bare id could name a whole array: no requeue.
    let resolved = JobRef::resolve(cfg.slurm_bin_dir.as_deref(), *job_no, deadline)
        .map_err(|e| format!("slurmctld did not say which job it is ({e})"));
    // A rerun of its own: on a whole GPU in Slurm's books too. Not
    // for a transparently collocated job: job_submit.lua's
    // job_modify would turn the GPU back into a shard.
    let whole = need_mib.is_none() && transparent.is_none();
    // The job prolog of the rerun records its new GPU (it runs for a
    // requeued job's next start).
    let follow_up = if whole { FollowUp::WholePrompt } else { FollowUp::Prompt };
    match resolved.and_then(|r| requeue(cfg.slurm_bin_dir.as_deref(), &r.selector(), follow_up).map(|()| r)) {
        Ok(job_ref) => {
            // Requeued, the job is pending and takes updates again
            // (slurmctld refuses them for a finished job): the
            // verdict into its AdminComment, for a rerun slurmctld
            // starts on another node (whose job prolog reads it).
            record_verdict(cfg, job_ref, restart.map(|_| next), verdict, log);
            log(&format!(
                "job {job} ran out of GPU memory{from} (matched: {line}); requeued, recovery {} of {}, next run {}{}",
                recoveries + 1,
                facts.max_recoveries,
                facts.mode.name(),
                if whole { " (a job on shards asks Slurm for a whole GPU instead)" } else { "" }
            ));
            // carma-monitor exports the node's count of recoveries.
            let counted = carma_placement::Placer::from_config(cfg, |m| eprintln!("carma-epilog: {m}"))
                .and_then(|p| p.count_recovery());
            if let Err(e) = counted {
                log(&format!("job {job}: recovery not counted: {e}"));
            }
        }
        Err(e) => log(&format!("job {job} ran out of GPU memory{from} but was not requeued: {e}")),
    }
}

/// OOM recoveries the job had before this run: the verdict left here, if it
/// is for this run (an older epilog's names none and counts); else, for a
/// run that ran out of GPU memory (two squeue calls), the one in AdminComment for
/// this run, wherever its node was. A verdict here for another run is from
/// a run before the last (slurmd skips the prolog, which would forget it,
/// for a job whose credential it still keeps).
fn recoveries_so_far(cfg: &Config, job: u32, restart: Option<u32>, oom: bool, log: &dyn Fn(&str)) -> u32 {
    let here = jobfiles::read_recovery(&cfg.state_dir, job);
    let for_run = jobfiles::recovery_run(&cfg.state_dir, job);
    // Without Slurm's restart count the verdict here is taken as this
    // run's, as one that names no run is (max_recoveries still holds).
    if let Some(r) = here.filter(|_| for_run.is_none() || restart.is_none() || for_run == restart) {
        return r.count;
    }
    let Some(run) = restart.filter(|r| *r > 0 && oom) else { return 0 };
    let deadline = Instant::now() + SCONTROL_TIMEOUT;
    match carma_placement::admin_comment::read(cfg.slurm_bin_dir.as_deref(), job, deadline) {
        Ok(comment) => jobfiles::recovery_in_comment(&comment, run).map_or(0, |r| r.count),
        Err(e) => {
            log(&format!("job {job}: earlier recoveries not read from AdminComment: {e}"));
            here.map_or(0, |r| r.count)
        }
    }
}

/// The verdict in the job's AdminComment for the run with restart count
/// `next` (`None`: Slurm did not give this run's count, so which run the
/// verdict is for is unknown, and nothing is written).
fn record_verdict(cfg: &Config, job_ref: JobRef, next: Option<u32>, verdict: jobfiles::Recovery, log: &dyn Fn(&str)) {
    let job = job_ref.id;
    let Some(next) = next else {
        log(&format!("job {job}: no SLURM_JOB_RESTART_COUNT: recovery not recorded in AdminComment"));
        return;
    };
    let entry = jobfiles::recovery_entry(verdict, next);
    let written = carma_placement::admin_comment::write_entry_ref(
        cfg.slurm_bin_dir.as_deref(),
        job_ref,
        jobfiles::RECOVERY_KEY,
        &entry,
        true,
        Instant::now() + SCONTROL_TIMEOUT,
    );
    if let Err(e) = written {
        log(&format!(
            "job {job}: recovery not recorded in AdminComment (a rerun on another node is placed as a first run): {e}"
        ));
    }
}

fn remember_peak(cfg: &Config, sig: &str, mib: u64, log: &dyn Fn(&str)) {
    let r = carma_placement::Placer::from_config(cfg, |m| eprintln!("carma-epilog: {m}"))
        .and_then(|p| p.remember_peak(sig, mib));
    match r {
        Ok(()) => log(&format!("job {}: remembered a need of {mib} MiB for its next run", env("SLURM_JOB_ID"))),
        Err(e) => log(&format!("job {}: cannot remember its need of {mib} MiB: {e}", env("SLURM_JOB_ID"))),
    }
}
