//! OOM recovery against the real cluster: carma-epilog (slurm.conf Epilog)
//! detects a simulated PyTorch OOM in the job's output and requeues the job;
//! the plugin reruns it on a GPU of its own.

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
    assert!(
        log.contains(&format!("job {no_requeue} ran out of GPU memory"))
            && log.contains("was not requeued: scontrol requeue")
    );
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
