//! How much slower each job of a set sharing one GPU runs than alone, from
//! each job's solo profile: the model the guard, `carma place --dry-run`,
//! the simulator and carma-fakejob use. (Not yet the admission count
//! slurmctld sees, nor the simulated GPUs' readings: docs/slowdown.md.)
//!
//! Both sharing modes are one shared resource divided by weighted
//! water-filling: each job asks for what it uses alone (its demand), the
//! resource has a capacity, and where the demands exceed it each job gets
//! the smaller of its demand and a share proportional to its weight. A job
//! runs `base × demand / share` times slower than alone.
//! - Time-slicing: the resource is the GPU's time; a job's demand is its
//!   solo busy share (NVML utilization.gpu alone). Kernels of different
//!   processes never overlap, and each context switch costs time: the
//!   capacity is 1 / (1 + `switch` × (n − 1)).
//! - MPS: the resource is the SMs; a job's demand is its solo SM activity.
//!   Kernels overlap up to a capacity somewhat above one reading's worth,
//!   and a job under MPS runs at 1 / `base` of its plain speed even alone.
//!
//! The weights grow with the demand (a job whose kernels fill the GPU
//! keeps more of it than a light one, but not in proportion under
//! time-slicing). Fitted on the H100 sets of data/h100/collocation.csv;
//! the fit, and its per-job error, are checked by the simulator's tests
//! (`carma_simulator::jobcheck`) and printed by `carma calibrate`
//! (docs/slowdown.md).

use carma_config::Sharing;
use serde::{Deserialize, Serialize};

/// What a job does to a GPU alone: the share of time its kernels run
/// (NVML utilization.gpu) and its SM activity (GPM/DCGM), each 0–1.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    pub busy: f64,
    pub sm: f64,
}

impl Profile {
    /// A job nothing is known of counts as filling the GPU: nothing it
    /// declares lets it past the guard, only what was seen of it.
    pub const UNKNOWN: Profile = Profile { busy: 1.0, sm: 1.0 };

    /// Both readings within 0–1 (NaN taken as the worst case).
    pub fn clamped(self) -> Profile {
        let c = |x: f64| if x.is_nan() { 1.0 } else { x.clamp(0.0, 1.0) };
        Profile { busy: c(self.busy), sm: c(self.sm) }
    }

    /// The larger of each reading: what a job was seen doing at most.
    pub fn max(self, o: Profile) -> Profile {
        Profile { busy: self.busy.max(o.busy), sm: self.sm.max(o.sm) }.clamped()
    }
}

/// The model's parameters for one sharing mode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Model {
    pub sharing: Sharing,
    /// Time-slicing: each extra job's share of the GPU's time lost to
    /// switching. MPS: unused.
    pub switch: f64,
    /// MPS: the SM activity jobs reach together. Time-slicing: unused (1).
    pub capacity: f64,
    /// How the shares follow the demands (0: equal, 1: proportional).
    pub weight_exp: f64,
    /// Slowdown of a job alone in this mode against a plain process.
    pub base: f64,
}

impl Model {
    /// Fitted on the H100's time-sliced pairs (docs/slowdown.md): per-job
    /// error median 3.2 %, max 9.1 % (`carma calibrate`).
    pub const H100_TIMESLICE: Model =
        Model { sharing: Sharing::Timeslice, switch: 0.14, capacity: 1.0, weight_exp: 0.5, base: 1.0 };
    /// Fitted on the H100's MPS pairs and its MPS solo run: per-job error
    /// median 2.1 %, max 6.2 %.
    pub const H100_MPS: Model = Model {
        sharing: Sharing::Mps,
        switch: 0.0,
        capacity: 1.08,
        weight_exp: 1.7,
        base: carma_config::MPS_SOLO_SLOWDOWN,
    };

    /// The calibrated model of a sharing mode.
    pub fn of(sharing: Sharing) -> Model {
        match sharing {
            Sharing::Timeslice => Model::H100_TIMESLICE,
            Sharing::Mps => Model::H100_MPS,
        }
    }

    /// Each job's slowdown against running alone as a plain process, in
    /// the order given. Empty in, empty out.
    pub fn slowdowns(&self, jobs: &[Profile]) -> Vec<f64> {
        let n = jobs.len();
        if n == 0 {
            return vec![];
        }
        let demand: Vec<f64> = jobs
            .iter()
            .map(|p| {
                let p = p.clamped();
                // A job with no demand still needs a sliver of the resource.
                (match self.sharing {
                    Sharing::Timeslice => p.busy,
                    Sharing::Mps => p.sm,
                })
                .max(1e-3)
            })
            .collect();
        let capacity = match self.sharing {
            Sharing::Timeslice => 1.0 / (1.0 + self.switch * (n - 1) as f64),
            Sharing::Mps => self.capacity,
        };
        let weights: Vec<f64> = demand.iter().map(|d| d.powf(self.weight_exp)).collect();
        let shares = water_fill(&demand, &weights, capacity);
        demand.iter().zip(&shares).map(|(d, s)| self.base * (d / s).max(1.0)).collect()
    }

    /// The largest slowdown of the set (1 for an empty one).
    pub fn worst(&self, jobs: &[Profile]) -> f64 {
        self.slowdowns(jobs).into_iter().fold(1.0, f64::max)
    }
}

/// Divides `capacity` among demands: each gets min(demand, λ × weight),
/// with λ such that the shares add up to the capacity (or every demand is
/// met). Exact: the jobs whose demand caps them are found in order of
/// demand / weight.
fn water_fill(demand: &[f64], weights: &[f64], capacity: f64) -> Vec<f64> {
    if demand.iter().sum::<f64>() <= capacity {
        return demand.to_vec();
    }
    let mut order: Vec<usize> = (0..demand.len()).collect();
    order.sort_by(|&a, &b| (demand[a] / weights[a]).total_cmp(&(demand[b] / weights[b])));
    let (mut left, mut weight_left) = (capacity, weights.iter().sum::<f64>());
    let mut lambda = left / weight_left;
    for &i in &order {
        // Met in full at this λ: it takes its demand, the rest share what is left.
        if demand[i] <= lambda * weights[i] {
            left -= demand[i];
            weight_left -= weights[i];
            if weight_left > 0.0 {
                lambda = left / weight_left;
            }
        } else {
            break;
        }
    }
    demand.iter().zip(weights).map(|(d, w)| d.min(lambda * w)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(busy: f64, sm: f64) -> Profile {
        Profile { busy, sm }
    }

    #[test]
    fn a_job_alone_runs_at_its_own_pace_time_sliced() {
        assert_eq!(Model::H100_TIMESLICE.slowdowns(&[p(0.98, 0.82)]), vec![1.0]);
        assert_eq!(Model::H100_TIMESLICE.slowdowns(&[]), Vec::<f64>::new());
    }

    #[test]
    fn light_jobs_that_fit_in_the_gpus_time_are_not_slowed() {
        // Five tiny MLPs (busy 0.124 each) use 0.62 of the GPU's time,
        // under what five contexts leave (1 / 1.56 = 0.64).
        let s = Model::H100_TIMESLICE.slowdowns(&[p(0.124, 0.006); 5]);
        assert!(s.iter().all(|x| *x == 1.0), "{s:?}");
        // Seven do not fit (0.87 of 0.54): each waits for the others.
        let s = Model::H100_TIMESLICE.slowdowns(&[p(0.124, 0.006); 7]);
        assert!(s.iter().all(|x| *x > 1.5), "{s:?}");
    }

    #[test]
    fn the_heavy_job_of_a_saturated_pair_loses_more_than_its_light_partner() {
        // resnet50 (busy 0.98) and mobilenet (0.541), measured 1.95x and 1.35x.
        let s = Model::H100_TIMESLICE.slowdowns(&[p(0.98, 0.825), p(0.541, 0.312)]);
        assert!((s[0] - 1.95).abs() / 1.95 < 0.05 && (s[1] - 1.35).abs() / 1.35 < 0.12, "{s:?}");
    }

    #[test]
    fn an_unknown_job_beside_a_half_busy_job_is_predicted_over_1_6x() {
        let m = Model::H100_TIMESLICE;
        assert!(m.worst(&[Profile::UNKNOWN, p(0.54, 0.31)]) > 1.6);
        assert!(m.worst(&[Profile::UNKNOWN]) <= 1.0);
    }

    #[test]
    fn water_filling_meets_small_demands_and_splits_the_rest_by_weight() {
        let s = water_fill(&[0.1, 0.9, 0.9], &[1.0, 1.0, 1.0], 1.0);
        assert!((s[0] - 0.1).abs() < 1e-12 && (s[1] - 0.45).abs() < 1e-12 && (s[2] - 0.45).abs() < 1e-12, "{s:?}");
        let s = water_fill(&[0.9, 0.9], &[3.0, 1.0], 1.0);
        assert!((s[0] - 0.75).abs() < 1e-12 && (s[1] - 0.25).abs() < 1e-12, "{s:?}");
        assert_eq!(water_fill(&[0.2, 0.3], &[1.0, 1.0], 1.0), vec![0.2, 0.3]);
    }

    #[test]
    fn bad_readings_count_as_the_worst_case() {
        let s = Model::H100_TIMESLICE.slowdowns(&[p(f64::NAN, 0.0), p(0.6, 0.3)]);
        assert_eq!(s, Model::H100_TIMESLICE.slowdowns(&[Profile::UNKNOWN, p(0.6, 0.3)]));
    }
}
