//! The slowdown guard, idle GPUs first, `lug` by predicted load, and how
//! profiles are learned (issue #56). The H100 pairs' figures are from
//! data/h100/collocation.csv (solo busy, SM activity; measured slowdowns);
//! simulator/tests/guard_h100.rs replays every measured set.

use super::*;
use crate::gpu::GpuProcess;
use crate::test_support::carma;

/// carma.yaml's defaults, as of a decision at t = 1000 s.
const P: Params = Params {
    metric: ActivityMetric::Sm,
    sm_activity_cap: 0.8,
    busy_cap: 0.8,
    headroom_mib: 2048,
    window_secs: 0,
    now_secs: 1000,
    readings_ms: None,
    sharing: Sharing::Timeslice,
    max_slowdown: 1.6,
    max_slowdown_unprofiled: 2.0,
    idle_first: true,
    profile_after_secs: 0,
};

const RESNET50: Profile = Profile { busy: 0.98, sm: 0.825 };
const MOBILENET: Profile = Profile { busy: 0.541, sm: 0.312 };
const RESNET18: Profile = Profile { busy: 0.703, sm: 0.495 };

/// A GPU of 80 GiB running `jobs` (pid 100 + job), reading `sm`/`busy`.
fn gpu(index: u32, jobs: &[u32], sm: f64, busy: f64) -> GpuReading {
    GpuReading {
        sm_activity: sm,
        busy,
        used_mib: 4096 * jobs.len() as u64,
        processes: jobs.iter().map(|j| GpuProcess { pid: 100 + j, used_mib: 4096 }).collect(),
        ..GpuReading::idle(index, format!("GPU-{index}"), 81920)
    }
}

/// Job `job` placed on `gpus` with `profile`, its process pid 100 + job.
fn placed(job: u32, gpus: Vec<u32>, profile: Option<Profile>) -> Reservation {
    Reservation { profile, since: 0, ..carma(job, gpus, 4096, 1000 + job) }
}

fn owners(jobs: &[u32]) -> HashMap<u32, u32> {
    jobs.iter().map(|j| (100 + j, 1000 + j)).collect()
}

fn wants(profile: Option<Profile>, policy: Policy) -> Demand {
    Demand { policy, count: 1, estimate_mib: Some(4096), mps_uid: None, profile }
}

fn one(gpus: &[GpuReading], st: &NodeState, d: Demand, p: &Params) -> Result<Vec<u32>, NoFit> {
    choose(gpus, &mut st.clone(), &d, p, &owners(&[1, 2, 3])).map(|c| c.gpus)
}

#[test]
fn the_guard_refuses_a_heavy_pair_whichever_job_comes_first() {
    // The SM cap admits resnet50 onto mobilenet (reading 0.312) and
    // refuses the reverse (0.825): the same final set, run 1.95x slower.
    for (running, newcomer, reading) in [(MOBILENET, RESNET50, 0.312), (RESNET50, MOBILENET, 0.825)] {
        let mut st = NodeState::default();
        st.reservations.push(placed(1, vec![0], Some(running)));
        let g = [gpu(0, &[1], reading, running.busy)];
        let e = one(&g, &st, wants(Some(newcomer), Policy::Magm), &P).unwrap_err();
        assert!(matches!(e.reasons[0].1, Some(Reject::Slowdown { .. } | Reject::Activity { .. })), "{e}");
        // The guard alone refuses it, with the cap out of the way.
        let no_cap = Params { sm_activity_cap: 1.0, ..P };
        let e = one(&g, &st, wants(Some(newcomer), Policy::Magm), &no_cap).unwrap_err();
        assert!(
            e.to_string().contains("predicted slowdown 1.8") || e.to_string().contains("predicted slowdown 1.9"),
            "{e}"
        );
    }
}

#[test]
fn the_guard_admits_a_pair_that_stays_within_the_bound() {
    // mobilenet + resnet18: measured 1.45x both; predicted about 1.47x.
    let mut st = NodeState::default();
    st.reservations.push(placed(1, vec![0], Some(RESNET18)));
    let g = [gpu(0, &[1], 0.495, 0.703)];
    let c = choose(&g, &mut st, &wants(Some(MOBILENET), Policy::Magm), &P, &owners(&[1])).unwrap();
    assert_eq!(c.gpus, vec![0]);
    assert!(c.slowdown[0] > 1.3 && c.slowdown[0] <= 1.6, "{:?}", c.slowdown);
    // Off, the bound admits the heavy pair too.
    let off = Params { max_slowdown: f64::INFINITY, ..P };
    st.reservations[0].profile = Some(RESNET50);
    assert_eq!(one(&[gpu(0, &[1], 0.5, 0.98)], &st, wants(Some(RESNET50), Policy::Magm), &off).unwrap(), vec![0]);
}

#[test]
fn an_unprofiled_job_counts_as_filling_the_gpu_and_its_own_worst_case_is_bounded_apart() {
    let mut st = NodeState::default();
    st.reservations.push(placed(1, vec![0], Some(RESNET18)));
    let g = [gpu(0, &[1], 0.495, 0.703)];
    // Beside resnet18 (busy 0.70), a job that may fill the GPU would slow
    // resnet18 1.76x: refused, protecting the profiled job.
    let e = one(&g, &st, wants(None, Policy::Magm), &P).unwrap_err();
    assert!(
        e.to_string().contains("predicted slowdown 1.76x > bound 1.60x")
            && e.to_string().contains("1 not yet profiled"),
        "{e}"
    );
    // Beside mobilenet (0.54): mobilenet 1.46x at worst, and the newcomer's
    // own worst case 1.98x, within max_slowdown_unprofiled (2.0).
    st.reservations[0].profile = Some(MOBILENET);
    let c =
        choose(&[gpu(0, &[1], 0.312, 0.541)], &mut st.clone(), &wants(None, Policy::Magm), &P, &owners(&[1])).unwrap();
    assert!((c.slowdown[0] - 1.98).abs() < 0.01, "{:?}", c.slowdown);
    // Bounded like the others (max_slowdown_unprofiled = max_slowdown), it is refused.
    let strict = Params { max_slowdown_unprofiled: 1.6, ..P };
    let e = one(&[gpu(0, &[1], 0.312, 0.541)], &st, wants(None, Policy::Magm), &strict).unwrap_err();
    assert!(e.to_string().contains("> bound 1.60x"), "{e}");
    // Two jobs not yet profiled never share (2.28x each at worst).
    st.reservations[0].profile = None;
    let e = one(&g, &st, wants(None, Policy::Magm), &P).unwrap_err();
    assert!(
        e.to_string().contains("predicted slowdown 2.28x > bound 2.00x")
            && e.to_string().contains("2 not yet profiled"),
        "{e}"
    );
    // A heavy profiled job beside an unprofiled one: the latter's worst case is 2.27x.
    assert_eq!(one(&g, &st, wants(Some(RESNET50), Policy::Magm), &P).unwrap_err().class(), "slowdown");
    // A very light job fits beside it (a tiny MLP: busy 0.124): 1.33x at worst.
    let tiny = Profile { busy: 0.124, sm: 0.006 };
    assert_eq!(one(&g, &st, wants(Some(tiny), Policy::Magm), &P).unwrap(), vec![0]);
}

#[test]
fn an_idle_gpu_is_taken_before_a_busy_one_under_every_sharing_policy() {
    // GPU0 runs a light job; GPU1 is idle; GPU2 has the most free memory
    // but runs a job too.
    let mut st = NodeState::default();
    st.reservations.push(placed(1, vec![0], Some(MOBILENET)));
    st.reservations.push(placed(2, vec![2], Some(MOBILENET)));
    let g = [gpu(0, &[1], 0.3, 0.54), gpu(1, &[], 0.0, 0.0), GpuReading { used_mib: 0, ..gpu(2, &[2], 0.3, 0.54) }];
    for policy in [Policy::Magm, Policy::BestFit, Policy::FirstFit, Policy::LeastUtilized, Policy::RoundRobin] {
        let light = Profile { busy: 0.2, sm: 0.1 };
        assert_eq!(one(&g, &st, wants(Some(light), policy), &P).unwrap(), vec![1], "{policy}");
        // Without the rule, first fit packs GPU0 and best fit the fullest.
        if policy == Policy::FirstFit || policy == Policy::BestFit {
            let packed = one(&g, &st, wants(Some(light), policy), &Params { idle_first: false, ..P }).unwrap();
            assert_eq!(packed, vec![0], "{policy}");
        }
    }
}

#[test]
fn least_utilized_ranks_by_predicted_load_not_by_the_reading() {
    // Time-sliced, GPU0 runs two jobs that slow each other (1.14x) and
    // read only 0.45 SM; GPU1 runs one light job reading 0.5. The reading
    // would pick GPU0 (about 1.47x with the newcomer); the prediction
    // picks GPU1 (1x).
    let mut st = NodeState::default();
    let light = Profile { busy: 0.5, sm: 0.25 };
    st.reservations.push(placed(1, vec![0], Some(light)));
    st.reservations.push(placed(2, vec![0], Some(light)));
    st.reservations.push(placed(3, vec![1], Some(Profile { busy: 0.35, sm: 0.5 })));
    let g = [gpu(0, &[1, 2], 0.45, 0.9), gpu(1, &[3], 0.5, 0.35)];
    let tiny = Profile { busy: 0.1, sm: 0.05 };
    let p = Params { idle_first: false, ..P };
    let c = choose(&g, &mut st.clone(), &wants(Some(tiny), Policy::LeastUtilized), &p, &owners(&[1, 2, 3])).unwrap();
    assert_eq!(c.gpus, vec![1], "{c:?}");
}

#[test]
fn a_job_is_profiled_from_a_whole_window_in_which_it_ran_alone_under_its_key() {
    let mut st = NodeState::default();
    st.reservations.push(Reservation { profile_key: Some("7:sig".into()), ..placed(1, vec![0], None) });
    st.reservations.push(placed(2, vec![1], None));
    st.reservations.push(placed(3, vec![1], None));
    let g = [gpu(0, &[1], 0.31, 0.54), gpu(1, &[2, 3], 0.6, 0.99)];
    let o = owners(&[1, 2, 3]);
    let p = Params { window_secs: 60, ..P };
    let at = |t: u64| Params { now_secs: t, ..p };
    // Placed at 0 s; its process first seen alone at 100 s (its start-up
    // ran before): timed from then, not from its placement.
    assert_eq!(learn_profiles(&mut st, &[gpu(0, &[], 0.0, 0.0)], &o, &at(50)), 0, "no process yet");
    assert_eq!(learn_profiles(&mut st, &g, &o, &at(100)), 1, "alone from now");
    assert_eq!(st.reservations[0].alone_since, Some(100));
    assert_eq!(learn_profiles(&mut st, &g, &o, &at(130)), 0, "the window still holds its start");
    assert_eq!(learn_profiles(&mut st, &g, &o, &at(160)), 1, "only job 1 runs alone");
    let seen = Profile { busy: 0.54, sm: 0.31 };
    assert_eq!((st.reservations[0].profile, st.profiles.get("7:sig").copied()), (Some(seen), Some(seen)));
    assert_eq!((st.reservations[1].profile, st.reservations[2].profile), (None, None));
    // Profiles only rise: a quieter window leaves it; a busier one raises it.
    assert_eq!(learn_profiles(&mut st, &[gpu(0, &[1], 0.1, 0.2)], &o, &at(170)), 0);
    assert_eq!(learn_profiles(&mut st, &[gpu(0, &[1], 0.4, 0.5)], &o, &at(180)), 1);
    assert_eq!(st.profiles["7:sig"], Profile { busy: 0.54, sm: 0.4 });
    // A process that is not the job's on its GPU: it is not alone, and
    // when it is again, a whole window must pass before it is read.
    let shared = [GpuReading {
        processes: vec![GpuProcess { pid: 101, used_mib: 1 }, GpuProcess { pid: 999, used_mib: 1 }],
        ..gpu(0, &[1], 0.9, 0.9)
    }];
    assert_eq!(learn_profiles(&mut st, &shared, &o, &at(190)), 1);
    assert_eq!(st.reservations[0].alone_since, None);
    assert_eq!(learn_profiles(&mut st, &[gpu(0, &[1], 0.9, 0.9)], &o, &at(200)), 1);
    assert_eq!(learn_profiles(&mut st, &[gpu(0, &[1], 0.9, 0.9)], &o, &at(230)), 0);
    assert_eq!(st.profiles["7:sig"], Profile { busy: 0.54, sm: 0.4 });
    // Directly read (no published window), profile_after_secs bounds it alike.
    let direct = Params { window_secs: 0, profile_after_secs: 60, ..P };
    let mut fresh = NodeState::default();
    fresh.reservations.push(Reservation { profile_key: Some("7:b".into()), ..placed(1, vec![0], None) });
    learn_profiles(&mut fresh, &g, &o, &Params { now_secs: 10, ..direct });
    assert_eq!(learn_profiles(&mut fresh, &g, &o, &Params { now_secs: 40, ..direct }), 0);
    assert!(learn_profiles(&mut fresh, &g, &o, &Params { now_secs: 70, ..direct }) > 0);
}

#[test]
fn every_running_job_of_a_key_takes_what_one_of_them_taught_alone() {
    let mut st = NodeState::default();
    st.reservations.push(Reservation { profile_key: Some("7:k".into()), ..placed(1, vec![0], None) });
    // Job 2 of the same key shares GPU1 with job 3: never alone.
    st.reservations.push(Reservation { profile_key: Some("7:k".into()), ..placed(2, vec![1], None) });
    st.reservations.push(placed(3, vec![1], None));
    let g = [gpu(0, &[1], 0.3, 0.5), gpu(1, &[2, 3], 0.5, 0.9)];
    let o = owners(&[1, 2, 3]);
    learn_profiles(&mut st, &g, &o, &Params { now_secs: 10, ..P });
    learn_profiles(&mut st, &g, &o, &Params { now_secs: 11, ..P });
    assert_eq!(st.reservations[1].profile, Some(Profile { busy: 0.5, sm: 0.3 }));
    assert_eq!(st.reservations[2].profile, None);
}

#[test]
fn an_mps_server_is_no_jobs_process() {
    // The server stays after its clients end: the GPU is idle, and a
    // client alone with it runs alone.
    let server = GpuProcess { pid: 4242, used_mib: 66 };
    let idle = GpuReading { processes: vec![server.clone()], mps_server_pid: Some(4242), ..gpu(0, &[], 0.0, 0.0) };
    let busy = gpu(1, &[], 0.0, 0.0);
    let mut st = NodeState::default();
    st.reservations.push(placed(1, vec![1], Some(MOBILENET)));
    let g =
        [idle.clone(), GpuReading { processes: vec![GpuProcess { pid: 101, used_mib: 1 }], used_mib: 4096, ..busy }];
    let light = Profile { busy: 0.1, sm: 0.05 };
    let p = Params { idle_first: true, ..P };
    let c = choose(&g, &mut st.clone(), &wants(Some(light), Policy::BestFit), &p, &owners(&[1])).unwrap();
    assert_eq!(c.gpus, vec![0], "the server's GPU is idle");
    let mut st = NodeState::default();
    st.reservations.push(Reservation { mps_uid: Some(7), ..placed(1, vec![0], None) });
    let alone = GpuReading { processes: vec![server, GpuProcess { pid: 101, used_mib: 1 }], ..idle };
    let mps = Params { sharing: Sharing::Mps, ..P };
    learn_profiles(&mut st, std::slice::from_ref(&alone), &owners(&[1]), &Params { now_secs: 10, ..mps });
    learn_profiles(&mut st, &[alone], &owners(&[1]), &Params { now_secs: 11, ..mps });
    assert!(st.reservations[0].profile.is_some(), "a client alone with the server is profiled");
}

#[test]
fn an_mps_clients_readings_alone_are_taken_back_to_a_plain_processs() {
    // resnet50 alone as an MPS client read SM 0.70, busy 0.83 on the H100;
    // plainly 0.825 and 0.98. Its profile is the plain one (the model's
    // input), within the readings' rounding.
    let mut st = NodeState::default();
    st.reservations.push(Reservation {
        mps_uid: Some(7),
        profile_key: Some("7:r50".into()),
        ..placed(1, vec![0], None)
    });
    let p = Params { sharing: Sharing::Mps, ..P };
    assert!(learn_profiles(&mut st, &[gpu(0, &[1], 0.70, 0.828)], &owners(&[1]), &p) > 0);
    let learned = st.profiles["7:r50"];
    assert!((learned.sm - 0.798).abs() < 0.01 && (learned.busy - 0.944).abs() < 0.01, "{learned:?}");
    // Time-sliced, or not an MPS client: the reading as it is.
    let mut plain = NodeState::default();
    plain.reservations.push(Reservation { profile_key: Some("7:r50".into()), ..placed(1, vec![0], None) });
    learn_profiles(&mut plain, &[gpu(0, &[1], 0.70, 0.828)], &owners(&[1]), &p);
    assert_eq!(plain.profiles["7:r50"], Profile { busy: 0.828, sm: 0.70 });
}
