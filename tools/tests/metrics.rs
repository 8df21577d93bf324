//! carma-monitor's metrics endpoint, on the NVML stand-in: what it serves
//! matches `carma status`, and hostile clients (slow senders, a huge
//! request, many connections) neither stall sampling nor the endpoint. The
//! monitor names a Slurm node that does not exist (`monitor.slurm_node`):
//! the host's test cluster may be up, and its node's admission count is not
//! this test's to set.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CARMA: &str = env!("CARGO_BIN_EXE_carma");
const MONITOR: &str = env!("CARGO_BIN_EXE_carma-monitor");

fn standin_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [deps.parent().unwrap(), deps]
        .iter()
        .map(|d| d.join("libnvidia_ml.so"))
        .find(|l| l.exists())
        .expect("libnvidia_ml.so not built: cargo build -p carma-nvml-standin")
}

/// A free loopback port (bound, then let go), never one already handed to
/// another test of this process (the kernel may offer a let-go port again).
fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap();
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

struct Node {
    dir: PathBuf,
    port: u16,
    monitor: Child,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.monitor.kill();
        let _ = self.monitor.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn node(tag: &str) -> Node {
    let dir =
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("carma-metrics-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for d in ["", "state", "procs"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
        std::fs::set_permissions(dir.join(d), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::os::unix::fs::symlink(standin_library(), dir.join("libnvidia-ml.so.1")).unwrap();
    std::fs::write(
        dir.join("sim-gpus.yaml"),
        format!(
            "process_dir: {}/procs\ngpus:\n  - {{index: 0, uuid: GPU-m0, memory_total: 40G, memory_used: 3G, sm_activity: 0.2, busy: 0.4}}\n  - {{index: 1, uuid: GPU-m1, memory_total: 40G}}\n",
            dir.display()
        ),
    )
    .unwrap();
    let port = free_port();
    std::fs::write(
        dir.join("carma.yaml"),
        format!(
            "gpu_source: {{nvml: {{library: {d}/libnvidia-ml.so.1}}}}\nstate_dir: {d}/state\nlog_file: {d}/carma.log\n\
             monitor: {{published: true, interval: 200ms, stale_after: 5s, metrics: '127.0.0.1:{port}', slurm_node: carma-test-no-such-node}}\nmonitor_window: 2s\n",
            d = dir.display()
        ),
    )
    .unwrap();
    let monitor = Command::new(MONITOR)
        .args(["--config", &dir.join("carma.yaml").display().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let n = Node { dir, port, monitor };
    let start = Instant::now();
    while get(n.port, "/metrics").is_err()
        || !get(n.port, "/metrics").unwrap().1.contains("carma_gpu_memory_used_bytes{")
    {
        assert!(start.elapsed() < Duration::from_secs(10), "no metrics: {}", n.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    n
}

impl Node {
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("carma.log")).unwrap_or_default()
    }
    fn written_ms(&self) -> u64 {
        let text = std::fs::read_to_string(self.dir.join("state/readings.json")).unwrap_or_default();
        serde_json::from_str::<serde_json::Value>(&text).unwrap_or_default()["written_ms"].as_u64().unwrap_or(0)
    }
}

/// (status line, body) of one GET, bounded in time.
fn get(port: u16, path: &str) -> Result<(String, String), String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| e.to_string())?;
    let (head, body) = text.split_once("\r\n\r\n").ok_or("no header end")?;
    Ok((head.lines().next().unwrap_or("").to_string(), body.to_string()))
}

fn value(page: &str, series: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no {series} in:\n{page}"))
        .parse()
        .unwrap()
}

#[test]
fn the_page_matches_carma_status_and_only_get_metrics_is_served() {
    let n = node("match");
    let (status, page) = get(n.port, "/metrics").unwrap();
    assert_eq!(status, "HTTP/1.1 200 OK");
    let out = Command::new(CARMA)
        .args(["status", "--json", "--config", &n.dir.join("carma.yaml").display().to_string()])
        .output()
        .unwrap();
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for g in st["gpus"].as_array().unwrap() {
        let labels = format!("{{gpu=\"{}\",uuid=\"{}\"}}", g["index"], g["uuid"].as_str().unwrap());
        let mib = |k: &str| g[k].as_f64().unwrap() * 1024.0 * 1024.0;
        assert_eq!(value(&page, &format!("carma_gpu_memory_total_bytes{labels}")), mib("total_mib"));
        assert_eq!(value(&page, &format!("carma_gpu_memory_used_bytes{labels}")), mib("used_mib"));
        assert_eq!(value(&page, &format!("carma_gpu_memory_effective_free_bytes{labels}")), mib("effective_free_mib"));
        assert!(
            (value(&page, &format!("carma_gpu_sm_activity_ratio{labels}")) - g["sm_activity"].as_f64().unwrap()).abs()
                < 1e-6
        );
    }
    assert!(page.contains("carma_monitor_info{node=\""), "{page}");
    assert_eq!(get(n.port, "/").unwrap().0, "HTTP/1.1 200 OK");
    assert_eq!(get(n.port, "/admin").unwrap().0, "HTTP/1.1 404 Not Found");
    let mut s = TcpStream::connect(("127.0.0.1", n.port)).unwrap();
    write!(s, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 405"), "{text}");
}

#[test]
fn failed_reads_show_on_the_page_while_they_fail() {
    let n = node("errors");
    let page = get(n.port, "/metrics").unwrap().1;
    assert_eq!(value(&page, "carma_monitor_read_errors_total"), 0.0);
    // Every process list now outgrows its buffer: each read fails.
    let text = std::fs::read_to_string(n.dir.join("sim-gpus.yaml")).unwrap();
    let tmp = n.dir.join(".faulty");
    std::fs::write(&tmp, format!("{text}standin: {{faults: {{process_race: {{extra: 8, times: 1000000}}}}}}\n"))
        .unwrap();
    std::fs::rename(&tmp, n.dir.join("sim-gpus.yaml")).unwrap();
    // A process on each GPU, so that NVML has a list to copy on both: a GPU
    // whose calls fail is left out, and the read fails once none is left.
    let mut holder = Command::new("sleep").arg("30").spawn().unwrap();
    let entry = format!(
        "{{\"pid\":{},\"gpus\":[{{\"index\":0,\"used_mib\":100,\"sm\":0.1}},{{\"index\":1,\"used_mib\":100,\"sm\":0.1}}]}}",
        holder.id()
    );
    std::fs::write(n.dir.join(format!("procs/{}.json", holder.id())), entry).unwrap();
    let start = Instant::now();
    loop {
        let page = get(n.port, "/metrics").unwrap().1;
        if value(&page, "carma_monitor_read_errors_total") >= 2.0 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "read errors never shown:\n{page}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = holder.kill();
    let _ = holder.wait();
}

#[test]
fn slow_huge_and_many_clients_stall_neither_sampling_nor_the_endpoint() {
    let n = node("hostile");
    // A huge request is refused once it passes 8 KiB.
    let mut s = TcpStream::connect(("127.0.0.1", n.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.write_all(format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(1 << 20)).as_bytes());
    let mut huge = String::new();
    let _ = s.read_to_string(&mut huge);
    assert!(huge.starts_with("HTTP/1.1 431"), "{:?}", &huge[..huge.len().min(80)]);
    // Slowloris: more connections than the endpoint allows, each sending a
    // byte now and then and never finishing its request; and 200
    // connections opened and dropped at once.
    let mut slow: Vec<TcpStream> = (0..20).filter_map(|_| TcpStream::connect(("127.0.0.1", n.port)).ok()).collect();
    let burst: Vec<_> = (0..200).filter_map(|_| TcpStream::connect(("127.0.0.1", n.port)).ok()).collect();
    drop(burst);
    let before = n.written_ms();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(1500) {
        for s in &mut slow {
            let _ = s.write_all(b"G");
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    // Sampling went on: the publication moved on by ~7 intervals.
    let after = n.written_ms();
    assert!(after >= before + 1000, "sampling stalled: {before} -> {after}");
    // The slow senders are cut off 2 s after they connected; then a scrape
    // is answered.
    let start = Instant::now();
    let answered = loop {
        if let Ok((status, page)) = get(n.port, "/metrics") {
            break (status, page);
        }
        assert!(start.elapsed() < Duration::from_secs(5), "the endpoint did not recover");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(answered.0, "HTTP/1.1 200 OK");
    assert!(answered.1.contains("carma_monitor_reads_total"));
    assert!(start.elapsed() < Duration::from_secs(3), "took {:?}", start.elapsed());
    drop(slow);
}
