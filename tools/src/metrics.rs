//! carma-monitor's metrics in Prometheus' text format (version 0.0.4, which
//! `promtool check metrics` lints): per GPU what `carma status` shows, per
//! job on the node its reservation, estimate and observed peak, the node's
//! counters (placements, waits, no-fits by reason, OOM recoveries), the
//! estimates' accuracy as a histogram, and the monitor's own health.
//! Rendered once per sample by the sampling loop; the endpoint serves the
//! last page (tools/src/http.rs).

use carma_placement::policy::{effective_free_mib, promised_mib};
use carma_placement::source::published::Published;
use carma_placement::state::ACCURACY_BOUNDS;
use carma_placement::{LinuxProcesses, NodeState, Processes};
use std::fmt::Write;

const MIB: f64 = 1024.0 * 1024.0;

/// The monitor's own counts.
#[derive(Debug, Clone, Default)]
pub struct MonitorStats {
    pub reads: u64,
    pub read_errors: u64,
    /// Unix seconds of the last good read.
    pub last_read_s: f64,
}

/// A label value as the text format writes it.
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

struct Page(String);

impl Page {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.0.push_str(name);
        if !labels.is_empty() {
            let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", esc(v))).collect();
            let _ = write!(self.0, "{{{}}}", l.join(","));
        }
        if value.is_finite() {
            let _ = writeln!(self.0, " {value}");
        } else {
            let _ = writeln!(self.0, " NaN");
        }
    }
}

/// Reasons a step is not placed, always exported (0 until seen).
pub const NO_FIT_REASONS: [&str; 6] = ["memory", "activity", "held", "mps_user", "gpu_count", "slowdown"];

pub fn render(node: &str, p: &Published, st: &NodeState, m: &MonitorStats) -> String {
    let mut out = Page(String::with_capacity(8192));
    gpu_families(&mut out, p, st);
    job_families(&mut out, st);
    counter_families(&mut out, st);
    monitor_families(&mut out, node, p, m);
    out.0
}

/// Per GPU: what `carma status` shows.
fn gpu_families(out: &mut Page, p: &Published, st: &NodeState) {
    let owners = LinuxProcesses.owners_on(&p.gpus, st);
    let gpu_labels: Vec<(String, String)> = p.gpus.iter().map(|g| (g.index.to_string(), g.uuid.clone())).collect();
    let per_gpu = |out: &mut Page, name: &str, kind: &str, help: &str, f: &dyn Fn(usize) -> Option<f64>| {
        out.family(name, kind, help);
        for (i, (gpu, uuid)) in gpu_labels.iter().enumerate() {
            if let Some(v) = f(i) {
                out.sample(name, &[("gpu", gpu), ("uuid", uuid)], v);
            }
        }
    };
    let g = &p.gpus;
    per_gpu(out, "carma_gpu_memory_total_bytes", "gauge", "GPU memory.", &|i| Some(g[i].total_mib as f64 * MIB));
    per_gpu(out, "carma_gpu_memory_used_bytes", "gauge", "GPU memory in use (NVML).", &|i| {
        Some(g[i].used_mib as f64 * MIB)
    });
    per_gpu(
        out,
        "carma_gpu_memory_promised_bytes",
        "gauge",
        "GPU memory promised to CARMA jobs beyond what they use now.",
        &|i| Some(promised_mib(&g[i], st, &owners) as f64 * MIB),
    );
    per_gpu(
        out,
        "carma_gpu_memory_effective_free_bytes",
        "gauge",
        "Free GPU memory less promises: what a new job can be placed in.",
        &|i| Some(effective_free_mib(&g[i], st, &owners) as f64 * MIB),
    );
    per_gpu(out, "carma_gpu_sm_activity_ratio", "gauge", "SM activity, mean over the monitor window.", &|i| {
        Some(g[i].sm_activity)
    });
    per_gpu(
        out,
        "carma_gpu_busy_ratio",
        "gauge",
        "Share of time any kernel ran (NVML utilization.gpu), mean over the monitor window.",
        &|i| Some(g[i].busy),
    );
    per_gpu(out, "carma_gpu_sm_occupancy_ratio", "gauge", "SM occupancy (NVML GPM or DCGM), where measured.", &|i| {
        g[i].sm_occupancy
    });
    per_gpu(out, "carma_gpu_power_watts", "gauge", "Board power.", &|i| g[i].power_w);
    // CARMA jobs: its placements, and CARMA steps running in a GPU Slurm gave
    // their job whole (they join the prolog's record, as its holders); a
    // GPU Slurm gave a plain job is held, but by no CARMA job.
    per_gpu(out, "carma_gpu_jobs", "gauge", "CARMA jobs placed on the GPU.", &|i| {
        let carma =
            |r: &&carma_placement::Reservation| r.holding == carma_placement::Holding::Carma || !r.holders.is_empty();
        Some(st.reservations.iter().filter(carma).filter(|r| r.gpus.contains(&g[i].index)).count() as f64)
    });
}

/// Per job on the node: its reservation, estimate, observed peak and mode.
fn job_families(out: &mut Page, st: &NodeState) {
    out.family("carma_job_reserved_bytes", "gauge", "GPU memory reserved for a job on a GPU of this node.");
    for r in &st.reservations {
        let job = r.job.to_string();
        for gpu in &r.gpus {
            out.sample(
                "carma_job_reserved_bytes",
                &[("jobid", &job), ("gpu", &gpu.to_string())],
                r.reserved_mib as f64 * MIB,
            );
        }
    }
    out.family("carma_job_estimate_bytes", "gauge", "A job's GPU memory estimate per GPU, and where it came from.");
    for r in &st.reservations {
        let job = r.job.to_string();
        out.sample(
            "carma_job_estimate_bytes",
            &[("jobid", &job), ("source", &r.estimate_source)],
            r.reserved_mib as f64 * MIB,
        );
    }
    out.family("carma_job_observed_peak_bytes", "gauge", "Highest per-GPU memory a job's processes were seen using.");
    for r in &st.reservations {
        out.sample("carma_job_observed_peak_bytes", &[("jobid", &r.job.to_string())], r.observed_mib as f64 * MIB);
    }
    out.family(
        "carma_job_profile",
        "gauge",
        "What a job did to a GPU alone (busy time, SM activity), as learned; absent until it ran alone.",
    );
    for r in &st.reservations {
        if let Some(p) = r.profile {
            let job = r.job.to_string();
            out.sample("carma_job_profile", &[("jobid", &job), ("reading", "busy")], p.busy);
            out.sample("carma_job_profile", &[("jobid", &job), ("reading", "sm")], p.sm);
        }
    }
    out.family("carma_profiles_learned", "gauge", "Job profiles (per user and job signature) this node has learned.");
    out.sample("carma_profiles_learned", &[], st.profiles.len() as f64);
    out.family("carma_job_info", "gauge", "A job placed on this node: its policy and sharing mode (value 1).");
    for r in &st.reservations {
        let policy = r.policy.map(|p| p.name()).unwrap_or("slurm-whole");
        let sharing = if r.exclusive {
            "exclusive"
        } else if r.mps_uid.is_some() {
            "mps"
        } else {
            "timeslice"
        };
        let job = r.job.to_string();
        out.sample("carma_job_info", &[("jobid", &job), ("policy", policy), ("sharing", sharing)], 1.0);
    }
}

/// The node's counters and the estimates' accuracy histogram.
fn counter_families(out: &mut Page, st: &NodeState) {
    let c = &st.counters;
    out.family("carma_placements_total", "counter", "Steps and jobs CARMA placed on this node.");
    out.sample("carma_placements_total", &[], c.placements as f64);
    out.family("carma_waits_total", "counter", "Steps that found no GPU at first and waited.");
    out.sample("carma_waits_total", &[], c.waits as f64);
    out.family("carma_no_fits_total", "counter", "Steps not placed, by the reason most GPUs were passed over.");
    for reason in NO_FIT_REASONS {
        out.sample("carma_no_fits_total", &[("reason", reason)], c.no_fits.get(reason).copied().unwrap_or(0) as f64);
    }
    out.family("carma_oom_recoveries_total", "counter", "Jobs requeued after running out of GPU memory.");
    out.sample("carma_oom_recoveries_total", &[], c.oom_recoveries as f64);

    let name = "carma_estimate_accuracy_ratio";
    out.family(name, "histogram", "Ended shared jobs' observed peak divided by their estimate.");
    let mut cumulative = 0u64;
    for (i, bound) in ACCURACY_BOUNDS.iter().enumerate() {
        cumulative += c.accuracy_buckets.get(i).copied().unwrap_or(0);
        out.sample(&format!("{name}_bucket"), &[("le", &bound.to_string())], cumulative as f64);
    }
    cumulative += c.accuracy_buckets.get(ACCURACY_BOUNDS.len()).copied().unwrap_or(0);
    out.sample(&format!("{name}_bucket"), &[("le", "+Inf")], cumulative as f64);
    out.sample(&format!("{name}_sum"), &[], c.accuracy_sum);
    out.sample(&format!("{name}_count"), &[], cumulative as f64);
}

/// The monitor's own health.
fn monitor_families(out: &mut Page, node: &str, p: &Published, m: &MonitorStats) {
    out.family("carma_monitor_reads_total", "counter", "GPU reads by carma-monitor.");
    out.sample("carma_monitor_reads_total", &[], m.reads as f64);
    out.family("carma_monitor_read_errors_total", "counter", "GPU reads that failed.");
    out.sample("carma_monitor_read_errors_total", &[], m.read_errors as f64);
    out.family(
        "carma_monitor_last_read_timestamp_seconds",
        "gauge",
        "When the GPUs were last read (time() minus this: staleness).",
    );
    out.sample("carma_monitor_last_read_timestamp_seconds", &[], m.last_read_s);
    out.family("carma_monitor_window_samples", "gauge", "Samples behind the window means.");
    out.sample("carma_monitor_window_samples", &[], f64::from(p.samples));
    out.family("carma_monitor_info", "gauge", "The monitor: its node and GPU source (value 1).");
    out.sample("carma_monitor_info", &[("node", node), ("source", &p.source)], 1.0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use carma_placement::GpuReading;
    use carma_placement::state::{Holding, Reservation};

    #[test]
    fn a_page_names_gpus_jobs_counters_and_the_histogram() {
        let gpu = GpuReading {
            index: 0,
            uuid: "GPU-\"odd\"".into(),
            minor: None,
            total_mib: 40960,
            used_mib: 1024,
            sm_activity: 0.25,
            busy: 0.5,
            processes: vec![],
            power_w: Some(120.0),
            mps_uid: None,
            sm_occupancy: None,
            mps_server_pid: None,
        };
        let p = Published {
            written_ms: 0,
            interval_ms: 1000,
            window_ms: 2000,
            source: "nvml".into(),
            samples: 2,
            gpus: vec![gpu.clone(), GpuReading { index: 1, uuid: "GPU-1".into(), ..gpu }],
        };
        let mut st = NodeState::default();
        st.reservations.push(Reservation {
            job: 42,
            gpus: vec![0],
            reserved_mib: 8192,
            estimate_source: "model".into(),
            exclusive: false,
            holding: Holding::Carma,
            policy: Some(carma_config::Policy::Magm),
            since: 1,
            holders: vec![],
            signature: None,
            observed_mib: 6000,
            mps_uid: None,
            model_mib: None,
            uid: None,
            profile: Some(carma_placement::slowdown::Profile { busy: 0.5, sm: 0.25 }),
            profile_key: None,
            alone_since: None,
        });
        st.profiles.insert("7:sig".into(), carma_placement::slowdown::Profile { busy: 0.5, sm: 0.25 });
        // Not a CARMA job: not counted in carma_gpu_jobs; a CARMA step in a
        // job Slurm gave the GPU whole is.
        st.reservations.push(Reservation::slurm_whole(43, vec![0], 1));
        st.reservations.push(Reservation { holders: vec![4242], ..Reservation::slurm_whole(44, vec![1], 1) });
        st.counters.placements = 3;
        st.counters.no_fit("memory");
        st.counters.observe_accuracy(0.95);
        st.counters.observe_accuracy(3.0);
        let page = render("node-a", &p, &st, &MonitorStats { reads: 5, read_errors: 1, last_read_s: 17.5 });
        for line in [
            "carma_gpu_memory_total_bytes{gpu=\"0\",uuid=\"GPU-\\\"odd\\\"\"} 42949672960",
            "carma_gpu_sm_activity_ratio{gpu=\"0\",uuid=\"GPU-\\\"odd\\\"\"} 0.25",
            "carma_gpu_jobs{gpu=\"0\",uuid=\"GPU-\\\"odd\\\"\"} 1",
            "carma_gpu_jobs{gpu=\"1\",uuid=\"GPU-1\"} 1",
            "carma_job_reserved_bytes{jobid=\"42\",gpu=\"0\"} 8589934592",
            "carma_job_estimate_bytes{jobid=\"42\",source=\"model\"} 8589934592",
            "carma_job_info{jobid=\"42\",policy=\"magm\",sharing=\"timeslice\"} 1",
            "carma_job_profile{jobid=\"42\",reading=\"busy\"} 0.5",
            "carma_job_profile{jobid=\"42\",reading=\"sm\"} 0.25",
            "carma_profiles_learned 1",
            "carma_no_fits_total{reason=\"slowdown\"} 0",
            "carma_placements_total 3",
            "carma_no_fits_total{reason=\"memory\"} 1",
            "carma_no_fits_total{reason=\"activity\"} 0",
            "carma_estimate_accuracy_ratio_bucket{le=\"0.9\"} 0",
            "carma_estimate_accuracy_ratio_bucket{le=\"1\"} 1",
            "carma_estimate_accuracy_ratio_bucket{le=\"2\"} 1",
            "carma_estimate_accuracy_ratio_bucket{le=\"+Inf\"} 2",
            "carma_estimate_accuracy_ratio_count 2",
            "carma_monitor_read_errors_total 1",
            "carma_monitor_info{node=\"node-a\",source=\"nvml\"} 1",
        ] {
            assert!(page.lines().any(|l| l == line), "missing {line}:\n{page}");
        }
        assert!(!page.contains("carma_gpu_sm_occupancy_ratio{"), "no occupancy measured: no sample");
        // The shipped Grafana dashboard queries only series this page has.
        let dashboard: serde_json::Value =
            serde_json::from_str(include_str!("../../slurm-conf-examples/grafana-carma.json")).unwrap();
        let mut names = 0;
        for t in dashboard["panels"].as_array().unwrap().iter().flat_map(|p| p["targets"].as_array().unwrap()) {
            let expr = t["expr"].as_str().unwrap();
            for word in
                expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| w.starts_with("carma_"))
            {
                names += 1;
                assert!(
                    page.lines().any(|l| l.starts_with(word)),
                    "the dashboard asks for {word}, which is not exported"
                );
            }
        }
        assert!(names >= 15, "{names}");
    }
}
