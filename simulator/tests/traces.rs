//! The paper's two traces through every policy: invariants that must hold
//! whatever the modelling constants are.

use carma_config::{GpuOwner, Policy};
use carma_placement::Params;
use carma_simulator::{
    Admission, Assumptions, Cluster, Estimator, SimConfig, apply_job_options, read_trace, read_workloads, simulate,
};
use std::path::PathBuf;

fn data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/carma")
}

fn cfg(policy: Policy, estimator: Estimator) -> SimConfig {
    SimConfig {
        cluster: Cluster::parse("1x4x40G").unwrap(),
        policy,
        estimator,
        params: Params::default(),
        assumptions: Assumptions::default(),
        admission: Admission::Anywhere,
        gpu_owner: GpuOwner::Carma,
        least_loaded: false,
    }
}

#[test]
fn every_policy_finishes_both_traces_and_exclusive_never_shares() {
    let w = read_workloads(&data().join("workloads.csv")).unwrap();
    for name in ["trace_t1.csv", "trace_t2.csv"] {
        let trace = read_trace(&data().join(name)).unwrap();
        assert_eq!(trace.len(), 60);
        let excl = simulate(&trace, &w, &cfg(Policy::Exclusive, Estimator::Oracle)).unwrap();
        assert!(excl.max_jobs_per_gpu.iter().all(|&n| n == 1), "{name}: exclusive shared a GPU");
        for p in Policy::ALL {
            let o = simulate(&trace, &w, &cfg(p, Estimator::Oracle)).unwrap();
            assert!(o.jobs.iter().all(|j| j.end_s.is_some()), "{name} {p}: a job never finished");
            // The oracle estimate is the measured peak: nothing can run out of memory.
            assert_eq!(o.ooms, 0, "{name} {p}");
            assert!(o.gpu_sm.iter().all(|&s| (0.0..=1.0).contains(&s)));
            assert!(o.gpu_mem_mib.iter().all(|&m| m <= 40960.0));
        }
    }
}

#[test]
fn underestimates_cause_ooms_that_recovery_completes() {
    let w = read_workloads(&data().join("workloads.csv")).unwrap();
    let trace = read_trace(&data().join("trace_t1.csv")).unwrap();
    // FakeTensor's estimates are far below the measured peaks (e.g. 15 MiB for
    // a 590 MiB job): jobs are collocated whose peaks do not fit together,
    // with the SM cap (a monitor reads the slowed jobs' real SM activity,
    // which time-slicing keeps under 0.8) and without it. Every crash is
    // rerun on a GPU of its own and completes. The slowdown guard is off:
    // it keeps most of this trace's jobs apart (the first run of each
    // signature is unprofiled), and with it none crashes.
    let mut c = cfg(Policy::Magm, Estimator::Column("faketensor".into()));
    c.params.max_slowdown = f64::INFINITY;
    for cap in [0.8, 1.0] {
        c.params.sm_activity_cap = cap;
        let o = simulate(&trace, &w, &c).unwrap();
        assert!(o.ooms > 0, "cap {cap}: no OOM despite underestimates");
        assert_eq!(o.ooms, o.jobs.iter().map(|j| j.ooms).sum::<u32>());
        assert_eq!(o.recoveries, o.ooms);
        assert!(o.jobs.iter().all(|j| j.end_s.is_some()), "cap {cap}: a crashed job was not recovered");
    }
    // The measured peaks never crash.
    assert_eq!(simulate(&trace, &w, &cfg(Policy::Magm, Estimator::Oracle)).unwrap().ooms, 0);
}

/// The jobs' options file: the gpt2-large row's per-GPU batch is half the
/// table's (DataParallel over its 2 GPUs), every language-model row gets
/// its script's sequence length, and the rows it does not name keep the
/// table's batch and no sequence length.
#[test]
fn job_options_set_per_gpu_batch_and_sequence_length() {
    let mut w = read_workloads(&data().join("workloads.csv")).unwrap();
    let before = w.clone();
    let rows = apply_job_options(&mut w, &data().join("job-options.csv")).unwrap();
    assert_eq!(rows.len(), 5);
    assert!(rows.iter().all(|r| r.source.starts_with("workloads/")), "{rows:?}");
    let gpt2 = &w["gpt2_large_2"];
    assert_eq!((gpt2.gpus, gpt2.batch_size, gpt2.seq_len), (2, Some(4), Some(512)));
    assert_eq!(before["gpt2_large_2"].batch_size, Some(8));
    assert_eq!(w["BERT_base"].seq_len, Some(512));
    assert_eq!(w["resnet"], before["resnet"]);
}

/// A row naming no workload, or a batch that is not a whole number > 0, is
/// refused naming the file's line and the field; an empty cell keeps the
/// table's value.
#[test]
fn job_options_refuse_unknown_workloads_and_bad_numbers() {
    let dir = std::env::temp_dir().join(format!("carma-sim-options-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let table = read_workloads(&data().join("workloads.csv")).unwrap();
    let run = |body: &str| {
        let f = dir.join("o.csv");
        std::fs::write(&f, format!("workload,batch_size,seq_len,source\n{body}\n")).unwrap();
        let mut w = table.clone();
        apply_job_options(&mut w, &f).map(|_| w)
    };
    let e = run("gpt2_large,4,512,typo").unwrap_err();
    assert!(e.contains("line 2") && e.contains("no workload 'gpt2_large'"), "{e}");
    let e = run("BERT_base,0,512,x").unwrap_err();
    assert!(e.contains("line 2") && e.contains("batch_size '0'"), "{e}");
    let e = run("BERT_base,32,long,x").unwrap_err();
    assert!(e.contains("seq_len 'long'"), "{e}");
    let w = run("BERT_base,,384,x, with a comma").unwrap();
    assert_eq!((w["BERT_base"].batch_size, w["BERT_base"].seq_len), (Some(32), Some(384)));
    std::fs::remove_dir_all(&dir).ok();
}
