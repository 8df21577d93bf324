//! carma: CARMA's admin command.
//!
//!   carma status [--json] [--config FILE]   GPUs, memory, SM activity, reservations
//!   carma estimate --model FILE [--batch-size N] [--json]   the GPU memory estimate and why
//!   carma place --dry-run [--mem SIZE] [--policy P] [--gpus N]   where a job would go now, and why not elsewhere
//!   carma transparent-scopes [--config FILE] [--output FILE]   the scopes job_submit.lua rewrites and admits by memory (one line each; --output: the file it reads, /etc/slurm/carma-scopes)
//!   carma simulate ...                       replay a job trace under CARMA's policies
#![forbid(unsafe_code)]

use carma_config::{Config, JobRequest, OptionName};
use carma_placement::Placer;
use carma_placement::resolve::{self, NodeFacts, Resolution, StepFacts};
use carma_tools::args::Args;
use carma_tools::status;
use std::path::Path;

const USAGE: &str = "usage: carma status [--json] [--config FILE]
       carma estimate --model FILE [--batch-size N] [--seq-len N] [--precision fp32|mixed|bf16] [--json] [--config FILE]
       carma place --dry-run [--mem SIZE] [--policy POLICY] [--gpus N] [--config FILE]
       carma transparent-scopes [--config FILE] [--output FILE]";

fn usage() -> String {
    format!("{USAGE}\n       {}", carma_tools::simulate::USAGE.replace('\n', "\n       "))
}

fn main() {
    let mut argv = std::env::args().skip(1);
    let cmd = argv.next().unwrap_or_default();
    let result = match cmd.as_str() {
        "status" => cmd_status(argv.collect()),
        "estimate" => cmd_estimate(argv.collect()),
        "place" => cmd_place(argv.collect()),
        "transparent-scopes" => cmd_scopes(argv.collect()),
        "simulate" => carma_tools::simulate::cmd_simulate(argv.collect()),
        "simulate-report" => carma_tools::simulate::cmd_report(argv.collect()),
        "-h" | "--help" | "help" => {
            println!("{}", usage());
            Ok(())
        }
        other => Err(format!("unknown command '{other}'\n{}", usage())),
    };
    if let Err(e) = result {
        eprintln!("carma: {e}");
        std::process::exit(2);
    }
}

/// The named flags, validated exactly as srun/sbatch validate the
/// `--carma-*` options they stand for.
fn request(a: &Args, flags: &[(&str, OptionName)]) -> Result<JobRequest, String> {
    let mut req = JobRequest::default();
    for (flag, option) in flags {
        if let Some(v) = a.get(flag) {
            req.set(*option, v.as_bytes(), &format!("--{flag}")).map_err(|e| e.to_string())?;
        }
    }
    Ok(req)
}

fn config(a: &Args) -> Result<Config, String> {
    let cfg = Config::load(Path::new(a.get("config").unwrap_or(carma_config::DEFAULT_CONFIG_PATH)))
        .map_err(|e| e.to_string())?;
    carma_tools::cli_log::set_file(cfg.log_file.clone());
    Ok(cfg)
}

/// What placement reports (a corrupt state file recovered, monitor readings
/// not used) goes to the admin's terminal and, as for any other process
/// that opens the node's state, to carma.log (where the caller may write it).
fn placer_log(msg: &str) {
    eprintln!("carma: {msg}");
    carma_tools::cli_log::record(msg);
}

fn cmd_status(argv: Vec<String>) -> Result<(), String> {
    let a = Args::parse(argv, &["config"], &["json"])?;
    let cfg = config(&a)?;
    let monitor = monitor_state(&cfg);
    // Stale readings refuse CARMA steps; the admin still sees the GPUs,
    // read directly (this is no slurmstepd).
    let read = if monitor.1["fresh"] == false {
        Config { monitor: carma_config::MonitorConfig { published: false, ..cfg.monitor.clone() }, ..cfg.clone() }
    } else {
        cfg.clone()
    };
    let mut placer = Placer::from_config(&read, placer_log).map_err(|e| e.to_string())?;
    let (gpus, state) = placer.status().map_err(|e| e.to_string())?;
    let gpus = status::settle(gpus, &state);
    if a.has("json") {
        let mut v = status::to_json(&gpus, &state);
        v["transparent"] = cfg.transparent.iter().map(|s| scope_json(s, &cfg)).collect();
        v["monitor"] = monitor.1;
        v["runtime"] = status::runtime(&cfg.estimator, &state).1;
        v["gpu_owner"] = cfg.gpu_owner.name().into();
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        println!("{}", status::precondition(&placer.params()));
        println!("{}", gpu_owner_line(cfg.gpu_owner));
        println!("{}", monitor.0);
        println!("{}", status::runtime(&cfg.estimator, &state).0);
        for s in &cfg.transparent {
            let size = s.default_mib.map_or_else(|| "whole GPUs".into(), |m| format!("{m} MiB"));
            let policy = s.policy.unwrap_or(cfg.default_policy);
            println!("transparent collocation: {} (policy {policy}, default {size})", s.selectors());
        }
        print!("{}", status::table(&gpus, &state));
    }
    Ok(())
}

/// The monitor's publication as placement sees it: a line and JSON.
fn monitor_state(cfg: &Config) -> (String, serde_json::Value) {
    use carma_placement::source::published;
    let used = cfg.monitor.published;
    match published::fresh(&cfg.state_dir, cfg.monitor.stale_after) {
        Ok(p) => {
            let age = p.age().as_secs_f64();
            let line = format!(
                "monitor: readings {age:.1} s old ({}, {} samples over {} s){}",
                p.source,
                p.samples,
                p.window_ms / 1000,
                if used { "" } else { "; not used by placement (monitor.published: false)" }
            );
            (
                line,
                serde_json::json!({"published": used, "fresh": true, "age_s": age, "source": p.source, "samples": p.samples}),
            )
        }
        Err(why) => {
            let line = if used {
                format!("monitor: STALE: {}", published::refusal(&why))
            } else {
                "monitor: off (monitor.published: false); placement reads the GPUs directly".into()
            };
            (line, serde_json::json!({"published": used, "fresh": false, "why": why}))
        }
    }
}

fn scope_json(s: &carma_config::Scope, cfg: &Config) -> serde_json::Value {
    serde_json::json!({
        "scope": s.selectors(),
        "policy": s.policy.unwrap_or(cfg.default_policy).name(),
        "default_mib": s.default_mib,
    })
}

/// Who chooses a CARMA job's GPU here, as `carma status` says it.
fn gpu_owner_line(owner: carma_config::GpuOwner) -> String {
    let how = match owner {
        carma_config::GpuOwner::Slurm => "a CARMA job runs on the GPUs Slurm allocated it",
        carma_config::GpuOwner::Carma => "CARMA's policy picks any GPU of the node",
    };
    format!("gpu_owner: {} ({how})", owner.name())
}

/// carma.yaml's `transparent:` scopes for slurmctld's job_submit.lua
/// (slurm-conf-examples/job_submit.lua), framed so that the script can
/// tell a complete answer from a failure: a header, one line per scope,
/// `end`.
fn cmd_scopes(argv: Vec<String>) -> Result<(), String> {
    use std::fmt::Write;
    let a = Args::parse(argv, &["config", "output"], &[])?;
    let cfg = config(&a)?;
    let mut text = String::from("carma-transparent-scopes 1\n");
    // gpu_owner: slurm runs a job on its shards' GPU, and Slurm takes a
    // job's shards from one GPU: requests of more GPUs stay whole.
    let max = if cfg.gpu_owner == carma_config::GpuOwner::Slurm { " max_gpus=1" } else { "" };
    for s in &cfg.transparent {
        // default_mib: what admission asks for a rewritten job without an estimate.
        match s.default_mib {
            Some(mib) => writeln!(text, "{s} default_mib={mib}{max}"),
            None => writeln!(text, "{s}{max}"),
        }
        .map_err(|e| e.to_string())?;
    }
    // Admission scopes (carma.yaml admission:): the GRES and the headroom
    // job_submit.lua adds to each CARMA job's per-GPU size.
    for s in &cfg.admission {
        let line = s.to_string();
        let selectors = line.strip_prefix("scope ").unwrap_or(&line);
        writeln!(text, "admit {selectors} gres={} headroom_mib={}", carma_config::ADMISSION_GRES, cfg.headroom_mib)
            .map_err(|e| e.to_string())?;
    }
    text.push_str("end\n");
    match a.get("output") {
        // The file slurmctld's Lua reads (it runs no command itself).
        Some(path) => carma_placement::fsutil::write_atomic(Path::new(path), text.as_bytes()).map_err(|e| {
            format!("--output {path}: {e}; give a path in a directory root owns, e.g. /etc/slurm/carma-scopes")
        }),
        None => {
            print!("{text}");
            Ok(())
        }
    }
}

/// The plugin's decision for a job like this one, on live readings and the
/// node's recorded state; nothing is reserved.
fn cmd_place(argv: Vec<String>) -> Result<(), String> {
    let a = Args::parse(argv, &["config", "mem", "policy", "gpus"], &["dry-run"])?;
    if !a.has("dry-run") {
        return Err("carma place only answers with --dry-run; jobs are placed by the plugin".into());
    }
    let cfg = config(&a)?;
    let req = request(&a, &[("mem", OptionName::Mem), ("policy", OptionName::Policy), ("gpus", OptionName::Gpus)])?;
    // The plugin's own resolution: carma.yaml's defaults (policy, unknown
    // estimate) apply as they would to the job.
    let mut request = req;
    if request.is_empty() {
        // A job of one GPU that named nothing else.
        request.gpus = Some(1);
    }
    let facts = StepFacts { request, ..StepFacts::default() };
    // As for a job that holds its GPU or shard from Slurm, with no GPUs of
    // Slurm's to keep to: every GPU is a candidate (the plugin keeps a job
    // to its own under gpu_owner: slurm).
    let node = NodeFacts { slurm_gpus: vec![0], ..NodeFacts::default() };
    let any_gpu = Config { gpu_owner: carma_config::GpuOwner::Carma, ..cfg.clone() };
    let plan = match resolve::resolve(&facts, &node, &any_gpu)? {
        Resolution::Place(plan) => plan,
        _ => return Err("give --mem, --policy or --gpus: a job without CARMA options is not placed by CARMA".into()),
    };
    // A job of no particular user: MPS's one-user-per-GPU rule, which
    // depends on whose job it is, is left out of the answer.
    let mut plan = plan;
    plan.request.mps_uid = None;
    let r = &plan.request;
    let (policy, count) = (r.policy, r.count);
    let mut placer = Placer::from_config(&cfg, placer_log).map_err(|e| e.to_string())?;
    let (gpus, state) = placer.status().map_err(|e| e.to_string())?;
    let p = placer.params();
    let now = carma_placement::clock::now_secs();
    let dry = status::dry_run(&gpus, &state, r, &p, &cfg.estimator.learn_runtime, now);
    let (decision, verdicts) = (dry.decision, dry.verdicts);
    let est = dry.estimate_mib.map_or_else(|| "unknown (whole GPUs)".to_string(), |m| format!("{m} MiB"));
    println!("a job of {est} per GPU on {count} GPU(s), policy {policy}; {}", status::precondition(&p));
    match &decision {
        Ok(c) => println!(
            "would place on gpu_indices={} (exclusive={}, reserve {} MiB)",
            carma_placement::index_list(&c.gpus),
            c.exclusive,
            c.reserve_mib
        ),
        Err(n) => println!(
            "would not place now: {} of {} GPUs qualify, {} needed",
            n.reasons.iter().filter(|r| r.1.is_none()).count(),
            n.reasons.len(),
            n.wanted
        ),
    }
    print!("{verdicts}");
    Ok(())
}

fn cmd_estimate(argv: Vec<String>) -> Result<(), String> {
    let a = Args::parse(argv, &["config", "model", "batch-size", "seq-len", "precision"], &["json"])?;
    let cfg = config(&a)?;
    let model = a.get("model").ok_or("--model FILE is required")?;
    let batch = match a.get("batch-size") {
        Some(b) => Some(
            b.parse::<u64>()
                .ok()
                .filter(|b| (1..=1 << 20).contains(b))
                .ok_or_else(|| format!("--batch-size: '{b}' is not a whole number from 1 to 1048576"))?,
        ),
        None => None,
    };
    let req = request(&a, &[("seq-len", OptionName::SeqLen), ("precision", OptionName::Precision)])?;
    let settings = carma_estimator::Settings::for_job(&cfg.estimator, &req);
    let bytes = carma_estimator::read_bounded_bytes(Path::new(model)).map_err(|e| e.to_string())?;
    let est = carma_estimator::estimate(bytes, model, batch, &settings).map_err(|e| e.to_string())?;
    let (fixed_from, fixed_line) = fixed_part(&cfg, &est);
    if a.has("json") {
        let mut v = serde_json::to_value(&est).unwrap_or_default();
        v["fixed_part"] = serde_json::json!({"mib": est.parts.runtime_mib, "from": fixed_from});
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        println!(
            "{} MiB per GPU (source {}, {} file, {} family, batch {})",
            est.mib,
            est.source,
            est.format,
            est.family.name(),
            est.batch
        );
        println!("{}", est.why);
        println!("{fixed_line}");
    }
    Ok(())
}

/// Which fixed part (the software stack's memory) the estimate used and
/// where it came from, as a short tag and a line.
fn fixed_part(cfg: &Config, est: &carma_estimator::Estimate) -> (&'static str, String) {
    if est.source == "gpumemnet" {
        return ("gpumemnet", "fixed part: GPUMemNet's bins include their own".into());
    }
    let mib = est.parts.runtime_mib;
    let (tag, from) = if mib == carma_config::DEFAULT_RUNTIME_MIB {
        (
            "default",
            format!("the default (PyTorch 2.x on an H100; estimator.runtime in {} may change it)", cfg.path.display()),
        )
    } else {
        ("carma.yaml", format!("estimator.runtime in {}", cfg.path.display()))
    };
    let line = format!(
        "fixed part: {mib} MiB, {from}; a node that has learned a larger one from your finished jobs \
         (or from most of its users') uses that instead, and CARMA_DECISION says runtime=learned:SIZE"
    );
    (tag, line)
}
