//! The guard replayed on the H100's measured sets (data/h100/collocation.csv)
//! through the plugin's own decision (`carma_placement::decide`): each job
//! of each set in turn is the newcomer, the others already run on the GPU
//! with their profiles (learned as they ran alone) and the GPU reads what
//! they read alone. With carma.yaml's defaults, a newcomer is admitted
//! exactly where the set's measured worst slowdown (a job's it/s alone as
//! a plain process over its it/s in the set) is within 1.6x.

use carma_config::{LearnRuntime, Policy, Sharing};
use carma_placement::{GpuProcess, GpuReading, NodeState, Params, Request, Reservation, StepRef};
use carma_simulator::calibration::read_collocation;
use carma_simulator::jobcheck::{job_checks, set_worsts, solo_profiles};
use std::collections::HashMap;
use std::path::Path;

/// Whether `newcomer` is placed on a GPU running `others` (job i: pid 100 + i).
fn admitted(sharing: Sharing, others: &[&str], newcomer: &str, params: &Params) -> bool {
    let rows = read_collocation(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/h100/collocation.csv")).unwrap();
    let solo = solo_profiles(&rows);
    let mut st = NodeState::default();
    let mut owners = HashMap::new();
    let (mut sm, mut busy) = (0.0, 0.0);
    for (i, job) in others.iter().enumerate() {
        let (profile, _) = solo[*job];
        let i = i as u32;
        st.reservations.push(Reservation {
            profile: Some(profile),
            since: 0,
            ..Reservation::slurm_whole(i + 1, vec![0], 0)
        });
        let r = st.reservations.last_mut().unwrap();
        (r.holding, r.exclusive, r.reserved_mib, r.holders) =
            (carma_placement::Holding::Carma, false, 4096, vec![1000 + i]);
        owners.insert(100 + i, 1000 + i);
        // One job runs before the newcomer comes: what it read alone in
        // this mode (resnet50 alone under MPS read 0.70 SM; the others
        // were measured alone as plain processes only).
        let alone = rows.iter().find(|r| r.sharing == sharing && r.jobs.len() == 1 && r.jobs[0] == *job);
        sm += alone.map_or(profile.sm, |r| r.sm);
        busy += alone.map_or(profile.busy, |r| r.busy);
    }
    let gpu = GpuReading {
        sm_activity: sm.min(1.0),
        busy: busy.min(1.0),
        used_mib: 4096 * others.len() as u64,
        processes: (0..others.len() as u32).map(|i| GpuProcess { pid: 100 + i, used_mib: 4096 }).collect(),
        ..GpuReading::idle(0, "GPU-0", 81920)
    };
    st.profiles.insert("1000:newcomer".into(), solo[newcomer].0);
    let req = Request { profile_key: Some("1000:newcomer".into()), ..Request::declared(Policy::Magm, 4096) };
    let p = Params { sharing, now_secs: 1000, ..*params };
    carma_placement::decide::decide(
        &mut st,
        StepRef { job: 99, holder: 9999 },
        &req,
        &[gpu],
        &owners,
        &p,
        &LearnRuntime::default(),
        1000,
        &mut |_| false,
    )
    .is_ok()
}

/// (sharing, jobs, worst measured slowdown) of every set of two or more jobs.
fn sets() -> Vec<(Sharing, Vec<String>, f64)> {
    let rows = read_collocation(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/h100/collocation.csv")).unwrap();
    set_worsts(&job_checks(&rows).unwrap())
        .into_iter()
        .filter(|s| s.1.contains('+'))
        .map(|(sharing, set, measured, _)| (sharing, set.split('+').map(str::to_string).collect(), measured))
        .collect()
}

/// Every (set, newcomer) decision with `params`: (what it should be, what it was).
fn decisions(params: &Params) -> Vec<(String, bool, bool)> {
    let mut out = Vec::new();
    for (sharing, jobs, worst) in sets() {
        for (i, newcomer) in jobs.iter().enumerate() {
            let others: Vec<&str> = jobs.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, s)| s.as_str()).collect();
            let label = format!("{} {} joining {}", sharing.name(), newcomer, others.join("+"));
            out.push((label, worst <= 1.6, admitted(sharing, &others, newcomer, params)));
        }
    }
    out
}

#[test]
fn a_newcomer_is_admitted_exactly_where_the_measured_worst_slowdown_is_within_the_bound() {
    let d = decisions(&Params::default());
    assert_eq!(d.len(), 16, "8 pairs, each job in turn the newcomer");
    for (label, should, was) in &d {
        println!(
            "{label}: measured {}, decided {}",
            if *should { "within" } else { "over" },
            if *was { "admit" } else { "refuse" }
        );
    }
    for (label, should, was) in &d {
        assert_eq!(should, was, "{label}");
    }
}

#[test]
fn without_the_guard_the_activity_cap_admits_sets_that_run_too_slow() {
    // main ace4a96's rule: the SM cap alone. resnet50 joins mobilenet
    // (reading 0.31) and runs 1.95x slower; the reverse is refused (0.82).
    let d = decisions(&Params { max_slowdown: f64::INFINITY, ..Params::default() });
    let wrong: Vec<&String> = d.iter().filter(|(_, should, was)| should != was).map(|(l, _, _)| l).collect();
    assert!(wrong.iter().any(|l| l.as_str() == "timeslice resnet50_64 joining mobilenetv3_32"), "{wrong:?}");
}
