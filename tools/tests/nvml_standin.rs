//! CARMA's NVML path (nvml-wrapper, the NVML source, GPM sampling in
//! carma-monitor, the dcgm-exporter fallback, bounded reads) run on the
//! NVML stand-in, as on a GPU node: `carma` and `carma-monitor` load
//! nvml-standin's libnvidia-ml.so.1 named by carma.yaml. Each test is its
//! own node: a directory with the library, its GPU description, carma.yaml
//! and state. Their monitors name a Slurm node that does not exist
//! (`monitor.slurm_node`): the host's test cluster may be up, and its node's
//! admission count is not theirs to set.

use carma_placement::source::SimulatedGpus;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const CARMA: &str = env!("CARGO_BIN_EXE_carma");
const MONITOR: &str = env!("CARGO_BIN_EXE_carma-monitor");

/// The built stand-in (target/PROFILE/, or deps/ beside this test).
fn standin_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    for dir in [deps.parent().unwrap(), deps] {
        let lib = dir.join("libnvidia_ml.so");
        if lib.exists() {
            return lib;
        }
    }
    panic!("libnvidia_ml.so not built beside {}: cargo build -p carma-nvml-standin", deps.display());
}

struct Node {
    dir: PathBuf,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Node {
    /// A node whose GPUs are `gpus` (YAML list entries) plus `standin`
    /// (the description's stand-in section) and `config` (carma.yaml lines).
    fn new(tag: &str, gpus: &[&str], standin: &str, config: &str) -> Node {
        let dir =
            std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("carma-nvml-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("procs")).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir(dir.join("state")).unwrap();
        std::fs::set_permissions(dir.join("state"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink(standin_library(), dir.join("libnvidia-ml.so.1")).unwrap();
        let node = Node { dir };
        node.describe(gpus, standin);
        std::fs::write(
            node.dir.join("carma.yaml"),
            format!(
                "gpu_source: {{nvml: {{library: {d}/libnvidia-ml.so.1}}}}\nstate_dir: {d}/state\nlog_file: {d}/carma.log\n{config}",
                d = node.dir.display()
            ),
        )
        .unwrap();
        node
    }

    fn describe(&self, gpus: &[&str], standin: &str) {
        let list: String = gpus.iter().map(|g| format!("  - {g}\n")).collect();
        let text = format!("process_dir: {}/procs\ngpus:\n{list}{standin}", self.dir.display());
        // Written whole (a reader polls the file for changes).
        let tmp = self.dir.join(".sim-gpus.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(tmp, self.dir.join("sim-gpus.yaml")).unwrap();
    }

    fn config(&self) -> String {
        self.dir.join("carma.yaml").display().to_string()
    }

    fn carma(&self, args: &[&str]) -> Output {
        let mut all: Vec<&str> = args.to_vec();
        let cfg = self.config();
        all.extend(["--config", &cfg]);
        Command::new(CARMA).args(&all).env_remove("CARMA_NVML_STANDIN").output().unwrap()
    }

    fn status(&self) -> serde_json::Value {
        let out = self.carma(&["status", "--json"]);
        assert!(out.status.success(), "carma status: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("carma.log")).unwrap_or_default()
    }

    fn sim(&self) -> SimulatedGpus {
        SimulatedGpus::load(&self.dir.join("sim-gpus.yaml")).unwrap()
    }

    fn monitor(&self) -> Child {
        Command::new(MONITOR)
            .args(["--config", &self.config()])
            .env_remove("CARMA_NVML_STANDIN")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// The monitor's publication once it holds `samples` samples.
    fn published(&self, samples: u64) -> serde_json::Value {
        let start = Instant::now();
        loop {
            if let Ok(text) = std::fs::read_to_string(self.dir.join("state/readings.json")) {
                let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                if v["samples"].as_u64().unwrap_or(0) >= samples {
                    return v;
                }
            }
            assert!(start.elapsed() < Duration::from_secs(20), "no publication of {samples} samples: {}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Stops a monitor with SIGTERM, as systemd does; its stderr.
fn stop(mut child: Child) -> String {
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(start.elapsed() < Duration::from_secs(10), "carma-monitor did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    err
}

fn one_line_error(out: &Output) -> String {
    assert!(!out.status.success(), "expected a failure: {}", String::from_utf8_lossy(&out.stdout));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(err.lines().any(|l| l.starts_with("carma")), "no carma line: {err}");
    err
}

/// Long-lived processes to register as GPU processes (registrations of
/// dead pids are ignored, as NVML forgets exited processes).
fn sleepers(n: usize) -> Vec<Child> {
    (0..n).map(|_| Command::new("sleep").arg("60").spawn().unwrap()).collect()
}

fn end(procs: &mut [Child]) {
    for p in procs {
        let _ = p.kill();
        let _ = p.wait();
    }
}

#[test]
fn memory_processes_and_uuids_come_through_nvml_as_the_driver_gives_them() {
    let node = Node::new(
        "read",
        &[
            "{index: 0, uuid: GPU-aaaa, memory_total: 80G}",
            "{index: 1, uuid: GPU-bbbb, memory_total: 80G, memory_used: 2G}",
        ],
        "",
        "",
    );
    // More processes than nvml-wrapper's first buffer: NVML's count query
    // answers Insufficient Size with the count, as the driver does.
    let mut procs = sleepers(40);
    let sim = node.sim();
    for p in &procs {
        sim.allocate(p.id(), &[1], 100, 0.01, 0.02, false).unwrap().unwrap();
    }
    let s = node.status();
    let g = &s["gpus"];
    assert_eq!((g[0]["uuid"].as_str(), g[1]["uuid"].as_str()), (Some("GPU-aaaa"), Some("GPU-bbbb")));
    assert_eq!(g[0]["total_mib"], 81920);
    assert_eq!(g[1]["used_mib"], 2048 + 40 * 100);
    let listed = g[1]["processes"].as_array().unwrap();
    assert_eq!(listed.len(), 40, "{listed:?}");
    assert!(listed.iter().all(|p| p["used_mib"] == 100));
    assert!(g[0]["processes"].as_array().unwrap().is_empty());
    // One-off reads have no GPM: busy time stands in for SM activity.
    assert_eq!((g[1]["busy"].as_f64(), g[1]["sm_activity"].as_f64()), (Some(0.8), Some(0.8)));
    assert!(g[0]["power_w"].as_f64().is_some());
    end(&mut procs);
    assert_eq!(node.status()["gpus"][1]["used_mib"], 2048, "exited processes hold nothing");
}

#[test]
fn device_minor_numbers_come_through_nvml_and_the_monitors_publication() {
    // A node whose driver numbered its device files apart from NVML's
    // indices (/dev/nvidia2 is GPU 0): grants follow the minor number.
    let node = Node::new(
        "minor",
        &["{index: 0, uuid: GPU-aaaa, minor: 2, memory_total: 80G}", "{index: 1, uuid: GPU-bbbb, memory_total: 80G}"],
        "",
        "",
    );
    let g = &node.status()["gpus"];
    assert_eq!((g[0]["minor"].as_u64(), g[1]["minor"].as_u64()), (Some(2), Some(1)));
    let monitor = node.monitor();
    let published = node.published(1);
    stop(monitor);
    let g = &published["gpus"];
    assert_eq!((g[0]["minor"].as_u64(), g[1]["minor"].as_u64()), (Some(2), Some(1)), "{published}");
}

#[test]
fn processes_that_start_between_count_and_copy_are_read_again_then_fail_cleanly() {
    let gpus = ["{index: 0, uuid: GPU-aaaa, memory_total: 40G}"];
    let node = Node::new("race", &gpus, "standin: {faults: {process_race: {extra: 8, times: 2}}}\n", "");
    let mut procs = sleepers(3);
    let sim = node.sim();
    for p in &procs {
        sim.allocate(p.id(), &[0], 512, 0.1, 0.1, false).unwrap().unwrap();
    }
    // Two races: the third try of the list succeeds.
    assert_eq!(node.status()["gpus"][0]["processes"].as_array().unwrap().len(), 3);
    // A list that keeps outgrowing its buffer is a failed read, said once.
    node.describe(&gpus, "standin: {faults: {process_race: {extra: 8, times: 1000}}}\n");
    let err = one_line_error(&node.carma(&["status"]));
    assert!(err.contains("NVML processes of GPU 0") && err.contains("not large enough"), "{err}");
    end(&mut procs);
}

#[test]
fn no_driver_and_a_broken_description_fail_reads_with_one_line() {
    let gpus = ["{index: 0, memory_total: 40G}"];
    let node = Node::new("init", &gpus, "standin: {faults: {init: driver_not_loaded}}\n", "");
    let err = one_line_error(&node.carma(&["status"]));
    assert!(err.contains("NVML unavailable from") && err.contains("is the NVIDIA driver installed"), "{err}");
    node.describe(&gpus, "standin: {profile: v100}\n");
    let err = one_line_error(&node.carma(&["status"]));
    assert!(err.contains("standin.profile: 'v100'") && err.contains("NVML unavailable"), "{err}");
    // No description at all: a node whose driver is not loaded.
    let missing = node.dir.join("missing.yaml");
    let out = Command::new(CARMA)
        .args(["status", "--config", &node.config()])
        .env("CARMA_NVML_STANDIN", &missing)
        .output()
        .unwrap();
    let err = one_line_error(&out);
    assert!(err.contains("the stand-in's driver is not loaded") && err.contains("NVML unavailable"), "{err}");
}

#[test]
fn a_lost_gpu_is_left_out_with_a_log_line_and_the_others_serve() {
    let gpus = ["{index: 0, uuid: GPU-aaaa, memory_total: 40G}", "{index: 1, uuid: GPU-bbbb, memory_total: 40G}"];
    let node = Node::new("lost", &gpus, "standin: {faults: {lost: [0]}}\n", "");
    let s = node.status();
    let indices: Vec<u64> = s["gpus"].as_array().unwrap().iter().map(|g| g["index"].as_u64().unwrap()).collect();
    assert_eq!(indices, vec![1]);
    let out = node.carma(&["place", "--dry-run", "--mem", "4G"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("would place on gpu_indices=1"), "{text}");
    let log = node.log();
    assert!(log.contains("GPU 0: NVML says the GPU is lost"), "{log}");
}

/// A GPU in MIG mode and one whose every NVML call fails are left out,
/// each with one log line, and the others still serve; a GPU the admin left
/// out of gres.conf (carma.yaml's `gpu_indices`) is never placed on.
#[test]
fn gpus_in_mig_mode_in_error_or_not_slurms_are_left_out_and_the_others_serve() {
    let gpus: Vec<String> = (0..4).map(|i| format!("{{index: {i}, uuid: GPU-{i}, memory_total: 40G}}")).collect();
    let gpus: Vec<&str> = gpus.iter().map(String::as_str).collect();
    let node = Node::new("mig", &gpus, "standin: {faults: {mig: [0], error: [1]}}\n", "gpu_indices: [1, 2]\n");
    let indices = |s: serde_json::Value| -> Vec<u64> {
        s["gpus"].as_array().unwrap().iter().map(|g| g["index"].as_u64().unwrap()).collect()
    };
    assert_eq!(indices(node.status()), vec![2]);
    for _ in 0..2 {
        let out = node.carma(&["place", "--dry-run", "--mem", "4G"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("would place on gpu_indices=2"), "{text}");
    }
    let log = node.log();
    assert!(log.contains("GPU 0: in MIG mode, which CARMA does not place on"), "{log}");
    assert!(log.contains("GPU 1: NVML memory info of GPU 1: an internal driver error occurred"), "{log}");
    // Every GPU in error: the read fails, saying why.
    node.describe(&gpus, "standin: {faults: {error: [0, 1, 2, 3]}}\n");
    let err = one_line_error(&node.carma(&["status"]));
    assert!(err.contains("NVML") && err.contains("of GPU 0"), "{err}");
}

/// Under MPS the driver's compute list names the server and only its MPS
/// list names the clients with their memory (NVML documents
/// nvmlDeviceGetMPSComputeRunningProcesses_v3 for "processes with a
/// Multi-Process Service compute context"): CARMA reads both, so the
/// clients' memory reaches their jobs.
#[test]
fn mps_clients_are_read_from_the_mps_list_with_their_memory() {
    let gpus = ["{index: 0, uuid: GPU-aaaa, memory_total: 40G}"];
    let node = Node::new("mpslist", &gpus, "", "");
    let mut procs = sleepers(2);
    let sim = node.sim();
    sim.allocate(procs[0].id(), &[0], 0, 0.0, 0.0, false).unwrap().unwrap();
    sim.allocate(procs[1].id(), &[0], 4096, 0.3, 0.3, true).unwrap().unwrap();
    let s = node.status();
    let listed = s["gpus"][0]["processes"].as_array().unwrap().clone();
    let client = listed.iter().find(|p| p["pid"] == procs[1].id()).unwrap_or_else(|| panic!("{listed:?}"));
    assert_eq!(client["used_mib"], 4096);
    assert!(listed.iter().any(|p| p["pid"] == procs[0].id()), "the server is listed: {listed:?}");
    end(&mut procs);
}

#[test]
fn a_hung_driver_call_fails_the_read_in_bounded_time() {
    let gpus = ["{index: 0, memory_total: 40G}"];
    let node = Node::new(
        "hang",
        &gpus,
        "standin: {faults: {block: {call: memory_info, seconds: 30}}}\n",
        "timeouts: {gpu_read: 1s}\n",
    );
    let t = Instant::now();
    let out = node.carma(&["status"]);
    let err = one_line_error(&out);
    assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
    assert!(err.contains("nvml did not answer within 1000 ms (timeouts.gpu_read)"), "{err}");
}

#[test]
fn the_monitor_publishes_gpm_sm_activity_of_the_h100_profile_within_one_window() {
    let csv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/h100/collocation.csv");
    let node = Node::new(
        "gpm",
        &["{index: 0, uuid: GPU-aaaa, memory_total: 80G}", "{index: 1, uuid: GPU-bbbb, memory_total: 80G}"],
        &format!(
            "standin:\n  profile: h100\n  replay: {{file: {}, gpus: {{0: timeslice/mobilenetv3_32+resnet18_32}}}}\n",
            csv.display()
        ),
        "monitor: {published: true, interval: 200ms, stale_after: 5s, metrics: off, slurm_node: carma-test-no-such-node}\nmonitor_window: 2s\n",
    );
    let mut procs = sleepers(1);
    node.sim().allocate(procs[0].id(), &[1], 4096, 0.3, 0.5, false).unwrap().unwrap();
    let m = node.monitor();
    let p = node.published(4);
    let g = &p["gpus"];
    assert_eq!(p["source"], "nvml");
    let near = |v: &serde_json::Value, want: f64| (v.as_f64().unwrap_or(-1.0) - want).abs() < 0.005;
    // The measured H100 row: SM activity 0.567 while busy 0.99.
    assert!(near(&g[0]["sm_activity"], 0.567) && near(&g[0]["busy"], 0.99), "{g}");
    assert!(near(&g[0]["sm_occupancy"], 0.259), "{g}");
    assert!(near(&g[1]["sm_activity"], 0.3) && near(&g[1]["busy"], 0.5), "{g}");
    // A change of load is what the monitor publishes one window (2 s) later.
    node.sim().allocate(procs[0].id(), &[1], 4096, 0.6, 0.7, false).unwrap().unwrap();
    std::thread::sleep(Duration::from_millis(2600));
    let g = &node.published(4)["gpus"];
    assert!(near(&g[1]["sm_activity"], 0.6), "{g}");
    let err = stop(m);
    assert!(!err.contains("panicked"), "{err}");
    end(&mut procs);
}

#[test]
fn the_monitors_busy_time_is_the_mean_of_what_each_interval_saw() {
    // Each read takes the driver's samples since the previous one. Taking
    // the whole window on each read averaged it twice: on an H100 a job
    // busy 0.93 read 0.58 one window after it started (docs/gpu-checks.md).
    let node = Node::new(
        "busy",
        &["{index: 0, uuid: GPU-aaaa, memory_total: 80G}"],
        "standin:\n  profile: h100\n",
        "monitor: {published: true, interval: 200ms, stale_after: 5s, metrics: off, slurm_node: carma-test-no-such-node}\nmonitor_window: 2s\n",
    );
    let m = node.monitor();
    let idle = node.published(3);
    assert_eq!(idle["gpus"][0]["busy"].as_f64(), Some(0.0), "{idle}");
    let mut procs = sleepers(1);
    node.sim().allocate(procs[0].id(), &[0], 4096, 0.3, 0.9, false).unwrap().unwrap();
    // One window and a little more: every sample in it saw the job.
    std::thread::sleep(Duration::from_millis(2600));
    let g = &node.published(3)["gpus"][0];
    let busy = g["busy"].as_f64().unwrap_or(-1.0);
    assert!((busy - 0.9).abs() < 0.02, "busy {busy} a window after a job busy 0.9 started: {g}");
    let err = stop(m);
    assert!(!err.contains("panicked"), "{err}");
    end(&mut procs);
}

/// A dcgm-exporter: answers every request with `page`.
fn exporter(page: String) -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = write!(
                s,
                "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{page}",
                page.len()
            );
        }
    });
    port
}

#[test]
fn without_gpm_the_a100_profile_reads_sm_activity_from_dcgm_exporter() {
    let gpus = ["{index: 0, uuid: GPU-aaaa, memory_total: 40G, sm_activity: 0.05, busy: 0.9}"];
    let page =
        "# TYPE DCGM_FI_PROF_SM_ACTIVE gauge\nDCGM_FI_PROF_SM_ACTIVE{gpu=\"0\",UUID=\"GPU-aaaa\"} 0.042\n".to_string();
    let port = exporter(page);
    let node = Node::new(
        "a100",
        &gpus,
        "standin: {profile: a100}\n",
        &format!(
            "monitor: {{published: true, interval: 200ms, stale_after: 5s, metrics: off, slurm_node: carma-test-no-such-node, dcgm_exporter: 'http://127.0.0.1:{port}/metrics'}}\nmonitor_window: 2s\n"
        ),
    );
    let m = node.monitor();
    let p = node.published(3);
    assert_eq!(p["source"], "nvml+dcgm-exporter");
    let near = |v: &serde_json::Value, want: f64| (v.as_f64().unwrap_or(-1.0) - want).abs() < 1e-9;
    let g = &p["gpus"][0];
    assert!(near(&g["sm_activity"], 0.042) && near(&g["busy"], 0.9), "{g}");
    stop(m);
    // Without the exporter an A100 has no SM activity reading: busy time
    // stands in (never below it, so the cap errs on the safe side).
    let plain = Node::new(
        "a100plain",
        &gpus,
        "standin: {profile: a100}\n",
        "monitor: {published: true, interval: 200ms, stale_after: 5s, metrics: off, slurm_node: carma-test-no-such-node}\nmonitor_window: 2s\n",
    );
    let m = plain.monitor();
    let p = plain.published(3);
    assert_eq!(p["source"], "nvml");
    assert!(near(&p["gpus"][0]["sm_activity"], 0.9), "{p}");
    assert!(p["gpus"][0]["sm_occupancy"].is_null());
    stop(m);
}

#[test]
fn a_light_pair_replayed_from_the_h100_passes_the_sm_cap_and_fails_the_busy_cap() {
    let csv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/h100/probes.csv");
    let node = Node::new(
        "light",
        &["{index: 0, uuid: GPU-aaaa, memory_total: 80G, memory_used: 3G}"],
        &format!("standin:\n  replay: {{file: {}, gpus: {{0: timeslice/tiny_mlp+tiny_mlp}}}}\n", csv.display()),
        "monitor: {published: true, interval: 200ms, stale_after: 5s, metrics: off, slurm_node: carma-test-no-such-node}\nmonitor_window: 2s\n",
    );
    let m = node.monitor();
    let g = node.published(3)["gpus"][0].clone();
    assert!(g["busy"].as_f64().unwrap() > 0.8 && g["sm_activity"].as_f64().unwrap() < 0.10, "{g}");
    let sm = node.carma(&["place", "--dry-run", "--mem", "4G"]);
    let text = String::from_utf8_lossy(&sm.stdout);
    assert!(text.contains("would place on gpu_indices=0"), "{text}");
    // The same node capping busy time instead.
    let busy_cfg = std::fs::read_to_string(node.config()).unwrap() + "activity_metric: busy\n";
    std::fs::write(node.dir.join("busy.yaml"), busy_cfg).unwrap();
    let out = Command::new(CARMA)
        .args(["place", "--dry-run", "--mem", "4G", "--config", &node.dir.join("busy.yaml").display().to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("would not place now") && text.contains("busy"), "{text}");
    stop(m);
}
