//! What placement needs from Slurm about a step and its node, read once
//! from the SPANK handle into plain values (`carma_placement::resolve`'s
//! `StepFacts` and `NodeFacts`).

use crate::ctx::transparent;
use crate::error::Error;
use crate::log;
use crate::options;
use crate::spank::{Item, Spank};
use carma_config::{Config, JobRequest};
use carma_placement::resolve::{self, NodeFacts, StepFacts};

/// A step CARMA has to look at: its facts, its node's, and carma.yaml.
pub(super) struct Step {
    pub facts: StepFacts,
    pub node: NodeFacts,
    pub cfg: &'static Config,
    pub step_id: u32,
}

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

/// Everything placement needs from Slurm, read once (the job's script,
/// which only a transparently collocated step needs, is read by
/// [`read_step`] when carma.yaml says it is one).
fn read_facts(sp: &Spank) -> Result<StepFacts, Error> {
    let request = request(sp)?;
    let shards_on_node = sp.getenv("SLURM_SHARDS_ON_NODE")?.map(|v| v.trim().parse().unwrap_or(1));
    let mut f = StepFacts { request, shards_on_node, ..StepFacts::default() };
    if f.request.is_empty() && f.shards_on_node.is_none() {
        // Not CARMA's and not sharing: nothing more is read.
        return Ok(f);
    }
    let env = carma_config::ESTIMATE_ENV;
    // The step's own estimate first: an inner srun may name another model.
    f.estimate = sp.getenv(env)?.or(sp.getenv(&format!("SLURM_SPANK_{env}"))?);
    f.job = sp.item_u32(Item::JobId)?;
    f.uid = sp.item_u32(Item::JobUid)?;
    f.batch_step = crate::spank::is_batch_step(sp.item_u32(Item::StepId)?);
    f.partition = sp.getenv("SLURM_JOB_PARTITION")?;
    f.account = sp.getenv("SLURM_JOB_ACCOUNT")?;
    f.qos = sp.getenv("SLURM_JOB_QOS")?;
    Ok(f)
}

/// The step's and its node's facts, or `None` for a step that is neither
/// CARMA's nor sharing (nothing to do, no lock taken). `carma` says, as
/// far as it is known (also when this fails), whether the step is CARMA's.
pub(super) fn read_step(sp: &Spank, carma: &mut bool) -> Result<Option<Step>, Error> {
    let facts = read_facts(sp);
    *carma = facts.as_ref().map_or(true, |f| !f.request.is_empty());
    let mut facts = facts?;
    if facts.request.is_empty() && facts.shards_on_node.is_none() {
        return Ok(None);
    }
    let cfg = options::config()?;
    log::set_log_file(cfg.log_file.clone());
    *carma |= resolve::is_carma(&facts, cfg);
    let step_id = sp.item_u32(Item::StepId)?;
    if *carma {
        // A transparently collocated step's history is keyed by its
        // script; every CARMA step's profile without a model signature too.
        facts.job_signature = transparent::signature(sp, crate::spank::is_batch_step(step_id));
    }
    // The root-owned job files matter only to a CARMA step: a plain shard
    // step (its whole-GPU record dropped) opens none of them.
    let node = if *carma { NodeFacts::read(&cfg.state_dir, facts.job) } else { NodeFacts::default() };
    Ok(Some(Step { facts, node, cfg, step_id }))
}

/// The step asked for CARMA: options given to it or to its job, or
/// `CARMA_*` in its environment; or it holds shards in a transparent scope.
pub(super) fn is_carma_step(sp: &Spank) -> bool {
    match read_facts(sp) {
        Err(_) => true,
        Ok(f) => !f.request.is_empty() || options::config().is_ok_and(|cfg| resolve::is_carma(&f, cfg)),
    }
}

/// `job 12 step batch`, as far as Slurm tells it.
pub(super) fn step_label(sp: &Spank) -> String {
    let job = sp.item_u32(Item::JobId).map_or_else(|_| "?".into(), |j| j.to_string());
    let step = sp.item_u32(Item::StepId).map_or_else(|_| "?".into(), crate::spank::step_name);
    format!("job {job} step {step}")
}
