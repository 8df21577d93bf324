//! Slurm's commands as the epilog runs them (fixed arguments, no shell,
//! bounded in time), a job's requeue, and the detached follow-up that
//! lifts Slurm's requeue delay once the job is pending.

use carma_placement::command::SQUEUE_LOCAL;
use carma_placement::eventlog;
use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub const SCONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// A Slurm command (in `bin_dir`: carma.yaml's `slurm_bin_dir`) with fixed
/// arguments (no shell), bounded in time; its standard output on success.
pub fn slurm_output(bin_dir: Option<&Path>, name: &str, args: &[&str]) -> Result<String, String> {
    slurm_output_by(bin_dir, name, args, Instant::now() + SCONTROL_TIMEOUT)
}

/// As `slurm_output`, within what is left until `deadline` (an error
/// once it has passed).
pub fn slurm_output_by(bin_dir: Option<&Path>, name: &str, args: &[&str], deadline: Instant) -> Result<String, String> {
    use carma_placement::command::{run_bytes_by, slurm_program};
    let prog = slurm_program(bin_dir, name);
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    let out = run_bytes_by(&prog, &args, deadline, SCONTROL_TIMEOUT)?;
    String::from_utf8(out).map_err(|_| format!("{prog} printed output that is not UTF-8"))
}

pub fn scontrol(bin_dir: Option<&Path>, args: &[&str]) -> Result<(), String> {
    slurm_output(bin_dir, "scontrol", args).map(drop)
}

/// What the follow-up of a requeue does once the job is pending.
#[derive(Clone, Copy, PartialEq)]
pub enum FollowUp {
    /// Lifts Slurm's requeue delay.
    Prompt,
    /// Turns the job's shards into a whole GPU (the rerun is to have a GPU
    /// of its own; only a pending job takes that update), then lifts the delay.
    WholePrompt,
    /// Sets the job's start time this many seconds from now, then
    /// releases it (a job that found no GPU on node after node, requeued
    /// held, waits before it tries again).
    Pause(u64),
}

impl FollowUp {
    fn arg(self) -> String {
        match self {
            FollowUp::Prompt => "keep".into(),
            FollowUp::WholePrompt => "whole".into(),
            FollowUp::Pause(s) => format!("pause={s}"),
        }
    }
}

/// Requeues the job. Slurm refuses jobs submitted with --no-requeue. Slurm
/// delays a requeued job's start (BeginTime); that can only be lifted once
/// the job has left COMPLETING, i.e. after this epilog ends, so a detached
/// follow-up (own process group: slurmd cleans up the epilog's) does it,
/// told where Slurm's commands are.
pub fn requeue(bin_dir: Option<&Path>, job: &str, next: FollowUp) -> Result<(), String> {
    scontrol(bin_dir, &["requeue", job])?;
    prompt_later(bin_dir, job, next).map_err(|e| format!("requeued, but {e}"))
}

/// Starts the detached follow-up of a requeue.
pub fn prompt_later(bin_dir: Option<&Path>, job: &str, next: FollowUp) -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let dir = bin_dir.map(Path::as_os_str).unwrap_or_default();
    Command::new(exe)
        .arg("--prompt-restart")
        .arg(job)
        .arg(dir)
        .arg(next.arg())
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the restart follow-up: {e}"))?;
    Ok(())
}

/// The detached follow-up has no terminal and no carma.yaml: what it
/// could not do goes to syslog.
fn logged(job: &str, what: &str, r: Result<(), String>) {
    if let Err(e) = r {
        eventlog::record(None, &format!("carma-epilog: requeued job {job}: {what}: {e}"));
    }
}

/// `--prompt-restart JOB [SLURM_BIN_DIR [keep|whole|pause=S]]`: waits
/// until the requeued job is PENDING (at most a minute; with a pause, at
/// most the pause or a minute, whichever is longer); with `whole`, turns
/// its shards into a whole GPU (Slurm 24.11 and later apply it; 22.05
/// refuses the update); then sets its start time to 3 s from now (with
/// `pause=S`, S s from this follow-up's start, at least 3 s from now), then
/// releases the held job, also when its start could not be set or it never
/// showed PENDING (held for ever would be worse than a short pause); a job
/// that ended meanwhile is left alone.
pub fn prompt_restart(args: &[OsString]) -> i32 {
    // A job id, or an array task's `ARRAY_TASK`.
    let id = |j: &str| {
        !j.is_empty()
            && j.split('_').count() <= 2
            && j.split('_').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    };
    let Some(job) = args.first().and_then(|j| j.to_str()).filter(|j| id(j)) else {
        return 2;
    };
    let bin_dir = args.get(1).map(Path::new).filter(|d| !d.as_os_str().is_empty());
    // What follows the requeue, read once: `whole`, a pause's seconds, or keep.
    let next = args.get(2).and_then(|w| w.to_str()).unwrap_or("keep");
    let pause = next.strip_prefix("pause=").map(|s| Duration::from_secs(s.parse::<u64>().unwrap_or(0)));
    let start = Instant::now();
    // Whether the job showed PENDING, and whether its start could be set.
    let (mut seen, mut failed) = (false, true);
    while start.elapsed() < pause.unwrap_or_default().max(Duration::from_secs(60)) {
        // The state field alone (squeue %T), never `scontrol show job`'s
        // text, where the job's name or command may say anything.
        let state = slurm_output(bin_dir, "squeue", &[SQUEUE_LOCAL, "-h", "-t", "all", "-o", "%T", "-j", job]);
        // Cancelled meanwhile: nothing is left to start or release. (Not
        // FAILED: Slurm may show a requeued job so for a moment
        // (tests/recovery.rs), and one left held for it would never run.)
        if state.as_deref().is_ok_and(|s| s.trim() == "CANCELLED") {
            return 0;
        }
        if state.is_ok_and(|s| s.trim() == "PENDING") {
            if next == "whole" {
                ask_for_a_whole_gpu(bin_dir, job);
            }
            // Not "now": slurmd revokes the previous run's credential with
            // one-second granularity and kills a run that starts within that
            // second ("Job credential revoked").
            let after = pause.map_or(0, |p| p.saturating_sub(start.elapsed()).as_secs()).max(3);
            let update = scontrol(bin_dir, &["update", &format!("JobId={job}"), &format!("StartTime=now+{after}")]);
            (seen, failed) = (true, update.is_err());
            logged(job, "its requeue delay was not lifted", update);
            break;
        }
        // Five times a second for the first minute, then every 2 s.
        let slow = start.elapsed() >= Duration::from_secs(60);
        std::thread::sleep(Duration::from_millis(if slow { 2000 } else { 200 }));
    }
    if !seen {
        logged(job, "it was not pending in time, so its start was not set", Err("gave up".into()));
    }
    if pause.is_some() {
        // A held job runs only once released: a refused release is tried
        // again before it is left to an administrator (syslog).
        let mut release = scontrol(bin_dir, &["release", job]);
        for _ in 0..3 {
            if release.is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_secs(2));
            release = scontrol(bin_dir, &["release", job]);
        }
        failed |= release.is_err();
        logged(job, "it was not released after its pause was set (`scontrol release` runs it)", release);
    }
    i32::from(failed)
}

/// Turns the pending job's shards into one whole GPU of the same type.
fn ask_for_a_whole_gpu(bin_dir: Option<&Path>, job: &str) {
    // slurmctld's field (squeue %b), never text the user wrote.
    let tres = slurm_output(bin_dir, "squeue", &[SQUEUE_LOCAL, "-h", "-t", "all", "-o", "%b", "-j", job]);
    if let Some(whole) = tres.ok().as_deref().and_then(crate::verdict::whole_gpu_for_shards) {
        let update = scontrol(bin_dir, &["update", &format!("JobId={job}"), &format!("TresPerNode={whole}")]);
        logged(job, "its shards were not turned into a whole GPU", update);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Calls under one deadline share it: a slow command is cut at what
    /// is left, and once it has passed nothing more is started.
    #[test]
    fn slurm_calls_under_one_deadline_end_by_it() {
        let bin = Some(Path::new("/bin"));
        let start = Instant::now();
        let deadline = start + Duration::from_millis(400);
        assert!(slurm_output_by(bin, "sleep", &["5"], deadline).is_err());
        assert!(start.elapsed() < Duration::from_secs(2), "the call outlived its deadline: {:?}", start.elapsed());
        let e = slurm_output_by(bin, "sleep", &["5"], deadline).unwrap_err();
        assert!(e.contains("no time left for `/bin/sleep 5`"), "{e}");
        assert!(start.elapsed() < Duration::from_secs(2));
        assert_eq!(slurm_output_by(bin, "echo", &["ok"], Instant::now() + SCONTROL_TIMEOUT).unwrap(), "ok\n");
    }
}
