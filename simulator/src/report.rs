//! Summaries of simulation outcomes: a table with ratios against the
//! `exclusive` baseline, CSV and JSON.

use crate::engine::{Outcome, mean, percentile};
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub policy: String,
    pub makespan_s: f64,
    pub mean_jct_s: f64,
    pub p95_jct_s: f64,
    pub mean_wait_s: f64,
    pub p95_wait_s: f64,
    /// Time-averaged SM activity over all GPUs, 0–1.
    pub sm_activity: f64,
    /// Time-averaged allocated memory per GPU, GiB.
    pub memory_gib: f64,
    pub energy_kwh: f64,
    pub ooms: u32,
    pub recoveries: u32,
    pub unplaceable: usize,
    pub max_jobs_per_gpu: u32,
    /// Finished jobs' slowdowns: run time against run time alone.
    pub job_slowdown_p50: f64,
    pub job_slowdown_p95: f64,
    pub job_slowdown_max: f64,
    /// Shared placements of jobs their node had no profile of.
    pub unprofiled: u32,
}

pub fn summarize(o: &Outcome) -> Summary {
    let (jct, waits, slow) = (o.jct(), o.waits(), o.job_slowdowns());
    Summary {
        policy: o.policy.name().to_string(),
        makespan_s: o.makespan_s,
        mean_jct_s: mean(&jct),
        p95_jct_s: percentile(&jct, 0.95),
        mean_wait_s: mean(&waits),
        p95_wait_s: percentile(&waits, 0.95),
        sm_activity: o.mean_sm(),
        memory_gib: mean(&o.gpu_mem_mib) / 1024.0,
        energy_kwh: o.energy_j / 3.6e6,
        ooms: o.ooms,
        recoveries: o.recoveries,
        unplaceable: o.jobs.iter().filter(|j| j.rejected).count(),
        max_jobs_per_gpu: o.max_jobs_per_gpu.iter().copied().max().unwrap_or(0),
        job_slowdown_p50: percentile(&slow, 0.5),
        job_slowdown_p95: percentile(&slow, 0.95),
        job_slowdown_max: slow.iter().copied().fold(0.0, f64::max),
        unprofiled: o.unprofiled,
    }
}

/// `x` against `base` as a signed percentage (`-` without a base).
pub fn pct(x: f64, base: f64) -> String {
    if base == 0.0 { "-".into() } else { format!("{:+.1}%", (x / base - 1.0) * 100.0) }
}

/// A Markdown table; with an `exclusive` row, changes against it follow.
pub fn table(rows: &[Summary]) -> String {
    let mut s = String::from(
        "| policy | makespan (h) | mean JCT (h) | p95 JCT (h) | mean wait (h) | p95 wait (h) | SM activity | memory (GiB/GPU) | energy (kWh) | OOMs | max jobs/GPU | job slowdown p50 / p95 / max |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1}% | {:.1} | {:.2} | {} | {} | {:.2} / {:.2} / {:.2} |\n",
            r.policy,
            r.makespan_s / 3600.0,
            r.mean_jct_s / 3600.0,
            r.p95_jct_s / 3600.0,
            r.mean_wait_s / 3600.0,
            r.p95_wait_s / 3600.0,
            r.sm_activity * 100.0,
            r.memory_gib,
            r.energy_kwh,
            r.ooms,
            r.max_jobs_per_gpu,
            r.job_slowdown_p50,
            r.job_slowdown_p95,
            r.job_slowdown_max
        ));
    }
    if let Some(base) = rows.iter().find(|r| r.policy == "exclusive") {
        s.push_str("\n| policy | makespan vs exclusive | mean JCT | mean wait | SM activity | energy |\n|---|---|---|---|---|---|\n");
        for r in rows.iter().filter(|r| r.policy != "exclusive") {
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} |\n",
                r.policy,
                pct(r.makespan_s, base.makespan_s),
                pct(r.mean_jct_s, base.mean_jct_s),
                pct(r.mean_wait_s, base.mean_wait_s),
                pct(r.sm_activity, base.sm_activity),
                pct(r.energy_kwh, base.energy_kwh)
            ));
        }
    }
    s
}

pub fn csv(rows: &[Summary]) -> String {
    let mut s = String::from(
        "policy,makespan_s,mean_jct_s,p95_jct_s,mean_wait_s,p95_wait_s,sm_activity,memory_gib,energy_kwh,ooms,recoveries,unplaceable,max_jobs_per_gpu,job_slowdown_p50,job_slowdown_p95,job_slowdown_max,unprofiled\n",
    );
    for r in rows {
        s.push_str(&format!(
            "{},{:.1},{:.1},{:.1},{:.1},{:.1},{:.4},{:.2},{:.3},{},{},{},{},{:.3},{:.3},{:.3},{}\n",
            r.policy,
            r.makespan_s,
            r.mean_jct_s,
            r.p95_jct_s,
            r.mean_wait_s,
            r.p95_wait_s,
            r.sm_activity,
            r.memory_gib,
            r.energy_kwh,
            r.ooms,
            r.recoveries,
            r.unplaceable,
            r.max_jobs_per_gpu,
            r.job_slowdown_p50,
            r.job_slowdown_p95,
            r.job_slowdown_max,
            r.unprofiled
        ));
    }
    s
}
