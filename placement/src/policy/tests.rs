use super::*;
use crate::gpu::GpuProcess;
use crate::state::{HISTORY_MAX, Reservation};
use proptest::prelude::*;

const P: Params = Params {
    metric: carma_config::ActivityMetric::Sm,
    sm_activity_cap: 0.8,
    busy_cap: 0.8,
    headroom_mib: 2048,
    window_secs: 0,
    now_secs: 0,
    readings_ms: None,
    sharing: carma_config::Sharing::Timeslice,
    // These tests are of memory, activity and the policies' order: the
    // guard and the idle-first rule are tested in `guard.rs`.
    max_slowdown: f64::INFINITY,
    max_slowdown_unprofiled: f64::INFINITY,
    idle_first: false,
    profile_after_secs: 0,
};

fn gpu(index: u32, used: u64, sm: f64) -> GpuReading {
    GpuReading {
        index,
        uuid: format!("GPU-{index}"),
        minor: None,
        total_mib: 40960,
        used_mib: used,
        sm_activity: sm,
        busy: sm,
        processes: if used > 0 { vec![GpuProcess { pid: 1000 + index, used_mib: used }] } else { vec![] },
        power_w: None,
        mps_uid: None,
        sm_occupancy: None,
        mps_server_pid: None,
    }
}

fn demand(policy: Policy, est: u64) -> Demand {
    Demand { policy, count: 1, estimate_mib: Some(est), mps_uid: None, profile: None }
}

fn pick(gpus: &[GpuReading], state: &mut NodeState, d: Demand) -> Result<Vec<u32>, NoFit> {
    choose(gpus, state, &d, &P, &HashMap::new()).map(|c| c.gpus)
}

use crate::test_support::carma;

/// GPU0 20 GiB used, GPU1 10 GiB, GPU2 30 GiB, GPU3 idle but 0.9 busy.
fn node() -> Vec<GpuReading> {
    vec![gpu(0, 20480, 0.3), gpu(1, 10240, 0.5), gpu(2, 30720, 0.1), gpu(3, 0, 0.9)]
}

#[test]
fn each_policy_picks_its_gpu() {
    let mut st = NodeState::default();
    let g = node();
    assert_eq!(pick(&g, &mut st, demand(Policy::Magm, 4096)).unwrap(), vec![1], "most free memory, GPU3 too busy");
    assert_eq!(pick(&g, &mut st, demand(Policy::BestFit, 4096)).unwrap(), vec![2], "least free that fits");
    assert_eq!(pick(&g, &mut st, demand(Policy::FirstFit, 4096)).unwrap(), vec![0]);
    assert_eq!(pick(&g, &mut st, demand(Policy::LeastUtilized, 4096)).unwrap(), vec![2], "lowest SM activity");
    // Exclusive needs an idle GPU: only GPU3 has no processes (SM cap does not apply).
    assert_eq!(pick(&g, &mut st, demand(Policy::Exclusive, 4096)).unwrap(), vec![3]);
}

#[test]
fn preconditions_sm_cap_and_headroom() {
    let mut st = NodeState::default();
    let g = vec![gpu(0, 0, 0.81)];
    let e = pick(&g, &mut st, demand(Policy::Magm, 1024)).unwrap_err();
    assert!(e.to_string().contains("SM activity 0.81 > cap 0.80"), "{e}");
    // 40960 - 30720 = 10240 free: 8192 + 2048 fits exactly, 8193 does not.
    let g = vec![gpu(0, 30720, 0.0)];
    assert_eq!(pick(&g, &mut st, demand(Policy::Magm, 8192)).unwrap(), vec![0]);
    let e = pick(&g, &mut st, demand(Policy::Magm, 8193)).unwrap_err();
    assert!(e.to_string().contains("effective free 10240 MiB < 8193 MiB estimate + 2048 MiB headroom"), "{e}");
}

#[test]
fn ties_break_by_gpu_index() {
    let g = vec![gpu(0, 0, 0.0), gpu(1, 0, 0.0), gpu(2, 0, 0.0)];
    for policy in [Policy::Magm, Policy::BestFit, Policy::FirstFit, Policy::LeastUtilized, Policy::Exclusive] {
        let mut st = NodeState::default();
        assert_eq!(pick(&g, &mut st, demand(policy, 1000)).unwrap(), vec![0], "{policy}");
    }
}

#[test]
fn round_robin_cycles_and_skips_ineligible() {
    let mut st = NodeState::default();
    let g = node();
    let mut seen = vec![];
    for _ in 0..5 {
        seen.push(pick(&g, &mut st, demand(Policy::RoundRobin, 4096)).unwrap()[0]);
    }
    assert_eq!(seen, vec![0, 1, 2, 0, 1], "GPU3 is over the SM cap");
}

#[test]
fn multi_gpu_jobs_get_distinct_gpus_or_none() {
    let mut st = NodeState::default();
    let g = node();
    let d = Demand { policy: Policy::Magm, count: 2, estimate_mib: Some(4096), mps_uid: None, profile: None };
    assert_eq!(choose(&g, &mut st, &d, &P, &HashMap::new()).unwrap().gpus, vec![1, 0]);
    let d = Demand { count: 4, ..d };
    let e = choose(&g, &mut st, &d, &P, &HashMap::new()).unwrap_err();
    assert!(e.to_string().starts_with("3 of 4 GPUs qualify, 4 needed"), "{e}");
}

#[test]
fn promised_but_not_yet_allocated_memory_counts() {
    // Job 7 was promised 16 GiB on GPU0 and has allocated 6 GiB of it so far.
    let mut g = vec![gpu(0, 6144, 0.2)];
    g[0].processes = vec![GpuProcess { pid: 500, used_mib: 6144 }];
    let mut st = NodeState::default();
    st.reservations.push(carma(7, vec![0], 16384, 42));
    let owners: HashMap<u32, u32> = [(500, 42)].into();
    assert_eq!(promised_mib(&g[0], &st, &owners), 10240);
    // 40960 - 6144 used - 10240 still promised = 24576 effective free.
    assert_eq!(effective_free_mib(&g[0], &st, &owners), 24576);
    let ok = choose(&g, &mut st, &demand(Policy::Magm, 22528), &P, &owners);
    assert!(ok.is_ok());
    assert!(choose(&g, &mut st, &demand(Policy::Magm, 22529), &P, &owners).is_err());
    // Unattributed processes do not reduce the promise (conservative).
    assert_eq!(promised_mib(&g[0], &st, &HashMap::new()), 16384);
    // A job that uses more than its estimate promises nothing more.
    g[0].processes[0].used_mib = 20000;
    assert_eq!(promised_mib(&g[0], &st, &owners), 0);
}

#[test]
fn exclusive_and_slurm_whole_gpus_are_never_targets() {
    let g = vec![gpu(0, 0, 0.0), gpu(1, 0, 0.0)];
    let mut st = NodeState::default();
    st.reservations.push(Reservation { exclusive: true, ..carma(1, vec![0], 40960, 9) });
    st.reservations.push(Reservation { holding: Holding::SlurmWhole, ..carma(2, vec![1], 40960, 8) });
    let e = pick(&g, &mut st, demand(Policy::Magm, 1000)).unwrap_err();
    let s = e.to_string();
    assert!(s.contains("GPU0: held exclusively by job 1") && s.contains("GPU1: held whole by Slurm job 2"), "{s}");
}

#[test]
fn an_mps_gpu_serves_one_user_at_a_time() {
    let mut g = vec![gpu(0, 0, 0.0), gpu(1, 0, 0.0), gpu(2, 0, 0.0)];
    let mut st = NodeState::default();
    // User 1001's MPS job placed on GPU0 (its server may not run yet).
    st.reservations.push(Reservation { mps_uid: Some(1001), ..carma(1, vec![0], 1000, 9) });
    // A server for user 7 runs on GPU1 without a CARMA job.
    g[1].mps_uid = Some(7);
    let mps = |uid| Demand { mps_uid: Some(uid), ..demand(Policy::FirstFit, 1000) };
    let (_, _, why) = assess(&g, &st, &mps(1002), &P, &HashMap::new());
    assert_eq!(why[0].1, Some(Reject::MpsUser(1001)));
    assert_eq!(why[1].1, Some(Reject::MpsUser(7)));
    assert_eq!(why[2].1, None);
    assert!(why[0].1.as_ref().unwrap().to_string().contains("serves another user (uid 1001)"));
    // The same user joins its own server; a job outside MPS is not bound.
    assert_eq!(choose(&g, &mut st, &mps(1001), &P, &HashMap::new()).unwrap().gpus, vec![0]);
    assert_eq!(choose(&g, &mut st, &demand(Policy::FirstFit, 1000), &P, &HashMap::new()).unwrap().gpus, vec![0]);
}

#[test]
fn exclusive_policy_never_shares_and_is_not_shared() {
    let g = vec![gpu(0, 0, 0.0), gpu(1, 0, 0.0)];
    let mut st = NodeState::default();
    st.reservations.push(carma(1, vec![0], 1000, 9));
    let c = choose(&g, &mut st, &demand(Policy::Exclusive, 1000), &P, &HashMap::new()).unwrap();
    assert_eq!(c.gpus, vec![1], "GPU0 has a job");
    assert!(c.exclusive);
    assert_eq!(c.reserve_mib, 40960);
}

#[test]
fn unknown_or_oversized_estimate_needs_whole_gpus() {
    let g = vec![gpu(0, 100, 0.0), gpu(1, 0, 0.0)];
    let mut st = NodeState::default();
    let d = Demand { policy: Policy::Magm, count: 1, estimate_mib: None, mps_uid: None, profile: None };
    let c = choose(&g, &mut st, &d, &P, &HashMap::new()).unwrap();
    assert_eq!((c.gpus, c.exclusive), (vec![1], true));
    let c = choose(&g, &mut st, &demand(Policy::Magm, 39000), &P, &HashMap::new()).unwrap();
    assert_eq!((c.gpus, c.exclusive), (vec![1], true), "39000 + 2048 headroom exceeds 40960");
}

/// A model node: placed jobs allocate part of their estimate over time.
#[derive(Debug, Clone)]
enum Op {
    Place { policy: usize, est: u64, count: u32 },
    Allocate { job: usize, fraction: f64 },
    Release { job: usize },
    Crash { job: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0usize..6, 512u64..30000, 1u32..3).prop_map(|(policy, est, count)| Op::Place { policy, est, count }),
        (0usize..16, 0.0f64..1.0).prop_map(|(job, fraction)| Op::Allocate { job, fraction }),
        (0usize..16).prop_map(|job| Op::Release { job }),
        (0usize..16).prop_map(|job| Op::Crash { job }),
    ]
}

proptest! {
    #[test]
    fn never_promised_beyond_capacity_and_release_restores(ops in proptest::collection::vec(op(), 1..60)) {
        let mut st = NodeState::default();
        // job id -> (gpus, estimate, allocated per gpu, holder alive)
        let mut jobs: Vec<(u32, Vec<u32>, u64, u64)> = vec![];
        let mut next = 1u32;
        let mut alive_holders: Vec<u32> = vec![];
        let readings = |jobs: &Vec<(u32, Vec<u32>, u64, u64)>| -> Vec<GpuReading> {
            (0..4).map(|i| {
                let procs: Vec<GpuProcess> = jobs.iter().filter(|j| j.1.contains(&i) && j.3 > 0)
                    .map(|j| GpuProcess { pid: 10_000 + j.0, used_mib: j.3 }).collect();
                GpuReading { used_mib: procs.iter().map(|p| p.used_mib).sum(), processes: procs, ..gpu(i, 0, 0.1) }
            }).collect()
        };
        for op in ops {
            let owners: HashMap<u32, u32> = jobs.iter().map(|j| (10_000 + j.0, j.0)).collect();
            match op {
                Op::Place { policy, est, count } => {
                    let g = readings(&jobs);
                    let d = Demand { policy: Policy::ALL[policy], count, estimate_mib: Some(est), mps_uid: None, profile: None };
                    if let Ok(c) = choose(&g, &mut st, &d, &P, &owners) {
                        let job = next; next += 1;
                        prop_assert_eq!(c.gpus.len(), count as usize);
                        st.reservations.push(Reservation { exclusive: c.exclusive, reserved_mib: c.reserve_mib, ..carma(job, c.gpus.clone(), 0, job) });
                        alive_holders.push(job);
                        jobs.push((job, c.gpus, c.reserve_mib, 0));
                    }
                }
                Op::Allocate { job, fraction } => if let Some(j) = jobs.get_mut(job) {
                    j.3 = (j.2 as f64 * fraction) as u64;
                },
                Op::Release { job } => if job < jobs.len() {
                    let j = jobs.remove(job);
                    st.release_holder(j.0, j.0);
                    alive_holders.retain(|&h| h != j.0);
                },
                Op::Crash { job } => if job < jobs.len() {
                    let j = jobs.remove(job);
                    alive_holders.retain(|&h| h != j.0);
                    st.collect_garbage(|_, h| alive_holders.contains(&h), |_| false);
                },
            }
            // Invariant: on every GPU, live use plus promises stays within
            // capacity minus headroom, or one job holds it exclusively.
            let owners: HashMap<u32, u32> = jobs.iter().map(|j| (10_000 + j.0, j.0)).collect();
            for g in readings(&jobs) {
                let on: Vec<_> = st.reservations.iter().filter(|r| r.gpus.contains(&g.index)).collect();
                if on.iter().any(|r| r.exclusive) {
                    prop_assert_eq!(on.len(), 1, "exclusive GPU shared");
                } else {
                    prop_assert!(g.used_mib + promised_mib(&g, &st, &owners) <= g.total_mib - P.headroom_mib,
                        "GPU{} over-promised: used {} + promised {}", g.index, g.used_mib, promised_mib(&g, &st, &owners));
                }
            }
        }
        for j in std::mem::take(&mut jobs) {
            st.release_holder(j.0, j.0);
        }
        prop_assert_eq!(st.reservations, NodeState::default().reservations);
    }
}

#[test]
fn observed_peaks_become_history_that_only_raises_estimates() {
    let mut st = NodeState::default();
    st.reservations.push(Reservation { signature: Some("00000000000000aa".into()), ..carma(1, vec![0], 1000, 10) });
    st.reservations.push(carma(2, vec![1], 1000, 20)); // no signature: nothing to remember
    // GPU0's process 1000 belongs to job 1's slurmstepd (10); GPU1's to job 2's.
    let owners: HashMap<u32, u32> = [(1000, 10), (1001, 20)].into();
    observe(&mut st, &[gpu(0, 6000, 0.2), gpu(1, 3000, 0.2)], &owners);
    observe(&mut st, &[gpu(0, 4000, 0.2), gpu(1, 3000, 0.2)], &owners); // lower later: the peak stays
    assert_eq!(st.job(1).map(|r| r.observed_mib), Some(6000));
    st.release_holder(1, 10);
    st.release_job(2);
    assert_eq!(st.history.len(), 1, "{:?}", st.history);
    assert_eq!(history_estimate(&st, Some("00000000000000aa"), Some(1000), false), Some(6600), "peak + 10%");
    assert_eq!(history_estimate(&st, Some("00000000000000aa"), Some(8000), false), None, "never lowers");
    assert_eq!(history_estimate(&st, Some("00000000000000aa"), None, false), None, "unknown stays whole GPUs");
    assert_eq!(history_estimate(&st, Some("00000000000000bb"), Some(1000), false), None);
    assert_eq!(history_estimate(&st, None, Some(1000), false), None);
    // A job that declared nothing: its history is its estimate, either way.
    assert_eq!(history_estimate(&st, Some("00000000000000aa"), Some(8000), true), Some(6600), "replaces a default");
    assert_eq!(history_estimate(&st, Some("00000000000000aa"), None, true), Some(6600), "replaces whole GPUs");
    assert_eq!(history_estimate(&st, Some("00000000000000bb"), None, true), None);
    // Bounded: the oldest-sorting signatures go first.
    for i in 0..HISTORY_MAX as u64 + 10 {
        st.reservations.push(Reservation {
            signature: Some(format!("{i:016x}")),
            observed_mib: 1,
            ..carma(9, vec![0], 1, 9)
        });
        st.release_job(9);
    }
    assert_eq!(st.history.len(), HISTORY_MAX);
}

#[test]
fn the_cap_applies_to_the_configured_reading_and_the_reason_names_it() {
    use carma_config::ActivityMetric;
    // GPU0: low SM activity, busy most of the time (time-sliced light jobs);
    // GPU1: the reverse.
    let gpus = vec![GpuReading { busy: 0.95, ..gpu(0, 8192, 0.30) }, GpuReading { busy: 0.40, ..gpu(1, 8192, 0.85) }];
    let mut st = NodeState::default();
    let sm = Params { metric: ActivityMetric::Sm, ..P };
    let c = choose(&gpus, &mut st, &demand(Policy::Magm, 4096), &sm, &HashMap::new()).unwrap();
    assert_eq!((c.gpus.clone(), c.activity.clone()), (vec![0], vec![0.30]));
    let busy = Params { metric: ActivityMetric::Busy, busy_cap: 0.9, ..P };
    let c = choose(&gpus, &mut st, &demand(Policy::Magm, 4096), &busy, &HashMap::new()).unwrap();
    assert_eq!((c.gpus.clone(), c.activity.clone()), (vec![1], vec![0.40]));
    // Both refused: each reason names its reading.
    let both = vec![gpus[0].clone(), GpuReading { busy: 0.99, ..gpus[1].clone() }];
    let e = choose(&both, &mut st, &demand(Policy::Magm, 4096), &busy, &HashMap::new()).unwrap_err().to_string();
    assert!(e.contains("GPU0: busy 0.95 > cap 0.90") && e.contains("GPU1: busy 0.99 > cap 0.90"), "{e}");
    let e =
        choose(&both, &mut st, &demand(Policy::Magm, 4096), &Params { sm_activity_cap: 0.2, ..sm }, &HashMap::new())
            .unwrap_err()
            .to_string();
    assert!(e.contains("GPU0: SM activity 0.30 > cap 0.20"), "{e}");
    // Least-utilized ranks by the configured reading.
    let lug = |p: &Params| {
        choose(
            &gpus,
            &mut NodeState::default(),
            &demand(Policy::LeastUtilized, 1024),
            &Params { sm_activity_cap: 1.0, busy_cap: 1.0, ..*p },
            &HashMap::new(),
        )
        .unwrap()
        .gpus
    };
    assert_eq!((lug(&sm), lug(&busy)), (vec![0], vec![1]));
}

#[test]
fn the_admission_count_is_what_shared_jobs_could_still_get_in_whole_gib() {
    let mut st = NodeState::default();
    // GPU0 20G used, GPU1 10G, GPU2 30G, GPU3 over the SM cap.
    let g = node();
    assert_eq!(admissible_gib(&g, &st, &HashMap::new(), &P), 20 + 30 + 10);
    // A CARMA promise of 15.5G on GPU1, whose 10G in use is another
    // process's: 40 - 10 - 15.5 = 14.5G free -> 14.
    st.reservations.push(carma(7, vec![1], 10240 + 5632, 1001));
    assert_eq!(admissible_gib(&g, &st, &HashMap::new(), &P), 20 + 14 + 10);
    // GPU2 given whole by Slurm: none of it.
    let mut whole = carma(8, vec![2], 0, 1);
    whole.holding = Holding::SlurmWhole;
    st.reservations.push(whole);
    assert_eq!(admissible_gib(&g, &st, &HashMap::new(), &P), 20 + 14);
}

/// A burst of 8 launches on 4 idle GPUs: the readings show none of them
/// yet, so without counting what they will add `ff` and `bf` would put all
/// 8 on GPU0. Each policy spreads them within the activity cap (at most 3
/// jobs per GPU within a window), and says why a GPU is passed over.
#[test]
fn a_burst_spreads_per_the_activity_cap_with_each_policy() {
    let now = 10_000;
    let p = Params { window_secs: 60, now_secs: now, ..P };
    let gpus: Vec<_> = (0..4).map(|i| gpu(i, 0, 0.0)).collect();
    for policy in [Policy::FirstFit, Policy::BestFit, Policy::Magm, Policy::LeastUtilized, Policy::RoundRobin] {
        let mut st = NodeState::default();
        let mut per_gpu = [0usize; 4];
        for job in 0..8u32 {
            let c = choose(&gpus, &mut st, &demand(policy, 4096), &p, &HashMap::new()).unwrap();
            per_gpu[c.gpus[0] as usize] += 1;
            st.reservations.push(Reservation { since: now - 1, ..carma(job, c.gpus.clone(), 4096, 5000 + job) });
        }
        assert!(per_gpu.iter().all(|&n| n <= 3), "{policy}: {per_gpu:?}");
        // Four more fill every GPU to 3; the next is refused on activity.
        for job in 8..12u32 {
            let c = choose(&gpus, &mut st, &demand(policy, 4096), &p, &HashMap::new()).unwrap();
            st.reservations.push(Reservation { since: now, ..carma(job, c.gpus.clone(), 4096, 5000 + job) });
        }
        let e = choose(&gpus, &mut st, &demand(policy, 4096), &p, &HashMap::new()).unwrap_err();
        assert_eq!(e.class(), "activity", "{policy}: {e}");
        assert!(e.to_string().contains("with 3 jobs placed within the window"), "{e}");
        // A window later the readings speak for them (here: low activity).
        let later = Params { now_secs: now + 60, ..p };
        let busy: Vec<_> = (0..4).map(|i| gpu(i, 0, 0.3)).collect();
        assert!(choose(&busy, &mut st, &demand(policy, 4096), &later, &HashMap::new()).is_ok(), "{policy}");
    }
}

/// Only CARMA's shared placements within the window count, and no window
/// (the trace simulator's readings) counts none.
#[test]
fn only_recent_shared_placements_add_expected_activity() {
    let p = Params { window_secs: 60, now_secs: 1_000, ..P };
    let g = gpu(0, 0, 0.1);
    let mut st = NodeState::default();
    st.reservations.push(Reservation { since: 990, ..carma(1, vec![0], 4096, 11) });
    st.reservations.push(Reservation { since: 900, ..carma(2, vec![0], 4096, 12) });
    st.reservations.push(Reservation { since: 995, ..carma(3, vec![1], 4096, 13) });
    let (value, recent) = expected_activity(&g, &st, &p);
    assert_eq!(recent, 1);
    // Half the cap, less the sixth of the window that has seen it.
    assert!((value - (0.1 + 0.4 * 50.0 / 60.0)).abs() < 1e-9, "{value}");
    assert_eq!(expected_activity(&g, &st, &P), (0.1, 0));
}

/// carma-monitor publishes every few seconds, so its window ends before
/// now: a job placed a window ago is only partly in the published means
/// yet, and keeps counting for the rest. Counted by its age now instead,
/// a job that keeps its GPU fully busy read 0.67 for the last seconds of a
/// 6 s window published 2 s ago, under a cap of 0.8, and a second job
/// joined a GPU that was already full (seen in the replay of #42).
#[test]
fn a_placed_job_counts_until_the_published_window_has_seen_it() {
    let now = 10_000;
    let p = Params { window_secs: 6, now_secs: now, ..P };
    let mut st = NodeState::default();
    st.reservations.push(Reservation { since: now - 6, ..carma(1, vec![0], 4096, 11) });
    // The published window, written 2 s ago, has the job's last 4 s at
    // most: full busy time reads 0.67.
    let g = gpu(0, 4096, 0.67);
    let published = Params { readings_ms: Some((now - 2) * 1000), ..p };
    let (value, recent) = expected_activity(&g, &st, &published);
    assert_eq!(recent, 1);
    // Seen 3 s of 6 (a second less for `since`'s rounding): half of the
    // half-cap still counts.
    assert!((value - (0.67 + 0.4 * 0.5)).abs() < 1e-9, "{value}");
    assert!(
        choose(std::slice::from_ref(&g), &mut st, &demand(Policy::Magm, 4096), &published, &HashMap::new()).is_err()
    );
    // Readings as of now (a direct source): its age is all the window.
    assert_eq!(expected_activity(&g, &st, &p), (0.67, 0));
    // Once the published window has seen all of it, the readings speak.
    let later = Params { readings_ms: Some((now + 1) * 1000), now_secs: now + 1, ..p };
    assert_eq!(expected_activity(&g, &st, &later), (0.67, 0));
    // Readings dated after now (a clock set back) are taken as of now: a
    // job placed 2 s ago still counts.
    st.reservations[0].since = now - 2;
    let ahead = Params { readings_ms: Some((now + 60) * 1000), ..p };
    assert_eq!(expected_activity(&g, &st, &ahead).1, 1);
}

#[test]
fn an_absurd_estimate_asks_for_a_whole_gpu_and_never_wraps_around() {
    // An "inf" or 1e30 from an OOM message, or a forged history: beyond
    // any GPU, so a GPU of its own, and nothing promised beyond its size.
    let mut st = NodeState::default();
    st.reservations.push(carma(1, vec![0], 4096, 77));
    let g = vec![gpu(0, 4096, 0.1), gpu(1, 0, 0.1)];
    for est in [u64::MAX, u64::MAX - 1000, 1 << 40] {
        let c = choose(&g, &mut st.clone(), &demand(Policy::Magm, est), &P, &HashMap::new()).unwrap();
        assert!(c.exclusive && c.gpus == vec![1], "{est}: {c:?}");
        assert_eq!(c.reserve_mib, 40960, "{est}");
    }
    // History of an absurd peak asks as much, without overflowing.
    st.history.insert("sig".into(), u64::MAX);
    assert_eq!(history_estimate(&st, Some("sig"), Some(1), false), Some(u64::MAX));
}
