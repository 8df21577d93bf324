//! Shared pieces of CARMA's command-line tools: `carma` (admin CLI),
//! `carma-fakejob` (simulated GPU workload), `carma-prolog`/`carma-epilog`.
// Only recovery::asuser holds `unsafe` (dropping to a user's credentials).
#![deny(unsafe_code)]

pub mod admission;
pub mod args;
pub mod cli_log;
pub mod http;
pub mod metrics;
pub mod monitor;
pub mod recovery;
pub mod simulate;
pub mod status;
