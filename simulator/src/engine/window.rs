//! What a monitor's window means read: each GPU's instantaneous SM activity
//! and busy time, kept as steps in time, averaged over the window. A job
//! joining a time-sliced GPU slows the others at once, but the mean moves
//! only as the window takes the new readings in, and a job that ended stays
//! in it until the window has passed it.

use std::collections::VecDeque;

/// Per GPU slot: from each time on, the `(sm, busy)` read until the next.
pub(super) struct Windowed {
    steps: Vec<VecDeque<(f64, f64, f64)>>,
}

impl Windowed {
    pub(super) fn new(slots: usize) -> Windowed {
        Windowed { steps: vec![VecDeque::new(); slots] }
    }

    /// What `slot` reads from `t` on; steps the window of `window_s` has
    /// passed are dropped (the last of them still gives its start).
    pub(super) fn record(&mut self, slot: usize, t: f64, sm: f64, busy: f64, window_s: f64) {
        let s = &mut self.steps[slot];
        if s.back().is_some_and(|&(_, a, b)| a == sm && b == busy) {
            return;
        }
        if s.back().is_some_and(|&(at, _, _)| at >= t) {
            s.pop_back();
        }
        s.push_back((t, sm, busy));
        while s.len() > 1 && s[1].0 <= t - window_s {
            s.pop_front();
        }
    }

    /// Whether every GPU reads idle through the last `keep_s` seconds
    /// before `t`: only then can a job still waiting never start.
    pub(super) fn idle_through(&self, t: f64, keep_s: f64) -> bool {
        self.steps.iter().all(|s| match s.back() {
            None => true,
            Some(&(at, sm, busy)) => sm == 0.0 && busy == 0.0 && at <= t - keep_s,
        })
    }

    /// The `(sm, busy)` means over `[t - window_s, t]`; idle before the
    /// first step.
    pub(super) fn mean(&self, slot: usize, t: f64, window_s: f64) -> (f64, f64) {
        let from = t - window_s;
        let s = &self.steps[slot];
        let (mut sm, mut busy) = (0.0, 0.0);
        for (i, &(at, a, b)) in s.iter().enumerate() {
            let until = s.get(i + 1).map_or(t, |n| n.0).min(t);
            let span = until - at.max(from);
            if span > 0.0 {
                sm += a * span;
                busy += b * span;
            }
        }
        (sm / window_s, busy / window_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mean_takes_a_step_in_linearly_and_keeps_an_ended_one_a_window() {
        let mut w = Windowed::new(1);
        w.record(0, 10.0, 0.6, 1.0, 6.0);
        assert_eq!(w.mean(0, 10.0, 6.0), (0.0, 0.0));
        let (sm, busy) = w.mean(0, 13.0, 6.0);
        assert!((sm - 0.3).abs() < 1e-9 && (busy - 0.5).abs() < 1e-9, "{sm} {busy}");
        // A second job slows the first: the GPU reads 0.5 from 16 s on.
        w.record(0, 16.0, 0.5, 1.0, 6.0);
        let (sm, _) = w.mean(0, 19.0, 6.0);
        assert!((sm - 0.55).abs() < 1e-9, "{sm}");
        // Both end at 20 s; the window still holds them until 26 s.
        w.record(0, 20.0, 0.0, 0.0, 6.0);
        let (sm, _) = w.mean(0, 23.0, 6.0);
        assert!((sm - 0.25).abs() < 1e-9, "{sm}");
        assert_eq!(w.mean(0, 26.0, 6.0), (0.0, 0.0));
    }
}
