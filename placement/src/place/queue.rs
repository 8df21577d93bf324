//! Launches that find the state lock taken: each queues its request and
//! waits for an answer or the lock; whoever holds the lock decides every
//! queued request in one state write (see [`crate::slots`]).

use super::{PlaceError, Placer};
use crate::clock::now_secs;
use crate::gpu::GpuReading;
use crate::policy::{NoFit, Params, learn_profiles, observe};
use crate::request::{Decision, Request, StepRef};
use crate::slots::{Answer, Refusal, RefusalCount, SlotRef, Slots};
use crate::state::{Locked, NodeState, StateError, StateStore};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Sleeps on the slot's wake-up word (bounded by `timeouts.lock`) until
/// the holder has decided for us, or the lock is ours to decide with.
pub(super) fn answer_or_lock<'a>(store: &'a StateStore, q: &Slots, slot: SlotRef) -> Result<Waited<'a>, PlaceError> {
    let start = Instant::now();
    let timeout = store.lock_timeout();
    loop {
        // Read before trying the lock: a release or an answer after
        // this read makes the wait below return at once.
        let seen = q.generation(slot);
        // The answer first: a holder answers before it releases, so a
        // launch woken by its answer would otherwise often find the lock
        // free and read the GPUs for nothing.
        if let Some(d) = q.take_answer(slot) {
            return Ok(Waited::Answered(d));
        }
        if let Some(lock) = store.try_exclusive()? {
            return Ok(Waited::Locked(lock));
        }
        let waited = start.elapsed();
        if waited >= timeout {
            if let Some(d) = q.withdraw(slot) {
                return Ok(Waited::Answered(d));
            }
            return Err(StateError::LockTimeout { path: store.lock_path(), waited }.into());
        }
        // The holder is most likely deciding for us: sleep until it
        // answers or releases (re-checking now and then, in case a
        // holder died between unlocking and waking us).
        q.wait(slot, seen, (timeout - waited).min(Duration::from_millis(20)));
    }
}

/// How a queued launch's wait ended.
pub(super) enum Waited<'a> {
    Answered(Answer),
    Locked(Locked<'a>),
}

/// What one round of decisions under the lock is made on: the readings,
/// whose processes belong to which holder, and the thresholds as of the
/// readings' time.
struct Round<'a> {
    readings: &'a [GpuReading],
    owners: &'a HashMap<u32, u32>,
    params: Params,
}

impl Placer {
    /// An answer another launch decided for us; a placement is checked
    /// against the job's Slurm GPUs: a holder of an older build ignores them.
    /// `counted`: a refusal's counter was bumped by its decider.
    pub(super) fn within_slurms(
        &self,
        step: StepRef,
        req: &Request,
        a: Answer,
        counted: &mut bool,
    ) -> Result<Decision, PlaceError> {
        let d = a.map_err(|r| {
            *counted = r.counted;
            PlaceError::NoFit(r.why)
        })?;
        match &req.within {
            Some(within) if !d.gpus.iter().all(|g| within.contains(g)) => {
                if let Err(e) = self.release(step) {
                    (self.log)(&format!(
                        "job {} step holder {}: giving back a foreign answer: {e}",
                        step.job, step.holder
                    ));
                }
                Err(PlaceError::OutsideSlurms { gpus: d.gpus, within: within.clone() })
            }
            _ => Ok(d),
        }
    }

    /// Under the exclusive lock (dead deciders' requests queued again, ours
    /// out of the queue): decides our request, then the queued
    /// ones in arrival order, writes the state, then answers them (placed
    /// or refused, with the reasons).
    /// Requests queued meanwhile are taken in further rounds.
    pub(super) fn decide_queued(
        &self,
        mut lock: Locked<'_>,
        step: StepRef,
        req: &Request,
        (readings, as_of_ms, read_before_lock): (&[GpuReading], Option<u64>, bool),
        count: Option<RefusalCount>,
        counted: &mut bool,
    ) -> Result<Decision, PlaceError> {
        let q = self.store.slots();
        let mut st = lock.load()?;
        self.collect(&mut st, false);
        let owners = self.processes.owners_on(readings, &st);
        observe(&mut st, readings, &owners);
        let params = Params { readings_ms: as_of_ms, ..self.params };
        learn_profiles(&mut st, readings, &owners, &Params { now_secs: now_secs(), ..params });
        // Every request of this round is decided on these readings.
        let round = Round { readings, owners: &owners, params };
        let mut gc_forced = false;
        let mine = self.decide(&mut st, step, req, &round, &mut gc_forced);
        if let Err(why) = &mine {
            // Ours is counted in this write too, once it stands.
            *counted = count_refusal(&mut st.counters, why, count);
        }
        let mut stored = false;
        let mut left = Vec::new();
        for _round in 0..4 {
            let Some(q) = q else { break };
            let taken = q.take_queued(&left, &*self.log);
            if taken.is_empty() {
                break;
            }
            let decided: Vec<_> = taken
                .into_iter()
                .map(|t| {
                    let answer = match self.decide(&mut st, t.step, &t.request, &round, &mut gc_forced) {
                        Ok(d) => Some(Ok(d)),
                        // Refusals too: decided again by its owner, each
                        // would pass the lock on its own, one after another.
                        // (One too large for its slot is left to its owner
                        // uncounted, below.)
                        // Not on readings taken before the lock (NVML read
                        // directly): safe for a placement (memory freed since
                        // still looks used), not for a refusal, which its
                        // owner decides again on its own read.
                        Err(why) if t.reads_refusals && !read_before_lock && Slots::refusal_fits(&why) => {
                            let counted = count_refusal(&mut st.counters, &why, t.count);
                            Some(Err(Refusal { why, counted }))
                        }
                        // An older build's: it decides again itself.
                        Err(_) => None,
                    };
                    (t.slot, answer)
                })
                .collect();
            if let Err(e) = lock.store(&st) {
                // Undecided after all: their owners try again themselves.
                decided.iter().for_each(|(s, _)| q.put_back(*s));
                if stored {
                    break; // ours is already written, its count with it
                }
                *counted = false;
                return Err(e.into());
            }
            stored = true;
            for (s, d) in decided {
                // Too large for the slot, or not for this owner: left to it
                // (not taken again this pass).
                match d {
                    Some(a) if q.answer(s, &a) => {}
                    Some(_) => left.push(s),
                    None => {
                        q.put_back(s);
                        left.push(s);
                    }
                }
            }
        }
        if !stored && let Err(e) = lock.store(&st) {
            *counted = false;
            return Err(e.into());
        }
        drop(lock);
        mine.map_err(PlaceError::NoFit)
    }

    /// One request against the state ([`crate::decide::decide`]), with
    /// garbage collection forced once before a refusal.
    fn decide(
        &self,
        st: &mut NodeState,
        step: StepRef,
        req: &Request,
        round: &Round<'_>,
        gc_forced: &mut bool,
    ) -> Result<Decision, NoFit> {
        let mut collect = |st: &mut NodeState| {
            if *gc_forced {
                return false;
            }
            *gc_forced = true;
            self.collect(st, true);
            true
        };
        let (readings, owners, params) = (round.readings, round.owners, &round.params);
        let d = crate::decide::decide(st, step, req, readings, owners, params, &self.learn, now_secs(), &mut collect);
        if d.is_ok() {
            st.counters.placements += 1;
        }
        d
    }
}

/// Bumps the counter `count` names for the refusal `why` (a node with fewer
/// GPUs than asked is a final refusal however long the step would wait).
/// Returns whether one was bumped.
fn count_refusal(counters: &mut crate::state::Counters, why: &NoFit, count: Option<RefusalCount>) -> bool {
    let Some(count) = count else { return false };
    if (why.reasons.len() as u32) < why.wanted || count == RefusalCount::NoFit {
        counters.no_fit(why.class());
    } else {
        counters.waits += 1;
    }
    true
}
