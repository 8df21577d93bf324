//! carma.yaml read and validated: defaults, every section, and the
//! one-line errors.

use super::{
    Config, ConfigError, EstimatorConfig, EstimatorMethod, GpuSource, HttpEndpoint, LearnRuntime, NoFitAction,
    RecoveryMode, UnknownEstimate,
};
use crate::activity::ActivityMetric;
use crate::policy::Policy;
use crate::scope::{JobScopeFacts, Scope};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("/etc/slurm/carma.yaml"))
}

/// The example admins copy must stay valid and say what the defaults are.
#[test]
fn the_example_carma_yaml_is_valid_and_states_the_defaults() {
    let c = parse(include_str!("../../../slurm-conf-examples/carma.yaml")).unwrap();
    let d = Config::default();
    assert_eq!(
        (c.default_policy, c.sm_activity_cap, c.headroom_mib, c.state_dir, c.estimator, c.timeouts),
        (d.default_policy, d.sm_activity_cap, d.headroom_mib, d.state_dir, d.estimator, d.timeouts)
    );
}

#[test]
fn estimator_section() {
    let c = parse("estimator:\n  runtime: 1G\n  method: gpumemnet\n").unwrap();
    assert_eq!(
        c.estimator,
        EstimatorConfig {
            runtime_mib: 1024,
            method: EstimatorMethod::Gpumemnet,
            learn_runtime: LearnRuntime::default()
        }
    );
    let c = parse("estimator:\n  learn_runtime: {min_jobs: 3, window: 3, quantile: 1, max: 2G}\n").unwrap();
    let l = c.estimator.learn_runtime;
    assert_eq!((l.min_jobs, l.window, l.quantile, l.max_mib), (3, 3, 1.0, 2048));
    for (yaml, key) in [
        ("{window: 0}", "learn_runtime.window: 0 is out of range"),
        ("{min_jobs: 9, window: 4}", "learn_runtime.min_jobs: 9 is more than window"),
        ("{quantile: 0.2}", "learn_runtime.quantile: 0.2 is out of range"),
        ("{max: 100G}", "learn_runtime.max: more than 64G"),
        ("{max: lots}", "learn_runtime.max"),
    ] {
        let e = parse(&format!("estimator:\n  learn_runtime: {yaml}\n")).unwrap_err().to_string();
        assert!(e.contains(key) && !e.contains('\n'), "{yaml}: {e}");
    }
    assert!(parse("estimator:\n  learn_runtime: {minjobs: 3}\n").is_err());
    let e = parse("estimator:\n  method: magic\n").unwrap_err().to_string();
    assert!(e.contains("estimator.method: 'magic' is unknown"), "{e}");
    let e = parse("estimator:\n  runtime: lots\n").unwrap_err().to_string();
    assert!(e.contains("estimator.runtime") && e.contains("2G"), "{e}");
    assert!(parse("estimator:\n  runtme: 1G\n").is_err());
}

#[test]
fn the_capped_reading_is_named() {
    let c = parse("activity_metric: busy\nbusy_cap: 0.9\n").unwrap();
    assert_eq!((c.activity_metric, c.busy_cap, c.sm_activity_cap), (ActivityMetric::Busy, 0.9, 0.80));
    assert_eq!(parse("").unwrap().activity_metric, ActivityMetric::Sm);
    let e = parse("activity_metric: utilization\n").unwrap_err().to_string();
    assert!(e.contains("activity_metric: unknown metric 'utilization'") && e.contains("sm (SM activity)"), "{e}");
}

/// Root refuses a carma.yaml, NVML library or log file a user could
/// write, in one line naming the path and the fix; it says which file
/// it read, or that there was none.
#[test]
fn root_refuses_files_users_could_write() {
    if !crate::ownership::running_as_root() {
        return println!("not root: the check applies to root only; skipped");
    }
    let dir = |base: &str| {
        let d = PathBuf::from(format!("{base}/carma-cfgtest-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        d
    };
    let (good, tmp) = (dir("/run"), dir("/tmp"));
    // A world-writable directory without the sticky bit (unlike /tmp,
    // where root's own directory is judged on its own).
    let open = tmp.join("open");
    std::fs::create_dir_all(&open).unwrap();
    std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let bad = format!("{} is writable by every user", open.display());
    let write = |p: &Path, text: &str| std::fs::write(p, text).unwrap();
    // Even a root-owned 0644 file there.
    write(&open.join("carma.yaml"), "");
    let e = Config::load(&open.join("carma.yaml")).unwrap_err().to_string();
    assert!(e.contains(&bad) && e.contains("chmod go-w") && !e.contains('\n'), "{e}");
    // Root's own 0755 directory under /tmp is trusted.
    write(&tmp.join("carma.yaml"), "");
    assert!(Config::load(&tmp.join("carma.yaml")).is_ok());
    let f = good.join("carma.yaml");
    write(&f, &format!("log_file: {}/carma.log\n", open.display()));
    let e = Config::load(&f).unwrap_err().to_string();
    assert!(e.contains(&format!("log_file: {bad}")), "{e}");
    write(&f, &format!("gpu_source: {{nvml: {{library: {}/libnvidia-ml.so.1}}}}\n", open.display()));
    let e = Config::load(&f).unwrap_err().to_string();
    assert!(e.contains(&format!("gpu_source.nvml.library: {bad}")), "{e}");
    // The file itself, writable by its group.
    write(&f, "");
    std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o664)).unwrap();
    std::os::unix::fs::chown(&f, None, Some(100)).unwrap();
    let e = Config::load(&f).unwrap_err().to_string();
    assert!(e.contains("carma.yaml is writable by group 100"), "{e}");
    std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    write(&f, &format!("log_file: {}/log/carma.log\n", good.display()));
    let (_, note) = Config::load_noted(&f).unwrap();
    // (The length put in directly: replacing a placeholder in the text
    // also replaced it in a path whose pid held the same digits.)
    assert_eq!(note, format!("config {}: loaded ({} bytes)", f.display(), std::fs::metadata(&f).unwrap().len()));
    let (_, note) = Config::load_noted(&good.join("missing.yaml")).unwrap();
    assert!(note.contains("not found, built-in defaults in force") && note.contains("configless"), "{note}");
    let _ = std::fs::remove_dir_all(&good);
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn empty_and_missing_give_defaults() {
    assert_eq!(parse("").unwrap(), Config::default());
    let c = Config::load(Path::new("/nonexistent/carma.yaml")).unwrap();
    assert_eq!(c.sm_activity_cap, 0.80);
    assert_eq!(c.headroom_mib, 2048);
    assert_eq!(c.gpu_source, GpuSource::Nvml { library: None });
}

#[test]
fn full_file() {
    let c = parse(
        "default_policy: bf\nsm_activity_cap: 0.7\nheadroom: 1G\nmonitor_window: 30s\n\
         gpu_source: {simulated: /var/lib/carma-sim/gpus.yaml}\nstate_dir: /var/lib/carma\n\
         unknown_estimate: 8G\nno_fit: hand_back\nmax_hand_backs: 2\nhand_back_pause: 2m\nrecovery: {mode: looser, max_recoveries: 2, looser_margin: 1024}\n\
         extra_oom_patterns: [\"MyFramework OOM\"]\ntimeouts: {lock: 2s, wait: 5m, poll: 500ms}\n",
    )
    .unwrap();
    assert_eq!(c.default_policy, Policy::BestFit);
    assert_eq!(c.headroom_mib, 1024);
    assert_eq!(c.gpu_source, GpuSource::Simulated("/var/lib/carma-sim/gpus.yaml".into()));
    let n = parse("gpu_source: {nvml: {library: /opt/nvidia/lib64/libnvidia-ml.so.1}}\n").unwrap();
    assert_eq!(n.gpu_source, GpuSource::Nvml { library: Some("/opt/nvidia/lib64/libnvidia-ml.so.1".into()) });
    let s = parse("slurm_bin_dir: /opt/slurm/bin\n").unwrap();
    assert_eq!(s.slurm_bin_dir, Some(PathBuf::from("/opt/slurm/bin")));
    assert_eq!(c.unknown_estimate, UnknownEstimate::Mib(8192));
    assert_eq!(c.no_fit, NoFitAction::HandBack);
    assert_eq!(c.max_hand_backs, 2);
    assert_eq!(c.hand_back_pause, Duration::from_secs(120));
    assert_eq!(Config::default().hand_back_pause, Duration::from_secs(60));
    assert_eq!(parse("hand_back_pause: 0s\n").unwrap().hand_back_pause, Duration::ZERO);
    assert_eq!((Config::default().max_pauses, parse("max_pauses: 3\n").unwrap().max_pauses), (24, 3));
    assert_eq!(parse("no_fit: fail\n").unwrap().no_fit, NoFitAction::Fail);
    assert_eq!(c.recovery_mode, RecoveryMode::Looser);
    assert_eq!(c.max_recoveries, 2);
    assert_eq!(c.looser_margin_mib, 1024);
    assert!(c.oom_patterns.contains(&"MyFramework OOM".to_string()));
    assert!(c.oom_patterns.contains(&"CUDA out of memory".to_string()));
    assert_eq!(c.timeouts.poll, Duration::from_millis(500));
}

#[test]
fn dcgm_exporter_endpoint() {
    let c = parse("monitor: {dcgm_exporter: 'http://127.0.0.1:9400/metrics'}\n").unwrap();
    let e = c.monitor.dcgm_exporter.unwrap();
    assert_eq!((e.host.as_str(), e.port, e.path.as_str()), ("127.0.0.1", 9400, "/metrics"));
    assert_eq!(e.to_string(), "http://127.0.0.1:9400/metrics");
    let e = HttpEndpoint::parse("http://gpu-node-7:9400").unwrap();
    assert_eq!((e.host.as_str(), e.path.as_str()), ("gpu-node-7", "/"));
    assert_eq!(Config::default().monitor.dcgm_exporter, None);
    assert_eq!(Config::default().monitor.metrics, Some("127.0.0.1:9402".parse().unwrap()));
    assert_eq!(parse("monitor: {metrics: off}\n").unwrap().monitor.metrics, None);
    assert_eq!(parse("monitor: {metrics: '[::]:9500'}\n").unwrap().monitor.metrics, Some("[::]:9500".parse().unwrap()));
}

#[test]
fn errors_name_the_key_on_one_line() {
    let cases = [
        ("sm_activity_cap: 1.5\n", "sm_activity_cap"),
        ("busy_cap: 0\n", "busy_cap"),
        ("max_slowdown: 1.0\n", "max_slowdown"),
        ("max_slowdown: fast\n", "max_slowdown"),
        ("max_slowdown_unprofiled: 11\n", "max_slowdown_unprofiled"),
        ("max_slowdown: 2.5\nmax_slowdown_unprofiled: 2.0\n", "max_slowdown_unprofiled"),
        ("sharing: mps\nmax_slowdown: 1.1\n", "max_slowdown"),
        ("activity_metric: smact\n", "activity_metric"),
        ("headroom: lots\n", "headroom"),
        ("default_policy: fastest\n", "default_policy"),
        ("gpu_source: cuda\n", "gpu_source"),
        ("gpu_source: {simulated: relative.yaml}\n", "gpu_source.simulated"),
        ("gpu_source: {nvml: {library: libnvidia-ml.so.1}}\n", "gpu_source.nvml.library"),
        ("timeouts: {gpu_read: 10ms}\n", "timeouts.gpu_read"),
        ("monitor: {metrics: 'localhost:9402'}\n", "monitor.metrics"),
        ("monitor: {metrics: '127.0.0.1:0'}\n", "monitor.metrics"),
        ("gpu_source: {nvml: {path: /usr/lib/libnvidia-ml.so.1}}\n", "the only key is library"),
        ("state_dir: var/lib\n", "state_dir"),
        ("slurm_bin_dir: opt/slurm/bin\n", "slurm_bin_dir"),
        ("no_fit: pray\n", "no_fit"),
        ("max_hand_backs: 11\n", "max_hand_backs"),
        ("hand_back_pause: 2h\n", "hand_back_pause"),
        ("hand_back_pause: soon\n", "hand_back_pause"),
        ("max_pauses: 0\n", "max_pauses"),
        ("max_pauses: 1001\n", "max_pauses"),
        ("recovery: {mode: twice}\n", "recovery.mode"),
        ("timeouts: {lock: 0s}\n", "timeouts"),
        ("oom_patterns: [\"\"]\n", "oom_patterns"),
        ("sm_activity_cup: 0.5\n", "sm_activity_cup"),
        ("recovery: {retries: 3}\n", "retries"),
        ("transparent: [{policy: magm}]\n", "transparent[0]"),
        ("transparent: [{partition: gpu}, {partition: \"a b\"}]\n", "transparent[1].partition"),
        ("transparent: [{partition: gpu, default_mem: lots}]\n", "transparent[0].default_mem"),
        ("transparent: [{partition: gpu, policy: fastest}]\n", "transparent[0].policy"),
        ("transparent: [{partitions: gpu}]\n", "partitions"),
        ("admission: [{qos: \"\"}]\n", "admission[0].qos"),
        ("admission: [{partition: gpu, policy: ff}]\n", "admission[0].policy"),
        ("admission: [{account: ml, default_mem: 4G}]\n", "admission[0].default_mem"),
        ("admission: [{}]\n", "admission[0]"),
        ("monitor: {interval: 2s, stale_after: 3s}\n", "monitor.stale_after"),
        ("monitor: {interval: 10ms}\n", "monitor.interval"),
        (
            "monitor: {dcgm_exporter: https://h:9400/metrics}\n",
            "monitor.dcgm_exporter: 'https://h:9400/metrics' is not an http:// URL",
        ),
        ("monitor: {dcgm_exporter: 'http://h/metrics'}\n", "names no port"),
        ("monitor: {dcgm_exporter: 'http://h:0/metrics'}\n", "bad port"),
        ("monitor: {dcgm_exporter: 'http://h x:9400/metrics'}\n", "bad host"),
        ("monitor: {publish: true}\n", "publish"),
        ("sharing: spatial\n", "sharing"),
        ("gpu_owner: node\n", "gpu_owner"),
        ("mps: {pipe_dir: run/mps}\n", "mps.pipe_dir"),
    ];
    for (text, key) in cases {
        let line = parse(text).unwrap_err().to_string();
        assert!(line.starts_with("config /etc/slurm/carma.yaml: "), "{line}");
        assert!(line.contains(key), "{text:?} -> {line}");
        assert!(!line.contains('\n'), "{line}");
    }
}

#[test]
fn values_spanning_lines_still_give_one_line() {
    let line = parse("monitor_window: \"5s\\nmemory\"\n").unwrap_err().to_string();
    assert!(line.contains("monitor_window") && !line.chars().any(char::is_control), "{line:?}");
}

#[test]
fn hostile_yaml_is_an_error_not_a_panic() {
    for text in ["[1, 2", "{{{{", "\u{0}\u{1}", "- a\n- b\n", "a: &x [*x]\n", ": :"] {
        assert!(parse(text).is_err(), "{text:?}");
    }
}

#[test]
fn transparent_scopes_are_read_in_order() {
    let c = parse("transparent:\n  - {partition: shared, default_mem: 10G}\n  - {account: ml, qos: low, policy: ff}\n")
        .unwrap();
    assert_eq!(c.transparent.len(), 2);
    assert_eq!(c.transparent[0].default_mib, Some(10240));
    assert_eq!(c.transparent[1].policy, Some(Policy::FirstFit));
    let job = |p| JobScopeFacts { partition: Some(p), account: Some("ml"), qos: Some("low") };
    assert_eq!(c.transparent_scope(&job("shared")).map(Scope::selectors).as_deref(), Some("partition:shared"));
    assert_eq!(c.transparent_scope(&job("other")).map(Scope::selectors).as_deref(), Some("account:ml,qos:low"));
    assert!(parse("").unwrap().transparent.is_empty());
}

#[test]
fn admission_scopes_are_selectors_only() {
    let c = parse("admission:\n  - {partition: wide}\n  - {account: ml}\n").unwrap();
    assert_eq!(c.admission.len(), 2);
    assert_eq!(c.admission[0].selectors(), "partition:wide");
    assert_eq!(c.admission[1].to_string(), "scope partition=* account=ml qos=*");
    assert!(parse("").unwrap().admission.is_empty());
}

#[test]
fn the_slowdown_guard_is_on_by_default_and_each_bound_can_be_set_or_turned_off() {
    let d = parse("").unwrap();
    assert_eq!((d.max_slowdown, d.max_slowdown_unprofiled, d.idle_first), (1.6, 2.0, true));
    let c = parse("max_slowdown: 1.3\nmax_slowdown_unprofiled: 1.5\nidle_first: false\n").unwrap();
    assert_eq!((c.max_slowdown, c.max_slowdown_unprofiled, c.idle_first), (1.3, 1.5, false));
    assert!(parse("max_slowdown: off\n").unwrap().max_slowdown.is_infinite());
    let e = parse("max_slowdown: 2.5\nmax_slowdown_unprofiled: 2.0\n").unwrap_err().to_string();
    assert!(e.contains("below max_slowdown 2.5") && !e.contains('\n'), "{e}");
}
