//! Plugin log lines, every one prefixed with `carma: `. In srun/sbatch they
//! reach the user's terminal; in slurmstepd, slurmd's log.

use crate::spank::{LogLevel, slurm_log};

pub fn error(msg: &str) {
    slurm_log(LogLevel::Error, &format!("carma: {msg}"));
}

pub fn info(msg: &str) {
    slurm_log(LogLevel::Info, &format!("carma: {msg}"));
}

pub fn verbose(msg: &str) {
    slurm_log(LogLevel::Verbose, &format!("carma: {msg}"));
}

pub fn debug(msg: &str) {
    slurm_log(LogLevel::Debug, &format!("carma: {msg}"));
}
