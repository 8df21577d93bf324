//! The H100 table replayed as finished jobs on one simulated node with the
//! default carma.yaml (learning on): each row, from each file a user could
//! pass for it, is a job of one user that is estimated (as srun/sbatch
//! would), placed (the node applies its learned fixed part), ends at its
//! measured peak (what carma-monitor would record) and so teaches the node.
//! A job is "first" while its user has fewer finished jobs than
//! `learn_runtime.min_jobs`; every later job must be covered (estimate at
//! least the peak), and every first job short by less than the placement
//! headroom. Twice: on the stack the table was measured on (held to both),
//! and on one whose fixed part is 900 MiB larger (the ~1.9 GB of the A100
//! stack in the docs): its first jobs are held to the headroom, its later
//! jobs to less than 5 % short (the largest of a user's latest jobs learns
//! 1881 of 1924 MiB; a job beyond every earlier one is short). Also
//! prints, per file kind and precision, what every case gets as a first job
//! (the estimate alone; each held to less than the headroom short). Prints
//! the figures docs/estimator.md quotes.

mod common;
use carma_config::{Config, Precision};
use carma_estimator::{Settings, estimate, read_bounded_bytes};
use carma_placement::decide::decide;
use carma_placement::{GpuReading, NodeState, Params, Request, StepRef};
use common::*;
use std::collections::{BTreeMap, HashMap};

/// Rows × the files there are for them: 18 + 9 torchsummary tables, 23 + 11
/// ONNX exports, 9 + 9 config.json (fp32 + mixed).
const EXPECTED_CASES: usize = 79;

use common::H100Case as Case;

fn cases() -> Vec<Case> {
    h100_cases()
}

struct Replay {
    /// (kind, precision) → estimate / peak of every job as a user's first
    /// job on a fresh node would get it (the estimate alone, nothing learned).
    as_first: BTreeMap<(&'static str, &'static str), Vec<f64>>,
    /// The largest shortfall of any job as a first job (MiB, 0 if none).
    as_first_short: u64,
    /// (kind, precision) → estimate / peak of the jobs after learning.
    after: BTreeMap<(&'static str, &'static str), Vec<f64>>,
    under_after: Vec<String>,
    /// The lowest estimate / peak after learning.
    worst_after: f64,
    /// The largest shortfall of a first job (MiB, 0 if none).
    first_short: u64,
    first: usize,
    learned: Option<u64>,
}

/// Replays every case as one user's finished jobs on a fresh node, with
/// `extra_mib` more fixed memory than the measured stack.
fn replay(cases: &[Case], extra_mib: u64) -> Replay {
    let cfg = Config::default();
    let learn = cfg.estimator.learn_runtime;
    let params = Params::default();
    assert_eq!(params.headroom_mib, cfg.headroom_mib, "the placer's defaults are carma.yaml's");
    let gpu = GpuReading::idle(0, "GPU-h100", 81559);
    let dir = data().join("h100/models");
    let mut st = NodeState::default();
    let mut out = Replay {
        as_first: BTreeMap::new(),
        as_first_short: 0,
        after: BTreeMap::new(),
        under_after: vec![],
        worst_after: f64::MAX,
        first_short: 0,
        first: 0,
        learned: None,
    };
    for (i, c) in cases.iter().enumerate() {
        let job = 1000 + i as u32;
        let mut s = Settings { seq_len: c.seq, ..Settings::from_config(&cfg.estimator) };
        s.precision = Precision::parse(c.precision).unwrap();
        let bytes = read_bounded_bytes(&dir.join(&c.file)).unwrap();
        let e = estimate(bytes, &c.file, Some(c.batch), &s).unwrap_or_else(|err| panic!("{}: {err}", c.file));
        let req = Request {
            estimate_source: e.source.into(),
            // One signature per job: no job's history decides.
            signature: Some(format!("1000:{i}")),
            runtime_mib: Some(s.runtime_mib),
            uid: Some(1000),
            within: None,
            ..Request::declared(cfg.default_policy, e.mib)
        };
        let step = StepRef { job, holder: 1 };
        let d =
            decide(&mut st, step, &req, std::slice::from_ref(&gpu), &HashMap::new(), &params, &learn, 0, &mut |_| {
                false
            })
            .unwrap_or_else(|e| panic!("{}: no fit {e:?}", c.label()));
        let peak = c.measured as u64 + extra_mib;
        out.as_first.entry((c.kind, c.precision)).or_default().push(e.mib as f64 / peak as f64);
        out.as_first_short = out.as_first_short.max(peak.saturating_sub(e.mib));
        let first = i < learn.min_jobs as usize;
        if first {
            out.first += 1;
            out.first_short = out.first_short.max(peak.saturating_sub(d.reserve_mib));
        } else {
            let ratio = d.reserve_mib as f64 / peak as f64;
            out.worst_after = out.worst_after.min(ratio);
            if ratio < 1.0 {
                out.under_after.push(format!("{}: {} MiB for {peak} ({ratio:.3}x)", c.label(), d.reserve_mib));
            }
            out.after.entry((c.kind, c.precision)).or_default().push(ratio);
        }
        st.job_mut(job).unwrap().observed_mib = peak;
        st.release_job(job).unwrap();
    }
    out.learned = carma_placement::learned::for_user(&st.runtime_by_user, Some(1000), &learn).map(|(v, _)| v);
    out
}

fn median(r: &mut [f64]) -> f64 {
    r.sort_by(f64::total_cmp);
    if r.len() % 2 == 1 { r[r.len() / 2] } else { (r[r.len() / 2 - 1] + r[r.len() / 2]) / 2.0 }
}

#[test]
fn learned_on_a_node_never_short_and_first_jobs_within_the_headroom() {
    let cases = cases();
    println!("{} cases (rows x files)", cases.len());
    assert_eq!(cases.len(), EXPECTED_CASES, "cases missing from data/h100");
    let headroom = Params::default().headroom_mib;
    let mut failures = Vec::new();
    for (stack, extra) in [("measured stack", 0), ("stack with 900 MiB more fixed memory", 900)] {
        let mut r = replay(&cases, extra);
        let after: usize = r.after.values().map(Vec::len).sum();
        println!(
            "{stack}: {} first jobs (largest shortfall {} MiB, headroom {headroom}), {after} after learning, learned {:?} MiB",
            r.first, r.first_short, r.learned
        );
        assert_eq!(r.first + after, EXPECTED_CASES);
        println!("  as a first job: largest shortfall {} MiB", r.as_first_short);
        if r.as_first_short >= headroom {
            failures.push(format!("{stack}: a job short by {} MiB as a first job", r.as_first_short));
        }
        for ((kind, precision), v) in &mut r.as_first {
            let under = v.iter().filter(|&&x| x < 1.0).count();
            let (n, m) = (v.len(), median(v));
            let (lo, hi) = (v[0], v[n - 1]);
            println!(
                "  as a first job: {kind:<12} {precision:<6} jobs {n:>2}: under {under:>2}, median {m:.2}x, min {lo:.2}x, max {hi:.2}x"
            );
        }
        for ((kind, precision), v) in &mut r.after {
            let under = v.iter().filter(|&&x| x < 1.0).count();
            let (n, m) = (v.len(), median(v));
            let (lo, hi) = (v[0], v[n - 1]);
            println!(
                "  after learning: {kind:<12} {precision:<6} jobs {n:>2}: under {under:>2}, median {m:.2}x, min {lo:.2}x, max {hi:.2}x"
            );
            if m > 1.15 {
                failures.push(format!("{stack}: {kind} {precision} median {m:.2}x above 1.15x"));
            }
        }
        if r.first_short >= headroom {
            failures.push(format!("{stack}: a first job short by {} MiB, not less than the headroom", r.first_short));
        }
        // The measured stack is held to never short. On the larger one a
        // later job is short where its observation (peak less model part)
        // is more than all the user's earlier ones: no statistic of past
        // jobs covers such a new record, so it is held to 5 %.
        println!("  under after learning: {} of {after} (lowest {:.3}x)", r.under_after.len(), r.worst_after);
        for u in &r.under_after {
            println!("    {u}");
        }
        if extra == 0 {
            failures.extend(r.under_after.iter().map(|u| format!("{stack}: under after learning: {u}")));
        } else if r.worst_after < 0.95 {
            failures.push(format!("{stack}: a later job at {:.3}x its peak, short by 5 % or more", r.worst_after));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
