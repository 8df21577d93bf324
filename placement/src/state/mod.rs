//! Node-local state: which job holds which GPUs, with what estimate, since
//! when, under which policy. One JSON file under the configured directory,
//! guarded by an flock with a bounded wait, replaced atomically.
//!
//! - `records`: one reservation; `counters`: what placements came to;
//!   `history`: ended jobs' peaks, remembered by signature.
//! - `store`: the state directory; `lock`: its bounded flock; `file`:
//!   reading and writing the file; `wire`: its JSON.

mod counters;
mod error;
mod file;
mod history;
mod lock;
mod records;
mod store;
mod wire;

pub use counters::{ACCURACY_BOUNDS, Counters};
pub use error::StateError;
pub(crate) use error::io;
pub use history::HISTORY_MAX;
pub use lock::Locked;
pub use records::{Holding, Reservation};
pub use store::{Logger, StateStore};

use std::collections::BTreeMap;

/// Raised only when a change is not additive (a field whose meaning an
/// older build would get wrong): new fields are kept by older builds
/// anyway, and a raised version makes every older build refuse the file.
pub const STATE_VERSION: u32 = 1;

/// The node's state. Read and written through [`wire`], which keeps the
/// fields a newer build wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeState {
    pub version: u32,
    /// Unix milliseconds of the last garbage collection.
    pub last_gc_ms: u64,
    /// Next GPU index the round-robin policy starts from.
    pub rr_cursor: u32,
    pub reservations: Vec<Reservation>,
    /// Observed peaks of ended jobs by signature, MiB (the `history`
    /// estimate). At most HISTORY_MAX entries.
    pub history: BTreeMap<String, u64>,
    /// When each signature of `history` was last used or raised, in the
    /// node's order of uses (missing: before any), for trimming the least
    /// recently used.
    pub history_used: BTreeMap<String, u64>,
    /// What each job signature (`uid:...`) does to a GPU alone, learned
    /// from readings of windows in which one of its jobs ran alone (the
    /// slowdown guard). Bounded like `history`.
    pub profiles: BTreeMap<String, crate::slowdown::Profile>,
    /// Ended jobs' observed peaks less their model parts, by user (the
    /// learned fixed memory, `learned.rs`).
    pub runtime_by_user: crate::learned::ByUser,
    /// Observations from before they were kept per user: read (so such a
    /// file loads) and dropped, since nobody knows whose they were.
    pub runtime_samples: Vec<u64>,
    /// What this node's placements came to, since the state file was made
    /// (carma-monitor exports them as counters).
    pub counters: Counters,
    /// Per job, what each of its later steps (by holder) added to the
    /// job's promise (`reserved_mib`), taken back when the step ends
    /// (see `decide::join`).
    pub step_parts: BTreeMap<u32, BTreeMap<u32, u64>>,
    /// Per job, its batch step's holder, where the batch step holds.
    pub batch_steps: BTreeMap<u32, u32>,
    /// Top-level fields a newer build wrote, kept as read.
    pub unknown: Unknown,
    /// Per job, the fields of its reservation that a newer build wrote,
    /// kept as read (here, so that [`Reservation`] stays a plain struct);
    /// dropped with the job's reservation.
    pub unknown_per_job: BTreeMap<u32, Unknown>,
}

/// Fields this build does not know, as read.
pub type Unknown = serde_json::Map<String, serde_json::Value>;

impl Default for NodeState {
    fn default() -> NodeState {
        NodeState {
            version: STATE_VERSION,
            last_gc_ms: 0,
            rr_cursor: 0,
            reservations: Vec::new(),
            history: BTreeMap::new(),
            history_used: BTreeMap::new(),
            profiles: BTreeMap::new(),
            runtime_by_user: BTreeMap::new(),
            runtime_samples: Vec::new(),
            counters: Counters::default(),
            step_parts: BTreeMap::new(),
            batch_steps: BTreeMap::new(),
            unknown: Unknown::new(),
            unknown_per_job: BTreeMap::new(),
        }
    }
}

impl NodeState {
    pub fn job(&self, job: u32) -> Option<&Reservation> {
        self.reservations.iter().find(|r| r.job == job)
    }

    pub fn job_mut(&mut self, job: u32) -> Option<&mut Reservation> {
        self.reservations.iter_mut().find(|r| r.job == job)
    }

    /// Drops holders that no longer hold their job (`holds(job, pid)`:
    /// dead, or a reused pid), then reservations left without any whose job no
    /// longer runs on this node; returns the released reservations.
    pub fn collect_garbage(
        &mut self,
        holds: impl Fn(u32, u32) -> bool,
        job_running: impl Fn(u32) -> bool,
    ) -> Vec<Reservation> {
        for r in &mut self.reservations {
            let job = r.job;
            let parts = self.step_parts.get_mut(&job);
            take_back_parts(r, parts, |pid| holds(job, pid));
        }
        // Slurm's whole GPUs stay the job's while Slurm says so, not while
        // a slurmstepd of it runs: an salloc without PrologFlags=Contain has
        // none between its sruns. The job epilog releases them, or the
        // epilog's sweep once Slurm says the job ended.
        let (keep, gone) = std::mem::take(&mut self.reservations)
            .into_iter()
            .partition(|r| r.holding == Holding::SlurmWhole || !r.holders.is_empty() || job_running(r.job));
        self.reservations = keep;
        for r in &gone {
            self.unknown_per_job.remove(&r.job);
            self.step_parts.remove(&r.job);
            self.batch_steps.remove(&r.job);
            self.remember(r);
        }
        gone
    }

    /// Removes one holder of a job; releases the job when none is left.
    pub fn release_holder(&mut self, job: u32, holder: u32) -> Option<Reservation> {
        let parts = self.step_parts.get_mut(&job);
        let r = self.reservations.iter_mut().find(|r| r.job == job)?;
        if !r.holders.contains(&holder) {
            return None;
        }
        take_back_parts(r, parts, |p| p != holder);
        // A CARMA step inside a job Slurm gave whole GPUs ran on them: the
        // GPUs stay the job's until its epilog (an salloc's next srun).
        if r.holders.is_empty() && r.holding != Holding::SlurmWhole { self.release_job(job) } else { None }
    }

    /// Forgets the job's whole-GPU record (the prolog's), if it has one.
    pub fn drop_whole(&mut self, job: u32) -> bool {
        match self.job(job) {
            Some(r) if r.holding == Holding::SlurmWhole => self.release_job(job).is_some(),
            _ => false,
        }
    }

    pub fn release_job(&mut self, job: u32) -> Option<Reservation> {
        let i = self.reservations.iter().position(|r| r.job == job)?;
        let r = self.reservations.remove(i);
        self.unknown_per_job.remove(&job);
        self.step_parts.remove(&job);
        self.batch_steps.remove(&job);
        self.remember(&r);
        Some(r)
    }
}

/// Keeps the holders `keep` says, taking back what each one dropped added
/// to the promise.
fn take_back_parts(r: &mut Reservation, mut parts: Option<&mut BTreeMap<u32, u64>>, keep: impl Fn(u32) -> bool) {
    r.holders.retain(|&pid| {
        let kept = keep(pid);
        if !kept && let Some(part) = parts.as_mut().and_then(|p| p.remove(&pid)) {
            r.reserved_mib = r.reserved_mib.saturating_sub(part);
        }
        kept
    });
}

#[cfg(test)]
mod tests;
