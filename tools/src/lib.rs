//! Shared pieces of CARMA's command-line tools: `carma` (admin CLI),
//! `carma-monitor` (GPU sampling), `carma-fakejob` (simulated GPU workload)
//! and `carma-fake-mps-control` (its MPS control daemon, for tests).
#![forbid(unsafe_code)]

pub mod admission;
pub mod calibrate;
pub mod cli;
pub mod cli_log;
pub mod http;
pub mod metrics;
pub mod monitor;
pub mod mps_standin;
pub mod replay;
pub mod simulate;
pub mod slurm_model;
pub mod status;
