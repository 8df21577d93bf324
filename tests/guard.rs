//! The slowdown guard on a real cluster (#56): a burst of light fake jobs
//! (the replay's: SM 0.25, busy 0.5) of one user and one script, on the
//! first node's four time-sliced GPUs, with carma.yaml's `max_slowdown:
//! 1.6`. Their first runs take the idle GPUs one each; once the node has
//! seen them alone (their profile), a second joins each GPU (predicted
//! 1.14x), and no third (1.92x), while under the SM cap alone all ten
//! start at once, three to a GPU.

mod common;
use common::*;
use std::thread;

/// One job's run: its GPU and when it ran.
#[derive(Debug, Clone)]
struct Span {
    gpu: String,
    start: f64,
    end: f64,
    out: String,
}

const CONF: &str = "/etc/slurm/carma.yaml";

/// Runs `n` copies of one batch script under one job name at once (one
/// profile key: the same user, name and script), each a light fake job of
/// `seconds`, and returns their spans.
fn burst(tag: &str, n: usize, seconds: u32) -> Vec<Span> {
    let name = unique(tag);
    let body = format!(
        "echo \"START $(date +%s.%N) $SLURM_STEP_GPUS\"\n\
         carma-fakejob --mem 1G --sm 0.25 --busy 0.5 --seconds {seconds}\nrc=$?\n\
         echo \"END $(date +%s.%N) $rc\"\nexit $rc"
    );
    let path = script(&name, &body);
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let (name, path) = (name.clone(), path.clone());
            thread::spawn(move || {
                let out = work_dir().join(format!("{name}-{i}.out"));
                let out_s = out.to_string_lossy().into_owned();
                let args =
                    ["sbatch", "--wait", "-J", &name, "-o", &out_s, "--carma-mem=1G", "--carma-policy=magm", &path];
                let r = user(&args, 240);
                let text = std::fs::read_to_string(&out).unwrap_or_default();
                assert_eq!(r.code, 0, "job {i} failed: {} {}\n{text}", r.stdout, r.stderr);
                let field = |tag: &str, k: usize| -> String {
                    let line = text.lines().find(|l| l.starts_with(tag));
                    line.and_then(|l| l.split_whitespace().nth(k))
                        .unwrap_or_else(|| panic!("{tag}?\n{text}"))
                        .to_string()
                };
                Span {
                    gpu: field("START", 2),
                    start: field("START", 1).parse().unwrap(),
                    end: field("END", 1).parse().unwrap(),
                    out: text,
                }
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Jobs running on `gpu` at time `t` (started at or before it).
fn running(spans: &[Span], gpu: Option<&str>, t: f64) -> usize {
    spans.iter().filter(|s| gpu.is_none_or(|g| s.gpu == g) && s.start <= t && t < s.end).count()
}

fn peak_per_gpu(spans: &[Span]) -> usize {
    spans.iter().map(|s| running(spans, Some(&s.gpu), s.start)).max().unwrap_or(0)
}

/// carma.yaml with `max_slowdown` set to `value` and `idle_first: true`
/// (the suites' cluster runs `off` and `false`), and a 4 s monitor_window:
/// this node reads its GPUs directly (no monitor), and learns a job's
/// profile once it ran alone that long. Restored when the guard returned
/// is dropped.
fn max_slowdown(value: &str) -> Restore {
    let keep = Restore::new(CONF);
    let conf = std::fs::read_to_string(CONF).unwrap();
    let set = |l: &str| match l.split(':').next() {
        Some("max_slowdown") => format!("max_slowdown: {value}"),
        Some("idle_first") => "idle_first: true".to_string(),
        _ => l.to_string(),
    };
    let mut lines: Vec<String> = conf.lines().map(set).collect();
    for key in ["max_slowdown:", "idle_first:"] {
        assert!(conf.lines().any(|l| l.starts_with(key)), "tests/cluster.sh sets {key}\n{conf}");
    }
    assert!(!conf.lines().any(|l| l.starts_with("monitor_window:")), "{conf}");
    lines.push("monitor_window: 4s".into());
    std::fs::write(CONF, lines.join("\n") + "\n").unwrap();
    keep
}

const LOG: &str = "/var/log/carma/carma.log";

/// carma.log's lines written since `from` bytes.
fn log_since(from: u64) -> String {
    let all = std::fs::read(LOG).unwrap_or_default();
    String::from_utf8_lossy(all.get(from as usize..).unwrap_or_default()).into_owned()
}

#[test]
fn a_burst_of_light_jobs_shares_gpus_only_within_the_bound_and_only_once_no_gpu_is_idle() {
    require_cluster();
    let _conf = max_slowdown("1.6");
    let log_from = std::fs::metadata(LOG).map_or(0, |m| m.len());
    let spans = burst("guard", 10, 16);
    let peak = peak_per_gpu(&spans);
    let gpus: std::collections::BTreeSet<&str> = spans.iter().map(|s| s.gpu.as_str()).collect();
    let text = format!("{spans:#?}");
    assert_eq!(gpus.len(), 4, "the burst used every GPU: {text}");
    // Two such jobs time-sliced: 1.14x each; three: 1.92x, over the bound.
    assert_eq!(peak, 2, "at most two light jobs to a GPU, and some shared: {text}");
    // A job started beside another only while every GPU ran a job.
    for s in &spans {
        if running(&spans, Some(&s.gpu), s.start) > 1 {
            let busy_gpus = gpus.iter().filter(|g| running(&spans, Some(g), s.start) > 0).count();
            assert_eq!(busy_gpus, 4, "a job shared GPU {} while a GPU was idle: {}", s.gpu, s.out);
        }
    }
    // This burst's decisions say what the guard predicted: for two
    // profiled jobs of the key about 1.1x (1.14x at busy 0.5; the node
    // learns what its busy samples averaged, 0.47-0.5), within the bound,
    // and never over the bound for a job not yet profiled (2.0).
    let log = log_since(log_from);
    let predicted: Vec<f64> = log
        .split("predicted_slowdown=")
        .skip(1)
        .filter_map(|rest| rest.split(|c: char| c == ' ' || c == ',').next()?.parse().ok())
        .collect();
    assert!(
        predicted.iter().any(|p| *p > 1.0 && *p <= 1.6),
        "no shared decision within the bound: {predicted:?}\n{log}"
    );
    assert!(predicted.iter().all(|p| *p <= 2.0), "{predicted:?}");
    wait_released();
    report(
        "guard",
        &format!(
            "a burst of 10 light fake jobs (SM 0.25, busy 0.5) of one script, max_slowdown 1.6: at most {peak} on a GPU, the first on idle GPUs, shared ones predicted within 1.6x"
        ),
    );
}

#[test]
fn without_the_guard_the_same_burst_piles_three_to_a_gpu() {
    require_cluster();
    let _conf = max_slowdown("off");
    let spans = burst("noguard", 10, 16);
    // Under the SM cap alone, two such jobs read about 0.44 SM together:
    // the cap never closes, and all ten start at once.
    let peak = peak_per_gpu(&spans);
    assert!(peak >= 3, "expected a pile-up without the guard: {spans:#?}");
    wait_released();
}
