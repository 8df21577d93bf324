//! Placing queue heads: where slurmctld sends a job (or CARMA's decision
//! tried on every node), the plugin's decision there, and starting the run.

use super::node::{Deciding, Run};
use super::request::plan;
use super::slurmctld::{Ask, Slurmctld};
use super::{Admission, Sim};
use carma_config::GpuOwner;
use carma_placement::{Decision, NodeState, Request, StepRef};

/// What came of trying to place the queue head.
enum Attempt {
    /// CARMA placed it on `node`, on the GPUs of `choice`; `slurm_gpus` are
    /// those slurmctld allocated shards on.
    Placed { node: usize, choice: Decision, slurm_gpus: Vec<u32>, ask: Ask },
    /// A node handed it back: slurmctld tries again at once.
    HandedBack,
    /// It leaves the queue unplaced: rejected or failed.
    Dropped,
    /// Nothing fits now: it waits, and so does the queue behind it.
    Waits,
}

impl Sim<'_> {
    /// Places queue heads while they fit (the recovery queue first).
    pub(super) fn place_queue_heads(&mut self) -> Result<(), String> {
        while self.dirty {
            let from_recovery = !self.recovery.is_empty();
            let Some(&job) = self.recovery.front().or(self.queue.front()) else {
                self.dirty = false;
                break;
            };
            match self.attempt(job, from_recovery)? {
                Attempt::Placed { node, choice, slurm_gpus, ask } => {
                    self.pop_head(from_recovery);
                    self.start(job, node, choice, slurm_gpus, &ask);
                }
                Attempt::HandedBack => {}
                Attempt::Dropped => self.pop_head(from_recovery),
                Attempt::Waits => {
                    self.dirty = false;
                    break;
                }
            }
        }
        Ok(())
    }

    /// Takes the queue head that was tried (the recovery queue's, if it came
    /// from there).
    fn pop_head(&mut self, from_recovery: bool) {
        if from_recovery {
            self.recovery.pop_front()
        } else {
            self.queue.pop_front()
        };
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
            admission => self.where_slurm_sends(job, admission, step, &plan.request, ask),
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
        job: usize,
        admission: Admission,
        step: StepRef,
        req: &Request,
        ask: Ask,
    ) -> Result<Attempt, String> {
        let slurmctld =
            Slurmctld { cfg: self.cfg, alloc: &self.slurm, runs: &self.runs, by_node: &self.by_node, t: self.t };
        let Some((node, gpus)) = slurmctld.pick(&self.excluded[job], self.wl[job].gpus, &ask) else {
            return Ok(Attempt::Waits);
        };
        // Shards as memory, or Slurm's choice of GPU standing: CARMA checks
        // Slurm's GPUs.
        let only = (matches!(admission, Admission::MemoryShards { .. } | Admission::Informed)
            || self.cfg.gpu_owner == GpuOwner::Slurm)
            .then_some(gpus.as_slice());
        let decided = {
            let (ctx, states) = self.deciding();
            ctx.decide(&mut states[node], node, only, step, req)?
        };
        match decided {
            Some(d) => Ok(Attempt::Placed { node, choice: d, slurm_gpus: gpus, ask }),
            None if (self.excluded[job].len() as u32) < admission.hand_back() => {
                // Handed back: requeued, this node excluded.
                self.excluded[job].push(node);
                self.handed_back += 1;
                Ok(Attempt::HandedBack)
            }
            None => {
                // CARMA cannot place it where Slurm sent it: it fails.
                // Could another node have?
                let (ctx, states) = self.deciding();
                let elsewhere = states.iter().enumerate().filter(|&(n, _)| n != node).any(|(n, st)| {
                    let mut probe = st.clone();
                    ctx.decide(&mut probe, n, None, step, req).ok().flatten().is_some()
                });
                self.results[job].failed_no_fit = true;
                self.results[job].wrong_node = elsewhere;
                Ok(Attempt::Dropped)
            }
        }
    }

    /// Starts the job's run where CARMA placed it.
    fn start(&mut self, job: usize, node: usize, choice: Decision, slurm_gpus: Vec<u32>, ask: &Ask) {
        let w = self.wl[job];
        let pid = self.next_pid;
        self.next_pid += 1;
        self.history_raised += u32::from(choice.history_mib.is_some());
        self.learned_raised += u32::from(choice.learned_runtime_mib.is_some());
        self.results[job].start_s.get_or_insert(self.t);
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
        });
        self.slurm.take(self.runs.last().expect("just pushed"));
    }
}
