//! Hand-computable mini traces: every figure below is worked out in the
//! comments, not taken from a run.

use carma_config::{GpuOwner, Policy};
use carma_placement::Params;
use carma_placement::slowdown::Model;
use carma_simulator::{
    Admission, Assumptions, Cluster, Estimator, PowerProfile, Sharing, SimConfig, TraceJob, Workload, simulate,
};
use std::collections::HashMap;

fn wl(name: &str, peak_gib: u64, solo_s: f64, sm: f64, estimate_gib: Option<u64>) -> Workload {
    let mut estimates = HashMap::new();
    if let Some(e) = estimate_gib {
        estimates.insert("test".to_string(), e * 1024);
    }
    // Busy as much as SM-active, unless a test says otherwise.
    Workload {
        name: name.into(),
        gpus: 1,
        solo_s,
        peak_mib: peak_gib * 1024,
        estimates,
        sm,
        busy: sm,
        model_file: None,
        batch_size: None,
        seq_len: None,
    }
}

/// Time-slicing without switching's cost, shares in proportion to
/// demand: jobs whose busy shares add up past 1 each run Σ busy × slower.
const IDEAL_TIMESLICE: Model =
    Model { sharing: Sharing::Timeslice, switch: 0.0, capacity: 1.0, weight_exp: 1.0, base: 1.0 };
/// MPS whose SMs hold one job's worth, shared in proportion to demand, at
/// no cost of its own.
const IDEAL_MPS: Model = Model { sharing: Sharing::Mps, switch: 0.0, capacity: 1.0, weight_exp: 1.0, base: 1.0 };

fn job(seq: u32, at: f64, w: &str) -> TraceJob {
    TraceJob { seq, submit_s: at, workload: w.into() }
}

fn cfg(policy: Policy, estimator: Estimator, ramp_s: f64) -> SimConfig {
    SimConfig {
        cluster: Cluster { nodes: 1, gpus_per_node: 1, mem_mib: 40 * 1024 },
        policy,
        estimator,
        params: Params::default(),
        // No switching overhead, an ideal MPS, power 60 W + 340 W x SM activity.
        assumptions: Assumptions {
            ramp_s,
            sharing: Sharing::Timeslice,
            model: Some(IDEAL_TIMESLICE),
            power: PowerProfile { name: "test", idle_w: 60.0, active_w: 0.0, sm_w: 340.0 },
            sample_s: 0.0,
            window_s: 0.0,
            publish_s: 0.0,
            node_wait_s: 0.0,
            requeue_s: 0.0,
            count_interval_s: 0.0,
            hand_back_pause_s: 0.0,
            backfill: false,
            backfill_interval_s: 0.0,
            requeue_to_back: false,
            ..Assumptions::default()
        },
        admission: Admission::Anywhere,
        gpu_owner: GpuOwner::Carma,
        least_loaded: false,
    }
}

/// Without the slowdown guard: every job may join any GPU the activity
/// cap and memory allow.
fn unguarded(mut c: SimConfig) -> SimConfig {
    c.params.max_slowdown = f64::INFINITY;
    c
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-3
}

#[test]
fn two_light_jobs_collocate_under_carma_and_queue_under_exclusive() {
    // A at t=0, B at t=10: 10 GiB, 100 s, SM 0.3 each; one 40 GiB GPU.
    let w: HashMap<_, _> = [("light".to_string(), wl("light", 10, 100.0, 0.3, None))].into();
    let trace = [job(0, 0.0, "light"), job(1, 10.0, "light")];
    for policy in [Policy::Magm, Policy::FirstFit, Policy::BestFit, Policy::LeastUtilized, Policy::RoundRobin] {
        // SM 0.3 <= cap, 10 GiB + 2 GiB headroom fits: B starts at once;
        // total busy 0.6 <= 1 and no switching overhead: no slowdown. A ends 100, B 110.
        let o = simulate(&trace, &w, &cfg(policy, Estimator::Oracle, 0.0)).unwrap();
        assert!(close(o.makespan_s, 110.0), "{policy}: {}", o.makespan_s);
        assert!(close(o.jobs[1].start_s.unwrap(), 10.0), "{policy}");
        assert_eq!(o.ooms, 0);
    }
    // Exclusive: B waits for A (ends 100), then runs 100 s: makespan 200, B waits 90.
    let o = simulate(&trace, &w, &cfg(Policy::Exclusive, Estimator::Oracle, 0.0)).unwrap();
    assert!(close(o.makespan_s, 200.0), "{}", o.makespan_s);
    assert!(close(o.jobs[1].start_s.unwrap() - o.jobs[1].submit_s, 90.0));
    // Never collocated: B starts exactly when A ends.
    assert!(close(o.jobs[1].start_s.unwrap(), o.jobs[0].end_s.unwrap()));
    assert_eq!(o.max_jobs_per_gpu, vec![1]);
    // SM integral: 0.3 over 200 s.
    assert!(close(o.gpu_sm[0], 0.3), "{}", o.gpu_sm[0]);
    // Energy: (60 + 340 * 0.3) W * 200 s.
    assert!(close(o.energy_j, (60.0 + 340.0 * 0.3) * 200.0), "{}", o.energy_j);
}

#[test]
fn time_slicing_slows_both_jobs_by_their_total_busy_time() {
    // Busy and SM 0.8 each (SM at the cap, still eligible). From t=10 the
    // GPU is asked for 1.6 of its time: both run 1.6x slower. A has 90 s of
    // work left: 144 s, ends 154. B did 144/160 = 90% by then; its last
    // 10 s alone: ends 164.
    let w: HashMap<_, _> = [("heavy".to_string(), wl("heavy", 10, 100.0, 0.8, None))].into();
    let trace = [job(0, 0.0, "heavy"), job(1, 10.0, "heavy")];
    // (The guard, which would keep B waiting, is off.)
    let o = simulate(&trace, &w, &unguarded(cfg(Policy::Magm, Estimator::Oracle, 0.0))).unwrap();
    assert!(close(o.jobs[0].end_s.unwrap(), 154.0), "{:?}", o.jobs[0]);
    assert!(close(o.jobs[1].end_s.unwrap(), 164.0), "{:?}", o.jobs[1]);
    assert!(close(o.makespan_s, 164.0));
    // A monitor reads the work actually done: (0.8 + 0.8) / 1.6 = 1.0 while
    // both run (10..154), 0.8 alone (0..10, 154..164): 160 SM-seconds, all
    // of both jobs' solo SM work (2 x 100 s x 0.8), over 164 s.
    assert!(close(o.gpu_sm[0], 160.0 / 164.0), "{}", o.gpu_sm[0]);
}

#[test]
fn under_mps_kernels_overlap_up_to_the_sms_capacity() {
    // Busy 0.8 but SM activity 0.5 each: time-sliced, as above, 1.6x slower;
    // under (ideal) MPS their SM activities sum to 1.0: no slowdown, so A
    // ends 100 and B 110.
    let heavy = Workload { busy: 0.8, ..wl("h", 10, 100.0, 0.5, None) };
    let w: HashMap<_, _> = [("h".to_string(), heavy)].into();
    let trace = [job(0, 0.0, "h"), job(1, 10.0, "h")];
    let mut c = unguarded(cfg(Policy::Magm, Estimator::Oracle, 0.0));
    let ts = simulate(&trace, &w, &c).unwrap();
    assert!(close(ts.makespan_s, 164.0), "{}", ts.makespan_s);
    c.assumptions.sharing = Sharing::Mps;
    c.assumptions.model = Some(IDEAL_MPS);
    let mps = simulate(&trace, &w, &c).unwrap();
    assert!(close(mps.jobs[0].end_s.unwrap(), 100.0) && close(mps.makespan_s, 110.0), "{:?}", mps.jobs);
    // Energy: SM 0.5 for 0..10 and 100..110, 1.0 for 10..100:
    // 60*110 + 340*(0.5*20 + 1.0*90) J.
    assert!(close(mps.energy_j, 60.0 * 110.0 + 340.0 * (0.5 * 20.0 + 90.0)), "{}", mps.energy_j);
}

#[test]
fn an_underestimated_job_ooms_and_is_rerun_alone() {
    // Peak 30 GiB, estimated 10 GiB; memory ramps over 10 s. A starts at 0.
    // At t=5 A holds 15 GiB (more than its estimate, so nothing is promised):
    // effective free 25 GiB >= 10 + 2: B is placed. Allocated memory
    // 3t + 3(t-5) GiB passes 40 GiB at t = 55/6; B started last: it crashes,
    // waits in the recovery queue for an idle GPU (A ends at 100) and reruns
    // alone 100..200.
    let w: HashMap<_, _> = [("big".to_string(), wl("big", 30, 100.0, 0.3, Some(10)))].into();
    let trace = [job(0, 0.0, "big"), job(1, 5.0, "big")];
    for policy in [Policy::Magm, Policy::FirstFit, Policy::BestFit, Policy::LeastUtilized, Policy::RoundRobin] {
        let o = simulate(&trace, &w, &cfg(policy, Estimator::Column("test".into()), 10.0)).unwrap();
        assert_eq!((o.ooms, o.recoveries), (1, 1), "{policy}");
        assert_eq!((o.jobs[0].ooms, o.jobs[1].ooms), (0, 1), "{policy}: the job that allocated last must crash");
        assert!(close(o.jobs[1].start_s.unwrap(), 5.0), "{policy}: B first started beside A");
        assert!(close(o.jobs[0].end_s.unwrap(), 100.0), "{policy}");
        assert!(close(o.jobs[1].end_s.unwrap(), 200.0), "{policy}: {:?}", o.jobs[1]);
        assert!(close(o.makespan_s, 200.0), "{policy}");
    }
    // Exclusive never starts B beside A, so nothing crashes.
    let o = simulate(&trace, &w, &cfg(Policy::Exclusive, Estimator::Column("test".into()), 10.0)).unwrap();
    assert_eq!(o.ooms, 0);
    assert!(close(o.jobs[1].start_s.unwrap(), 100.0) && close(o.makespan_s, 200.0));
    // With the oracle estimate (30 GiB) B never starts beside A: no OOM.
    let o = simulate(&trace, &w, &cfg(Policy::Magm, Estimator::Oracle, 10.0)).unwrap();
    assert_eq!(o.ooms, 0);
    assert!(close(o.jobs[1].start_s.unwrap(), 100.0));
}

#[test]
fn exclusive_never_collocates_on_a_busy_trace() {
    let w: HashMap<_, _> =
        [("a".to_string(), wl("a", 5, 50.0, 0.2, None)), ("b".to_string(), wl("b", 12, 70.0, 0.5, None))].into();
    let trace: Vec<TraceJob> =
        (0..20).map(|i| job(i, f64::from(i) * 7.0, if i % 2 == 0 { "a" } else { "b" })).collect();
    let mut c = cfg(Policy::Exclusive, Estimator::Oracle, 5.0);
    c.cluster = Cluster { nodes: 2, gpus_per_node: 2, mem_mib: 40 * 1024 };
    let o = simulate(&trace, &w, &c).unwrap();
    assert_eq!(o.max_jobs_per_gpu, vec![1; 4], "exclusive collocated");
    assert!(o.jobs.iter().all(|j| j.end_s.is_some()));
    let carma = simulate(&trace, &w, &SimConfig { policy: Policy::Magm, ..c }).unwrap();
    assert!(carma.makespan_s <= o.makespan_s + 1e-6);
    assert!(carma.max_jobs_per_gpu.iter().any(|&n| n > 1), "magm never collocated: {:?}", carma.max_jobs_per_gpu);
}

/// #30's case: node 0's four GPUs each hold a 36 GiB job (one shard of 8
/// each), node 1 is empty; then a job of 8 GiB. Today's slurmctld sends it
/// to node 0 (7 free shards per GPU), where no GPU has 8 + 2 GiB free: it
/// fails while node 1 stood empty. With shards as memory, node 0's GPUs
/// hold 38 of 40 GiB-shards, so slurmctld sends it to node 1, where it runs.
/// CARMA everywhere (`anywhere`) finds node 1 too, and so
/// does Slurm when monitors withdraw busy GPUs' shards.
#[test]
fn slurm_sends_a_job_to_a_full_node_unless_shards_are_memory() {
    let w: HashMap<_, _> = [
        ("big".to_string(), wl("big", 36, 1000.0, 0.3, None)),
        ("small".to_string(), wl("small", 8, 100.0, 0.3, None)),
    ]
    .into();
    let mut trace: Vec<TraceJob> = (0..4).map(|i| job(i, 0.0, "big")).collect();
    trace.push(job(4, 10.0, "small"));
    let two = Cluster { nodes: 2, gpus_per_node: 4, mem_mib: 40 * 1024 };
    let run = |admission: Admission| {
        let c = SimConfig { cluster: two, admission, ..cfg(Policy::Magm, Estimator::Oracle, 0.0) };
        simulate(&trace, &w, &c).unwrap()
    };
    let today = run(Admission::Shards { per_gpu: 8, hand_back: 0 });
    // The four big jobs fill node 0 (first node with free shards), one per GPU.
    assert!(today.jobs[..4].iter().all(|j| j.end_s.is_some() && !j.failed_no_fit));
    let small = &today.jobs[4];
    assert!(small.failed_no_fit && small.wrong_node && small.end_s.is_none(), "{small:?}");
    for admission in [Admission::MemoryShards { hand_back: 0 }, Admission::Informed, Admission::Anywhere] {
        let o = run(admission);
        let small = &o.jobs[4];
        assert!(!small.failed_no_fit && small.end_s == Some(110.0), "{admission:?}: {small:?}");
        assert!(o.jobs.iter().all(|j| j.end_s.is_some()));
    }
}

/// Shards as memory alone pack a busy GPU: a job whose memory fits beside
/// a busy one is sent there and refused by CARMA's activity cap. When each
/// node's monitor withdraws the shards of a GPU over the cap, slurmctld
/// sends it to the idle GPU instead.
#[test]
fn slurm_needs_the_monitors_view_of_activity_not_memory_alone() {
    // One node, two GPUs; a 10 GiB job busy 0.9 (over the 0.8 cap) on GPU 0,
    // then a 10 GiB job: 20 GiB-shards of 40 are free on GPU 0.
    let w: HashMap<_, _> = [
        ("hot".to_string(), wl("hot", 10, 1000.0, 0.9, None)),
        ("small".to_string(), wl("small", 10, 100.0, 0.3, None)),
    ]
    .into();
    let trace = [job(0, 0.0, "hot"), job(1, 10.0, "small")];
    let one = Cluster { nodes: 1, gpus_per_node: 2, mem_mib: 40 * 1024 };
    let run = |admission: Admission| {
        let c = SimConfig { cluster: one, admission, ..cfg(Policy::Magm, Estimator::Oracle, 0.0) };
        simulate(&trace, &w, &c).unwrap()
    };
    let packed = run(Admission::MemoryShards { hand_back: 0 });
    assert!(packed.jobs[1].failed_no_fit, "{:?}", packed.jobs[1]);
    let informed = run(Admission::Informed);
    assert!(!informed.jobs[1].failed_no_fit && informed.jobs[1].end_s == Some(110.0), "{:?}", informed.jobs[1]);
}

/// Node-level memory (what Slurm can be told at run time): node 0's free
/// memory is split across its GPUs (15 GiB each beside two 25 GiB jobs),
/// so a 20 GiB job that the node's total admits fits no GPU there; the node
/// hands it back and slurmctld sends it to node 1, where CARMA places it.
#[test]
fn a_node_whose_free_memory_is_split_hands_the_job_back() {
    let w: HashMap<_, _> = [
        ("mid".to_string(), wl("mid", 25, 1000.0, 0.2, None)),
        ("twenty".to_string(), wl("twenty", 20, 100.0, 0.2, None)),
    ]
    .into();
    let trace = [job(0, 0.0, "mid"), job(1, 0.0, "mid"), job(2, 10.0, "twenty")];
    let two = Cluster { nodes: 2, gpus_per_node: 2, mem_mib: 40 * 1024 };
    let run = |admission: Admission| {
        let c = SimConfig { cluster: two, admission, ..cfg(Policy::Magm, Estimator::Oracle, 0.0) };
        simulate(&trace, &w, &c).unwrap()
    };
    // Node 0 took both 25 GiB jobs (27 GiB each with headroom: 54 of 80),
    // one per GPU (magm); 26 GiB left on the node, 13 on each GPU.
    let o = run(Admission::NodeMemory { hand_back: 3 });
    assert_eq!(o.handed_back, 1, "{:?}", o.jobs);
    assert!(o.jobs.iter().all(|j| j.end_s.is_some() && !j.failed_no_fit), "{:?}", o.jobs);
    assert_eq!(o.jobs[2].end_s, Some(110.0));
    // Without hand-back the node would have failed it.
    let o = run(Admission::NodeMemory { hand_back: 0 });
    assert!(o.jobs[2].failed_no_fit && o.jobs[2].wrong_node, "{:?}", o.jobs[2]);
}

/// A job out of hand-backs pauses (`hand_back_pause_s`) instead of
/// failing: both nodes' GPUs hold a 25 GiB job each until t=100, so a
/// 20 GiB job at t=10 finds no GPU on either; it waits 50 s, finds none
/// again at t=60, waits twice as long and runs at t=160 (both nodes free
/// since t=100).
/// Without a pause it fails at t=10, though a node would have room later.
#[test]
fn a_job_out_of_hand_backs_pauses_and_runs_when_a_node_has_room() {
    let w: HashMap<_, _> = [
        ("mid".to_string(), wl("mid", 25, 100.0, 0.2, None)),
        ("twenty".to_string(), wl("twenty", 20, 100.0, 0.2, None)),
    ]
    .into();
    let trace =
        [job(0, 0.0, "mid"), job(1, 0.0, "mid"), job(2, 0.0, "mid"), job(3, 0.0, "mid"), job(4, 10.0, "twenty")];
    let two = Cluster { nodes: 2, gpus_per_node: 2, mem_mib: 40 * 1024 };
    let run = |pause: f64| {
        let base = cfg(Policy::Magm, Estimator::Oracle, 0.0);
        let assumptions = Assumptions { hand_back_pause_s: pause, ..base.assumptions };
        let c = SimConfig { cluster: two, admission: Admission::NodeMemory { hand_back: 1 }, assumptions, ..base };
        simulate(&trace, &w, &c).unwrap()
    };
    let failed = run(0.0);
    assert!(failed.jobs[4].failed_no_fit && failed.paused == 0, "{:?}", failed.jobs[4]);
    let o = run(50.0);
    assert!(!o.jobs[4].failed_no_fit, "{:?}", o.jobs[4]);
    assert_eq!(o.jobs[4].end_s, Some(260.0), "{:?}", o.jobs[4]);
    assert_eq!((o.paused, o.handed_back), (2, 2));
}

/// Slurm's backfill (no time limits): a two-GPU job that finds no node
/// with two GPUs' worth of count free waits at the queue head; strictly in
/// order, the one-GPU job behind it waits too, under backfill it starts.
#[test]
fn under_backfill_a_job_behind_a_waiting_head_starts_if_it_fits() {
    let w: HashMap<_, _> = [
        ("mid".to_string(), wl("mid", 25, 100.0, 0.2, None)),
        ("pair".to_string(), Workload { gpus: 2, ..wl("pair", 30, 100.0, 0.2, None) }),
        ("small".to_string(), wl("small", 4, 100.0, 0.2, None)),
    ]
    .into();
    let trace = [job(0, 0.0, "mid"), job(1, 1.0, "pair"), job(2, 2.0, "small")];
    let one = Cluster { nodes: 1, gpus_per_node: 2, mem_mib: 40 * 1024 };
    let run = |backfill: bool, backfill_interval_s: f64| {
        let base = cfg(Policy::Magm, Estimator::Oracle, 0.0);
        let assumptions = Assumptions { backfill, backfill_interval_s, ..base.assumptions };
        let c = SimConfig { cluster: one, admission: Admission::NodeMemory { hand_back: 0 }, assumptions, ..base };
        simulate(&trace, &w, &c).unwrap()
    };
    let fifo = run(false, 0.0);
    assert_eq!(fifo.jobs[2].start_s, Some(100.0), "{:?}", fifo.jobs);
    let bf = run(true, 0.0);
    assert_eq!(bf.jobs[2].start_s, Some(2.0), "{:?}", bf.jobs);
    assert_eq!((fifo.jobs[1].start_s, bf.jobs[1].start_s), (Some(100.0), Some(100.0)), "the head: {:?}", bf.jobs);
    // Passes every 7 s from the first submission: the job behind the head
    // waits for the one at 7 s; the head still starts when the first ends.
    let periodic = run(true, 7.0);
    assert_eq!(periodic.jobs[2].start_s, Some(7.0), "{:?}", periodic.jobs);
    assert!(periodic.jobs[1].start_s.is_some_and(|s| (s - 100.0).abs() < 1e-6), "the head: {:?}", periodic.jobs);
}

/// Under `gpu_owner: slurm` CARMA keeps to the GPU of the job's shard,
/// which slurmctld takes from the first GPU with one free, whatever its
/// memory: a second 25 GiB job lands beside the first, where it does not
/// fit, while the node's other GPU is empty. With `carma` the policy picks
/// the empty GPU. Node-memory admission then hands the job back to the
/// other node instead of failing it.
#[test]
fn under_slurms_ownership_a_job_runs_on_its_shards_gpu() {
    let w: HashMap<_, _> = [("mid".to_string(), wl("mid", 25, 1000.0, 0.2, None))].into();
    let trace = [job(0, 0.0, "mid"), job(1, 10.0, "mid")];
    let run = |nodes: u32, admission: Admission, gpu_owner: GpuOwner| {
        let cluster = Cluster { nodes, gpus_per_node: 2, mem_mib: 40 * 1024 };
        let c = SimConfig { cluster, admission, gpu_owner, ..cfg(Policy::Magm, Estimator::Oracle, 0.0) };
        simulate(&trace, &w, &c).unwrap()
    };
    let shards = Admission::Shards { per_gpu: 8, hand_back: 0 };
    let carmas = run(1, shards, GpuOwner::Carma);
    assert!(carmas.jobs.iter().all(|j| j.end_s == Some(j.submit_s + 1000.0)), "{:?}", carmas.jobs);
    let slurms = run(1, shards, GpuOwner::Slurm);
    assert!(slurms.jobs[0].end_s.is_some() && slurms.jobs[1].failed_no_fit, "{:?}", slurms.jobs);
    // LL_SHARED_GRES: slurmctld takes the second shard from the empty GPU.
    let cluster = Cluster { nodes: 1, gpus_per_node: 2, mem_mib: 40 * 1024 };
    let c = SimConfig {
        cluster,
        admission: shards,
        gpu_owner: GpuOwner::Slurm,
        least_loaded: true,
        ..cfg(Policy::Magm, Estimator::Oracle, 0.0)
    };
    let spread = simulate(&trace, &w, &c).unwrap();
    assert!(spread.jobs.iter().all(|j| j.end_s == Some(j.submit_s + 1000.0)), "{:?}", spread.jobs);
    let memory = Admission::NodeMemory { hand_back: 3 };
    assert_eq!(run(2, memory, GpuOwner::Carma).handed_back, 0);
    let o = run(2, memory, GpuOwner::Slurm);
    assert_eq!(o.handed_back, 1, "{:?}", o.jobs);
    assert!(o.jobs.iter().all(|j| j.end_s == Some(j.submit_s + 1000.0)), "{:?}", o.jobs);
}

/// Under Slurm's ownership a job of two GPUs on job-count shards holds two
/// whole GPUs (`--gres=gpu:2`): beside a one-GPU job on a two-GPU node it
/// waits for that job's end. CARMA's own choice collocates it at once.
#[test]
fn under_slurms_ownership_a_two_gpu_job_waits_for_two_whole_gpus() {
    let pair = Workload { gpus: 2, ..wl("pair", 5, 1000.0, 0.1, None) };
    let w: HashMap<_, _> = [("one".to_string(), wl("one", 5, 1000.0, 0.1, None)), ("pair".to_string(), pair)].into();
    let trace = [job(0, 0.0, "one"), job(1, 10.0, "pair")];
    let run = |gpu_owner: GpuOwner| {
        let cluster = Cluster { nodes: 1, gpus_per_node: 2, mem_mib: 40 * 1024 };
        let admission = Admission::Shards { per_gpu: 8, hand_back: 0 };
        let c = SimConfig { cluster, admission, gpu_owner, ..cfg(Policy::Magm, Estimator::Oracle, 0.0) };
        simulate(&trace, &w, &c).unwrap()
    };
    assert_eq!(run(GpuOwner::Carma).jobs[1].start_s, Some(10.0));
    assert_eq!(run(GpuOwner::Slurm).jobs[1].start_s, Some(1000.0));
}

#[test]
fn a_trace_that_starts_late_is_sampled_from_its_first_submission() {
    // One job at t=3, 100 s; a timeline sample every 60 s from the first
    // submission: at 0 and 60 (relative), the makespan 100.
    let w: HashMap<_, _> = [("light".to_string(), wl("light", 10, 100.0, 0.3, None))].into();
    let mut c = cfg(Policy::Magm, Estimator::Oracle, 0.0);
    c.assumptions.sample_s = 60.0;
    let o = simulate(&[job(0, 3.0, "light")], &w, &c).unwrap();
    assert!(close(o.makespan_s, 100.0), "{}", o.makespan_s);
    let at: Vec<f64> = o.timeline.iter().map(|s| s.t).collect();
    assert_eq!(at, vec![0.0, 60.0]);
}

/// The wait on the node (timeouts.wait): node 0's memory is split (13 GiB
/// free on each GPU beside two 25 GiB jobs of 100 s), so the 20 GiB job
/// sent there at t=10 fits no GPU. Waiting 200 s it starts there when the
/// first job ends (100) and ends at 200, never handed back; waiting 50 s it
/// is handed back at 60, away 5 s for the requeue, and placed on node 1 at
/// 65, ending at 165.
#[test]
fn a_job_waits_on_its_node_before_it_is_handed_back() {
    let w: HashMap<_, _> = [
        ("mid".to_string(), wl("mid", 25, 100.0, 0.2, None)),
        ("twenty".to_string(), wl("twenty", 20, 100.0, 0.2, None)),
    ]
    .into();
    let trace = [job(0, 0.0, "mid"), job(1, 0.0, "mid"), job(2, 10.0, "twenty")];
    let run = |node_wait_s: f64| {
        let mut c = SimConfig {
            cluster: Cluster { nodes: 2, gpus_per_node: 2, mem_mib: 40 * 1024 },
            admission: Admission::NodeMemory { hand_back: 3 },
            ..cfg(Policy::Magm, Estimator::Oracle, 0.0)
        };
        c.assumptions.node_wait_s = node_wait_s;
        c.assumptions.requeue_s = 5.0;
        simulate(&trace, &w, &c).unwrap()
    };
    let o = run(200.0);
    assert_eq!(o.handed_back, 0, "{:?}", o.jobs);
    assert_eq!((o.jobs[2].start_s, o.jobs[2].end_s), (Some(100.0), Some(200.0)), "{:?}", o.jobs[2]);
    let o = run(50.0);
    assert_eq!(o.handed_back, 1, "{:?}", o.jobs);
    assert_eq!((o.jobs[2].start_s, o.jobs[2].end_s), (Some(65.0), Some(165.0)), "{:?}", o.jobs[2]);
}

/// The readings' window: one GPU, four jobs of SM (and busy) 0.25
/// arriving together (no switching overhead here). With no window each
/// reads at once: 0, 0.25, 0.5 and 0.75 pass the 0.8 cap, so all four
/// start at 0. With a 10 s window the readings have seen none of them yet
/// and the plugin counts each placed within it as half the cap (0.4) on
/// top: 0, 0.4 and 0.8 pass (not over), 1.2 does not. At age a the three
/// read 0.75 a/10 + 1.2 (1 - a/10), at most 0.8 from a = 8.9 s: the fourth
/// starts at the next whole second the plugin counts, 9 or 10 s.
#[test]
fn under_a_window_recent_placements_count_on_top_of_the_readings() {
    let w: HashMap<_, _> = [("light".to_string(), wl("light", 2, 100.0, 0.25, None))].into();
    let trace: Vec<TraceJob> = (0..4).map(|i| job(i, 0.0, "light")).collect();
    let run = |window_s: f64| {
        // (Without the guard: the jobs are not profiled within the window.)
        let mut c = unguarded(cfg(Policy::Magm, Estimator::Oracle, 0.0));
        c.assumptions.window_s = window_s;
        simulate(&trace, &w, &c).unwrap()
    };
    let starts = |o: &carma_simulator::Outcome| o.jobs.iter().map(|j| j.start_s.unwrap_or(-1.0)).collect::<Vec<_>>();
    let o = run(0.0);
    assert_eq!(starts(&o), [0.0, 0.0, 0.0, 0.0], "{:?}", o.jobs);
    let o = run(10.0);
    assert_eq!(starts(&o)[..3], [0.0, 0.0, 0.0], "{:?}", o.jobs);
    assert!((8.9..=10.0).contains(&starts(&o)[3]), "{:?}", o.jobs);
}

/// The readings are window means of what the GPU read: a job that ended
/// stays in them until the window has passed it, and the plugin sees them
/// as of the monitor's last publication. One GPU; a job of SM 1.0 runs
/// 0-10 s, then a light one arrives. Under a 6 s window the mean at t is
/// (16 - t) / 6, within the 0.8 cap from 11.2 s: arriving at 10.5 s the
/// light job starts at the next whole second that passes, 12 s (with the
/// ended job dropped at once it started on arrival). Arriving at 11.5 s it
/// starts at once (0.75), unless the readings are published every 4 s:
/// then they are as of 8 s (1.0) until 12 s (0.67).
#[test]
fn window_means_keep_an_ended_job_and_lag_by_the_publication_interval() {
    let w: HashMap<_, _> =
        [("hot".to_string(), wl("hot", 2, 10.0, 1.0, None)), ("light".to_string(), wl("light", 2, 10.0, 0.25, None))]
            .into();
    let run = |arrives: f64, window_s: f64, publish_s: f64| {
        let mut c = cfg(Policy::Magm, Estimator::Oracle, 0.0);
        c.assumptions.window_s = window_s;
        c.assumptions.publish_s = publish_s;
        let o = simulate(&[job(0, 0.0, "hot"), job(1, arrives, "light")], &w, &c).unwrap();
        assert_eq!(o.jobs[0].end_s, Some(10.0), "{:?}", o.jobs);
        o.jobs[1].start_s.unwrap()
    };
    assert_eq!(run(10.5, 0.0, 0.0), 10.5);
    assert_eq!(run(10.5, 6.0, 0.0), 12.0);
    assert_eq!(run(11.5, 6.0, 0.0), 11.5);
    assert_eq!(run(11.5, 6.0, 4.0), 12.0);
}

/// The monitors' admission count (`count_interval_s`): what the node could
/// promise when its monitor last set it; slurmctld's free count is that
/// less what it has allocated there (a running job's memory held twice).
#[test]
fn slurmctld_sees_the_count_its_node_last_set() {
    // One 40 GiB GPU. A (30 GiB, asks 32) at 0 for 1005 s; B (4 GiB, asks
    // 6) at 1 and C (12 GiB, asks 14) at 2, each for 100 s; all SM 0.1.
    let w: HashMap<_, _> = [
        ("big".to_string(), wl("big", 30, 1005.0, 0.1, None)),
        ("small".to_string(), wl("small", 4, 100.0, 0.1, None)),
        ("mid".to_string(), wl("mid", 12, 100.0, 0.1, None)),
    ]
    .into();
    let trace = [job(0, 0.0, "big"), job(1, 1.0, "small"), job(2, 2.0, "mid")];
    let one = Cluster { nodes: 1, gpus_per_node: 1, mem_mib: 40 * 1024 };
    let run = |count_interval_s: f64| {
        let base = cfg(Policy::Magm, Estimator::Oracle, 0.0);
        let c = SimConfig {
            cluster: one,
            admission: Admission::NodeMemory { hand_back: 1 },
            assumptions: Assumptions { count_interval_s, ..base.assumptions },
            ..base
        };
        simulate(&trace, &w, &c).unwrap()
    };
    // Counted by Slurm alone: 40 - 32 - 6 = 2 GiB left after B, 8 after
    // B's end (101): C starts at A's end (1005).
    let alone = run(0.0);
    assert!(close(alone.jobs[2].start_s.unwrap(), 1005.0), "{:?}", alone.jobs[2]);
    // Set at 0 (40): B fits the 8 left (1). Every 10 s after, the GPU can
    // promise 40 - 30 - 4 = 6 GiB, then (B gone) 10: slurmctld takes its
    // allocations off that, none free. A ends at 1005, between two counts:
    // slurmctld frees its 32, and the count set at 1000 (10) is less than
    // C's 14. Nothing runs, but the run goes on to the next count (1010,
    // 40 GiB), where C starts.
    let counted = run(10.0);
    assert!(close(counted.jobs[1].start_s.unwrap(), 1.0), "{:?}", counted.jobs[1]);
    assert!(!counted.jobs[2].rejected, "{:?}", counted.jobs[2]);
    assert!(close(counted.jobs[2].start_s.unwrap(), 1010.0), "{:?}", counted.jobs[2]);
}

/// A job larger than any GPU crashes alone on its exclusive GPU: it is
/// rejected, not recovered for ever.
#[test]
fn a_job_that_runs_out_of_memory_alone_is_rejected_not_recovered_for_ever() {
    let w: HashMap<_, _> = [("huge".to_string(), wl("huge", 50, 100.0, 0.2, None))].into();
    let o = simulate(&[job(0, 0.0, "huge")], &w, &cfg(Policy::Magm, Estimator::Oracle, 0.0)).unwrap();
    assert!(o.jobs[0].rejected && o.jobs[0].ooms == 1 && o.jobs[0].end_s.is_none(), "{:?}", o.jobs[0]);
}

/// Each job is slowed by its own share of the GPU, not by one figure per
/// GPU: time-sliced on the H100's model, a heavy job (busy 0.98) loses more
/// of its time to a light one (busy 0.54) than the light one loses to it.
/// Both take 100 s alone and start at 0 (guard off): while together, each
/// runs at its own slowdown s_h > s_l; the light one ends at 100 s_l, the
/// heavy one has done 100 s_l / s_h of its work then, the rest alone.
#[test]
fn the_heavy_job_of_a_time_sliced_pair_is_slowed_more_than_its_light_partner() {
    // (SM activity under the 0.8 cap, so the light one may join.)
    let heavy = Workload { busy: 0.98, ..wl("heavy", 10, 100.0, 0.7, None) };
    let light = Workload { busy: 0.54, ..wl("light", 10, 100.0, 0.31, None) };
    let w: HashMap<_, _> = [("heavy".to_string(), heavy.clone()), ("light".to_string(), light.clone())].into();
    let trace = [job(0, 0.0, "heavy"), job(1, 0.0, "light")];
    let mut c = unguarded(cfg(Policy::Magm, Estimator::Oracle, 0.0));
    c.assumptions.model = None;
    let o = simulate(&trace, &w, &c).unwrap();
    let profile = |w: &Workload| carma_placement::slowdown::Profile { busy: w.busy, sm: w.sm };
    let s = Model::H100_TIMESLICE.slowdowns(&[profile(&heavy), profile(&light)]);
    let (light_end, heavy_end) = (100.0 * s[1], 100.0 * s[1] + 100.0 * (1.0 - s[1] / s[0]));
    assert!(close(o.jobs[1].end_s.unwrap(), light_end), "{:?} vs {light_end}", o.jobs[1]);
    assert!(close(o.jobs[0].end_s.unwrap(), heavy_end), "{:?} vs {heavy_end}", o.jobs[0]);
    let (sh, sl) = (o.jobs[0].slowdown().unwrap(), o.jobs[1].slowdown().unwrap());
    assert!(sh > sl + 0.1, "heavy {sh}, light {sl}");
}

/// The node learns what a job does to a GPU from its readings while it
/// runs alone, as carma-monitor does: a workload's second run may join its
/// first (two jobs of busy 0.65 each run 1.48x slower together, within the
/// guard's 1.6), while a job of a signature the node has not seen counts
/// as filling the GPU: beside one such job it would be predicted over 2x
/// slower itself, beside two far more, so it waits for the GPU to empty.
#[test]
fn an_unprofiled_job_waits_until_its_signature_is_learned() {
    let light = |name: &str| Workload { busy: 0.65, ..wl(name, 10, 100.0, 0.3, None) };
    let w: HashMap<_, _> = [("light".to_string(), light("light")), ("other".to_string(), light("other"))].into();
    let trace = [job(0, 0.0, "light"), job(1, 10.0, "light"), job(2, 20.0, "other")];
    let o = simulate(&trace, &w, &cfg(Policy::Magm, Estimator::Oracle, 0.0)).unwrap();
    let (starts, ends): (Vec<f64>, Vec<f64>) = o.jobs.iter().map(|j| (j.start_s.unwrap(), j.end_s.unwrap())).unzip();
    assert_eq!(starts[..2], [0.0, 10.0], "{:?}", o.jobs);
    assert!(close(starts[2], ends[0].max(ends[1])), "{:?}", o.jobs);
    // The first run of each signature was placed unprofiled.
    assert_eq!(o.unprofiled, 2);
    assert_eq!(o.jobs.iter().map(|j| j.unprofiled).collect::<Vec<_>>(), [true, false, true]);
}
