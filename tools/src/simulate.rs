//! `carma simulate` and `carma simulate-report`: the command lines over
//! `carma_simulator` (the report itself is `carma_simulator::paper`).

use crate::args::Args;
use carma_config::{ActivityMetric, GpuOwner, Policy, parse_size_mib};
use carma_placement::Params;
use carma_simulator::paper::{estimator, plots, run_all, workloads};
use carma_simulator::report::{Summary, csv, summarize, table};
use carma_simulator::{Admission, Assumptions, Cluster, PowerProfile, Sharing, SimConfig};
use std::path::{Path, PathBuf};

pub const USAGE: &str = "carma simulate --trace FILE --workloads FILE [--cluster 1x4x40G] [--policy POLICY | --compare]
                [--estimator oracle|carma|horus|faketensor|gpumemnet] [--models DIR]
                [--activity MAP --measured CSV] [--job-options CSV] [--sharing timeslice|mps] [--cap-metric sm|busy] [--gpu a100-40gb|h100-80gb]
                [--sm-cap 0.8] [--busy-cap 0.8] [--headroom 2G] [--ramp 60] [--switch-overhead 0.106]
                [--mps-capacity 1.06] [--mps-overhead 0.01] [--mps-solo 0.87]
                [--idle-w W] [--active-w W] [--sm-w W] [--admission anywhere|shards|memory-shards|informed|node-memory]
                [--gpu-owner slurm|carma] [--least-loaded] [--json] [--csv FILE] [--plots DIR]
carma simulate-report --data DIR --out DIR    (the report in docs/simulation.md; DIR is data/)";

const FLAGS: &[&str] = &[
    "trace",
    "workloads",
    "cluster",
    "policy",
    "estimator",
    "models",
    "activity",
    "measured",
    "job-options",
    "sharing",
    "cap-metric",
    "gpu",
    "sm-cap",
    "busy-cap",
    "headroom",
    "ramp",
    "switch-overhead",
    "mps-capacity",
    "mps-overhead",
    "mps-solo",
    "idle-w",
    "active-w",
    "sm-w",
    "csv",
    "plots",
    "admission",
    "gpu-owner",
];

fn num(v: &str) -> Result<f64, String> {
    v.parse::<f64>().ok().filter(|x| x.is_finite() && *x >= 0.0).ok_or_else(|| "expected a number >= 0".into())
}

fn positive(v: &str) -> Result<f64, String> {
    num(v).and_then(|x| if x > 0.0 { Ok(x) } else { Err("expected a number > 0".into()) })
}

fn assumptions(a: &Args) -> Result<Assumptions, String> {
    let d = Assumptions::default();
    let gpu = a.parsed("gpu", PowerProfile::parse)?.unwrap_or(d.power);
    Ok(Assumptions {
        ramp_s: a.parsed("ramp", num)?.unwrap_or(d.ramp_s),
        sharing: a.parsed("sharing", Sharing::parse)?.unwrap_or(d.sharing),
        switch_overhead: a.parsed("switch-overhead", num)?.unwrap_or(d.switch_overhead),
        mps_capacity: a.parsed("mps-capacity", positive)?.unwrap_or(d.mps_capacity),
        mps_overhead: a.parsed("mps-overhead", num)?.unwrap_or(d.mps_overhead),
        mps_solo: a.parsed("mps-solo", positive)?.unwrap_or(d.mps_solo),
        power: PowerProfile {
            name: gpu.name,
            idle_w: a.parsed("idle-w", num)?.unwrap_or(gpu.idle_w),
            active_w: a.parsed("active-w", num)?.unwrap_or(gpu.active_w),
            sm_w: a.parsed("sm-w", num)?.unwrap_or(gpu.sm_w),
        },
        sample_s: d.sample_s,
    })
}

pub fn cmd_simulate(argv: Vec<String>) -> Result<(), String> {
    let a = Args::parse(argv, FLAGS, &["compare", "json", "least-loaded"])?;
    let trace = PathBuf::from(a.get("trace").ok_or("--trace FILE is required")?);
    let table_path = PathBuf::from(a.get("workloads").ok_or("--workloads FILE is required")?);
    let activity = match (a.get("activity"), a.get("measured")) {
        (Some(m), Some(c)) => Some((Path::new(m), Path::new(c))),
        (None, None) => None,
        _ => return Err("--activity MAP and --measured CSV go together".into()),
    };
    let w = workloads(&table_path, activity, a.get("job-options").map(Path::new))?;
    let models = a
        .get("models")
        .map(PathBuf::from)
        .unwrap_or_else(|| table_path.parent().unwrap_or(Path::new(".")).join("model-summaries"));
    let cfg = SimConfig {
        cluster: Cluster::parse(a.get("cluster").unwrap_or("1x4x40G"))?,
        policy: a.parsed("policy", |v| v.parse::<Policy>())?.unwrap_or(Policy::Magm),
        estimator: estimator(a.get("estimator").unwrap_or("oracle"), &w, &models),
        params: Params {
            metric: a.parsed("cap-metric", ActivityMetric::parse)?.unwrap_or_default(),
            sm_activity_cap: a.parsed("sm-cap", num)?.unwrap_or(0.8),
            busy_cap: a.parsed("busy-cap", num)?.unwrap_or(0.8),
            headroom_mib: a.parsed("headroom", parse_size_mib)?.unwrap_or(2048),
            ..Params::default()
        },
        assumptions: assumptions(&a)?,
        admission: a.parsed("admission", Admission::parse)?.unwrap_or_default(),
        // carma.yaml's default: a job runs on its shards' GPU.
        gpu_owner: a.parsed("gpu-owner", GpuOwner::parse)?.unwrap_or(GpuOwner::Slurm),
        least_loaded: a.has("least-loaded"),
    };
    let policies: Vec<Policy> = if a.has("compare") { Policy::ALL.to_vec() } else { vec![cfg.policy] };
    let outcomes = run_all(&trace, &w, &cfg, &policies)?;
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

pub fn cmd_report(argv: Vec<String>) -> Result<(), String> {
    let a = Args::parse(argv, &["data", "out"], &[])?;
    let data =
        PathBuf::from(a.get("data").ok_or(
            "--data DIR (the repository's data/: carma/ with the traces, h100/ with measurements) is required",
        )?);
    let out = PathBuf::from(a.get("out").ok_or("--out DIR is required")?);
    carma_simulator::paper::write_report(&data, &out)
}
