//! `carma status`: GPUs, live memory, SM activity, busy time, promises and
//! jobs; `carma place --dry-run`: where a job would go now, and why not
//! elsewhere, from the plugin's own precondition and policy code.

use carma_config::EstimatorConfig;
use carma_placement::policy::{Choice, Demand, NoFit, Params, assess, choose, effective_free_mib, promised_mib};
use carma_placement::{GpuReading, LinuxProcesses, NodeState, Processes};
use serde_json::json;
use std::collections::HashMap;

fn owners(gpus: &[GpuReading], state: &NodeState) -> HashMap<u32, u32> {
    LinuxProcesses.owners_on(gpus, state)
}

/// Drops from the readings processes that ended between the reading and
/// the /proc walk that attributes them (their memory is freed as a process
/// exits): shown, they would count once as used and once more inside their
/// job's promise. Placement keeps them, erring on the safe side.
pub fn settle(mut gpus: Vec<GpuReading>, state: &NodeState) -> Vec<GpuReading> {
    let owners = owners(&gpus, state);
    for g in &mut gpus {
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut g.processes)
            .into_iter()
            .partition(|p| !owners.contains_key(&p.pid) && !carma_placement::procs::alive(p.pid));
        g.used_mib = g.used_mib.saturating_sub(gone.iter().map(|p| p.used_mib).sum());
        g.processes = kept;
    }
    gpus
}

pub fn table(gpus: &[GpuReading], state: &NodeState) -> String {
    let owners = owners(gpus, state);
    let mut out = format!(
        "{:<4} {:<14} {:>8} {:>8} {:>9} {:>9} {:>5} {:>5}  {}\n",
        "GPU", "UUID", "USED", "TOTAL", "PROMISED", "EFF.FREE", "SM", "BUSY", "JOBS (id:policy:reserve)"
    );
    for g in gpus {
        let jobs: Vec<String> = state
            .reservations
            .iter()
            .filter(|r| r.gpus.contains(&g.index))
            .map(|r| {
                let policy = r.policy.map(|p| p.name()).unwrap_or("slurm-whole");
                let excl = if r.exclusive { ":excl" } else { "" };
                format!("{}:{policy}:{}M{excl}", r.job, r.estimate_mib)
            })
            .collect();
        out.push_str(&format!(
            "{:<4} {:<14} {:>7}M {:>7}M {:>8}M {:>8}M {:>5.2} {:>5.2}  {}\n",
            g.index,
            g.uuid.chars().take(14).collect::<String>(),
            g.used_mib,
            g.total_mib,
            promised_mib(g, state, &owners),
            effective_free_mib(g, state, &owners),
            g.sm_activity,
            g.busy,
            if jobs.is_empty() { "-".into() } else { jobs.join(" ") }
        ));
    }
    out
}

pub fn to_json(gpus: &[GpuReading], state: &NodeState) -> serde_json::Value {
    let owners = owners(gpus, state);
    json!({
        "gpus": gpus.iter().map(|g| json!({
            "index": g.index,
            "uuid": g.uuid,
            "total_mib": g.total_mib,
            "used_mib": g.used_mib,
            "promised_mib": promised_mib(g, state, &owners),
            "effective_free_mib": effective_free_mib(g, state, &owners),
            "sm_activity": g.sm_activity,
            "busy": g.busy,
            "sm_occupancy": g.sm_occupancy,
            "mps_uid": g.mps_uid,
            "power_w": g.power_w,
            "processes": g.processes,
            "jobs": state.reservations.iter().filter(|r| r.gpus.contains(&g.index)).map(|r| r.job).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "reservations": state.reservations,
        "rr_cursor": state.rr_cursor,
    })
}

/// The node's fixed memory per job (the stack's part of model-based
/// estimates), configured and learned: a line and JSON.
pub fn runtime(est: &EstimatorConfig, state: &NodeState) -> (String, serde_json::Value) {
    let l = &est.learn_runtime;
    let seen = state.runtime_samples.len().min(l.window as usize);
    let learned = carma_placement::learned::value(&state.runtime_samples, l);
    let configured = est.runtime_mib;
    let line = match learned {
        _ if l.min_jobs == 0 => format!("runtime: {configured} MiB (estimator.runtime; learning off)"),
        None => {
            format!("runtime: {configured} MiB (estimator.runtime); learning: {seen} of {} jobs observed", l.min_jobs)
        }
        Some(v) if v > configured => format!(
            "runtime: {v} MiB learned from {seen} jobs (quantile {} of the latest {}), used in place of estimator.runtime {configured} MiB",
            l.quantile, l.window
        ),
        Some(v) => {
            format!("runtime: {configured} MiB (estimator.runtime); learned {v} MiB from {seen} jobs, not above it")
        }
    };
    let v =
        json!({"configured_mib": configured, "learned_mib": learned, "observed_jobs": seen, "min_jobs": l.min_jobs});
    (line, v)
}

/// The precondition in force, as one line: `precondition: sm <= 0.80, headroom 2048 MiB`.
pub fn precondition(p: &Params) -> String {
    format!("precondition: {} <= {:.2} (activity_metric), headroom {} MiB", p.metric, p.cap(), p.headroom_mib)
}

/// Where `demand` would be placed now and every GPU's verdict. Works on a
/// copy of the state: nothing is reserved or written.
pub fn dry_run(gpus: &[GpuReading], state: &NodeState, demand: &Demand, p: &Params) -> (Result<Choice, NoFit>, String) {
    let owners = owners(gpus, state);
    let (_, _, reasons) = assess(gpus, state, demand, p, &owners);
    let decision = choose(gpus, &mut state.clone(), demand, p, &owners);
    let chosen: &[u32] = decision.as_ref().map(|c| c.gpus.as_slice()).unwrap_or(&[]);
    let mut out = String::new();
    for (g, (index, why)) in gpus.iter().zip(&reasons) {
        let reading = format!(
            "{} {:.2}, effective free {} MiB",
            p.metric.label(),
            g.activity(p.metric),
            effective_free_mib(g, state, &owners)
        );
        let verdict = match why {
            Some(r) => format!("no: {r}"),
            None if chosen.contains(index) => format!("chosen ({reading})"),
            None => format!("qualifies, ranked after the chosen ({reading})"),
        };
        out.push_str(&format!("GPU{index}: {verdict}\n"));
    }
    (decision, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use carma_placement::GpuProcess;

    #[test]
    fn processes_gone_since_the_reading_are_not_shown_as_using_memory() {
        let me = std::process::id();
        // Beyond any pid_max: no such process.
        let gone = 4_000_000;
        let g = GpuReading {
            index: 0,
            uuid: "GPU-0".into(),
            minor: None,
            total_mib: 40960,
            used_mib: 3000,
            sm_activity: 0.0,
            busy: 0.0,
            processes: vec![GpuProcess { pid: me, used_mib: 1000 }, GpuProcess { pid: gone, used_mib: 2000 }],
            power_w: None,
            mps_uid: None,
            sm_occupancy: None,
        };
        let s = settle(vec![g], &NodeState::default());
        assert_eq!(s[0].used_mib, 1000);
        assert_eq!(s[0].processes, vec![GpuProcess { pid: me, used_mib: 1000 }], "a live process stays");
    }
}
