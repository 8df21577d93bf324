//! OOM recovery against the real cluster: carma-epilog (slurm.conf Epilog)
//! detects a simulated PyTorch OOM in the job's output and requeues the job;
//! the plugin reruns it on a GPU of its own.
//! (long file: one suite of real-Slurm scenarios, each test a job story.)

mod common;
use common::*;
use std::time::{Duration, Instant};

/// Submits a batch job as the test user; returns (job id, output path).
fn submit(opts: &[&str], body: &str) -> (String, String) {
    let name = unique("rec");
    let path = script(&name, body);
    let out = work_dir().join(format!("{name}-%x-%j.out")).to_string_lossy().into_owned();
    let mut args = vec!["sbatch", "--parsable", "--open-mode=append", "-J", &name, "-o", &out];
    args.extend_from_slice(opts);
    args.push(&path);
    let r = user(&args, 30).ok();
    let id = r.stdout.trim().to_string();
    let real = out.replace("%x", &name).replace("%j", &id);
    (id, real)
}

fn field(job: &str, key: &str) -> String {
    let r = root(&["scontrol", "show", "job", "-o", job], 20);
    r.stdout.split_whitespace().find_map(|w| w.strip_prefix(&format!("{key}="))).unwrap_or_default().to_string()
}

/// Seconds from now until a time scontrol printed (local time).
fn seconds_until(stamp: &str) -> i64 {
    let at = root(&["date", "-d", stamp, "+%s"], 10).ok().stdout.trim().parse::<i64>();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64);
    match (at, now) {
        (Ok(at), Ok(now)) => at - now,
        _ => panic!("not a time: {stamp}"),
    }
}

/// Waits for a terminal state that stays put: between a run's end and its
/// epilog's requeue, Slurm briefly reports FAILED for a job that restarts.
fn wait_done(job: &str, secs: u64) -> String {
    let start = Instant::now();
    let terminal = |s: &str| ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"].contains(&s);
    loop {
        let st = field(job, "JobState");
        if terminal(&st) {
            let restarts = field(job, "Restarts");
            std::thread::sleep(Duration::from_millis(2500));
            if field(job, "JobState") == st && field(job, "Restarts") == restarts {
                return st;
            }
            continue;
        }
        assert!(start.elapsed() < Duration::from_secs(secs), "job {job} still {st} after {secs}s");
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn carma_log() -> String {
    std::fs::read_to_string("/var/log/carma/carma.log").unwrap_or_default()
}

const VICTIM: &str = "echo \"RUN ${SLURM_RESTART_COUNT:-0} $CARMA_DECISION\"\n\
                      carma-fakejob --mem 8G --grow-to $GROW --grow-after 2 --seconds 5";

#[test]
fn oom_next_to_a_growing_neighbour_is_requeued_and_reruns_alone() {
    require_cluster();
    let (nb, nb_out) = submit(
        &["--carma-policy=ff", "--carma-mem=16G"],
        "echo \"$CARMA_DECISION\"\ncarma-fakejob --mem 16G --seconds 16",
    );
    wait_reservations(1);
    // Each run also probes the GPU device files (ConstrainDevices=yes).
    let body = format!("{PROBE}\n{VICTIM}");
    let (victim, out) = submit(&["--carma-policy=ff", "--carma-mem=8G", "--export=ALL,GROW=30G"], &body);
    let t0 = Instant::now();
    assert_eq!(wait_done(&victim, 90), "COMPLETED");
    let took = t0.elapsed();
    let text = std::fs::read_to_string(&out).unwrap();
    let runs: Vec<&str> = text.lines().filter(|l| l.starts_with("RUN ")).collect();
    assert_eq!(runs.len(), 2, "{text}");
    assert!(
        runs[0].contains("gpu_indices=0") && runs[0].contains("exclusive=false"),
        "first run collocated with the neighbour: {text}"
    );
    assert!(text.contains("torch.OutOfMemoryError: CUDA out of memory"), "{text}");
    assert!(
        runs[1].starts_with("RUN 1") && runs[1].contains("recovery=exclusive") && runs[1].contains("exclusive=true"),
        "{text}"
    );
    assert!(!runs[1].contains("gpu_indices=0 "), "rerun shared the neighbour's GPU: {text}");
    assert!(text.contains("carma-fakejob: done"), "{text}");
    // Each run could open exactly its GPU: the shared one, then its own.
    let probes = probe_lines(&text);
    assert_eq!(probes.len(), 2, "{text}");
    for (told, opened) in &probes {
        assert_eq!((told.len(), opened), (1, told), "{text}");
    }
    assert!(!probes[1].0.contains(&0), "{text}");
    assert_eq!(field(&victim, "Restarts"), "1");
    // The rerun held a whole GPU in Slurm's books, not the first run's shard.
    let tres = field(&victim, "TresPerNode");
    assert!(tres.contains("gpu:1") && !tres.contains("shard"), "rerun's request: {tres}");
    // Slurm's requeue delay (BeginTime) was lifted: both runs took seconds, not minutes.
    assert!(took < Duration::from_secs(60), "restart was not prompt: {took:?}");
    assert!(carma_log().contains(&format!("job {victim} ran out of GPU memory in {out}")), "no epilog line");
    // The job's record after it ended says how its last run was placed:
    // recovered, exclusively.
    let record = job_field(&victim, "AdminComment");
    assert!(record.contains("recovery=exclusive") && record.contains("exclusive=true"), "{record}");
    assert_eq!(wait_done(&nb, 60), "COMPLETED", "the neighbour was affected");
    assert!(std::fs::read_to_string(nb_out).unwrap().contains("carma-fakejob: done"));
}

#[test]
fn a_failure_without_an_oom_line_is_not_requeued() {
    require_cluster();
    let (job, _) = submit(&["--carma-mem=2G"], "echo 'ValueError: bad learning rate' >&2\nexit 1");
    assert_eq!(wait_done(&job, 60), "FAILED");
    assert_eq!(field(&job, "Restarts"), "0");
    assert!(carma_log().contains(&format!("job {job} failed (status 256) without a GPU OOM message")));
}

#[test]
fn a_job_that_ooms_twice_stops_after_the_limit_with_a_message() {
    require_cluster();
    // 41G never fits a 40G GPU, alone or not.
    let (job, out) = submit(&["--carma-mem=8G", "--export=ALL,GROW=41G"], VICTIM);
    assert_eq!(wait_done(&job, 90), "FAILED");
    assert_eq!(field(&job, "Restarts"), "1");
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(text.matches("torch.OutOfMemoryError").count(), 2, "{text}");
    assert!(
        text.contains(&format!("carma: job {job} ran out of GPU memory again after 1 recovery(ies); not requeued (recovery.max_recoveries=1)")),
        "{text}"
    );
}

#[test]
fn cancelled_no_requeue_and_recovery_none_jobs_are_never_requeued() {
    require_cluster();
    let oom_then_sleep = "echo 'torch.OutOfMemoryError: CUDA out of memory.' >&2\nsleep 60";
    let (cancelled, _) = submit(&["--carma-mem=1G"], oom_then_sleep);
    std::thread::sleep(Duration::from_secs(2));
    root(&["scancel", &cancelled], 20).ok();
    let oom_exit = "echo 'torch.OutOfMemoryError: CUDA out of memory.' >&2\nexit 1";
    let (no_requeue, _) = submit(&["--carma-mem=1G", "--no-requeue"], oom_exit);
    let (none, _) = submit(&["--carma-mem=1G", "--carma-recovery=none"], oom_exit);
    assert_eq!(wait_done(&cancelled, 60), "CANCELLED");
    assert_eq!(wait_done(&no_requeue, 60), "FAILED");
    assert_eq!(wait_done(&none, 60), "FAILED");
    for j in [&cancelled, &no_requeue, &none] {
        assert_eq!(field(j, "Restarts"), "0", "job {j} was requeued");
    }
    let log = carma_log();
    // scontrol as carma.yaml's slurm_bin_dir names it, or from PATH.
    let said = log.lines().find(|l| l.contains(&format!("job {no_requeue} ran out of GPU memory"))).unwrap_or("");
    assert!(said.contains("was not requeued: ") && said.contains("scontrol requeue"), "{said}");
    assert!(
        log.contains(&format!("job {none} ran out of GPU memory"))
            && log.contains("--carma-recovery=none: not requeued")
    );
}

#[test]
fn looser_recovery_reruns_with_the_crashed_runs_need_instead_of_a_whole_gpu() {
    require_cluster();
    let (nb, _) = submit(&["--carma-policy=ff", "--carma-mem=16G"], "carma-fakejob --mem 16G --seconds 16");
    wait_reservations(1);
    let (victim, out) =
        submit(&["--carma-policy=ff", "--carma-mem=8G", "--carma-recovery=looser", "--export=ALL,GROW=30G"], VICTIM);
    assert_eq!(wait_done(&victim, 90), "COMPLETED");
    let text = std::fs::read_to_string(&out).unwrap();
    let rerun = text.lines().find(|l| l.starts_with("RUN 1")).unwrap_or_else(|| panic!("no rerun: {text}"));
    // The OOM message said "Tried to allocate 30720 MiB"; plus the 2 GiB margin.
    assert!(rerun.contains("recovery=looser") && rerun.contains("estimate=32768M source=recovery"), "{rerun}");
    assert!(rerun.contains("exclusive=false"), "looser must not take a whole GPU: {rerun}");
    assert!(!rerun.contains("gpu_indices=0 "), "16G neighbour + 32G does not fit GPU 0: {rerun}");
    assert!(text.contains("carma-fakejob: done"), "{text}");
    assert!(field(&victim, "TresPerNode").contains("shard"), "a looser rerun keeps its shard");
    assert_eq!(wait_done(&nb, 60), "COMPLETED");
}

/// Waits (at most `secs`) until `path` exists or not, as `present` says.
fn wait_path(path: &str, present: bool, secs: u64) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(secs) {
        if std::path::Path::new(path).exists() == present {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}

#[test]
fn recovery_files_of_jobs_that_will_not_run_here_again_are_swept_by_the_epilog() {
    require_cluster();
    // A held job stays PENDING, as a requeued one waiting to rerun does.
    let (held, _) = submit(&["--hold", "--carma-mem=1G"], "true");
    let unknown = "4000000"; // a job Slurm never had
    let file = |name: &str| format!("/run/carma/{name}");
    for name in [format!("recovery-{held}"), format!("restart-{held}"), format!("recovery-{unknown}")] {
        root(&["touch", "-d", "1 hour ago", &file(&name)], 10).ok();
    }
    let sweep_with_a_job = || {
        // The epilog sweeps at most every 10 minutes: forget the last sweep.
        root(&["rm", "-f", "/run/carma/jobfiles.swept"], 10).ok();
        let (run, _) = sbatch_wait(&[], &[], "true", 60);
        assert_eq!(run.code, 0, "{}", run.stderr);
    };
    sweep_with_a_job();
    assert!(wait_path(&file(&format!("recovery-{unknown}")), false, 30), "a file of an unknown job was kept");
    assert!(
        carma_log().contains(&format!("removed the recovery files of job {unknown}: Slurm no longer knows it")),
        "{}",
        carma_log()
    );
    assert!(std::path::Path::new(&file(&format!("recovery-{held}"))).exists(), "a pending job's file was removed");
    assert!(std::path::Path::new(&file(&format!("restart-{held}"))).exists());
    // Cancelled while waiting: it will never run, so its files go.
    root(&["scancel", &held], 20).ok();
    assert_eq!(wait_done(&held, 60), "CANCELLED");
    sweep_with_a_job();
    assert!(wait_path(&file(&format!("recovery-{held}")), false, 30), "a cancelled job's file was kept");
    assert!(!std::path::Path::new(&file(&format!("restart-{held}"))).exists());
    assert!(carma_log().contains(&format!("removed the recovery files of job {held}: it is CANCELLED")));
}

/// Waits (at most `secs`) until the file at `path` contains `text`.
fn wait_text(path: &str, text: &str, secs: u64) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(secs) {
        if std::fs::read_to_string(path).is_ok_and(|t| t.contains(text)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}

/// An admin's `scontrol requeue` of a running job, with Slurm's requeue
/// delay lifted as the epilog's own follow-up does.
fn admin_requeue(job: &str) {
    root(&["scontrol", "requeue", job], 20).ok();
    let start = Instant::now();
    while field(job, "JobState") != "PENDING" {
        assert!(start.elapsed() < Duration::from_secs(60), "job {job} not pending after the requeue");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Not "now": a run that starts within the second slurmd revoked the
    // last run's credential in is killed (see carma-epilog's prompt_restart).
    root(&["scontrol", "update", &format!("JobId={job}"), "StartTime=now+3"], 20).ok();
}

#[test]
fn an_admin_requeue_is_no_recovery_and_uses_none_of_the_limit() {
    require_cluster();
    // Run 0 waits to be requeued by the admin; run 1 runs out of GPU
    // memory; run 2, the recovery, finishes.
    let body = "echo \"RUN ${SLURM_RESTART_COUNT:-0} $CARMA_DECISION\"\n\
                case ${SLURM_RESTART_COUNT:-0} in\n\
                0) echo waiting; sleep 120 ;;\n\
                1) echo 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.' >&2; exit 1 ;;\n\
                *) echo finished ;;\n\
                esac";
    let (job, out) = submit(&["--carma-policy=ff", "--carma-mem=2G"], body);
    assert!(wait_text(&out, "waiting", 60), "run 0 did not start");
    admin_requeue(&job);
    assert_eq!(wait_done(&job, 120), "COMPLETED");
    let text = std::fs::read_to_string(&out).unwrap();
    let runs: Vec<&str> = text.lines().filter(|l| l.starts_with("RUN ")).collect();
    assert_eq!(runs.len(), 3, "{text}");
    assert!(
        runs[1].starts_with("RUN 1") && !runs[1].contains("recovery=") && runs[1].contains("exclusive=false"),
        "the admin's requeue was taken for an OOM: {text}"
    );
    assert!(
        runs[2].starts_with("RUN 2") && runs[2].contains("recovery=exclusive") && runs[2].contains("exclusive=true"),
        "the OOM after the admin's requeue was not recovered: {text}"
    );
    assert!(text.contains("finished"), "{text}");
    assert_eq!(field(&job, "Restarts"), "2");
    assert!(carma_log().contains(&format!("job {job} ran out of GPU memory in {out}")), "no epilog line");
    assert!(carma_log().contains("requeued, recovery 1 of 1"), "the recovery was not counted as the first");
    report(
        "fault",
        "an admin's scontrol requeue of a running CARMA job: the rerun is placed as asked, no recovery used; a later OOM is still recovered",
    );
}

#[test]
fn appended_output_of_a_recovered_run_is_not_read_again_when_the_rerun_fails_otherwise() {
    require_cluster();
    // --open-mode=append (as submit() does): run 1's output follows run 0's OOM.
    let body = "echo \"RUN ${SLURM_RESTART_COUNT:-0} $CARMA_DECISION\"\n\
                if [ ${SLURM_RESTART_COUNT:-0} = 0 ]; then\n\
                echo 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.' >&2; exit 1\n\
                fi\n\
                echo 'ValueError: bad learning rate' >&2; exit 1";
    let (job, out) = submit(&["--carma-mem=2G"], body);
    assert_eq!(wait_done(&job, 90), "FAILED");
    assert_eq!(field(&job, "Restarts"), "1");
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(text.matches("RUN ").count(), 2, "{text}");
    assert!(!text.contains("ran out of GPU memory again"), "run 0's OOM was read as run 1's: {text}");
    assert!(
        carma_log().contains(&format!("job {job} failed (status 256) without a GPU OOM message")),
        "{}",
        carma_log()
    );
    report(
        "fault",
        "a recovered job appending to its output (--open-mode=append) fails again for another reason: only that run's output is read, not taken for an OOM",
    );
}

#[test]
fn output_readable_only_through_the_users_group_is_scanned_and_the_job_recovered() {
    require_cluster();
    // A project directory of group carmashare (tests/cluster.sh): the job's
    // user reaches it only through that supplementary group.
    let dir = work_dir().join(unique("grp"));
    let dir_s = dir.to_string_lossy().into_owned();
    root(&["install", "-d", "-m", "2770", "-o", "root", "-g", "carmashare", &dir_s], 10).ok();
    let name = unique("recgrp");
    let path = script(
        &name,
        "echo \"RUN ${SLURM_RESTART_COUNT:-0} $CARMA_DECISION\"\n\
        if [ ${SLURM_RESTART_COUNT:-0} = 0 ]; then\n\
        echo 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.' >&2; exit 1\n\
        fi\n\
        echo recovered",
    );
    let out = format!("{dir_s}/out-%j");
    let r = user(&["sbatch", "--parsable", "--open-mode=append", "--carma-mem=2G", "-J", &name, "-o", &out, &path], 30)
        .ok();
    let job = r.stdout.trim().to_string();
    let out = out.replace("%j", &job);
    assert_eq!(wait_done(&job, 90), "COMPLETED", "{}", carma_log());
    assert_eq!(field(&job, "Restarts"), "1");
    let text = root(&["cat", &out], 10).ok().stdout;
    assert!(text.contains("recovery=exclusive") && text.contains("recovered"), "{text}");
    assert!(carma_log().contains(&format!("job {job} ran out of GPU memory in {out}")), "{}", carma_log());
    report(
        "fault",
        "a job's output in a directory readable only through the user's supplementary group: the epilog reads it with the user's groups and recovers the job",
    );
}

#[test]
fn a_preempted_and_requeued_job_reruns_as_it_asked_not_as_a_recovery() {
    require_cluster();
    // All 32 CPUs of the node: the urgent job below can only run by
    // preempting it (tests/cluster.sh: lowprio is requeued by urgent).
    let body = "echo \"RUN ${SLURM_RESTART_COUNT:-0} $CARMA_DECISION\"\n\
                if [ ${SLURM_RESTART_COUNT:-0} = 0 ]; then echo waiting; sleep 120; fi\n\
                echo finished";
    let (job, out) = submit(&["-p", "lowprio", "-c", "32", "--carma-policy=ff", "--carma-mem=2G"], body);
    assert!(wait_text(&out, "waiting", 60), "run 0 did not start");
    let urgent = user(&["sbatch", "--parsable", "-p", "urgent", "-c", "32", "--wrap", "sleep 3"], 30).ok();
    let urgent = urgent.stdout.trim().to_string();
    let start = Instant::now();
    while field(&job, "JobState") != "PENDING" {
        assert!(start.elapsed() < Duration::from_secs(60), "job {job} was not preempted: {}", field(&job, "JobState"));
        std::thread::sleep(Duration::from_millis(200));
    }
    root(&["scontrol", "update", &format!("JobId={job}"), "StartTime=now+3"], 20).ok();
    assert_eq!(wait_done(&urgent, 60), "COMPLETED");
    assert_eq!(wait_done(&job, 120), "COMPLETED");
    let text = std::fs::read_to_string(&out).unwrap();
    let runs: Vec<&str> = text.lines().filter(|l| l.starts_with("RUN ")).collect();
    assert_eq!(runs.len(), 2, "{text}");
    assert!(
        runs[1].starts_with("RUN 1") && !runs[1].contains("recovery=") && runs[1].contains("exclusive=false"),
        "the preemption was taken for an OOM: {text}"
    );
    report(
        "fault",
        "a CARMA job preempted and requeued (PreemptMode=REQUEUE): the rerun is placed as asked, no recovery used",
    );
}

/// Drains a node while alive (its running jobs go on; none start there);
/// resumes it when dropped, also when the test fails.
struct Drained(String);

impl Drained {
    fn new(node: &str) -> Drained {
        let r = root(&["scontrol", "update", &format!("NodeName={node}"), "State=DRAIN", "Reason=carma-test"], 20);
        assert_eq!(r.code, 0, "cannot drain {node}: {}", r.stderr);
        Drained(node.to_string())
    }
}

impl Drop for Drained {
    fn drop(&mut self) {
        let _ = root(&["scontrol", "update", &format!("NodeName={}", self.0), "State=RESUME"], 20);
    }
}

/// slurmctld, not CARMA, picks the node of a requeued job's rerun: run 0
/// runs out of GPU memory on the first node, which is drained meanwhile,
/// so the rerun can only start on the second. It is still a recovery there
/// (carma-epilog's verdict travels in AdminComment and the second node's
/// job prolog reads it), with the first node's local verdict of no use.
#[test]
fn a_rerun_that_slurm_starts_on_another_node_is_still_a_recovery() {
    require_cluster();
    let node1 = root(&["hostname", "-s"], 10).ok().stdout.trim().to_string();
    let node2 = node2();
    let flag = work_dir().join(format!("{}.go", unique("flag")));
    let body = format!(
        "echo \"RUN ${{SLURM_RESTART_COUNT:-0}} $SLURMD_NODENAME $CARMA_DECISION\"\n\
         case ${{SLURM_RESTART_COUNT:-0}} in\n\
         0) while [ ! -e {} ]; do sleep 0.2; done\n\
         echo 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.' >&2; exit 1 ;;\n\
         *) echo finished ;;\n\
         esac",
        flag.display()
    );
    let away = Drained::new(&node2);
    let (job, out) = submit(&["-p", "multi", "--carma-policy=ff", "--carma-mem=2G"], &body);
    let _cancel = Cancel(vec![job.clone()]);
    assert!(wait_text(&out, "RUN 0", 60), "run 0 did not start");
    drop(away);
    let _here = Drained::new(&node1);
    std::fs::write(&flag, "").unwrap();
    assert_eq!(wait_done(&job, 120), "COMPLETED");
    let text = std::fs::read_to_string(&out).unwrap();
    let runs: Vec<&str> = text.lines().filter(|l| l.starts_with("RUN ")).collect();
    assert_eq!(runs.len(), 2, "{text}");
    // The test cluster's first node is named after this host (tests/cluster.sh).
    assert!(runs[0].starts_with(&format!("RUN 0 {node1} ")) && runs[0].contains("exclusive=false"), "{text}");
    assert!(
        runs[1].starts_with(&format!("RUN 1 {node2} "))
            && runs[1].contains("recovery=exclusive")
            && runs[1].contains("exclusive=true"),
        "the rerun on the other node was not placed as a recovery: {text}"
    );
    assert!(text.contains("finished"), "{text}");
    let comment = job_field(&job, "AdminComment");
    assert!(comment.contains("carma-recovery: exclusive n=1 restart=1"), "{comment}");
    let log2 = std::fs::read_to_string(format!("/var/log/carma/carma-{node2}.log")).unwrap_or_default();
    assert!(log2.contains(&format!("job {job}: run 1 recovers from an OOM (exclusive, recovery 1)")), "{log2}");
    report("fault", "a recovered job's rerun that slurmctld starts on another node is placed there as a recovery");
}

/// Under carma.yaml `gpu_owner: slurm` (the default; the test cluster sets
/// carma) the exclusive rerun runs on the whole GPU Slurm gives it: the
/// epilog turns its shard into a GPU, the rerun's job prolog records that
/// GPU, and CARMA keeps the rerun to it (not to the first run's shard GPU,
/// where the neighbour still runs).
#[test]
fn under_gpu_owner_slurm_an_oom_rerun_runs_on_the_whole_gpu_slurm_gives_it() {
    require_cluster();
    const CONF: &str = "/etc/slurm/carma.yaml";
    let _conf = Restore::new(CONF);
    let text = std::fs::read_to_string(CONF).unwrap();
    std::fs::write(CONF, text.replace("\ngpu_owner: carma\n", "\ngpu_owner: slurm\n")).unwrap();
    let status: serde_json::Value =
        serde_json::from_str(&root(&["carma", "status", "--json"], 20).ok().stdout).unwrap();
    assert_eq!(status["gpu_owner"], "slurm", "the switch to gpu_owner: slurm did not take");
    let host = root(&["hostname", "-s"], 10).ok().stdout.trim().to_string();
    let (nb, _) = submit(
        &["-w", &host, "--carma-policy=ff", "--carma-mem=16G"],
        // Past the rerun's start: its shard keeps GPU 0 from being handed
        // out whole meanwhile (cancelled at the end).
        "echo \"$CARMA_DECISION\"\ncarma-fakejob --mem 16G --seconds 300",
    );
    let _cancel_nb = Cancel(vec![nb.clone()]);
    wait_reservations(1);
    let body = format!("{PROBE}\n{VICTIM}");
    let (victim, out) = submit(&["-w", &host, "--carma-policy=ff", "--carma-mem=8G", "--export=ALL,GROW=30G"], &body);
    let _cancel = Cancel(vec![victim.clone()]);
    assert_eq!(wait_done(&victim, 300), "COMPLETED");
    let text = std::fs::read_to_string(&out).unwrap();
    let runs: Vec<&str> = text.lines().filter(|l| l.starts_with("RUN ")).collect();
    assert_eq!(runs.len(), 2, "{text}");
    assert!(runs[0].contains("gpu_indices=0 ") && runs[0].contains("exclusive=false"), "{text}");
    assert!(runs[1].contains("recovery=exclusive") && runs[1].contains("exclusive=true"), "{text}");
    assert!(!runs[1].contains("gpu_indices=0 "), "the rerun stayed on the first run's shard GPU: {text}");
    let probes = probe_lines(&text);
    assert_eq!(probes.len(), 2, "{text}");
    for (told, opened) in &probes {
        assert_eq!((told.len(), opened), (1, told), "{text}");
    }
    let tres = field(&victim, "TresPerNode");
    assert!(tres.contains("gpu:1") && !tres.contains("shard"), "rerun's request: {tres}");
    assert!(text.contains("carma-fakejob: done"), "{text}");
    root(&["scancel", &nb], 20).ok();
    wait_completed(&nb);
    wait_released();
}

const NODE1_CONF: &str = "/etc/slurm/carma.yaml";
const NODE2_CONF: &str = "/etc/slurm/node2/carma.yaml";

/// carma.yaml `no_fit: hand_back` (with a short wait and `extra`) on the
/// node whose file `conf` is; the file is put back when the guard drops.
fn hand_back_on(conf: &'static str, extra: &str) -> Restore {
    let guard = Restore::new(conf);
    let text = String::from_utf8(guard.saved().expect("carma.yaml")).unwrap();
    assert!(text.contains("wait: 60s"), "the test cluster's carma.yaml changed: {text}");
    let text = text.replace("wait: 60s", "wait: 2s") + "no_fit: hand_back\n" + extra;
    std::fs::write(conf, text).unwrap();
    guard
}

/// Four jobs of 30G, one per GPU of the node (`-w`; its carma.yaml
/// `conf`, which names its GPUs), none of which leaves room for 20G;
/// returns their ids (cancel them).
fn fill_node(partition: &str, node: &str, conf: &str) -> Vec<String> {
    let body = format!("carma-fakejob --config {conf} --mem 30G --seconds 300");
    (0..4).map(|_| submit(&["-p", partition, "-w", node, "--carma-policy=ff", "--carma-mem=30G"], &body).0).collect()
}

/// The node the job's (last) run was on.
fn ran_on(job: &str) -> String {
    root(&["squeue", "-h", "-t", "all", "-j", job, "-o", "%N"], 20).stdout.trim().to_string()
}

/// `no_fit: hand_back`: a job that finds no GPU on the node slurmctld
/// sent it to (its free memory split across GPUs, none with room) is not
/// held in slurmstepd: its batch step fails after its (2 s) wait, carma-epilog
/// requeues it with that node excluded, and it runs on the empty node.
/// The reason is in its output and the count in AdminComment. A job that
/// requires the full node pauses instead, and runs there once it has room.
#[test]
fn a_job_handed_back_runs_on_the_other_node() {
    require_cluster();
    let _conf = hand_back_on(NODE1_CONF, "hand_back_pause: 5s\n");
    let host = root(&["hostname", "-s"], 10).ok().stdout.trim().to_string();
    let fillers = fill_node("debug", &host, NODE1_CONF);
    let cancel_fillers = Cancel(fillers);
    wait_reservations(4);
    // slurmctld sends a job that fits anywhere to the first node.
    let started = Instant::now();
    let (job, out) = submit(
        &["-p", "multi", "--carma-policy=ff", "--carma-mem=20G"],
        "echo \"RAN on $SLURMD_NODENAME: $CARMA_DECISION\"",
    );
    let _cancel = Cancel(vec![job.clone()]);
    assert_eq!(wait_done(&job, 120), "COMPLETED");
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let node2 = node2();
    assert_eq!(ran_on(&job), node2, "{text}");
    assert!(text.contains(&format!("RAN on {node2}: ")), "{text}");
    assert!(text.contains("handed back to Slurm (no_fit: hand_back)"), "the first run's error: {text}");
    assert!(
        text.contains(&format!(
            "found no GPU on {host}; handed back to Slurm, requeued to run on another node (hand-back 1 of 3)"
        )),
        "carma-epilog's line: {text}"
    );
    let comment = job_field(&job, "AdminComment");
    assert!(comment.contains(&format!("carma-hand-back: n=1 from={host} c={host} p=0 (")), "{comment}");
    assert_eq!(field(&job, "ExcNodeList"), host);
    println!("handed back and run on {node2} in {:.1} s", started.elapsed().as_secs_f64());
    // A job that requires the full node would pend for ever once excluded:
    // it is not excluded from it, but waits hand_back_pause in Slurm's
    // queue and tries there again (carma.yaml's pause here: 5 s).
    let (pinned, out) = submit(&["-p", "multi", "-w", &host, "--carma-policy=ff", "--carma-mem=20G"], "echo RAN");
    let _cancel_pinned = Cancel(vec![pinned.clone()]);
    let paused = format!(
        "found no GPU on {host}; it requires nodes {host} (-w): requeued to wait 5s (hand_back_pause, pause 1)"
    );
    assert!(wait_text(&out, &paused, 60), "{}", std::fs::read_to_string(&out).unwrap_or_default());
    let comment = job_field(&pinned, "AdminComment");
    assert!(comment.contains(&format!("carma-hand-back: n=0 from={host} c= p=1 (")), "{comment}");
    // Room on its node: it runs there.
    drop(cancel_fillers);
    assert_eq!(wait_done(&pinned, 120), "COMPLETED");
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    assert!(text.contains("RAN") && !text.contains("not handed back"), "{text}");
}

/// Every GPU of both nodes taken by a 30G job ([`fill_node`]), all
/// running and placed; returns the two nodes' names and the fillers
/// (cancelled when dropped).
fn fill_both_nodes() -> (String, String, Cancel) {
    let host = root(&["hostname", "-s"], 10).ok().stdout.trim().to_string();
    let node2 = node2();
    let mut fillers = fill_node("debug", &host, NODE1_CONF);
    fillers.extend(fill_node("multi", &node2, NODE2_CONF));
    let cancel = Cancel(fillers.clone());
    for f in &fillers {
        let start = Instant::now();
        while field(f, "JobState") != "RUNNING" {
            assert!(start.elapsed() < Duration::from_secs(60), "filler {f} did not start");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    wait_reservations(4);
    // The second node's fillers are placed (its monitor publishes them).
    std::thread::sleep(Duration::from_secs(3));
    (host, node2, cancel)
}

/// With `hand_back_pause: 0`, past `max_hand_backs` the job fails with
/// the reason: handed back once from the first node, found no GPU on the
/// second either (counted from AdminComment there), and ends FAILED,
/// saying so in its output.
#[test]
fn a_job_past_its_hand_backs_fails_with_the_reason_when_it_may_not_pause() {
    require_cluster();
    let _conf = hand_back_on(NODE1_CONF, "max_hand_backs: 1\nhand_back_pause: 0s\n");
    let _conf2 = hand_back_on(NODE2_CONF, "max_hand_backs: 1\nhand_back_pause: 0s\n");
    let (host, node2, _cancel_fillers) = fill_both_nodes();
    let (job, out) = submit(&["-p", "multi", "--carma-policy=ff", "--carma-mem=20G"], "echo RAN");
    let _cancel = Cancel(vec![job.clone()]);
    assert_eq!(wait_done(&job, 120), "FAILED");
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    assert!(!text.contains("RAN"), "{text}");
    assert!(text.contains(&format!("found no GPU on {host}; handed back to Slurm")), "{text}");
    assert!(
        text.contains(&format!(
            "found no GPU on {node2}; handed back 1 time(s) since it last paused (max_hand_backs=1); not handed back again: hand_back_pause=0: policy ff, estimate 20480M"
        )),
        "{text}"
    );
    assert_eq!(ran_on(&job), node2);
    let comment = job_field(&job, "AdminComment");
    assert!(comment.contains(&format!("carma-hand-back: n=1 from={host} c={host} p=0 (")), "{comment}");
}

/// Every GPU of both nodes full (the admission claim of #42, on Slurm): a
/// job past `max_hand_backs` does not fail while a node may yet have room.
/// It is handed back from the first node, finds no GPU on the second
/// either, and pauses in Slurm's queue (`hand_back_pause`) with CARMA's
/// exclusions lifted and its count started again; a job that excluded a
/// node of its own (`-x`) has no other node to go to, pauses at once and
/// keeps its own exclusion. Once the nodes have room both run.
#[test]
fn a_job_past_its_hand_backs_pauses_in_the_queue_and_runs_when_a_node_has_room() {
    require_cluster();
    let _conf = hand_back_on(NODE1_CONF, "max_hand_backs: 1\nhand_back_pause: 20s\n");
    let _conf2 = hand_back_on(NODE2_CONF, "max_hand_backs: 1\nhand_back_pause: 20s\n");
    let (host, node2, cancel_fillers) = fill_both_nodes();
    let body = "echo \"RAN on $SLURMD_NODENAME\"";
    let (job, out) = submit(&["-p", "multi", "--carma-policy=ff", "--carma-mem=20G"], body);
    let (own, own_out) = submit(&["-p", "multi", "-x", &node2, "--carma-policy=ff", "--carma-mem=20G"], body);
    let _cancel = Cancel(vec![job.clone(), own.clone()]);
    let paused = "handed back 1 time(s) since it last paused (max_hand_backs=1): requeued to wait 20s (hand_back_pause, pause 1)";
    assert!(wait_text(&out, paused, 90), "{}", std::fs::read_to_string(&out).unwrap_or_default());
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    assert!(text.contains("handed back to Slurm, requeued to run on another node (hand-back 1 of 1)"), "{text}");
    assert!(!text.contains("not handed back"), "{text}");
    // Pending on its pause (once its epilog has ended: COMPLETING until
    // then), released, waiting for its begin time: Slurm's release keeps
    // the start the follow-up set before it.
    let t = Instant::now();
    while field(&job, "Reason") != "BeginTime" && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(250));
    }
    let (reason, eligible) = (field(&job, "Reason"), field(&job, "EligibleTime"));
    assert_eq!(reason, "BeginTime", "EligibleTime={eligible}");
    // Nothing of CARMA's excluded, counted afresh.
    assert_eq!(field(&job, "JobState"), "PENDING");
    let until = seconds_until(&eligible);
    assert!((1..=21).contains(&until), "eligible in {until} s ({eligible}), not about the 20 s pause");
    assert_eq!(field(&job, "ExcNodeList"), "(null)");
    let comment = job_field(&job, "AdminComment");
    assert!(comment.contains("carma-hand-back: n=0 from=") && comment.contains(" c= p=1 ("), "{comment}");
    let own_paused = format!(
        "found no GPU on {host}; no node of partition(s) multi is left once {host} is excluded: requeued to wait 20s"
    );
    assert!(wait_text(&own_out, &own_paused, 60), "{}", std::fs::read_to_string(&own_out).unwrap_or_default());
    assert_eq!(field(&own, "ExcNodeList"), node2);
    let comment = job_field(&own, "AdminComment");
    assert!(comment.contains(&format!("carma-hand-back: n=0 from={host} c= p=1 (")), "{comment}");
    drop(cancel_fillers);
    assert_eq!(wait_done(&job, 120), "COMPLETED");
    assert_eq!(wait_done(&own, 120), "COMPLETED");
    assert!(std::fs::read_to_string(&own_out).unwrap_or_default().contains(&format!("RAN on {host}")));
    report(
        "admission",
        "every GPU of both nodes full: a job past max_hand_backs pauses in Slurm's queue (hand_back_pause) instead of failing, CARMA's exclusions lifted and a -x of its own kept, and runs once a node has room",
    );
}

/// A hand-back mark is its run's only: one an earlier run left behind (its
/// epilog lost, a node rebooted mid-job) does not turn this run's ordinary
/// failure into a hand-back, whatever carma.yaml's `no_fit` says now.
/// The job fails once, with its own status, and the mark is gone.
#[test]
fn a_hand_back_mark_an_earlier_run_left_is_not_this_runs() {
    require_cluster();
    let host = root(&["hostname", "-s"], 10).ok().stdout.trim().to_string();
    let (job, out) = submit(&["-H", "-p", "debug", "-w", &host, "--carma-mem=4G"], "echo RAN\nexit 3");
    let _cancel = Cancel(vec![job.clone()]);
    let mark = format!("/run/carma/handback-{job}");
    std::fs::write(&mark, "policy ff: no GPU fit (a lost epilog's)\n").unwrap();
    root(&["scontrol", "release", &job], 20).ok();
    assert_eq!(wait_done(&job, 60), "FAILED");
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    assert!(text.contains("RAN") && !text.contains("handed back") && !text.contains("found no GPU"), "{text}");
    assert_eq!((field(&job, "Restarts"), field(&job, "ExcNodeList")), ("0".into(), "(null)".into()));
    assert!(!std::path::Path::new(&mark).exists(), "the stale mark stayed in /run/carma");
    report(
        "fault",
        "a hand-back mark an earlier run left (its epilog lost): the next run's own failure is not taken for a hand-back; the mark is dropped when the batch step starts",
    );
}
