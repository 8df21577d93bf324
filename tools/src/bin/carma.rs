//! carma: CARMA's admin command (`carma --help`; the command line is
//! `carma_tools::cli`).
#![forbid(unsafe_code)]

use carma_config::{Config, JobRequest, OptionName};
use carma_placement::Placer;
use carma_placement::resolve::{self, NodeFacts, Resolution, StepFacts};
use carma_tools::cli::{Cli, Command, EstimateArgs, PlaceArgs, ScopesArgs, Shell, StatusArgs};
use carma_tools::status;
use clap::CommandFactory;
use std::path::Path;

fn main() {
    let result = carma_tools::cli::parse::<Cli>().and_then(|cli| match cli.command {
        Command::Status(a) => cmd_status(&a),
        Command::Estimate(a) => cmd_estimate(&a),
        Command::Place(a) => cmd_place(&a),
        Command::TransparentScopes(a) => cmd_scopes(&a),
        Command::Simulate(a) => carma_tools::simulate::cmd_simulate(&a),
        Command::SimulateReport(a) => carma_tools::simulate::cmd_report(&a),
        Command::Calibrate(a) => carma_tools::calibrate::cmd_calibrate(&a),
        Command::ReplayPlan(a) => carma_tools::replay::cmd_plan(&a),
        Command::ReplayCompare(a) => carma_tools::replay::cmd_compare(&a),
        Command::Completions(a) => completions(a.shell),
    });
    if let Err(e) = result {
        eprintln!("carma: {e}");
        std::process::exit(2);
    }
}

/// The script for `shell`, written whole: clap_complete panics on a failed
/// write, which a closed pipe would be.
fn completions(shell: Shell) -> Result<(), String> {
    use std::io::Write;
    let mut script = Vec::new();
    clap_complete::generate(clap_complete::Shell::from(shell), &mut Cli::command(), "carma", &mut script);
    std::io::stdout().write_all(&script).map_err(|e| format!("completions: {e}"))
}

/// The given options, validated exactly as srun/sbatch validate the
/// `--carma-*` options they stand for.
fn request(options: &[(&str, Option<&str>, OptionName)]) -> Result<JobRequest, String> {
    let mut req = JobRequest::default();
    for (flag, value, option) in options {
        if let Some(v) = value {
            req.set(*option, v.as_bytes(), &format!("--{flag}")).map_err(|e| e.to_string())?;
        }
    }
    Ok(req)
}

/// What placement reports (a corrupt state file recovered, monitor readings
/// not used) goes to the admin's terminal and, as for any other process
/// that opens the node's state, to carma.log (where the caller may write it).
fn placer_log(msg: &str) {
    eprintln!("carma: {msg}");
    carma_tools::cli_log::record(msg);
}

fn cmd_status(a: &StatusArgs) -> Result<(), String> {
    let cfg = a.config.load()?;
    let monitor = monitor_state(&cfg);
    // Stale readings refuse CARMA steps; the admin still sees the GPUs,
    // read directly (this is no slurmstepd).
    let read = if monitor.1["fresh"] == false {
        Config { monitor: carma_config::MonitorConfig { published: false, ..cfg.monitor.clone() }, ..cfg.clone() }
    } else {
        cfg.clone()
    };
    let mut placer = Placer::from_config(&read, placer_log).map_err(|e| e.to_string())?;
    let carma_placement::Status { readings: gpus, state, params } = placer.status().map_err(|e| e.to_string())?;
    let gpus = status::settle(gpus, &state);
    if a.json {
        let mut v = status::to_json(&gpus, &state);
        v["transparent"] = cfg.transparent.iter().map(|s| scope_json(s, &cfg)).collect();
        v["monitor"] = monitor.1;
        v["runtime"] = status::runtime(&cfg.estimator, &state).1;
        v["gpu_owner"] = cfg.gpu_owner.name().into();
        v["slowdown"] = status::slowdowns(&gpus, &state, &params).1;
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        println!("{}", status::precondition(&params));
        println!("{}", gpu_owner_line(cfg.gpu_owner));
        println!("{}", monitor.0);
        println!("{}", status::runtime(&cfg.estimator, &state).0);
        for s in &cfg.transparent {
            let size = s.default_mib.map_or_else(|| "whole GPUs".into(), |m| format!("{m} MiB"));
            let policy = s.policy.unwrap_or(cfg.default_policy);
            println!("transparent collocation: {} (policy {policy}, default {size})", s.selectors());
        }
        print!("{}", status::table(&gpus, &state));
        print!("{}", status::slowdowns(&gpus, &state, &params).0);
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
fn cmd_scopes(a: &ScopesArgs) -> Result<(), String> {
    use std::fmt::Write;
    let cfg = a.config.load()?;
    let mut text = String::from("carma-transparent-scopes 1\n");
    // Slurm takes a job's shards from one GPU, and a step uses at most the
    // GPUs Slurm allocated its job, under either gpu_owner (issue 58: under
    // `carma`, gpu:4 rewritten to shard:4 was one GPU in Slurm's books and
    // four in CARMA's): requests of more GPUs stay whole.
    let max = " max_gpus=1";
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
    match &a.output {
        // The file slurmctld's Lua reads (it runs no command itself).
        Some(path) => carma_placement::fsutil::write_atomic(path, text.as_bytes()).map_err(|e| {
            format!(
                "--output {}: {e}; give a path in a directory root owns, e.g. /etc/slurm/carma-scopes",
                path.display()
            )
        }),
        None => {
            print!("{text}");
            Ok(())
        }
    }
}

/// The plugin's decision for a job like this one, on live readings and the
/// node's recorded state; nothing is reserved.
fn cmd_place(a: &PlaceArgs) -> Result<(), String> {
    if !a.dry_run {
        return Err("carma place only answers with --dry-run; jobs are placed by the plugin".into());
    }
    let cfg = a.config.load()?;
    let req = request(&[
        ("mem", a.mem.as_deref(), OptionName::Mem),
        ("policy", a.policy.as_deref(), OptionName::Policy),
        ("gpus", a.gpus.as_deref(), OptionName::Gpus),
    ])?;
    // The plugin's own resolution: carma.yaml's defaults (policy, unknown
    // estimate) apply as they would to the job.
    let mut request = req;
    if request.is_empty() {
        // A job of one GPU that named nothing else.
        request.gpus = Some(1);
    }
    // As for a job that holds as many GPUs as it asks from Slurm, with no
    // GPUs of Slurm's to keep to: every GPU is a candidate (the plugin
    // keeps a job to its own under gpu_owner: slurm, and to as many as
    // Slurm charged it under either owner).
    let node = NodeFacts { slurm_gpus: (0..request.gpu_count()).collect(), ..NodeFacts::default() };
    let facts = StepFacts { request, ..StepFacts::default() };
    let any_gpu = Config { gpu_owner: carma_config::GpuOwner::Carma, ..cfg.clone() };
    let plan = match resolve::resolve(&facts, &node, &any_gpu)? {
        Resolution::Place(plan) => plan,
        _ => return Err("give --mem, --policy or --gpus: a job without CARMA options is not placed by CARMA".into()),
    };
    // A job of no particular user: MPS's one-user-per-GPU rule, which
    // depends on whose job it is, is left out of the answer.
    let mut plan = plan;
    plan.request.mps_uid = None;
    let mut placer = Placer::from_config(&cfg, placer_log).map_err(|e| e.to_string())?;
    let carma_placement::Status { readings: gpus, mut state, params: p } =
        placer.status().map_err(|e| e.to_string())?;
    // A job of this profile (--busy, --sm), as if the node had learned it.
    if let (Some(busy), Some(sm)) = (a.busy, a.sm) {
        if !((0.0..=1.0).contains(&busy) && (0.0..=1.0).contains(&sm)) {
            return Err(format!("--busy {busy} --sm {sm}: give each as a fraction from 0 to 1"));
        }
        let key = "dry-run:profile".to_string();
        state.profiles.insert(key.clone(), carma_placement::slowdown::Profile { busy, sm });
        plan.request.profile_key = Some(key);
    }
    let r = &plan.request;
    let (policy, count) = (r.policy, r.count);
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

fn cmd_estimate(a: &EstimateArgs) -> Result<(), String> {
    let cfg = a.config.load()?;
    let model = a.model.as_str();
    let req = request(&[
        ("seq-len", a.seq_len.as_deref(), OptionName::SeqLen),
        ("precision", a.precision.as_deref(), OptionName::Precision),
    ])?;
    let settings = carma_estimator::Settings::for_job(&cfg.estimator, &req);
    let bytes = carma_estimator::read_bounded_bytes(Path::new(model)).map_err(|e| e.to_string())?;
    let est = carma_estimator::estimate(bytes, model, a.batch_size, &settings).map_err(|e| e.to_string())?;
    let (fixed_from, fixed_line) = fixed_part(&cfg, &est);
    if a.json {
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
