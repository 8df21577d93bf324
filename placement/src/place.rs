//! One placement: read the GPUs, then under the state lock collect garbage,
//! reuse the job's GPUs or choose new ones, and record the reservation.

mod error;
mod processes;
mod queue;

pub use error::PlaceError;
pub use processes::{LinuxProcesses, LiveHolders, Processes};

use queue::{Waited, answer_or_lock};

use crate::clock::{now_ms, now_secs};
use crate::gpu::GpuReading;
use crate::policy::{Params, learn_profiles, observe};
use crate::request::{Decision, Request, StepRef};
use crate::source::{GpuSource, SourceError, open_source};
use crate::state::{Holding, Logger, NodeState, Reservation, StateStore};
use carma_config::{Config, LearnRuntime};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The longest pause between two looks while a step waits for a GPU: a
/// cancelled job's step ends within about this (plus one question to Slurm).
pub const WAIT_SLICE: Duration = Duration::from_millis(500);

const GC_INTERVAL_MS: u64 = 1000;

/// What a GPU source is opened with: carma.yaml and the log sink.
type SourceConfig = (Config, fn(&str));

pub struct Placer {
    store: StateStore,
    /// Opened on first use: releasing or recording holdings needs no GPU readings.
    source: Option<Box<dyn GpuSource>>,
    source_config: Option<SourceConfig>,
    params: Params,
    learn: LearnRuntime,
    processes: Box<dyn Processes>,
    log: Logger,
}

/// What `carma status` and the dry run show: the GPUs, the node's state,
/// and the thresholds as of those readings.
pub struct Status {
    pub readings: Vec<GpuReading>,
    pub state: NodeState,
    pub params: Params,
}

/// The readings of an opened source, and when their window ended where
/// that is older than the read ([`Params::readings_ms`]: published readings).
fn read_source(source: &mut Option<Box<dyn GpuSource>>) -> Result<(Vec<GpuReading>, Option<u64>), PlaceError> {
    match source.as_mut() {
        Some(s) => Ok((s.read()?, s.as_of_ms())),
        None => Err(PlaceError::Source(SourceError("no GPU source configured".into()))),
    }
}

impl Placer {
    pub fn new(
        store: StateStore,
        source: Box<dyn GpuSource>,
        params: Params,
        processes: Box<dyn Processes>,
        log: Logger,
    ) -> Placer {
        let learn = LearnRuntime::default();
        Placer { store, source: Some(source), source_config: None, params, learn, processes, log }
    }

    fn source(&mut self) -> Result<&mut Box<dyn GpuSource>, PlaceError> {
        if self.source.is_none() {
            let (cfg, log) = self
                .source_config
                .as_ref()
                .ok_or_else(|| PlaceError::Source(SourceError("no GPU source configured".into())))?;
            self.source = Some(open_source(cfg, *log)?);
        }
        Ok(self.source.as_mut().expect("just opened"))
    }

    /// The readings, and when their window ended where that is older than
    /// the read.
    fn read(&mut self) -> Result<(Vec<GpuReading>, Option<u64>), PlaceError> {
        self.source()?;
        read_source(&mut self.source)
    }

    /// The placer of this node as carma.yaml describes it.
    pub fn from_config(cfg: &Config, log: fn(&str)) -> Result<Placer, PlaceError> {
        let store = StateStore::open(&cfg.state_dir, cfg.timeouts.lock, Box::new(log))?;
        let params = Params {
            metric: cfg.activity_metric,
            sm_activity_cap: cfg.sm_activity_cap,
            busy_cap: cfg.busy_cap,
            headroom_mib: cfg.headroom_mib,
            // The monitor's readings average over its window, so a job
            // placed within it shows only part of its activity yet; direct
            // reads (NVML, the simulated GPUs) show a job once it runs.
            window_secs: if cfg.monitor.published { cfg.monitor_window.as_secs().max(1) } else { 0 },
            now_secs: 0,
            readings_ms: None,
            sharing: cfg.sharing,
            max_slowdown: cfg.max_slowdown,
            max_slowdown_unprofiled: cfg.max_slowdown_unprofiled,
            idle_first: cfg.idle_first,
            profile_after_secs: cfg.monitor_window.as_secs().max(1),
        };
        Ok(Placer {
            store,
            source: None,
            source_config: Some((cfg.clone(), log)),
            params,
            learn: cfg.estimator.learn_runtime,
            processes: Box::new(LinuxProcesses),
            log: Box::new(log),
        })
    }

    /// The thresholds, as of now, for readings as of now.
    pub fn params(&self) -> Params {
        Params { now_secs: now_secs(), ..self.params }
    }

    /// Who holds reservations (Linux's slurmstepds unless set: the latency
    /// bench stands in its own process: [`LiveHolders`]).
    pub fn set_processes(&mut self, processes: Box<dyn Processes>) {
        self.processes = processes;
    }

    /// How this node learns its fixed memory (carma.yaml's defaults unless
    /// set).
    pub fn set_learn_runtime(&mut self, learn: LearnRuntime) {
        self.learn = learn;
    }

    pub fn source_name(&mut self) -> Result<&'static str, PlaceError> {
        Ok(self.source()?.name())
    }

    /// The recorded state (shared lock): carma-monitor's metrics.
    pub fn state(&self) -> Result<NodeState, PlaceError> {
        Ok(self.store.snapshot()?)
    }

    /// Live readings and the recorded state (shared lock), for status.
    pub fn status(&mut self) -> Result<Status, PlaceError> {
        let (readings, readings_ms) = self.read()?;
        let params = Params { readings_ms, ..self.params() };
        Ok(Status { readings, state: self.store.snapshot()?, params })
    }

    /// Garbage collection costs a /proc lookup per holder, so it runs at most
    /// every GC_INTERVAL_MS, and always before a placement is refused: a
    /// stale reservation can delay nothing. Queue slots of dead steps are
    /// freed on the periodic runs only (they delay nothing).
    fn collect(&self, st: &mut NodeState, force: bool) {
        let now = now_ms();
        let periodic = now.saturating_sub(st.last_gc_ms) >= GC_INTERVAL_MS;
        if !force && !periodic {
            return;
        }
        st.last_gc_ms = now;
        // Several reservations and tickets may name one holder: look once.
        let seen = std::cell::RefCell::new(HashMap::new());
        let alive = |pid: u32| *seen.borrow_mut().entry(pid).or_insert_with(|| self.processes.alive(pid));
        if periodic && let Some(q) = self.store.slots() {
            q.reclaim(&alive);
        }
        // A holder counts only while it is still a slurmstepd of its job.
        let holds = |job: u32, pid: u32| alive(pid) && self.processes.holds(job, pid);
        for r in st.collect_garbage(holds, |job| self.processes.job_running(job)) {
            let gpus = crate::gpu::index_list(&r.gpus);
            (self.log)(&format!("released job {} from gpu_indices={gpus}: its steps are gone", r.job));
        }
    }

    /// One attempt: reuse the job's GPUs or choose new ones. A step that
    /// finds the lock taken queues its request: whichever step holds the
    /// lock decides every queued request in one state write, so a burst of
    /// launches does not pass the lock once per launch (see
    /// [`crate::slots`]).
    pub fn try_place(&mut self, step: StepRef, req: &Request) -> Result<Decision, PlaceError> {
        self.attempt(step, req, None, &mut false)
    }

    /// [`Placer::try_place`]; a refusal bumps `count` in the state write
    /// that decides it ([`crate::slots::RefusalCount`]), and `counted` says
    /// whether it did (then the step does not pass the lock again to count).
    fn attempt(
        &mut self,
        step: StepRef,
        req: &Request,
        count: Option<crate::slots::RefusalCount>,
        counted: &mut bool,
    ) -> Result<Decision, PlaceError> {
        // Opened (NVML initialised, where it is read directly) before any
        // lock. Published (or simulated) readings, a file, are read only by
        // whoever takes the lock: a queued launch is decided on the holder's
        // readings and reads nothing. The driver is never read under the lock (a
        // hung driver would hold every launch of the node behind it, to
        // fail on the lock's timeout): each launch reads it first, bounded
        // by timeouts.gpu_read. Older readings than the lock's are safe: a
        // job placed since counts by its whole promise, one released since
        // by its memory still in use.
        let early = match self.source()?.name() {
            "nvml" => Some(read_source(&mut self.source)?),
            _ => None,
        };
        *counted = false;
        let (lock, own) = match self.store.try_exclusive()? {
            Some(lock) => (lock, None),
            None => match self.store.slots().and_then(|q| Some((q, q.enqueue(step, req, count)?))) {
                // No queue (or no room in it): wait for the lock, bounded.
                None => (self.store.exclusive()?, None),
                Some((q, slot)) => match answer_or_lock(&self.store, q, slot)? {
                    Waited::Answered(d) => return self.within_slurms(step, req, d, counted),
                    Waited::Locked(lock) => (lock, Some(slot)),
                },
            },
        };
        if let Some(q) = self.store.slots() {
            // Whatever a dead decider had taken is queued again; then ours
            // leaves the queue, unless it was answered meanwhile.
            q.recover_taken();
            if let Some(d) = own.and_then(|s| q.withdraw(s)) {
                drop(lock);
                return self.within_slurms(step, req, d, counted);
            }
        }
        // A failed read returns with the lock, which gives it back.
        let read_before_lock = early.is_some();
        let (readings, as_of_ms) = match early {
            Some(r) => r,
            None => read_source(&mut self.source)?,
        };
        self.decide_queued(lock, step, req, (&readings, as_of_ms, read_before_lock), count, counted)
    }

    /// Counts a step that waits, or one that was not placed (carma-monitor
    /// exports the counts); a state that cannot be written loses the count,
    /// never the step.
    fn count(&self, f: impl FnOnce(&mut crate::state::Counters)) {
        let _ = self.store.update(|st| f(&mut st.counters));
    }

    /// Places, re-checking with back-off (poll, doubling up to 8×poll, never
    /// more than [`WAIT_SLICE`]) while no GPU fits, for at most `wait`.
    /// `wait` zero = one attempt. Before each pause `job_alive` is asked:
    /// slurmstepd sees nothing of a cancel while a hook runs (its terminate
    /// handler waits for the step to start), so the caller asks Slurm.
    pub fn place(
        &mut self,
        step: StepRef,
        req: &Request,
        wait: Duration,
        poll: Duration,
        job_alive: &mut dyn FnMut() -> bool,
    ) -> Result<Decision, PlaceError> {
        use crate::slots::RefusalCount;
        let start = Instant::now();
        let mut pause = poll;
        let mut waiting = false;
        loop {
            // What a refusal of this attempt counts, bumped in the state
            // write that decides it (a final refusal or the first wait; a
            // refusal of more GPUs than the node has counts as final).
            let asked =
                if wait.is_zero() { Some(RefusalCount::NoFit) } else { (!waiting).then_some(RefusalCount::Wait) };
            let mut counted = false;
            match self.attempt(step, req, asked, &mut counted) {
                // More GPUs than the node has: waiting cannot help.
                Err(PlaceError::NoFit(last)) if (last.reasons.len() as u32) < last.wanted => {
                    if !counted {
                        self.count(|c| c.no_fit(last.class()));
                    }
                    return Err(PlaceError::NoFit(last));
                }
                Err(PlaceError::NoFit(last)) => {
                    let waited = start.elapsed();
                    if waited >= wait {
                        if !(counted && asked == Some(RefusalCount::NoFit)) {
                            self.count(|c| c.no_fit(last.class()));
                        }
                        return Err(if wait.is_zero() {
                            PlaceError::NoFit(last)
                        } else {
                            PlaceError::TimedOut { waited, last }
                        });
                    }
                    if !waiting {
                        waiting = true;
                        if !(counted && asked == Some(RefusalCount::Wait)) {
                            self.count(|c| c.waits += 1);
                        }
                    } else if !job_alive() {
                        self.count(|c| c.no_fit(last.class()));
                        return Err(PlaceError::Ended { waited });
                    }
                    std::thread::sleep(pause.min(wait - waited).min(WAIT_SLICE));
                    pause = (pause * 2).min(poll * 8);
                }
                other => return other,
            }
        }
    }

    /// Records GPUs that Slurm allocated to a job (from the prolog's trusted
    /// environment) as held whole, so that CARMA never places another job on
    /// them. A step that turns out to share (shards, CARMA) calls
    /// [`Placer::drop_whole`].
    pub fn record_whole(&self, job: u32, gpus: &[u32]) -> Result<(), PlaceError> {
        self.store.update(|st| {
            self.collect(st, false);
            match st.job_mut(job) {
                // A record an earlier run of the job left (its epilog did
                // not run): this allocation's GPUs replace its own.
                Some(r) if r.holding == Holding::SlurmWhole && r.holders.is_empty() => r.gpus = gpus.to_vec(),
                Some(_) => {}
                None => st.reservations.push(Reservation::slurm_whole(job, gpus.to_vec(), now_secs())),
            }
        })?;
        Ok(())
    }

    /// The job shares its GPUs after all (shards or CARMA placement): forget
    /// the whole-GPU record the prolog made. Returns true if one existed.
    pub fn drop_whole(&self, job: u32) -> Result<bool, PlaceError> {
        Ok(self.store.update(|st| st.drop_whole(job))?)
    }

    /// [`Placer::drop_whole`] for each of `jobs`, in one state update;
    /// returns the jobs that had a record.
    pub fn drop_whole_of(&self, jobs: &[u32]) -> Result<Vec<u32>, PlaceError> {
        Ok(self.store.update(|st| jobs.iter().copied().filter(|j| st.drop_whole(*j)).collect())?)
    }

    /// A step ended: the job's GPUs are released when no step holds them.
    pub fn release(&self, step: StepRef) -> Result<Option<Reservation>, PlaceError> {
        Ok(self.store.update(|st| st.release_holder(step.job, step.holder))?)
    }

    /// Raises placed jobs' observed peaks to what their processes use in
    /// `readings` (carma-monitor, every interval), and the profiles of jobs
    /// running alone to what their GPUs read (`learn_profiles`), so that
    /// neither depends on other jobs being placed while it runs. Takes the
    /// exclusive lock and writes only when something rose; returns how
    /// many jobs' peaks or profiles did.
    pub fn observe_peaks(&self, readings: &[GpuReading]) -> Result<usize, PlaceError> {
        let params = self.params();
        let rises = |st: &NodeState| -> (usize, NodeState) {
            let owners = self.processes.owners_on(readings, st);
            let mut after = st.clone();
            observe(&mut after, readings, &owners);
            learn_profiles(&mut after, readings, &owners, &params);
            let n = st
                .reservations
                .iter()
                .zip(&after.reservations)
                .filter(|(a, b)| {
                    b.observed_mib > a.observed_mib || b.profile != a.profile || b.alone_since != a.alone_since
                })
                .count();
            (n, after)
        };
        if rises(&self.store.snapshot()?).0 == 0 {
            return Ok(0);
        }
        let mut lock = self.store.exclusive()?;
        let st = lock.load()?;
        let (n, after) = rises(&st);
        if n > 0 {
            lock.store(&after)?;
        }
        Ok(n)
    }

    /// The GPU memory shared jobs could still be promised here, in GiB, on
    /// `readings` and the recorded state (carma-monitor's admission count;
    /// [`crate::policy::admissible_gib`]).
    pub fn admissible_gib(&self, readings: &[GpuReading]) -> Result<u64, PlaceError> {
        let st = self.store.snapshot()?;
        let owners = self.processes.owners_on(readings, &st);
        Ok(crate::policy::admissible_gib(readings, &st, &owners, &self.params()))
    }

    /// What a job needed when it ran out of GPU memory (carma-epilog): a
    /// lower bound of its peak, remembered like an observed one.
    pub fn remember_peak(&self, signature: &str, mib: u64) -> Result<(), PlaceError> {
        Ok(self.store.update(|st| st.remember_peak(signature, mib))?)
    }

    /// A job of this node was requeued after running out of GPU memory
    /// (carma-epilog).
    pub fn count_recovery(&self) -> Result<(), PlaceError> {
        Ok(self.store.update(|st| st.counters.oom_recoveries += 1)?)
    }

    /// The job ended (epilog): release whatever it still holds.
    pub fn release_job(&self, job: u32) -> Result<Option<Reservation>, PlaceError> {
        Ok(self.store.update(|st| st.release_job(job))?)
    }
}
