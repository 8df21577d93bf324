//! What each job does to a GPU alone (its profile), learned from the
//! readings of windows in which it ran alone: the slowdown guard's input.

use super::{Params, by_gpu, seen_ms};
use crate::gpu::GpuReading;
use crate::slowdown::Profile;
use crate::state::{Holding, NodeState, Reservation};
use carma_config::Sharing;
use std::collections::HashMap;

/// Learns what jobs do to a GPU alone. A job (a CARMA reservation) is alone
/// while it is the only one on each of its GPUs and every process there is
/// its own (an MPS server is NVIDIA's, not a job's); it is timed from when
/// it was first seen so (`alone_since`): its start-up before its first
/// process, and a neighbour that just left, are not what it does. Once the
/// readings' window holds only that time and is at least
/// `profile_after_secs` long, its profile, and its key's, rise to the GPUs'
/// readings; every running job of the key gets the key's profile. Profiles
/// only rise: a quiet window is not evidence that a job is light. Returns
/// how many reservations' profiles or `alone_since` changed.
pub fn learn_profiles(state: &mut NodeState, gpus: &[GpuReading], owners: &HashMap<u32, u32>, p: &Params) -> usize {
    let after_ms = p.window_secs.max(p.profile_after_secs).saturating_mul(1000);
    let readings: Vec<(usize, Option<Profile>)> = {
        let on = by_gpu(gpus, state);
        let ours =
            state.reservations.iter().enumerate().filter(|(_, r)| r.holding == Holding::Carma && !r.holders.is_empty());
        ours.map(|(i, r)| (i, alone_reading(r, gpus, &on, owners, p))).collect()
    };
    let mut changed = 0;
    let mut seen: Vec<(usize, Profile)> = Vec::new();
    for (i, reading) in readings {
        let r = &mut state.reservations[i];
        let since = match (reading, r.alone_since) {
            (None, None) => continue,
            (None, Some(_)) => {
                r.alone_since = None;
                changed += 1;
                continue;
            }
            (Some(_), None) => {
                r.alone_since = Some(p.now_secs);
                changed += 1;
                // Readings of no window (the trace simulator's exact ones)
                // show it alone at once.
                if after_ms > 0 {
                    continue;
                }
                p.now_secs
            }
            (Some(_), Some(t)) => t,
        };
        if let Some(now) = reading.filter(|_| seen_ms(since, p) >= after_ms) {
            seen.push((i, now));
        }
    }
    for (i, now) in seen {
        let r = &mut state.reservations[i];
        let raised = r.profile.map_or(now, |p| p.max(now));
        if r.profile != Some(raised) {
            r.profile = Some(raised);
            changed += 1;
        }
        if let Some(key) = r.profile_key.clone() {
            state.remember_profile(&key, raised);
            // The key's other running jobs are the same job: they take it too.
            let learned = state.profiles.get(&key).copied().unwrap_or(raised);
            for o in state.reservations.iter_mut().filter(|o| o.profile_key.as_deref() == Some(key.as_str())) {
                let up = o.profile.map_or(learned, |p| p.max(learned));
                if o.profile != Some(up) {
                    o.profile = Some(up);
                    changed += 1;
                }
            }
        }
    }
    changed
}

/// What `r`'s GPUs read while it runs alone on them (the larger of each
/// reading over its GPUs, an MPS client's taken back to a plain process's),
/// or `None` where it is not alone on every one of them.
fn alone_reading(
    r: &Reservation,
    gpus: &[GpuReading],
    on: &[Vec<&Reservation>],
    owners: &HashMap<u32, u32>,
    p: &Params,
) -> Option<Profile> {
    let mut reading: Option<Profile> = None;
    for (g, on) in gpus.iter().zip(on).filter(|(g, _)| r.gpus.contains(&g.index)) {
        let mine = |pid: &u32| owners.get(pid).is_some_and(|h| r.holders.contains(h));
        let mut jobs = job_processes(g).peekable();
        let alone = on.len() == 1 && jobs.peek().is_some() && jobs.all(|q| mine(&q.pid));
        if !alone {
            return None;
        }
        // An MPS client alone runs at 1/base of its plain pace and reads
        // that much less (resnet50 alone: 0.70 SM under MPS, 0.825
        // plainly); profiles are plain processes' (the model's input).
        let scale = if r.mps_uid.is_some() && p.sharing == Sharing::Mps { p.model().base } else { 1.0 };
        let here = Profile { busy: g.busy * scale, sm: g.sm_activity * scale }.clamped();
        reading = Some(reading.map_or(here, |r| r.max(here)));
    }
    reading
}

/// The GPU's processes that are jobs': all but its MPS server.
pub(super) fn job_processes(g: &GpuReading) -> impl Iterator<Item = &crate::gpu::GpuProcess> {
    g.processes.iter().filter(move |q| Some(q.pid) != g.mps_server_pid)
}
