//! CARMA's placement engine, free of Slurm and NVML types so that the SPANK
//! plugin, the admin CLI and the trace simulator all run the same code.
//!
//! - [`gpu`]: what a GPU source reports; [`source`]: NVML and simulated GPUs.
//! - [`state`]: the node-local, file-locked record of what CARMA promised.
//! - [`learned`]: the node's fixed memory, learned from finished jobs.
//! - [`policy`]: preconditions and the six policies, as pure functions;
//!   [`nofit`]: why no GPU fits, GPU by GPU.
//! - [`place`]: lock → read → garbage-collect → decide → write → unlock;
//!   [`slots`]: requests waiting for the lock, decided together by its holder.
// `unsafe` only where a module says why (the shared-memory queue, one libc
// call); every block carries its SAFETY comment.
#![deny(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod admin_comment;
#[allow(unsafe_code)] // bpf(2): the one system call (its module doc)
pub mod bpf;
pub mod clock;
pub mod command;
pub mod decide;
pub mod device;
pub mod devices;
pub mod eventlog;
pub mod fsutil;
pub mod gpu;
pub mod jobfiles;
pub mod learned;
pub mod nofit;
pub mod place;
pub mod policy;
pub mod procs;
pub mod request;
pub mod resolve;
#[allow(unsafe_code)] // the shared-memory queue: mapping and atomics (its module doc)
pub mod slots;
pub mod slowdown;
pub mod source;
pub mod state;
#[cfg(test)]
mod test_support;

pub use gpu::{GpuProcess, GpuReading, index_list};
pub use place::{LinuxProcesses, LiveHolders, PlaceError, Placer, Processes, Status};
pub use policy::{Demand, NoFit, Params, Reject, choose};
pub use request::{Decision, Request, StepRef};
pub use source::{GpuSource, SourceError, open_direct, open_monitored, open_sampling, open_source};
pub use state::{Holding, NodeState, Reservation, StateStore};
