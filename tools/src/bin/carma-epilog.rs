//! carma-epilog: Slurm's node Epilog (slurm.conf `Epilog=`), run as root
//! once per job at its end. For a CARMA job that exited with a non-zero
//! status it reads the tail of the job's stderr/stdout as the job's user,
//! looks for a GPU out-of-memory crash and requeues the job (bounded by
//! recovery.max_recoveries) so that its next run gets GPU(s) of its own.
//!
//! It always exits 0: a failing epilog drains the node. Everything it
//! decides goes to syslog, carma.yaml's log_file and stderr.
#![forbid(unsafe_code)]

use carma_config::{Config, JobRequest, OptionName, RecoveryMode};
use carma_placement::admin_comment::JobRef;
use carma_placement::command::SQUEUE_LOCAL;
use carma_placement::{eventlog, jobfiles};
use carma_tools::recovery::asuser::{User, run_self_as};
use carma_tools::recovery::paths::{JobFields, Resolved, resolve};
use carma_tools::recovery::{Facts, Verdict, decide, needs_scan, oom};
use std::ffi::OsString;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Tail of the job output that is scanned.
const TAIL_BYTES: u64 = 64 * 1024;
const HELPER_TIMEOUT: Duration = Duration::from_secs(5);
const SCONTROL_TIMEOUT: Duration = Duration::from_secs(10);
/// A hand-back's Slurm calls before its requeue, and again those after it
/// (the requeue, a timed-out requeue's check and the release have
/// SCONTROL_TIMEOUT each; with the output scans and write and the stale-file sweep,
/// about 95 s at worst).
const HAND_BACK_TIMEOUT: Duration = Duration::from_secs(20);

fn main() {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    // Helper modes, run as the job's user by the epilog itself.
    match args.first().and_then(|a| a.to_str()) {
        Some("--as-user-read-tail") => std::process::exit(helper_read_tail(&args[1..])),
        Some("--as-user-append") => std::process::exit(helper_append(&args[1..])),
        Some("--prompt-restart") => std::process::exit(prompt_restart(&args[1..])),
        _ => {}
    }
    let config_path = args
        .iter()
        .filter_map(|a| a.to_str())
        .find_map(|a| a.strip_prefix("--config="))
        .unwrap_or(carma_config::DEFAULT_CONFIG_PATH)
        .to_string();
    let log = |cfg: Option<&Config>, msg: &str| {
        eprintln!("carma-epilog: {msg}");
        eventlog::record(cfg.and_then(|c| c.log_file.as_deref()), msg);
    };
    match Config::load(Path::new(&config_path)) {
        Ok(cfg) => {
            if let Err(e) = epilog(&cfg, &|m| log(Some(&cfg), m)) {
                log(Some(&cfg), &format!("job {}: {e}", env("SLURM_JOB_ID")));
            }
        }
        Err(e) => log(None, &format!("{e}; OOM recovery is off until it is fixed")),
    }
    std::process::exit(0);
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_default()
}

fn epilog(cfg: &Config, log: &dyn Fn(&str)) -> Result<(), String> {
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
    // Slurm's restart count of this run (slurmd's environment; `None` where
    // Slurm did not say).
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
    let recoveries = recoveries_so_far(cfg, job_no, restart, facts.oom_line.is_some(), log);
    facts.recoveries = recoveries;
    let verdict = decide(&facts);
    // The job's per-run files are done with, unless it is requeued below.
    end_run(cfg, job_no, &ends.unwrap_or_default(), log);
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
        Verdict::Requeue => {
            let line = facts.oom_line.as_deref().unwrap_or("");
            let needed = oom::needed_mib(line);
            if let Some((sig, mib)) = transparent.as_ref().and_then(|t| t.signature.as_deref()).zip(needed) {
                // A job that declares nothing learns from its crash: its
                // next submission asks for at least what this run needed.
                remember_peak(cfg, sig, mib, log);
            }
            let need_mib = if facts.mode == RecoveryMode::Looser { needed } else { None };
            // Before the requeue: the next run may start on this node at once.
            let verdict = jobfiles::Recovery { mode: facts.mode, need_mib, count: recoveries + 1 };
            // For the next run: this run's restart count plus one.
            let next = restart.unwrap_or(0).saturating_add(1);
            if let Err(e) = jobfiles::write_recovery(&cfg.state_dir, job_no, verdict, next) {
                log(&format!("job {job}: cannot record its recovery mode in {}: {e}", cfg.state_dir.display()));
            }
            // A task of a job array is named ARRAY_TASK: the id of the
            // task whose id is the array's would requeue every task.
            let deadline = Instant::now() + SCONTROL_TIMEOUT;
            // Unresolved, the bare id could name a whole array: no requeue.
            let resolved = JobRef::resolve(cfg.slurm_bin_dir.as_deref(), job_no, deadline)
                .map_err(|e| format!("slurmctld did not say which job it is ({e})"));
            // A rerun of its own: on a whole GPU in Slurm's books too. Not
            // for a transparently collocated job: job_submit.lua's
            // job_modify would turn the GPU back into a shard.
            let whole = need_mib.is_none() && transparent.is_none();
            // The job prolog of the rerun records its new GPU (measured on
            // 24.11 and 26.05: it runs for a requeued job's next start).
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
                        match follow_up {
                            FollowUp::Prompt => "",
                            FollowUp::WholePrompt => " (a job on shards asks Slurm for a whole GPU instead)",
                        }
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
    }
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

/// Requeues a job slurmstepd handed back (no GPU fitted here) to run on
/// another node: this node joins its excluded nodes. Counted in its
/// AdminComment, wherever it runs next; past `max_hand_backs` it fails,
/// with the reason in its output. It is requeued held and released only
/// once its exclusion and count are in slurmctld, so neither a short
/// requeue delay nor a failed update lets it start here again or past
/// the bound; without Slurm's answers it is not requeued at all.
fn hand_back(
    cfg: &Config,
    job: &str,
    job_no: u32,
    reason: &str,
    status: i32,
    restart: Option<u32>,
    log: &dyn Fn(&str),
) {
    use carma_placement::admin_comment;
    use carma_tools::recovery::hand_back::{JobPlace, SINFO_FORMAT, SQUEUE_FORMAT, names, usable_gpu_nodes};
    let bin = cfg.slurm_bin_dir.as_deref();
    let node = env("SLURMD_NODENAME");
    let tell = |msg: &str| {
        log(msg);
        append_to_job_output(msg, log);
    };
    // A job cancelled while its step waited ends with status 0, which the
    // caller never hands back; one killed by a signal is not requeued either.
    if status & 0x7f != 0 {
        return log(&format!("job {job} ended by signal {}: not handed back", status & 0x7f));
    }
    if node.is_empty() {
        return tell(&format!("carma: job {job} was not handed back: slurmd named no node"));
    }
    let no = |why: &str| tell(&format!("carma: job {job} found no GPU on {node}; not handed back: {why}: {reason}"));
    // Bounds for all of Slurm's answers together (about a dozen calls):
    // the epilog ends well inside PrologEpilogTimeout. One for what is
    // asked, one for what is recorded after the requeue; the requeue and
    // the release have their own, so no read's slowness keeps a job from
    // being requeued or, once recorded, released. A recording cut short
    // leaves the job held, and says so, for an administrator.
    let deadline = Instant::now() + HAND_BACK_TIMEOUT;
    let slurm = |name: &str, args: &[&str], by: Instant| slurm_output_by(bin, name, args, by);
    let Ok(job_ref) = JobRef::resolve(bin, job_no, deadline) else {
        return no("slurmctld did not say which job it is");
    };
    let sel = job_ref.selector();
    // What slurmctld says: its AdminComment, where it may run, the nodes of
    // its partitions and its exclusions with this node, expanded.
    struct Asked {
        comment: Vec<u8>,
        place: JobPlace,
        partition_nodes: Vec<String>,
        excluded: Vec<String>,
    }
    let read = || -> Result<Asked, String> {
        let comment = admin_comment::read_ref(bin, job_ref, deadline)?;
        let place = JobPlace::parse(&slurm(
            "squeue",
            &[SQUEUE_LOCAL, "-h", "-t", "all", "-j", &sel, "-o", SQUEUE_FORMAT],
            deadline,
        )?)?;
        let partition_nodes =
            usable_gpu_nodes(&slurm("sinfo", &["-h", "-N", "-p", &place.partitions, "-o", SINFO_FORMAT], deadline)?);
        let excluded = names(&slurm("scontrol", &["show", "hostnames", &place.excluding(&node)], deadline)?);
        Ok(Asked { comment, place, partition_nodes, excluded })
    };
    let Asked { comment, place, partition_nodes, excluded } = match read() {
        Ok(r) => r,
        Err(e) => return no(&format!("slurmctld did not answer ({e})")),
    };
    let (count, max) = (jobfiles::hand_backs_in_comment(&comment), cfg.max_hand_backs);
    if count >= max {
        return tell(&format!(
            "carma: job {job} found no GPU on {node} after {count} hand-back(s); not handed back again (max_hand_backs={max}): {reason}"
        ));
    }
    if let Some(why) = place.refusal(&node, &partition_nodes, &excluded) {
        return no(&why);
    }
    // The requeue has its own bound: one cut short may still be applied.
    if let Err(e) = self::scontrol(bin, &["requeuehold", &sel]) {
        if !e.contains("timed out") {
            return no(&format!("Slurm did not requeue it ({e})"));
        }
        // Then the job's restart count is this run's plus one (its state
        // reads COMPLETING until this epilog ends, requeued or not).
        let count = slurm_output(bin, "squeue", &[SQUEUE_LOCAL, "-h", "-t", "all", "-j", &sel, "-O", "restartcnt"]);
        let requeued = restart.is_some_and(|r| count.is_ok_and(|c| c.trim().parse() == Ok(r + 1)));
        if !requeued {
            return tell(&format!(
                "carma: job {job} found no GPU on {node}; Slurm did not confirm its requeue ({e}): if it was requeued it is held (`scontrol release {sel}` runs it again): {reason}"
            ));
        }
    }
    let deadline = Instant::now() + HAND_BACK_TIMEOUT;
    let scontrol = |args: &[&str]| slurm("scontrol", args, deadline).map(drop);
    // Verified: another writer's read-modify-write must not drop the count.
    let entry = |key: &str, text: &str| admin_comment::write_entry_ref(bin, job_ref, key, text, true, deadline);
    // An administrator's hold (requeuehold's is the user's, which the
    // user could release before the exclusion is in).
    let mut recorded = scontrol(&["hold", &sel])
        .and_then(|()| {
            scontrol(&["update", &format!("JobId={sel}"), &format!("ExcNodeList={}", place.excluding(&node))])
        })
        .and_then(|()| entry(jobfiles::HAND_BACK_KEY, &jobfiles::hand_back_entry(count + 1, &node, reason)));
    // An OOM recovery's verdict names the run it is for; the requeue
    // starts the next one, which it is for now.
    if restart.is_none() {
        log(&format!(
            "job {job}: no SLURM_JOB_RESTART_COUNT: an OOM recovery's verdict is not carried to its next run"
        ));
    }
    if let Some((run, verdict)) = restart.and_then(|r| jobfiles::recovery_in_comment(&comment, r).map(|v| (r, v))) {
        recorded = recorded.and_then(|()| entry(jobfiles::RECOVERY_KEY, &jobfiles::recovery_entry(verdict, run + 1)));
    }
    if let Err(e) = recorded.and_then(|()| self::scontrol(bin, &["release", &sel])) {
        return tell(&format!(
            "carma: job {job} was requeued held, but its hand-back could not be recorded in Slurm ({e}); an administrator's `scontrol release {sel}` runs it again, without excluding {node}"
        ));
    }
    if let Err(e) = prompt_later(bin, &sel, FollowUp::Prompt) {
        log(&format!("job {job}: {e}; it starts after Slurm's requeue delay"));
    }
    tell(&format!(
        "carma: job {job} found no GPU on {node}; handed back to Slurm, requeued to run on another node (hand-back {} of {max}): {reason}",
        count + 1
    ));
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
    // run's, as before verdicts named their run (max_recoveries still holds).
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

fn job_user() -> Result<User, String> {
    let uid = env("SLURM_JOB_UID").parse().map_err(|_| "SLURM_JOB_UID missing")?;
    let gid = env("SLURM_JOB_GID").parse().map_err(|_| "SLURM_JOB_GID missing")?;
    Ok(User { uid, gid })
}

/// What scanning the job's output found, and where each file ends now.
struct Scan {
    result: Result<(Option<String>, Option<PathBuf>), String>,
    ends: Vec<jobfiles::OutputEnd>,
}

/// Finds the OOM line in this run's part of the job's stderr, then stdout,
/// read as the user: what follows where the last run here ended (`earlier`),
/// at most the last `tail` bytes (0: only where the files end now).
fn scan_output(cfg: &Config, job: &str, earlier: &[jobfiles::OutputEnd], tail: u64) -> Scan {
    let mut ends = Vec::new();
    let result = scan_each(cfg, job, earlier, tail, &mut ends);
    Scan { result, ends }
}

fn scan_each(
    cfg: &Config,
    job: &str,
    earlier: &[jobfiles::OutputEnd],
    tail: u64,
    ends: &mut Vec<jobfiles::OutputEnd>,
) -> Result<(Option<String>, Option<PathBuf>), String> {
    let user = job_user()?;
    let mut notes = Vec::new();
    let mut patterns: Vec<String> =
        [env("SLURM_JOB_STDERR"), env("SLURM_JOB_STDOUT")].into_iter().filter(|p| !p.is_empty()).collect();
    patterns.dedup();
    if patterns.is_empty() {
        return Err(format!(
            "job {job} failed but has no output file to scan (interactive job?); OOM recovery needs sbatch"
        ));
    }
    let mut found = None;
    for pattern in patterns {
        let args = helper_args(&["--as-user-read-tail", &pattern, &tail.to_string(), &earlier_arg(earlier)]);
        let out = run_self_as(user, &args, (tail + 4096) as usize, HELPER_TIMEOUT)?;
        let text = String::from_utf8_lossy(&out);
        let (head, body) = text.split_once('\n').unwrap_or((&text, ""));
        let Some(end) = head.strip_prefix("FILE ").and_then(parse_end) else {
            return Err(format!("job {job}: cannot scan its output: {head}"));
        };
        let path = PathBuf::from(&end.path);
        if !ends.iter().any(|e: &jobfiles::OutputEnd| e.path == end.path) {
            ends.push(end);
        }
        if found.is_none() {
            match oom::find_oom(body, &cfg.oom_patterns) {
                Some(line) => found = Some((line.chars().take(300).collect(), path)),
                None => notes.push(path),
            }
        }
    }
    Ok(match found {
        Some((line, path)) => (Some(line), Some(path)),
        None => (None, notes.pop()),
    })
}

/// The earlier ends as one helper argument: `SIZE DEV INO PATH` lines.
fn earlier_arg(earlier: &[jobfiles::OutputEnd]) -> String {
    earlier.iter().map(|e| format!("{} {} {} {}\n", e.size, e.dev, e.ino, e.path)).collect()
}

/// `SIZE DEV INO PATH`.
fn parse_end(text: &str) -> Option<jobfiles::OutputEnd> {
    let mut w = text.splitn(4, ' ');
    let (size, dev, ino) = (w.next()?.parse().ok()?, w.next()?.parse().ok()?, w.next()?.parse().ok()?);
    Some(jobfiles::OutputEnd { dev, ino, size, path: w.next()?.to_string() })
}

/// A helper's command line: `lead` arguments, then the job's fields.
fn helper_args(lead: &[&str]) -> Vec<OsString> {
    lead.iter()
        .map(OsString::from)
        .chain(JobFields::from_slurm_env().to_args().into_iter().map(OsString::from))
        .collect()
}

/// Splits a helper's arguments into its `n` leading ones and the job fields.
fn helper_parse(args: &[OsString], n: usize) -> Option<(Vec<String>, JobFields)> {
    let a: Vec<String> = args.iter().map(|s| s.to_string_lossy().into_owned()).collect();
    let (lead, rest) = a.split_at_checked(n)?;
    Some((lead.to_vec(), JobFields::from_args(rest)?))
}

/// `--as-user-read-tail PATTERN TAIL EARLIER <job fields>`: resolves the
/// pattern and prints "FILE SIZE DEV INO PATH" and at most TAIL bytes of
/// the file's end, from where EARLIER (the last run's ends) says this
/// file ended if it is the same file and has not shrunk since; or one line
/// saying why not.
fn helper_read_tail(args: &[OsString]) -> i32 {
    let Some((lead, fields)) = helper_parse(args, 3) else {
        println!("ERROR helper arguments");
        return 2;
    };
    let path = match resolve(&lead[0], &fields) {
        Resolved::File(p) => p,
        Resolved::NotFound(p) => {
            println!("NOTFOUND {p} does not exist or is not readable by the job's user");
            return 0;
        }
        Resolved::Ambiguous(m) => {
            println!("AMBIGUOUS {m}; not guessing");
            return 0;
        }
    };
    let tail: u64 = lead[1].parse().unwrap_or(0).min(TAIL_BYTES);
    let earlier: Vec<jobfiles::OutputEnd> = lead[2].lines().filter_map(parse_end).collect();
    let read = || -> std::io::Result<(jobfiles::OutputEnd, Vec<u8>)> {
        use std::os::unix::fs::MetadataExt;
        // O_NONBLOCK: a FIFO must not block us; only regular files are read.
        let mut f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&path)?;
        let meta = f.metadata()?;
        if !meta.is_file() {
            return Err(std::io::Error::other("not a regular file"));
        }
        let size = meta.len();
        let run_start =
            earlier.iter().find(|e| e.dev == meta.dev() && e.ino == meta.ino() && e.size <= size).map_or(0, |e| e.size);
        f.seek(SeekFrom::Start(size.saturating_sub(tail).max(run_start)))?;
        let mut buf = Vec::new();
        f.take(tail).read_to_end(&mut buf)?;
        let end = jobfiles::OutputEnd { dev: meta.dev(), ino: meta.ino(), size, path: path.display().to_string() };
        Ok((end, buf))
    };
    match read() {
        Ok((end, buf)) => {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "FILE {} {} {} {}", end.size, end.dev, end.ino, end.path);
            let _ = out.write_all(&buf);
        }
        Err(e) => println!("UNREADABLE {}: {e}", path.display()),
    }
    0
}

/// Tells the user in the job's own output, written with the user's rights.
fn append_to_job_output(msg: &str, log: &dyn Fn(&str)) {
    let Ok(user) = job_user() else { return };
    let pattern = [env("SLURM_JOB_STDERR"), env("SLURM_JOB_STDOUT")].into_iter().find(|p| !p.is_empty());
    let Some(pattern) = pattern else { return };
    let args = helper_args(&["--as-user-append", &pattern, msg]);
    if let Err(e) = run_self_as(user, &args, 1024, HELPER_TIMEOUT) {
        log(&format!("could not write to the job's output: {e}"));
    }
}

/// `--as-user-append PATTERN MESSAGE <job fields>`
fn helper_append(args: &[OsString]) -> i32 {
    let Some((lead, fields)) = helper_parse(args, 2) else { return 2 };
    let Resolved::File(path) = resolve(&lead[0], &fields) else { return 1 };
    let f = std::fs::OpenOptions::new().append(true).custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW).open(path);
    match f {
        Ok(mut f) if f.metadata().is_ok_and(|m| m.is_file()) => {
            let _ = writeln!(f, "{}", lead[1]);
            0
        }
        _ => 1,
    }
}

/// A Slurm command (in `bin_dir`: carma.yaml's `slurm_bin_dir`) with fixed
/// arguments (no shell), bounded in time; its standard output on success.
fn slurm_output(bin_dir: Option<&Path>, name: &str, args: &[&str]) -> Result<String, String> {
    slurm_output_by(bin_dir, name, args, Instant::now() + SCONTROL_TIMEOUT)
}

/// As `slurm_output`, within what is left until `deadline` (an error
/// once it has passed).
fn slurm_output_by(bin_dir: Option<&Path>, name: &str, args: &[&str], deadline: Instant) -> Result<String, String> {
    use carma_placement::command::{run_bytes_by, slurm_program};
    let prog = slurm_program(bin_dir, name);
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    let out = run_bytes_by(&prog, &args, deadline, SCONTROL_TIMEOUT)?;
    String::from_utf8(out).map_err(|_| format!("{prog} printed output that is not UTF-8"))
}

fn scontrol(bin_dir: Option<&Path>, args: &[&str]) -> Result<(), String> {
    slurm_output(bin_dir, "scontrol", args).map(drop)
}

/// How long a job's recovery files may sit before the epilog asks Slurm
/// whether the job can still need them (a requeued job normally restarts
/// within seconds), and how often it asks at most.
const STALE_JOBFILES_AGE: Duration = Duration::from_secs(600);
const STALE_JOBFILES_SWEEP: Duration = Duration::from_secs(600);
/// Jobs looked up per sweep (one squeue call), bounding the epilog's time.
const STALE_JOBFILES_MAX: usize = 256;

/// Removes the recovery files of jobs that will not run again: ones Slurm
/// no longer knows or that reached a final state (cancelled while waiting
/// to rerun, or rerun and ended elsewhere). Jobs still pending or running
/// keep theirs; when Slurm cannot be asked, everything is kept.
fn sweep_stale_jobfiles(cfg: &Config, log: &dyn Fn(&str)) {
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
    let mut ended_jobs = Vec::new();
    for job in jobs {
        let state = state_of(job);
        let ended = match state {
            None => true,
            Some(s) => [
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
            ]
            .contains(&s),
        };
        if ended {
            ended_jobs.push((job, state));
        }
    }
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

/// What the follow-up of a requeue does once the job is pending.
#[derive(Clone, Copy, PartialEq)]
enum FollowUp {
    /// Lifts Slurm's requeue delay.
    Prompt,
    /// Turns the job's shards into a whole GPU (the rerun is to have a GPU
    /// of its own; only a pending job takes that update), then lifts the delay.
    WholePrompt,
}

impl FollowUp {
    fn arg(self) -> &'static str {
        match self {
            FollowUp::Prompt => "keep",
            FollowUp::WholePrompt => "whole",
        }
    }
}

/// Requeues the job. Slurm refuses jobs submitted with --no-requeue. Slurm
/// delays a requeued job's start (BeginTime); that can only be lifted once
/// the job has left COMPLETING, i.e. after this epilog ends, so a detached
/// follow-up (own process group: slurmd cleans up the epilog's) does it,
/// told where Slurm's commands are.
fn requeue(bin_dir: Option<&Path>, job: &str, next: FollowUp) -> Result<(), String> {
    scontrol(bin_dir, &["requeue", job])?;
    prompt_later(bin_dir, job, next).map_err(|e| format!("requeued, but {e}"))
}

/// Starts the detached follow-up of a requeue.
fn prompt_later(bin_dir: Option<&Path>, job: &str, next: FollowUp) -> Result<(), String> {
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

/// `--prompt-restart JOB [SLURM_BIN_DIR [keep|whole]]`: waits (at most a
/// minute) until the requeued job is PENDING; with `whole`, turns its
/// shards into a whole GPU (24.11 and later apply it, measured; 22.05
/// refuses the update); then sets its start time to 3 s from now.
fn prompt_restart(args: &[OsString]) -> i32 {
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
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        // The state field alone (squeue %T), never `scontrol show job`'s
        // text, where the job's name or command may say anything.
        let state = slurm_output(bin_dir, "squeue", &[SQUEUE_LOCAL, "-h", "-t", "all", "-o", "%T", "-j", job]);
        if state.is_ok_and(|s| s.trim() == "PENDING") {
            let how = args.get(2).and_then(|w| w.to_str()).unwrap_or("keep");
            if how == "whole" {
                // slurmctld's field (squeue %b), never text the user wrote.
                let tres = slurm_output(bin_dir, "squeue", &[SQUEUE_LOCAL, "-h", "-t", "all", "-o", "%b", "-j", job]);
                if let Some(whole) = tres.ok().as_deref().and_then(carma_tools::recovery::whole_gpu_for_shards) {
                    let update =
                        scontrol(bin_dir, &["update", &format!("JobId={job}"), &format!("TresPerNode={whole}")]);
                    logged(job, "its shards were not turned into a whole GPU", update);
                }
            }
            // Not "now": slurmd revokes the previous run's credential with
            // one-second granularity and kills a run that starts within that
            // second ("Job credential revoked"), measured on Slurm 22.05.
            let update = scontrol(bin_dir, &["update", &format!("JobId={job}"), "StartTime=now+3"]);
            let failed = update.is_err();
            logged(job, "its requeue delay was not lifted", update);
            return i32::from(failed);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    logged(job, "it was not pending within a minute, so its requeue delay was not lifted", Err("gave up".into()));
    1
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
