//! Time between events: each job's slowdown and each run's rate, the next
//! event, the exact integrals up to it, and what happens then (an OOM, jobs
//! finishing).

use super::node::Run;
use super::{Cluster, EPS, Sample, Sim, share};

/// How things go until the next event.
pub(super) struct Pace {
    /// Jobs on each GPU (node-major).
    count: Vec<u32>,
    /// Each run's progress per second (1 = done).
    rate: Vec<f64>,
    /// The SM activity a monitor would read on each GPU: each job's solo
    /// SM activity at its pace.
    sm_now: Vec<f64>,
}

impl Sim<'_> {
    /// Each run's own slowdown among the jobs sharing its GPUs (the
    /// sharing mode's per-job model) → each run's rate.
    pub(super) fn pace(&mut self) -> Pace {
        let (cl, a) = (self.cfg.cluster, &self.cfg.assumptions);
        let mut count = vec![0u32; cl.gpus()];
        for r in &self.runs {
            for &g in &r.gpus {
                count[cl.slot(r.node, g)] += 1;
            }
        }
        for (m, c) in self.max_jobs.iter_mut().zip(&count) {
            *m = (*m).max(*c);
        }
        let all: Vec<usize> = (0..self.runs.len()).collect();
        let rel: Vec<f64> = share::slowdowns(&a.model(), cl, &self.runs, &all).iter().map(|s| 1.0 / s).collect();
        let rate: Vec<f64> = self.runs.iter().zip(&rel).map(|(r, k)| k / r.solo_s).collect();
        let mut sm_now = vec![0.0; cl.gpus()];
        for (r, k) in self.runs.iter().zip(&rel) {
            for &g in &r.gpus {
                sm_now[cl.slot(r.node, g)] += r.sm * k;
            }
        }
        Pace { count, rate, sm_now }
    }

    /// The next event: an arrival, a completion, the end of a ramp, an OOM
    /// (with the run it crashes), a sample.
    pub(super) fn next_event(&self, pace: &Pace) -> (f64, Option<(f64, usize)>) {
        let (t, a) = (self.t, &self.cfg.assumptions);
        let mut t_next = f64::INFINITY;
        if self.next_arrival < self.trace.len() {
            t_next = t_next.min(self.trace[self.next_arrival].submit_s);
        }
        for &(back, _, _) in &self.away {
            t_next = t_next.min(back);
        }
        for w in &self.on_node {
            t_next = t_next.min(w.deadline);
        }
        // Under a window the plugin's count of recent placements falls
        // second by second: a job still waiting is tried at the next one.
        if a.window_s > 0.0 && (!self.queue.is_empty() || !self.recovery.is_empty() || !self.on_node.is_empty()) {
            t_next = t_next.min(t.floor() + 1.0);
        }
        // A job slurmctld holds back is tried again when a monitor sets its
        // node's count.
        if a.count_interval_s > 0.0 && (!self.queue.is_empty() || !self.recovery.is_empty()) {
            for &(due, _) in &self.counts {
                if due > t + EPS && due.is_finite() {
                    t_next = t_next.min(due);
                }
            }
        }
        if let Some(pass) = self.next_backfill()
            && self.jobs_behind_head()
        {
            t_next = t_next.min(pass);
        }
        for (r, &k) in self.runs.iter().zip(&pace.rate) {
            t_next = t_next.min(t + (1.0 - r.progress) / k);
            if r.start + a.ramp_s > t + EPS {
                t_next = t_next.min(r.start + a.ramp_s);
            }
        }
        let oom = next_oom(&self.runs, &self.by_node, &self.cfg.cluster, t, t_next, a.ramp_s);
        if let Some((when, _)) = oom {
            t_next = t_next.min(when);
        }
        if a.sample_s > 0.0 && self.next_sample <= t_next {
            t_next = t_next.min(self.next_sample.max(t));
        }
        (t_next, oom)
    }

    /// Integrates over [t, t_next] (everything is linear in between), takes
    /// a sample if one is due, and moves the clock and the runs on.
    pub(super) fn advance(&mut self, pace: &Pace, t_next: f64) {
        let (t, cl, a) = (self.t, self.cfg.cluster, &self.cfg.assumptions);
        let dt = (t_next - t).max(0.0);
        for s in 0..cl.gpus() {
            let u = pace.sm_now[s].min(1.0);
            self.sm_int[s] += u * dt;
            self.energy += a.power.watts(pace.count[s], u) * dt;
        }
        for r in &self.runs {
            let m = (r.alloc(t, a.ramp_s) + r.alloc(t_next, a.ramp_s)) / 2.0 * dt;
            for &g in &r.gpus {
                self.mem_int[cl.slot(r.node, g)] += m;
            }
        }
        if a.sample_s > 0.0 && (t_next - self.next_sample).abs() < EPS {
            let mut mem = vec![0.0; cl.gpus()];
            for r in &self.runs {
                for &g in &r.gpus {
                    mem[cl.slot(r.node, g)] += r.alloc(t_next, a.ramp_s);
                }
            }
            let sm = pace.sm_now.iter().map(|d| d.min(1.0)).collect();
            self.timeline.push(Sample { t: t_next - self.t0, sm, mem_mib: mem });
            self.next_sample += a.sample_s;
        }
        for (r, &k) in self.runs.iter_mut().zip(&pace.rate) {
            r.progress += k * dt;
        }
        self.t = t_next;
    }

    /// An OOM: the job that allocated last on that GPU crashes, and goes to
    /// the recovery queue; one that crashed alone on its GPUs never fits
    /// one and is rejected (recovered, it would crash for ever).
    pub(super) fn crash(&mut self, victim: usize) {
        let r = self.runs.remove(victim);
        self.slurm.give_back(&r);
        self.states[r.node].release_holder(r.pid, r.pid);
        self.results[r.job].ooms += 1;
        self.dirty = true;
        self.ooms += 1;
        let alone = !self.runs.iter().any(|o| o.node == r.node && o.gpus.iter().any(|g| r.gpus.contains(g)));
        if alone {
            self.results[r.job].rejected = true;
            return;
        }
        self.recoveries += 1;
        self.recovery.push_back(r.job);
    }

    /// Ends the runs that are done.
    pub(super) fn finish_completed(&mut self) {
        let ramp = self.cfg.assumptions.ramp_s;
        let mut i = 0;
        while i < self.runs.len() {
            if self.runs[i].progress >= 1.0 - 1e-9 {
                // carma-monitor has sampled the job through its run: its
                // peak is what the node's history keeps.
                let r = self.runs.remove(i);
                if let Some(res) = self.states[r.node].job_mut(r.pid) {
                    res.observed_mib = res.observed_mib.max(r.alloc(self.t, ramp).ceil() as u64);
                }
                self.slurm.give_back(&r);
                self.states[r.node].release_holder(r.pid, r.pid);
                self.results[r.job].end_s = Some(self.t);
                self.results[r.job].run_s = Some(self.t - r.start);
                self.last_end = self.t;
                self.dirty = true;
            } else {
                i += 1;
            }
        }
    }
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
