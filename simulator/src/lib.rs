//! A discrete-event simulator that replays a job trace through CARMA's real
//! resolution and decision (`carma_placement::resolve` and `decide`, fed by a
//! `GpuSource` over simulated nodes), so admins can compare policies before
//! switching CARMA on, and the project can compare itself with the paper.
//!
//! Every modelling assumption is a field of [`Assumptions`], documented there
//! and in docs/simulation.md.
#![forbid(unsafe_code)]

pub mod calibration;
pub mod engine;
pub mod input;
pub mod jobcheck;
pub mod model;
pub mod paper;
pub mod report;
pub mod svg;

pub use engine::{Admission, Assumptions, Cluster, Estimator, Outcome, PowerProfile, Sharing, SimConfig, simulate};
pub use input::{
    TraceJob, Workload, apply_activity, apply_job_options, read_solo_readings, read_trace, read_workloads,
};
