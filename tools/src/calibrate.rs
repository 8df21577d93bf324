//! `carma calibrate`: the slowdown model the guard decides with, held
//! against measured sets (data/h100/collocation.csv's format), job by job,
//! and what the guard would do with each set.

use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug, Clone, PartialEq)]
pub struct CalibrateArgs {
    /// Measured sets: a CSV with the columns mode, jobs,
    /// job_throughputs_it_s, power_w, nvml_utilization_gpu_pct and
    /// gpm_sm_activity_pct, one row per set (each job also alone, time-sliced)
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// The bound to judge the sets by (carma.yaml max_slowdown)
    #[arg(long, value_name = "X", default_value_t = 1.6)]
    pub max_slowdown: f64,
}

/// Prints every job's predicted and measured slowdown, the error summary
/// and the guard's verdict per set.
pub fn cmd_calibrate(a: &CalibrateArgs) -> Result<(), String> {
    if !(a.max_slowdown.is_finite() && a.max_slowdown >= 1.0) {
        return Err(format!("--max-slowdown {}: use a factor of 1 or more, like 1.6", a.max_slowdown));
    }
    let rows = carma_simulator::calibration::read_collocation(&a.file)?;
    let checks = carma_simulator::jobcheck::job_checks(&rows).map_err(|e| format!("{}: {e}", a.file.display()))?;
    if checks.is_empty() {
        return Err(format!("{}: no set of two or more jobs (or one under MPS) to check", a.file.display()));
    }
    print!("{}", carma_simulator::jobcheck::report(&checks, a.max_slowdown));
    Ok(())
}
