//! How slurmctld orders and starts jobs, as `carma simulate` and `carma
//! replay-compare` model it (docs/replay.md measures it on real Slurm).

use carma_simulator::Assumptions;

/// The options that say how slurmctld schedules.
#[derive(clap::Args, Debug, Clone, Copy, Default)]
pub struct SlurmModel {
    /// Slurm's backfill where jobs have no time limit: a job behind a queue head that waits starts if it fits; without it the head blocks the queue
    #[arg(long)]
    pub backfill: bool,
    /// Under --backfill: seconds between its passes (slurmctld's bf_interval; between them its main scheduler stops at the first job that does not fit); 0: a pass at every event
    #[arg(long, value_name = "S", default_value_t = 0.0, value_parser = interval, requires = "backfill")]
    pub backfill_interval: f64,
    /// A job handed back or paused goes to the back of the queue (Slurm's priority/basic gives a job released from its requeue hold a priority below all so far); without it, it keeps its place
    #[arg(long)]
    pub requeue_to_back: bool,
}

impl SlurmModel {
    /// `a` with these options.
    pub fn apply(&self, a: Assumptions) -> Assumptions {
        Assumptions {
            backfill: self.backfill,
            backfill_interval_s: self.backfill_interval,
            requeue_to_back: self.requeue_to_back,
            ..a
        }
    }
}

fn interval(v: &str) -> Result<f64, String> {
    v.parse::<f64>()
        .ok()
        .filter(|x| x.is_finite() && (0.0..=3600.0).contains(x))
        .ok_or_else(|| "expected seconds from 0 to 3600".into())
}
