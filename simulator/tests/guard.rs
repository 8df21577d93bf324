//! The slowdown guard on the paper's traces, with carma.yaml's defaults:
//! where the node knows a job's profile, it runs no slower than the bound
//! (the simulated GPUs follow the model the guard predicts with); a job
//! placed before its node knew it runs no slower than the worst
//! case, 2x.

use carma_config::{GpuOwner, Policy};
use carma_placement::Params;
use carma_simulator::{Admission, Assumptions, Cluster, Estimator, SimConfig, apply_activity, read_solo_readings};
use carma_simulator::{read_trace, read_workloads, simulate};
use std::path::PathBuf;

fn data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data")
}

#[test]
fn with_the_defaults_no_time_sliced_job_runs_slower_than_the_bound() {
    let mut w = read_workloads(&data().join("carma/workloads.csv")).unwrap();
    let measured = read_solo_readings(&data().join("h100/collocation.csv")).unwrap();
    apply_activity(&mut w, &data().join("h100/workload-map.csv"), &measured).unwrap();
    let bound = Params::default().max_slowdown;
    for name in ["trace_t1.csv", "trace_t2.csv"] {
        let trace = read_trace(&data().join("carma").join(name)).unwrap();
        for policy in Policy::ALL {
            let cfg = SimConfig {
                cluster: Cluster::parse("1x4x40G").unwrap(),
                policy,
                estimator: Estimator::Oracle,
                params: Params::default(),
                assumptions: Assumptions::default(),
                admission: Admission::Anywhere,
                gpu_owner: GpuOwner::Carma,
                least_loaded: false,
            };
            let o = simulate(&trace, &w, &cfg).unwrap();
            for j in &o.jobs {
                let (s, limit) = (j.slowdown().unwrap(), if j.unprofiled { 2.0 } else { bound });
                assert!(s <= limit + 1e-6, "{name} {policy}: {} ran {s:.2}x slower than alone", j.workload);
            }
            // Without the guard the same trace slows some job far past it.
            let off = SimConfig { params: Params { max_slowdown: f64::INFINITY, ..cfg.params }, ..cfg.clone() };
            let worst_off = simulate(&trace, &w, &off).unwrap().job_slowdowns().into_iter().fold(1.0, f64::max);
            if policy != Policy::Exclusive {
                assert!(worst_off > bound, "{name} {policy}: unguarded worst {worst_off:.2}");
            }
        }
    }
}
