//! CARMA's preconditions and policies as pure functions over a GPU reading
//! and the node state, so that they can be tested on hand-built states and
//! reused by the simulator.

use crate::gpu::GpuReading;
pub use crate::nofit::{NoFit, Reject};
use crate::slowdown::{Model, Profile};
use crate::state::{Holding, NodeState, Reservation};
use carma_config::{ActivityMetric, Policy, Sharing};
use std::collections::HashMap;

/// Thresholds from carma.yaml.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// The reading the precondition caps, and the caps of both.
    pub metric: ActivityMetric,
    pub sm_activity_cap: f64,
    pub busy_cap: f64,
    pub headroom_mib: u64,
    /// The window activity readings average over (carma.yaml's
    /// monitor_window): a job placed within it is not (fully) in the
    /// readings yet, and counts as [`Params::placed_activity`] on top of
    /// them. 0: readings see a job at once (the trace simulator's).
    pub window_secs: u64,
    /// Now, Unix seconds, against reservations' `since`.
    pub now_secs: u64,
    /// When the readings' window ended, ms since the epoch (the monitor's
    /// publication time): a job placed within the window counts by how
    /// much of it the readings have seen, which lags its age now by the
    /// publication's age. `None`: readings are as of now.
    pub readings_ms: Option<u64>,
    /// How jobs on one GPU share it: which slowdown model applies.
    pub sharing: Sharing,
    /// The slowdown guard: no job of a GPU may be predicted to run more
    /// than this many times slower than alone. Infinite: no guard.
    pub max_slowdown: f64,
    /// The bound on a job not yet seen alone, whose own slowdown is taken
    /// at its worst (as if it filled the GPU): at least `max_slowdown`.
    pub max_slowdown_unprofiled: f64,
    /// Collocating policies take an idle GPU (no job, no process) before
    /// any busy one, as CARMA's reference server does.
    pub idle_first: bool,
    /// A job's profile is learned from readings of at least this long in
    /// which it ran alone (carma.yaml monitor_window: what one reading
    /// averages over, published or read directly). 0: the readings' own
    /// window (`window_secs`) alone decides.
    pub profile_after_secs: u64,
}

impl Default for Params {
    /// carma.yaml's thresholds; no window (see [`Params::window_secs`]).
    fn default() -> Params {
        Params {
            metric: ActivityMetric::Sm,
            sm_activity_cap: 0.8,
            busy_cap: 0.8,
            headroom_mib: 2048,
            window_secs: 0,
            now_secs: 0,
            readings_ms: None,
            sharing: Sharing::Timeslice,
            max_slowdown: 1.6,
            max_slowdown_unprofiled: 2.0,
            idle_first: true,
            profile_after_secs: 0,
        }
    }
}

impl Params {
    pub fn cap(&self) -> f64 {
        match self.metric {
            ActivityMetric::Sm => self.sm_activity_cap,
            ActivityMetric::Busy => self.busy_cap,
        }
    }

    /// What a job placed within the window is taken to add to its GPUs'
    /// activity until the window has seen it: half the cap (its real
    /// activity is unknown until then), so that at most three jobs join
    /// an idle GPU at once (0, ½ and almost 1 cap pass; then it is over).
    /// Like promised memory, it keeps a burst of launches from piling onto
    /// a GPU whose readings do not show them yet.
    pub fn placed_activity(&self) -> f64 {
        self.cap() / 2.0
    }

    /// The slowdown model of this sharing mode.
    pub fn model(&self) -> Model {
        Model::of(self.sharing)
    }

    /// The bound on an unprofiled job's own worst case: never below the
    /// bound on the others, and off with the guard.
    pub fn unprofiled_bound(&self) -> f64 {
        self.max_slowdown_unprofiled.max(self.max_slowdown)
    }
}

/// The profiles of the jobs sharing a GPU (CARMA's shared reservations
/// naming it), `None` where a job was not yet seen alone.
fn profiles_on(on: &[&Reservation]) -> Vec<Option<Profile>> {
    on.iter().filter(|r| r.holding == Holding::Carma && !r.exclusive).map(|r| r.profile).collect()
}

/// What the guard predicts for a GPU's jobs with a newcomer among them.
struct Prediction {
    /// The worst slowdown of any of them.
    worst: f64,
    /// The first job over its bound: its slowdown and the bound.
    over: Option<(f64, f64)>,
    jobs: usize,
    unknown: usize,
}

/// Each job of the GPU with `newcomer` (last) against its bound: a job
/// whose profile is known may be predicted at most `max_slowdown`; one not
/// yet seen alone counts as filling the GPU (so its neighbours are
/// protected against the worst it could be), and that worst case of its
/// own must stay within `max_slowdown_unprofiled`.
fn predicted_with(on: &[&Reservation], newcomer: Option<Profile>, p: &Params) -> Prediction {
    let mut known = profiles_on(on);
    known.push(newcomer);
    let jobs: Vec<Profile> = known.iter().map(|k| k.unwrap_or(Profile::UNKNOWN)).collect();
    let slow = p.model().slowdowns(&jobs);
    let bound = |k: &Option<Profile>| if k.is_some() { p.max_slowdown } else { p.unprofiled_bound() };
    let over = known.iter().zip(&slow).find(|(k, s)| **s > bound(k)).map(|(k, s)| (*s, bound(k)));
    Prediction {
        worst: slow.iter().copied().fold(1.0, f64::max),
        over,
        jobs: jobs.len(),
        unknown: known.iter().filter(|k| k.is_none()).count(),
    }
}

/// The worst predicted slowdown of the jobs on `gpu` if a job of profile
/// `newcomer` (unknown: `None`) joined them (`carma place --dry-run`).
pub fn predicted_slowdown(gpu: &GpuReading, state: &NodeState, newcomer: Option<Profile>, p: &Params) -> f64 {
    predicted_with(&on_gpu(gpu, state), newcomer, p).worst
}

/// The GPU's activity as the precondition sees it: the reading, plus what
/// CARMA jobs placed on it within the window will add, and how many such
/// jobs there are. Each adds [`Params::placed_activity`] less the share of
/// the window that has seen it run (a window-long mean takes a job in
/// linearly).
pub fn expected_activity(gpu: &GpuReading, state: &NodeState, p: &Params) -> (f64, usize) {
    expected_activity_on(gpu, &on_gpu(gpu, state), p)
}

/// [`expected_activity`] over the reservations naming the GPU.
fn expected_activity_on(gpu: &GpuReading, on: &[&Reservation], p: &Params) -> (f64, usize) {
    let mut recent = 0;
    let mut pending = 0.0;
    if p.window_secs > 0 {
        let window_ms = p.window_secs * 1000;
        for r in on.iter().filter(|r| r.holding == Holding::Carma && !r.exclusive) {
            let seen_ms = seen_ms(r.since, p);
            if seen_ms < window_ms {
                recent += 1;
                pending += p.placed_activity() * (1.0 - seen_ms as f64 / window_ms as f64);
            }
        }
    }
    (gpu.activity(p.metric) + pending, recent)
}

/// The reservations naming `gpu`.
fn on_gpu<'a>(gpu: &GpuReading, state: &'a NodeState) -> Vec<&'a Reservation> {
    state.reservations.iter().filter(|r| r.gpus.contains(&gpu.index)).collect()
}

/// The reservations naming each of `gpus`, in their order, from one pass
/// over the state: each GPU's checks then read its own few reservations,
/// not all of the node's (a 64-GPU node deciding a burst of 64 launches
/// would otherwise scan every reservation for every GPU, check and launch).
fn by_gpu<'a>(gpus: &[GpuReading], state: &'a NodeState) -> Vec<Vec<&'a Reservation>> {
    // (Readings name each GPU once; were one named twice, both get its
    // reservations, as the scans did.)
    let mut at: HashMap<u32, Vec<usize>> = HashMap::new();
    for (i, g) in gpus.iter().enumerate() {
        at.entry(g.index).or_default().push(i);
    }
    let mut out = vec![Vec::new(); gpus.len()];
    for r in &state.reservations {
        for g in &r.gpus {
            for &i in at.get(g).into_iter().flatten() {
                // A reservation naming a GPU twice counts once, as with
                // `contains`.
                if out[i].last().is_none_or(|l: &&Reservation| !std::ptr::eq(*l, r)) {
                    out[i].push(r);
                }
            }
        }
    }
    out
}

/// How long of a job placed at `since` the readings' window has seen, in
/// ms. `since` is whole seconds, so the job may have started up to a
/// second later than it says: counted as seen a second less, never more
/// (published readings only; readings as of now keep the plain age).
/// Readings dated after now (a clock set back) are taken as of now.
fn seen_ms(since: u64, p: &Params) -> u64 {
    match p.readings_ms {
        Some(end) => {
            let end = end.min(p.now_secs.saturating_add(1).saturating_mul(1000));
            end.saturating_sub(since.saturating_add(1).saturating_mul(1000))
        }
        None => p.now_secs.saturating_sub(since).saturating_mul(1000),
    }
}

/// What a job asks for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Demand {
    pub policy: Policy,
    /// Distinct GPUs wanted.
    pub count: u32,
    /// Expected peak per GPU; `None` = unknown, so whole GPUs are needed.
    pub estimate_mib: Option<u64>,
    /// The job's user, when it will share a GPU as an MPS client: a GPU
    /// whose MPS server serves another user cannot take it.
    pub mps_uid: Option<u32>,
    /// What the job does to a GPU alone, as learned (`None`: unknown, so
    /// counted as filling it).
    pub profile: Option<Profile>,
}

/// A placement: GPUs in the order the policy ranked them.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub gpus: Vec<u32>,
    /// True when the job gets the GPUs to itself.
    pub exclusive: bool,
    /// Per-GPU memory the reservation promises (the whole GPU if exclusive).
    pub reserve_mib: u64,
    /// Effective free memory of each chosen GPU at decision time.
    pub free_mib: Vec<u64>,
    /// The capped reading of each chosen GPU at decision time.
    pub activity: Vec<f64>,
    /// The worst predicted slowdown of each chosen GPU's jobs, the job
    /// with them (1 where it is alone).
    pub slowdown: Vec<f64>,
}

/// Memory promised on `gpu` to placed jobs that have not allocated it yet:
/// for each CARMA reservation, its estimate minus what its processes use
/// there now, never below zero. `owners` maps GPU process pids to the
/// holder (slurmstepd) they descend from.
pub fn promised_mib(gpu: &GpuReading, state: &NodeState, owners: &HashMap<u32, u32>) -> u64 {
    promised_on(gpu, &on_gpu(gpu, state), owners)
}

/// [`promised_mib`] over the reservations naming the GPU.
fn promised_on(gpu: &GpuReading, on: &[&Reservation], owners: &HashMap<u32, u32>) -> u64 {
    on.iter()
        .filter(|r| r.holding == Holding::Carma)
        .map(|r| {
            let used: u64 = gpu
                .processes
                .iter()
                .filter(|p| owners.get(&p.pid).is_some_and(|h| r.holders.contains(h)))
                .map(|p| p.used_mib)
                .sum();
            r.reserved_mib.saturating_sub(used)
        })
        .sum()
}

/// Raises each CARMA reservation's observed peak to what its processes
/// use now on any of its GPUs.
pub fn observe(state: &mut NodeState, gpus: &[GpuReading], owners: &HashMap<u32, u32>) {
    for r in state.reservations.iter_mut().filter(|r| r.holding == Holding::Carma) {
        for g in gpus.iter().filter(|g| r.gpus.contains(&g.index)) {
            let used: u64 = g
                .processes
                .iter()
                .filter(|p| owners.get(&p.pid).is_some_and(|h| r.holders.contains(h)))
                .map(|p| p.used_mib)
                .sum();
            r.observed_mib = r.observed_mib.max(used);
        }
    }
}

/// The estimate a job's history asks for: its highest observed peak plus
/// 10%, when that is more than the estimate it came with. Observed peaks
/// are lower bounds (sampled at decisions), so for a job that declared or
/// estimated its memory history only ever raises. A job that declared
/// nothing (`first`) has nothing better than its history.
pub fn history_estimate(
    state: &NodeState,
    signature: Option<&str>,
    estimate_mib: Option<u64>,
    first: bool,
) -> Option<u64> {
    let peak = *state.history.get(signature?)?;
    let wanted = peak.saturating_add(peak / 10);
    (first || estimate_mib.is_some_and(|e| wanted > e)).then_some(wanted)
}

/// Live free memory minus promised memory.
pub fn effective_free_mib(gpu: &GpuReading, state: &NodeState, owners: &HashMap<u32, u32>) -> u64 {
    gpu.free_mib().saturating_sub(promised_mib(gpu, state, owners))
}

/// [`effective_free_mib`] over the reservations naming the GPU.
fn effective_free_on(gpu: &GpuReading, on: &[&Reservation], owners: &HashMap<u32, u32>) -> u64 {
    gpu.free_mib().saturating_sub(promised_on(gpu, on, owners))
}

/// The GPU memory shared jobs could still be promised on this node, in
/// GiB: each GPU a shared job may use (not held whole by Slurm or by an
/// exclusive job, its activity within the cap) offers its effective free
/// memory, rounded down to whole GiB. It is the node's admission count
/// (docs/admission.md; slurmctld takes its allocations off it again); a job
/// asks for its size plus headroom, so the headroom is not taken off here.
/// One GPU's free memory may still be too little for a job the sum admits.
pub fn admissible_gib(gpus: &[GpuReading], state: &NodeState, owners: &HashMap<u32, u32>, p: &Params) -> u64 {
    gpus.iter()
        .zip(by_gpu(gpus, state))
        .filter(|(g, on)| {
            let held = on.iter().any(|r| r.holding == Holding::SlurmWhole || r.exclusive);
            !held && expected_activity_on(g, on, p).0 <= p.cap()
        })
        .map(|(g, on)| effective_free_on(g, &on, owners) / 1024)
        .sum()
}

/// Why `gpu` cannot take the demand, or `None` if it can.
fn reject(
    gpu: &GpuReading,
    on: &[&Reservation],
    owners: &HashMap<u32, u32>,
    need_whole: bool,
    est: u64,
    demand: &Demand,
    p: &Params,
) -> Option<Reject> {
    let mps_uid = demand.mps_uid;
    let mut first = None;
    for r in on {
        if r.holding == Holding::SlurmWhole {
            return Some(Reject::SlurmWhole(r.job));
        }
        if r.exclusive {
            return Some(Reject::Exclusive(r.job));
        }
        first.get_or_insert(r.job);
    }
    if need_whole {
        if let Some(job) = first {
            return Some(Reject::NotIdleJob(job));
        }
        if !gpu.processes.is_empty() {
            return Some(Reject::NotIdleProcesses { count: gpu.processes.len(), used_mib: gpu.used_mib });
        }
        return None;
    }
    if let Some(me) = mps_uid {
        // The server running now, or one a placed MPS job will start.
        let other = gpu.mps_uid.filter(|u| *u != me).or_else(|| on.iter().find_map(|r| r.mps_uid.filter(|u| *u != me)));
        if let Some(uid) = other {
            return Some(Reject::MpsUser(uid));
        }
    }
    let (value, recent) = expected_activity_on(gpu, on, p);
    if value > p.cap() {
        return Some(Reject::Activity { metric: p.metric, value, cap: p.cap(), recent });
    }
    let free = effective_free_on(gpu, on, owners);
    if free < est.saturating_add(p.headroom_mib) {
        return Some(Reject::Memory { free_mib: free, estimate_mib: est, headroom_mib: p.headroom_mib });
    }
    let guess = predicted_with(on, demand.profile, p);
    if let Some((predicted, bound)) = guess.over {
        return Some(Reject::Slowdown { predicted, bound, jobs: guess.jobs, unknown: guess.unknown });
    }
    None
}

/// Chooses `demand.count` distinct GPUs, or says why it cannot. May move
/// the round-robin cursor in `state`.
pub fn choose(
    gpus: &[GpuReading],
    state: &mut NodeState,
    demand: &Demand,
    params: &Params,
    owners: &HashMap<u32, u32>,
) -> Result<Choice, NoFit> {
    let on = by_gpu(gpus, state);
    let (need_whole, est, reasons) = assess_on(gpus, &on, demand, params, owners);
    // Each eligible GPU: its effective free memory, expected activity,
    // the worst predicted slowdown with the job, and whether it is idle.
    let mut ok: Vec<Eligible> = gpus
        .iter()
        .zip(&on)
        .zip(&reasons)
        .filter(|(_, (_, why))| why.is_none())
        .map(|((g, on), _)| Eligible {
            gpu: g,
            free: effective_free_on(g, on, owners),
            activity: expected_activity_on(g, on, params).0,
            slowdown: if need_whole { 1.0 } else { predicted_with(on, demand.profile, params).worst },
            // No job, no process, and no load the readings show (a process
            // NVML does not list, such as another container's).
            idle: on.is_empty() && job_processes(g).next().is_none() && g.busy < IDLE_BUSY,
        })
        .collect();
    let want = demand.count as usize;
    if ok.len() < want || want == 0 {
        return Err(NoFit { wanted: demand.count, reasons });
    }
    // Stable sorts keep ties in GPU-index order, so decisions are repeatable.
    ok.sort_by_key(|e| e.gpu.index);
    match if need_whole { Policy::FirstFit } else { demand.policy } {
        Policy::Exclusive | Policy::FirstFit => {}
        Policy::Magm => ok.sort_by_key(|e| std::cmp::Reverse(e.free)),
        Policy::BestFit => ok.sort_by_key(|e| e.free),
        // The least loaded GPU as the jobs' profiles predict it, not as a
        // reading says: a time-sliced GPU reads lower the more crowded it is.
        Policy::LeastUtilized => ok.sort_by(|a, b| {
            a.slowdown.total_cmp(&b.slowdown).then(a.activity.total_cmp(&b.activity)).then(b.free.cmp(&a.free))
        }),
        Policy::RoundRobin => {
            let cursor = state.rr_cursor;
            ok.sort_by_key(|e| (e.gpu.index < cursor, e.gpu.index));
        }
    }
    // An idle GPU first, under every policy that shares: a job never runs
    // beside another while a GPU it could have waits idle.
    if params.idle_first && !need_whole {
        ok.sort_by_key(|e| !e.idle);
    }
    ok.truncate(want);
    if demand.policy == Policy::RoundRobin {
        state.rr_cursor = ok.iter().map(|e| e.gpu.index).max().unwrap_or(0) + 1;
        if gpus.iter().all(|g| g.index < state.rr_cursor) {
            state.rr_cursor = 0;
        }
    }
    let smallest = gpus.iter().map(|g| g.total_mib).min().unwrap_or(0);
    let reserve_mib = if need_whole { smallest.max(est) } else { est };
    Ok(Choice {
        gpus: ok.iter().map(|e| e.gpu.index).collect(),
        exclusive: need_whole,
        reserve_mib,
        free_mib: ok.iter().map(|e| e.free).collect(),
        activity: ok.iter().map(|e| e.activity).collect(),
        slowdown: ok.iter().map(|e| e.slowdown).collect(),
    })
}

/// Below this busy share a GPU with no job and no process counts as idle
/// (a reading of an idle GPU is 0; the stand-in's and NVML's noise stays
/// far below this).
const IDLE_BUSY: f64 = 0.05;

/// A GPU that can take the demand, with what the policies rank it by.
struct Eligible<'a> {
    gpu: &'a GpuReading,
    free: u64,
    activity: f64,
    slowdown: f64,
    idle: bool,
}

/// Each GPU against the demand: whether the job needs whole GPUs, the
/// per-GPU memory it needs, and why each GPU cannot take it (`None`: it
/// can). What `choose` decides from, and what `carma place --dry-run` shows.
pub fn assess(
    gpus: &[GpuReading],
    state: &NodeState,
    demand: &Demand,
    params: &Params,
    owners: &HashMap<u32, u32>,
) -> (bool, u64, Vec<(u32, Option<Reject>)>) {
    assess_on(gpus, &by_gpu(gpus, state), demand, params, owners)
}

/// [`assess`] with each GPU's reservations ([`by_gpu`]).
fn assess_on(
    gpus: &[GpuReading],
    on: &[Vec<&Reservation>],
    demand: &Demand,
    params: &Params,
    owners: &HashMap<u32, u32>,
) -> (bool, u64, Vec<(u32, Option<Reject>)>) {
    let smallest = gpus.iter().map(|g| g.total_mib).min().unwrap_or(0);
    // No job needs more than a GPU holds: an absurd estimate (an OOM
    // message's "inf", a forged history) asks for a whole GPU, and the sums
    // of estimates below stay far from overflowing.
    let largest = gpus.iter().map(|g| g.total_mib).max().unwrap_or(0);
    let estimate = demand.estimate_mib.map(|e| e.min(largest));
    let need_whole = match estimate {
        None => true,
        Some(est) => demand.policy == Policy::Exclusive || est.saturating_add(params.headroom_mib) > smallest,
    };
    let est = estimate.unwrap_or(smallest);
    let reasons =
        gpus.iter().zip(on).map(|(g, on)| (g.index, reject(g, on, owners, need_whole, est, demand, params))).collect();
    (need_whole, est, reasons)
}

mod profiles;
use profiles::job_processes;
pub use profiles::learn_profiles;

#[cfg(test)]
mod guard_tests;
#[cfg(test)]
mod tests;
