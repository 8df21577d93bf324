//! `carma simulate` and `carma simulate-report`: the command lines over
//! `carma_simulator` (the report itself is `carma_simulator::paper`).

use carma_config::{ActivityMetric, GpuOwner, Policy, parse_size_mib};
use carma_placement::Params;
use carma_simulator::paper::{estimator, plots, run_all, workloads};
use carma_simulator::report::{Summary, csv, summarize, table};
use carma_simulator::{Admission, Assumptions, Cluster, PowerProfile, Sharing, SimConfig};
use std::path::{Path, PathBuf};

/// `carma simulate`'s options: each assumption of the model is one.
/// What slurm-conf-examples/carma.yaml (the configuration the README
/// installs) sets: carma-monitor publishes every second the means over
/// monitor_window. `carma simulate` without flags models what such a
/// site gets.
const SHIPPED_WINDOW_S: f64 = 60.0;
const SHIPPED_PUBLISH_S: f64 = 1.0;

/// The slowdown guard's flags, one definition for `carma simulate` and
/// `carma replay-compare`.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct GuardArgs {
    /// The slowdown guard: no job of a GPU may be predicted to run more than X times slower than alone (carma.yaml max_slowdown); off: no guard
    #[arg(long, value_name = "X|off", default_value = "1.6", value_parser = max_slowdown)]
    pub max_slowdown: f64,
    /// The bound on a job not yet seen alone, taken at its worst (carma.yaml max_slowdown_unprofiled; never below --max-slowdown)
    #[arg(long, value_name = "X|off", default_value = "2.0", value_parser = max_slowdown)]
    pub max_slowdown_unprofiled: f64,
    /// Collocating policies take a GPU with a job before an idle one (carma.yaml idle_first: false)
    #[arg(long)]
    pub no_idle_first: bool,
}

impl GuardArgs {
    /// `p` with the guard these flags set.
    pub fn apply(&self, p: Params) -> Params {
        Params {
            max_slowdown: self.max_slowdown,
            max_slowdown_unprofiled: self.max_slowdown_unprofiled,
            idle_first: !self.no_idle_first,
            ..p
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct SimulateArgs {
    /// The job trace (CSV)
    #[arg(long, value_name = "FILE")]
    pub trace: PathBuf,
    /// The workloads the trace names (CSV: memory, run time, ...)
    #[arg(long, value_name = "FILE")]
    pub workloads: PathBuf,
    /// Nodes x GPUs per node x memory per GPU
    #[arg(long, value_name = "NxGxMEM", default_value = "1x4x40G", value_parser = Cluster::parse)]
    pub cluster: Cluster,
    /// The placement policy
    #[arg(long, value_name = "POLICY", default_value_t = Policy::Magm)]
    pub policy: Policy,
    /// Run every policy (--policy is then left out)
    #[arg(long)]
    pub compare: bool,
    /// Whose memory estimates: oracle, carma, horus, faketensor, gpumemnet (a column of the workloads)
    #[arg(long, value_name = "NAME", default_value = "oracle")]
    pub estimator: String,
    /// The model files `--estimator carma` reads [default: model-summaries/ beside the workloads]
    #[arg(long, value_name = "DIR")]
    pub models: Option<PathBuf>,
    /// Which measured workload each workload's activity comes from (with --measured)
    #[arg(long, value_name = "MAP", requires = "measured")]
    pub activity: Option<PathBuf>,
    /// The measured activity (with --activity), e.g. data/h100/collocation.csv
    #[arg(long, value_name = "CSV", requires = "activity")]
    pub measured: Option<PathBuf>,
    /// The CARMA options each workload's job script implies
    #[arg(long, value_name = "CSV")]
    pub job_options: Option<PathBuf>,
    /// How collocated jobs share a GPU: timeslice or mps
    #[arg(long, value_name = "MODE", default_value = Assumptions::default().sharing.name(), value_parser = Sharing::parse)]
    pub sharing: Sharing,
    /// The reading the activity cap applies to: sm or busy
    #[arg(long, value_name = "METRIC", default_value_t = ActivityMetric::default(), value_parser = ActivityMetric::parse)]
    pub cap_metric: ActivityMetric,
    /// The GPU's power profile: a100-40gb or h100-80gb
    #[arg(long, value_name = "PROFILE", default_value = Assumptions::default().power.name, value_parser = PowerProfile::parse)]
    pub gpu: PowerProfile,
    /// SM activity cap
    #[arg(long, allow_negative_numbers = true, value_name = "FRACTION", default_value_t = 0.8, value_parser = num)]
    pub sm_cap: f64,
    /// Busy time cap
    #[arg(long, allow_negative_numbers = true, value_name = "FRACTION", default_value_t = 0.8, value_parser = num)]
    pub busy_cap: f64,
    /// Memory kept free on each GPU
    #[arg(long, allow_negative_numbers = true, value_name = "SIZE", default_value = "2G", value_parser = parse_size_mib)]
    pub headroom: u64,
    /// Seconds a job's memory takes to grow to its peak
    #[arg(long, allow_negative_numbers = true, value_name = "S", default_value_t = Assumptions::default().ramp_s, value_parser = num)]
    pub ramp: f64,
    #[command(flatten)]
    pub guard: GuardArgs,
    /// The window activity readings average over (carma.yaml monitor_window with published readings, as the shipped carma.yaml has them); 0: none (no carma-monitor)
    #[arg(long, allow_negative_numbers = true, value_name = "S", default_value_t = SHIPPED_WINDOW_S, value_parser = num)]
    pub window: f64,
    /// Seconds between the monitor's publications (monitor.interval): readings under a window are as of the last; 0: as of now
    #[arg(long, allow_negative_numbers = true, value_name = "S", default_value_t = SHIPPED_PUBLISH_S, value_parser = num)]
    pub publish: f64,
    /// Seconds a job CARMA cannot place waits on its node for a GPU before it is handed back or fails (timeouts.wait); 0: at once
    #[arg(long, allow_negative_numbers = true, value_name = "S", default_value_t = Assumptions::default().node_wait_s, value_parser = num)]
    pub node_wait: f64,
    /// Seconds a handed-back job is away before slurmctld places it again (the requeue)
    #[arg(long, allow_negative_numbers = true, value_name = "S", default_value_t = Assumptions::default().requeue_s, value_parser = num)]
    pub requeue_delay: f64,
    /// Under --admission node-memory: seconds between the nodes' admission counts in slurmctld, each what the node could promise when its monitor set it (monitor.admission_interval); 0: slurmctld counts the node's GPUs under the activity cap
    #[arg(long, value_name = "S", default_value_t = Assumptions::default().count_interval_s, value_parser = num)]
    pub count_interval: f64,
    /// Under hand-back admissions: seconds a job that was handed back as often as it may be since it last paused waits in the queue before it may go anywhere again (carma.yaml's hand_back_pause); 0: it fails
    #[arg(long, value_name = "S", default_value_t = Assumptions::default().hand_back_pause_s, value_parser = num)]
    pub hand_back_pause: f64,
    #[command(flatten)]
    pub slurm: crate::slurm_model::SlurmModel,
    /// Idle power in watts [default: the --gpu profile's]
    #[arg(long, allow_negative_numbers = true, value_name = "W", value_parser = num)]
    pub idle_w: Option<f64>,
    /// Power of a GPU running any job, in watts [default: the --gpu profile's]
    #[arg(long, allow_negative_numbers = true, value_name = "W", value_parser = num)]
    pub active_w: Option<f64>,
    /// Power at full SM activity, in watts [default: the --gpu profile's]
    #[arg(long, allow_negative_numbers = true, value_name = "W", value_parser = num)]
    pub sm_w: Option<f64>,
    /// How slurmctld picks the node: anywhere, shards, shards+handback, memory-shards, memory-shards+handback, informed, node-memory
    #[arg(long, value_name = "MODE", default_value = Admission::default().name(), value_parser = Admission::parse)]
    pub admission: Admission,
    /// Whose choice of GPU stands: slurm or carma (carma.yaml's gpu_owner)
    #[arg(long, value_name = "OWNER", default_value = "slurm", value_parser = GpuOwner::parse)]
    pub gpu_owner: GpuOwner,
    /// slurmctld takes shards from the GPU with the fewest allocated (LL_SHARED_GRES), not the first with one free
    #[arg(long)]
    pub least_loaded: bool,
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
    /// Also write the summary as CSV to FILE
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Also draw plots into DIR
    #[arg(long, value_name = "DIR")]
    pub plots: Option<PathBuf>,
}

/// `carma simulate-report`'s options.
#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// The repository's data/: carma/ with the traces, h100/ with measurements
    #[arg(long, value_name = "DIR")]
    pub data: PathBuf,
    /// Where the report goes (docs/)
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

fn num(v: &str) -> Result<f64, String> {
    v.parse::<f64>().ok().filter(|x| x.is_finite() && *x >= 0.0).ok_or_else(|| "expected a number >= 0".into())
}

/// A bound of at least 1 (no job runs faster than alone), or `off`.
pub(crate) fn max_slowdown(v: &str) -> Result<f64, String> {
    if v == "off" {
        return Ok(f64::INFINITY);
    }
    num(v).and_then(|x| if x >= 1.0 { Ok(x) } else { Err("expected a number >= 1 or off".into()) })
}

fn assumptions(a: &SimulateArgs) -> Assumptions {
    Assumptions {
        ramp_s: a.ramp,
        sharing: a.sharing,
        power: PowerProfile {
            name: a.gpu.name,
            idle_w: a.idle_w.unwrap_or(a.gpu.idle_w),
            active_w: a.active_w.unwrap_or(a.gpu.active_w),
            sm_w: a.sm_w.unwrap_or(a.gpu.sm_w),
        },
        sample_s: Assumptions::default().sample_s,
        window_s: a.window,
        publish_s: a.publish,
        node_wait_s: a.node_wait,
        requeue_s: a.requeue_delay,
        count_interval_s: a.count_interval,
        hand_back_pause_s: a.hand_back_pause,
        backfill: a.slurm.backfill,
        backfill_interval_s: a.slurm.backfill_interval,
        requeue_to_back: a.slurm.requeue_to_back,
        // The calibrated per-job model of the sharing mode.
        ..Assumptions::default()
    }
}

fn params(a: &SimulateArgs) -> Params {
    a.guard.apply(Params {
        metric: a.cap_metric,
        sm_activity_cap: a.sm_cap,
        busy_cap: a.busy_cap,
        headroom_mib: a.headroom,
        sharing: a.sharing,
        // As the plugin: a profile needs a whole window alone.
        profile_after_secs: a.window.max(0.0).ceil() as u64,
        ..Params::default()
    })
}

pub fn cmd_simulate(a: &SimulateArgs) -> Result<(), String> {
    let activity = a.activity.as_deref().zip(a.measured.as_deref());
    let w = workloads(&a.workloads, activity, a.job_options.as_deref())?;
    let models =
        a.models.clone().unwrap_or_else(|| a.workloads.parent().unwrap_or(Path::new(".")).join("model-summaries"));
    let cfg = SimConfig {
        cluster: a.cluster,
        policy: a.policy,
        estimator: estimator(&a.estimator, &w, &models),
        params: params(a),
        assumptions: assumptions(a),
        admission: a.admission,
        gpu_owner: a.gpu_owner,
        least_loaded: a.least_loaded,
    };
    let policies: Vec<Policy> = if a.compare { Policy::ALL.to_vec() } else { vec![cfg.policy] };
    let outcomes = run_all(&a.trace, &w, &cfg, &policies)?;
    let rows: Vec<Summary> = outcomes.iter().map(summarize).collect();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows).unwrap_or_default());
    } else {
        print!("{}", table(&rows));
    }
    if let Some(f) = &a.csv {
        std::fs::write(f, csv(&rows)).map_err(|e| format!("{}: {e}", f.display()))?;
    }
    if let Some(d) = &a.plots {
        let stem = a.trace.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "trace".into());
        plots(d, &stem, &outcomes)?;
    }
    Ok(())
}

pub fn cmd_report(a: &ReportArgs) -> Result<(), String> {
    carma_simulator::paper::write_report(&a.data, &a.out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn parse(options: &[&str]) -> Result<SimulateArgs, String> {
        let argv = ["carma", "simulate", "--trace", "t.csv", "--workloads", "w/workloads.csv"];
        match Cli::try_parse_from(argv.iter().chain(options)).map_err(|e| crate::cli::one_line(&e))?.command {
            Command::Simulate(a) => Ok(*a),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn without_options_the_simulator_defaults_hold() {
        let a = parse(&[]).unwrap();
        assert_eq!((a.trace.to_str(), a.workloads.to_str()), (Some("t.csv"), Some("w/workloads.csv")));
        assert_eq!(a.cluster, Cluster::parse("1x4x40G").unwrap());
        assert_eq!((a.policy, a.estimator.as_str(), &a.models), (Policy::Magm, "oracle", &None));
        // The configuration the README installs: its monitor's window and
        // publication interval, its guard.
        let shipped = carma_config::Config::load(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../slurm-conf-examples/carma.yaml"),
        )
        .unwrap();
        assert!(shipped.monitor.published);
        assert_eq!(
            assumptions(&a),
            Assumptions {
                window_s: shipped.monitor_window.as_secs_f64(),
                publish_s: shipped.monitor.interval.as_secs_f64(),
                ..Assumptions::default()
            }
        );
        assert_eq!(
            (params(&a).max_slowdown, params(&a).max_slowdown_unprofiled, params(&a).idle_first),
            (shipped.max_slowdown, shipped.max_slowdown_unprofiled, shipped.idle_first)
        );
        let defaults = Params {
            metric: ActivityMetric::default(),
            sm_activity_cap: 0.8,
            busy_cap: 0.8,
            headroom_mib: 2048,
            profile_after_secs: shipped.monitor_window.as_secs(),
            ..Params::default()
        };
        assert_eq!(params(&a), defaults);
        assert_eq!((a.admission, a.gpu_owner), (Admission::default(), GpuOwner::Slurm));
        assert!(!a.compare && !a.json && !a.least_loaded);
        assert!(a.activity.is_none() && a.measured.is_none() && a.job_options.is_none());
        assert!(a.csv.is_none() && a.plots.is_none());
    }

    #[test]
    fn each_option_reaches_the_configuration() {
        let a = parse(&[
            "--cluster=2x8x80G",
            "--policy",
            "ff",
            "--compare",
            "--estimator",
            "carma",
            "--models",
            "m",
            "--activity",
            "map.csv",
            "--measured",
            "c.csv",
            "--job-options",
            "o.csv",
            "--sharing",
            "mps",
            "--cap-metric",
            "busy",
            "--gpu",
            "h100-80gb",
            "--sm-cap",
            "0.5",
            "--busy-cap",
            "0.9",
            "--headroom",
            "1G",
            "--ramp",
            "30",
            "--max-slowdown",
            "off",
            "--no-idle-first",
            "--idle-w",
            "50",
            "--window",
            "30",
            "--publish",
            "3",
            "--node-wait",
            "12",
            "--requeue-delay",
            "2",
            "--admission",
            "node-memory",
            "--gpu-owner",
            "carma",
            "--least-loaded",
            "--json",
            "--csv",
            "out.csv",
            "--plots",
            "p",
        ])
        .unwrap();
        assert_eq!(a.cluster, Cluster::parse("2x8x80G").unwrap());
        assert_eq!((a.policy, a.compare, a.estimator.as_str()), (Policy::FirstFit, true, "carma"));
        assert_eq!(a.models, Some(PathBuf::from("m")));
        assert_eq!(
            (a.activity.as_deref().unwrap(), a.measured.as_deref().unwrap()),
            (Path::new("map.csv"), Path::new("c.csv"))
        );
        assert_eq!(a.job_options, Some(PathBuf::from("o.csv")));
        let want = Assumptions {
            ramp_s: 30.0,
            sharing: Sharing::Mps,
            // The profile's own watts where none is given.
            power: PowerProfile { idle_w: 50.0, ..PowerProfile::H100_80GB },
            sample_s: Assumptions::default().sample_s,
            window_s: 30.0,
            publish_s: 3.0,
            node_wait_s: 12.0,
            requeue_s: 2.0,
            count_interval_s: 0.0,
            hand_back_pause_s: 0.0,
            backfill: false,
            backfill_interval_s: 0.0,
            requeue_to_back: false,
            ..Assumptions::default()
        };
        assert_eq!(assumptions(&a), want);
        let p = params(&a);
        assert_eq!((p.metric, p.sm_activity_cap, p.busy_cap, p.headroom_mib), (ActivityMetric::Busy, 0.5, 0.9, 1024));
        assert_eq!((p.sharing, p.max_slowdown, p.idle_first), (Sharing::Mps, f64::INFINITY, false));
        assert_eq!(parse(&["--max-slowdown", "2"]).unwrap().guard.max_slowdown, 2.0);
        assert_eq!(parse(&["--max-slowdown-unprofiled", "off"]).unwrap().guard.max_slowdown_unprofiled, f64::INFINITY);
        assert_eq!((a.admission, a.gpu_owner), (Admission::parse("node-memory").unwrap(), GpuOwner::Carma));
        assert!(a.least_loaded && a.json);
        assert_eq!((a.csv, a.plots), (Some(PathBuf::from("out.csv")), Some(PathBuf::from("p"))));
    }

    #[test]
    fn bad_values_name_the_option_and_what_it_takes() {
        for (argv, says) in [
            (&["--sm-cap", "-1"][..], "--sm-cap <FRACTION>': expected a number >= 0"),
            (&["--max-slowdown=0.5"], "--max-slowdown <X|off>': expected a number >= 1 or off"),
            (&["--headroom", "2X"], "--headroom <SIZE>'"),
            (&["--policy", "fastest"], "--policy <POLICY>'"),
            (&["--gpu", "v100"], "expected a100-40gb or h100-80gb"),
            (&["--activity", "map.csv"], "--measured <CSV>"),
            (&["--measured", "c.csv"], "--activity <MAP>"),
        ] {
            let e = parse(argv).unwrap_err();
            assert!(e.contains(says) && !e.contains('\n'), "{argv:?}: {e}");
        }
    }

    #[test]
    fn the_report_takes_data_and_out() {
        let cli = Cli::try_parse_from(["carma", "simulate-report", "--data", "data", "--out=docs"]).unwrap();
        let Command::SimulateReport(a) = cli.command else { panic!() };
        assert_eq!((a.data, a.out), (PathBuf::from("data"), PathBuf::from("docs")));
        assert!(Cli::try_parse_from(["carma", "simulate-report", "--data", "data"]).is_err());
    }
}
