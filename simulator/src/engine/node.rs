//! One simulated node as CARMA's plugin sees it: GPU
//! readings through its `GpuSource` trait and the plugin's decision on them.

pub(super) use super::run::Run;
use super::window::Windowed;
use super::{Assumptions, Cluster, SimConfig, share};
use carma_placement::policy::{learn_profiles, observe};
use carma_placement::state::NodeState;
use carma_placement::{GpuProcess, GpuReading, GpuSource, SourceError, StepRef};
use std::collections::HashMap;

/// One simulated node seen through CARMA's GPU-source trait.
pub(super) struct NodeView<'a> {
    pub(super) cluster: Cluster,
    pub(super) node: usize,
    pub(super) runs: &'a [Run],
    /// Indices into `runs` of this node's runs.
    pub(super) on_node: &'a [usize],
    pub(super) t: f64,
    pub(super) assumptions: &'a Assumptions,
    /// The readings' history, where they are window means.
    pub(super) window: &'a Windowed,
}

impl NodeView<'_> {
    /// What each GPU reads at this instant `(sm, busy)`.
    pub(super) fn instant(&self) -> Vec<(f64, f64)> {
        let slow = share::slowdowns(&self.assumptions.model(), self.cluster, self.runs, self.on_node);
        (0..self.cluster.gpus_per_node)
            .map(|index| {
                share::reading(
                    self.on_node
                        .iter()
                        .zip(&slow)
                        .map(|(&i, &s)| (&self.runs[i], s))
                        .filter(|(r, _)| r.gpus.contains(&index)),
                )
            })
            .collect()
    }

    fn on_gpu(&self, index: u32) -> impl Iterator<Item = &Run> {
        self.on_node.iter().map(|&i| &self.runs[i]).filter(move |r| r.gpus.contains(&index))
    }

    /// What a monitor reads: memory and processes now, SM activity and busy
    /// time now or, under a window, their means over it.
    pub(super) fn read_now(&self) -> Vec<GpuReading> {
        let window = self.assumptions.window_s;
        let now = if window > 0.0 { Vec::new() } else { self.instant() };
        (0..self.cluster.gpus_per_node)
            .map(|index| {
                let mut used = 0.0;
                let mut processes = Vec::new();
                for r in self.on_gpu(index) {
                    let a = r.alloc(self.t, self.assumptions.ramp_s);
                    used += a;
                    processes.push(GpuProcess { pid: r.pid, used_mib: a.ceil() as u64 });
                }
                let (sm, busy) = if window > 0.0 {
                    let at = self.assumptions.published_at(self.t);
                    self.window.mean(self.cluster.slot(self.node, index), at, window)
                } else {
                    now[index as usize]
                };
                GpuReading {
                    index,
                    uuid: String::new(),
                    minor: None,
                    total_mib: self.cluster.mem_mib,
                    used_mib: used.ceil() as u64,
                    sm_activity: sm,
                    busy,
                    processes,
                    power_w: None,
                    mps_uid: None,
                    sm_occupancy: None,
                    mps_server_pid: None,
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

/// What deciding a job on one node needs besides the node's state.
pub(super) struct Deciding<'a> {
    pub(super) cfg: &'a SimConfig,
    pub(super) learn: &'a carma_config::LearnRuntime,
    pub(super) runs: &'a [Run],
    /// Indices into `runs` of each node's runs.
    pub(super) by_node: &'a [Vec<usize>],
    pub(super) t: f64,
    pub(super) window: &'a Windowed,
}

impl Deciding<'_> {
    /// The plugin's decision on `node` (on `only` those GPUs, where Slurm
    /// chose them); `None` when nothing fits.
    pub(super) fn decide(
        &self,
        st: &mut NodeState,
        node: usize,
        only: Option<&[u32]>,
        step: StepRef,
        req: &carma_placement::Request,
    ) -> Result<Option<carma_placement::Decision>, String> {
        let on_node = &self.by_node[node];
        let owners: HashMap<u32, u32> = on_node.iter().map(|&i| (self.runs[i].pid, self.runs[i].pid)).collect();
        let mut readings = NodeView {
            cluster: self.cfg.cluster,
            node,
            runs: self.runs,
            on_node,
            t: self.t,
            assumptions: &self.cfg.assumptions,
            window: self.window,
        }
        .read()
        .map_err(|e| e.0)?;
        // What the placer does under the lock: sample what placed jobs
        // use and learn the profiles of jobs alone, then decide.
        let params = self.params();
        observe(st, &readings, &owners);
        learn_profiles(st, &readings, &owners, &params);
        if let Some(only) = only {
            readings.retain(|g| only.contains(&g.index));
        }
        let decided = carma_placement::decide::decide(
            st,
            step,
            req,
            &readings,
            &owners,
            &params,
            self.learn,
            self.t.max(0.0) as u64,
            &mut |_| false,
        );
        Ok(decided.ok())
    }
}

impl Deciding<'_> {
    fn params(&self) -> carma_placement::Params {
        deciding_params(self.cfg, self.t)
    }
}

/// The thresholds with the window: jobs placed within it count on top of
/// the readings, as of their publication.
pub(super) fn deciding_params(cfg: &SimConfig, t: f64) -> carma_placement::Params {
    let a = &cfg.assumptions;
    carma_placement::Params {
        // The cluster's sharing mode is the nodes' (carma.yaml sharing):
        // the guard predicts with its model.
        sharing: a.sharing,
        window_secs: window_secs(a.window_s),
        now_secs: t.max(0.0) as u64,
        readings_ms: (a.window_s > 0.0 && a.publish_s > 0.0).then(|| (a.published_at(t).max(0.0) * 1000.0) as u64),
        ..cfg.params
    }
}

/// The window as the plugin takes monitor_window: whole seconds, at least 1
/// (0: none).
fn window_secs(window_s: f64) -> u64 {
    if window_s > 0.0 { window_s.ceil().max(1.0) as u64 } else { 0 }
}
