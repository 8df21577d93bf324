//! A simulated GPU training job for nodes without GPUs. It registers its
//! memory and SM use on the simulated GPUs in its CUDA_VISIBLE_DEVICES while
//! it runs and removes them when it ends. Like PyTorch, it prints
//! `torch.OutOfMemoryError: CUDA out of memory. ...` and exits 1 when a GPU
//! lacks the memory. Run as an MPS client (CUDA_MPS_PIPE_DIRECTORY set) it
//! registers as one, and like CUDA under MPS it fails an allocation beyond
//! its fence (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, e.g. `0=12288M`) the same way.
//!
//!
//! On the NVML stand-in (`gpu_source: nvml`, the test cluster) the GPUs are
//! the stand-in's description file, and an MPS client asks the GPU's MPS
//! control daemon (the test stand-in `carma-fake-mps-control`, installed as
//! `nvidia-cuda-mps-control`) for its user's server, as CUDA does: the
//! daemon starts it as the job's user, named as NVIDIA's
//! (`nvidia-cuda-mps-server`). NVML lists the server among a GPU's compute
//! processes, which is how CARMA sees whose MPS server a GPU runs.
#![deny(clippy::undocumented_unsafe_blocks)]

use carma_config::{Config, GpuSource, parse_size_mib};
use carma_placement::index_list;
use carma_placement::slowdown::{Model, Profile};
use carma_placement::source::SimulatedGpus;
use carma_placement::source::simulated::standin_description;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A simulated GPU training job: it holds memory and SM activity on the
/// simulated GPUs (or the NVML stand-in's) in CUDA_VISIBLE_DEVICES while it runs.
#[derive(clap::Parser, Debug)]
#[command(name = "carma-fakejob", version, help_expected = true, args_override_self = true)]
struct Cli {
    /// Memory per GPU, e.g. 8G
    #[arg(long, allow_negative_numbers = true, value_name = "SIZE", value_parser = parse_size_mib)]
    mem: u64,
    /// SM activity, 0.0 to 1.0
    #[arg(long, allow_negative_numbers = true, value_name = "FRACTION", default_value_t = 0.5, value_parser = fraction)]
    sm: f64,
    /// Share of time its kernels run, 0.0 to 1.0 [default: --sm's value]
    #[arg(long, allow_negative_numbers = true, value_name = "FRACTION", value_parser = fraction)]
    busy: Option<f64>,
    /// How long it runs
    #[arg(long, allow_negative_numbers = true, value_name = "S", default_value_t = 10.0, value_parser = secs)]
    seconds: f64,
    /// Seconds of work alone: it ends when done, running as much slower as
    /// the slowdown model says this job runs among the jobs sharing its
    /// GPUs (instead of --seconds; `carma replay-plan`'s jobs)
    #[arg(long, allow_negative_numbers = true, value_name = "S", value_parser = secs)]
    work: Option<f64>,
    /// Seconds its memory takes to reach --mem
    #[arg(long, allow_negative_numbers = true, value_name = "S", default_value_t = 0.0, value_parser = secs)]
    ramp: f64,
    /// Grow to this memory per GPU after --grow-after seconds
    #[arg(long, allow_negative_numbers = true, value_name = "SIZE", value_parser = parse_size_mib)]
    grow_to: Option<u64>,
    /// When to grow to --grow-to
    #[arg(long, allow_negative_numbers = true, value_name = "S", default_value_t = 0.0, value_parser = secs)]
    grow_after: f64,
    /// carma.yaml to read (its gpu_source)
    #[arg(long, value_name = "FILE", default_value = carma_config::DEFAULT_CONFIG_PATH)]
    config: PathBuf,
}

static STOP: AtomicBool = AtomicBool::new(false);

/// How long an MPS client waits for its server (while another user's runs
/// on the GPU, a client waits, as under NVIDIA's MPS).
const MPS_SERVER_WAIT: Duration = Duration::from_secs(30);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn main() {
    match run() {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("carma-fakejob: {e}");
            std::process::exit(2);
        }
    }
}

fn secs(v: &str) -> Result<f64, String> {
    v.parse::<f64>().ok().filter(|s| s.is_finite() && *s >= 0.0).ok_or_else(|| "expected seconds >= 0".into())
}

fn fraction(v: &str) -> Result<f64, String> {
    v.parse::<f64>().ok().filter(|s| (0.0..=1.0).contains(s)).ok_or_else(|| "expected 0.0 to 1.0".into())
}

fn run() -> Result<i32, String> {
    let a = carma_tools::cli::parse::<Cli>()?;
    let (mem, sm, seconds, ramp, grow_to, grow_after) = (a.mem, a.sm, a.seconds, a.ramp, a.grow_to, a.grow_after);
    // Share of time its kernels run: at least its SM activity.
    let busy = a.busy.unwrap_or(sm);
    let config = Config::load(&a.config).map_err(|e| e.to_string())?;
    let (file, standin) = match &config.gpu_source {
        GpuSource::Simulated(file) => (file.clone(), false),
        GpuSource::Nvml { library } => (standin_description(library.as_deref()), true),
    };
    let sim =
        SimulatedGpus::load(&file).map_err(|e| format!("{e} (its GPUs are simulated GPUs or the NVML stand-in's)"))?;
    let visible = std::env::var("CUDA_VISIBLE_DEVICES")
        .map_err(|_| "CUDA_VISIBLE_DEVICES is not set: no GPU visible".to_string())?;
    let gpus = sim.visible_indices(&visible)?;
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
    }
    let pipe = std::env::var_os("CUDA_MPS_PIPE_DIRECTORY");
    let mps = pipe.is_some();
    // On the stand-in, the GPU's MPS control daemon starts (or has) the
    // server of this job's user; the connection is held while the job
    // runs, and its end tells the daemon this client is gone.
    let _server = match pipe.filter(|_| standin) {
        Some(dir) => Some(carma_tools::mps_standin::connect(std::path::Path::new(&dir), MPS_SERVER_WAIT)?),
        None => None,
    };
    let fence = match std::env::var("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") {
        Ok(v) => fence_mib(&v)?,
        Err(_) => None,
    };
    let pid = std::process::id();
    let start = Instant::now();
    // Its own slowdown among its GPUs' jobs: time-sliced, or as an MPS
    // client (which pays MPS's own cost even alone).
    let model = Model::of(if mps { carma_config::Sharing::Mps } else { carma_config::Sharing::Timeslice });
    let me = Profile { busy, sm };
    let mut work = a.work.map(|w| Work { left_s: w, at: start, model, me });
    match a.work {
        Some(w) => {
            println!(
                "carma-fakejob: pid {pid} on GPU {visible} (node GPU {}): {mem} MiB, SM {sm}, busy {busy}, {w} s of work",
                index_list(&gpus)
            )
        }
        None => println!(
            "carma-fakejob: pid {pid} on GPU {visible} (node GPU {}): {mem} MiB, SM {sm}, busy {busy}, {seconds} s",
            index_list(&gpus)
        ),
    }
    let mut registered = None;
    let code = loop {
        let t = start.elapsed().as_secs_f64();
        let done = match &mut work {
            Some(w) => w.advance(&sim, &gpus),
            None => t >= seconds,
        };
        if done || STOP.load(Ordering::SeqCst) {
            break 0;
        }
        // Memory grows linearly over the ramp, as a framework allocates.
        let mut want = if ramp > 0.0 { ((mem as f64) * (t / ramp).min(1.0)).ceil() as u64 } else { mem };
        if let Some(g) = grow_to.filter(|_| t >= grow_after) {
            want = want.max(g);
        }
        if let Some(limit) = fence.filter(|l| want > *l) {
            println!("carma-fakejob: allocation past the MPS fence after {t:.1} s");
            eprintln!(
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {want} MiB. GPU 0 has a total capacity of {:.2} GiB of which 0 bytes is free.",
                limit as f64 / 1024.0
            );
            break 1;
        }
        // Registered again only when it grows: a replay runs hundreds.
        let fresh = registered != Some(want);
        match if fresh {
            sim.allocate(pid, &gpus, want.max(1), sm, busy, mps).map_err(|e| e.to_string())?
        } else {
            Ok(())
        } {
            Ok(()) => registered = Some(want),
            Err(oom) => {
                let free = oom.total_mib.saturating_sub(oom.used_mib);
                println!("carma-fakejob: allocation failed after {t:.1} s");
                eprintln!(
                    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {} MiB. GPU {} has a total capacity of {:.2} GiB of which {} MiB is free.",
                    oom.asked_mib,
                    oom.gpu,
                    oom.total_mib as f64 / 1024.0,
                    free
                );
                break 1;
            }
        }
        let tick = match &work {
            // The work's end is found within a tick.
            Some(w) => Duration::from_millis(250).min(Duration::from_secs_f64(w.left_s.max(0.01))),
            None => Duration::from_millis(100).min(Duration::from_secs_f64((seconds - t).max(0.0))),
        };
        std::thread::sleep(tick);
    };
    sim.release(pid);
    if code == 0 {
        println!("carma-fakejob: done");
    }
    Ok(code)
}

/// Work left to a `--work` job and when it was last counted.
struct Work {
    left_s: f64,
    at: Instant,
    model: Model,
    /// What it does to a GPU alone.
    me: Profile,
}

impl Work {
    /// Counts the time since the last call at the speed the slowdown model
    /// gives this job among the jobs now on its GPUs (on the slowest of
    /// its GPUs); true when no work is left.
    fn advance(&mut self, sim: &SimulatedGpus, gpus: &[u32]) -> bool {
        let now = Instant::now();
        let slowdown = gpus.iter().map(|&g| self.slowdown_on(&sim.sharers(g))).fold(1.0, f64::max);
        self.left_s -= now.duration_since(self.at).as_secs_f64() / slowdown;
        self.at = now;
        self.left_s <= 0.0
    }

    /// Its slowdown among a GPU's sharers `(busy, sm)`, itself included
    /// once registered (the model gives jobs of one profile one slowdown,
    /// so any entry of its profile is its own); before that, as if it had
    /// joined them.
    fn slowdown_on(&self, sharers: &[(f64, f64)]) -> f64 {
        let mut jobs: Vec<Profile> = sharers.iter().map(|&(busy, sm)| Profile { busy, sm }).collect();
        let at = jobs.iter().position(|p| *p == self.me).unwrap_or_else(|| {
            jobs.push(self.me);
            jobs.len() - 1
        });
        self.model.slowdowns(&jobs)[at]
    }
}

/// The fence of the process's first device (`0=12288M`, `0=12G,1=12G`).
fn fence_mib(v: &str) -> Result<Option<u64>, String> {
    for part in v.split(',') {
        if let Some(size) = part.trim().strip_prefix("0=") {
            return parse_size_mib(size).map(Some).map_err(|e| format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={v}: {e}"));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    fn parse(argv: &[&str]) -> Result<Cli, String> {
        Cli::try_parse_from(std::iter::once(&"carma-fakejob").chain(argv)).map_err(|e| carma_tools::cli::one_line(&e))
    }

    /// Time-sliced, the heavy job of a pair runs slower than its light
    /// partner (H100: resnet50 1.95x beside mobilenet, which runs 1.35x).
    #[test]
    fn a_work_job_goes_at_its_own_slowdown_among_its_gpus_jobs() {
        let work =
            |busy, sm| Work { left_s: 1.0, at: Instant::now(), model: Model::H100_TIMESLICE, me: Profile { busy, sm } };
        let pair = [(0.98, 0.825), (0.541, 0.312)];
        let (heavy, light) = (work(0.98, 0.825).slowdown_on(&pair), work(0.541, 0.312).slowdown_on(&pair));
        assert!(heavy > light + 0.3, "{heavy} {light}");
        // Alone, registered or not yet: its own pace.
        assert_eq!(work(0.98, 0.825).slowdown_on(&[]), 1.0);
        assert_eq!(work(0.98, 0.825).slowdown_on(&[(0.98, 0.825)]), 1.0);
        // Not yet registered beside the light one: as if it had joined.
        assert_eq!(work(0.98, 0.825).slowdown_on(&pair[1..]), heavy);
    }

    #[test]
    fn options_parse_as_before() {
        Cli::command().debug_assert();
        let a = parse(&["--mem", "8G"]).unwrap();
        assert_eq!((a.mem, a.sm, a.busy, a.seconds, a.ramp), (8192, 0.5, None, 10.0, 0.0));
        assert_eq!((a.grow_to, a.grow_after, a.work), (None, 0.0, None));
        assert_eq!(parse(&["--mem", "1G", "--work", "2.5"]).unwrap().work, Some(2.5));
        assert_eq!(a.config, PathBuf::from(carma_config::DEFAULT_CONFIG_PATH));
        let argv = ["--mem=2G", "--sm", "0.2", "--busy", "0.9", "--seconds", "3", "--ramp", "1", "--grow-to", "6G"];
        let a = parse(&[&argv[..], &["--grow-after", "2", "--config", "/n2.yaml"]].concat()).unwrap();
        assert_eq!((a.mem, a.sm, a.busy, a.seconds, a.ramp), (2048, 0.2, Some(0.9), 3.0, 1.0));
        assert_eq!((a.grow_to, a.grow_after, a.config), (Some(6144), 2.0, PathBuf::from("/n2.yaml")));
        for (argv, says) in [
            (&["--sm", "0.5"][..], "--mem <SIZE>"),
            (&["--mem", "1G", "--sm", "1.5"], "--sm <FRACTION>': expected 0.0 to 1.0"),
            (&["--mem", "1G", "--seconds", "-1"], "--seconds <S>': expected seconds >= 0"),
            (&["--mem", "1G", "--bogus"], "'--bogus'"),
        ] {
            let e = parse(argv).unwrap_err();
            assert!(e.contains(says) && !e.contains('\n'), "{argv:?}: {e}");
        }
    }
}
