//! carma-monitor's work: sample every GPU each `monitor.interval`, keep the
//! samples of the last `monitor_window`, and publish their means (SM
//! activity, busy time) with the latest memory, processes and power in
//! `state_dir/readings.json` for placement and `carma status`. It also
//! raises placed jobs' observed peaks in the node state as it sees them,
//! which is what their history (`source=history`) remembers.

use carma_config::Config;
use carma_placement::GpuReading;
use carma_placement::source::published::{self, Published};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One sample's readings: per GPU index, SM activity and busy.
type Readings = Vec<(u32, f64, f64)>;

/// The samples of one window.
pub struct Window {
    span: Duration,
    samples: VecDeque<(Instant, Readings)>,
}

impl Window {
    pub fn new(span: Duration) -> Window {
        Window { span, samples: VecDeque::new() }
    }

    pub fn push(&mut self, at: Instant, gpus: &[GpuReading]) {
        self.samples.push_back((at, gpus.iter().map(|g| (g.index, g.sm_activity, g.busy)).collect()));
        while self.samples.front().is_some_and(|(t, _)| at.duration_since(*t) > self.span) {
            self.samples.pop_front();
        }
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// `latest` with SM activity and busy time replaced by their means over
    /// the window (per GPU index; a GPU that appeared mid-window is
    /// averaged over the samples that have it).
    pub fn means(&self, latest: &[GpuReading]) -> Vec<GpuReading> {
        latest
            .iter()
            .map(|g| {
                let (mut sm, mut busy, mut n) = (0.0, 0.0, 0u32);
                for (_, gpus) in &self.samples {
                    if let Some((_, s, b)) = gpus.iter().find(|(i, _, _)| *i == g.index) {
                        sm += s;
                        busy += b;
                        n += 1;
                    }
                }
                let mut out = g.clone();
                if n > 0 {
                    out.sm_activity = sm / f64::from(n);
                    out.busy = busy / f64::from(n);
                }
                out
            })
            .collect()
    }
}

/// Samples and publishes until `stop` is set (or once). Errors reading the
/// GPUs are logged when they change and sampling goes on: meanwhile the
/// publication ages, and placement falls back to direct reads once it is
/// stale. Fails only when the GPU source cannot be opened at all.
pub fn run(cfg: &Config, stop: &AtomicBool, once: bool, log: fn(&str)) -> Result<(), String> {
    // Checks (and creates) the root-owned state directory; the placer
    // records placed jobs' peaks as the monitor sees them.
    let placer = carma_placement::Placer::from_config(cfg, log).map_err(|e| e.to_string())?;
    let mut source = carma_placement::open_monitored(cfg, log).map_err(|e| e.to_string())?;
    let interval = cfg.monitor.interval;
    log(&format!(
        "carma-monitor: sampling {} every {} ms, window {} s, publishing {}",
        source.name(),
        interval.as_millis(),
        cfg.monitor_window.as_secs(),
        published::path(&cfg.state_dir).display()
    ));
    let mut window = Window::new(cfg.monitor_window);
    let mut last_error: Option<String> = None;
    let mut next = Instant::now();
    // The node's admission count in slurmctld (only where its Slurm node
    // has the admission GRES: docs/admission.md), kept by a thread of its
    // own: scontrol waits up to 10 s on an unreachable slurmctld, which
    // must not delay sampling.
    let node = cfg.monitor.node_name();
    let admissible: Arc<Mutex<Option<u64>>> = Arc::new(Mutex::new(None));
    if !once {
        let bin_dir = cfg.slurm_bin_dir.clone();
        let state_dir = cfg.state_dir.clone();
        spawn_admission(node.clone(), bin_dir, state_dir, cfg.monitor.admission_interval, admissible.clone(), log);
    }
    // The metrics endpoint serves the page rendered after each sample.
    let page = crate::http::Page::default();
    let mut stats = crate::metrics::MonitorStats::default();
    // The last publication: on a failed read the page is rendered again
    // from it, so the error count and the age show while reads fail.
    let mut last: Option<Published> = None;
    if let (Some(addr), false) = (cfg.monitor.metrics, once) {
        match crate::http::serve(addr, page.clone(), log) {
            Ok(bound) => log(&format!("carma-monitor: metrics at http://{bound}/metrics")),
            // Sampling and placement go on without the endpoint.
            Err(e) => log(&format!("carma-monitor: metrics not served: {e} (carma.yaml monitor.metrics)")),
        }
    }
    while !stop.load(Ordering::SeqCst) {
        stats.reads += 1;
        match source.read() {
            Ok(gpus) => {
                let now = Instant::now();
                window.push(now, &gpus);
                let p = Published {
                    written_ms: carma_placement::clock::now_ms(),
                    interval_ms: interval.as_millis() as u64,
                    window_ms: cfg.monitor_window.as_millis() as u64,
                    source: source.name().to_string(),
                    samples: window.len() as u32,
                    gpus: window.means(&gpus),
                };
                let result = published::publish(&cfg.state_dir, &p)
                    .map_err(|e| format!("cannot publish: {e}"))
                    .and_then(|()| placer.observe_peaks(&gpus).map_err(|e| format!("cannot record peaks: {e}")));
                note(&mut last_error, result.err(), log);
                // A state that cannot be read was said above (peaks).
                if let Ok(gib) = placer.admissible_gib(&p.gpus) {
                    *admissible.lock().unwrap_or_else(|p| p.into_inner()) = Some(gib);
                }
                stats.last_read_s = p.written_ms as f64 / 1000.0;
                if let Ok(st) = placer.state() {
                    page.set(crate::metrics::render(&node, &p, &st, &stats));
                }
                last = Some(p);
            }
            Err(e) => {
                stats.read_errors += 1;
                note(&mut last_error, Some(format!("cannot read the GPUs: {e}")), log);
                if let (Some(p), Ok(st)) = (&last, placer.state()) {
                    page.set(crate::metrics::render(&node, p, &st, &stats));
                }
            }
        }
        if once {
            break;
        }
        next += interval;
        let now = Instant::now();
        if next < now {
            next = now; // fell behind (a slow read): no burst to catch up
        }
        while !stop.load(Ordering::SeqCst) && Instant::now() < next {
            std::thread::sleep((next - Instant::now()).min(Duration::from_millis(100)));
        }
    }
    log("carma-monitor: stopped");
    Ok(())
}

/// Sets the node's admission count every `every` to the latest admissible
/// GiB the sampling loop left in `latest`, for the life of the process.
fn spawn_admission(
    node: String,
    bin_dir: Option<std::path::PathBuf>,
    state_dir: std::path::PathBuf,
    every: Duration,
    latest: Arc<Mutex<Option<u64>>>,
    log: fn(&str),
) {
    let mut admission = crate::admission::Admission::new(node, bin_dir);
    let mut last_error: Option<String> = None;
    let spawned = std::thread::Builder::new().name("carma-admission".into()).spawn(move || {
        loop {
            let Some(gib) = *latest.lock().unwrap_or_else(|p| p.into_inner()) else {
                // No reading yet.
                std::thread::sleep(Duration::from_millis(100));
                continue;
            };
            let jobs_changed = carma_placement::jobfiles::jobs_changed_at(&state_dir);
            match admission.sync(gib, jobs_changed).map_err(|e| format!("admission count: {e}")) {
                Ok(change) => {
                    if let Some(change) = change {
                        log(&format!("carma-monitor: {change}"));
                    }
                    last_error = None;
                }
                // Said once per distinct failure: slurmctld may be down
                // for a while.
                Err(e) if last_error.as_ref() != Some(&e) => {
                    log(&format!("carma-monitor: {e}"));
                    last_error = Some(e);
                }
                Err(_) => {}
            }
            std::thread::sleep(every);
        }
    });
    if let Err(e) = spawned {
        log(&format!("carma-monitor: cannot start the admission thread ({e}); the node's count is not kept"));
    }
}

/// Logs an error when it first appears or changes, and the recovery.
fn note(last: &mut Option<String>, now: Option<String>, log: fn(&str)) {
    if now != *last {
        match &now {
            Some(e) => log(&format!("carma-monitor: {e}")),
            None => log("carma-monitor: readings published again"),
        }
        *last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, sm: f64, busy: f64) -> GpuReading {
        GpuReading {
            index,
            uuid: format!("GPU-{index}"),
            minor: None,
            total_mib: 1000,
            used_mib: 10,
            sm_activity: sm,
            busy,
            processes: vec![],
            power_w: None,
            mps_uid: None,
            sm_occupancy: None,
            mps_server_pid: None,
        }
    }

    #[test]
    fn means_cover_the_window_only() {
        let t0 = Instant::now();
        let mut w = Window::new(Duration::from_secs(10));
        w.push(t0, &[gpu(0, 0.9, 1.0)]);
        w.push(t0 + Duration::from_secs(5), &[gpu(0, 0.3, 0.5), gpu(1, 0.2, 0.2)]);
        let m = w.means(&[gpu(0, 0.3, 0.5), gpu(1, 0.2, 0.2)]);
        assert!((m[0].sm_activity - 0.6).abs() < 1e-9 && (m[0].busy - 0.75).abs() < 1e-9, "{m:?}");
        assert!((m[1].sm_activity - 0.2).abs() < 1e-9, "a GPU new in the window: its own samples");
        // 11 s after the first sample it has left the window.
        w.push(t0 + Duration::from_secs(11), &[gpu(0, 0.0, 0.0), gpu(1, 0.2, 0.2)]);
        assert_eq!(w.len(), 2);
        let m = w.means(&[gpu(0, 0.0, 0.0)]);
        assert!((m[0].sm_activity - 0.15).abs() < 1e-9, "{m:?}");
        assert_eq!(m[0].used_mib, 10, "memory is the latest sample's");
    }

    #[test]
    fn one_round_publishes_what_the_source_reads() {
        let d = std::env::temp_dir().join(format!("carma-monitor-test-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let gpus = d.join("gpus.yaml");
        std::fs::write(&gpus, "gpus:\n  - {index: 0, uuid: GPU-m, memory_total: 16G}\n").unwrap();
        let state = d.join("state");
        let cfg = Config {
            state_dir: state.clone(),
            gpu_source: carma_config::GpuSource::Simulated(gpus),
            ..Config::default()
        };
        run(&cfg, &AtomicBool::new(false), true, |_| {}).unwrap();
        let p = published::fresh(&state, Duration::from_secs(10)).unwrap();
        assert_eq!((p.gpus[0].uuid.as_str(), p.gpus[0].total_mib, p.samples), ("GPU-m", 16384, 1));
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Serves each of `replies` to one HTTP request, in order, on 127.0.0.1.
    fn exporter(replies: Vec<String>) -> (u16, std::thread::JoinHandle<()>) {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            for reply in replies {
                let (mut s, _) = l.accept().unwrap();
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.ends_with(b"\r\n\r\n") {
                    let n = s.read(&mut buf).unwrap();
                    assert!(n > 0, "request cut short");
                    req.extend_from_slice(&buf[..n]);
                }
                assert!(req.starts_with(b"GET /metrics HTTP/1.0\r\n"), "{}", String::from_utf8_lossy(&req));
                s.write_all(reply.as_bytes()).unwrap();
            }
        });
        (port, server)
    }

    static LOG: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

    /// GPUs without GPM (A100s): SM activity and occupancy come from the
    /// node's dcgm-exporter, memory from the GPU source. A scrape that fails
    /// or lacks the field publishes nothing and says why.
    #[test]
    fn sm_readings_come_from_a_dcgm_exporter_where_configured() {
        let d = std::env::temp_dir().join(format!("carma-monitor-dcgm-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let gpus = d.join("gpus.yaml");
        std::fs::write(&gpus, "gpus:\n  - {index: 0, uuid: GPU-m, memory_total: 16G}\n").unwrap();
        let ok = |body: &str| format!("HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n{body}");
        let page = "DCGM_FI_PROF_SM_ACTIVE{gpu=\"0\",UUID=\"GPU-m\",device=\"nvidia0\"} 0.37\n\
                    DCGM_FI_PROF_SM_OCCUPANCY{gpu=\"0\",UUID=\"GPU-m\",device=\"nvidia0\"} 0.21\n";
        let (port, server) = exporter(vec![
            ok(page),
            "HTTP/1.0 500 Internal Server Error\r\n\r\n".into(),
            ok("DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-m\"} 92\n"),
        ]);
        let mut cfg = Config {
            state_dir: d.join("state"),
            gpu_source: carma_config::GpuSource::Simulated(gpus),
            ..Config::default()
        };
        cfg.monitor.dcgm_exporter =
            Some(carma_config::HttpEndpoint::parse(&format!("http://127.0.0.1:{port}/metrics")).unwrap());
        let log: fn(&str) = |m| LOG.lock().unwrap().push(m.to_string());
        run(&cfg, &AtomicBool::new(false), true, log).unwrap();
        let p = published::fresh(&cfg.state_dir, Duration::from_secs(10)).unwrap();
        assert_eq!(p.source, "simulated+dcgm-exporter");
        assert_eq!((p.gpus[0].sm_activity, p.gpus[0].sm_occupancy, p.gpus[0].total_mib), (0.37, Some(0.21), 16384));
        for want in
            ["the reply is 'HTTP/1.0 500 Internal Server Error'", "publishes no DCGM_FI_PROF_SM_ACTIVE for GPU 0"]
        {
            let _ = std::fs::remove_file(published::path(&cfg.state_dir));
            run(&cfg, &AtomicBool::new(false), true, log).unwrap();
            assert!(published::fresh(&cfg.state_dir, Duration::from_secs(10)).is_err(), "published despite: {want}");
            let logged = LOG.lock().unwrap().join("\n");
            assert!(logged.contains(want), "{logged}");
        }
        // Nothing listens: refused at once, not a hang. Port 1, not the
        // exporter's old one, which a test beside this one may bind.
        server.join().unwrap();
        cfg.monitor.dcgm_exporter = Some(carma_config::HttpEndpoint::parse("http://127.0.0.1:1/metrics").unwrap());
        let t = Instant::now();
        run(&cfg, &AtomicBool::new(false), true, log).unwrap();
        assert!(LOG.lock().unwrap().join("\n").contains("cannot connect"));
        assert!(t.elapsed() < Duration::from_secs(3));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
