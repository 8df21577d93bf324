//! Privilege boundaries: CARMA runs as root in slurmstepd, the prolog and
//! the epilog; users must not be able to change its state, and files they
//! name are opened with their rights only.

mod common;
use common::*;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

#[test]
fn state_and_log_files_are_root_owned_and_not_user_writable() {
    require_cluster();
    user(&["srun", "--carma-mem=1G", "true"], 60).ok();
    for path in [
        "/run/carma",
        "/run/carma/state.json",
        "/run/carma/state.lock",
        "/run/carma/queue.slots",
        "/var/log/carma",
        "/var/log/carma/carma.log",
    ] {
        let m = std::fs::metadata(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(m.uid(), 0, "{path} not owned by root");
        assert_eq!(m.mode() & 0o022, 0, "{path} is group/world writable: {:o}", m.mode());
    }
    // The job user can neither change nor add state.
    for args in [
        vec!["touch", "/run/carma/state.json"],
        vec!["touch", "/run/carma/recovery-1"],
        vec!["cp", "/dev/null", "/run/carma/state.json"],
        vec!["touch", "/var/log/carma/carma.log"],
        // A forged placement request or answer.
        vec!["cp", "/dev/null", "/run/carma/queue.slots"],
        vec!["dd", "if=/dev/zero", "of=/run/carma/queue.slots", "bs=64", "count=1", "conv=notrunc"],
    ] {
        let r = user(&args, 10);
        assert_ne!(r.code, 0, "user could run {args:?}");
    }
    report(
        "privilege",
        "state directory, state file, request queue (queue.slots) and log are root-owned and not writable by the job user (write attempts by the user fail)",
    );
}

/// Issue 58: the state files were 0644 in a 0755 directory, and flock(2)
/// needs only a read descriptor: a user's `flock -s state.lock sleep
/// infinity` failed every CARMA step on the node after `timeouts.lock`.
/// Now the directory is root's only (0700, its files 0600), and a node
/// upgraded from a build that made it 0755 is tightened at the next step.
#[test]
fn a_users_flock_on_the_state_lock_cannot_stall_placement() {
    require_cluster();
    const LOCK: &str = "/run/carma/state.lock";
    user(&["srun", "--carma-mem=1G", "true"], 60).ok();
    // Its epilog opens the state too: once it is done, nothing but the next
    // step sees the loosened modes (an epilog between the two chmods saw a
    // 755 directory over 600 files and tightened the directory alone).
    wait_released();
    // As an older build left it (files, then the directory): tightened by
    // the next step, with a log line.
    root(&["chmod", "644", LOCK, "/run/carma/state.json", "/run/carma/queue.slots"], 10).ok();
    root(&["chmod", "755", "/run/carma"], 10).ok();
    user(&["srun", "--carma-mem=1G", "true"], 60).ok();
    let log = std::fs::read_to_string("/var/log/carma/carma.log").unwrap();
    assert!(log.contains("state_dir /run/carma was mode 755") && log.contains("made it 700"), "no tightening logged");
    let mode = |p: &str| std::fs::metadata(p).unwrap_or_else(|e| panic!("{p}: {e}")).mode() & 0o7777;
    assert_eq!(mode("/run/carma"), 0o700);
    for f in [LOCK, "/run/carma/state.json", "/run/carma/queue.slots"] {
        assert_eq!(mode(f), 0o600, "{f}");
    }
    // The user cannot open the lock (nor read the state or the queue).
    let r = user(&["flock", "-n", "-s", LOCK, "true"], 10);
    assert_ne!(r.code, 0, "the job user took the state lock");
    assert!(r.stderr.contains("Permission denied"), "{}", r.stderr);
    for f in ["/run/carma/state.json", "/run/carma/queue.slots"] {
        let r = user(&["cat", f], 10);
        assert!(r.code != 0 && r.stderr.contains("Permission denied"), "{f}: {}", r.stderr);
    }
    // The attack as reported, held for longer than timeouts.lock (5 s):
    // its flock cannot open the file; a CARMA job on the node still runs.
    let mut holder = std::process::Command::new("runuser")
        .args(["-u", USER, "--", "flock", "-s", LOCK, "sleep", "35"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let start = Instant::now();
    let (r, out) = sbatch_wait(&["--gres=shard:1", "--carma-mem=1G"], &[], "echo \"DECISION $CARMA_DECISION\"", 60);
    let took = start.elapsed();
    let _ = holder.kill();
    let held = holder.wait_with_output().unwrap();
    assert_eq!(r.code, 0, "the CARMA job failed while the user tried to hold the lock: {out}");
    assert!(out.contains("DECISION policy="), "{out}");
    assert!(String::from_utf8_lossy(&held.stderr).contains("Permission denied"), "{held:?}");
    report(
        "privilege",
        &format!(
            "a user's `flock -s /run/carma/state.lock sleep 35` (issue 58): cannot open the lock (state directory 0700, its files 0600; a 0755 one from an older build is tightened by the next step, with a log line); a CARMA job on the node places meanwhile ({:.1} s)",
            took.as_secs_f64()
        ),
    );
}

#[test]
fn the_epilog_reads_job_output_with_the_users_rights() {
    require_cluster();
    // The job swaps its own output file for a link to /etc/shadow and fails
    // with an OOM line, hoping root will read (and log) the link's target.
    let name = unique("shadow");
    let out = work_dir().join(format!("{name}.out"));
    let body = format!(
        "echo 'torch.OutOfMemoryError: CUDA out of memory.'\nrm -f {0}\nln -s /etc/shadow {0}\nexit 1",
        out.display()
    );
    let script = script(&name, &body);
    let r =
        user(&["sbatch", "--parsable", "-J", &name, "-o", out.to_str().unwrap(), "--carma-mem=1G", &script], 30).ok();
    let job = r.stdout.trim().to_string();
    let start = Instant::now();
    let log = loop {
        let log = std::fs::read_to_string("/var/log/carma/carma.log").unwrap_or_default();
        // The epilog's verdict on this job (the plugin's placement line
        // comes first and is not it).
        let epilog_said = log.lines().any(|l| {
            l.contains(&format!("job {job}"))
                && ["cannot scan", "requeued", "ran out", "without a GPU OOM"].iter().any(|w| l.contains(w))
        });
        if epilog_said {
            break log;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "no epilog line for job {job}");
        std::thread::sleep(Duration::from_millis(300));
    };
    let line = log.lines().rfind(|l| l.contains(&format!("job {job}"))).unwrap().to_string();
    assert!(line.contains("cannot scan its output") && line.contains("UNREADABLE"), "{line}");
    assert!(!log.contains("root:"), "shadow content reached CARMA's log");
    let restarts = root(&["scontrol", "show", "job", "-o", &job], 10).stdout;
    assert!(restarts.contains("Restarts=0"), "requeued on a file the user cannot read: {restarts}");
    report(
        "privilege",
        "a job that swaps its output file for a link to /etc/shadow and prints an OOM line: the epilog, reading as the job user, cannot open it; no requeue, nothing of /etc/shadow logged",
    );
}

#[test]
fn no_production_code_spawns_a_shell() {
    // Slurm runs CARMA as root with user-influenced values around: commands
    // are executed directly with fixed arguments, never through a shell.
    let root_dir = &common::repo();
    let mut offenders = Vec::new();
    for dir in
        ["spank-plugin/src", "config/src", "placement/src", "tools/src", "prolog/src", "estimator/src", "simulator/src"]
    {
        let mut stack = vec![root_dir.join(dir)];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    let text = std::fs::read_to_string(&p).unwrap();
                    // Only code before a file's unit tests counts.
                    let code = text.split("#[cfg(test)]").next().unwrap_or("");
                    for bad in [
                        "Command::new(\"sh\")",
                        "Command::new(\"bash\")",
                        "Command::new(\"/bin/sh\")",
                        "libc::system",
                        "\"-c\"",
                        // Slurm's commands go through the one bounded runner
                        // (placement/src/command.rs), never an unbounded output().
                        "Command::new(\"scontrol\")",
                        "Command::new(\"squeue\")",
                        // Fields a user cannot write, never a job's text.
                        "JobState=",
                    ] {
                        if code.contains(bad) {
                            offenders.push(format!("{}: {bad}", p.display()));
                        }
                    }
                }
            }
        }
    }
    // slurmctld runs job_submit under its locks: its Lua starts no process
    // (io.popen and os.execute both go through `sh -c`).
    let mut luas = 0;
    for e in std::fs::read_dir(root_dir.join("slurm-conf-examples")).unwrap().flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "lua") {
            luas += 1;
            let text = std::fs::read_to_string(&p).unwrap();
            for bad in ["io.popen", "os.execute", "io.lines(\"|"] {
                if text.lines().any(|l| !l.trim_start().starts_with("--") && l.contains(bad)) {
                    offenders.push(format!("{}: {bad}", p.display()));
                }
            }
        }
    }
    assert!(luas >= 3, "expected carma_slurm.lua, job_submit.lua and cli_filter.lua, read {luas} Lua files");
    assert!(offenders.is_empty(), "{offenders:?}");
    report("privilege", "no production source (Rust or slurmctld's Lua) spawns a shell or passes user strings to one");
}

#[test]
fn an_understated_estimate_cannot_crowd_out_other_jobs() {
    require_cluster();
    // A job declares 1 GiB but takes 30 GiB of its GPU.
    let liar = std::thread::spawn(|| {
        sbatch_wait(
            &["--carma-policy=ff", "--carma-mem=1G"],
            &[],
            "echo \"GPU $SLURM_STEP_GPUS\"\ncarma-fakejob --mem 30G --seconds 6",
            120,
        )
    });
    wait_reservations(1);
    std::thread::sleep(Duration::from_secs(2));
    // First-fit would put a 14 GiB job on the same GPU if the declaration
    // were believed; the live reading puts it elsewhere.
    let (r, out) = sbatch_wait(&["--carma-policy=ff", "--carma-mem=14G"], &[], "echo \"GPU $SLURM_STEP_GPUS\"", 60);
    assert_eq!(r.code, 0, "{out}");
    let (lr, lout) = liar.join().unwrap();
    assert_eq!(lr.code, 0, "{lout}");
    let gpu = |o: &str| o.lines().find_map(|l| l.strip_prefix("GPU ")).map(str::to_string);
    assert!(gpu(&lout).is_some() && gpu(&out).is_some(), "{lout}\n{out}");
    assert_ne!(gpu(&out), gpu(&lout), "placed next to 30 GiB of real use on a 40 GiB GPU");
    report(
        "privilege",
        "a job that declares 1 GiB but uses 30 GiB cannot crowd out others: live readings count, the next job goes elsewhere",
    );
}
