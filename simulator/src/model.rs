//! What the simulator assumes about GPUs and jobs sharing them: power,
//! interference under time-slicing and MPS, memory ramp-up. A leaf: the
//! engine runs with these, calibration fits them, input reads with them.

pub use carma_config::Sharing;
use carma_placement::slowdown::Model;

/// GPU power: `idle_w` always, `active_w` while any job runs on the GPU,
/// and `sm_w` × SM activity. Fitted on an H100 (see [`crate::calibration`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PowerProfile {
    pub name: &'static str,
    pub idle_w: f64,
    pub active_w: f64,
    pub sm_w: f64,
}

impl PowerProfile {
    /// Fitted by least squares on data/h100/collocation.csv (idle measured:
    /// 69.8 W; the fit is re-done and printed by `carma simulate-report`).
    pub const H100_80GB: PowerProfile = PowerProfile { name: "h100-80gb", idle_w: 69.8, active_w: 21.1, sm_w: 518.0 };
    /// The paper's GPU, not measured here: the H100 fit's dynamic part scaled
    /// by the TDP ratio (400 W / 700 W); idle ~60 W.
    pub const A100_40GB: PowerProfile = PowerProfile { name: "a100-40gb", idle_w: 60.0, active_w: 12.1, sm_w: 296.0 };

    pub fn parse(s: &str) -> Result<PowerProfile, String> {
        match s {
            "h100-80gb" => Ok(PowerProfile::H100_80GB),
            "a100-40gb" => Ok(PowerProfile::A100_40GB),
            _ => Err(format!("GPU profile '{s}': expected a100-40gb or h100-80gb")),
        }
    }

    pub fn watts(&self, jobs: u32, sm: f64) -> f64 {
        self.idle_w + if jobs > 0 { self.active_w } else { 0.0 } + self.sm_w * sm.min(1.0)
    }
}

/// Every modelling choice, with its default. The interference defaults are
/// fitted on data/h100/collocation.csv ([`crate::calibration`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Assumptions {
    /// A job's memory grows linearly from 0 to its peak over this many
    /// seconds after it starts (frameworks allocate during the first
    /// iterations): why memory that is promised but not yet used matters.
    pub ramp_s: f64,
    pub sharing: Sharing,
    /// How much slower each job sharing a GPU runs than alone: the model
    /// the plugin's guard predicts with (`carma_placement::slowdown`), so
    /// the simulated GPUs behave as the guard expects them to, within the
    /// model's error against the H100. `None`: the calibrated model of
    /// `sharing`.
    pub model: Option<Model>,
    /// The aggregate (one slowdown per GPU) model of before #56, which
    /// [`crate::calibration`] still fits and prints; the engine does not
    /// read it. Time-slicing: a GPU whose jobs' solo busy fractions sum to
    /// B > 1 runs each max(1, B)× slower, times 1 + `switch_overhead` per
    /// extra job.
    pub switch_overhead: f64,
    /// The aggregate model under MPS (as `switch_overhead`, not read by the
    /// engine): a GPU whose jobs' solo SM activities sum to S runs each
    /// max(1, S / `mps_capacity`)× slower, times 1 + `mps_overhead` per
    /// extra job, and every job under MPS at `mps_solo` of its plain speed.
    pub mps_capacity: f64,
    pub mps_overhead: f64,
    pub mps_solo: f64,
    pub power: PowerProfile,
    /// Interval of the per-GPU timeline for plots (0 = no timeline).
    pub sample_s: f64,
    /// The window the monitor's activity readings average over (carma.yaml
    /// monitor_window, with published readings): a job is taken into them
    /// linearly over it, and the plugin counts one placed within it as
    /// half the cap on top ([`carma_placement::Params::window_secs`]).
    /// 0: readings see a job at once, and nothing is added.
    pub window_s: f64,
    /// Seconds between the monitor's publications (carma.yaml
    /// monitor.interval): under a window, the plugin reads the means as of
    /// the last one, and counts a placed job by how much of it they have
    /// seen ([`carma_placement::Params::readings_ms`]). 0: as of now.
    pub publish_s: f64,
    /// Seconds a job CARMA cannot place waits on the node slurmctld sent it
    /// to (carma.yaml timeouts.wait), holding its allocation there and
    /// placed as soon as a GPU fits, before it is handed back or fails.
    /// 0: decided at once.
    pub node_wait_s: f64,
    /// Seconds a handed-back job is away before slurmctld can place it
    /// again (the epilog's requeue). 0: at once.
    pub requeue_s: f64,
    /// How often each node's monitor sets its admission count in slurmctld
    /// (carma.yaml's `monitor.admission_interval`), under node-memory
    /// admission: the count is what the node could promise when it was
    /// last set, and slurmctld's free count that less what it has
    /// allocated there. 0: slurmctld counts the node's GPUs under the cap,
    /// less what it allocated.
    pub count_interval_s: f64,
    /// Seconds a job that found no GPU on as many nodes since it last paused as the
    /// admission hands back waits in the queue (carma.yaml's
    /// `hand_back_pause`) before slurmctld may send it anywhere again, its
    /// exclusions lifted and its count started again. 0: it fails.
    pub hand_back_pause_s: f64,
    /// Slurm's backfill as it works where jobs have no time limit (the test
    /// clusters' `MaxTime=INFINITE`): the queue head's reservation lies past
    /// every running job's end, so any later job that fits starts while the
    /// head waits (a stream of small jobs may then pass a large head for
    /// ever, as in Slurm without a reservation). Off: strictly in order
    /// (the head blocks the queue).
    pub backfill: bool,
    /// Under `backfill`, seconds between backfill passes: slurmctld's
    /// backfill runs `bf_interval` after its last cycle ended, and between
    /// its passes the main scheduler, run at each submission and end, stops
    /// at the first job that does not fit. 0: a pass at every event.
    pub backfill_interval_s: f64,
    /// A job handed back (or paused) goes to the back of the queue, as in
    /// Slurm under priority/basic, where a job requeued held is given a
    /// new priority, below every job's so far, when it is released. Off:
    /// it keeps its place (its submission's).
    pub requeue_to_back: bool,
}

impl Default for Assumptions {
    fn default() -> Self {
        Assumptions {
            ramp_s: 60.0,
            sharing: Sharing::Timeslice,
            model: None,
            switch_overhead: 0.106,
            mps_capacity: 1.06,
            mps_overhead: 0.01,
            mps_solo: 0.87,
            power: PowerProfile::A100_40GB,
            sample_s: 60.0,
            window_s: 0.0,
            publish_s: 0.0,
            node_wait_s: 0.0,
            requeue_s: 0.0,
            count_interval_s: 0.0,
            hand_back_pause_s: 0.0,
            backfill: false,
            backfill_interval_s: 0.0,
            requeue_to_back: false,
        }
    }
}

impl Assumptions {
    /// When the readings the plugin sees at `t` were published.
    pub fn published_at(&self, t: f64) -> f64 {
        if self.publish_s > 0.0 { (t / self.publish_s).floor() * self.publish_s } else { t }
    }

    /// The per-job slowdown model the engine runs with.
    pub fn model(&self) -> Model {
        self.model.unwrap_or_else(|| Model::of(self.sharing))
    }

    /// The aggregate model's slowdown of every job of a GPU (see
    /// `switch_overhead`; for the calibration's figures only): `(busy, sm)`
    /// are their solo readings.
    pub fn slowdown(&self, jobs: &[(f64, f64)]) -> f64 {
        let extra = jobs.len().saturating_sub(1) as f64;
        match self.sharing {
            Sharing::Timeslice => {
                let busy: f64 = jobs.iter().map(|j| j.0).sum();
                busy.max(1.0) * (1.0 + self.switch_overhead * extra)
            }
            Sharing::Mps => {
                let sm: f64 = jobs.iter().map(|j| j.1).sum();
                (sm / self.mps_capacity).max(1.0) * (1.0 + self.mps_overhead * extra) / self.mps_solo
            }
        }
    }
}
