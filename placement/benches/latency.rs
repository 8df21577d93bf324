//! Placement decision latency: GPU read + state lock + garbage collection +
//! policy + atomic state write, as one slurmstepd does it. Measured alone
//! (1 launch at a time) and in bursts of 64 launches contending at once on
//! one node's state (the wait for the lock included). Prints p50/p99/max.
//!
//! Each launch is its own process, as each job step's slurmstepd is: 64
//! threads of one process would also contend on one address space and one
//! allocator, which slurmstepds never do. The children start together when
//! the parent drops a gate lock, after all of them are ready; the time
//! measured is the decision alone, not the process start.
//!
//! The state directory is BENCH_DIR (default /dev/shm: tmpfs, like the
//! default state_dir /run/carma).
//! Run: cargo bench -p carma-placement --bench latency

use carma_config::Policy;
use carma_placement::source::SimulatedGpus;
use carma_placement::{LinuxProcesses, Params, Placer, Request, StateStore, StepRef};
use fs2::FileExt;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BURSTS: [usize; 2] = [1, 64];
const ROUNDS: usize = 30;
const CHILD: &str = "CARMA_LATENCY_CHILD";

fn setup(dir: &Path, gpus: usize) -> PathBuf {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir.join("procs")).unwrap();
    std::fs::create_dir_all(dir.join("state")).unwrap();
    let mut yaml = format!("process_dir: {}\ngpus:\n", dir.join("procs").display());
    for i in 0..gpus {
        yaml.push_str(&format!("  - {{index: {i}, memory_total: 40G}}\n"));
    }
    let file = dir.join("gpus.yaml");
    std::fs::write(&file, yaml).unwrap();
    file
}

fn placer(dir: &Path) -> Placer {
    let store = StateStore::open(&dir.join("state"), Duration::from_secs(5), Box::new(|_| {})).unwrap();
    let source = Box::new(SimulatedGpus::load(&dir.join("gpus.yaml")).unwrap());
    let params = Params { sm_activity_cap: 0.8, headroom_mib: 2048 };
    Placer::new(store, source, params, Box::new(LinuxProcesses), Box::new(|_| {}))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// One launch: `<dir> <job> <policy index> <holder>`. Says "ready", waits
/// for the gate, decides once, prints "<ok> <nanoseconds>".
fn child(args: &[String]) {
    let dir = PathBuf::from(&args[0]);
    let job: u32 = args[1].parse().unwrap();
    let policy = Policy::ALL[args[2].parse::<usize>().unwrap()];
    let holder: u32 = args[3].parse().unwrap();
    let mut p = placer(&dir);
    let req = Request {
        policy,
        count: 1,
        estimate_mib: Some(512),
        estimate_source: "declared".into(),
        shares: true,
        signature: None,
    };
    let gate = std::fs::File::open(dir.join("gate")).unwrap();
    println!("ready");
    std::io::stdout().flush().unwrap();
    gate.lock_shared().unwrap();
    let t = Instant::now();
    let d = p.try_place(StepRef { job, holder }, &req);
    let took = t.elapsed();
    println!("{} {}", d.is_ok() as u8, took.as_nanos());
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    if std::env::var_os(CHILD).is_some() {
        return child(&args);
    }
    let base = std::env::var("BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from("/dev/shm"))
        .join(format!("carma-bench-{}", std::process::id()));
    let me = std::env::current_exe().unwrap();
    println!(
        "placement latency, simulated source, one process per launch, state in {}, {ROUNDS} rounds",
        base.display()
    );
    for (gpus, launches) in [4usize, 64].into_iter().flat_map(|g| BURSTS.map(|b| (g, b))) {
        let dir = base.join(format!("g{gpus}"));
        setup(&dir, gpus);
        let gate_path = dir.join("gate");
        // Reservations are held by this process, so none is collected as
        // garbage while the children exit.
        let holder = std::process::id();
        let releaser = placer(&dir);
        let mut all = Vec::with_capacity(launches * ROUNDS);
        for round in 0..ROUNDS {
            let gate = std::fs::File::create(&gate_path).unwrap();
            gate.lock_exclusive().unwrap();
            let jobs: Vec<u32> = (0..launches).map(|i| (round * launches + i) as u32 + 1).collect();
            let mut children: Vec<_> = jobs
                .iter()
                .enumerate()
                .map(|(i, job)| {
                    Command::new(&me)
                        .env(CHILD, "1")
                        .args([dir.display().to_string(), job.to_string(), (i % 6).to_string(), holder.to_string()])
                        .stdout(Stdio::piped())
                        .spawn()
                        .unwrap()
                })
                .collect();
            let mut outs: Vec<_> = children.iter_mut().map(|c| BufReader::new(c.stdout.take().unwrap())).collect();
            for out in &mut outs {
                let mut line = String::new();
                out.read_line(&mut line).unwrap();
                assert_eq!(line.trim(), "ready");
            }
            drop(gate); // all children start at once
            let mut placed = 0;
            for out in &mut outs {
                let mut line = String::new();
                out.read_line(&mut line).unwrap();
                let (ok, ns) = line.trim().split_once(' ').expect("child result");
                placed += (ok == "1") as usize;
                all.push(Duration::from_nanos(ns.parse().unwrap()));
            }
            for mut c in children {
                assert!(c.wait().unwrap().success());
            }
            // Exclusive requests (1 in 6) find no idle GPU once others share
            // them; every other request fits.
            let shared = launches - launches.div_ceil(6);
            assert!(placed >= shared, "only {placed} of {launches} placed");
            for job in jobs {
                releaser.release(StepRef { job, holder }).unwrap();
            }
        }
        all.sort();
        println!(
            "  {gpus:>2} GPUs, {launches:>2} concurrent: p50 {:>7.3} ms  p99 {:>7.3} ms  max {:>7.3} ms  ({} decisions; target p99 < 5 ms)",
            percentile(&all, 0.50).as_secs_f64() * 1e3,
            percentile(&all, 0.99).as_secs_f64() * 1e3,
            all.last().unwrap().as_secs_f64() * 1e3,
            all.len()
        );
    }
    let _ = std::fs::remove_dir_all(&base);
}
