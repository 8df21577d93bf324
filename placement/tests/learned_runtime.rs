//! The node's learned fixed memory, through the placer: jobs placed with a
//! model-based estimate and then released with an observed peak teach the
//! node its stack's fixed part, which later model-based estimates use in
//! place of their own where it is larger. Declared estimates and history
//! are left alone.

use carma_config::{LearnRuntime, Policy};
use carma_placement::source::SimulatedGpus;
use carma_placement::{LinuxProcesses, Params, Placer, Request, StateStore, StepRef};
use std::path::{Path, PathBuf};
use std::time::Duration;

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn node(name: &str) -> Dir {
    let d = std::env::temp_dir().join(format!("carma-learned-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join("procs")).unwrap();
    std::fs::create_dir_all(d.join("state")).unwrap();
    std::fs::set_permissions(d.join("state"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let yaml = format!("process_dir: {}\ngpus:\n  - {{index: 0, memory_total: 80G}}\n", d.join("procs").display());
    std::fs::write(d.join("gpus.yaml"), yaml).unwrap();
    Dir(d)
}

fn store(dir: &Path) -> StateStore {
    StateStore::open(&dir.join("state"), Duration::from_secs(10), Box::new(|_| {})).unwrap()
}

fn placer(dir: &Path) -> Placer {
    let source = Box::new(SimulatedGpus::load(&dir.join("gpus.yaml")).unwrap());
    let mut p = Placer::new(store(dir), source, Params::default(), Box::new(LinuxProcesses), Box::new(|_| {}));
    p.set_learn_runtime(LearnRuntime { min_jobs: 2, window: 4, quantile: 0.75, max_mib: 4096 });
    p
}

fn request(mib: u64, runtime_mib: Option<u64>, signature: Option<&str>) -> Request {
    Request {
        estimate_source: "layers".into(),
        signature: signature.map(str::to_string),
        runtime_mib,
        uid: Some(7),
        within: None,
        ..Request::declared(Policy::Magm, mib)
    }
}

fn samples(dir: &Path, uid: u32) -> Vec<u64> {
    store(dir).snapshot().unwrap().runtime_by_user[&uid].samples.clone()
}

/// Places `job`, records `peak` as what its processes were seen using
/// (what carma-monitor or a later decision would record), and ends it.
fn run(p: &mut Placer, dir: &Path, job: u32, req: &Request, peak: u64) -> carma_placement::Decision {
    let step = StepRef { job, holder: std::process::id() };
    let d = p.try_place(step, req).unwrap();
    store(dir).update(|st| st.job_mut(job).unwrap().observed_mib = peak).unwrap();
    p.release(step).unwrap().expect("released");
    d
}

#[test]
fn finished_jobs_teach_the_node_its_fixed_memory() {
    let d = node("teach");
    let mut p = placer(&d.0);
    // A stack whose fixed part is 1900 MiB, not the 700 the estimates carry:
    // each job peaks at its model part (5000) + 1900.
    let first = run(&mut p, &d.0, 1, &request(5700, Some(700), None), 6900);
    assert_eq!((first.reserve_mib, first.learned_runtime_mib), (5700, None));
    let second = run(&mut p, &d.0, 2, &request(5700, Some(700), None), 6900);
    assert_eq!((second.reserve_mib, second.learned_runtime_mib), (5700, None), "1 of 2 jobs observed");
    assert_eq!(samples(&d.0, 7), vec![1900, 1900]);
    // Now learned: a 3000 MiB model gets 3000 + 1900.
    let third = run(&mut p, &d.0, 3, &request(3700, Some(700), None), 100);
    assert_eq!((third.reserve_mib, third.learned_runtime_mib), (4900, Some(1900)));
    assert_eq!(third.learned_from, Some(carma_placement::learned::Whose::User));
    // A declared estimate has no model part: unchanged, and not an observation.
    let declared = run(&mut p, &d.0, 4, &request(3700, None, None), 9000);
    assert_eq!((declared.reserve_mib, declared.learned_runtime_mib), (3700, None));
    // Job 3 peaked below its model part: it observed 0.
    assert_eq!(samples(&d.0, 7), vec![1900, 1900, 0]);
    // A job whose estimate already carries more than the learned value keeps it.
    let big = run(&mut p, &d.0, 5, &request(5000, Some(2500), None), 100);
    assert_eq!((big.reserve_mib, big.learned_runtime_mib), (5000, None));
}

#[test]
fn history_decides_over_the_learned_value_and_the_window_forgets() {
    let d = node("window");
    let mut p = placer(&d.0);
    for job in 1..=2 {
        run(&mut p, &d.0, job, &request(1700, Some(700), Some("7:sig")), 2900);
    }
    // The signature's history (2900 + 10 %) is above model + learned (1000 + 1900).
    let h = run(&mut p, &d.0, 3, &request(1700, Some(700), Some("7:sig")), 0);
    assert_eq!((h.reserve_mib, h.history_mib, h.learned_runtime_mib), (3190, Some(3190), None));
    // Four jobs whose peaks their model parts covered fill the window of 4.
    for job in 4..=7 {
        run(&mut p, &d.0, job, &request(1700, Some(700), None), 1000);
    }
    let after = run(&mut p, &d.0, 8, &request(1700, Some(700), None), 0);
    assert_eq!((after.reserve_mib, after.learned_runtime_mib), (1700, None), "the old observations left the window");
}

/// #38.4 through the placer: a user who forges `CARMA_ESTIMATE` (a model
/// part of 100 MiB for jobs that peak at 60 GB) over 48 jobs raises only
/// their own fixed part; another user's next estimate is what it was.
#[test]
fn a_forged_estimate_moves_only_its_users_fixed_part() {
    let d = node("forged");
    let mut p = placer(&d.0);
    let honest = |_job| Request { uid: Some(1), ..request(5700, Some(700), None) };
    // Two honest users teach the node 1900 (each their own, and so the node's).
    for (job, uid) in [(1, 1), (2, 1), (3, 2), (4, 2)] {
        run(&mut p, &d.0, job, &Request { uid: Some(uid), ..request(5700, Some(700), None) }, 6900);
    }
    let newcomer = |_job| Request { uid: Some(3), ..request(5700, Some(700), None) };
    let before = (run(&mut p, &d.0, 5, &honest(5), 0), run(&mut p, &d.0, 6, &newcomer(6), 0));
    assert_eq!((before.0.reserve_mib, before.1.reserve_mib), (6900, 6900));
    assert_eq!(before.1.learned_from, Some(carma_placement::learned::Whose::Node));
    let forged = Request { uid: Some(666), ..request(800, Some(700), None) };
    for job in 100..148 {
        run(&mut p, &d.0, job, &forged, 60_000);
    }
    let own = run(&mut p, &d.0, 200, &forged, 0);
    assert_eq!(own.reserve_mib, 100 + 4096, "the forger's own estimates rose to learn_runtime.max");
    let after = (run(&mut p, &d.0, 201, &honest(201), 0), run(&mut p, &d.0, 202, &newcomer(202), 0));
    assert_eq!((after.0.reserve_mib, after.1.reserve_mib), (6900, 6900), "nobody else's estimate moved");
}
