//! `carma replay-plan` and `carma replay-compare`: a job trace made into the
//! submissions of a test cluster (`tests/scale.sh replay` submits them as
//! carma-fakejob jobs), and what that cluster did held against
//! `carma simulate` of the same trace, cluster shape, policy and admission.

use carma_config::{ActivityMetric, GpuOwner, Policy};
use carma_placement::Params;
use carma_simulator::engine::mean;
use carma_simulator::{Admission, Assumptions, Cluster, Estimator, SimConfig, TraceJob, Workload, simulate};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// `carma replay-plan`'s options.
#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// The job trace (CSV: seq,submit_offset_s,workload)
    #[arg(long, value_name = "FILE", required_unless_present = "synthetic")]
    pub trace: Option<PathBuf>,
    /// Instead of --trace: the simulator's synthetic trace of N single-GPU jobs (run times a tenth, at least 30 s)
    #[arg(long, value_name = "N", conflicts_with = "trace")]
    pub synthetic: Option<u32>,
    /// The synthetic trace's mean gap between submissions, seconds [default: 0.4]
    #[arg(long, value_name = "S", conflicts_with = "trace", value_parser = gap)]
    pub gap: Option<f64>,
    /// The workloads it names (CSV, as `carma simulate` reads them)
    #[arg(long, value_name = "FILE")]
    pub workloads: PathBuf,
    /// Copies of the trace submitted together (one per node scales it to the cluster)
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub copies: u32,
    /// Time compression: submit offsets, run times and the memory ramp divided by it
    #[arg(long, value_name = "X", default_value_t = 1.0, value_parser = compression)]
    pub compress: f64,
    /// Where the plan goes: trace.csv, workloads.csv (for the simulator) and jobs.tsv (for sbatch)
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

/// `carma replay-compare`'s options.
#[derive(clap::Args, Debug)]
pub struct CompareArgs {
    /// The plan's directory (`carma replay-plan --out`)
    #[arg(long, value_name = "DIR")]
    pub plan: PathBuf,
    /// What the cluster did, one job a line: seq submit_s start_s end_s exit hand_backs [node_wait_s [pauses]] (times from the replay's start, `-` when none)
    #[arg(long, value_name = "FILE")]
    pub results: PathBuf,
    /// The cluster: nodes x GPUs per node x memory per GPU
    #[arg(long, value_name = "NxGxMEM", value_parser = Cluster::parse)]
    pub cluster: Cluster,
    /// The policy the jobs asked for
    #[arg(long, value_name = "POLICY")]
    pub policy: Policy,
    /// Whose choice of GPU stands: slurm or carma (the nodes' carma.yaml gpu_owner)
    #[arg(long, value_name = "OWNER", default_value = "slurm", value_parser = GpuOwner::parse)]
    pub gpu_owner: GpuOwner,
    /// The reading the nodes' activity cap applies to: sm, or busy where SM activity cannot be read (no GPM, no DCGM), as busy time then stands in for it
    #[arg(long, value_name = "METRIC", default_value_t = ActivityMetric::default(), value_parser = ActivityMetric::parse)]
    pub cap_metric: ActivityMetric,
    #[command(flatten)]
    pub guard: crate::simulate::GuardArgs,
    /// The nodes' monitor_window, seconds (their readings are published)
    #[arg(long, value_name = "S", default_value_t = 0.0, value_parser = seconds)]
    pub window: f64,
    /// The nodes' monitor.interval, seconds: the readings are the window's means as of the last publication
    #[arg(long, value_name = "S", default_value_t = 0.0, value_parser = seconds)]
    pub publish: f64,
    /// Seconds a job waits on its node for a GPU before it is handed back (the nodes' timeouts.wait)
    #[arg(long, value_name = "S", default_value_t = 0.0, value_parser = seconds)]
    pub node_wait: f64,
    /// Seconds between the nodes' admission counts (their monitor.admission_interval); 0: slurmctld counts the GPUs under the cap
    #[arg(long, value_name = "S", default_value_t = 0.0, value_parser = seconds)]
    pub count_interval: f64,
    /// Seconds a handed-back job is away before slurmctld places it again (the requeue)
    #[arg(long, value_name = "S", default_value_t = 0.0, value_parser = seconds)]
    pub requeue_delay: f64,
    /// Seconds a job out of hand-backs waits in the queue before it may go anywhere again (the nodes' hand_back_pause); 0: it fails
    #[arg(long, value_name = "S", default_value_t = 0.0, value_parser = seconds)]
    pub hand_back_pause: f64,
    #[command(flatten)]
    pub slurm: crate::slurm_model::SlurmModel,
    /// Fail (exit 1) when the simulated makespan (with --noise-runs, the median of the runs') differs from the real by more than PCT per cent: a broken model or harness, not a benchmark's verdict
    #[arg(long, value_name = "PCT", value_parser = seconds)]
    pub fail_above: Option<f64>,
    /// Simulate N times more, each job's submission moved later by up to --noise seconds (drawn per run, deterministically): the spread a makespan has from Slurm's start-up times alone
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub noise_runs: u32,
    /// The most a submission is moved in the --noise-runs runs, seconds
    #[arg(long, value_name = "S", default_value_t = 1.0, value_parser = seconds)]
    pub noise: f64,
    /// Also write the simulated jobs to FILE: seq submit_s start_s end_s exit runs node gpus
    #[arg(long, value_name = "FILE")]
    pub simulated: Option<PathBuf>,
    /// slurmctld takes shards from the least loaded GPU (LL_SHARED_GRES, Slurm 23.11 on)
    #[arg(long)]
    pub least_loaded: bool,
}

fn seconds(v: &str) -> Result<f64, String> {
    v.parse::<f64>()
        .ok()
        .filter(|x| x.is_finite() && *x >= 0.0 && *x <= 1e6)
        .ok_or_else(|| "expected a number from 0 to 1e6".into())
}

fn gap(v: &str) -> Result<f64, String> {
    v.parse::<f64>().ok().filter(|x| x.is_finite() && *x > 0.0).ok_or_else(|| "expected seconds > 0".into())
}

fn compression(v: &str) -> Result<f64, String> {
    v.parse::<f64>().ok().filter(|x| x.is_finite() && *x >= 1.0).ok_or_else(|| "expected a number >= 1".into())
}

/// The memory ramp of a plan compressed `compress` times (the simulator's
/// default ramp, as fast as the rest of the trace).
fn ramp_s(compress: f64) -> f64 {
    Assumptions::default().ramp_s / compress
}

/// The plan: `copies` of the trace merged in submit order (copy k's job n
/// is seq k*1000+n), every time divided by `compress`.
pub fn plan(
    trace: &[TraceJob],
    workloads: &HashMap<String, Workload>,
    copies: u32,
    compress: f64,
) -> Result<(Vec<TraceJob>, HashMap<String, Workload>), String> {
    if let Some(j) = trace.iter().find(|j| !workloads.contains_key(&j.workload)) {
        return Err(format!("trace job {}: workload '{}' is not in the workloads", j.seq, j.workload));
    }
    if copies > 1 && trace.iter().any(|j| j.seq >= 1000) {
        return Err("trace seq must be under 1000 (copies are numbered copy*1000+seq)".into());
    }
    let mut jobs: Vec<TraceJob> = (0..copies)
        .flat_map(|k| {
            trace.iter().map(move |j| TraceJob { seq: k * 1000 + j.seq, submit_s: j.submit_s / compress, ..j.clone() })
        })
        .collect();
    by_submit(&mut jobs);
    let w = workloads.iter().map(|(k, w)| (k.clone(), Workload { solo_s: w.solo_s / compress, ..w.clone() })).collect();
    Ok((jobs, w))
}

/// Submit order (seq breaks ties), as the simulator reads a trace.
fn by_submit(jobs: &mut [TraceJob]) {
    jobs.sort_by(|a, b| a.submit_s.total_cmp(&b.submit_s).then(a.seq.cmp(&b.seq)));
}

pub fn cmd_plan(a: &PlanArgs) -> Result<(), String> {
    let mut w = carma_simulator::read_workloads(&a.workloads)?;
    let trace = match (&a.trace, a.synthetic) {
        (Some(t), _) => carma_simulator::read_trace(t)?,
        (None, Some(n)) => {
            let (t, short) = carma_simulator::input::synthetic(&w, n, a.gap.unwrap_or(0.4), 7);
            w = short;
            t
        }
        (None, None) => return Err("--trace or --synthetic is needed".into()),
    };
    let (jobs, w) = plan(&trace, &w, a.copies, a.compress)?;
    std::fs::create_dir_all(&a.out).map_err(|e| format!("--out {}: {e}", a.out.display()))?;
    let mut t = String::from("seq,submit_offset_s,workload\n");
    let mut tsv = String::from("# seq submit_s gpus mem_mib sm busy work_s ramp_s\n");
    for j in &jobs {
        let x = &w[&j.workload];
        let _ = writeln!(t, "{},{:.3},{}", j.seq, j.submit_s, j.workload);
        let _ = writeln!(
            tsv,
            "{} {:.3} {} {} {} {} {:.3} {:.3}",
            j.seq,
            j.submit_s,
            x.gpus,
            x.peak_mib,
            x.sm,
            x.busy,
            x.solo_s,
            ramp_s(a.compress)
        );
    }
    let mut names: Vec<&String> = w.keys().collect();
    names.sort();
    let mut wl = String::from("workload,gpus,exclusive_minutes,measured_peak_mib,sm_activity,busy\n");
    for n in names {
        let x = &w[n];
        let _ = writeln!(wl, "{n},{},{},{},{},{}", x.gpus, x.solo_s / 60.0, x.peak_mib, x.sm, x.busy);
    }
    for (name, body) in
        [("trace.csv", t), ("jobs.tsv", tsv), ("workloads.csv", wl), ("compress", format!("{}\n", a.compress))]
    {
        let p = a.out.join(name);
        std::fs::write(&p, body).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    println!(
        "carma replay-plan: {} jobs ({} copies), {:.0} s of submissions",
        jobs.len(),
        a.copies,
        jobs.last().map_or(0.0, |j| j.submit_s)
    );
    Ok(())
}

/// One job as the cluster ran it.
#[derive(Debug, Clone, PartialEq)]
pub struct RealJob {
    pub seq: u32,
    pub submit_s: f64,
    pub start_s: Option<f64>,
    pub end_s: Option<f64>,
    pub exit: Option<i32>,
    /// Times a node handed it back (requeued it elsewhere).
    pub hand_backs: u32,
    /// Times it paused in the queue, out of hand-backs (`hand_back_pause`).
    pub pauses: u32,
    /// Seconds its last run waited on its node for a GPU (the plugin's
    /// time in the hook), where known.
    pub node_wait_s: Option<f64>,
}

/// Reads the results file (see [`CompareArgs::results`]).
pub fn read_results(text: &str) -> Result<Vec<RealJob>, String> {
    let opt = |s: &str| {
        if s == "-" { Ok(None) } else { s.parse::<f64>().map(Some).map_err(|_| format!("'{s}' is not a time")) }
    };
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty() && !l.starts_with('#')) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let bad = |e: String| format!("results line {}: {e}", n + 1);
        if !(6..=8).contains(&f.len()) {
            return Err(bad(format!(
                "expected 6 to 8 fields (seq submit_s start_s end_s exit hand_backs [node_wait_s [pauses]]), found {}",
                f.len()
            )));
        }
        out.push(RealJob {
            seq: f[0].parse().map_err(|_| bad(format!("seq '{}'", f[0])))?,
            submit_s: f[1].parse().map_err(|_| bad(format!("submit_s '{}'", f[1])))?,
            start_s: opt(f[2]).map_err(bad)?,
            end_s: opt(f[3]).map_err(bad)?,
            exit: if f[4] == "-" { None } else { Some(f[4].parse().map_err(|_| bad(format!("exit '{}'", f[4])))?) },
            hand_backs: f[5].parse().map_err(|_| bad(format!("hand_backs '{}'", f[5])))?,
            node_wait_s: f.get(6).map_or(Ok(None), |s| opt(s)).map_err(bad)?,
            pauses: f.get(7).map_or(Ok(0), |s| s.parse().map_err(|_| bad(format!("pauses '{s}'"))))?,
        });
    }
    Ok(out)
}

/// The figures compared: each side's makespan, mean wait, mean job
/// completion time, failures and hand-backs.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    pub jobs: usize,
    pub makespan_s: f64,
    pub mean_wait_s: f64,
    pub mean_jct_s: f64,
    pub failed: usize,
    pub handed_back: u32,
    pub paused: u32,
}

pub fn real_figures(jobs: &[RealJob]) -> Figures {
    let ok = |j: &&RealJob| j.exit == Some(0) && j.end_s.is_some();
    let first = jobs.iter().map(|j| j.submit_s).fold(f64::INFINITY, f64::min);
    let first = if first.is_finite() { first } else { 0.0 };
    Figures {
        jobs: jobs.len(),
        // From the first submission, as the simulator counts it.
        makespan_s: (jobs.iter().filter_map(|j| j.end_s).fold(0.0, f64::max) - first).max(0.0),
        mean_wait_s: mean(&jobs.iter().filter_map(|j| j.start_s.map(|s| s - j.submit_s)).collect::<Vec<_>>()),
        mean_jct_s: mean(&jobs.iter().filter(ok).filter_map(|j| j.end_s.map(|e| e - j.submit_s)).collect::<Vec<_>>()),
        failed: jobs.iter().filter(|j| !ok(j)).count(),
        handed_back: jobs.iter().map(|j| j.hand_backs).sum(),
        paused: jobs.iter().map(|j| j.pauses).sum(),
    }
}

/// The simulator's figures for the plan, each job submitted when sbatch
/// really submitted it (`real`; a burst of arrivals leaves sbatch behind).
pub fn simulated_figures(a: &CompareArgs, real: &[RealJob]) -> Result<Figures, String> {
    simulated_run(a, real, None)
}

/// Each noise run's draws: the synthetic trace's generator, its seed mixed
/// from the run's number.
fn draws(run: u64) -> impl FnMut() -> f64 {
    carma_simulator::input::draws(run.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5DEE_CE66)
}

/// The simulated figures of the plan; with `noise` (run, seconds), each
/// submission moved later by a draw of up to that many seconds. The
/// simulator starts a job the moment it fits; Slurm takes a median of half
/// a second from sbatch to the batch script (docs/replay.md), more or less
/// for each job, and a makespan made by a few long jobs moves with it.
fn simulated_run(a: &CompareArgs, real: &[RealJob], noise: Option<(u64, f64)>) -> Result<Figures, String> {
    let mut trace = carma_simulator::read_trace(&a.plan.join("trace.csv"))?;
    let submitted: HashMap<u32, f64> = real.iter().map(|j| (j.seq, j.submit_s)).collect();
    let mut later = noise.map(|(run, _)| draws(run));
    for j in &mut trace {
        j.submit_s = submitted.get(&j.seq).copied().unwrap_or(j.submit_s);
        if let (Some(next), Some((_, s))) = (later.as_mut(), noise) {
            j.submit_s += next() * s;
        }
    }
    by_submit(&mut trace);
    let w = carma_simulator::read_workloads(&a.plan.join("workloads.csv"))?;
    let compress = read_compress(&a.plan)?;
    let cfg = SimConfig {
        cluster: a.cluster,
        policy: a.policy,
        estimator: Estimator::Oracle,
        params: a.guard.apply(Params { metric: a.cap_metric, ..Params::default() }),
        assumptions: a.slurm.apply(Assumptions {
            ramp_s: ramp_s(compress),
            window_s: a.window,
            publish_s: a.publish,
            node_wait_s: a.node_wait,
            requeue_s: a.requeue_delay,
            count_interval_s: a.count_interval,
            hand_back_pause_s: a.hand_back_pause,
            ..Assumptions::default()
        }),
        admission: Admission::parse("node-memory")?,
        gpu_owner: a.gpu_owner,
        least_loaded: a.least_loaded,
    };
    let o = simulate(&trace, &w, &cfg)?;
    if let (Some(f), None) = (&a.simulated, noise) {
        let t = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.3}"));
        let mut out = String::from("# seq submit_s start_s end_s exit runs node gpus\n");
        for j in &o.jobs {
            let exit = if j.end_s.is_some() { "0" } else { "-" };
            let (node, gpus) = match &j.placed {
                Some((n, g)) => (format!("n{n}"), carma_placement::gpu::index_list(g)),
                None => ("-".to_string(), "-".to_string()),
            };
            let _ = writeln!(
                out,
                "{} {:.3} {} {} {exit} {} {node} {gpus}",
                j.seq,
                j.submit_s,
                t(j.start_s),
                t(j.end_s),
                u32::from(j.start_s.is_some())
            );
        }
        std::fs::write(f, out).map_err(|e| format!("--simulated {}: {e}", f.display()))?;
    }
    Ok(Figures {
        jobs: o.jobs.len(),
        makespan_s: o.makespan_s,
        mean_wait_s: mean(&o.waits()),
        mean_jct_s: mean(&o.jct()),
        failed: o.jobs.iter().filter(|j| j.end_s.is_none() || j.failed_no_fit || j.rejected).count(),
        handed_back: o.handed_back,
        paused: o.paused,
    })
}

fn read_compress(plan: &Path) -> Result<f64, String> {
    let p = plan.join("compress");
    let s = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e} (written by carma replay-plan)", p.display()))?;
    compression(s.trim()).map_err(|e| format!("{}: {e}", p.display()))
}

/// Where the real jobs' mean wait went, in shares that add up to it: the
/// wait on their node for a GPU (the plugin's time in the hook) of jobs
/// placed at once, the whole wait of jobs handed back, and the rest,
/// Slurm's own (scheduling, launch, prolog, and queueing where no node had
/// room by slurmctld's count). `None` without node waits.
pub fn real_wait_split(jobs: &[RealJob]) -> Option<String> {
    // Jobs whose node wait the log does not give are left out.
    let started: Vec<&RealJob> = jobs.iter().filter(|j| j.start_s.is_some() && j.node_wait_s.is_some()).collect();
    if started.is_empty() {
        return None;
    }
    let n = started.len() as f64;
    let wait = |j: &RealJob| j.start_s.unwrap_or(j.submit_s) - j.submit_s;
    let (kept, back): (Vec<&RealJob>, Vec<&RealJob>) = started.iter().partition(|j| j.hand_backs == 0);
    let node: f64 = kept.iter().map(|j| j.node_wait_s.unwrap_or(0.0)).sum::<f64>() / n;
    let back_s: f64 = back.iter().map(|j| wait(j)).sum::<f64>() / n;
    let mut slurm: Vec<f64> = kept.iter().map(|j| wait(j) - j.node_wait_s.unwrap_or(0.0)).collect();
    slurm.sort_by(f64::total_cmp);
    let slurm_s = slurm.iter().sum::<f64>() / n;
    let median = slurm.get(slurm.len() / 2).copied().unwrap_or(0.0);
    let queued = slurm.iter().filter(|&&s| s > 5.0).count();
    Some(format!(
        "real mean wait {:.1} s ({} jobs) = {node:.1} s on the node for a GPU + {back_s:.1} s of {} jobs handed back + {slurm_s:.1} s Slurm's (jobs not handed back: median {median:.2} s each, {queued} over 5 s)\n",
        node + back_s + slurm_s,
        started.len(),
        back.len()
    ))
}

/// Real against simulated, with the difference in per cent of the real.
pub fn comparison(real: &Figures, sim: &Figures) -> String {
    let pct = |r: f64, s: f64| if r == 0.0 { "-".to_string() } else { format!("{:+.1}%", (s / r - 1.0) * 100.0) };
    let mut out = String::from("| figure | real Slurm | simulator | simulator vs real |\n|---|---|---|---|\n");
    let _ = writeln!(out, "| jobs | {} | {} | |", real.jobs, sim.jobs);
    for (name, r, s) in [
        ("makespan (s)", real.makespan_s, sim.makespan_s),
        ("mean wait (s)", real.mean_wait_s, sim.mean_wait_s),
        ("mean JCT (s)", real.mean_jct_s, sim.mean_jct_s),
    ] {
        // (+ 0.0: no "-0.0")
        let _ = writeln!(out, "| {name} | {:.1} | {:.1} | {} |", r + 0.0, s + 0.0, pct(r, s));
    }
    let _ = writeln!(out, "| failed | {} | {} | |", real.failed, sim.failed);
    let _ = writeln!(out, "| handed back | {} | {} | |", real.handed_back, sim.handed_back);
    let _ = writeln!(out, "| paused (out of hand-backs) | {} | {} | |", real.paused, sim.paused);
    out
}

pub fn cmd_compare(a: &CompareArgs) -> Result<(), String> {
    let text = std::fs::read_to_string(&a.results).map_err(|e| format!("--results {}: {e}", a.results.display()))?;
    let jobs = read_results(&text)?;
    let real = real_figures(&jobs);
    let sim = simulated_figures(a, &jobs)?;
    print!("{}", comparison(&real, &sim));
    if let Some(split) = real_wait_split(&jobs) {
        print!("{split}");
    }
    let mut runs = vec![sim];
    for run in 1..=u64::from(a.noise_runs) {
        runs.push(simulated_run(a, &jobs, Some((run, a.noise)))?);
    }
    if runs.len() > 1 {
        print!("{}", spread(&runs, a.noise));
    }
    let median = median_makespan(&runs);
    let off = if real.makespan_s > 0.0 { (median / real.makespan_s - 1.0).abs() * 100.0 } else { 100.0 };
    match a.fail_above {
        Some(max) if off > max => Err(format!(
            "the simulated makespan (median of {} runs) {median:.1} s is {off:.1} % off the real {:.1} s, more than --fail-above {max}",
            runs.len(),
            real.makespan_s
        )),
        _ => Ok(()),
    }
}

/// The median of the runs' makespans: one run's is the end of a few long
/// jobs, which a second's jitter moves by half (docs/replay.md).
fn median_makespan(runs: &[Figures]) -> f64 {
    let mut v: Vec<f64> = runs.iter().map(|f| f.makespan_s).collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The simulated figures' range over the plain run and the noisy ones.
fn spread(runs: &[Figures], noise: f64) -> String {
    let range = |f: fn(&Figures) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        format!("{:.1} to {:.1} s (median {:.1})", v[0], v[v.len() - 1], v[v.len() / 2])
    };
    format!(
        "simulator over {} runs (as submitted, then each submission up to {noise} s later): makespan {}, mean wait {}, mean JCT {}\n",
        runs.len(),
        range(|f| f.makespan_s),
        range(|f| f.mean_wait_s),
        range(|f| f.mean_jct_s)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(name: &str, solo_s: f64) -> Workload {
        Workload {
            name: name.into(),
            gpus: 1,
            solo_s,
            peak_mib: 5000,
            estimates: HashMap::new(),
            sm: 0.3,
            busy: 0.6,
            model_file: None,
            batch_size: None,
            seq_len: None,
        }
    }

    #[test]
    fn a_plan_merges_copies_in_submit_order_and_compresses_time() {
        let t = vec![
            TraceJob { seq: 0, submit_s: 0.0, workload: "a".into() },
            TraceJob { seq: 1, submit_s: 600.0, workload: "b".into() },
        ];
        let ws = HashMap::from([("a".to_string(), w("a", 1200.0)), ("b".to_string(), w("b", 60.0))]);
        let (jobs, out) = plan(&t, &ws, 2, 60.0).unwrap();
        let got: Vec<(u32, f64)> = jobs.iter().map(|j| (j.seq, j.submit_s)).collect();
        assert_eq!(got, vec![(0, 0.0), (1000, 0.0), (1, 10.0), (1001, 10.0)]);
        assert_eq!((out["a"].solo_s, out["b"].solo_s), (20.0, 1.0));
        let e = plan(&[TraceJob { seq: 0, submit_s: 0.0, workload: "x".into() }], &ws, 1, 1.0).unwrap_err();
        assert!(e.contains("workload 'x'"), "{e}");
    }

    #[test]
    fn real_figures_count_failures_hand_backs_and_waits() {
        let r = read_results("# header\n0 0.0 2.0 12.0 0 0\n1 1.0 5.0 20.0 0 1\n2 3.0 4.0 6.0 1 0\n3 4.0 - - - 0\n4 0.0 9.0 10.0 0 4 0.1 2\n")
            .unwrap();
        let f = real_figures(&r[..4]);
        assert_eq!((f.jobs, f.failed, f.handed_back, f.paused), (4, 2, 1, 0));
        assert_eq!((real_figures(&r).handed_back, real_figures(&r).paused), (5, 2));
        // From the first submission (0.0 here) to the last end.
        assert_eq!(f.makespan_s, 20.0);
        let later = read_results("0 2.0 3.0 12.0 0 0\n").unwrap();
        assert_eq!(real_figures(&later).makespan_s, 10.0);
        assert_eq!(f.mean_wait_s, (2.0 + 4.0 + 1.0) / 3.0);
        assert_eq!(f.mean_jct_s, (12.0 + 19.0) / 2.0);
        let e = read_results("0 0.0 x 1 0 1\n").unwrap_err();
        assert!(e.contains("line 1") && e.contains("'x'"), "{e}");
        assert!(read_results("0 0.0 1 2 0\n").unwrap_err().contains("expected 6 to 8 fields"));
        assert!(read_results("0 0.0 1 2 0 0 - x\n").unwrap_err().contains("pauses 'x'"));
    }

    /// The real wait split: the node's share from the plugin's time in the
    /// hook, the handed-back jobs' whole wait, and Slurm's the rest.
    #[test]
    fn the_real_wait_splits_into_node_hand_backs_and_slurm() {
        let r = read_results("0 0.0 1.0 9.0 0 0 0.5\n1 0.0 3.0 9.0 0 0 0.0\n2 0.0 12.0 20.0 0 1 4.0\n").unwrap();
        let s = real_wait_split(&r).unwrap();
        // Mean wait (1 + 3 + 12) / 3; node 0.5 / 3, handed back 12 / 3,
        // Slurm's (0.5 + 3) / 3: the shares add up to it.
        assert!(s.starts_with("real mean wait 5.3 s (3 jobs) = 0.2 s on the node"), "{s}");
        assert!(s.contains("+ 4.0 s of 1 jobs handed back + 1.2 s Slurm's"), "{s}");
        assert!(s.contains("median 3.00 s each, 0 over 5 s"), "{s}");
        assert_eq!(real_wait_split(&read_results("0 0.0 1.0 9.0 0 0\n").unwrap()), None);
    }

    #[test]
    fn bad_options_name_the_option_and_what_it_takes() {
        use crate::cli::Cli;
        use clap::Parser;
        let base = ["carma", "replay-plan", "--workloads", "w.csv", "--out", "d"];
        for (extra, says) in [
            (&[][..], "--trace <FILE>"),
            (&["--trace", "t.csv", "--compress", "0.5"], "--compress <X>': expected a number >= 1"),
            (&["--trace", "t.csv", "--synthetic", "5"], "cannot be used with"),
            (&["--trace", "t.csv", "--gap", "1"], "cannot be used with"),
            (&["--synthetic", "5", "--gap", "0"], "--gap <S>': expected seconds > 0"),
            (&["--trace", "t.csv", "--copies", "0"], "--copies <N>'"),
        ] {
            let e = Cli::try_parse_from(base.iter().chain(extra)).map(|_| ()).map_err(|e| crate::cli::one_line(&e));
            let e = e.err().unwrap_or_else(|| panic!("{extra:?} was accepted"));
            assert!(e.contains(says) && !e.contains('\n'), "{extra:?}: {e}");
        }
        let ok = Cli::try_parse_from(base.iter().chain(&["--synthetic", "5", "--gap", "2"])).unwrap();
        let crate::cli::Command::ReplayPlan(a) = ok.command else { panic!() };
        assert_eq!((a.synthetic, a.gap, a.compress, a.copies, a.trace), (Some(5), Some(2.0), 1.0, 1, None));
    }

    #[test]
    fn the_comparison_gives_the_simulators_difference_from_the_real() {
        let real = Figures {
            jobs: 2,
            makespan_s: 100.0,
            mean_wait_s: 10.0,
            mean_jct_s: 50.0,
            failed: 0,
            handed_back: 1,
            paused: 0,
        };
        let sim = Figures { makespan_s: 108.0, mean_wait_s: 5.0, ..real.clone() };
        let t = comparison(&real, &sim);
        assert!(t.contains("| makespan (s) | 100.0 | 108.0 | +8.0% |"), "{t}");
        assert!(t.contains("| mean wait (s) | 10.0 | 5.0 | -50.0% |"), "{t}");
    }

    /// The gate holds the real makespan against the simulated runs'
    /// median; the spread line gives each figure's range and median.
    #[test]
    fn the_real_makespan_is_held_against_the_simulated_median() {
        let f = |m: f64| Figures {
            jobs: 1,
            makespan_s: m,
            mean_wait_s: 1.0,
            mean_jct_s: m / 2.0,
            failed: 0,
            handed_back: 0,
            paused: 0,
        };
        assert_eq!(median_makespan(&[f(280.0), f(150.0), f(200.0)]), 200.0);
        assert_eq!(median_makespan(&[]), 0.0);
        let s = spread(&[f(200.0), f(150.0), f(280.0)], 1.0);
        assert!(s.starts_with("simulator over 3 runs"), "{s}");
        assert!(s.contains("makespan 150.0 to 280.0 s (median 200.0)"), "{s}");
        assert!(s.contains("mean JCT 75.0 to 140.0 s (median 100.0)"), "{s}");
        // Each run's draws differ, and repeat.
        let (mut a, mut b) = (draws(1), draws(2));
        let (x, y) = (a(), b());
        assert!(x != y && (0.0..1.0).contains(&x) && (0.0..1.0).contains(&y));
        assert_eq!(draws(1)(), x);
    }
}
