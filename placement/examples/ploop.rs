use carma_config::Policy;
use carma_placement::source::SimulatedGpus;
use carma_placement::{LinuxProcesses, Params, Placer, Request, StateStore, StepRef};
use std::time::{Duration, Instant};
fn main() {
    let dir = std::path::PathBuf::from("/dev/shm/ploop");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("procs")).unwrap();
    std::fs::create_dir_all(dir.join("state")).unwrap();
    let mut yaml = format!("process_dir: {}\ngpus:\n", dir.join("procs").display());
    for i in 0..4 {
        yaml.push_str(&format!("  - {{index: {i}, memory_total: 40G}}\n"));
    }
    std::fs::write(dir.join("gpus.yaml"), yaml).unwrap();
    let store = StateStore::open(&dir.join("state"), Duration::from_secs(5), Box::new(|_| {})).unwrap();
    let source = Box::new(SimulatedGpus::load(&dir.join("gpus.yaml")).unwrap());
    let params = Params { sm_activity_cap: 0.8, headroom_mib: 2048 };
    let mut p = Placer::new(store, source, params, Box::new(LinuxProcesses), Box::new(|_| {}));
    let holder = std::process::id();
    // 40 background reservations
    let req = Request {
        policy: Policy::Magm,
        count: 1,
        estimate_mib: Some(512),
        estimate_source: "declared".into(),
        shares: true,
        signature: None,
    };
    for j in 0..40 {
        p.try_place(StepRef { job: 100000 + j, holder }, &req).unwrap();
    }
    let n = 20000;
    let t = Instant::now();
    for j in 0..n {
        p.try_place(StepRef { job: j, holder }, &req).unwrap();
        p.release(StepRef { job: j, holder }).unwrap();
    }
    println!("{:?} per place+release", t.elapsed() / n);
}
