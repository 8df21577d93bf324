//! The event loop. Jobs wait in a FIFO queue (head-of-line, like CARMA's;
//! the recovery queue goes first). Each job goes the plugin's way: its
//! facts are resolved into a request (`carma_placement::resolve`), and each
//! node, read through a `GpuSource`, decides it (`carma_placement::decide`:
//! reuse, the node's learned fixed part, the job's history, the
//! preconditions and policy, MPS's one user per GPU).
//! Between events every quantity is linear in time, so the integrals
//! (SM activity, memory, energy) are exact.

use crate::input::{TraceJob, Workload};
use carma_config::{Config, GpuOwner, JobRequest, Policy, RecoveryMode};
use carma_placement::jobfiles::Recovery;
use carma_placement::policy::observe;
use carma_placement::resolve::{self, NodeFacts, Resolution, StepFacts};
use carma_placement::state::NodeState;
use carma_placement::{GpuProcess, GpuReading, GpuSource, Params, SourceError, StepRef};
use std::collections::{HashMap, VecDeque};

pub use crate::model::{Assumptions, PowerProfile, Sharing};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cluster {
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub mem_mib: u64,
}

impl Cluster {
    /// `NxGxMEM` (`1x4x40G`), `NxG` (40 GiB GPUs) or `G` (one node).
    pub fn parse(s: &str) -> Result<Cluster, String> {
        let parts: Vec<&str> = s.split('x').collect();
        let int = |p: &str| {
            p.parse::<u32>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("cluster '{s}': '{p}' is not a positive number"))
        };
        let (nodes, gpus, mem) = match parts.as_slice() {
            [g] => (1, int(g)?, 40960),
            [n, g] => (int(n)?, int(g)?, 40960),
            [n, g, m] => {
                (int(n)?, int(g)?, carma_config::parse_size_mib(m).map_err(|e| format!("cluster '{s}': {e}"))?)
            }
            _ => return Err(format!("cluster '{s}': write NODESxGPUSxMEM, e.g. 1x4x40G")),
        };
        Ok(Cluster { nodes, gpus_per_node: gpus, mem_mib: mem })
    }

    pub fn gpus(&self) -> usize {
        (self.nodes * self.gpus_per_node) as usize
    }
}

/// Where a job's memory estimate comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Estimator {
    /// The measured peak: a perfect estimator.
    Oracle,
    /// A column `<name>_estimate_mib` of the workload table. The paper uses
    /// 40000 for "failed or capped": such jobs get whole GPUs.
    Column(String),
    /// Estimates made elsewhere, by workload (`carma simulate --estimator
    /// carma` runs carma-estimator on each workload's model file, as
    /// srun/sbatch would); `None` = no estimate, so whole GPUs.
    Given(HashMap<String, Option<u64>>),
}

/// Which node (and GPU) slurmctld sends a job to before CARMA decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Admission {
    /// CARMA's decision on every node, the first that fits: a cluster-wide
    /// CARMA no Slurm has (what the simulator did before #30).
    #[default]
    Anywhere,
    /// Today's slurmctld: each GPU offers `per_gpu` shards, a job asks one
    /// per GPU, and goes to the first node with that many GPUs holding a
    /// free shard; CARMA then decides on that node only.
    Shards { per_gpu: u32, hand_back: u32 },
    /// Shards as memory: each GPU offers its memory in GiB; a job asks its
    /// estimate plus headroom in GiB (a whole GPU's worth when unknown) on
    /// each GPU, and slurmctld picks the node and the GPUs (the first that
    /// have them free); CARMA checks its preconditions on those GPUs.
    MemoryShards { hand_back: u32 },
    /// Shards as memory, and each node's carma-monitor withdraws the shards
    /// of a GPU over the activity cap from slurmctld (gives them back when it
    /// falls under): Slurm sees both of CARMA's preconditions.
    Informed,
    /// What Slurm can be told at run time: a node-level memory count (a
    /// GRES without device files, `carmamem`, in GiB), which each node's
    /// carma-monitor sets to the memory of its GPUs under the activity cap;
    /// a job asks its estimate plus headroom per GPU. slurmctld picks the
    /// node, CARMA the GPUs (its policy, granting their devices itself); a
    /// node where no GPU fits after all hands the job back.
    NodeMemory { hand_back: u32 },
}

/// With `hand_back` 0 a job CARMA cannot place where Slurm sent it fails
/// (after `timeouts.wait`, as on a real node). Otherwise the node hands it
/// back: requeued with that node excluded (the exclusion stays with the
/// job), at most `hand_back` times; the next refusal fails it.
const HAND_BACK: u32 = 3;

impl Admission {
    pub fn parse(s: &str) -> Result<Admission, String> {
        match s {
            "anywhere" => Ok(Admission::Anywhere),
            "shards" => Ok(Admission::Shards { per_gpu: 8, hand_back: 0 }),
            "shards+handback" => Ok(Admission::Shards { per_gpu: 8, hand_back: HAND_BACK }),
            "memory-shards" => Ok(Admission::MemoryShards { hand_back: 0 }),
            "memory-shards+handback" => Ok(Admission::MemoryShards { hand_back: HAND_BACK }),
            "informed" => Ok(Admission::Informed),
            "node-memory" => Ok(Admission::NodeMemory { hand_back: HAND_BACK }),
            _ => Err(format!(
                "admission '{s}': expected anywhere, shards, shards+handback, memory-shards, memory-shards+handback, informed or node-memory"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Admission::Anywhere => "anywhere",
            Admission::Shards { hand_back: 0, .. } => "shards",
            Admission::Shards { .. } => "shards+handback",
            Admission::MemoryShards { hand_back: 0 } => "memory-shards",
            Admission::MemoryShards { .. } => "memory-shards+handback",
            Admission::Informed => "informed",
            Admission::NodeMemory { .. } => "node-memory",
        }
    }

    fn hand_back(self) -> u32 {
        match self {
            Admission::Anywhere | Admission::Informed => 0,
            Admission::Shards { hand_back, .. }
            | Admission::MemoryShards { hand_back }
            | Admission::NodeMemory { hand_back } => hand_back,
        }
    }
}

#[derive(Debug, Clone)]
pub struct SimConfig {
    pub cluster: Cluster,
    pub policy: Policy,
    pub estimator: Estimator,
    pub params: Params,
    pub assumptions: Assumptions,
    pub admission: Admission,
    /// Whose choice of GPU stands where slurmctld allocates shards
    /// (carma.yaml `gpu_owner`): `Slurm` keeps CARMA to the GPUs of the
    /// job's shards (the first GPUs with one free); `Carma` lets its policy
    /// pick any GPU of the node. Shards sized in memory are Slurm's choice
    /// either way; `anywhere` is CARMA's.
    pub gpu_owner: GpuOwner,
    /// slurm.conf `SelectTypeParameters=...,LL_SHARED_GRES` (Slurm 23.11
    /// and later): slurmctld takes shards from the GPU with the fewest
    /// allocated, not from the first with one free.
    pub least_loaded: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct JobResult {
    pub seq: u32,
    pub workload: String,
    pub submit_s: f64,
    pub start_s: Option<f64>,
    pub end_s: Option<f64>,
    pub ooms: u32,
    /// Never placeable (more GPUs than a node has).
    pub rejected: bool,
    /// Sent by slurmctld to a node where CARMA could not place it: failed.
    pub failed_no_fit: bool,
    /// ... while another node could have placed it.
    pub wrong_node: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub t: f64,
    pub sm: Vec<f64>,
    pub mem_mib: Vec<f64>,
}

#[derive(Debug, Clone)]
pub struct Outcome {
    pub policy: Policy,
    pub makespan_s: f64,
    pub jobs: Vec<JobResult>,
    /// Time-averaged over the makespan, per GPU (node-major).
    pub gpu_sm: Vec<f64>,
    pub gpu_mem_mib: Vec<f64>,
    pub energy_j: f64,
    /// Most jobs that ever ran at once on each GPU.
    pub max_jobs_per_gpu: Vec<u32>,
    pub ooms: u32,
    pub recoveries: u32,
    /// Placements whose estimate the node's history of the job raised.
    pub history_raised: u32,
    /// Placements whose estimate the node's learned fixed part raised.
    pub learned_raised: u32,
    /// Times a node handed a job back to slurmctld (it could not place it).
    pub handed_back: u32,
    pub timeline: Vec<Sample>,
}

impl Outcome {
    fn finished(&self) -> impl Iterator<Item = &JobResult> {
        self.jobs.iter().filter(|j| j.end_s.is_some())
    }

    pub fn jct(&self) -> Vec<f64> {
        self.finished().map(|j| j.end_s.unwrap_or(0.0) - j.submit_s).collect()
    }

    pub fn waits(&self) -> Vec<f64> {
        self.jobs.iter().filter_map(|j| j.start_s.map(|s| s - j.submit_s)).collect()
    }

    pub fn mean_sm(&self) -> f64 {
        mean(&self.gpu_sm)
    }
}

pub fn mean(v: &[f64]) -> f64 {
    if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 }
}

/// Nearest-rank percentile of unsorted values.
pub fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[((p * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1]
}

struct Run {
    job: usize,
    pid: u32,
    node: usize,
    gpus: Vec<u32>,
    /// Shards slurmctld allocated on each of `slurm_gpus`.
    shards: u32,
    slurm_gpus: Vec<u32>,
    /// The node-level memory count slurmctld allocated (node-memory).
    node_gib: u32,
    start: f64,
    peak: f64,
    /// Solo readings: share of time a kernel runs, SM activity.
    busy: f64,
    sm: f64,
    solo_s: f64,
    progress: f64,
}

impl Run {
    fn alloc(&self, t: f64, ramp: f64) -> f64 {
        if ramp <= 0.0 { self.peak } else { self.peak * ((t - self.start) / ramp).clamp(0.0, 1.0) }
    }
}

/// One simulated node seen through CARMA's GPU-source trait.
struct NodeView<'a> {
    cluster: Cluster,
    runs: &'a [Run],
    /// Indices into `runs` of this node's runs.
    on_node: &'a [usize],
    t: f64,
    assumptions: &'a Assumptions,
}

impl NodeView<'_> {
    fn read_now(&self) -> Vec<GpuReading> {
        (0..self.cluster.gpus_per_node)
            .map(|index| {
                let mut used = 0.0;
                let mut processes = Vec::new();
                let mut solo = Vec::new();
                for r in self.on_node.iter().map(|&i| &self.runs[i]).filter(|r| r.gpus.contains(&index)) {
                    let a = r.alloc(self.t, self.assumptions.ramp_s);
                    used += a;
                    solo.push((r.busy, r.sm));
                    processes.push(GpuProcess { pid: r.pid, used_mib: a.ceil() as u64 });
                }
                // What a monitor reads: each job's SM work at its slowed
                // pace, and the share of time any kernel runs (the GPU is
                // busy whenever one of its jobs would be).
                let sm = solo.iter().map(|j| j.1).sum::<f64>() / self.assumptions.slowdown(&solo);
                let busy = solo.iter().map(|j| j.0).sum::<f64>();
                GpuReading {
                    index,
                    uuid: String::new(),
                    minor: None,
                    total_mib: self.cluster.mem_mib,
                    used_mib: used.ceil() as u64,
                    sm_activity: sm.min(1.0),
                    busy: busy.min(1.0),
                    processes,
                    power_w: None,
                    mps_uid: None,
                    sm_occupancy: None,
                }
            })
            .collect()
    }
}

impl GpuSource for NodeView<'_> {
    fn read(&mut self) -> Result<Vec<GpuReading>, SourceError> {
        Ok(self.read_now())
    }

    fn name(&self) -> &'static str {
        "trace"
    }
}

const EPS: f64 = 1e-6;

/// What slurmctld has allocated: shards on each GPU (node-major) and the
/// node-level memory count, taken when a run starts and given back when it
/// ends.
struct SlurmAlloc {
    shards: Vec<u32>,
    node_gib: Vec<u32>,
    gpus_per_node: u32,
}

impl SlurmAlloc {
    fn new(cl: Cluster) -> SlurmAlloc {
        SlurmAlloc { shards: vec![0; cl.gpus()], node_gib: vec![0; cl.nodes as usize], gpus_per_node: cl.gpus_per_node }
    }

    fn shards(&self, node: usize, g: u32) -> u32 {
        self.shards[node * self.gpus_per_node as usize + g as usize]
    }

    fn take(&mut self, r: &Run) {
        for &g in &r.slurm_gpus {
            self.shards[r.node * self.gpus_per_node as usize + g as usize] += r.shards;
        }
        self.node_gib[r.node] += r.node_gib;
    }

    fn give_back(&mut self, r: &Run) {
        for &g in &r.slurm_gpus {
            self.shards[r.node * self.gpus_per_node as usize + g as usize] -= r.shards;
        }
        self.node_gib[r.node] -= r.node_gib;
    }
}

/// What deciding a job on one node needs besides the node's state.
struct Deciding<'a> {
    cl: Cluster,
    runs: &'a [Run],
    by_node: &'a [Vec<usize>],
    t: f64,
    a: &'a Assumptions,
    cfg: &'a SimConfig,
    learn: &'a carma_config::LearnRuntime,
}

impl Deciding<'_> {
    /// The plugin's decision on `node` (on `only` those GPUs, where Slurm
    /// chose them); `None` when nothing fits.
    fn decide(
        &mut self,
        st: &mut NodeState,
        node: usize,
        only: Option<&[u32]>,
        step: StepRef,
        req: &carma_placement::Request,
    ) -> Result<Option<carma_placement::Decision>, String> {
        let on_node = &self.by_node[node];
        let owners: HashMap<u32, u32> = on_node.iter().map(|&i| (self.runs[i].pid, self.runs[i].pid)).collect();
        let mut readings = NodeView { cluster: self.cl, runs: self.runs, on_node, t: self.t, assumptions: self.a }
            .read()
            .map_err(|e| e.0)?;
        // What the placer does under the lock: sample what placed jobs
        // use, then decide.
        observe(st, &readings, &owners);
        if let Some(only) = only {
            readings.retain(|g| only.contains(&g.index));
        }
        let decided = carma_placement::decide::decide(
            st,
            step,
            req,
            &readings,
            &owners,
            &self.cfg.params,
            self.learn,
            0,
            &mut |_| false,
        );
        Ok(decided.ok())
    }
}

/// Shards a GPU offers where shards count jobs, not memory (gres.conf
/// `Count=8` per GPU; node-memory admission keeps them beside `carmamem`).
const JOB_SHARDS_PER_GPU: u32 = 8;

fn shards_per_gpu(admission: Admission, cl: Cluster) -> u32 {
    match admission {
        Admission::Anywhere => 0,
        Admission::Shards { per_gpu, .. } => per_gpu,
        Admission::MemoryShards { .. } | Admission::Informed | Admission::NodeMemory { .. } => {
            (cl.mem_mib / 1024) as u32
        }
    }
}

/// Shards a job asks for on each GPU: one, or its estimate plus headroom in
/// GiB (a whole GPU's worth when the estimate is unknown or larger).
fn shards_needed(cfg: &SimConfig, cl: Cluster, estimate_mib: Option<u64>) -> u32 {
    let per_gpu = shards_per_gpu(cfg.admission, cl);
    match cfg.admission {
        Admission::Anywhere => 0,
        Admission::Shards { .. } => 1,
        Admission::MemoryShards { .. } | Admission::Informed | Admission::NodeMemory { .. } => estimate_mib
            .map_or(per_gpu, |e| (e + cfg.params.headroom_mib).div_ceil(1024).min(u64::from(per_gpu)) as u32),
    }
}

/// Takes the queue head that was tried (the recovery queue's, if it came
/// from there).
fn pop_head(from_recovery: bool, recovery: &mut VecDeque<usize>, queue: &mut VecDeque<usize>) {
    if from_recovery {
        recovery.pop_front()
    } else {
        queue.pop_front()
    };
}

/// Every simulated job is one user's.
const SIM_UID: u32 = 1000;

/// A queued job's request as the plugin resolves it: the estimator's
/// figure as srun/sbatch would pass it (a model-based one with its fixed
/// part and a signature, so history and the learned fixed part apply; a
/// measured or column figure as declared memory), and a recovering rerun
/// as carma-epilog's marker says.
fn plan(w: &Workload, from_recovery: bool, cfg: &SimConfig, resolve_cfg: &Config) -> Result<resolve::Plan, String> {
    let mut request = JobRequest { policy: Some(cfg.policy), gpus: Some(w.gpus), ..JobRequest::default() };
    let mut estimate = None;
    match &cfg.estimator {
        Estimator::Oracle => request.mem_mib = Some(w.peak_mib),
        Estimator::Column(c) => request.mem_mib = w.estimates.get(c).copied().filter(|&e| e < 40000),
        Estimator::Given(m) => {
            if let Some(mib) = m.get(&w.name).copied().flatten() {
                let runtime = carma_estimator::Settings::default().runtime_mib;
                let signature = carma_config::fnv1a(w.name.as_bytes());
                estimate = Some(carma_config::format_estimate(mib, "layers", signature, Some(runtime.min(mib))));
            }
        }
    }
    let facts = StepFacts { job: 0, uid: SIM_UID, request, estimate, ..StepFacts::default() };
    let node = if from_recovery {
        NodeFacts {
            recovery: Some(Recovery { mode: RecoveryMode::Exclusive, need_mib: Some(w.peak_mib), count: 1 }),
            slurm_gpus: vec![0],
        }
    } else {
        // slurmctld gave every simulated job its shards.
        NodeFacts { slurm_gpus: vec![0], ..NodeFacts::default() }
    };
    match resolve::resolve(&facts, &node, resolve_cfg)? {
        Resolution::Place(plan) => Ok(*plan),
        other => Err(format!("{}: not a CARMA job ({other:?})", w.name)),
    }
}

pub fn simulate(trace: &[TraceJob], workloads: &HashMap<String, Workload>, cfg: &SimConfig) -> Result<Outcome, String> {
    let a = &cfg.assumptions;
    let cl = cfg.cluster;
    let wl: Vec<&Workload> = trace
        .iter()
        .map(|j| {
            workloads.get(&j.workload).ok_or_else(|| format!("trace job {}: unknown workload '{}'", j.seq, j.workload))
        })
        .collect::<Result<_, _>>()?;
    let mut results: Vec<JobResult> = trace
        .iter()
        .map(|j| JobResult {
            seq: j.seq,
            workload: j.workload.clone(),
            submit_s: j.submit_s,
            start_s: None,
            end_s: None,
            ooms: 0,
            rejected: false,
            failed_no_fit: false,
            wrong_node: false,
        })
        .collect();
    let mut states: Vec<NodeState> = (0..cl.nodes).map(|_| NodeState::default()).collect();
    // Shards slurmctld has allocated on each GPU (node-major), and the
    // nodes that handed each job back.
    let mut slurm = SlurmAlloc::new(cl);
    let mut excluded: Vec<Vec<usize>> = vec![Vec::new(); trace.len()];
    // carma.yaml as the simulated cluster's admin wrote it: the defaults,
    // the sharing mode, recovery on a GPU of its own.
    // No model of which GPU slurmctld picks: CARMA's policy picks (see plan).
    let resolve_cfg = Config {
        sharing: a.sharing,
        recovery_mode: RecoveryMode::Exclusive,
        gpu_owner: carma_config::GpuOwner::Carma,
        ..Config::default()
    };
    let mut runs: Vec<Run> = Vec::new();
    let (mut queue, mut recovery) = (VecDeque::new(), VecDeque::new());
    let mut next_arrival = 0;
    let mut next_pid = 1u32;
    let ngpu = cl.gpus();
    let (mut sm_int, mut mem_int) = (vec![0.0; ngpu], vec![0.0; ngpu]);
    let mut max_jobs = vec![0u32; ngpu];
    let (mut energy, mut ooms, mut recoveries) = (0.0, 0u32, 0u32);
    let (mut history_raised, mut learned_raised, mut handed_back) = (0u32, 0u32, 0u32);
    let mut timeline = Vec::new();
    let mut next_sample = 0.0;
    let mut t = trace.first().map_or(0.0, |j| j.submit_s);
    let t0 = t;
    let gpu_slot = |node: usize, g: u32| node * cl.gpus_per_node as usize + g as usize;
    // Whether the queue head may fit now. Between events, effective free
    // memory only shrinks (ramps) and SM activity is constant, so a blocked
    // head is retried only after something ends or a new head arrives.
    let mut dirty = true;
    let mut by_node: Vec<Vec<usize>> = vec![Vec::new(); cl.nodes as usize];

    loop {
        while next_arrival < trace.len() && trace[next_arrival].submit_s <= t + EPS {
            dirty |= queue.is_empty() && recovery.is_empty();
            queue.push_back(next_arrival);
            next_arrival += 1;
        }
        for v in &mut by_node {
            v.clear();
        }
        for (i, r) in runs.iter().enumerate() {
            by_node[r.node].push(i);
        }
        // Place queue heads while they fit (recovery queue first).
        while dirty {
            let from_recovery = !recovery.is_empty();
            let Some(&job) = recovery.front().or(queue.front()) else {
                dirty = false;
                break;
            };
            let w = wl[job];
            if w.gpus > cl.gpus_per_node {
                results[job].rejected = true;
                pop_head(from_recovery, &mut recovery, &mut queue);
                continue;
            }
            let plan = plan(w, from_recovery, cfg, &resolve_cfg)?;
            let step = StepRef { job: next_pid, holder: next_pid };
            let mut ctx =
                Deciding { cl, runs: &runs, by_node: &by_node, t, a, cfg, learn: &resolve_cfg.estimator.learn_runtime };
            let mut placed = None;
            let mut slurm_gpus = Vec::new();
            let need = shards_needed(cfg, cl, plan.request.estimate_mib);
            // Under Slurm's ownership a job of several GPUs on job-count
            // shards asks whole GPUs (`--gres=gpu:N`: Slurm takes one job's
            // shards from one GPU; job_submit.lua keeps such jobs whole).
            // Memory shards assume MULTIPLE_SHARING_GRES_PJ instead.
            let whole = cfg.gpu_owner == GpuOwner::Slurm
                && w.gpus > 1
                && matches!(cfg.admission, Admission::Shards { .. } | Admission::NodeMemory { .. });
            // Shards a GPU offers and the job asks of each of its GPUs (node
            // memory counts GiB per node, beside one job shard per GPU; a
            // whole GPU takes all its shards).
            let node_memory = matches!(cfg.admission, Admission::NodeMemory { .. });
            let gpu_shards = if node_memory { JOB_SHARDS_PER_GPU } else { shards_per_gpu(cfg.admission, cl) };
            let ask = match (whole, node_memory) {
                (true, _) => gpu_shards,
                (false, true) => 1,
                (false, false) => need,
            };
            match cfg.admission {
                Admission::Anywhere => {
                    for (node, st) in states.iter_mut().enumerate() {
                        if let Some(d) = ctx.decide(st, node, None, step, &plan.request)? {
                            placed = Some((node, d));
                            break;
                        }
                    }
                }
                admission => {
                    // slurmctld: the first node with enough GPUs holding
                    // the shards asked for; the job pends while none has.
                    let per_gpu = shards_per_gpu(admission, cl);
                    // The order slurmctld tries a node's GPUs in for shards.
                    let tried = |node: usize| -> Vec<u32> {
                        let mut g: Vec<u32> = (0..cl.gpus_per_node).collect();
                        if cfg.least_loaded {
                            g.sort_by_key(|&g| slurm.shards(node, g));
                        }
                        g
                    };
                    let fits = |node: usize| -> Option<Vec<u32>> {
                        // Informed, node memory: GPUs over the cap offer none.
                        let mut over: Vec<bool> =
                            if matches!(admission, Admission::Informed | Admission::NodeMemory { .. }) {
                                let view =
                                    NodeView { cluster: cl, runs: &runs, on_node: &by_node[node], t, assumptions: a };
                                view.read_now()
                                    .iter()
                                    .map(|g| g.activity(cfg.params.metric) > cfg.params.cap())
                                    .collect()
                            } else {
                                vec![false; cl.gpus_per_node as usize]
                            };
                        if matches!(admission, Admission::NodeMemory { .. }) {
                            let capacity = over.iter().filter(|o| !**o).count() as u32 * per_gpu;
                            let free = capacity.saturating_sub(slurm.node_gib[node]);
                            if free < need * w.gpus {
                                return None;
                            }
                            if cfg.gpu_owner == GpuOwner::Carma {
                                return Some(Vec::new());
                            }
                            // The job's shard of each GPU, whatever its memory
                            // or activity (Slurm sees neither per GPU).
                            over = vec![false; cl.gpus_per_node as usize];
                        }
                        let free: Vec<u32> = tried(node)
                            .into_iter()
                            .filter(|&g| !over[g as usize] && slurm.shards(node, g) + ask <= gpu_shards)
                            .take(w.gpus as usize)
                            .collect();
                        (free.len() == w.gpus as usize).then_some(free)
                    };
                    // Slurm's next choice, past the nodes that handed the job back.
                    let pick = (0..cl.nodes as usize)
                        .filter(|n| !excluded[job].contains(n))
                        .find_map(|n| fits(n).map(|g| (n, g)));
                    if let Some((node, gpus)) = pick {
                        // Shards as memory, or Slurm's choice of GPU
                        // standing: CARMA checks Slurm's GPUs.
                        let only = (matches!(admission, Admission::MemoryShards { .. } | Admission::Informed)
                            || cfg.gpu_owner == GpuOwner::Slurm)
                            .then_some(gpus.as_slice());
                        match ctx.decide(&mut states[node], node, only, step, &plan.request)? {
                            Some(d) => {
                                placed = Some((node, d));
                                slurm_gpus = gpus;
                            }
                            None if (excluded[job].len() as u32) < admission.hand_back() => {
                                // Handed back: requeued, this node excluded;
                                // slurmctld tries again at once.
                                excluded[job].push(node);
                                handed_back += 1;
                                continue;
                            }
                            None => {
                                // CARMA cannot place it where Slurm sent it:
                                // it fails. Could another node have?
                                let elsewhere = (0..cl.nodes as usize).filter(|&n| n != node).any(|n| {
                                    let mut probe = states[n].clone();
                                    ctx.decide(&mut probe, n, None, step, &plan.request).ok().flatten().is_some()
                                });
                                results[job].failed_no_fit = true;
                                results[job].wrong_node = elsewhere;
                                pop_head(from_recovery, &mut recovery, &mut queue);
                                continue;
                            }
                        }
                    }
                }
            }
            let Some((node, choice)) = placed else {
                dirty = false;
                break;
            };
            let node_gib = if matches!(cfg.admission, Admission::NodeMemory { .. }) { need * w.gpus } else { 0 };
            pop_head(from_recovery, &mut recovery, &mut queue);
            let pid = next_pid;
            next_pid += 1;
            history_raised += u32::from(choice.history_mib.is_some());
            learned_raised += u32::from(choice.learned_runtime_mib.is_some());
            results[job].start_s.get_or_insert(t);
            by_node[node].push(runs.len());
            runs.push(Run {
                job,
                pid,
                node,
                shards: ask,
                slurm_gpus,
                node_gib,
                gpus: choice.gpus,
                start: t,
                peak: w.peak_mib as f64,
                busy: w.busy,
                sm: w.sm,
                solo_s: w.solo_s.max(1.0),
                progress: 0.0,
            });
            slurm.take(runs.last().expect("just pushed"));
        }
        if runs.is_empty() && next_arrival == trace.len() {
            // Whatever still waits can never start (nothing will free up).
            for &j in queue.iter().chain(recovery.iter()) {
                results[j].rejected = true;
            }
            break;
        }

        // Per-GPU solo readings of the jobs sharing it → each GPU's slowdown
        // (the sharing mode's interference model) → each run's rate.
        let mut solo: Vec<Vec<(f64, f64)>> = vec![Vec::new(); ngpu];
        for r in &runs {
            for &g in &r.gpus {
                solo[gpu_slot(r.node, g)].push((r.busy, r.sm));
            }
        }
        let count: Vec<u32> = solo.iter().map(|s| s.len() as u32).collect();
        for (m, c) in max_jobs.iter_mut().zip(&count) {
            *m = (*m).max(*c);
        }
        let slow: Vec<f64> = solo.iter().map(|s| a.slowdown(s)).collect();
        let rel: Vec<f64> =
            runs.iter().map(|r| 1.0 / r.gpus.iter().map(|&g| slow[gpu_slot(r.node, g)]).fold(1.0, f64::max)).collect();
        let rate: Vec<f64> = runs.iter().zip(&rel).map(|(r, k)| k / r.solo_s).collect();
        // SM activity a monitor would read: each job's solo SM activity at its pace.
        let mut sm_now = vec![0.0; ngpu];
        for (r, k) in runs.iter().zip(&rel) {
            for &g in &r.gpus {
                sm_now[gpu_slot(r.node, g)] += r.sm * k;
            }
        }

        // Next event: arrival, completion, end of a ramp, an OOM, a sample.
        let mut t_next = f64::INFINITY;
        if next_arrival < trace.len() {
            t_next = t_next.min(trace[next_arrival].submit_s);
        }
        for (r, &k) in runs.iter().zip(&rate) {
            t_next = t_next.min(t + (1.0 - r.progress) / k);
            if r.start + a.ramp_s > t + EPS {
                t_next = t_next.min(r.start + a.ramp_s);
            }
        }
        let oom = next_oom(&runs, &by_node, &cl, t, t_next, a.ramp_s);
        if let Some((when, _)) = oom {
            t_next = t_next.min(when);
        }
        if a.sample_s > 0.0 && next_sample <= t_next {
            t_next = t_next.min(next_sample.max(t));
        }
        let dt = (t_next - t).max(0.0);

        // Integrate over [t, t_next]: everything is linear in between.
        for s in 0..ngpu {
            let u = sm_now[s].min(1.0);
            sm_int[s] += u * dt;
            energy += a.power.watts(count[s], u) * dt;
        }
        for r in &runs {
            let m = (r.alloc(t, a.ramp_s) + r.alloc(t_next, a.ramp_s)) / 2.0 * dt;
            for &g in &r.gpus {
                mem_int[gpu_slot(r.node, g)] += m;
            }
        }
        if a.sample_s > 0.0 && (t_next - next_sample).abs() < EPS {
            let mut mem = vec![0.0; ngpu];
            for r in &runs {
                for &g in &r.gpus {
                    mem[gpu_slot(r.node, g)] += r.alloc(t_next, a.ramp_s);
                }
            }
            timeline.push(Sample { t: t_next - t0, sm: sm_now.iter().map(|d| d.min(1.0)).collect(), mem_mib: mem });
            next_sample += a.sample_s;
        }
        for (r, &k) in runs.iter_mut().zip(&rate) {
            r.progress += k * dt;
        }
        t = t_next;

        // An OOM: the job that allocated last on that GPU crashes.
        if let Some((when, victim)) = oom
            && (when - t).abs() < EPS
        {
            let r = runs.remove(victim);
            slurm.give_back(&r);
            states[r.node].release_holder(r.pid, r.pid);
            results[r.job].ooms += 1;
            dirty = true;
            ooms += 1;
            recoveries += 1;
            recovery.push_back(r.job);
        }
        let mut i = 0;
        while i < runs.len() {
            if runs[i].progress >= 1.0 - 1e-9 {
                // carma-monitor has sampled the job through its run: its
                // peak is what the node's history keeps.
                let r = runs.remove(i);
                if let Some(res) = states[r.node].job_mut(r.pid) {
                    res.observed_mib = res.observed_mib.max(r.alloc(t, a.ramp_s).ceil() as u64);
                }
                slurm.give_back(&r);
                states[r.node].release_holder(r.pid, r.pid);
                results[r.job].end_s = Some(t);
                dirty = true;
            } else {
                i += 1;
            }
        }
    }
    let makespan = results.iter().filter_map(|j| j.end_s).fold(t0, f64::max) - t0;
    let span = makespan.max(EPS);
    Ok(Outcome {
        policy: cfg.policy,
        makespan_s: makespan,
        jobs: results,
        gpu_sm: sm_int.iter().map(|v| v / span).collect(),
        gpu_mem_mib: mem_int.iter().map(|v| v / span).collect(),
        energy_j: energy,
        max_jobs_per_gpu: max_jobs,
        ooms,
        recoveries,
        history_raised,
        learned_raised,
        handed_back,
        timeline,
    })
}

/// The earliest moment in (t, horizon] at which some GPU's allocated memory
/// exceeds its capacity, and the run that crashes then: the one that
/// started last among those still allocating on that GPU.
fn next_oom(
    runs: &[Run],
    by_node: &[Vec<usize>],
    cl: &Cluster,
    t: f64,
    horizon: f64,
    ramp: f64,
) -> Option<(f64, usize)> {
    let mut best: Option<(f64, usize)> = None;
    let cap = cl.mem_mib as f64;
    for on_node in by_node {
        // Only GPUs where something is still allocating can cross capacity.
        if !on_node.iter().any(|&i| runs[i].start + ramp > t + EPS || ramp <= 0.0) {
            continue;
        }
        for g in 0..cl.gpus_per_node {
            let on: Vec<usize> = on_node.iter().copied().filter(|&i| runs[i].gpus.contains(&g)).collect();
            if !on.iter().any(|&i| runs[i].start + ramp > t + EPS || ramp <= 0.0) {
                continue;
            }
            let alloc = |x: f64| on.iter().map(|&i| runs[i].alloc(x, ramp)).sum::<f64>();
            let end = on.iter().map(|&i| runs[i].start + ramp).fold(t, f64::max).min(horizon);
            if alloc(end) <= cap {
                continue;
            }
            // alloc is non-decreasing: bisect for the crossing.
            let (mut lo, mut hi) = (t, end);
            if alloc(lo) > cap {
                hi = lo;
            } else {
                for _ in 0..60 {
                    let mid = (lo + hi) / 2.0;
                    if alloc(mid) > cap { hi = mid } else { lo = mid }
                }
            }
            let Some(victim) = on
                .iter()
                .copied()
                .filter(|&i| runs[i].start + ramp > hi - EPS || ramp <= 0.0)
                .max_by(|&a, &b| runs[a].start.total_cmp(&runs[b].start).then(runs[a].pid.cmp(&runs[b].pid)))
            else {
                continue;
            };
            if best.is_none_or(|(w, _)| hi < w) {
                best = Some((hi, victim));
            }
        }
    }
    best
}
