//! The learned fixed memory: the part of every estimate that belongs to the
//! software stack (CUDA context, cuBLAS/cuDNN, the framework), not to the
//! model. It differs by stack (700 MiB in the CARMA paper's data, ~1 GiB
//! for PyTorch 2.11 on an H100, ~1.9 GB in other published sets) and no
//! estimator can know it. Each finished job whose estimate came from its
//! model says how far its observed peak went past the model part; a high
//! quantile of a user's latest such observations (by default their
//! largest) is that user's learned value.
//!
//! Whose jobs move what: the model part comes from `CARMA_ESTIMATE`, which
//! srun/sbatch set as the user, so a user can forge it. A user's
//! observations therefore set only that user's value; other users get the
//! node's value, the largest value that more than half of the node's users
//! (at least two) have learned. One user can move that only within the
//! span of the other users' values (docs/estimator.md).
//!
//! Why it cannot drift low: it is used only where it is larger than the
//! fixed part a job's estimate already carries (carma.yaml's
//! `estimator.runtime`), so learning only ever raises an estimate. Why it
//! cannot run away: the value is capped by `learn_runtime.max`, and only
//! the user's latest `window` jobs count, so a job that leaked raises only
//! its own user's estimates, and only until `window` more of their jobs
//! ended (below the quantile, with a quantile under 1, it moves nothing).

use carma_config::LearnRuntime;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Observations kept per user (the largest allowed window).
pub const KEPT: usize = 256;
/// Users whose observations a node keeps; beyond, the one whose latest
/// job ended longest ago is forgotten.
pub const USERS_KEPT: usize = 64;

/// One user's observations on this node, oldest first.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct UserRuntime {
    pub samples: Vec<u64>,
    /// When its latest observation came, in the node's order of
    /// observations (for forgetting the least recently seen user).
    #[serde(default)]
    pub last: u64,
}

/// The node's observations by uid (the job's user as Slurm says it).
pub type ByUser = BTreeMap<u32, UserRuntime>;

/// Where the fixed part a job got came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Whose {
    /// The job's user's own finished jobs.
    User,
    /// The node's value over its users.
    Node,
}

impl Whose {
    pub fn as_str(self) -> &'static str {
        match self {
            Whose::User => "user",
            Whose::Node => "node",
        }
    }
}

/// Records one finished job of `uid`: its observed per-GPU peak less the
/// model part of its estimate (0 where the model part alone covered it).
pub fn observe(by_user: &mut ByUser, uid: u32, peak_mib: u64, model_mib: u64) {
    let tick = by_user.values().map(|u| u.last).max().unwrap_or(0) + 1;
    let u = by_user.entry(uid).or_default();
    u.samples.push(peak_mib.saturating_sub(model_mib));
    let over = u.samples.len().saturating_sub(KEPT);
    u.samples.drain(..over);
    u.last = tick;
    while by_user.len() > USERS_KEPT {
        let oldest = by_user.iter().min_by_key(|(_, u)| u.last).map(|(&k, _)| k);
        oldest.map(|k| by_user.remove(&k));
    }
}

/// One user's learned value, once `min_jobs` observations are in the
/// window: the `quantile` of the latest `window` (nearest rank), at most `max`.
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

/// The node's value: the largest that more than half of the users with a
/// learned value reach, once at least two users have one. Raising one
/// user's value changes how many users reach any figure by at most one, so
/// no single user can take it above the other users' values.
pub fn node_value(by_user: &ByUser, learn: &LearnRuntime) -> Option<u64> {
    let mut values: Vec<u64> = by_user.values().filter_map(|u| value(&u.samples, learn)).collect();
    if values.len() < 2 {
        return None;
    }
    values.sort_unstable_by(|a, b| b.cmp(a));
    Some(values[values.len() / 2])
}

/// The fixed part for a job of `uid`: the user's own learned value, else
/// the node's; with where it came from.
pub fn for_user(by_user: &ByUser, uid: Option<u32>, learn: &LearnRuntime) -> Option<(u64, Whose)> {
    let own = uid.and_then(|u| by_user.get(&u)).and_then(|u| value(&u.samples, learn));
    match own {
        Some(v) => Some((v, Whose::User)),
        None => node_value(by_user, learn).map(|v| (v, Whose::Node)),
    }
}

/// The learned value for a job of `uid` where it exceeds the fixed part
/// `runtime_mib` that the job's estimate carries (the only case in which
/// it changes anything).
pub fn raise(by_user: &ByUser, uid: Option<u32>, learn: &LearnRuntime, runtime_mib: u64) -> Option<(u64, Whose)> {
    for_user(by_user, uid, learn).filter(|&(v, _)| v > runtime_mib)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The upper quartile: the quantile's own rules.
    fn learn(min_jobs: u32, window: u32) -> LearnRuntime {
        LearnRuntime { min_jobs, window, quantile: 0.75, ..LearnRuntime::default() }
    }

    /// The default is the largest of the user's latest 32: a later job
    /// is short only where its fixed part is more than any of theirs
    /// showed. A leaking job raises that user's value (to the cap) until
    /// 32 more of their jobs ended, and nobody else's.
    #[test]
    fn the_default_is_the_largest_of_the_users_latest_jobs() {
        let d = LearnRuntime::default();
        let mut m = ByUser::new();
        for (peak, model) in [(2900, 2000), (3500, 2000), (2100, 1000), (1500, 1000)] {
            observe(&mut m, 7, peak, model);
        }
        assert_eq!(for_user(&m, Some(7), &d), Some((1500, Whose::User)), "the largest of 900, 1500, 1100, 500");
        for uid in [1, 2] {
            for _ in 0..3 {
                observe(&mut m, uid, 2000, 1000);
            }
        }
        observe(&mut m, 7, 40_000, 1000);
        assert_eq!(for_user(&m, Some(7), &d), Some((d.max_mib, Whose::User)), "capped");
        assert_eq!(for_user(&m, Some(1), &d), Some((1000, Whose::User)));
        assert_eq!(for_user(&m, Some(3), &d), Some((1000, Whose::Node)), "the other users' value");
        for _ in 0..d.window {
            observe(&mut m, 7, 2000, 1000);
        }
        assert_eq!(for_user(&m, Some(7), &d), Some((1000, Whose::User)), "the leak forgotten");
    }

    fn samples(by_user: &ByUser, uid: u32) -> Vec<u64> {
        by_user[&uid].samples.clone()
    }

    #[test]
    fn a_high_quantile_of_the_latest_window_once_enough_jobs_ended() {
        let mut m = ByUser::new();
        for (peak, model) in [(5000, 4000), (900, 3000), (2700, 1000), (1800, 1000)] {
            observe(&mut m, 7, peak, model);
        }
        let s = samples(&m, 7);
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
        assert_eq!(raise(&m, Some(7), &learn(4, 64), 700), Some((1000, Whose::User)));
        assert_eq!(raise(&m, Some(7), &learn(4, 64), 1000), None);
    }

    #[test]
    fn one_outlier_does_not_move_it_and_the_state_stays_bounded() {
        let mut m = ByUser::new();
        for _ in 0..20 {
            observe(&mut m, 7, 1760, 1000);
        }
        observe(&mut m, 7, 40_000, 1000);
        assert_eq!(value(&samples(&m, 7), &learn(8, 64)), Some(760), "a leaking job is one observation of 21");
        for _ in 0..1000 {
            observe(&mut m, 7, 1900, 0);
        }
        assert_eq!(samples(&m, 7).len(), KEPT);
        assert_eq!(value(&samples(&m, 7), &learn(8, 64)), Some(1900), "the window forgot the old stack");
        for uid in 100..100 + USERS_KEPT as u32 {
            observe(&mut m, uid, 1000, 0);
        }
        assert_eq!(m.len(), USERS_KEPT);
        assert!(!m.contains_key(&7), "the user seen longest ago is forgotten first");
    }

    /// One user's forged estimates (a model part of 0, so every peak
    /// observes in full) move that user's value only; the node's value
    /// needs more than half of its users.
    #[test]
    fn one_users_jobs_do_not_move_other_users_values() {
        let l = learn(3, 64);
        let mut m = ByUser::new();
        for uid in [1, 2, 3] {
            for _ in 0..4 {
                observe(&mut m, uid, 5000, 4000);
            }
        }
        let before: Vec<_> = [1, 2, 3, 4].iter().map(|&u| for_user(&m, Some(u), &l)).collect();
        assert_eq!(before[3], Some((1000, Whose::Node)), "a user with no jobs gets the node's value");
        for _ in 0..48 {
            observe(&mut m, 666, 60_000, 0);
        }
        assert_eq!(for_user(&m, Some(666), &l), Some((l.max_mib, Whose::User)), "the forger raised their own");
        let after: Vec<_> = [1, 2, 3, 4].iter().map(|&u| for_user(&m, Some(u), &l)).collect();
        assert_eq!(before, after, "nobody else's fixed part moved");
        // Alone on a node, a user's value is never the node's.
        let mut alone = ByUser::new();
        for _ in 0..48 {
            observe(&mut alone, 666, 60_000, 0);
        }
        assert_eq!(for_user(&alone, Some(1), &l), None);
        assert_eq!(node_value(&alone, &l), None);
        // With two forgers among three honest users the node's value is
        // still one the honest users reached.
        for _ in 0..48 {
            observe(&mut m, 667, 60_000, 0);
        }
        assert_eq!(node_value(&m, &l), Some(1000));
    }
}
