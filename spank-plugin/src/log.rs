//! Plugin log lines, every one prefixed with `carma: `. In srun/sbatch they
//! reach the user's terminal; in slurmstepd, slurmd's log. Placement
//! decisions also go to syslog (if /dev/log exists) and to carma.yaml's
//! `log_file`; neither failing ever fails a job.

use crate::spank::{LogLevel, slurm_log};
use carma_placement::eventlog;
use std::path::PathBuf;

pub fn error(msg: &str) {
    slurm_log(LogLevel::Error, &format!("carma: {msg}"));
}

pub fn info(msg: &str) {
    slurm_log(LogLevel::Info, &format!("carma: {msg}"));
}

pub fn debug(msg: &str) {
    slurm_log(LogLevel::Debug, &format!("carma: {msg}"));
}

/// Sets the optional log file (from carma.yaml) once per process.
pub fn set_log_file(path: Option<PathBuf>) {
    eventlog::set_file(path);
}

/// A decision or state change: Slurm's log, syslog and the log file.
pub fn event(msg: &str) {
    info(msg);
    eventlog::event(msg);
}

/// A CARMA step that could not be placed (already in Slurm's log at error
/// level): syslog and the log file, so `carma.log` names every CARMA step.
pub fn record_failure(msg: &str) {
    eventlog::event(msg);
}
