//! `carma simulate` and `carma simulate-report`: replay a trace through the
//! real placement engine under one or all policies.

use crate::args::Args;
use carma_config::{Policy, parse_size_mib};
use carma_placement::Params;
use carma_sim::engine::Outcome;
use carma_sim::report::{Summary, csv, summarize, table};
use carma_sim::svg::line_chart;
use carma_sim::{Assumptions, Cluster, Estimator, SimConfig, read_trace, read_workloads, simulate};
use std::path::{Path, PathBuf};

pub const USAGE: &str = "carma simulate --trace FILE --workloads FILE [--cluster 1x4x40G] [--policy POLICY | --compare]
                [--estimator oracle|horus|faketensor|gpumemnet] [--sm-cap 0.8] [--headroom 2G]
                [--ramp 60] [--penalty 0.1] [--idle-w 60] [--max-w 400] [--json] [--csv FILE] [--plots DIR]
carma simulate-report --data DIR --out DIR    (the report in docs/simulation.md)";

const FLAGS: &[&str] = &[
    "trace",
    "workloads",
    "cluster",
    "policy",
    "estimator",
    "sm-cap",
    "headroom",
    "ramp",
    "penalty",
    "idle-w",
    "max-w",
    "csv",
    "plots",
];

fn num(v: &str) -> Result<f64, String> {
    v.parse::<f64>().ok().filter(|x| x.is_finite() && *x >= 0.0).ok_or_else(|| "expected a number >= 0".into())
}

fn config(a: &Args) -> Result<SimConfig, String> {
    let d = Assumptions::default();
    Ok(SimConfig {
        cluster: Cluster::parse(a.get("cluster").unwrap_or("1x4x40G"))?,
        policy: a.parsed("policy", |v| v.parse::<Policy>())?.unwrap_or(Policy::Magm),
        estimator: match a.get("estimator").unwrap_or("oracle") {
            "oracle" => Estimator::Oracle,
            other => Estimator::Column(other.to_string()),
        },
        params: Params {
            sm_activity_cap: a.parsed("sm-cap", num)?.unwrap_or(0.8),
            headroom_mib: a.parsed("headroom", parse_size_mib)?.unwrap_or(2048),
        },
        assumptions: Assumptions {
            ramp_s: a.parsed("ramp", num)?.unwrap_or(d.ramp_s),
            penalty: a.parsed("penalty", num)?.unwrap_or(d.penalty),
            idle_w: a.parsed("idle-w", num)?.unwrap_or(d.idle_w),
            max_w: a.parsed("max-w", num)?.unwrap_or(d.max_w),
            sample_s: d.sample_s,
        },
    })
}

fn run_all(trace: &Path, workloads: &Path, cfg: &SimConfig, policies: &[Policy]) -> Result<Vec<Outcome>, String> {
    let t = read_trace(trace)?;
    let w = read_workloads(workloads)?;
    policies.iter().map(|&policy| simulate(&t, &w, &SimConfig { policy, ..cfg.clone() })).collect()
}

/// Writes one SVG per GPU and metric, one line per policy; returns the file names.
fn plots(dir: &Path, prefix: &str, outcomes: &[Outcome]) -> Result<Vec<String>, String> {
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

pub fn cmd_simulate(argv: Vec<String>) -> Result<(), String> {
    let a = Args::parse(argv, FLAGS, &["compare", "json"])?;
    let trace = PathBuf::from(a.get("trace").ok_or("--trace FILE is required")?);
    let workloads = PathBuf::from(a.get("workloads").ok_or("--workloads FILE is required")?);
    let cfg = config(&a)?;
    let policies: Vec<Policy> = if a.has("compare") { Policy::ALL.to_vec() } else { vec![cfg.policy] };
    let outcomes = run_all(&trace, &workloads, &cfg, &policies)?;
    let rows: Vec<Summary> = outcomes.iter().map(summarize).collect();
    if a.has("json") {
        println!("{}", serde_json::to_string_pretty(&rows).unwrap_or_default());
    } else {
        print!("{}", table(&rows));
    }
    if let Some(f) = a.get("csv") {
        std::fs::write(f, csv(&rows)).map_err(|e| format!("{f}: {e}"))?;
    }
    if let Some(d) = a.get("plots") {
        let stem = trace.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "trace".into());
        plots(Path::new(d), &stem, &outcomes)?;
    }
    Ok(())
}

/// The paper's reported gains of its best configuration over exclusive
/// assignment (arXiv 2508.19073 v3).
const PAPER: &str =
    "about −35% end-to-end trace time, +54% GPU (SM) utilization, −15% GPU energy (v1: −26.7%, +39.3%, −14.2%)";

pub fn cmd_report(argv: Vec<String>) -> Result<(), String> {
    let a = Args::parse(argv, &["data", "out"], &[])?;
    let data =
        PathBuf::from(a.get("data").ok_or("--data DIR (with workloads.csv, trace_t1.csv, trace_t2.csv) is required")?);
    let out = PathBuf::from(a.get("out").ok_or("--out DIR is required")?);
    let img = out.join("simulation");
    let workloads = data.join("workloads.csv");
    let d = Assumptions::default();
    let mut md = format!(
        "# Trace simulation: CARMA policies on the paper's traces\n\n\
         Generated by `cargo run --release -p carma-tools --bin carma -- simulate-report --data data/carma --out docs`;\n\
         do not edit by hand. Traces and measured peaks: the CARMA paper's artifacts (arXiv 2508.19073).\n\n\
         The simulator places jobs with the plugin's own code (`carma_placement::choose`, same preconditions:\n\
         SM activity ≤ 0.80, effective free memory ≥ estimate + 2 GiB headroom) on 4 simulated A100-40GB GPUs.\n\n\
         **Paper, for comparison** (real runs, 3 GPUs used): {PAPER}.\n\n\
         ## Assumptions (each is a `carma simulate` flag)\n\n\
         - Run time alone: the paper's `exclusive_minutes` (the mnist row, which has none: 1 minute).\n\
         - Memory: grows linearly from 0 to the measured peak over the first {ramp} s of a run (`--ramp`). A GPU whose\n\
           allocations pass its capacity OOMs the job that started last; it is rerun on an idle GPU (recovery queue first).\n\
         - Interference: solo SM activity per dataset (ImageNet 0.65, wikitext-2 0.75, COCO/VOC 0.60, CIFAR-100 0.25,\n\
           MNIST 0.10, Criteo 0.40). Co-runners whose SM activities sum to D > 1 each run D× slower, and every extra job\n\
           on a GPU adds {pen:.0}% (`--penalty`). These are assumptions, not measurements: the paper's traces carry no SM data.\n\
         - Power: {idle} W idle + linear in SM activity up to {max} W (`--idle-w`, `--max-w`); energy counts all 4 GPUs over the makespan.\n\
         - Queue: first-in first-out, head-of-line blocking, as in CARMA.\n\
         - Multi-GPU rows (gpt2, xlnet) use 2 GPUs each.\n\n",
        ramp = d.ramp_s,
        pen = d.penalty * 100.0,
        idle = d.idle_w,
        max = d.max_w
    );
    for trace in ["trace_t1", "trace_t2"] {
        for (est, what) in [
            ("oracle", "oracle (measured peak)"),
            ("gpumemnet", "the paper's GPUMemNet estimates (8 GB bins)"),
            ("faketensor", "the paper's FakeTensor estimates"),
        ] {
            let cfg = SimConfig {
                cluster: Cluster::parse("1x4x40G")?,
                policy: Policy::Magm,
                estimator: if est == "oracle" { Estimator::Oracle } else { Estimator::Column(est.into()) },
                params: Params { sm_activity_cap: 0.8, headroom_mib: 2048 },
                assumptions: d.clone(),
            };
            let outcomes = run_all(&data.join(format!("{trace}.csv")), &workloads, &cfg, &Policy::ALL)?;
            let rows: Vec<Summary> = outcomes.iter().map(summarize).collect();
            md.push_str(&format!("## {trace}, estimates: {what}\n\n{}\n", table(&rows)));
            std::fs::create_dir_all(&img).map_err(|e| e.to_string())?;
            std::fs::write(img.join(format!("{trace}-{est}.csv")), csv(&rows)).map_err(|e| e.to_string())?;
            if est == "oracle" {
                let pair: Vec<Outcome> =
                    outcomes.into_iter().filter(|o| matches!(o.policy, Policy::Exclusive | Policy::Magm)).collect();
                let files = plots(&img, trace, &pair)?;
                let sm: Vec<String> =
                    files.iter().filter(|f| f.contains("-sm-")).map(|f| format!("![{f}](simulation/{f})")).collect();
                md.push_str(&format!("SM activity per GPU over time, exclusive vs magm:\n\n{}\n\n", sm.join("\n")));
            }
        }
    }
    md.push_str(
        "## Reading these numbers\n\n\
         - Makespan and SM activity move like the paper's: collocation finishes the same trace in roughly a third less\n\
           time with most GPUs busier. Our SM gain is larger because our interference model is mild for jobs whose\n\
           SM activities sum to at most 1; the paper's jobs also compete for memory bandwidth.\n\
         - Energy does not fall as in the paper: a power model linear in SM activity credits collocation only with the\n\
           idle power of the shorter makespan, while the same SM work is done. The paper measured −15%, which\n\
           suggests real power is sub-linear in SM activity; explore with `--idle-w` and `--max-w`.\n\
         - Estimates matter: coarse GPUMemNet bins collocate less than the oracle. FakeTensor's \"failed\" rows (40000)\n\
           take whole GPUs, and its underestimates would cause OOM crashes: on trace_t1, `--sm-cap 1.0` gives 5 OOMs\n\
           (rerun on idle GPUs by the recovery queue), while the default SM cap of 0.80 lets at most two large jobs\n\
           share a GPU and avoids them.\n",
    );
    std::fs::write(out.join("simulation.md"), md).map_err(|e| e.to_string())?;
    println!("wrote {}", out.join("simulation.md").display());
    Ok(())
}
