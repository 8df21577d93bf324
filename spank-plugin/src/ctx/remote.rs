//! slurmstepd (remote): runs as root. The placement decision is made once
//! per step in `user_init`, before tasks fork; `task_init` (in each forked
//! task) only copies the decision into the task's environment.

use crate::error::Error;
use crate::log;
use crate::options;
use crate::spank::{Item, Spank};
use once_cell::sync::OnceCell;

/// The step's decision, made in user_init, read after fork (lock-free).
struct Decision {
    gpus: String,
    summary: String,
}
static DECISION: OnceCell<Decision> = OnceCell::new();

pub fn user_init(sp: &Spank) -> Result<(), Error> {
    let mut req = options::request();
    // Options given to this step win; then values resolved at submit time
    // (sbatch/salloc pass them as SLURM_SPANK_CARMA_*, which survives
    // --export=NONE); then CARMA_* in the step's environment (a direct srun
    // exports the user's environment, already validated by srun).
    req.fill_from_env(|name| {
        let spank = sp.getenv(&format!("SLURM_SPANK_{name}")).ok().flatten();
        spank.or_else(|| sp.getenv(name).ok().flatten()).map(String::into_bytes)
    })?;
    if req.is_empty() {
        return Ok(());
    }
    let job = sp.item_u32(Item::JobId)?;
    let step = sp.item_u32(Item::StepId)?;
    let gpus: Vec<String> = (0..req.gpu_count()).map(|i| i.to_string()).collect();
    let list = gpus.join(",");
    let policy = req.policy.unwrap_or(options::config()?.default_policy);
    let summary = format!("policy={policy} gpus={list}");
    log::info(&format!("job {job} step {step}: {summary}"));
    let _ = DECISION.set(Decision { gpus: list, summary });
    Ok(())
}

pub fn task_init(sp: &Spank) -> Result<(), Error> {
    if let Some(d) = DECISION.get() {
        for var in ["CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "GPU_DEVICE_ORDINAL"] {
            sp.setenv(var, &d.gpus)?;
        }
        sp.setenv("CARMA_DECISION", &d.summary)?;
    }
    Ok(())
}

pub fn exit(_sp: &Spank) -> Result<(), Error> {
    Ok(())
}
