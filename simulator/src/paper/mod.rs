//! The report in docs/simulation.md: the paper's traces under every policy,
//! sharing mode and capped reading, with the simulator's calibration and
//! this project's estimator against the measured peaks; and the pieces
//! `carma simulate` shares with it (workload tables with their measured
//! activity and options, our estimates, plots).

use crate::calibration::{fit_interference, fit_power, power_checks, read_collocation, throughput_checks};
use crate::engine::Outcome;
use crate::input::read_job_options;
use crate::report::{Summary, csv, pct, summarize, table};
use crate::svg::line_chart;
use crate::{
    Admission, Assumptions, Cluster, Estimator, PowerProfile, Sharing, SimConfig, Workload, apply_activity,
    apply_job_options, read_solo_readings, read_trace, read_workloads, simulate,
};
use carma_config::{ActivityMetric, GpuOwner, Policy};
use carma_estimator::{Settings, estimate, read_bounded_bytes};
use carma_placement::Params;
use std::collections::HashMap;
use std::path::Path;

/// Our estimator on each workload's model file, as srun/sbatch run it
/// (carma.yaml's default estimator settings, the job's batch size per GPU
/// and sequence length); `None` where it refuses the file, which the
/// plugin turns into whole GPUs.
pub fn our_estimates(workloads: &HashMap<String, Workload>, models: &Path) -> HashMap<String, Option<u64>> {
    workloads
        .values()
        .map(|w| {
            let settings = Settings { seq_len: w.seq_len.map(u64::from), ..Settings::default() };
            let mib = w.model_file.as_ref().and_then(|f| {
                let path = models.join(f);
                let bytes = read_bounded_bytes(&path).ok()?;
                estimate(bytes, f, w.batch_size.map(u64::from), &settings).ok().map(|e| e.mib)
            });
            (w.name.clone(), mib)
        })
        .collect()
}

/// The workload table, with measured activity where a map is given and the
/// options the jobs' scripts imply where a file of them is.
pub fn workloads(
    path: &Path,
    activity: Option<(&Path, &Path)>,
    options: Option<&Path>,
) -> Result<HashMap<String, Workload>, String> {
    let mut w = read_workloads(path)?;
    if let Some((map, measured)) = activity {
        apply_activity(&mut w, map, &read_solo_readings(measured)?)?;
    }
    if let Some(o) = options {
        apply_job_options(&mut w, o)?;
    }
    Ok(w)
}

pub fn estimator(name: &str, w: &HashMap<String, Workload>, models: &Path) -> Estimator {
    match name {
        "oracle" => Estimator::Oracle,
        "carma" => Estimator::Given(our_estimates(w, models)),
        other => Estimator::Column(other.to_string()),
    }
}

pub fn run_all(
    trace: &Path,
    w: &HashMap<String, Workload>,
    cfg: &SimConfig,
    policies: &[Policy],
) -> Result<Vec<Outcome>, String> {
    let t = read_trace(trace)?;
    policies.iter().map(|&policy| simulate(&t, w, &SimConfig { policy, ..cfg.clone() })).collect()
}

/// The report's cluster (the paper's: 4 A100-40GB) with one sharing mode,
/// capped reading and estimator; the policy is set per run.
fn report_config(sharing: Sharing, cap: ActivityMetric, estimator: Estimator, d: &Assumptions) -> SimConfig {
    SimConfig {
        cluster: Cluster { nodes: 1, gpus_per_node: 4, mem_mib: 40 * 1024 },
        policy: Policy::Magm,
        estimator,
        params: Params { metric: cap, ..Params::default() },
        assumptions: Assumptions { sharing, ..d.clone() },
        admission: Admission::Anywhere,
        gpu_owner: GpuOwner::Carma,
        least_loaded: false,
    }
}

/// Writes one SVG per GPU and metric, one line per policy; returns the file names.
pub fn plots(dir: &Path, prefix: &str, outcomes: &[Outcome]) -> Result<Vec<String>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let gpus = outcomes.first().map_or(0, |o| o.gpu_sm.len());
    let mut files = Vec::new();
    for (metric, label, y_max) in [("sm", "SM activity", 1.0), ("mem", "memory (GiB)", 40.0)] {
        for g in 0..gpus {
            let series: Vec<(String, Vec<(f64, f64)>)> = outcomes
                .iter()
                .map(|o| {
                    let pts = o
                        .timeline
                        .iter()
                        .map(|s| (s.t, if metric == "sm" { s.sm[g] } else { s.mem_mib[g] / 1024.0 }))
                        .collect();
                    (o.policy.name().to_string(), pts)
                })
                .collect();
            let name = format!("{prefix}-{metric}-gpu{g}.svg");
            let svg = line_chart(&format!("{prefix}: {label}, GPU {g}"), label, y_max, &series);
            std::fs::write(dir.join(&name), svg).map_err(|e| format!("{name}: {e}"))?;
            files.push(name);
        }
    }
    Ok(files)
}

/// The paper's reported gains of its best configuration over exclusive
/// assignment (arXiv 2508.19073 v3).
const PAPER: &str =
    "about −35% end-to-end trace time, +54% GPU (SM) utilization, −15% GPU energy (v1: −26.7%, +39.3%, −14.2%)";

/// The calibration section: the models against data/h100/collocation.csv.
fn calibration(measured: &Path) -> Result<String, String> {
    let rows = read_collocation(measured)?;
    let d = Assumptions::default();
    let (ts, k, c, m) = fit_interference(&rows)?;
    let mut md = format!(
        "## Calibration on real collocation measurements\n\n\
         `data/h100/collocation.csv`: training jobs alone and together on one H100, time-sliced and under MPS.\n\n\
         **Interference models** (`--sharing`):\n\
         - time-slicing: kernels of different jobs never overlap, so a GPU whose jobs' solo *busy* fractions (NVML\n\
           utilization.gpu) sum to B runs each max(1, B)× slower, × (1 + {ts_d}) per extra job for switching\n\
           (`--switch-overhead`);\n\
         - MPS: kernels overlap up to the SMs' capacity, so a GPU whose jobs' solo *SM activities* sum to S runs each\n\
           max(1, S / {k_d})× slower (`--mps-capacity`), × (1 + {c_d}) per extra job (`--mps-overhead`), and a job under\n\
           MPS runs at {m_d} of its plain speed (`--mps-solo`: resnet50 alone under MPS did 22.3 it/s, plainly 25.8).\n\n\
         The defaults are the fit that minimises the worst error over the measured sets (grid search, re-done now:\n\
         switch overhead {ts:.3}, MPS capacity {k:.2}, overhead {c:.2}, solo {m:.2}). Predicted vs measured aggregate\n\
         throughput (Σ over the jobs of throughput / throughput alone):\n\n\
         | sharing | jobs | measured | predicted | error |\n|---|---|---|---|---|\n",
        ts_d = d.switch_overhead,
        k_d = d.mps_capacity,
        c_d = d.mps_overhead,
        m_d = d.mps_solo,
    );
    let checks = throughput_checks(&rows, &d)?;
    for ch in &checks {
        md.push_str(&format!(
            "| {} | {} | {:.3} | {:.3} | {:+.1}% |\n",
            ch.sharing.name(),
            ch.jobs,
            ch.measured,
            ch.predicted,
            ch.error() * 100.0
        ));
    }
    let worst = checks.iter().map(|c| c.error().abs()).fold(0.0, f64::max);
    let p = fit_power(&rows, "h100-80gb")?;
    md.push_str(&format!(
        "\nWorst error {:.1}% (target ≤ 10%; the fit is in-sample: 9 sets, 4 parameters).\n\n\
         **Power** (`--gpu`, `--idle-w`, `--active-w`, `--sm-w`): idle + a floor while any job runs + a part linear in SM\n\
         activity. Least squares over the measured rows (idle measured): {:.1} W + {:.1} W + {:.0} W × SM activity.\n\
         The A100-40GB profile, which the paper's traces ran on, is not measured here: the H100 fit's dynamic part\n\
         scaled by the TDP ratio (400/700 W) with 60 W idle: {:.0} W + {:.1} W + {:.0} W × SM activity.\n\n\
         | row | measured (W) | predicted (W) | error |\n|---|---|---|---|\n",
        worst * 100.0,
        p.idle_w,
        p.active_w,
        p.sm_w,
        PowerProfile::A100_40GB.idle_w,
        PowerProfile::A100_40GB.active_w,
        PowerProfile::A100_40GB.sm_w,
    ));
    for (row, meas, pred) in power_checks(&rows, &p) {
        md.push_str(&format!("| {row} | {meas:.1} | {pred:.1} | {:+.1}% |\n", (pred / meas - 1.0) * 100.0));
    }
    md.push_str(
        "\nThe tiny MLP is the worst row: a nearly idle GPU (SM activity 0.006) still raised its clocks. Collocated\n\
         pairs draw less than the same work done alone, because the idle power and the floor are paid once.\n\n",
    );
    Ok(md)
}

/// Workloads per measured job they take their activity from.
fn activity_section(map: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(map).map_err(|e| format!("{}: {e}", map.display()))?;
    let mut by: Vec<(String, String, usize)> = Vec::new();
    for line in text.lines().skip(1).filter(|l| !l.is_empty()) {
        let f: Vec<&str> = line.splitn(3, ',').collect();
        let (m, why) = (f.get(1).copied().unwrap_or(""), f.get(2).copied().unwrap_or(""));
        match by.iter_mut().find(|b| b.0 == m) {
            Some(b) => b.2 += 1,
            None => by.push((m.to_string(), why.to_string(), 1)),
        }
    }
    let mut md = String::from(
        "## Workload activity\n\n\
         The paper's traces carry no GPU readings. Each workload takes the solo busy fraction and SM activity of the\n\
         nearest job measured on the H100 (`data/h100/workload-map.csv`; no GPU machine was lent for measuring the\n\
         paper's exact architectures):\n\n| measured job | workloads | why |\n|---|---|---|\n",
    );
    for (m, why, n) in by {
        md.push_str(&format!("| {m} | {n} | {why} |\n"));
    }
    md.push_str(
        "\nThe jobs ran on an A100 in the paper and were measured on an H100, which is faster: on an A100 the same\n\
         jobs keep the GPU busier, so these readings understate interference somewhat.\n\n",
    );
    Ok(md)
}

/// Writes `out/simulation.md` and its plots under `out/simulation/` from
/// the repository's `data/` (`carma/`: traces, workloads, model files;
/// `h100/`: measurements).
pub fn write_report(data: &Path, out: &Path) -> Result<(), String> {
    let img = out.join("simulation");
    let carma = data.join("carma");
    let (map, measured) = (data.join("h100/workload-map.csv"), data.join("h100/collocation.csv"));
    let options = carma.join("job-options.csv");
    let w = workloads(&carma.join("workloads.csv"), Some((&map, &measured)), Some(&options))?;
    let ours = our_estimates(&w, &carma.join("model-summaries"));
    // The model files with the table's batch sizes alone: what the options add.
    let plain = our_estimates(&workloads(&carma.join("workloads.csv"), None, None)?, &carma.join("model-summaries"));
    let d = Assumptions::default();
    let mut md = format!(
        "# Trace simulation: CARMA policies on the paper's traces\n\n\
         Generated by `cargo run --release -p carma-tools --bin carma -- simulate-report --data data --out docs`;\n\
         do not edit by hand. Traces and measured peaks: the CARMA paper's artifacts (arXiv 2508.19073).\n\n\
         The simulator places jobs as the plugin does: each job's request is resolved by `carma_placement::resolve`\n\
         and decided by `carma_placement::decide` on 4 simulated A100-40GB GPUs (the same preconditions: SM activity\n\
         ≤ 0.80 as a monitor would read it, effective free memory ≥ estimate + 2 GiB headroom; the node's history\n\
         of a job and its learned fixed part; MPS's one user per GPU).\n\n\
         **Paper, for comparison** (real runs, 3 GPUs used): {PAPER}.\n\n\
         ## Assumptions (each is a `carma simulate` flag)\n\n\
         - Run time alone: the paper's `exclusive_minutes` (the mnist row, which has none: minutes per epoch × epochs).\n\
         - Memory: grows linearly from 0 to the measured peak over the first {ramp} s of a run (`--ramp`). A GPU whose\n\
           allocations pass its capacity OOMs the job that started last; it is rerun on an idle GPU (recovery queue first).\n\
         - Interference and power: calibrated below (`--sharing`, `--gpu`).\n\
         - Queue: first-in first-out, head-of-line blocking, as in CARMA.\n\
         - Multi-GPU rows (gpt2, xlnet) use 2 GPUs each.\n\
         - Estimators: `oracle` is the measured peak; `carma` is this project's estimator run on each workload's model\n\
           file with the options its user would give srun/sbatch, exactly as the plugin runs it (a file it refuses means\n\
           whole GPUs, as in the plugin); `gpumemnet` and `faketensor` are the paper's published estimates.\n\n",
        ramp = d.ramp_s,
    );
    md.push_str(&calibration(&measured)?);
    md.push_str(&activity_section(&map)?);
    // Our estimator against the measured peaks.
    let mut names: Vec<&String> = w.keys().collect();
    names.sort();
    let (mut under, mut whole, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for n in &names {
        match ours.get(*n).copied().flatten() {
            Some(e) if e < w[*n].peak_mib => under.push(format!("{n} ({e} < {} MiB)", w[*n].peak_mib)),
            Some(e) => ratios.push(e as f64 / w[*n].peak_mib as f64),
            None => whole.push(n.as_str()),
        }
    }
    ratios.sort_by(f64::total_cmp);
    md.push_str(&format!(
        "## Our estimator on the trace workloads\n\n\
         {} of {} workloads estimated; under-estimates: {}; median over-provision {:.2}×. {}\n\n",
        under.len() + ratios.len(),
        names.len(),
        if under.is_empty() { "none".to_string() } else { under.join(", ") },
        ratios.get(ratios.len() / 2).copied().unwrap_or(0.0),
        if whole.is_empty() {
            "Every workload has an estimate (torchinfo tables included since #14; dlrm's table is for batch 32768, \
             its rows for batch 8, and mnist_train's is defective: data/README.md)."
                .to_string()
        } else {
            format!("Given whole GPUs (a model file the estimator refuses): {}.", whole.join(", "))
        }
    ));
    md.push_str(&options_section(&options, &w, &ours, &plain)?);

    let mut summary = String::from(
        "## Where we stand\n\n\
         Best CARMA policy against exclusive assignment, per trace, estimator, sharing mode and the reading the\n\
         0.80 cap applies to (`sm`: SM activity, CARMA's; `busy`: the share of time any kernel runs):\n\n\
         | trace | estimates | sharing | cap on | best policy | makespan | SM activity | energy | OOMs (all recovered) |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    let mut ours_vs_oracle = String::from(
        "\nOur estimator against the oracle, per policy (makespan; goal: within 5%):\n\n\
         | trace | sharing | cap on | policy | oracle (h) | ours (h) | difference | OOMs with ours | raised by history | by the learned fixed part |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut detail = String::new();
    for trace in ["trace_t1", "trace_t2"] {
        let mut oracle_rows: HashMap<(&str, &str, String), f64> = HashMap::new();
        for (sharing, cap, ests) in [
            (Sharing::Timeslice, ActivityMetric::Sm, &["oracle", "carma", "gpumemnet", "faketensor"][..]),
            (Sharing::Timeslice, ActivityMetric::Busy, &["oracle", "carma"][..]),
            (Sharing::Mps, ActivityMetric::Sm, &["oracle", "carma"][..]),
        ] {
            for est in ests {
                let estimator = match *est {
                    "oracle" => Estimator::Oracle,
                    "carma" => Estimator::Given(ours.clone()),
                    other => Estimator::Column(other.into()),
                };
                let cfg = report_config(sharing, cap, estimator, &d);
                let outcomes = run_all(&carma.join(format!("{trace}.csv")), &w, &cfg, &Policy::ALL)?;
                let rows: Vec<Summary> = outcomes.iter().map(summarize).collect();
                let unfinished =
                    outcomes.iter().map(|o| o.jobs.iter().filter(|j| j.end_s.is_none()).count()).sum::<usize>();
                if unfinished > 0 {
                    return Err(format!("{trace} {est} {}: {unfinished} jobs never finished", sharing.name()));
                }
                let base = rows.iter().find(|r| r.policy == "exclusive").ok_or("no exclusive run")?;
                let best = rows
                    .iter()
                    .filter(|r| r.policy != "exclusive")
                    .min_by(|x, y| x.makespan_s.total_cmp(&y.makespan_s))
                    .ok_or("no CARMA policy")?;
                summary.push_str(&format!(
                    "| {trace} | {est} | {} | {} | {} | {} | {} | {} | {} |\n",
                    sharing.name(),
                    cap.name(),
                    best.policy,
                    pct(best.makespan_s, base.makespan_s),
                    pct(best.sm_activity, base.sm_activity),
                    pct(best.energy_kwh, base.energy_kwh),
                    best.ooms
                ));
                for r in &rows {
                    match *est {
                        "oracle" => {
                            oracle_rows.insert((sharing.name(), cap.name(), r.policy.clone()), r.makespan_s);
                        }
                        "carma" if r.policy != "exclusive" => {
                            let o = oracle_rows[&(sharing.name(), cap.name(), r.policy.clone())];
                            let run = outcomes.iter().find(|x| x.policy.name() == r.policy).ok_or("no such run")?;
                            ours_vs_oracle.push_str(&format!(
                                "| {trace} | {} | {} | {} | {:.2} | {:.2} | {} | {} | {} | {} |\n",
                                sharing.name(),
                                cap.name(),
                                r.policy,
                                o / 3600.0,
                                r.makespan_s / 3600.0,
                                pct(r.makespan_s, o),
                                r.ooms,
                                run.history_raised,
                                run.learned_raised
                            ));
                        }
                        _ => {}
                    }
                }
                detail.push_str(&format!(
                    "### {trace}, estimates: {est}, sharing: {}, cap on {}\n\n{}\n",
                    sharing.name(),
                    cap.name(),
                    table(&rows)
                ));
                std::fs::create_dir_all(&img).map_err(|e| e.to_string())?;
                std::fs::write(img.join(format!("{trace}-{est}-{}-{}.csv", sharing.name(), cap.name())), csv(&rows))
                    .map_err(|e| e.to_string())?;
                if *est == "oracle" && sharing == Sharing::Mps {
                    let pair: Vec<Outcome> =
                        outcomes.into_iter().filter(|o| matches!(o.policy, Policy::Exclusive | Policy::Magm)).collect();
                    let files = plots(&img, trace, &pair)?;
                    let sm: Vec<String> = files
                        .iter()
                        .filter(|f| f.contains("-sm-"))
                        .map(|f| format!("![{f}](simulation/{f})"))
                        .collect();
                    detail.push_str(&format!(
                        "SM activity per GPU over time, exclusive vs magm:\n\n{}\n\n",
                        sm.join("\n")
                    ));
                }
            }
        }
    }
    md.push_str(&summary);
    md.push_str(&ours_vs_oracle);
    md.push_str(HISTORY_NOTE);
    md.push_str(&admission_section(&carma, &w)?);
    md.push_str(&attribution(&carma, &w, &ours, &plain, &d)?);
    md.push_str(&format!("\n**The paper** (best configuration, real runs): {PAPER}.\n\n"));
    md.push_str(READING);
    md.push_str("\n## Every run\n\n");
    md.push_str(&detail);
    std::fs::write(out.join("simulation.md"), md).map_err(|e| e.to_string())?;
    println!("wrote {}", out.join("simulation.md").display());
    Ok(())
}

/// A trace on a cluster, with its workloads.
type Case = (String, Cluster, Vec<crate::TraceJob>, HashMap<String, Workload>);

/// How slurmctld's choice of node changes what CARMA can do (#30), on the
/// paper's traces scaled to 64 nodes and on a synthetic trace of 64 nodes x
/// 8 GPUs: today's shard counts, shards as memory, and the cluster-wide
/// CARMA the simulator modelled before.
fn admission_section(carma: &Path, w: &HashMap<String, Workload>) -> Result<String, String> {
    let mut md = String::from(
        "\n## Which node: slurmctld's choice before CARMA's (#30)\n\n\
         Slurm, not CARMA, chooses the node. `shards`: today's configuration, 8 shards per GPU, a job asks one per\n\
         GPU and goes to the first node with that many free; CARMA then decides on that node alone, and a job it\n\
         cannot place there fails (after `timeouts.wait` on a real node). `memory-shards`: each GPU offers its memory\n\
         in GiB as shards and a job asks its estimate plus headroom in GiB, so slurmctld picks a node and GPU with\n\
         that memory unpromised, and CARMA checks its preconditions on that GPU. `anywhere`: CARMA's decision tried\n\
         on every node, which no Slurm does (the simulator's model before #30). Measured peaks as estimates,\n\
         policy magm, time-sliced with the cap on busy time; \"failed\" counts jobs CARMA could not place where\n\
         Slurm sent them, \"with room elsewhere\" those another node could have taken at that moment.\n\
         \"GPU chosen by\": carma.yaml `gpu_owner` (#37). `slurm` keeps CARMA to the GPU of the job's shard, which\n\
         slurmctld takes from the first GPU with one free (one job shard of 8 per GPU beside `carmamem` under\n\
         node-memory); `carma` lets the policy pick any GPU of the node. Under `slurm` a job of several GPUs holds\n\
         them whole (`--gres=gpu:N`: Slurm takes one job's shards from one GPU). Shards as memory are Slurm's\n\
         choice either way (assuming `MULTIPLE_SHARING_GRES_PJ` for jobs of several GPUs), `anywhere` is CARMA's.\n\n\
         | trace | cluster | admission | GPU chosen by | jobs | finished | failed | with room elsewhere | handed back | makespan (h) | mean wait (min) | GPU memory used (GiB, mean) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let d = Assumptions::default();
    let params = Params { metric: ActivityMetric::Busy, ..Params::default() };
    let mut cases: Vec<Case> = Vec::new();
    for name in ["trace_t1", "trace_t2"] {
        // 64 copies of the paper's 60-job trace, one per node's worth of GPUs,
        // each job submitted at its offset.
        let one = read_trace(&carma.join(format!("{name}.csv")))?;
        let mut t: Vec<crate::TraceJob> = (0..64u32)
            .flat_map(|copy| one.iter().map(move |j| crate::TraceJob { seq: copy * 1000 + j.seq, ..j.clone() }))
            .collect();
        t.sort_by(|a, b| a.submit_s.total_cmp(&b.submit_s).then(a.seq.cmp(&b.seq)));
        cases.push((format!("{name} x64"), Cluster { nodes: 64, gpus_per_node: 4, mem_mib: 40 * 1024 }, t, w.clone()));
    }
    // Synthetic: the paper's single-GPU workloads shortened 10x, 20,000 jobs
    // arriving every 0.4 s on average (deterministic), on 64 x 8 GPUs.
    let (synthetic, short) = crate::input::synthetic(w, 20_000, 0.4, 7);
    cases.push((
        "synthetic 20,000".into(),
        Cluster { nodes: 64, gpus_per_node: 8, mem_mib: 40 * 1024 },
        synthetic,
        short,
    ));
    for (label, cluster, trace, workloads) in &cases {
        let (carma, slurm) = (GpuOwner::Carma, GpuOwner::Slurm);
        for (admission, gpu_owner, least_loaded) in [
            (Admission::Shards { per_gpu: 8, hand_back: 0 }, carma, false),
            (Admission::Shards { per_gpu: 8, hand_back: 0 }, slurm, false),
            (Admission::Shards { per_gpu: 8, hand_back: 3 }, carma, false),
            (Admission::Shards { per_gpu: 8, hand_back: 3 }, slurm, false),
            (Admission::Shards { per_gpu: 8, hand_back: 3 }, slurm, true),
            (Admission::Shards { per_gpu: 2, hand_back: 3 }, slurm, false),
            (Admission::Shards { per_gpu: 1, hand_back: 3 }, slurm, false),
            (Admission::MemoryShards { hand_back: 0 }, slurm, false),
            (Admission::MemoryShards { hand_back: 3 }, slurm, false),
            (Admission::Informed, slurm, false),
            (Admission::NodeMemory { hand_back: 3 }, carma, false),
            (Admission::NodeMemory { hand_back: 3 }, slurm, false),
            (Admission::NodeMemory { hand_back: 3 }, slurm, true),
            (Admission::Anywhere, carma, false),
        ] {
            let cfg = SimConfig {
                cluster: *cluster,
                policy: Policy::Magm,
                estimator: Estimator::Oracle,
                params,
                assumptions: Assumptions { sample_s: 0.0, ..d.clone() },
                admission,
                gpu_owner,
                least_loaded,
            };
            let o = simulate(trace, workloads, &cfg)?;
            let finished = o.jobs.iter().filter(|j| j.end_s.is_some()).count();
            let failed = o.jobs.iter().filter(|j| j.failed_no_fit).count();
            let wrong = o.jobs.iter().filter(|j| j.wrong_node).count();
            let waits: Vec<f64> = o.jobs.iter().filter_map(|j| j.start_s.map(|s| s - j.submit_s)).collect();
            let mem = o.gpu_mem_mib.iter().sum::<f64>() / o.gpu_mem_mib.len().max(1) as f64 / 1024.0;
            md.push_str(&format!(
                "| {label} | {}x{}x{}G | {} | {} | {} | {finished} | {failed} | {wrong} | {} | {:.2} | {:.1} | {mem:.1} |\n",
                cluster.nodes,
                cluster.gpus_per_node,
                cluster.mem_mib / 1024,
                match admission {
                    Admission::Shards { per_gpu, .. } if per_gpu != 8 => format!("{} ({per_gpu} per GPU)", admission.name()),
                    _ => admission.name().to_string(),
                },
                if least_loaded { "slurm, least loaded" } else { gpu_owner.name() },
                o.jobs.len(),
                o.handed_back,
                o.makespan_s / 3600.0,
                crate::engine::mean(&waits) / 60.0,
            ));
        }
    }
    md.push_str(
        "\nWhat this says (these runs are the first measurement of #30's design). Slurm\n\
         fills the lowest-numbered nodes first: with today's 8 shards per GPU it sends up to 32 jobs to a 4-GPU node\n\
         whatever their memory, and in a burst nearly every job lands where CARMA cannot place it while other nodes\n\
         stand empty. Shards as memory stop Slurm from over-promising memory, but not the refusals: slurmctld packs\n\
         the memory of the first GPUs full, and CARMA's activity precondition, which Slurm does not see, refuses the\n\
         busy ones. Handing a refused job back (requeued with that node excluded, at most 3 times) moves it to the\n\
         next low node, as busy. So admission must know what each node's monitor knows, not memory alone:\n\
         `informed` (shards as memory, and each node's carma-monitor withdrawing a GPU's shards from slurmctld while\n\
         its activity is over the cap) fails no job, its makespans within 1.1% of `anywhere`'s and its mean waits at\n\
         most 5.4% longer, but\n\
         Slurm cannot do it: it refuses to change the count of a GRES bound to device files at run time (measured on\n\
         22.05; docs/admission.md). What it can do is `node-memory`: a node-level memory count without device files\n\
         (`carmamem`, GiB), which `scontrol update` changes at run time, set by each node's monitor to the memory of\n\
         its GPUs under the cap; slurmctld picks the node by it and CARMA the GPUs. It fails no job of the synthetic\n\
         trace and 5.4–6.2% of the scaled paper traces, after 3 hand-backs, where a node's free memory is split across\n\
         GPUs none of which fits the job. Model simplifications: a refused job fails at once (a real node waits\n\
         `timeouts.wait` first), a handed-back job is tried again at once, and slurmctld sees a monitor's update at\n\
         once (a real one a monitor interval and\n\
         an `scontrol update` later); `anywhere` is no Slurm's behaviour but the best a cluster-wide CARMA could do.\n\n\
         Whose choice of GPU stands (#37, rows `slurm` and `least loaded` added 2026-11-26 beside the earlier\n\
         rows, none of which moved). Under\n\
         `gpu_owner: slurm`, the plugin's default, slurmctld takes a job's shard from the first GPU with one free,\n\
         so the second job of a node lands beside the first whatever their memory, and CARMA, kept to that GPU,\n\
         refuses it while other GPUs stand empty: with 8 job shards per GPU 205, 205 and 61 jobs finish of 3840,\n\
         3840 and 20,000, with hand-back 244, 244 and 236, and node-memory admission does no better (the same\n\
         244, 244 and 236: its node-level count admits the job, its shard still comes from the first GPU). slurm.conf\n\
         `SelectTypeParameters=...,LL_SHARED_GRES` (Slurm 23.11 and later: shards from the least loaded GPU,\n\
         measured on 26.05.5) spreads them: with hand-back 400, 400 and 1510 finish (CARMA's own choice on the\n\
         same shards: 152, 208 and 1759), and with node-memory 1821, 1311 and 4734. Fewer shards per GPU spread\n\
         jobs too: 2 per GPU finish 604, 800 and 658; 1 per GPU fails none but collocates nothing (makespans 7.71 and\n\
         9.48 h against `anywhere`'s 6.39 and 8.41, mean waits 121 and 94 minutes). So under Slurm's ownership\n\
         slurmctld must know each GPU's free memory and activity (`informed`), which it\n\
         does not allow at run time for a GRES with device files (docs/admission.md); until it does,\n\
         `gpu_owner: carma` on nodes whose every GPU job is CARMA's is what collocates (node-memory: 3601, 3633\n\
         and 20,000 finish).\n",
    );
    Ok(md)
}

/// Why the figures with our estimator moved when the simulator began to
/// decide as the plugin does (a dated record, not regenerated).
const HISTORY_NOTE: &str = "\nThe last two columns count placements whose estimate the node raised. Until #29 (2026-11-24) the\n\
simulator called the policy code alone; since then it runs the plugin's decision, so a workload's later run on\n\
a node gets the node's history of it (its observed peak + 10%) where that is above our estimate. Only runs with\n\
our estimator can move: measured and column estimates are declared memory, which carries no signature, as in\n\
the plugin. What moved then, all time-sliced with the cap on SM activity: trace_t1 ff 9.50 → 9.65 h and bf\n\
9.36 → 9.76 h; trace_t2 magm 10.02 → 10.84 h, bf 12.32 → 11.59 h and lug 10.49 → 10.52 h, so trace_t2's best\n\
policy there became rr (+6.2%, was magm +3.6%). A history-raised estimate reserves more, so fewer jobs\n\
collocate where memory is what limits them; with the busy cap and under MPS activity limits collocation\n\
first, and no makespan moved. The learned fixed part raised none then: a job's observed peak minus the model\n\
part of our estimate stayed under the 700 MiB the estimates carried.\n\n\
Since 2026-11-25 (#38, #44) the estimates carry 1 GiB of fixed memory (PyTorch 2.x on an H100), and each node\n\
learns each user's fixed part from their finished jobs (`estimator.learn_runtime`: after 3 jobs, the largest of\n\
the last 32 observed peaks less the model part, at most 4 GiB). Every simulated job is one user's, so the\n\
2-GPU XLNet-large row, 4.2 GiB over our estimate, sets that user's fixed part to the 4 GiB maximum and raises\n\
nearly every later placement (24–40 per run, the last column); the node's history, below that, raises almost\n\
none (3–10 per run before, 0–1 now). Regenerated on 2026-11-26 (#37), ours moved (makespan, h). Time-sliced\n\
with the SM cap, where larger reservations mostly refuse collocations that time-slicing makes slow (trace_t1's\n\
magm, bf and lug 1.4–2.1 h faster, its rr and ff 0.2 h slower; every policy of trace_t2 0.5–2.8 h faster): trace_t1 rr 8.09 →\n\
8.28, magm 10.07 → 8.02, ff 8.09 → 8.26, bf 9.81 → 7.76, lug 9.87 → 8.49; trace_t2 rr 10.27 → 9.29, magm\n\
10.84 → 9.11, ff 13.62 → 10.79, bf 10.55 → 10.02, lug 10.52 → 9.94. Where collocation pays they collocate\n\
less: with the busy cap trace_t1 +0.10 to +0.33 h, trace_t2 −0.32 (rr) to +0.14 h; under MPS trace_t1 +0.44\n\
to +0.72 h (lug −0.03), trace_t2 −0.03 to +0.37 h. The oracle's, GPUMemNet's and FakeTensor's runs declare\n\
their memory, which carries no fixed part to learn, and did not move.\n";

/// The options the jobs' users give (data/carma/job-options.csv), each
/// row with the estimate it makes and the one the model file alone makes.
fn options_section(
    path: &Path,
    w: &HashMap<String, Workload>,
    ours: &HashMap<String, Option<u64>>,
    plain: &HashMap<String, Option<u64>>,
) -> Result<String, String> {
    let mut md = String::from(
        "The options each language-model job's user gives srun/sbatch (`--carma-batch-size` per GPU,\n\
         `--carma-seq-len`), read from the paper's training scripts (`data/carma/job-options.csv`; the other rows'\n\
         table batch is already per GPU, and their model files fix the input size):\n\n\
         | workload | GPUs | options | estimate (MiB) | without them | measured | the script says |\n\
         |---|---|---|---|---|---|---|\n",
    );
    let mib =
        |m: &HashMap<String, Option<u64>>, n: &str| m.get(n).copied().flatten().map_or("—".into(), |v| v.to_string());
    for o in read_job_options(path)? {
        let name = o.workload.as_str();
        let x = w.get(name).ok_or_else(|| format!("{} line {}: no workload '{name}'", path.display(), o.line))?;
        let opt = |flag: &str, v: Option<u32>| v.map(|v| format!("`--carma-{flag}={v}`"));
        let opts: Vec<String> =
            [opt("batch-size", x.batch_size), opt("seq-len", x.seq_len)].into_iter().flatten().collect();
        md.push_str(&format!(
            "| {name} | {} | {} | {} | {} | {} | {} |\n",
            x.gpus,
            opts.join(" "),
            mib(ours, name),
            mib(plain, name),
            x.peak_mib,
            o.source
        ));
    }
    md.push('\n');
    Ok(md)
}

/// Where our estimates lose makespan against the oracle's: the mean over
/// the CARMA policies of ours / oracle − 1 (and the same for the model
/// files alone, without the jobs' options), and how much of it goes when
/// one model file's workloads get their measured peaks instead, in the two
/// configurations where collocation pays.
fn attribution(
    carma: &Path,
    w: &HashMap<String, Workload>,
    ours: &HashMap<String, Option<u64>>,
    plain: &HashMap<String, Option<u64>>,
    d: &Assumptions,
) -> Result<String, String> {
    let policies: Vec<Policy> = Policy::ALL.into_iter().filter(|p| *p != Policy::Exclusive).collect();
    let mut files: Vec<&str> = w
        .values()
        .filter(|x| ours.get(&x.name).copied().flatten() != Some(x.peak_mib))
        .filter_map(|x| x.model_file.as_deref())
        .collect();
    files.sort_unstable();
    files.dedup();
    let mut md = String::from(
        "\nWhere ours loses: the mean over the five policies of ours / oracle − 1 (makespan), and how much of it\n\
         goes when one model file's workloads get their measured peaks instead of our estimates (largest first;\n\
         a negative figure: that file's estimates *help*, by refusing collocations that slow the trace):\n\n\
         | trace | sharing | cap on | mean gap | without the jobs' options | closed by measuring (model file: points) |\n\
         |---|---|---|---|---|---|\n",
    );
    for (sharing, cap) in [(Sharing::Mps, ActivityMetric::Sm), (Sharing::Timeslice, ActivityMetric::Busy)] {
        for trace in ["trace_t1", "trace_t2"] {
            let path = carma.join(format!("{trace}.csv"));
            let makespans = |e: Estimator| -> Result<Vec<f64>, String> {
                let cfg = report_config(sharing, cap, e, d);
                Ok(run_all(&path, w, &cfg, &policies)?.iter().map(|o| summarize(o).makespan_s).collect())
            };
            let oracle = makespans(Estimator::Oracle)?;
            let gap = |e: Estimator| -> Result<f64, String> {
                let m = makespans(e)?;
                Ok(m.iter().zip(&oracle).map(|(a, b)| a / b - 1.0).sum::<f64>() / m.len() as f64)
            };
            let base = gap(Estimator::Given(ours.clone()))?;
            let without = gap(Estimator::Given(plain.clone()))?;
            let mut closed = Vec::new();
            for f in &files {
                let mut fixed = ours.clone();
                for x in w.values().filter(|x| x.model_file.as_deref() == Some(f)) {
                    fixed.insert(x.name.clone(), Some(x.peak_mib));
                }
                closed.push((base - gap(Estimator::Given(fixed))?, *f));
            }
            closed.sort_by(|a, b| b.0.abs().total_cmp(&a.0.abs()));
            let top: Vec<String> = closed
                .iter()
                .filter(|(c, _)| c.abs() >= 0.005)
                .take(4)
                .map(|(c, f)| format!("{f}: {:+.1}", c * 100.0))
                .collect();
            md.push_str(&format!(
                "| {trace} | {} | {} | {:+.1}% | {:+.1}% | {} |\n",
                sharing.name(),
                cap.name(),
                base * 100.0,
                without * 100.0,
                if top.is_empty() { "none above 0.5 points".to_string() } else { top.join("; ") }
            ));
        }
    }
    Ok(md)
}

/// How to read the figures. Written against the figures of the committed
/// report: regenerate and re-read it when the models change.
const READING: &str = "## Reading these numbers\n\n\
- **Under time-slicing, CARMA's SM-activity cap lets collocation hurt.** Jobs that share a GPU's time slow\n\
  each other, so a monitor reads less SM activity than the jobs' solo figures and lets more jobs onto a GPU\n\
  whose time is already spent: with the oracle, even the best policy takes +2% to +10% longer than exclusive. Capping the *busy* share instead (NVML\n\
  utilization.gpu, which time-slicing exhausts) refuses those collocations: −14% to −17%. (Best policy per\n\
  trace, both figures.) The old model\n\
  (slowdown by summed SM activity, +10% per job) credited two heavy jobs with +40% aggregate throughput\n\
  where the H100 measured −8%, which is why the previous report showed gains here.\n\
- **MPS is where collocation pays**, with the SM cap CARMA uses: −30% to −39% makespan, +43% to +65% SM\n\
  activity and −10% to −13% energy with the oracle. The paper's −35%, +54% and −15% lie in that range.\n\
- **Energy falls wherever makespan falls**: the idle power and the active floor are paid once for two jobs'\n\
  work, as the H100 measured.\n\
- **Our estimator**, given the options each job's user would pass (per-GPU batch and sequence length, read\n\
  from the paper's scripts: table above), is within 5% of the oracle on trace_t2 in both configurations where\n\
  collocation pays (mean over the policies +1.3% under MPS, +1.5% time-sliced with the busy cap) and on\n\
  trace_t1 time-sliced (+3.3%), but +9.6% behind it on trace_t1 under MPS (best policy against best: −33.8%\n\
  against −39.2% makespan), so the 5% goal is not met there. The simulator runs every job as one user, whose\n\
  learned fixed part the largest shortfall sets: the 2-GPU XLNet-large row, whose model keeps 12.2 GiB at 4\n\
  per GPU as measured on a CPU with CUDA's dropout masks while the A100 held 18.9 GiB (docs/estimator.md),\n\
  raises nearly every later estimate by 3 GiB, and measuring that one workload closes the largest part of three of\n\
  the four gaps (the attribution table); on a cluster each user learns from their own jobs. Without the jobs' options the\n\
  gaps are +11.2% and +4.7% on trace_t1, +4.0% and +2.3% on trace_t2 (MPS, then time-sliced): gpt2-large's\n\
  listing names no sequence length, so the analytic model takes its 1024 positions, and the table's batch of 8\n\
  is what the script's DataParallel splits over the row's 2 GPUs: 65 GiB per GPU, whole GPUs. With\n\
  `--carma-batch-size=4 --carma-seq-len=512` it is 27,096 MiB for 28,356 measured (0.96×), 1.2 GiB short,\n\
  inside the 2 GiB headroom. BERT-base (24,317 MiB for 19,828, 1.23×) follows XLNet-large and EfficientNet in\n\
  trace_t1's MPS row of the attribution table. Its listing names `BertSdpaSelfAttention`: it ran fused attention, which keeps no\n\
  attention probabilities, and the CPU check of docs/estimator.md found the A100 used 1.00× the fused figure,\n\
  while the analytic model keeps every probability. That stays until a GPU checks it: gpt2-large's listing\n\
  names SDPA too, and its estimate, probabilities included, is already short of its measured peak\n\
  (DataParallel's gathered outputs and per-replica gradients on GPU 0 are not modelled). It under-estimates\n\
  four workloads (gpt2-large's and XLNet-large's 2-GPU rows, above; the dlrm and mnist summaries, which do not\n\
  describe the rows' jobs); no run left a job unrecovered.\n\
- **GPUMemNet's coarse bins** happen to help under time-slicing with the SM cap: they refuse the harmful\n\
  collocations that finer estimates allow.\n\
- **Caveats**: activity comes from the nearest job measured on an H100 (above), power on the A100 is scaled\n\
  from the H100 fit, and the interference fit is in-sample on nine measured sets.\n";

#[cfg(test)]
mod tests {
    use super::*;

    /// The estimate follows the options the job's user gives: gpt2-large
    /// declared as its script runs it (4 per GPU, 512 tokens) leaves room
    /// on a 40 GB GPU beside it, where its model file and the table's batch
    /// alone ask for more than a GPU holds.
    #[test]
    fn our_estimates_follow_the_jobs_options() {
        let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/carma");
        let (table, options) = (data.join("workloads.csv"), data.join("job-options.csv"));
        let models = data.join("model-summaries");
        let declared = our_estimates(&workloads(&table, None, Some(&options)).unwrap(), &models);
        let plain = our_estimates(&workloads(&table, None, None).unwrap(), &models);
        let (with, without) = (declared["gpt2_large_2"].unwrap(), plain["gpt2_large_2"].unwrap());
        assert!(with + 2048 + 4096 <= 40 * 1024, "{with} MiB leaves no neighbour room on a 40 GB GPU");
        assert!(without > 40 * 1024, "{without} MiB");
        assert_eq!(declared["resnet"], plain["resnet"]);
    }

    /// #17's condition on our estimator: whatever it under-estimates, every
    /// job of both traces finishes, each OOM rerun by recovery, under every
    /// policy, sharing mode and capped reading the report shows.
    #[test]
    fn our_estimates_never_leave_a_job_unrecovered() {
        let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data");
        let (map, measured) = (data.join("h100/workload-map.csv"), data.join("h100/collocation.csv"));
        let options = data.join("carma/job-options.csv");
        let w = workloads(&data.join("carma/workloads.csv"), Some((&map, &measured)), Some(&options)).unwrap();
        let ours = our_estimates(&w, &data.join("carma/model-summaries"));
        assert!(ours.values().all(Option::is_some), "a workload without an estimate: {ours:?}");
        // Our estimates, and the same halved: the halved ones do
        // under-estimate, so recovery is exercised whatever ours do.
        let halved: HashMap<String, Option<u64>> = ours.iter().map(|(k, v)| (k.clone(), v.map(|m| m / 2))).collect();
        let mut crashes = 0;
        for (sharing, cap) in [
            (Sharing::Timeslice, ActivityMetric::Sm),
            (Sharing::Timeslice, ActivityMetric::Busy),
            (Sharing::Mps, ActivityMetric::Sm),
        ] {
            for (estimates, which) in [(&ours, "ours"), (&halved, "halved")] {
                for trace in ["trace_t1", "trace_t2"] {
                    let cfg = report_config(sharing, cap, Estimator::Given(estimates.clone()), &Assumptions::default());
                    for o in run_all(&data.join(format!("carma/{trace}.csv")), &w, &cfg, &Policy::ALL).unwrap() {
                        let what = format!("{which} {trace} {} {} {}", sharing.name(), cap.name(), o.policy);
                        assert!(o.jobs.iter().all(|j| j.end_s.is_some()), "{what}: a job never finished");
                        assert_eq!(o.recoveries, o.ooms, "{what}");
                        crashes += o.ooms;
                    }
                }
            }
        }
        assert!(crashes > 0, "no OOM at all: the test would not see an unrecovered one");
    }
}
