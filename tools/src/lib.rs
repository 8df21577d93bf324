//! Shared pieces of CARMA's command-line tools: `carma` (admin CLI),
//! `carma-monitor` (GPU sampling), `carma-fakejob` (simulated GPU workload).
#![forbid(unsafe_code)]

pub mod admission;
pub mod cli;
pub mod cli_log;
pub mod http;
pub mod metrics;
pub mod monitor;
pub mod replay;
pub mod simulate;
pub mod status;
