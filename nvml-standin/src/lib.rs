//! A GPU stand-in behind NVML's C interface: `libnvidia-ml.so.1` for
//! nodes without GPUs (the test cluster, CI, the demo). CARMA's production
//! code loads it through nvml-wrapper exactly as it loads the driver's, so
//! the NVML source, GPM sampling, per-process memory and MPS detection run
//! in CI. Below this interface everything is simulated: the GPUs and their
//! load come from the simulated GPUs' description file and the workloads
//! registered there (`carma-fakejob`), see [`model`].
//!
//! It answers as the driver does call by call where CARMA depends on it:
//! versioned structs are checked, a process list that does not fit the
//! caller's buffer is `NVML_ERROR_INSUFFICIENT_SIZE` with the count, GPM
//! is `NVML_ERROR_NOT_SUPPORTED` on the A100 profile, and faults (no
//! driver, a lost GPU, a process race, a hung call) come from the file.
//! Every entry catches panics: nothing unwinds into the caller.
//!
//! The entry points by concern: `system` (init, versions, error strings),
//! `device` (identity, memory, processes), `activity` (utilization, power)
//! and `gpm`; `entry` holds what they share.

#![allow(clippy::missing_safety_doc)]

pub mod model;
pub mod replay;

mod activity;
mod device;
mod entry;
mod gpm;
mod system;

pub use activity::*;
pub use device::*;
pub use gpm::*;
pub use system::*;

/// NVML's return codes (nvml.h).
pub mod code {
    pub const SUCCESS: u32 = 0;
    pub const UNINITIALIZED: u32 = 1;
    pub const INVALID_ARGUMENT: u32 = 2;
    pub const NOT_SUPPORTED: u32 = 3;
    pub const NO_PERMISSION: u32 = 4;
    pub const NOT_FOUND: u32 = 6;
    pub const INSUFFICIENT_SIZE: u32 = 7;
    pub const DRIVER_NOT_LOADED: u32 = 9;
    pub const GPU_IS_LOST: u32 = 15;
    pub const LIB_RM_VERSION_MISMATCH: u32 = 18;
    pub const ARGUMENT_VERSION_MISMATCH: u32 = 25;
    pub const UNKNOWN: u32 = 999;
}
