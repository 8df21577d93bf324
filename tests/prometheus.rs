//! The cluster's Prometheus server (Debian's package, started on loopback
//! by tests/cluster.sh on the host) scrapes both nodes' carma-monitor
//! endpoints while CARMA jobs run; its HTTP API has the series for those
//! jobs, with the values `carma status` shows at the same moment
//! (tests/load.rs checks it saw every job of the load rounds). `promtool check metrics` passes on both pages. The Grafana
//! dashboard's queries name only series the monitors export.

mod common;
use common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const N2_CONFIG: &str = "/etc/slurm/node2/carma.yaml";
const PORT: u16 = 9491;

fn http(path: &str, port: u16) -> String {
    let r = root(&["curl", "-s", "--max-time", "5", &format!("http://127.0.0.1:{port}{path}")], 10);
    r.stdout
}

/// Prometheus' answer to an instant query, as it sent it.
fn query_raw(q: &str) -> String {
    let url = format!("http://127.0.0.1:{PORT}/api/v1/query");
    root(&["curl", "-s", "--max-time", "5", "-G", &url, "--data-urlencode", &format!("query={q}")], 10).stdout
}

/// Prometheus' answer to an instant query: (labels, value) per series.
fn query(q: &str) -> Vec<(serde_json::Value, f64)> {
    let v: serde_json::Value = serde_json::from_str(&query_raw(q)).unwrap_or_default();
    v["data"]["result"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| (s["metric"].clone(), s["value"][1].as_str().unwrap_or("nan").parse().unwrap_or(f64::NAN)))
        .collect()
}

#[test]
fn prometheus_scrapes_both_monitors_and_finds_the_jobs_as_carma_status_shows_them() {
    require_cluster();
    // The cluster's Prometheus (tests/cluster.sh, host only) and its scrape
    // configuration, which promtool accepts.
    assert!(
        std::path::Path::new("/run/carma-cluster/prometheus.pid").exists(),
        "no Prometheus in this cluster: tests/cluster.sh starts it on the host (this suite runs there only)"
    );
    let check = Command::new("promtool").args(["check", "config", "/run/carma-cluster/prometheus.yml"]).output();
    assert!(check.is_ok_and(|o| o.status.success()), "promtool rejects the cluster's scrape configuration");
    // The first node's monitor (the second's always runs).
    let host = root(&["hostname", "-s"], 10).ok().stdout.trim().to_string();
    let _monitor = Node1Monitor::start(&host);

    // Both pages pass Prometheus' own lint.
    let start = Instant::now();
    while !http("/metrics", 9402).contains("carma_gpu_memory_used_bytes") {
        assert!(start.elapsed() < Duration::from_secs(10), "the first node's monitor serves nothing");
        std::thread::sleep(Duration::from_millis(200));
    }
    for port in [9402, 9403] {
        let page = http("/metrics", port);
        let mut lint = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut lint.stdin.take().unwrap(), page.as_bytes()).unwrap();
        let out = lint.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "promtool check metrics on :{port}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // CARMA jobs on both nodes, running for a while.
    let node = node2();
    let mut jobs = Vec::new();
    for (i, (target, config)) in
        [("", "/etc/slurm/carma.yaml"), ("", "/etc/slurm/carma.yaml"), ("multi", N2_CONFIG), ("multi", N2_CONFIG)]
            .iter()
            .enumerate()
    {
        let body = format!("carma-fakejob --config {config} --mem {}G --sm 0.2 --seconds 25", 2 + i);
        let name = unique("prom");
        let path = script(&name, &body);
        let out = work_dir().join(format!("{name}.out")).to_string_lossy().into_owned();
        let mem = format!("--carma-mem={}G", 3 + i);
        let mut args = vec!["sbatch", "--parsable", "--carma-policy=magm", mem.as_str(), "-o", out.as_str()];
        if !target.is_empty() {
            args.extend(["-p", target, "-w", node.as_str()]);
        }
        args.push(&path);
        jobs.push(user(&args, 30).ok().stdout.trim().to_string());
    }
    // Prometheus has scraped every job's reservation.
    let start = Instant::now();
    let series = loop {
        let s = query("carma_job_reserved_bytes");
        let seen: Vec<String> = s.iter().filter_map(|(m, _)| m["jobid"].as_str().map(String::from)).collect();
        if jobs.iter().all(|j| seen.contains(j)) {
            break s;
        }
        assert!(start.elapsed() < Duration::from_secs(40), "jobs {jobs:?} not all in Prometheus: {seen:?}");
        std::thread::sleep(Duration::from_millis(500));
    };
    // Its values are what carma status shows: each job's reservation per GPU.
    for (config, instance) in [("/etc/slurm/carma.yaml", "127.0.0.1:9402"), (N2_CONFIG, "127.0.0.1:9403")] {
        let st: serde_json::Value =
            serde_json::from_str(&root(&["carma", "status", "--json", "--config", config], 20).ok().stdout).unwrap();
        for r in st["reservations"].as_array().unwrap() {
            let job = r["job"].to_string();
            for gpu in r["gpu_indices"].as_array().unwrap() {
                let want = r["estimate_mib"].as_f64().unwrap() * 1048576.0;
                let got = series.iter().find(|(m, _)| {
                    m["jobid"].as_str() == Some(job.as_str())
                        && m["gpu"].as_str() == Some(gpu.to_string().as_str())
                        && m["instance"] == instance
                });
                assert_eq!(got.map(|g| g.1), Some(want), "job {job} GPU {gpu} on {instance}: {series:?}");
            }
        }
        // And the GPUs' memory in use, for every GPU of the node.
        for g in st["gpus"].as_array().unwrap() {
            let q = format!("carma_gpu_memory_total_bytes{{instance=\"{instance}\",gpu=\"{}\"}}", g["index"]);
            let got = query(&q);
            assert_eq!(got.first().map(|x| x.1), Some(g["total_mib"].as_f64().unwrap() * 1048576.0), "{q}");
        }
    }
    // Counters and the histogram are scraped too.
    assert!(!query("carma_placements_total").is_empty());
    assert!(query("carma_estimate_accuracy_ratio_bucket").len() >= 2 * 10);

    // Every query of the Grafana dashboard finds series.
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join("slurm-conf-examples/grafana-carma.json")).unwrap())
            .unwrap();
    for panel in dashboard["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"]
                .as_str()
                .unwrap()
                .replace("$instance", ".*")
                .replace("$__rate_interval", "1m")
                .replace("$__range", "5m");
            let answer = query_raw(&expr);
            assert!(answer.contains("\"status\":\"success\""), "panel {}: {expr}: {answer}", panel["title"]);
        }
    }
    for j in &jobs {
        wait_completed(j);
    }
    report(
        "metrics",
        "Prometheus scraped both nodes' monitors; the jobs' series matched carma status; promtool lint passed",
    );
}

fn repo() -> std::path::PathBuf {
    common::repo()
}
