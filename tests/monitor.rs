//! carma-monitor on the real cluster. tests/cluster.sh runs it for the
//! second node, whose carma.yaml says `monitor: {published: true,
//! interval: 250ms, stale_after: 2s}` and `monitor_window: 2s`: placement
//! there reads the published readings and never the GPUs itself: when
//! they go stale, its CARMA steps are refused with the reason. The monitor also records
//! placed jobs' peaks, which their history learns from.

mod common;
use common::*;
use std::time::{Duration, Instant};

const N2_CONFIG: &str = "/etc/slurm/node2/carma.yaml";
const N2_STATE: &str = "/run/carma2";
const MONITOR_PID: &str = "/run/carma-cluster/b/carma-monitor.pid";

fn published() -> serde_json::Value {
    let text = std::fs::read_to_string(format!("{N2_STATE}/readings.json")).unwrap_or_default();
    serde_json::from_str(&text).unwrap_or_default()
}

/// Restarts the monitor however the test ends.
struct MonitorBack;
impl Drop for MonitorBack {
    fn drop(&mut self) {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/cluster.sh");
        root(&[script, "start-monitor"], 30);
    }
}

#[test]
fn published_readings_are_window_means_and_placement_uses_them() {
    require_cluster();
    let status = root(&["carma", "status", "--config", N2_CONFIG], 20).ok().stdout;
    assert!(status.contains("monitor: readings ") && status.contains("(nvml, "), "{status}");
    // A busy job on the second node: its SM activity reaches the published
    // mean over the 2 s window, sample by sample.
    let body = format!(
        "echo \"GPU $SLURM_STEP_GPUS\"\ncarma-fakejob --config {N2_CONFIG} --mem 2G --sm 0.95 --busy 1.0 --seconds 8"
    );
    let name = unique("mon");
    let path = script(&name, &body);
    let out = work_dir().join(format!("{name}.out")).to_string_lossy().into_owned();
    let node = node2();
    let args =
        ["sbatch", "--parsable", "-p", "multi", "-w", &node, "--gres=shard:1", "--carma-mem=2G", "-o", &out, &path];
    let job = user(&args, 30).ok().stdout.trim().to_string();
    let start = Instant::now();
    let mut seen = Vec::new();
    let gpu = loop {
        let p = published();
        let busy: Vec<(u64, f64)> = p["gpus"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|g| (g["index"].as_u64().unwrap_or(0), g["sm_activity"].as_f64().unwrap_or(0.0)))
            .filter(|(_, sm)| *sm > 0.0)
            .collect();
        if let Some(&(i, sm)) = busy.first() {
            seen.push(sm);
            if sm >= 0.94 {
                break i;
            }
        }
        assert!(start.elapsed() < Duration::from_secs(20), "published SM activity never reached 0.95: {seen:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    // Means over the window: it rose through values below the job's own.
    assert!(seen.iter().any(|&s| s < 0.9), "no intermediate mean: {seen:?}");
    assert!(published()["samples"].as_u64().unwrap_or(0) >= 4, "{}", published());
    // The placement code, on the published readings, refuses that GPU: on
    // its activity, at least the reading (the job may still count on top
    // while the published window has not seen all of it).
    let dry = root(&["carma", "place", "--dry-run", "--config", N2_CONFIG, "--mem", "1G", "--policy", "ff"], 20).ok();
    let refused = format!("GPU{gpu}: no: SM activity ");
    let value = dry.stdout.split(&refused).nth(1).and_then(|rest| rest.split_whitespace().next()?.parse::<f64>().ok());
    assert!(value.is_some_and(|v| v >= 0.9), "{}", dry.stdout);
    wait_completed(&job);
}

#[test]
fn the_monitor_records_peaks_that_a_jobs_next_run_learns_from() {
    require_cluster();
    // A transparent job (partition multi is a scope; its default is 4G)
    // using 3G, alone on the second node: no other placement there samples
    // its use, so only the monitor can see its peak.
    let node = node2();
    let name = unique("peak");
    let body = format!("echo \"DECISION $CARMA_DECISION\"\ncarma-fakejob --config {N2_CONFIG} --mem 3G --seconds 3");
    let path = script(&name, &body);
    let run = || {
        let out = work_dir().join(format!("{}.out", unique("peak"))).to_string_lossy().into_owned();
        let args = ["sbatch", "--parsable", "-J", &name, "-p", "multi", "-w", &node, "--gres=gpu:1", "-o", &out, &path];
        let job = user(&args, 30).ok().stdout.trim().to_string();
        wait_completed(&job);
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        text.lines().find_map(|l| l.strip_prefix("DECISION ")).unwrap_or_default().to_string()
    };
    let first = run();
    assert!(first.contains("estimate=4096M source=scope_default"), "{first}");
    // The same job again: its observed peak (3072 MiB) + 10 % is its estimate.
    let second = run();
    assert!(second.contains(&format!("estimate={}M source=history", 3072 + 307)), "{second}");
}

#[test]
fn a_stopped_monitor_is_reported_and_carma_steps_fail_closed_with_the_reason() {
    require_cluster();
    let _back = MonitorBack;
    let pid = std::fs::read_to_string(MONITOR_PID).unwrap();
    root(&["kill", pid.trim()], 10).ok();
    let _ = std::fs::remove_file(format!("{N2_STATE}/monitor.stale"));
    std::thread::sleep(Duration::from_millis(2500));
    let status = root(&["carma", "status", "--config", N2_CONFIG], 20).ok().stdout;
    assert!(status.contains("monitor: STALE: ") && status.contains("s old"), "{status}");
    assert!(status.contains("CARMA steps are refused"), "{status}");
    // CARMA steps are refused with the reason, never placed on a read of
    // the driver in slurmstepd; the log says so once.
    let node = node2();
    let r =
        user(&["srun", "-p", "multi", "-w", &node, "--gres=shard:1", "--carma-mem=1G", "echo", "SHOULD-NOT-RUN"], 60);
    let out = format!("{}{}", r.stdout, r.stderr);
    assert_ne!(r.code, 0, "{out}");
    assert!(!out.contains("SHOULD-NOT-RUN"), "{out}");
    assert!(out.contains("readings are not usable") && out.contains("readings.json is "), "{out}");
    let log = std::fs::read_to_string(format!("/var/log/carma/carma-{node}.log")).unwrap_or_default();
    let line = log.lines().rev().find(|l| l.contains("readings are not usable")).unwrap_or_default();
    assert!(line.contains("CARMA steps are refused until it publishes again"), "{line}");
    assert!(!log.contains("reading the GPUs directly"), "{log}");
    report("monitor", "carma-monitor stopped: status says stale, CARMA steps refused with the reason, no driver read");
}
