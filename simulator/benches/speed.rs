//! Simulation speed: the paper's two 60-job traces under all six policies,
//! and a synthetic 100,000-job trace on 128 nodes x 8 GPUs (magm).
//! Targets: both traces well under a second; the large one under a minute.
//! Run: cargo bench -p carma-simulator --bench speed

use carma_config::{ActivityMetric, GpuOwner, Policy};
use carma_placement::Params;
use carma_simulator::{Admission, Assumptions, Cluster, Estimator, SimConfig, read_trace, read_workloads, simulate};
use std::path::PathBuf;
use std::time::Instant;

fn cfg(cluster: Cluster, policy: Policy, sample_s: f64) -> SimConfig {
    SimConfig {
        cluster,
        policy,
        estimator: Estimator::Oracle,
        params: Params::default(),
        assumptions: Assumptions { sample_s, ..Assumptions::default() },
        admission: Admission::Anywhere,
        gpu_owner: GpuOwner::Carma,
        least_loaded: false,
    }
}

fn main() {
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/carma");
    let w = read_workloads(&data.join("workloads.csv")).expect("workloads.csv");
    let one = Cluster::parse("1x4x40G").unwrap();
    let t = Instant::now();
    for name in ["trace_t1.csv", "trace_t2.csv"] {
        let trace = read_trace(&data.join(name)).unwrap();
        for p in Policy::ALL {
            simulate(&trace, &w, &cfg(one, p, 60.0)).unwrap();
        }
    }
    println!(
        "paper traces t1+t2, 6 policies each (12 runs): {:.3} s (target: well under 1 s)",
        t.elapsed().as_secs_f64()
    );

    // Synthetic: the paper's single-GPU workloads, shortened 10x, arriving
    // every 0.25 s on average (deterministic LCG): ~1,500 jobs want the
    // 1,024 GPUs at once, so placement, collocation and queueing all work.
    let (trace, short) = carma_simulator::input::synthetic(&w, 100_000, 0.25, 42);
    let big = Cluster { nodes: 128, gpus_per_node: 8, mem_mib: 40960 };
    // Time-sliced with the cap on busy time, the configuration that makes
    // collocation pay there (docs/simulation.md). With the cap on SM
    // activity a time-sliced GPU reads less SM activity the more jobs share
    // it, so jobs pile up to the memory limit (dozens per GPU here) and each
    // event touches them all: a different, slower regime.
    let mut c = cfg(big, Policy::Magm, 0.0);
    c.params.metric = ActivityMetric::Busy;
    let t = Instant::now();
    let o = simulate(&trace, &short, &c).unwrap();
    let done = o.jobs.iter().filter(|j| j.end_s.is_some()).count();
    println!(
        "synthetic 100,000 jobs on 128x8 GPUs (magm, time-sliced, cap on busy): {:.1} s (target < 60 s); {done} finished, makespan {:.1} h, {} OOMs",
        t.elapsed().as_secs_f64(),
        o.makespan_s / 3600.0,
        o.ooms
    );
}
