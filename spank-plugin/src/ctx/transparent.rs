//! Transparent collocation in slurmstepd: a step of a job that named no
//! CARMA option, holds shards on this node, and runs in one of carma.yaml's
//! `transparent:` scopes (slurmctld's job_submit/lua turned its
//! `--gres=gpu:N` into `--gres=shard:N`). CARMA places it on as many GPUs
//! as it holds shards here, under the scope's policy, with the estimate:
//! the node's history of the same user's same job, else the scope's
//! default size, else whole GPUs.

use crate::error::Error;
use crate::spank::Spank;
use carma_config::{Config, JobScopeFacts, Policy};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;

/// Slurm's own limit on a batch script (slurm.conf max_script_size default).
const MAX_SCRIPT_BYTES: u64 = 4 << 20;

pub struct Transparent {
    /// The scope's selectors, `partition:gpu`.
    pub scope: String,
    pub policy: Policy,
    pub count: u32,
    pub estimate_mib: Option<u64>,
    /// `scope_default` or `unknown`; history, where it applies, says so itself.
    pub source: &'static str,
    /// Job name plus script (or command) digest, for the node's history.
    pub signature: Option<String>,
}

/// The job runs in a transparent scope (errors read as no).
pub fn in_scope(sp: &Spank, cfg: &Config) -> bool {
    scope(sp, cfg).ok().flatten().is_some()
}

fn scope<'c>(sp: &Spank, cfg: &'c Config) -> Result<Option<&'c carma_config::Scope>, Error> {
    if cfg.transparent.is_empty() {
        return Ok(None);
    }
    let (partition, account, qos) =
        (sp.getenv("SLURM_JOB_PARTITION")?, sp.getenv("SLURM_JOB_ACCOUNT")?, sp.getenv("SLURM_JOB_QOS")?);
    let facts = JobScopeFacts { partition: partition.as_deref(), account: account.as_deref(), qos: qos.as_deref() };
    Ok(cfg.transparent_scope(&facts))
}

/// `Some` when the step is transparently collocated. `shards`: the shards
/// Slurm gave the job on this node (SLURM_SHARDS_ON_NODE).
pub fn detect(sp: &Spank, cfg: &Config, shards: u32, batch: bool) -> Result<Option<Transparent>, Error> {
    let Some(scope) = scope(sp, cfg)? else { return Ok(None) };
    let (estimate_mib, source) = match scope.default_mib {
        Some(m) => (Some(m), "scope_default"),
        None => (None, "unknown"),
    };
    Ok(Some(Transparent {
        scope: scope.selectors(),
        policy: scope.policy.unwrap_or(cfg.default_policy),
        count: shards.max(1),
        estimate_mib,
        source,
        signature: signature(sp, batch),
    }))
}

/// FNV-1a over the job name and the batch script (a batch step) or the
/// command line (a job started by srun). `None` when neither is readable:
/// such a job just has no history.
fn signature(sp: &Spank, batch: bool) -> Option<String> {
    let name = sp.getenv("SLURM_JOB_NAME").ok().flatten().unwrap_or_default();
    let argv = sp.argv().ok()?;
    let body = if batch { read_script(argv.first()?)? } else { argv.join(&0u8) };
    let h = [name.as_bytes(), &[0], &body]
        .iter()
        .flat_map(|b| b.iter())
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3));
    Some(format!("job:{h:016x}"))
}

/// Slurm's copy of the batch script, in slurmd's root-owned spool (Slurm
/// names the path, not the user); no symlink is followed.
fn read_script(path: &[u8]) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(path));
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path).ok()?;
    let mut body = Vec::new();
    f.take(MAX_SCRIPT_BYTES).read_to_end(&mut body).ok()?;
    Some(body)
}
