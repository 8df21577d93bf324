//! CARMA's Slurm SPANK plugin.
//!
//! Layers (outermost first):
//! - [`spank`]: the only module with `unsafe`: exported symbols, the
//!   `extern "C"` hooks, the typed [`spank::Spank`] handle, C codes → `Result`.
//! - [`guard`]: every hook runs inside `catch_unwind`; errors and panics
//!   become one log line and an error code, never an unwind into Slurm.
//! - [`dispatch`]: routes each hook to the module of the running context:
//!   [`ctx::submit`] (srun, sbatch, salloc), [`ctx::remote`] (slurmstepd),
//!   [`ctx::job_script`] (prolog/epilog). slurmd needs nothing.

mod ctx;
mod dispatch;
mod error;
mod guard;
mod log;
mod options;
mod spank;
