//! One step's placement request, resolved from plain facts: what Slurm
//! said about the step (read once by the plugin), what carma.yaml says, and
//! the root-owned job files on this node. The one place that decides the
//! estimate's source, the recovery mode, the transparent scope and the MPS
//! user. No Slurm types: the plugin, `carma place --dry-run` and the tests
//! call it alike.

use crate::jobfiles;
use crate::request::{Decision, Request};
use carma_config::{
    Config, GpuOwner, JobRequest, JobScopeFacts, NoFitAction, Policy, RecoveryMode, Sharing, UnknownEstimate,
    parse_estimate,
};
use std::path::Path;
use std::time::Duration;

/// What Slurm says about a step, as plain values.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepFacts {
    pub job: u32,
    /// The job's user.
    pub uid: u32,
    /// CARMA options given to the step or its job, or `CARMA_*` in its
    /// environment, already merged and validated.
    pub request: JobRequest,
    /// `CARMA_ESTIMATE` as srun/sbatch passed it (the step's own first).
    pub estimate: Option<String>,
    /// Shards Slurm gave the job on this node (`SLURM_SHARDS_ON_NODE`).
    pub shards_on_node: Option<u32>,
    /// The job's batch step (its script), whose srun steps run inside it.
    pub batch_step: bool,
    pub partition: Option<String>,
    pub account: Option<String>,
    pub qos: Option<String>,
    /// The job name and script (or command line) digest, `job:<hex>`: a
    /// transparent job's history key, where Slurm's copy was readable.
    pub job_signature: Option<String>,
}

/// What this node's root-owned job files say about the job.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeFacts {
    /// carma-epilog's verdict: the job crashed with a GPU OOM here. Only
    /// this makes a recovery; Slurm's restart count also counts an admin's
    /// requeue, preemption and node failure.
    pub recovery: Option<jobfiles::Recovery>,
    /// The GPUs the job prolog saw Slurm allocate to the job here (gres/gpu
    /// or gres/shard, `SLURM_JOB_GPUS` in slurmd's environment): the job
    /// holds a GPU Slurm accounts for, and its steps are placed among these.
    /// The step's own environment cannot say so, since a user can set any
    /// variable in it.
    pub slurm_gpus: Vec<u32>,
}

/// Why a CARMA step without a GPU Slurm accounts for is refused: every
/// GPU-second must be in Slurm's accounting (QOS limits, fairshare, sacct).
pub const UNACCOUNTED: &str = "the job holds no GPU that Slurm accounts for on this node: add --gres=shard:1 to share a GPU, or --gres=gpu:N for whole GPUs";

impl NodeFacts {
    pub fn read(state_dir: &Path, job: u32) -> NodeFacts {
        NodeFacts {
            recovery: jobfiles::read_recovery(state_dir, job),
            slurm_gpus: jobfiles::read_gpus(state_dir, job).unwrap_or_default(),
        }
    }
}

/// What to do with the step.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolution {
    /// Not a CARMA step and not sharing: nothing, no lock taken.
    Nothing,
    /// A shard step without CARMA: only forget the prolog's whole-GPU record.
    DropWhole,
    Place(Box<Plan>),
}

/// A CARMA step's request and what its log line says about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub request: Request,
    /// How long to wait for a fit (`no_fit: wait` or `hand_back`), else zero.
    pub wait: Duration,
    /// Handed back to Slurm when nothing fits by then (`no_fit:
    /// hand_back`, a batch step: only a batch job can be requeued).
    pub hand_back: bool,
    /// The transparent mark carma-epilog needs to recover the job.
    pub transparent: Option<jobfiles::Transparent>,
    /// Lines for the log that are not errors.
    pub notes: Vec<String>,
    /// ` recovery=looser` or ` recovery=exclusive`, where recovering.
    recovery: &'static str,
    /// ` transparent=partition:gpu` for a transparently collocated step.
    scope: String,
}

/// Whether the step is CARMA's at all: options, or shards in a
/// transparent scope.
pub fn is_carma(f: &StepFacts, cfg: &Config) -> bool {
    !f.request.is_empty() || (f.shards_on_node.is_some() && scope(f, cfg).is_some())
}

fn scope<'c>(f: &StepFacts, cfg: &'c Config) -> Option<&'c carma_config::Scope> {
    if cfg.transparent.is_empty() {
        return None;
    }
    let facts =
        JobScopeFacts { partition: f.partition.as_deref(), account: f.account.as_deref(), qos: f.qos.as_deref() };
    cfg.transparent_scope(&facts)
}

pub fn resolve(f: &StepFacts, node: &NodeFacts, cfg: &Config) -> Result<Resolution, String> {
    let req = &f.request;
    if req.is_empty() && f.shards_on_node.is_none() {
        return Ok(Resolution::Nothing);
    }
    // A shard step without CARMA options in a transparent scope is CARMA's.
    let transparent = match (req.is_empty(), f.shards_on_node) {
        (true, Some(n)) => scope(f, cfg).map(|s| (s, n.max(1))),
        _ => None,
    };
    if req.is_empty() && transparent.is_none() {
        return Ok(Resolution::DropWhole);
    }
    // A CARMA step is placed only on a job that holds a GPU or a shard:
    // otherwise its GPU-seconds would escape Slurm's accounting and limits.
    if node.slurm_gpus.is_empty() {
        return Err(UNACCOUNTED.into());
    }
    let mut notes = Vec::new();
    let (mut policy, count, mut estimate_mib, mut source, signature, mut runtime_mib) = match transparent {
        Some((s, shards)) => {
            let (mib, source) = match s.default_mib {
                Some(m) => (Some(m), "scope_default"),
                None => (None, "unknown"),
            };
            let policy = s.policy.unwrap_or(cfg.default_policy);
            (policy, shards, mib, source.to_string(), f.job_signature.clone(), None)
        }
        None => {
            let (mib, source, signature, runtime) = estimate(f, cfg, &mut notes)?;
            let policy = req.policy.unwrap_or(cfg.default_policy);
            (policy, req.gpu_count(), mib, source, signature, runtime)
        }
    };
    // A job requeued after a GPU OOM is rerun as its recovery mode says:
    // carma-epilog left its verdict on this node.
    let recovery = match node.recovery {
        Some(verdict) => recover(verdict, cfg, &mut policy, &mut estimate_mib, &mut source, &mut runtime_mib),
        None => "",
    };
    // History is per user: another user cannot raise (or learn) this
    // user's estimates by claiming the same signature.
    let signature = signature.map(|s| format!("{}:{s}", f.uid));
    // What the job does to a GPU is learned under its model's signature,
    // else its script's (or command line's) digest; per user like history.
    let profile_key = signature.clone().or_else(|| f.job_signature.as_ref().map(|s| format!("{}:{s}", f.uid)));
    // sharing: mps: a step that shares one GPU becomes a client of that
    // GPU's MPS server, which serves one user at a time.
    let mps_uid = (cfg.sharing == Sharing::Mps && count == 1 && policy != Policy::Exclusive).then_some(f.uid);
    let request = Request {
        policy,
        count,
        estimate_mib,
        estimate_source: source,
        // The prolog recorded Slurm's GPUs as held whole; a step on shards
        // shows the job shares them.
        shares: f.shards_on_node.is_some(),
        signature: signature.clone(),
        // A recovering rerun keeps what recovery decided.
        history_first: transparent.is_some() && recovery.is_empty(),
        mps_uid,
        runtime_mib,
        batch_step: f.batch_step,
        uid: Some(f.uid),
        // Where Slurm owns the GPUs (docs/architecture.md, "Who owns a
        // GPU"), its choice stands: CARMA checks the preconditions there and
        // never moves the job to a GPU Slurm may give whole to a job that
        // did not opt in to sharing.
        within: (cfg.gpu_owner == GpuOwner::Slurm).then(|| node.slurm_gpus.clone()),
        profile_key,
    };
    // One owner per GPU's worth: a step uses at most as many GPUs as Slurm
    // charged its job here (the GPUs its gpu or shard GRES came from),
    // whoever picks them. Else one shard would buy N GPUs that Slurm counts
    // free (issue 58). Waiting cannot meet it: refused at once.
    if request.count as usize > node.slurm_gpus.len() {
        return Err(more_than_charged(request.count, node.slurm_gpus.len(), f.shards_on_node));
    }
    let transparent_mark = transparent.map(|(s, _)| jobfiles::Transparent { scope: s.selectors(), signature });
    let scope = transparent.map_or_else(String::new, |(s, _)| format!(" transparent={}", s.selectors()));
    let wait = if cfg.no_fit == NoFitAction::Fail { Duration::ZERO } else { cfg.timeouts.wait };
    let hand_back = cfg.no_fit == NoFitAction::HandBack && f.batch_step;
    Ok(Resolution::Place(Box::new(Plan {
        request,
        wait,
        hand_back,
        transparent: transparent_mark,
        notes,
        recovery,
        scope,
    })))
}

/// Why a step asks for more GPUs than Slurm charged its job on this node,
/// and what to ask Slurm for instead.
pub fn more_than_charged(count: u32, charged: usize, shards: Option<u32>) -> String {
    let held = match shards {
        Some(n) => format!("its {n} shard(s) come from {charged} GPU(s), and a shard is at most one GPU's worth"),
        None => format!("it holds {charged} GPU(s)"),
    };
    format!(
        "--carma-gpus={count}: the step asks for {count} GPUs but Slurm charged the job {charged} on this node ({held}): ask --gres=gpu:{count} for {count} GPUs"
    )
}

/// What a recovering rerun changes: a looser estimate (what the OOM showed
/// it needs, plus the margin) or a GPU of its own. Returns the log mark.
fn recover(
    verdict: jobfiles::Recovery,
    cfg: &Config,
    policy: &mut Policy,
    estimate_mib: &mut Option<u64>,
    source: &mut String,
    runtime_mib: &mut Option<u64>,
) -> &'static str {
    match (verdict.mode, verdict.need_mib) {
        (RecoveryMode::None, _) => "",
        (RecoveryMode::Looser, Some(mib)) => {
            let mib = mib.saturating_add(cfg.looser_margin_mib);
            *estimate_mib = Some(estimate_mib.map_or(mib, |e| e.max(mib)));
            *source = "recovery".into();
            // What the OOM showed it needs, not a model's estimate.
            *runtime_mib = None;
            " recovery=looser"
        }
        // Exclusive, or looser without a recorded need: a GPU of its own.
        _ => {
            *policy = Policy::Exclusive;
            " recovery=exclusive"
        }
    }
}

/// The per-GPU estimate, its source, signature and fixed part: `--carma-mem`,
/// else the estimate srun/sbatch made from `--carma-model`, else the
/// configured rule for unknown jobs. Model files are never opened here.
type Estimated = (Option<u64>, String, Option<String>, Option<u64>);

fn estimate(f: &StepFacts, cfg: &Config, notes: &mut Vec<String>) -> Result<Estimated, String> {
    if let Some(mib) = f.request.mem_mib {
        return Ok((Some(mib), "declared".into(), None, None));
    }
    let env = carma_config::ESTIMATE_ENV;
    if let Some(raw) = &f.estimate {
        let e = parse_estimate(raw.as_bytes()).map_err(|e| format!("{env}: {e}"))?;
        return Ok((Some(e.mib), e.source.into(), e.signature, e.runtime_mib));
    }
    if f.request.model.is_some() {
        notes.push("a model was named but no estimate arrived from srun/sbatch; treating the job as unknown".into());
    }
    Ok(match cfg.unknown_estimate {
        UnknownEstimate::Exclusive => (None, "unknown".into(), None, None),
        UnknownEstimate::Mib(m) => (Some(m), "default".into(), None, None),
    })
}

impl Plan {
    /// The estimate as the log shows it before placement.
    fn estimate_label(&self) -> String {
        self.request.estimate_mib.map_or_else(|| "unknown".into(), |m| format!("{m}M"))
    }

    /// Why the step could not be placed, with what it asked.
    pub fn failure(&self, why: &dyn std::fmt::Display) -> String {
        format!(
            "policy {}, estimate {} ({}): {why}",
            self.request.policy,
            self.estimate_label(),
            self.request.estimate_source
        )
    }

    /// `CARMA_DECISION`: what was asked, what decided the estimate in the
    /// end (history, the node's learned fixed part), and the placement.
    /// `sharing`: the MPS client's note, if any.
    pub fn summary(&self, d: &Decision, sharing: &str) -> String {
        let r = &self.request;
        let (mut est, mut source) = (self.estimate_label(), r.estimate_source.clone());
        if let Some(mib) = d.history_mib {
            est = format!("{mib}M");
            source = "history".into();
        }
        let mut learned = String::new();
        if let (Some(l), Some(rt), Some(e)) = (d.learned_runtime_mib, r.runtime_mib, r.estimate_mib) {
            est = format!("{}M", e - rt + l);
            learned = format!(" runtime=learned:{l}M");
            if let Some(w) = d.learned_from {
                learned += &format!(" learned_from={}", w.as_str());
            }
        }
        format!(
            "policy={} estimate={est} source={source}{learned} {d}{}{}{sharing}",
            r.policy, self.recovery, self.scope
        )
    }
}

#[cfg(test)]
mod tests;
