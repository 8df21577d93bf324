//! Ended jobs' observed peaks, remembered by signature (the `history`
//! estimate) and as observations of the node's fixed memory.

use super::{NodeState, Reservation};
use std::collections::BTreeMap;

/// Bounds the state file: beyond this, the least recently used signature
/// of the user with the most signatures is dropped.
pub const HISTORY_MAX: usize = 4096;

impl NodeState {
    /// Keeps an ended job's observed peak under its signature (the highest
    /// seen over its runs).
    /// Its peak less its model part is an observation of the node's fixed
    /// memory.
    pub(super) fn remember(&mut self, r: &Reservation) {
        if r.observed_mib == 0 {
            return;
        }
        // How far the estimate was from what the job used: shared
        // reservations only (an exclusive one holds the whole GPU).
        if !r.exclusive && r.reserved_mib > 0 {
            self.counters.observe_accuracy(r.observed_mib as f64 / r.reserved_mib as f64);
        }
        if let (Some(model), Some(uid)) = (r.model_mib, r.uid) {
            crate::learned::observe(&mut self.runtime_by_user, uid, r.observed_mib, model);
        }
        if let Some(sig) = &r.signature {
            self.remember_peak(sig, r.observed_mib);
        }
    }

    /// Raises the peak remembered under `sig` to `mib` (never lowers it).
    pub fn remember_peak(&mut self, sig: &str, mib: u64) {
        let e = self.history.entry(sig.to_string()).or_insert(0);
        *e = (*e).max(mib);
        self.touch_history(sig);
        while self.history.len() > HISTORY_MAX {
            match self.history_victim() {
                Some(k) => {
                    self.history.remove(&k);
                    self.history_used.remove(&k);
                }
                None => break,
            }
        }
    }

    /// Raises the profile learned under `key` to `seen` (each reading to
    /// the larger). Bounded like the history: past [`HISTORY_MAX`] keys,
    /// one of the user with the most is dropped.
    pub fn remember_profile(&mut self, key: &str, seen: crate::slowdown::Profile) {
        let e = self.profiles.entry(key.to_string()).or_insert(seen);
        *e = e.max(seen);
        while self.profiles.len() > HISTORY_MAX {
            let Some(victim) = of_busiest_user(self.profiles.keys()).find(|k| *k != key).cloned() else { break };
            self.profiles.remove(&victim);
        }
    }

    /// Marks `sig` as the most recently used signature.
    pub fn touch_history(&mut self, sig: &str) {
        let tick = self.history_used.values().max().copied().unwrap_or(0) + 1;
        self.history_used.insert(sig.to_string(), tick);
        // Uses of signatures trimmed since (or never kept) are not kept.
        let history = &self.history;
        self.history_used.retain(|k, _| history.contains_key(k));
    }

    /// The signature to drop from a full history: the least recently used
    /// of the user who has the most, so that one user's many signatures
    /// evict only that user's. Signatures are `uid:hash` (resolve.rs).
    fn history_victim(&self) -> Option<String> {
        let used = |k: &str| self.history_used.get(k).copied().unwrap_or(0);
        of_busiest_user(self.history.keys()).min_by_key(|k| used(k)).cloned()
    }
}

/// The keys (`uid:...`, resolve.rs) of the user who has the most of them:
/// a full store drops one of these, so one user's many keys evict only
/// that user's.
fn of_busiest_user<'a>(keys: impl Iterator<Item = &'a String> + Clone) -> impl Iterator<Item = &'a String> {
    fn owner(k: &str) -> &str {
        k.split_once(':').map_or("", |(uid, _)| uid)
    }
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for k in keys.clone() {
        *count.entry(owner(k)).or_insert(0) += 1;
    }
    let most = count.values().max().copied().unwrap_or(0);
    keys.filter(move |k| count.get(owner(k)) == Some(&most))
}
