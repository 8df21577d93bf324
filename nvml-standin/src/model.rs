//! What the stand-in's GPUs read, from the description file: the simulated
//! GPUs' YAML (GPUs, baseline load, the directory where simulated workloads
//! register their memory and SM use) and its `standin:` section:
//!
//! ```yaml
//! standin:
//!   profile: h100            # h100 (GPM supported) or a100 (GPM not supported)
//!   replay:                  # readings measured on a real H100, per GPU
//!     file: /usr/share/carma-sim/h100-collocation.csv   # relative: to this file
//!     gpus: {1: timeslice/mobilenetv3_32+resnet18_32}
//!   faults:
//!     init: driver_not_loaded             # nvmlInit fails as on a node without the driver
//!     lost: [2]                           # these GPUs answer GPU_IS_LOST
//!     mig: [1]                            # these GPUs are in MIG mode
//!     error: [3]                          # every call on these GPUs answers UNKNOWN
//!     process_race: {extra: 8, times: 1}  # processes start between NVML's count and copy
//!     block: {call: memory_info, seconds: 30}   # a call that hangs in the driver
//! ```
//!
//! The file is read again whenever it changes, so a test can fault a GPU
//! under a running reader (init faults apply at init).

use crate::code;
use crate::replay;
use carma_placement::GpuSource;
use carma_placement::source::SimulatedGpus;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// A GPU model as NVML names it, and whether it has GPM (Hopper and newer).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Profile {
    pub name: &'static str,
    pub gpm: bool,
}

const H100: Profile = Profile { name: "NVIDIA H100 80GB HBM3", gpm: true };
const A100: Profile = Profile { name: "NVIDIA A100-SXM4-40GB", gpm: false };

/// Calls a `block` fault can hang.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Call {
    Init,
    DeviceCount,
    MemoryInfo,
    Processes,
    Utilization,
    GpmSample,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStandin {
    profile: Option<String>,
    replay: Option<RawReplay>,
    faults: Option<RawFaults>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplay {
    file: String,
    gpus: BTreeMap<u32, String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFaults {
    init: Option<String>,
    #[serde(default)]
    lost: Vec<u32>,
    #[serde(default)]
    mig: Vec<u32>,
    #[serde(default)]
    error: Vec<u32>,
    process_race: Option<Race>,
    block: Option<Block>,
}

#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Race {
    pub extra: u32,
    pub times: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Block {
    pub call: Call,
    pub seconds: f64,
}

#[derive(Debug, Clone, Default)]
pub struct Faults {
    pub init: Option<u32>,
    pub lost: Vec<u32>,
    pub mig: Vec<u32>,
    pub error: Vec<u32>,
    pub process_race: Option<Race>,
    pub block: Option<Block>,
}

/// One GPU as the stand-in answers for it now.
#[derive(Debug, Clone, PartialEq)]
pub struct Gpu {
    pub uuid: String,
    /// The device minor number (`/dev/nvidia<minor>`): the description's
    /// `minor`, else the index.
    pub minor: u32,
    pub total_mib: u64,
    pub used_mib: u64,
    pub busy: f64,
    pub sm: f64,
    pub occupancy: f64,
    pub power_w: f64,
    /// Compute processes (an MPS server among them, not its clients).
    pub processes: Vec<(u32, u64)>,
    /// MPS clients, with their memory: under MPS the driver lists them
    /// only in nvmlDeviceGetMPSComputeRunningProcesses.
    pub mps_clients: Vec<(u32, u64)>,
}

pub struct Description {
    sim: SimulatedGpus,
    pub profile: Profile,
    pub faults: Faults,
    replay: BTreeMap<u32, replay::Row>,
}

fn init_code(name: &str) -> Result<u32, String> {
    Ok(match name {
        "driver_not_loaded" => code::DRIVER_NOT_LOADED,
        "no_permission" => code::NO_PERMISSION,
        "lib_rm_version_mismatch" => code::LIB_RM_VERSION_MISMATCH,
        "unknown" => code::UNKNOWN,
        _ => {
            return Err(format!(
                "standin.faults.init: '{name}'; use driver_not_loaded, no_permission, lib_rm_version_mismatch or unknown"
            ));
        }
    })
}

impl Description {
    pub fn load(path: &Path) -> Result<Description, String> {
        let sim = SimulatedGpus::load(path).map_err(|e| e.to_string())?;
        let bad = |m: String| format!("{}: {m}", path.display());
        let text = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        let value: serde_yaml::Value = serde_yaml::from_slice(&text).map_err(|e| bad(e.to_string()))?;
        let raw: RawStandin = match value.get("standin") {
            Some(v) => serde_yaml::from_value(v.clone()).map_err(|e| bad(format!("standin: {e}")))?,
            None => RawStandin::default(),
        };
        let profile = match raw.profile.as_deref() {
            None | Some("h100") => H100,
            Some("a100") => A100,
            Some(p) => return Err(bad(format!("standin.profile: '{p}'; use h100 or a100"))),
        };
        let mut replay = BTreeMap::new();
        if let Some(r) = raw.replay {
            let file = path.parent().unwrap_or(Path::new("/")).join(&r.file);
            for (gpu, mix) in r.gpus {
                replay.insert(gpu, replay::row(&file, &mix).map_err(bad)?);
            }
        }
        let f = raw.faults.unwrap_or_default();
        let faults = Faults {
            init: f.init.as_deref().map(init_code).transpose().map_err(bad)?,
            lost: f.lost,
            mig: f.mig,
            error: f.error,
            process_race: f.process_race,
            block: f.block,
        };
        Ok(Description { sim, profile, faults, replay })
    }

    /// Every GPU now: the simulated GPUs' readings with replayed rows added.
    pub fn gpus(&mut self) -> Vec<Gpu> {
        let readings = self.sim.read().unwrap_or_default();
        let clients = self.sim.mps_clients();
        readings
            .into_iter()
            .map(|r| {
                let row = self.replay.get(&r.index);
                let own_sm = r.sm_activity;
                let sm = (own_sm + row.map_or(0.0, |x| x.sm)).min(1.0);
                let busy = (r.busy + row.map_or(0.0, |x| x.busy)).min(1.0);
                // Occupancy ran at about half of SM activity on the H100
                // (data/h100/collocation.csv) where nothing was measured.
                let occupancy =
                    (row.and_then(|x| x.occupancy).unwrap_or(row.map_or(0.0, |x| x.sm) * 0.5) + own_sm * 0.5).min(1.0);
                // The H100's board power: ~70 W idle, ~540 W × SM activity,
                // ~50 W more whenever kernels run (docs/nvml-standin.md).
                let modelled = 70.0 + 540.0 * sm + if busy > 0.0 { 50.0 } else { 0.0 };
                let power_w = row.and_then(|x| x.power_w).or(r.power_w).unwrap_or(modelled);
                Gpu {
                    minor: r.device_minor(),
                    uuid: r.uuid,
                    total_mib: r.total_mib,
                    used_mib: r.used_mib,
                    busy,
                    sm,
                    occupancy,
                    power_w,
                    processes: r
                        .processes
                        .iter()
                        .filter(|p| !clients.contains(&p.pid))
                        .map(|p| (p.pid, p.used_mib))
                        .collect(),
                    mps_clients: r
                        .processes
                        .iter()
                        .filter(|p| clients.contains(&p.pid))
                        .map(|p| (p.pid, p.used_mib))
                        .collect(),
                }
            })
            .collect()
    }
}

/// The loaded description, read again when its file changes.
pub struct Loaded {
    path: PathBuf,
    modified: Option<SystemTime>,
    desc: Description,
    /// Readings are taken once per 20 ms: one reader's calls for one GPU
    /// see one moment, as the driver's would.
    snapshot: Option<(Instant, Vec<Gpu>)>,
    races_left: u32,
}

static STATE: Mutex<Option<Loaded>> = Mutex::new(None);
static INITS: Mutex<u32> = Mutex::new(0);

fn lock<T>(m: &'static Mutex<T>) -> std::sync::MutexGuard<'static, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn say(line: &str) {
    eprintln!("carma nvml stand-in: {line}");
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn block(desc: &Description, call: Call) -> Option<Duration> {
    desc.faults.block.filter(|b| b.call == call).map(|b| Duration::from_secs_f64(b.seconds.clamp(0.0, 3600.0)))
}

/// nvmlInit: loads the description `path` (a missing file is a node
/// without the driver).
pub fn init(path: &Path) -> u32 {
    let mut inits = lock(&INITS);
    let mut state = lock(&STATE);
    if state.is_none() {
        if !path.exists() {
            say(&format!("no GPU description at {} (the stand-in's driver is not loaded)", path.display()));
            return code::DRIVER_NOT_LOADED;
        }
        let desc = match Description::load(path) {
            Ok(d) => d,
            Err(e) => {
                say(&e.replace('\n', " "));
                return code::UNKNOWN;
            }
        };
        if let Some(c) = desc.faults.init {
            return c;
        }
        let pause = block(&desc, Call::Init);
        let races_left = desc.faults.process_race.map_or(0, |r| r.times);
        *state = Some(Loaded { path: path.to_path_buf(), modified: modified(path), desc, snapshot: None, races_left });
        if let Some(d) = pause {
            drop(state);
            std::thread::sleep(d);
        }
    }
    *inits += 1;
    code::SUCCESS
}

pub fn shutdown() -> u32 {
    let mut inits = lock(&INITS);
    match *inits {
        0 => code::UNINITIALIZED,
        _ => {
            *inits -= 1;
            if *inits == 0 {
                *lock(&STATE) = None;
            }
            code::SUCCESS
        }
    }
}

/// Runs `f` on the GPUs now, after a `block` fault on `call` and with
/// lost GPUs and unknown indices answered as the driver does.
pub fn with_gpus<T>(call: Call, gpu: Option<u32>, f: impl FnOnce(&[Gpu], &mut Loaded) -> T) -> Result<T, u32> {
    let pause = {
        let mut guard = lock(&STATE);
        let state = guard.as_mut().ok_or(code::UNINITIALIZED)?;
        // A changed file is read again; a broken one keeps the last good
        // description (said once per change).
        let now_modified = modified(&state.path);
        if now_modified != state.modified {
            state.modified = now_modified;
            match Description::load(&state.path) {
                Ok(d) => {
                    state.races_left = d.faults.process_race.map_or(0, |r| r.times);
                    state.desc = d;
                    state.snapshot = None;
                }
                Err(e) => say(&format!("{}; keeping the last description", e.replace('\n', " "))),
            }
        }
        block(&state.desc, call)
    };
    if let Some(d) = pause {
        std::thread::sleep(d);
    }
    let mut guard = lock(&STATE);
    let state = guard.as_mut().ok_or(code::UNINITIALIZED)?;
    // The snapshot is lent to `f` (taken out of the state `f` also gets)
    // and put back, rather than copied on every call.
    let (taken, gpus) = match state.snapshot.take() {
        Some((t, g)) if t.elapsed() < Duration::from_millis(20) => (t, g),
        _ => (Instant::now(), state.desc.gpus()),
    };
    let out = match gpu {
        Some(i) if i as usize >= gpus.len() => Err(code::INVALID_ARGUMENT),
        Some(i) if state.desc.faults.lost.contains(&i) => Err(code::GPU_IS_LOST),
        Some(i) if state.desc.faults.error.contains(&i) => Err(code::UNKNOWN),
        _ => Ok(f(&gpus, state)),
    };
    state.snapshot = Some((taken, gpus));
    out
}

impl Loaded {
    pub fn profile(&self) -> Profile {
        self.desc.profile
    }

    /// The GPU is in MIG mode.
    pub fn mig(&self, gpu: u32) -> bool {
        self.desc.faults.mig.contains(&gpu)
    }

    /// Processes that start between a count and a copy, if a race is due.
    pub fn take_race(&mut self) -> u32 {
        match self.desc.faults.process_race {
            Some(r) if self.races_left > 0 => {
                self.races_left -= 1;
                r.extra
            }
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replayed_rows_and_bad_sections() {
        let dir = std::env::temp_dir().join(format!("standin-model-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let csv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/h100/probes.csv");
        let f = dir.join("sim-gpus.yaml");
        std::fs::write(
            &f,
            format!(
                "process_dir: {}\ngpus:\n  - {{index: 0, memory_total: 80G}}\n  - {{index: 1, memory_total: 80G}}\n\
                 standin:\n  profile: a100\n  replay: {{file: {}, gpus: {{1: timeslice/tiny_mlp+tiny_mlp}}}}\n",
                dir.display(),
                csv.display()
            ),
        )
        .unwrap();
        let mut d = Description::load(&f).unwrap();
        assert_eq!(d.profile, A100);
        let g = d.gpus();
        assert_eq!((g[0].busy, g[0].sm, g[0].power_w), (0.0, 0.0, 70.0));
        assert!((g[1].busy - 0.92).abs() < 1e-9 && (g[1].sm - 0.011).abs() < 1e-9, "{:?}", g[1]);
        for (section, needle) in [
            ("standin: {profile: v100}\n", "standin.profile"),
            ("standin: {faults: {init: crash}}\n", "standin.faults.init"),
            ("standin: {faults: {block: {call: everything, seconds: 1}}}\n", "standin"),
            ("standin: {colour: red}\n", "colour"),
            ("standin: {replay: {file: nope.csv, gpus: {0: a/b}}}\n", "nope.csv"),
        ] {
            std::fs::write(&f, format!("gpus:\n  - {{index: 0, memory_total: 80G}}\n{section}")).unwrap();
            let e = Description::load(&f).err().unwrap();
            assert!(e.contains(needle) && e.contains("sim-gpus.yaml"), "{section}: {e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
