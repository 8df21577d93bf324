//! The finished job as slurmd's epilog environment describes it: its
//! variables and the user it ran as.

use crate::asuser::User;

/// A variable of slurmd's epilog environment; empty where unset.
pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_default()
}

/// The job's user and group.
pub fn job_user() -> Result<User, String> {
    let uid = env("SLURM_JOB_UID").parse().map_err(|_| "SLURM_JOB_UID missing")?;
    let gid = env("SLURM_JOB_GID").parse().map_err(|_| "SLURM_JOB_GID missing")?;
    Ok(User { uid, gid })
}
