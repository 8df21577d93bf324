//! Which processes are alive and which slurmstepd holds them: Linux's
//! /proc in production, a stand-in for the bench, tests and simulator.

use crate::gpu::GpuReading;
use crate::procs;
use crate::state::NodeState;
use std::collections::HashMap;

/// How the placer learns which processes are alive and whose they are.
/// Linux /proc in production; the simulator supplies its own.
pub trait Processes: Send {
    fn alive(&self, pid: u32) -> bool;
    /// `pid`, recorded as a holder of `job`, still is one (and is not a
    /// reused pid).
    fn holds(&self, job: u32, pid: u32) -> bool {
        let _ = job;
        self.alive(pid)
    }
    /// The job still has a step on this node.
    fn job_running(&self, job: u32) -> bool;
    fn owners(&self, pids: &[u32], holders: &[u32]) -> HashMap<u32, u32>;

    /// Which holder (slurmstepd) each process on the GPUs descends from,
    /// among the holders the node state records.
    fn owners_on(&self, readings: &[GpuReading], st: &NodeState) -> HashMap<u32, u32> {
        let pids: Vec<u32> = readings.iter().flat_map(|g| g.processes.iter().map(|p| p.pid)).collect();
        let holders: Vec<u32> = st.reservations.iter().flat_map(|r| r.holders.iter().copied()).collect();
        self.owners(&pids, &holders)
    }
}

pub struct LinuxProcesses;

impl Processes for LinuxProcesses {
    fn alive(&self, pid: u32) -> bool {
        procs::alive(pid)
    }
    fn holds(&self, job: u32, pid: u32) -> bool {
        procs::stepd_of(job, pid)
    }
    fn job_running(&self, job: u32) -> bool {
        procs::job_has_stepd(job)
    }
    fn owners(&self, pids: &[u32], holders: &[u32]) -> HashMap<u32, u32> {
        procs::owners(pids.iter().copied(), holders)
    }
}

/// Linux's processes, where any live process holds the reservations it
/// is recorded for: a stand-in for slurmstepd (in production only a root
/// slurmstepd of the job holds: `procs::stepd_of`) for the latency bench
/// and the tests, whose own process holds what it places.
pub struct LiveHolders;

impl Processes for LiveHolders {
    fn alive(&self, pid: u32) -> bool {
        procs::alive(pid)
    }
    fn job_running(&self, _job: u32) -> bool {
        false
    }
    fn owners(&self, pids: &[u32], holders: &[u32]) -> HashMap<u32, u32> {
        procs::owners(pids.iter().copied(), holders)
    }
}
