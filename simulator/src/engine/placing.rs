//! Placing queue heads: where slurmctld sends a job (or CARMA's decision
//! tried on every node), the plugin's decision there, and starting the run.

use super::node::{Deciding, Run};
use super::request::plan;
use super::slurmctld::{Ask, Slurmctld};
use super::{Admission, Sim};
use carma_config::GpuOwner;
use carma_placement::{Decision, NodeState, Request, StepRef};

/// A job slurmctld sent to a node where CARMA found no GPU yet: it holds
/// its allocation there and is tried again until `deadline`.
pub(super) struct OnNode {
    job: usize,
    node: usize,
    pub(super) deadline: f64,
    slurm_gpus: Vec<u32>,
    ask: Ask,
    from_recovery: bool,
}

/// What came of trying to place the queue head.
enum Attempt {
    /// CARMA placed it on `node`, on the GPUs of `choice`; `slurm_gpus` are
    /// those slurmctld allocated shards on.
    Placed { node: usize, choice: Decision, slurm_gpus: Vec<u32>, ask: Ask },
    /// A node handed it back: slurmctld tries again at once.
    HandedBack,
    /// Sent to `node`, where it waits for a GPU (timeouts.wait).
    WaitsOnNode { node: usize, slurm_gpus: Vec<u32>, ask: Ask },
    /// It leaves the queue unplaced: rejected or failed.
    Dropped,
    /// Nothing fits now: it waits, and so does the queue behind it (under
    /// backfill the jobs behind it are tried).
    Waits,
}

impl Sim<'_> {
    /// Places queue heads while they fit (the recovery queue first); under
    /// backfill, also the jobs behind a head that waits.
    pub(super) fn place_queue_heads(&mut self) -> Result<(), String> {
        // Queued jobs passed over (backfill), from the recovery queue's
        // head on: they stay queued.
        let mut at = 0;
        while self.dirty {
            let Some((job, from_recovery)) = self.queued(at) else {
                self.dirty = false;
                break;
            };
            match self.attempt(job, from_recovery)? {
                Attempt::Placed { node, choice, slurm_gpus, ask } => {
                    self.unqueue(at);
                    self.start(job, node, choice, slurm_gpus, &ask);
                }
                // Away for the step's wait and the requeue, if they take time.
                Attempt::HandedBack if self.cfg.assumptions.requeue_s > 0.0 => {
                    self.unqueue(at);
                    self.away.push((self.t + self.cfg.assumptions.requeue_s, job, from_recovery));
                }
                // Back at once: at the queue's end where a requeued job is
                // given the lowest priority, else in its place.
                Attempt::HandedBack if self.cfg.assumptions.requeue_to_back && !from_recovery => {
                    self.unqueue(at);
                    self.queue.push_back(job);
                }
                Attempt::HandedBack => {}
                Attempt::WaitsOnNode { node, slurm_gpus, ask } => {
                    self.unqueue(at);
                    let gib = ask.node_gib(self.cfg, self.wl[job].gpus);
                    self.slurm.hold(node, &slurm_gpus, ask.shards, gib);
                    let deadline = self.t + self.cfg.assumptions.node_wait_s;
                    self.on_node.push(OnNode { job, node, deadline, slurm_gpus, ask, from_recovery });
                }
                Attempt::Dropped => self.unqueue(at),
                Attempt::Waits if self.backfill_now() => at += 1,
                Attempt::Waits => {
                    self.dirty = false;
                    break;
                }
            }
        }
        Ok(())
    }

    /// The `at`-th queued job, the recovery queue's first, and whether it
    /// is from there.
    fn queued(&self, at: usize) -> Option<(usize, bool)> {
        match self.recovery.get(at) {
            Some(&job) => Some((job, true)),
            None => self.queue.get(at - self.recovery.len()).map(|&job| (job, false)),
        }
    }

    /// Takes the `at`-th queued job (see [`Sim::queued`]) out of its queue.
    fn unqueue(&mut self, at: usize) {
        if at < self.recovery.len() {
            self.recovery.remove(at);
        } else {
            self.queue.remove(at - self.recovery.len());
        }
    }

    /// Jobs waiting on their node: placed there once a GPU fits, handed
    /// back (or failed) when their wait is over.
    pub(super) fn retry_on_node(&mut self) -> Result<(), String> {
        let mut i = 0;
        while i < self.on_node.len() {
            let (job, node, from_recovery) = (self.on_node[i].job, self.on_node[i].node, self.on_node[i].from_recovery);
            let plan = plan(self.wl[job], from_recovery, self.cfg, &self.resolve_cfg)?;
            let step = StepRef { job: self.next_pid, holder: self.next_pid };
            let only = self.only_slurms_gpus().then(|| self.on_node[i].slurm_gpus.clone());
            let decided = {
                let (ctx, states) = self.deciding();
                ctx.decide(&mut states[node], node, only.as_deref(), step, &plan.request)?
            };
            let over = self.t + 1e-6 >= self.on_node[i].deadline;
            if decided.is_none() && !over {
                i += 1;
                continue;
            }
            let w = self.on_node.remove(i);
            let gib = w.ask.node_gib(self.cfg, self.wl[job].gpus);
            self.slurm.unhold(node, &w.slurm_gpus, w.ask.shards, gib);
            match decided {
                Some(d) => self.start(job, node, d, w.slurm_gpus, &w.ask),
                None => {
                    // What it held on the node is free for the queue again.
                    self.dirty = true;
                    if (self.excluded[job].len() as u32) < self.cfg.admission.hand_back() {
                        self.excluded[job].push(node);
                        self.handed_back += 1;
                        self.away.push((self.t + self.cfg.assumptions.requeue_s, job, from_recovery));
                    } else if !self.pause(job, from_recovery) {
                        self.fail_no_fit(job, node, step, &plan.request);
                    }
                }
            }
        }
        Ok(())
    }

    /// Shards as memory, or Slurm's choice of GPU standing: CARMA checks
    /// Slurm's GPUs only.
    fn only_slurms_gpus(&self) -> bool {
        matches!(self.cfg.admission, Admission::MemoryShards { .. } | Admission::Informed)
            || self.cfg.gpu_owner == GpuOwner::Slurm
    }

    /// A job out of hand-backs waits `hand_back_pause_s` in the queue
    /// (twice the last for each pause of the job, up to an hour; the
    /// pause replaces the requeue's delay), then may go to any node, its
    /// count started again (carma-epilog's pause). Returns whether it
    /// paused (with no pause it fails).
    fn pause(&mut self, job: usize, from_recovery: bool) -> bool {
        let a = &self.cfg.assumptions;
        if a.hand_back_pause_s <= 0.0 || self.cfg.admission.hand_back() == 0 {
            return false;
        }
        let pause = (a.hand_back_pause_s * f64::from(1u32 << self.pauses[job].min(6))).min(3600.0);
        self.excluded[job].clear();
        self.pauses[job] += 1;
        self.paused += 1;
        self.away.push((self.t + pause.max(a.requeue_s), job, from_recovery));
        true
    }

    /// CARMA cannot place the job where Slurm sent it: it fails. Could
    /// another node have placed it?
    fn fail_no_fit(&mut self, job: usize, node: usize, step: StepRef, req: &Request) {
        let (ctx, states) = self.deciding();
        let elsewhere = states.iter().enumerate().filter(|&(n, _)| n != node).any(|(n, st)| {
            let mut probe = st.clone();
            ctx.decide(&mut probe, n, None, step, req).ok().flatten().is_some()
        });
        self.results[job].failed_no_fit = true;
        self.results[job].wrong_node = elsewhere;
    }

    fn attempt(&mut self, job: usize, from_recovery: bool) -> Result<Attempt, String> {
        let w = self.wl[job];
        if w.gpus > self.cfg.cluster.gpus_per_node {
            self.results[job].rejected = true;
            return Ok(Attempt::Dropped);
        }
        let plan = plan(w, from_recovery, self.cfg, &self.resolve_cfg)?;
        let step = StepRef { job: self.next_pid, holder: self.next_pid };
        let ask = Ask::new(self.cfg, w.gpus, plan.request.estimate_mib);
        match self.cfg.admission {
            Admission::Anywhere => self.anywhere(step, &plan.request, ask),
            admission => self.where_slurm_sends((job, from_recovery), admission, step, &plan.request, ask),
        }
    }

    /// What the plugin's decision reads, beside the nodes' states it changes.
    fn deciding(&mut self) -> (Deciding<'_>, &mut [NodeState]) {
        let ctx = Deciding {
            cfg: self.cfg,
            learn: &self.resolve_cfg.estimator.learn_runtime,
            runs: &self.runs,
            by_node: &self.by_node,
            t: self.t,
            window: &self.windowed,
        };
        (ctx, &mut self.states)
    }

    /// CARMA's decision on every node in turn, the first that fits.
    fn anywhere(&mut self, step: StepRef, req: &Request, ask: Ask) -> Result<Attempt, String> {
        let (ctx, states) = self.deciding();
        for (node, st) in states.iter_mut().enumerate() {
            if let Some(d) = ctx.decide(st, node, None, step, req)? {
                return Ok(Attempt::Placed { node, choice: d, slurm_gpus: Vec::new(), ask });
            }
        }
        Ok(Attempt::Waits)
    }

    /// slurmctld picks the node (and the GPUs); CARMA decides there alone.
    /// A job it cannot place is handed back, or fails.
    fn where_slurm_sends(
        &mut self,
        (job, from_recovery): (usize, bool),
        admission: Admission,
        step: StepRef,
        req: &Request,
        ask: Ask,
    ) -> Result<Attempt, String> {
        self.set_counts();
        let slurmctld = Slurmctld {
            cfg: self.cfg,
            alloc: &self.slurm,
            runs: &self.runs,
            by_node: &self.by_node,
            t: self.t,
            window: &self.windowed,
            counts: &self.counts,
        };
        let Some((node, gpus)) = slurmctld.pick(&self.excluded[job], self.wl[job].gpus, &ask) else {
            return Ok(Attempt::Waits);
        };
        let only = self.only_slurms_gpus().then_some(gpus.as_slice());
        let decided = {
            let (ctx, states) = self.deciding();
            ctx.decide(&mut states[node], node, only, step, req)?
        };
        match decided {
            Some(d) => Ok(Attempt::Placed { node, choice: d, slurm_gpus: gpus, ask }),
            None if self.cfg.assumptions.node_wait_s > 0.0 => Ok(Attempt::WaitsOnNode { node, slurm_gpus: gpus, ask }),
            None if (self.excluded[job].len() as u32) < admission.hand_back() => {
                // Handed back: requeued, this node excluded.
                self.excluded[job].push(node);
                self.handed_back += 1;
                Ok(Attempt::HandedBack)
            }
            None => {
                if !self.pause(job, from_recovery) {
                    self.fail_no_fit(job, node, step, req);
                }
                Ok(Attempt::Dropped)
            }
        }
    }

    /// The monitors whose time has come set their node's count: what
    /// the node could promise now (`admissible_gib`); slurmctld takes what
    /// it allocated there off it (tools/src/admission.rs).
    /// Returns whether any did (a job held back may fit now).
    pub(super) fn set_counts(&mut self) -> bool {
        let every = self.cfg.assumptions.count_interval_s;
        if every <= 0.0 || !matches!(self.cfg.admission, Admission::NodeMemory { .. }) {
            return false;
        }
        let mut set = false;
        for node in 0..self.states.len() {
            // (Due within EPS counts as due: next_event schedules no
            // event that close.)
            if self.t + super::EPS < self.counts[node].0 {
                continue;
            }
            let (readings, owners) = self.read_node(node);
            let params = super::node::deciding_params(self.cfg, self.t);
            let gib = carma_placement::policy::admissible_gib(&readings, &self.states[node], &owners, &params);
            // The next point of the node's schedule (from its first count).
            let mut next = if self.counts[node].0.is_finite() { self.counts[node].0 } else { self.t };
            while next <= self.t {
                next += every;
            }
            // As the monitor writes it: never 0 (Slurm would drop the GRES).
            self.counts[node] = (next, (gib as u32).max(1));
            set = true;
        }
        set
    }

    /// Starts the job's run where CARMA placed it.
    fn start(&mut self, job: usize, node: usize, choice: Decision, slurm_gpus: Vec<u32>, ask: &Ask) {
        let w = self.wl[job];
        let pid = self.next_pid;
        self.next_pid += 1;
        self.history_raised += u32::from(choice.history_mib.is_some());
        self.learned_raised += u32::from(choice.learned_runtime_mib.is_some());
        self.results[job].start_s.get_or_insert(self.t);
        self.results[job].placed = Some((node, choice.gpus.clone()));
        let shared = !choice.exclusive;
        let known = self.states[node].job_mut(pid).is_some_and(|r| r.profile.is_some());
        self.unprofiled += u32::from(shared && !known);
        self.results[job].unprofiled = shared && !known;
        let mps_client = shared && choice.gpus.len() == 1 && self.cfg.assumptions.sharing == super::Sharing::Mps;
        self.by_node[node].push(self.runs.len());
        self.runs.push(Run {
            job,
            pid,
            node,
            shards: ask.shards,
            slurm_gpus,
            node_gib: ask.node_gib(self.cfg, w.gpus),
            gpus: choice.gpus,
            start: self.t,
            peak: w.peak_mib as f64,
            busy: w.busy,
            sm: w.sm,
            solo_s: w.solo_s.max(1.0),
            progress: 0.0,
            mps_client,
        });
        self.slurm.take(self.runs.last().expect("just pushed"));
    }
}
