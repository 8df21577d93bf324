//! The node's learned fixed memory: the part of every estimate that belongs
//! to the software stack (CUDA context, cuBLAS/cuDNN, the framework), not to
//! the model. It differs by stack (700 MiB in the CARMA paper's data, ~760
//! on PyTorch 2.11/H100, ~1.9 GB in other published sets) and no estimator
//! can know it. Each finished job whose estimate came from its model says
//! how far its observed peak went past the model part; a high quantile of
//! the node's latest such observations is its learned value.
//!
//! Why it cannot drift low: it is used only where it is larger than the
//! fixed part a job's estimate already carries (carma.yaml's
//! `estimator.runtime`), so learning only ever raises an estimate. Why it
//! cannot run away: one job that leaked or was mis-estimated is one
//! observation below the quantile (with 0.75, a quarter of the window must
//! agree), the value is capped by `learn_runtime.max`, and only the latest
//! `window` jobs count, so it follows a stack upgrade and forgets it after
//! a downgrade.

use carma_config::LearnRuntime;

/// Observations kept in the node state (the largest allowed window).
pub const KEPT: usize = 256;

/// Records one finished job: its observed per-GPU peak less the model part
/// of its estimate (0 where the model part alone covered the peak).
pub fn observe(samples: &mut Vec<u64>, peak_mib: u64, model_mib: u64) {
    samples.push(peak_mib.saturating_sub(model_mib));
    let over = samples.len().saturating_sub(KEPT);
    samples.drain(..over);
}

/// The learned value, once `min_jobs` observations are in the window:
/// the `quantile` of the latest `window` (nearest rank), at most `max`.
pub fn value(samples: &[u64], learn: &LearnRuntime) -> Option<u64> {
    let window = &samples[samples.len().saturating_sub(learn.window as usize)..];
    if learn.min_jobs == 0 || window.len() < learn.min_jobs as usize {
        return None;
    }
    let mut sorted = window.to_vec();
    sorted.sort_unstable();
    let rank = (learn.quantile * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1].min(learn.max_mib))
}

/// The learned value where it exceeds the fixed part `runtime_mib` that a
/// job's estimate carries (the only case in which it changes anything).
pub fn raise(samples: &[u64], learn: &LearnRuntime, runtime_mib: u64) -> Option<u64> {
    value(samples, learn).filter(|&v| v > runtime_mib)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn learn(min_jobs: u32, window: u32) -> LearnRuntime {
        LearnRuntime { min_jobs, window, ..LearnRuntime::default() }
    }

    #[test]
    fn a_high_quantile_of_the_latest_window_once_enough_jobs_ended() {
        let mut s = Vec::new();
        for (peak, model) in [(5000, 4000), (900, 3000), (2700, 1000), (1800, 1000)] {
            observe(&mut s, peak, model);
        }
        assert_eq!(s, vec![1000, 0, 1700, 800], "a peak below the model part observes 0");
        assert_eq!(value(&s, &learn(5, 64)), None, "4 of 5 jobs");
        assert_eq!(value(&s, &learn(0, 64)), None, "min_jobs 0: never learned");
        // Nearest rank: ceil(0.75 × 4) = the 3rd of 0, 800, 1000, 1700.
        assert_eq!(value(&s, &learn(4, 64)), Some(1000));
        assert_eq!(value(&s, &LearnRuntime { quantile: 1.0, ..learn(4, 64) }), Some(1700));
        assert_eq!(value(&s, &LearnRuntime { quantile: 0.5, ..learn(4, 64) }), Some(800));
        // Only the latest `window` count: 1700 and 800.
        assert_eq!(value(&s, &learn(2, 2)), Some(1700));
        assert_eq!(value(&s, &LearnRuntime { max_mib: 1200, ..learn(2, 2) }), Some(1200), "capped");
        // It only ever raises: not where the job's own fixed part is larger.
        assert_eq!(raise(&s, &learn(4, 64), 700), Some(1000));
        assert_eq!(raise(&s, &learn(4, 64), 1000), None);
    }

    #[test]
    fn one_outlier_does_not_move_it_and_the_state_stays_bounded() {
        let mut s = Vec::new();
        for _ in 0..20 {
            observe(&mut s, 1760, 1000);
        }
        observe(&mut s, 40_000, 1000);
        assert_eq!(value(&s, &learn(8, 64)), Some(760), "a leaking job is one observation of 21");
        for _ in 0..1000 {
            observe(&mut s, 1900, 0);
        }
        assert_eq!(s.len(), KEPT);
        assert_eq!(value(&s, &learn(8, 64)), Some(1900), "the window forgot the old stack");
    }
}
