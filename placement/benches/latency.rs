//! Placement decision latency: GPU read + state lock + garbage collection +
//! policy + atomic state write (and, for a step that does not fit, counting
//! the refusal), as one slurmstepd does it (`Placer::place`, no wait). Measured alone
//! (1 launch at a time) and in bursts of 64 launches contending at once on
//! one node's state (the wait for the lock included). Prints p50/p99/max.
//!
//! Each launch is its own process, as each job step's slurmstepd is: 64
//! threads of one process would also contend on one address space and one
//! allocator, which slurmstepds never do. The children start together when
//! the parent drops a gate lock, after all of them are ready; the time
//! measured is the decision alone, not the process start, and they stay
//! alive until the whole burst has decided. Each also reports the CPU time
//! its decision took (its share of deciding for others included), its page
//! faults and how often it slept; the means are printed. Bursts of 64 and
//! 256 also run without the request queue (slots.rs), to weigh what it buys
//! (docs/architecture.md).
//!
//! Readings come from the simulated GPUs directly, (64 concurrent) from
//! carma-monitor's published readings, as production reads them with
//! `monitor: {published: true}`, and from NVML directly (the fallback
//! when published readings are stale, and `gpu_source: nvml` without the
//! monitor) on the NVML stand-in: nvml-wrapper loading libnvidia-ml.so.1,
//! the bounded reader thread and every NVML call of a read, our cost (the
//! stand-in answers each call in microseconds; a driver's calls take
//! longer: ~30 ms for a whole read on an H100, docs/nvml-standin.md).
//!
//! CARMA_BENCH_ROUNDS overrides the number of bursts per configuration;
//! CARMA_BENCH_ONLY=GPUS:LAUNCHES:SOURCE (e.g. 64:64:published) runs that
//! configuration alone (to profile it).
//! The state directory is BENCH_DIR (default /dev/shm: tmpfs, like the
//! default state_dir /run/carma).
//! Run: cargo bench -p carma-placement --bench latency

use carma_config::Policy;
use carma_placement::source::published::{self, Published};
use carma_placement::source::{GpuSource, SimulatedGpus};
use carma_placement::{LiveHolders, Params, Placer, Request, StateStore, StepRef};
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
    // What carma-monitor would publish for these GPUs.
    let gpus = SimulatedGpus::load(&file).unwrap().read().unwrap();
    let p = Published {
        written_ms: carma_placement::clock::now_ms(),
        interval_ms: 1000,
        window_ms: 60_000,
        source: "simulated".into(),
        samples: 60,
        gpus,
    };
    published::publish(&dir.join("state"), &p).unwrap();
    file
}

/// The node's placer as slurmstepd opens it from carma.yaml, reading the
/// published readings (never stale during the bench).
fn published_placer(dir: &Path) -> Placer {
    let mut cfg = carma_config::Config {
        state_dir: dir.join("state"),
        gpu_source: carma_config::GpuSource::Simulated(dir.join("gpus.yaml")),
        ..Default::default()
    };
    cfg.monitor.published = true;
    cfg.monitor.stale_after = Duration::from_secs(24 * 3600);
    let mut p = Placer::from_config(&cfg, |_| {}).unwrap();
    p.set_processes(Box::new(LiveHolders));
    p
}

/// The stand-in library the workspace built (target/PROFILE/).
fn standin_library() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let lib = exe.parent()?.parent()?.join("libnvidia_ml.so");
    lib.exists().then_some(lib)
}

/// The node's placer with `gpu_source: nvml` on the stand-in beside
/// `dir`'s GPUs, opened as slurmstepd opens it (on its first read).
fn nvml_placer(dir: &Path) -> Placer {
    let cfg = carma_config::Config {
        state_dir: dir.join("state"),
        gpu_source: carma_config::GpuSource::Nvml { library: Some(dir.join("libnvidia-ml.so.1")) },
        ..Default::default()
    };
    let mut p = Placer::from_config(&cfg, |_| {}).unwrap();
    p.set_processes(Box::new(LiveHolders));
    p
}

fn placer(dir: &Path) -> Placer {
    let store = StateStore::open(&dir.join("state"), Duration::from_secs(5), Box::new(|_| {})).unwrap();
    let source = Box::new(SimulatedGpus::load(&dir.join("gpus.yaml")).unwrap());
    let params = Params::default();
    Placer::new(store, source, params, Box::new(LiveHolders), Box::new(|_| {}))
}

/// This process's (CPU ns, minor page faults, voluntary context switches)
/// so far. CPU time from the scheduler's clock: getrusage's user/system
/// split is sampled at timer ticks, far too coarse for one launch.
fn usage() -> (i64, i64, i64) {
    // SAFETY: both calls only write into the zeroed structs we pass.
    let (mut ts, mut ru): (libc::timespec, libc::rusage) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    unsafe {
        libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts);
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
    }
    (ts.tv_sec * 1_000_000_000 + ts.tv_nsec, ru.ru_minflt, ru.ru_nvcsw)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// One launch: `<dir> <job> <policy index> <holder>`. Says "ready", waits
/// for the gate, decides once, prints "<outcome> <nanoseconds> ..." where
/// the outcome is 1 placed, 0 no GPU fits, 2 any other failure.
fn child(args: &[String]) {
    let dir = PathBuf::from(&args[0]);
    let job: u32 = args[1].parse().unwrap();
    let policy = Policy::ALL[args[2].parse::<usize>().unwrap()];
    let holder: u32 = args[3].parse().unwrap();
    let mut p = match args.get(4).map(String::as_str) {
        Some("published") => published_placer(&dir),
        Some("nvml") => nvml_placer(&dir),
        _ => placer(&dir),
    };
    let req = Request::declared(policy, 512);
    let gate = std::fs::File::open(dir.join("gate")).unwrap();
    println!("ready");
    std::io::stdout().flush().unwrap();
    gate.lock_shared().unwrap();
    let before = usage();
    let t = Instant::now();
    // As slurmstepd places a step (`Placer::place`), with no wait: a
    // refusal's count is part of the launch.
    let d = p.place(StepRef { job, holder }, &req, Duration::ZERO, Duration::from_millis(250), &mut || true);
    let took = t.elapsed();
    let after = usage();
    let outcome = match &d {
        Ok(_) => 1,
        Err(carma_placement::PlaceError::NoFit(_)) => 0,
        Err(_) => 2,
    };
    println!("{} {} {} {} {}", outcome, took.as_nanos(), after.0 - before.0, after.1 - before.1, after.2 - before.2);
    // Stay alive until the whole burst has decided, as a slurmstepd goes
    // on to run its job: the teardown of an exiting process is not part of
    // any launch's placement.
    std::io::stdout().flush().unwrap();
    let _ = std::io::stdin().read_line(&mut String::new());
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
    let rounds = std::env::var("CARMA_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(ROUNDS);
    println!("placement latency, simulated GPUs, one process per launch, state in {}, {rounds} rounds", base.display());
    let direct = [4usize, 64].into_iter().flat_map(|g| BURSTS.map(|b| (g, b, "direct", true)));
    let published = [4usize, 64].map(|g| (g, 64, "published", true));
    // What the request queue (slots.rs) buys: the same bursts with the
    // queue unavailable, as the placer runs when it cannot map it (every
    // launch then passes the state lock on its own).
    let weighing = [(4usize, 64usize, "direct", false), (4, 256, "direct", true), (4, 256, "direct", false)];
    let standin = standin_library();
    let nvml = [(4usize, 1usize, "nvml", true), (4, 64, "nvml", true), (64, 1, "nvml", true)];
    let nvml = nvml.into_iter().filter(|_| standin.is_some());
    if standin.is_none() {
        println!("  (no NVML stand-in built beside this bench: cargo build -p carma-nvml-standin; nvml rows skipped)");
    }
    let only = std::env::var("CARMA_BENCH_ONLY").ok();
    let chosen =
        |&(g, l, s, c): &(usize, usize, &str, bool)| only.as_deref().is_none_or(|o| c && o == format!("{g}:{l}:{s}"));
    for (gpus, launches, source, combining) in direct.chain(published).chain(weighing).chain(nvml).filter(chosen) {
        let dir = base.join(format!("g{gpus}-{launches}-{source}-{combining}"));
        let file = setup(&dir, gpus);
        if !combining {
            // A queue file of the wrong size is never mapped (Slots::open).
            std::fs::write(dir.join("state").join(carma_placement::slots::SLOTS_FILE), [0u8; 4096]).unwrap();
        }
        // 256-launch bursts cost 256 process starts each: fewer rounds.
        let rounds = if launches > 64 { rounds.div_ceil(3) } else { rounds };
        if let Some(lib) = standin.as_ref().filter(|_| source == "nvml") {
            std::fs::copy(&file, dir.join("sim-gpus.yaml")).unwrap();
            std::os::unix::fs::symlink(lib, dir.join("libnvidia-ml.so.1")).unwrap();
        }
        let gate_path = dir.join("gate");
        // Reservations are held by this process, so none is collected as
        // garbage while the children exit.
        let holder = std::process::id();
        let releaser = placer(&dir);
        let mut all = Vec::with_capacity(launches * rounds);
        let mut cpu = (0i64, 0i64, 0i64);
        for round in 0..rounds {
            let gate = std::fs::File::create(&gate_path).unwrap();
            gate.lock_exclusive().unwrap();
            let jobs: Vec<u32> = (0..launches).map(|i| (round * launches + i) as u32 + 1).collect();
            let mut children: Vec<_> = jobs
                .iter()
                .enumerate()
                .map(|(i, job)| {
                    Command::new(&me)
                        .env(CHILD, "1")
                        .args([
                            dir.display().to_string(),
                            job.to_string(),
                            (i % 6).to_string(),
                            holder.to_string(),
                            source.to_string(),
                        ])
                        .stdout(Stdio::piped())
                        .stdin(Stdio::piped())
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
                let f: Vec<i64> = line.split_whitespace().map(|w| w.parse().expect("child result")).collect();
                placed += (f[0] == 1) as usize;
                assert_ne!(f[0], 2, "a launch failed for a reason other than no fit");
                all.push(Duration::from_nanos(f[1] as u64));
                cpu.0 += f[2];
                cpu.1 += f[3];
                cpu.2 += f[4];
            }
            for mut c in children {
                drop(c.stdin.take()); // the burst is over: let it exit
                assert!(c.wait().unwrap().success());
            }
            // Exclusive requests (1 in 6) find no idle GPU once others share
            // them, and shared ones find none once exclusive ones hold every
            // GPU: how many fit depends on the order the burst is decided
            // in. In any order every GPU takes at least one launch.
            assert!(placed >= gpus.min(launches), "only {placed} of {launches} placed on {gpus} GPUs");
            for job in jobs {
                releaser.release(StepRef { job, holder }).unwrap();
            }
        }
        all.sort();
        println!(
            "  {gpus:>2} GPUs, {launches:>3} concurrent, {source:>9} readings{}: p50 {:>7.3} ms  p99 {:>7.3} ms  max {:>7.3} ms  ({} decisions; target p99 < 5 ms)",
            if combining { "" } else { ", no request queue" },
            percentile(&all, 0.50).as_secs_f64() * 1e3,
            percentile(&all, 0.99).as_secs_f64() * 1e3,
            all.last().unwrap().as_secs_f64() * 1e3,
            all.len()
        );
        let n = all.len() as f64;
        println!(
            "      per launch: CPU {:.0} µs, {:.1} minor page faults, {:.1} sleeps",
            cpu.0 as f64 / n / 1e3,
            cpu.1 as f64 / n,
            cpu.2 as f64 / n
        );
    }
    let _ = std::fs::remove_dir_all(&base);
}
