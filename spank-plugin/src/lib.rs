//! CARMA's Slurm SPANK plugin.
//!
//! Floors, top first; each calls only floors below it:
//! - [`hooks`]: the symbols Slurm looks up; every `extern "C"` hook runs
//!   [`guard`] around [`dispatch`].
//! - [`dispatch`]: routes each hook to the module of the running context:
//!   [`ctx::submit`] (srun, sbatch, salloc), [`ctx::remote`] (slurmstepd:
//!   Slurm's facts → `carma_placement::resolve` → the placer → the task),
//!   [`ctx::job_script`] (prolog/epilog). slurmd needs nothing.
//! - [`guard`]: every hook runs inside `catch_unwind`; errors and panics
//!   become one log line and an error code, never an unwind into Slurm.
//! - [`options`], [`log`], [`error`]: option values, log lines, errors;
//!   [`record`]: the job's CARMA record in its AdminComment.
//! - [`spank`]: the typed handle over Slurm's `spank_*` calls, C codes →
//!   `Result` in one place. `unsafe` lives in [`spank`] and [`hooks`] only,
//!   each block with its SAFETY comment (clippy denies one without).
#![deny(clippy::undocumented_unsafe_blocks)]

mod ctx;
mod dispatch;
mod error;
mod guard;
mod hooks;
mod log;
mod options;
mod record;
mod spank;
