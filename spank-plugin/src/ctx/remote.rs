//! slurmstepd (remote). The placement decision is made once per step in
//! `init_post_opt`, the last hook that runs as root before tasks fork
//! (`user_init` already runs as the job's user and could not write the
//! root-owned state); `task_init` (in each forked task, as the user) only
//! copies the decision into the task's environment; `exit` (root again)
//! releases the step's hold on its GPUs.

use super::transparent;
use crate::error::{Context as _, Error};
use crate::log;
use crate::options;
use crate::spank::{Item, Spank};
use carma_config::{Config, JobRequest, NoFitAction, Policy, RecoveryMode, Sharing, UnknownEstimate};
use carma_placement::{Placer, Request, StepRef, jobfiles};
use once_cell::sync::OnceCell;
use std::time::Duration;

/// The step's decision, made in init_post_opt, read after fork (lock-free).
struct Decision {
    gpus: String,
    summary: String,
    /// More of the task's environment (an MPS client's pipe and fence).
    env: Vec<(&'static str, String)>,
    step: StepRef,
    /// As Slurm names it: `batch`, `extern`, `interactive` or the number.
    step_name: String,
}
/// `Err` holds why a CARMA step could not be placed. It is reported by
/// task_init, in the task: a failing init_post_opt would make slurmd drain
/// the node for a batch step, and the user would never see the reason.
static DECISION: OnceCell<Result<Decision, String>> = OnceCell::new();

/// Options given to this step win; then values resolved at submit time
/// (sbatch/salloc pass them as SLURM_SPANK_CARMA_*, which survives
/// --export=NONE); then CARMA_* in the step's environment (a direct srun
/// exports the user's environment, already validated by srun).
fn request(sp: &Spank) -> Result<JobRequest, Error> {
    let mut req = options::request();
    req.fill_from_env(|name| {
        let spank = sp.getenv(&format!("SLURM_SPANK_{name}")).ok().flatten();
        spank.or_else(|| sp.getenv(name).ok().flatten()).map(String::into_bytes)
    })?;
    Ok(req)
}

/// The per-GPU estimate and where it came from: `--carma-mem`, else the
/// estimate srun/sbatch made from `--carma-model` (the step's own
/// CARMA_ESTIMATE first: an inner srun may name another model), else the
/// configured rule for unknown jobs. Model files are never opened here:
/// this runs as root.
/// The last item is the estimate's fixed part, where it came from a model.
fn estimate(sp: &Spank, req: &JobRequest, cfg: &Config) -> Result<Estimated, Error> {
    if let Some(mib) = req.mem_mib {
        return Ok((Some(mib), "declared".into(), None, None));
    }
    let env = carma_config::ESTIMATE_ENV;
    if let Some(raw) = sp.getenv(env)?.or(sp.getenv(&format!("SLURM_SPANK_{env}"))?) {
        let e = carma_config::parse_estimate(raw.as_bytes()).map_err(|e| Error::msg(format!("{env}: {e}")))?;
        return Ok((Some(e.mib), e.source.into(), e.signature, e.runtime_mib));
    }
    if req.model.is_some() {
        log::info("a model was named but no estimate arrived from srun/sbatch; treating the job as unknown");
    }
    Ok(match cfg.unknown_estimate {
        UnknownEstimate::Exclusive => (None, "unknown".into(), None, None),
        UnknownEstimate::Mib(m) => (Some(m), "default".into(), None, None),
    })
}

/// Never fails: a CARMA step's failure is deferred to task_init, anything
/// else is logged (the step runs as without CARMA). A panic is a failure
/// like any other: it must neither fail this hook (a batch step's failure
/// here drains the node) nor leave a CARMA step without a decision.
pub fn place(sp: &Spank) -> Result<(), Error> {
    let mut carma = false;
    let placed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| try_place(sp, &mut carma)))
        .unwrap_or_else(|p| Err(Error::msg(crate::guard::internal_error(p.as_ref()))));
    if let Err(e) = placed {
        let msg = format!("{}: {e}", step_label(sp));
        log::error(&format!("init_post_opt: {msg}"));
        if carma {
            // The admin finds every CARMA step in carma.log, placed or not
            // (wherever the failure came before carma.yaml was read).
            if let Ok(cfg) = options::config() {
                log::set_log_file(cfg.log_file.clone());
            }
            log::record_failure(&format!("not placed: {msg}"));
            let _ = DECISION.set(Err(msg));
        }
    }
    Ok(())
}

/// `job 12 step batch`, as far as Slurm tells it.
fn step_label(sp: &Spank) -> String {
    let job = sp.item_u32(Item::JobId).map_or_else(|_| "?".into(), |j| j.to_string());
    let step = sp.item_u32(Item::StepId).map_or_else(|_| "?".into(), crate::spank::step_name);
    format!("job {job} step {step}")
}

/// The step asked for CARMA: options given to it or to its job, or
/// `CARMA_*` in its environment (what [`request`] resolves); or it holds
/// shards in a transparent scope.
fn is_carma_step(sp: &Spank) -> bool {
    let transparent = || {
        let shards = shards_on_node(sp).ok().flatten().is_some();
        shards && options::config().is_ok_and(|cfg| transparent::in_scope(sp, cfg))
    };
    request(sp).map_or(true, |r| !r.is_empty()) || transparent()
}

fn try_place(sp: &Spank, carma: &mut bool) -> Result<(), Error> {
    let req = request(sp);
    *carma = req.as_ref().map_or(true, |r| !r.is_empty());
    let req = req?;
    let shards = shards_on_node(sp)?;
    if req.is_empty() && shards.is_none() {
        // Not a CARMA step and not sharing: nothing to do, no lock taken.
        return Ok(());
    }
    let cfg = options::config()?;
    log::set_log_file(cfg.log_file.clone());
    let job = sp.item_u32(Item::JobId)?;
    let step_id = sp.item_u32(Item::StepId)?;
    let step_name = crate::spank::step_name(step_id);
    let step = StepRef { job, holder: std::process::id() };
    // A shard step without CARMA options in a transparent scope is CARMA's.
    let transparent = match (req.is_empty(), shards) {
        (true, Some(n)) => transparent::detect(sp, cfg, n, crate::spank::is_batch_step(step_id))?,
        _ => None,
    };
    *carma |= transparent.is_some();
    let mut placer = Placer::from_config(cfg, log::event).context("placement")?;
    // The prolog recorded Slurm's GPUs as held whole; a step on shards or
    // without Slurm GPUs shows the job shares them.
    let shares = shards.is_some() || slurm_gpus(sp)?.is_none();
    if req.is_empty() && transparent.is_none() {
        // A shard step without CARMA: only forget that record.
        placer.drop_whole(job).context("placement")?;
        return Ok(());
    }
    let asked = match &transparent {
        Some(t) => Asked {
            policy: t.policy,
            count: t.count,
            estimate_mib: t.estimate_mib,
            source: t.source.into(),
            signature: t.signature.clone(),
            runtime_mib: None,
            recovery: cfg.recovery_mode,
            note: format!(" transparent={}", t.scope),
        },
        None => {
            let (estimate_mib, source, signature, runtime_mib) = estimate(sp, &req, cfg)?;
            Asked {
                policy: req.policy.unwrap_or(cfg.default_policy),
                count: req.gpu_count(),
                estimate_mib,
                source,
                signature,
                runtime_mib,
                recovery: req.recovery.unwrap_or(cfg.recovery_mode),
                note: String::new(),
            }
        }
    };
    let Asked { mut policy, count, mut estimate_mib, source: mut estimate_source, signature, mut runtime_mib, .. } =
        asked;
    // A job requeued after a GPU OOM is rerun as its recovery mode says:
    // carma-epilog left a marker on this node; on another node the prolog
    // left the restart count (both root-owned, not user-forgeable).
    let marker = jobfiles::read_recovery(&cfg.state_dir, job);
    let restarts = jobfiles::read_restarts(&cfg.state_dir, job);
    let mut recovery = String::new();
    if marker.is_some() || restarts > 0 {
        let mode = marker.map_or(asked.recovery, |m| m.mode);
        match (mode, marker.and_then(|m| m.need_mib)) {
            (RecoveryMode::None, _) => {}
            (RecoveryMode::Looser, Some(mib)) => {
                let mib = mib + cfg.looser_margin_mib;
                estimate_mib = Some(estimate_mib.map_or(mib, |e| e.max(mib)));
                estimate_source = "recovery".into();
                // What the OOM showed it needs, not a model's estimate.
                runtime_mib = None;
                recovery = " recovery=looser".into();
            }
            // Exclusive, or looser without a recorded need: a GPU of its own.
            _ => {
                policy = Policy::Exclusive;
                recovery = " recovery=exclusive".into();
            }
        }
    }
    // History is per user: another user cannot raise (or learn) this
    // user's estimates by claiming the same signature.
    let uid = sp.item_u32(Item::JobUid)?;
    let signature = signature.map(|s| format!("{uid}:{s}"));
    // sharing: mps: a step that shares one GPU becomes a client of that
    // GPU's MPS server, which serves one user at a time.
    let mps_uid = (cfg.sharing == Sharing::Mps && count == 1 && policy != Policy::Exclusive).then_some(uid);
    let request = Request {
        policy,
        count,
        estimate_mib,
        estimate_source: estimate_source.clone(),
        shares,
        signature,
        // A recovering rerun keeps what recovery decided.
        history_first: transparent.is_some() && recovery.is_empty(),
        mps_uid,
        runtime_mib,
    };
    let wait = if cfg.no_fit == NoFitAction::Wait { cfg.timeouts.wait } else { Duration::ZERO };
    let mut est = estimate_mib.map(|m| format!("{m}M")).unwrap_or_else(|| "unknown".into());
    let decision = placer
        .place(step, &request, wait, cfg.timeouts.poll)
        .map_err(|e| Error::msg(format!("policy {policy}, estimate {est} ({estimate_source}): {e}")))?;
    if let Some(mib) = decision.history_mib {
        est = format!("{mib}M");
        estimate_source = "history".into();
    }
    // The node's learned fixed memory replaced the estimate's own.
    let mut learned = String::new();
    if let (Some(l), Some(r), Some(e)) = (decision.learned_runtime_mib, runtime_mib, estimate_mib) {
        est = format!("{}M", e - r + l);
        learned = format!(" runtime=learned:{l}M");
    }
    if let Some(t) = transparent.as_ref().filter(|_| !decision.reused) {
        // carma-epilog recovers only CARMA jobs: this mark says it is one,
        // and under which signature to remember what an OOM needed. The
        // step that decided writes it (a batch job's batch step): later
        // steps, with their own command lines, must not re-key it.
        let mark = jobfiles::Transparent { scope: t.scope.clone(), signature: request.signature.clone() };
        if let Err(e) = jobfiles::write_transparent(&cfg.state_dir, job, &mark) {
            log::error(&format!("job {job}: cannot mark it transparent in {}: {e}", cfg.state_dir.display()));
        }
    }
    let (env, sharing) = match (mps_uid, decision.gpus.as_slice()) {
        (Some(_), [gpu]) if !decision.exclusive => mps_client(cfg, *gpu, decision.reserve_mib, job),
        _ => (Vec::new(), String::new()),
    };
    let summary = format!(
        "policy={policy} estimate={est} source={estimate_source}{learned} {decision}{recovery}{}{sharing}",
        asked.note
    );
    log::event(&format!("job {job} step {step_name}: {summary}"));
    let gpus = carma_placement::index_list(&decision.gpus);
    let _ = DECISION.set(Ok(Decision { gpus, summary, env, step, step_name }));
    Ok(())
}

/// The environment of an MPS client of `gpu`'s control daemon, fenced to
/// `fence_mib` (the device is 0 as the job sees it), and the decision's
/// note. Without a running daemon the step shares by time-slicing, and
/// the log says so.
fn mps_client(cfg: &Config, gpu: u32, fence_mib: u64, job: u32) -> (Vec<(&'static str, String)>, String) {
    let pipe = cfg.mps.pipe_dir.join(gpu.to_string());
    if !pipe.join("control").exists() {
        log::event(&format!(
            "job {job}: no MPS control daemon for GPU {gpu} ({} missing): the job shares the GPU by time-slicing, without a memory fence",
            pipe.join("control").display()
        ));
        return (Vec::new(), " sharing=timeslice (no MPS daemon)".into());
    }
    let env = vec![
        ("CUDA_MPS_PIPE_DIRECTORY", pipe.display().to_string()),
        ("CUDA_MPS_LOG_DIRECTORY", cfg.mps.log_dir.join(gpu.to_string()).display().to_string()),
        ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", format!("0={fence_mib}M")),
    ];
    (env, format!(" sharing=mps fence=0={fence_mib}M"))
}

/// Estimate, source, signature and the estimate's fixed part.
type Estimated = (Option<u64>, String, Option<String>, Option<u64>);

/// What the step asks of placement, from its options or its scope.
struct Asked {
    policy: Policy,
    count: u32,
    estimate_mib: Option<u64>,
    source: String,
    signature: Option<String>,
    /// The stack's fixed part of a model-based estimate.
    runtime_mib: Option<u64>,
    /// Recovery mode unless carma-epilog recorded one.
    recovery: RecoveryMode,
    /// Appended to the decision (`transparent=partition:gpu`).
    note: String,
}

/// Shards Slurm gave the job on this node, if any.
fn shards_on_node(sp: &Spank) -> Result<Option<u32>, Error> {
    Ok(sp.getenv("SLURM_SHARDS_ON_NODE")?.map(|v| v.trim().parse().unwrap_or(1)))
}

/// GPUs Slurm itself allocated to the step (gres/gpu), if any.
fn slurm_gpus(sp: &Spank) -> Result<Option<String>, Error> {
    for var in ["SLURM_STEP_GPUS", "SLURM_JOB_GPUS"] {
        if let Some(v) = sp.getenv(var)?
            && !v.is_empty()
        {
            return Ok(Some(v));
        }
    }
    Ok(None)
}

pub fn task_init(sp: &Spank) -> Result<(), Error> {
    // Runs in the forked task: no locks, no NVML, no logging on success.
    match DECISION.get() {
        // No decision for a step that asked for CARMA (placement never ran
        // in this slurmstepd): it must not run unplaced beside others.
        None if is_carma_step(sp) => {
            let why = "no CARMA placement decision was made for this step (slurmd's log says why)";
            eprintln!("carma: this step was not started: {why}");
            Err(Error::msg(why))
        }
        None => Ok(()),
        Some(Ok(d)) => {
            for var in ["CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "GPU_DEVICE_ORDINAL"] {
                sp.setenv(var, &d.gpus)?;
            }
            for (var, value) in &d.env {
                sp.setenv(var, value)?;
            }
            sp.setenv("CARMA_DECISION", &d.summary)
        }
        Some(Err(why)) => {
            // The task's stderr is the job's: the user sees why.
            eprintln!("carma: this step was not started: {why}");
            Err(Error::msg(why.clone()))
        }
    }
}

/// Releases the step's hold; failures are logged only (garbage collection
/// reclaims the reservation once this slurmstepd is gone).
pub fn exit(_sp: &Spank) -> Result<(), Error> {
    let Some(Ok(d)) = DECISION.get() else { return Ok(()) };
    let release = || -> Result<(), Error> {
        let placer = Placer::from_config(options::config()?, log::event).context("release")?;
        if let Some(r) = placer.release(d.step).context("release")? {
            log::event(&format!(
                "job {} step {} released gpu_indices={}",
                r.job,
                d.step_name,
                carma_placement::index_list(&r.gpus)
            ));
        }
        Ok(())
    };
    if let Err(e) = release() {
        log::error(&format!("exit: {e}"));
    }
    Ok(())
}
