//! The state file's JSON: [`NodeState`]'s fields, plus whatever fields a
//! newer build added (each object's keys this build does not know are
//! collected by the flattened map and written back as read).

use super::{Counters, NodeState, Reservation, Unknown};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Deserialize)]
struct In {
    version: u32,
    #[serde(default)]
    last_gc_ms: u64,
    rr_cursor: u32,
    reservations: Vec<InReservation>,
    #[serde(default)]
    history: BTreeMap<String, u64>,
    #[serde(default)]
    history_used: BTreeMap<String, u64>,
    #[serde(default)]
    profiles: BTreeMap<String, crate::slowdown::Profile>,
    #[serde(default)]
    runtime_by_user: crate::learned::ByUser,
    #[serde(default)]
    runtime_samples: Vec<u64>,
    #[serde(default)]
    counters: Counters,
    #[serde(default)]
    step_parts: BTreeMap<u32, BTreeMap<u32, u64>>,
    #[serde(default)]
    batch_steps: BTreeMap<u32, u32>,
    #[serde(flatten)]
    unknown: Unknown,
}

#[derive(Deserialize)]
struct InReservation {
    #[serde(flatten)]
    known: Reservation,
    #[serde(flatten)]
    unknown: Unknown,
}

#[derive(Serialize)]
struct Out<'a> {
    version: u32,
    last_gc_ms: u64,
    rr_cursor: u32,
    reservations: Vec<OutReservation<'a>>,
    history: &'a BTreeMap<String, u64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    history_used: &'a BTreeMap<String, u64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    profiles: &'a BTreeMap<String, crate::slowdown::Profile>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    runtime_by_user: &'a crate::learned::ByUser,
    counters: &'a Counters,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    step_parts: &'a BTreeMap<u32, BTreeMap<u32, u64>>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    batch_steps: &'a BTreeMap<u32, u32>,
    #[serde(flatten)]
    unknown: &'a Unknown,
}

#[derive(Serialize)]
struct OutReservation<'a> {
    #[serde(flatten)]
    known: &'a Reservation,
    #[serde(flatten)]
    unknown: &'a Unknown,
}

impl<'de> Deserialize<'de> for NodeState {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<NodeState, D::Error> {
        let w = In::deserialize(d)?;
        let mut unknown_per_job = BTreeMap::new();
        let reservations = w
            .reservations
            .into_iter()
            .map(|r| {
                if !r.unknown.is_empty() {
                    unknown_per_job.insert(r.known.job, r.unknown);
                }
                r.known
            })
            .collect();
        Ok(NodeState {
            version: w.version,
            last_gc_ms: w.last_gc_ms,
            rr_cursor: w.rr_cursor,
            reservations,
            history: w.history,
            history_used: w.history_used,
            profiles: w.profiles,
            runtime_by_user: w.runtime_by_user,
            runtime_samples: w.runtime_samples,
            counters: w.counters,
            step_parts: w.step_parts,
            batch_steps: w.batch_steps,
            unknown: w.unknown,
            unknown_per_job,
        })
    }
}

impl Serialize for NodeState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let none = Unknown::new();
        Out {
            version: self.version,
            last_gc_ms: self.last_gc_ms,
            rr_cursor: self.rr_cursor,
            reservations: self
                .reservations
                .iter()
                .map(|r| OutReservation { known: r, unknown: self.unknown_per_job.get(&r.job).unwrap_or(&none) })
                .collect(),
            history: &self.history,
            history_used: &self.history_used,
            profiles: &self.profiles,
            runtime_by_user: &self.runtime_by_user,
            counters: &self.counters,
            step_parts: &self.step_parts,
            batch_steps: &self.batch_steps,
            unknown: &self.unknown,
        }
        .serialize(s)
    }
}
