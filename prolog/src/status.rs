//! `carma status`: GPUs, live memory, SM activity, promises and jobs.

use carma_placement::policy::{effective_free_mib, promised_mib};
use carma_placement::{GpuReading, LinuxProcesses, NodeState, Processes};
use serde_json::json;
use std::collections::HashMap;

fn owners(gpus: &[GpuReading], state: &NodeState) -> HashMap<u32, u32> {
    let pids: Vec<u32> = gpus.iter().flat_map(|g| g.processes.iter().map(|p| p.pid)).collect();
    let holders: Vec<u32> = state.reservations.iter().flat_map(|r| r.holders.iter().copied()).collect();
    LinuxProcesses.owners(&pids, &holders)
}

pub fn table(gpus: &[GpuReading], state: &NodeState) -> String {
    let owners = owners(gpus, state);
    let mut out = format!(
        "{:<4} {:<14} {:>8} {:>8} {:>9} {:>9} {:>5}  {}\n",
        "GPU", "UUID", "USED", "TOTAL", "PROMISED", "EFF.FREE", "SM", "JOBS (id:policy:reserve)"
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
            "{:<4} {:<14} {:>7}M {:>7}M {:>8}M {:>8}M {:>5.2}  {}\n",
            g.index,
            g.uuid.chars().take(14).collect::<String>(),
            g.used_mib,
            g.total_mib,
            promised_mib(g, state, &owners),
            effective_free_mib(g, state, &owners),
            g.sm_activity,
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
            "processes": g.processes,
            "jobs": state.reservations.iter().filter(|r| r.gpus.contains(&g.index)).map(|r| r.job).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "reservations": state.reservations,
        "rr_cursor": state.rr_cursor,
    })
}
