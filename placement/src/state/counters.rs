//! What this node's placements came to, kept in the state file for
//! carma-monitor's counters.

use super::Unknown;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Upper bounds of the buckets of ended jobs' observed peak / estimate
/// (the last bucket, beyond 2.0, is +Inf).
pub const ACCURACY_BOUNDS: [f64; 9] = [0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0];

/// Counts since the state file was made; a rebuilt state starts them
/// again (Prometheus reads that as a counter reset).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Counters {
    /// Steps and jobs placed (shared or exclusive).
    #[serde(default)]
    pub placements: u64,
    /// Steps that found no GPU at first and waited.
    #[serde(default)]
    pub waits: u64,
    /// Steps that were not placed, by reason (memory, activity, held,
    /// mps_user, gpu_count).
    #[serde(default)]
    pub no_fits: BTreeMap<String, u64>,
    /// Jobs requeued after an out-of-memory crash.
    #[serde(default)]
    pub oom_recoveries: u64,
    /// Ended shared jobs by observed peak / estimate: one count per bucket
    /// of [`ACCURACY_BOUNDS`], then the +Inf bucket (not cumulative).
    #[serde(default)]
    pub accuracy_buckets: Vec<u64>,
    #[serde(default)]
    pub accuracy_sum: f64,
    /// Counters a newer build keeps, as read.
    #[serde(flatten)]
    pub unknown: Unknown,
}

impl Counters {
    /// Counts one ended job's observed peak / estimate.
    pub fn observe_accuracy(&mut self, ratio: f64) {
        if !ratio.is_finite() || ratio < 0.0 {
            return;
        }
        self.accuracy_buckets.resize(ACCURACY_BOUNDS.len() + 1, 0);
        let i = ACCURACY_BOUNDS.iter().position(|b| ratio <= *b).unwrap_or(ACCURACY_BOUNDS.len());
        self.accuracy_buckets[i] += 1;
        self.accuracy_sum += ratio;
    }

    pub fn no_fit(&mut self, reason: &str) {
        *self.no_fits.entry(reason.to_string()).or_insert(0) += 1;
    }
}
