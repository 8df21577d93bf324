//! Faults injected into the real cluster, each with its documented outcome:
//! CARMA never hangs or crashes a step, never drains the node, recovers its
//! state with a log line, and a non-CARMA job never notices.

mod common;
use common::*;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const STATE: &str = "/run/carma/state.json";
const SIM: &str = "/etc/carma/sim-gpus.yaml";

fn node_ok() {
    let st = root(&["sinfo", "-h", "-o", "%T"], 10).stdout;
    assert!(!st.contains("drain") && !st.contains("down"), "node is {st}");
}

fn carma_log() -> String {
    std::fs::read_to_string("/var/log/carma/carma.log").unwrap_or_default()
}

#[test]
fn a_hung_state_lock_holder_fails_carma_steps_in_bounded_time_and_spares_others() {
    require_cluster();
    // A process that takes the state lock and never lets go.
    let mut holder: Child = Command::new("flock").args(["-o", "/run/carma/state.lock", "sleep", "30"]).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let r = user(&["srun", "--carma-mem=1G", "true"], 60);
    let took = t.elapsed();
    let plain = user(&["srun", "true"], 30);
    let _ = holder.kill();
    let _ = holder.wait();
    assert_ne!(r.code, 0, "a CARMA step ran without its state lock");
    assert!(r.stderr.contains("state lock") && r.stderr.contains("not obtained within 5.0s"), "{}", r.stderr);
    assert!(took < Duration::from_secs(20), "lock wait not bounded: {took:?}");
    assert_eq!(plain.code, 0, "a job without CARMA was affected: {}", plain.stderr);
    node_ok();
    user(&["srun", "--carma-mem=1G", "true"], 60).ok();
    report(
        "fault",
        "state lock held by a hung process: CARMA steps fail after the configured lock timeout with a clear error; non-CARMA jobs unaffected",
    );
}

/// Waits (at most 60 s) until the test user has no job pending, running
/// or completing.
fn wait_user_jobs_gone() {
    let start = Instant::now();
    while !root(&["squeue", "-h", "-u", USER, "-t", "PD,R,CG,CF"], 20).stdout.trim().is_empty() {
        assert!(start.elapsed() < Duration::from_secs(60), "the test user's jobs did not end");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn corrupt_and_truncated_state_files_are_set_aside_and_a_newer_one_fails_closed() {
    require_cluster();
    for (i, bad) in [&b"\x00\xffgarbage"[..], b"{\"version\":1,\"rr_cur"].into_iter().enumerate() {
        // The previous step's slurmstepd and its job's epilog (which
        // releases what the job holds, reading the state) must be done with
        // the state first: an epilog that set the bad file aside would
        // leave this case's step nothing to recover.
        wait_released();
        wait_user_jobs_gone();
        std::fs::write(STATE, bad).unwrap();
        let before = std::fs::read_dir("/run/carma")
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().contains(".corrupt."))
            .count();
        let r = user(&["srun", "--carma-mem=1G", "printenv", "CARMA_DECISION"], 60).ok();
        assert!(r.stdout.contains("gpu_indices="), "case {i}: {}", r.stdout);
        let after = std::fs::read_dir("/run/carma")
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().contains(".corrupt."))
            .count();
        assert_eq!(after, before + 1, "case {i}: the bad file was not kept aside");
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(STATE).unwrap()).expect("state rewritten as valid JSON");
        assert_eq!(v["version"], 1);
    }
    assert!(carma_log().contains("unreadable") && carma_log().contains("starting from an empty state"));
    // A newer build's file (mid-upgrade): never set aside or rewritten, so
    // its holdings stay; CARMA steps are refused saying why, others run.
    wait_released();
    wait_user_jobs_gone();
    let newer = br#"{"version":7,"rr_cursor":0,"reservations":[{"job":999999,"gpu_indices":[0],"estimate_mib":0,"estimate_source":"slurm","exclusive":true,"holding":"slurm_whole","policy":null,"since":1,"holders":[]}],"per_gpu_owner":{"0":999999}}"#;
    std::fs::write(STATE, newer).unwrap();
    let r = user(&["srun", "--carma-mem=1G", "echo", "SHOULD-NOT-RUN"], 60);
    let out = format!("{}{}", r.stdout, r.stderr);
    assert_ne!(r.code, 0, "{out}");
    assert!(out.contains("schema version 7, newer than this build") && !out.contains("SHOULD-NOT-RUN"), "{out}");
    user(&["srun", "true"], 60).ok();
    assert_eq!(std::fs::read(STATE).unwrap(), newer, "the newer state file was changed");
    std::fs::remove_file(STATE).unwrap();
    node_ok();
    report(
        "fault",
        "state file truncated or filled with garbage: set aside with a log line, the node starts empty; of a newer schema version (mid-upgrade): left untouched, CARMA steps refused with the reason, others run",
    );
}

#[test]
fn an_insecure_state_directory_is_refused_with_the_fix() {
    require_cluster();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions("/run/carma", std::fs::Permissions::from_mode(0o777)).unwrap();
    let r = user(&["srun", "--carma-mem=1G", "true"], 60);
    std::fs::set_permissions("/run/carma", std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_ne!(r.code, 0);
    assert!(
        r.stderr.contains("must be owned by uid 0 and writable only by it") && r.stderr.contains("chmod 700"),
        "{}",
        r.stderr
    );
    node_ok();
    report("fault", "state directory world-writable: refused with the chmod fix");
}

/// The first node's GPUs are the NVML stand-in's (tests/cluster.sh): its
/// description file, with `standin: {faults: ...}` for the driver's faults.
fn with_faults(faults: &str) {
    let base: String = std::fs::read_to_string(SIM)
        .unwrap()
        .lines()
        .take_while(|l| !l.starts_with("standin:"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(SIM, format!("{base}standin: {{faults: {faults}}}\n")).unwrap();
}

#[test]
fn a_node_whose_nvml_does_not_load_fails_carma_steps_with_the_reason() {
    require_cluster();
    let _restore = Restore::new(SIM);
    for (fault, needle) in [
        (Some("{init: driver_not_loaded}"), "NVML unavailable (NVIDIA driver is not loaded)"),
        (None, "NVML unavailable ("),
    ] {
        match fault {
            Some(f) => with_faults(f),
            None => std::fs::write(SIM, "gpus: [oops\n").unwrap(),
        }
        let (r, out) = sbatch_wait(&["--carma-mem=1G"], &[], "echo SHOULD-NOT-RUN", 60);
        assert_ne!(r.code, 0);
        assert!(out.contains("carma: this step was not started") && out.contains(needle), "{out}");
        assert!(out.contains("is the NVIDIA driver installed and loaded?"), "{out}");
        assert!(!out.contains("SHOULD-NOT-RUN"));
        user(&["srun", "true"], 30).ok();
        node_ok();
    }
    report(
        "fault",
        "NVML does not load (no driver, broken library): CARMA steps fail with the reason; others run; node not drained",
    );
}

#[test]
fn a_lost_gpu_is_passed_over_and_a_hung_driver_fails_steps_in_bounded_time() {
    require_cluster();
    let _restore = Restore::new(SIM);
    with_faults("{lost: [0, 1, 2]}");
    let r = user(&["srun", "--carma-mem=2G", "--carma-policy=ff", "bash", "-c", "echo \"D=$CARMA_DECISION\""], 60).ok();
    assert!(r.stdout.contains("gpu_indices=3 "), "{}", r.stdout);
    assert!(carma_log().contains("GPU 0: NVML says the GPU is lost"), "no log line for the lost GPU");
    // A driver call that hangs for 60 s: the read gives up at
    // timeouts.gpu_read (3 s) and the step fails with the reason.
    with_faults("{block: {call: memory_info, seconds: 60}}");
    let t = Instant::now();
    let r = user(&["srun", "--carma-mem=2G", "echo", "SHOULD-NOT-RUN"], 60);
    assert!(t.elapsed() < Duration::from_secs(20), "took {:?}", t.elapsed());
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("nvml did not answer within 3000 ms (timeouts.gpu_read)"), "{}", r.stderr);
    assert!(!r.stdout.contains("SHOULD-NOT-RUN"));
    // Jobs CARMA does not place never read the GPUs.
    user(&["srun", "true"], 30).ok();
    node_ok();
    report(
        "fault",
        "NVML: a lost GPU is left out (one log line) and jobs go to the others; a driver call hung for 60 s fails CARMA steps after 3 s; node not drained",
    );
}

#[test]
fn kill_9_of_a_slurmstepd_releases_its_reservation() {
    require_cluster();
    let r = user(
        &["sbatch", "--parsable", "-o", "/dev/null", "--carma-mem=3G", "--wrap", "carma-fakejob --mem 2G --seconds 20"],
        30,
    )
    .ok();
    let job = r.stdout.trim().to_string();
    let start = Instant::now();
    let stepd = loop {
        let p = root(&["pgrep", "-f", &format!("slurmstepd: \\[{job}.batch\\]")], 10);
        if p.code == 0 {
            break p.stdout.trim().to_string();
        }
        assert!(start.elapsed() < Duration::from_secs(30), "job {job} never started");
        std::thread::sleep(Duration::from_millis(200));
    };
    std::thread::sleep(Duration::from_secs(1));
    let status = |_: ()| root(&["carma", "status", "--json"], 20).ok().stdout;
    assert!(status(()).contains(&format!("\"job\": {job}")), "no reservation for job {job}");
    root(&["kill", "-9", &stepd], 10).ok();
    std::thread::sleep(Duration::from_millis(1200));
    // The next placement collects the dead holder's reservation.
    user(&["srun", "--carma-mem=1G", "true"], 60).ok();
    assert!(!status(()).contains(&format!("\"job\": {job}")), "reservation of killed job {job} kept");
    assert!(carma_log().contains(&format!("released job {job} from gpu_indices=")), "release not logged");
    root(&["scancel", &job], 10);
    let _ = root(&["pkill", "-f", "carma-fakejob --mem 2G --seconds 20"], 10);
    assert!(Path::new("/run/carma/state.json").exists());
    node_ok();
    report(
        "fault",
        "kill -9 of a running job's slurmstepd: its reservation is reclaimed at the next placement, with a log line",
    );
}

#[test]
fn slurmd_restart_while_carma_jobs_run() {
    require_cluster();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let r =
            sbatch_wait(&["--carma-mem=3G"], &[], "echo \"$CARMA_DECISION\"\ncarma-fakejob --mem 2G --seconds 8", 120);
        tx.send(()).ok();
        r
    });
    wait_reservations(1);
    // Restart slurmd under the running job (its slurmstepd lives on).
    let pid = std::fs::read_to_string("/run/carma-cluster/slurmd.pid").unwrap();
    root(&["kill", "-TERM", pid.trim()], 10).ok();
    let start = Instant::now();
    while Path::new(&format!("/proc/{}", pid.trim())).exists() {
        assert!(start.elapsed() < Duration::from_secs(20), "slurmd did not stop");
        std::thread::sleep(Duration::from_millis(100));
    }
    let host = root(&["hostname", "-s"], 10).ok().stdout.trim().to_string();
    root(&["slurmd", "-N", &host], 20).ok();
    rx.recv_timeout(Duration::from_secs(120)).expect("job did not finish after slurmd restart");
    let (r, out) = waiter.join().unwrap();
    assert_eq!(r.code, 0, "{out}");
    assert!(out.contains("carma-fakejob: done"), "{out}");
    let v: serde_json::Value = serde_json::from_str(&root(&["carma", "status", "--json"], 20).ok().stdout).unwrap();
    assert_eq!(v["reservations"].as_array().map(Vec::len), Some(0), "reservation kept after the job ended");
    node_ok();
    report("fault", "slurmd restarted while CARMA jobs run: they complete, reservations released, node not drained");
}

/// Unmounts the small tmpfs when dropped.
struct Mounted(&'static str);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0).status();
    }
}

#[test]
fn a_full_state_disk_fails_carma_steps_cleanly_and_keeps_the_old_state() {
    require_cluster();
    const DIR: &str = "/run/carma-full";
    const CONF: &str = "/etc/slurm/carma.yaml";
    std::fs::create_dir_all(DIR).unwrap();
    assert!(
        Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", DIR])
            .status()
            .unwrap()
            .success()
    );
    let _mounted = Mounted(DIR);
    let _conf = Restore::new(CONF);
    let conf = std::fs::read_to_string(CONF).unwrap();
    std::fs::write(CONF, conf.replace("state_dir: /run/carma\n", &format!("state_dir: {DIR}\n"))).unwrap();
    // A first job writes the state there. Its slurmstepd releases, and its
    // epilog runs, after srun returns: wait for both, so that nothing else
    // writes to the small disk while the test fills it.
    let job = user(&["srun", "--carma-mem=1G", "printenv", "SLURM_JOB_ID"], 60).ok().stdout.trim().to_string();
    wait_completed(&job);
    let state = format!("{DIR}/state.json");
    let before = std::fs::read(&state).expect("state written on the small disk");
    // Fill the disk, and check that it stays full (nothing may borrow and
    // give back space in the meantime: see placement/tests/small_disk.rs).
    let _ = Command::new("dd").args(["if=/dev/zero", &format!("of={DIR}/fill"), "bs=4k"]).output();
    let avail = || root(&["stat", "-f", "-c", "%a", DIR], 10).ok().stdout.trim().to_string();
    assert_eq!(avail(), "0", "the disk is not full");
    let (r, out) = sbatch_wait(&["--carma-mem=1G"], &[], "echo SHOULD-NOT-RUN", 60);
    assert_eq!(avail(), "0", "the disk is not full");
    assert_ne!(r.code, 0, "{out}");
    assert!(out.contains("carma: this step was not started") && out.contains("No space left on device"), "{out}");
    assert!(!out.contains("SHOULD-NOT-RUN"));
    // The admin finds the step in carma.log too.
    assert!(
        carma_log().lines().any(|l| l.contains("not placed: job ")
            && l.contains(" step batch: ")
            && l.contains("No space left on device")),
        "no carma.log line for the unplaced batch step"
    );
    assert_eq!(std::fs::read(&state).unwrap(), before, "the old state changed");
    let names: Vec<String> =
        std::fs::read_dir(DIR).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(!names.iter().any(|n| n.contains(".tmp.")), "temp file left behind: {names:?}");
    // Jobs without CARMA do not notice; the node is not drained.
    user(&["srun", "true"], 30).ok();
    node_ok();
    // Space again: CARMA steps run again.
    std::fs::remove_file(format!("{DIR}/fill")).unwrap();
    user(&["srun", "--carma-mem=1G", "true"], 60).ok();
    report(
        "fault",
        "state disk full (64 KiB tmpfs): CARMA steps fail with No space left on device, the old state file is unchanged, no temp file left, others run; with space again CARMA runs",
    );
}

/// Puts node 2's plugstack back however the test ends, and resumes the node
/// if it was drained: the tests after this one need it.
struct RestorePlugstack(String, String);

impl Drop for RestorePlugstack {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.0, &self.1);
        let st = root(&["sinfo", "-h", "-N", "-n", &node2(), "-o", "%T"], 10).stdout;
        if st.contains("drain") || st.contains("drng") || st.contains("down") {
            root(&["scontrol", "update", &format!("nodename={}", node2()), "state=resume"], 20);
        }
    }
}

#[test]
fn a_bad_plugstack_argument_leaves_the_node_up_and_names_itself_in_both_logs() {
    require_cluster();
    let node2 = node2();
    let path = "/etc/slurm/node2/plugstack.conf".to_string();
    let saved = std::fs::read_to_string(&path).unwrap();
    let _restore = RestorePlugstack(path.clone(), saved.clone());
    // An admin's typo: an argument CARMA does not know, on the plugin's line.
    let bad = saved
        .lines()
        .map(|l| if l.contains("carma_spank.so") { format!("{l} confg_typo=1") } else { l.to_string() })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&path, format!("{bad}\n")).unwrap();
    let log_path = format!("/var/log/carma/carma-{node2}.log");
    let before = std::fs::read_to_string(&log_path).unwrap_or_default().len();
    // A job without CARMA options: its prolog and epilog run the plugin.
    let r = user(&["srun", "-p", "multi", "-w", &node2, "printenv", "SLURMD_NODENAME"], 60).ok();
    assert_eq!(r.stdout.trim(), node2);
    // The epilog runs after srun returns: wait for the job to leave the node.
    let start = Instant::now();
    while !root(&["squeue", "-h", "-w", &node2, "-t", "R,CG", "-o", "%i"], 10).stdout.trim().is_empty() {
        assert!(start.elapsed() < Duration::from_secs(30), "the job stayed on {node2}");
        std::thread::sleep(Duration::from_millis(250));
    }
    std::thread::sleep(Duration::from_secs(1));
    let st = root(&["sinfo", "-h", "-N", "-n", &node2, "-o", "%T"], 10).stdout;
    assert!(!st.contains("drain") && !st.contains("drng") && !st.contains("down"), "node {node2} is {st}");
    let carma = std::fs::read_to_string(&log_path).unwrap_or_default();
    let fresh = &carma[before.min(carma.len())..];
    for what in ["job_prolog", "job_epilog"] {
        assert!(
            fresh.lines().any(|l| l.contains(&format!("{what}: plugstack.conf:")) && l.contains("confg_typo")),
            "{log_path} does not name the bad argument in {what}: {fresh}"
        );
    }
    let slurmd = std::fs::read_to_string(format!("/var/log/carma-cluster/slurmd-{node2}.log")).unwrap();
    assert!(
        slurmd.lines().any(|l| l.contains("plugstack.conf:") && l.contains("confg_typo")),
        "slurmd's log does not name it"
    );
    report(
        "fault",
        "a typo in plugstack.conf's arguments: job prolog and epilog log it in slurmd's log and carma.log, skip CARMA's part; node not drained, jobs run",
    );
}
