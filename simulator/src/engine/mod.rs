//! The event loop. Jobs wait in a FIFO queue (head-of-line, like CARMA's;
//! the recovery queue goes first). Each job goes the plugin's way: its
//! facts are resolved into a request (`carma_placement::resolve`), and each
//! node, read through a `GpuSource`, decides it (`carma_placement::decide`:
//! reuse, the node's learned fixed part, the job's history, the
//! preconditions and policy, MPS's one user per GPU).
//! Between events every quantity is linear in time, so the integrals
//! (SM activity, memory, energy) are exact.

mod config;
mod events;
mod node;
mod outcome;
mod placing;
mod request;
mod run;
mod share;
mod slurmctld;
mod window;

use crate::input::{TraceJob, Workload};
use carma_config::{Config, RecoveryMode};
use carma_placement::state::NodeState;
use node::Run;
use slurmctld::SlurmAlloc;
use std::collections::{HashMap, VecDeque};

pub use crate::model::{Assumptions, PowerProfile, Sharing};
pub use config::{Admission, Cluster, Estimator, SimConfig};
pub use outcome::{JobResult, Outcome, Sample, mean, percentile};

const EPS: f64 = 1e-6;

pub fn simulate(trace: &[TraceJob], workloads: &HashMap<String, Workload>, cfg: &SimConfig) -> Result<Outcome, String> {
    let mut sim = Sim::new(trace, workloads, cfg)?;
    loop {
        sim.arrivals();
        sim.index_runs_by_node();
        sim.record_readings();
        sim.learn_profiles();
        sim.retry_on_node()?;
        // Readings and the plugin's count of recent placements change with
        // time under a window: the head may fit at any event.
        sim.dirty |= cfg.assumptions.window_s > 0.0;
        // A monitor that sets its node's count may let the head in.
        sim.dirty |= sim.set_counts();
        // A backfill pass tries every job behind a head that waits.
        sim.dirty |= sim.next_backfill().is_some() && sim.backfill_now();
        sim.place_queue_heads()?;
        // Who runs where changed now, not at the next event.
        sim.record_readings();
        if sim.runs.is_empty()
            && sim.next_arrival == trace.len()
            && sim.away.is_empty()
            && sim.on_node.is_empty()
            && (sim.queue.is_empty() && sim.recovery.is_empty() || sim.readings_settled())
            && !sim.backfill_pass_ahead()
        {
            sim.reject_waiting();
            break;
        }
        let pace = sim.pace();
        let (t_next, oom) = sim.next_event(&pace);
        sim.advance(&pace, t_next);
        if let Some((when, victim)) = oom
            && (when - sim.t).abs() < EPS
        {
            sim.crash(victim);
        }
        sim.finish_completed();
    }
    Ok(sim.outcome())
}

/// A simulation under way.
struct Sim<'a> {
    trace: &'a [TraceJob],
    cfg: &'a SimConfig,
    /// Each trace job's workload.
    wl: Vec<&'a Workload>,
    /// carma.yaml as the simulated cluster's admin wrote it.
    resolve_cfg: Config,
    results: Vec<JobResult>,
    states: Vec<NodeState>,
    slurm: SlurmAlloc,
    /// Each node's admission count as its monitor last set it, and when it
    /// sets it next (`Assumptions::count_interval_s`).
    counts: Vec<(f64, u32)>,
    /// When a run last ended (what the counts set since have seen).
    last_end: f64,
    /// The nodes that handed each job back.
    excluded: Vec<Vec<usize>>,
    /// Each job's pauses out of hand-backs so far (each twice the last).
    pauses: Vec<u32>,
    runs: Vec<Run>,
    /// Indices into `runs` of each node's runs.
    by_node: Vec<Vec<usize>>,
    queue: VecDeque<usize>,
    recovery: VecDeque<usize>,
    /// Jobs handed back: the time slurmctld can place each again, the job,
    /// and whether it goes back to the recovery queue.
    away: Vec<(f64, usize, bool)>,
    /// Jobs waiting on the node slurmctld sent them to for a GPU.
    on_node: Vec<placing::OnNode>,
    /// The GPUs' readings over time, where readings are window means.
    windowed: window::Windowed,
    next_arrival: usize,
    next_pid: u32,
    t0: f64,
    t: f64,
    /// Whether the queue head may fit now. Between events, effective free
    /// memory only shrinks (ramps) and SM activity is constant, so a blocked
    /// head is retried only after something ends or a new head arrives
    /// (under backfill, also when any job arrives: it may fit behind it).
    dirty: bool,
    /// Integrals over time, per GPU (node-major), and energy.
    sm_int: Vec<f64>,
    mem_int: Vec<f64>,
    energy: f64,
    max_jobs: Vec<u32>,
    ooms: u32,
    recoveries: u32,
    history_raised: u32,
    learned_raised: u32,
    unprofiled: u32,
    handed_back: u32,
    paused: u32,
    timeline: Vec<Sample>,
    next_sample: f64,
}

impl<'a> Sim<'a> {
    fn new(
        trace: &'a [TraceJob],
        workloads: &'a HashMap<String, Workload>,
        cfg: &'a SimConfig,
    ) -> Result<Self, String> {
        let cl = cfg.cluster;
        let wl: Vec<&Workload> = trace
            .iter()
            .map(|j| {
                workloads
                    .get(&j.workload)
                    .ok_or_else(|| format!("trace job {}: unknown workload '{}'", j.seq, j.workload))
            })
            .collect::<Result<_, _>>()?;
        let results = trace
            .iter()
            .zip(&wl)
            .map(|(j, w)| JobResult {
                seq: j.seq,
                workload: j.workload.clone(),
                submit_s: j.submit_s,
                start_s: None,
                end_s: None,
                ooms: 0,
                rejected: false,
                failed_no_fit: false,
                wrong_node: false,
                placed: None,
                run_s: None,
                solo_s: w.solo_s.max(1.0),
                unprofiled: false,
            })
            .collect();
        // The defaults, the sharing mode, recovery on a GPU of its own. No
        // model of which GPU slurmctld picks: CARMA's policy picks (see
        // `request::plan`).
        let resolve_cfg = Config {
            sharing: cfg.assumptions.sharing,
            recovery_mode: RecoveryMode::Exclusive,
            gpu_owner: carma_config::GpuOwner::Carma,
            ..Config::default()
        };
        let ngpu = cl.gpus();
        let t0 = trace.first().map_or(0.0, |j| j.submit_s);
        Ok(Sim {
            trace,
            cfg,
            wl,
            resolve_cfg,
            results,
            states: (0..cl.nodes).map(|_| NodeState::default()).collect(),
            slurm: SlurmAlloc::new(cl),
            counts: vec![(f64::NEG_INFINITY, 0); cl.nodes as usize],
            last_end: f64::NEG_INFINITY,
            excluded: vec![Vec::new(); trace.len()],
            pauses: vec![0; trace.len()],
            runs: Vec::new(),
            by_node: vec![Vec::new(); cl.nodes as usize],
            queue: VecDeque::new(),
            recovery: VecDeque::new(),
            away: Vec::new(),
            on_node: Vec::new(),
            windowed: window::Windowed::new(ngpu),
            next_arrival: 0,
            next_pid: 1,
            t0,
            t: t0,
            dirty: true,
            sm_int: vec![0.0; ngpu],
            mem_int: vec![0.0; ngpu],
            energy: 0.0,
            max_jobs: vec![0; ngpu],
            ooms: 0,
            recoveries: 0,
            history_raised: 0,
            learned_raised: 0,
            unprofiled: 0,
            handed_back: 0,
            paused: 0,
            timeline: Vec::new(),
            // Samples fall every sample_s from the first submission (t0).
            next_sample: t0,
        })
    }

    /// Queues the jobs submitted by now, and those handed back whose time
    /// away is over (in submit order: a requeued job keeps its priority;
    /// or last, `requeue_to_back`).
    fn arrivals(&mut self) {
        let t = self.t;
        let back: Vec<(usize, bool)> = self.away.iter().filter(|a| a.0 <= t + EPS).map(|a| (a.1, a.2)).collect();
        self.away.retain(|a| a.0 > t + EPS);
        for (job, recovering) in back {
            let last = self.cfg.assumptions.requeue_to_back && !recovering;
            let q = if recovering { &mut self.recovery } else { &mut self.queue };
            let at = if last { q.len() } else { q.iter().position(|&o| o > job).unwrap_or(q.len()) };
            q.insert(at, job);
            self.dirty = true;
        }
        while self.next_arrival < self.trace.len() && self.trace[self.next_arrival].submit_s <= self.t + EPS {
            // (Under backfill a new job may start behind a blocked head.)
            self.dirty |= (self.queue.is_empty() && self.recovery.is_empty()) || self.backfill_now();
            self.queue.push_back(self.next_arrival);
            self.next_arrival += 1;
        }
    }

    /// Whether jobs behind a queue head that waits may be tried now: under
    /// backfill, at every event, or at its passes (every
    /// `backfill_interval_s` from the first submission).
    fn backfill_now(&self) -> bool {
        let a = &self.cfg.assumptions;
        if !a.backfill || a.backfill_interval_s <= 0.0 {
            return a.backfill;
        }
        let k = ((self.t - self.t0) / a.backfill_interval_s).round();
        (self.t - self.t0 - k * a.backfill_interval_s).abs() < EPS
    }

    /// Whether a periodic backfill pass is still to come for jobs behind
    /// the queue head (none tried them since the last run ended).
    fn backfill_pass_ahead(&self) -> bool {
        self.next_backfill().is_some() && !self.backfill_now() && self.jobs_behind_head()
    }

    /// Whether a job waits behind the queue head (the recovery queue's
    /// first).
    fn jobs_behind_head(&self) -> bool {
        self.queue.len() + self.recovery.len() > 1
    }

    /// The next backfill pass after now, where passes are periodic.
    fn next_backfill(&self) -> Option<f64> {
        let a = &self.cfg.assumptions;
        (a.backfill && a.backfill_interval_s > 0.0).then(|| {
            let k = ((self.t - self.t0 + EPS) / a.backfill_interval_s).floor() + 1.0;
            self.t0 + k * a.backfill_interval_s
        })
    }

    /// Each GPU's instantaneous readings from now on, for the window means.
    fn record_readings(&mut self) {
        let (cl, a) = (self.cfg.cluster, &self.cfg.assumptions);
        if a.window_s <= 0.0 {
            return;
        }
        for node in 0..cl.nodes as usize {
            let now = node::NodeView {
                cluster: cl,
                node,
                runs: &self.runs,
                on_node: &self.by_node[node],
                t: self.t,
                assumptions: a,
                window: &self.windowed,
            }
            .instant();
            for (g, (sm, busy)) in (0..cl.gpus_per_node).zip(now) {
                self.windowed.record(cl.slot(node, g), self.t, sm, busy, a.window_s + a.publish_s);
            }
        }
    }

    /// What each node's carma-monitor does every interval (here: at every
    /// event, when something may have changed): profiles of jobs alone on
    /// their GPUs are learned from what the GPUs read, whether or not a
    /// job is being placed.
    fn learn_profiles(&mut self) {
        let cl = self.cfg.cluster;
        let params = node::deciding_params(self.cfg, self.t);
        for node in (0..cl.nodes as usize).filter(|&n| !self.by_node[n].is_empty()) {
            let (readings, owners) = self.read_node(node);
            carma_placement::policy::learn_profiles(&mut self.states[node], &readings, &owners, &params);
        }
    }

    /// What `node`'s GPUs read now, and whose each process is (a run's pid
    /// is its own holder).
    fn read_node(&self, node: usize) -> (Vec<carma_placement::GpuReading>, HashMap<u32, u32>) {
        let on_node = &self.by_node[node];
        let owners: HashMap<u32, u32> = on_node.iter().map(|&i| (self.runs[i].pid, self.runs[i].pid)).collect();
        let readings = node::NodeView {
            cluster: self.cfg.cluster,
            node,
            runs: &self.runs,
            on_node,
            t: self.t,
            assumptions: &self.cfg.assumptions,
            window: &self.windowed,
        }
        .read_now();
        (readings, owners)
    }

    /// Whether the readings can change no more with nothing running: at
    /// once without a window, else once its means have passed every run.
    fn readings_settled(&self) -> bool {
        let a = &self.cfg.assumptions;
        let means = a.window_s <= 0.0 || self.windowed.idle_through(self.t, a.window_s + a.publish_s.max(0.0));
        // And every node's count set since the last run ended (under
        // node-memory admission, where monitors set them).
        let counted = a.count_interval_s <= 0.0
            || !matches!(self.cfg.admission, Admission::NodeMemory { .. })
            || self.counts.iter().all(|&(due, _)| due - a.count_interval_s >= self.last_end);
        means && counted
    }

    fn index_runs_by_node(&mut self) {
        for v in &mut self.by_node {
            v.clear();
        }
        for (i, r) in self.runs.iter().enumerate() {
            self.by_node[r.node].push(i);
        }
    }

    /// Nothing runs and nothing is to come: whatever still waits can never
    /// start (nothing will free up).
    fn reject_waiting(&mut self) {
        for &j in self.queue.iter().chain(self.recovery.iter()) {
            self.results[j].rejected = true;
        }
    }

    fn outcome(self) -> Outcome {
        let makespan = self.results.iter().filter_map(|j| j.end_s).fold(self.t0, f64::max) - self.t0;
        let span = makespan.max(EPS);
        Outcome {
            policy: self.cfg.policy,
            makespan_s: makespan,
            jobs: self.results,
            gpu_sm: self.sm_int.iter().map(|v| v / span).collect(),
            gpu_mem_mib: self.mem_int.iter().map(|v| v / span).collect(),
            energy_j: self.energy,
            max_jobs_per_gpu: self.max_jobs,
            ooms: self.ooms,
            recoveries: self.recoveries,
            history_raised: self.history_raised,
            learned_raised: self.learned_raised,
            unprofiled: self.unprofiled,
            handed_back: self.handed_back,
            paused: self.paused,
            timeline: self.timeline,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use carma_config::{GpuOwner, Policy};
    use carma_placement::Params;

    /// A job back from a requeue keeps its submission's place in the
    /// queue, or (priority/basic's release) goes behind every job queued.
    #[test]
    fn a_job_back_from_a_requeue_keeps_its_place_or_goes_last() {
        let w = Workload {
            name: "w".into(),
            gpus: 1,
            solo_s: 10.0,
            peak_mib: 1024,
            estimates: HashMap::new(),
            sm: 0.1,
            busy: 0.1,
            model_file: None,
            batch_size: None,
            seq_len: None,
        };
        let workloads: HashMap<String, Workload> = [("w".to_string(), w)].into();
        let trace: Vec<TraceJob> =
            (0..3).map(|seq| TraceJob { seq, submit_s: f64::from(seq), workload: "w".into() }).collect();
        let order = |requeue_to_back: bool| {
            let cfg = SimConfig {
                cluster: Cluster { nodes: 1, gpus_per_node: 1, mem_mib: 40 * 1024 },
                policy: Policy::Magm,
                estimator: Estimator::Oracle,
                params: Params::default(),
                assumptions: Assumptions { requeue_to_back, ..Assumptions::default() },
                admission: Admission::Anywhere,
                gpu_owner: GpuOwner::Carma,
                least_loaded: false,
            };
            let mut sim = Sim::new(&trace, &workloads, &cfg).unwrap();
            sim.t = 2.0;
            sim.away.push((2.0, 0, false));
            sim.queue.extend([1, 2]);
            sim.next_arrival = 3;
            sim.arrivals();
            sim.queue.iter().copied().collect::<Vec<_>>()
        };
        assert_eq!(order(false), [0, 1, 2]);
        assert_eq!(order(true), [1, 2, 0]);
    }
}
