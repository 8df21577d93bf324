//! CARMA's node-side helper at job end, `carma-epilog` (slurm.conf
//! `Epilog=`): OOM recovery (the verdict, the scan of the job's output as
//! its user, the requeue) and the requeue of a job slurmstepd handed back.
// Only asuser holds `unsafe` (dropping to a user's credentials).
#![deny(unsafe_code)]

pub mod asuser;
pub mod epilog;
pub mod hand_back;
pub mod helper;
pub mod job_env;
pub mod oom;
pub mod paths;
pub mod scan;
pub mod slurm;
pub mod sweep;
pub mod verdict;
