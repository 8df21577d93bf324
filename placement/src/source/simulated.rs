//! Simulated GPUs for nodes without GPUs (CI, the demo, the simulator).
//!
//! An admin-written YAML file describes the GPUs; running workloads
//! (`carma-fakejob`) register their memory, SM activity and busy time as one small JSON file
//! per process in `process_dir` (mode 1777, like /tmp), which readers treat
//! like NVML's process list: files of dead processes are ignored.
//!
//! ```yaml
//! process_dir: /run/carma-sim      # default
//! gpus:
//!   - {index: 0, uuid: GPU-sim-0, memory_total: 40G}
//!   - {index: 1, memory_total: 40G, memory_used: 1G, sm_activity: 0.2, busy: 0.5}   # baseline load
//! ```

use super::{GpuSource, SourceError};
use crate::gpu::{GpuProcess, GpuReading};
use crate::procs::alive;
use fs2::FileExt;
use serde::{Deserialize, Serialize};
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const MAX_FILE_BYTES: u64 = 64 * 1024;
const MAX_PROCESS_FILES: usize = 4096;
pub const DEFAULT_PROCESS_DIR: &str = "/run/carma-sim";
/// The file the NVML stand-in describes its GPUs with, beside the library
/// or here.
pub const STANDIN_FILE_NAME: &str = "sim-gpus.yaml";
pub const DEFAULT_STANDIN_FILE: &str = "/etc/carma/sim-gpus.yaml";

/// The description of the GPUs the NVML stand-in loaded from `library`
/// (its file, or its directory) presents: `$CARMA_NVML_STANDIN`, else
/// `sim-gpus.yaml` beside the library, else /etc/carma/sim-gpus.yaml. The
/// stand-in and the simulated workloads on its GPUs agree through this.
pub fn standin_description(library: Option<&Path>) -> PathBuf {
    if let Some(p) = std::env::var_os("CARMA_NVML_STANDIN").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let dir = library.map(|l| if l.is_dir() { l.to_path_buf() } else { l.parent().unwrap_or(l).to_path_buf() });
    match dir.map(|d| d.join(STANDIN_FILE_NAME)) {
        Some(beside) if beside.exists() => beside,
        _ => PathBuf::from(DEFAULT_STANDIN_FILE),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    gpus: Vec<RawGpu>,
    process_dir: Option<String>,
    /// Read by the NVML stand-in (`nvml-standin/`): its GPU profile,
    /// replayed readings and faults.
    #[allow(dead_code)]
    standin: Option<serde_yaml::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGpu {
    index: u32,
    uuid: Option<String>,
    /// The device minor number (`/dev/nvidia<minor>`); the index if unset.
    minor: Option<u32>,
    memory_total: serde_yaml::Value,
    memory_used: Option<serde_yaml::Value>,
    sm_activity: Option<f64>,
    busy: Option<f64>,
    power_w: Option<f64>,
}

#[derive(Debug, Clone)]
struct SimGpu {
    index: u32,
    uuid: String,
    minor: u32,
    total_mib: u64,
    base_used_mib: u64,
    base_sm: f64,
    base_busy: f64,
    power_w: Option<f64>,
}

/// One process's use of each GPU it runs on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimProcess {
    pub pid: u32,
    pub gpus: Vec<SimUse>,
    /// A client of the GPUs' MPS servers (it ran with CUDA_MPS_PIPE_DIRECTORY).
    #[serde(default)]
    pub mps: bool,
    /// The registration file's owner: the process's Unix user (never taken
    /// from the file's content, which its user writes).
    #[serde(skip)]
    pub uid: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimUse {
    pub index: u32,
    pub used_mib: u64,
    pub sm: f64,
    /// Share of time its kernels run; older registrations lack it (its SM activity then).
    #[serde(default)]
    pub busy: Option<f64>,
}

/// Raised when a simulated allocation does not fit (the fake workload
/// turns it into PyTorch's OOM message).
#[derive(Debug, Clone, PartialEq)]
pub struct SimOom {
    pub gpu: u32,
    pub total_mib: u64,
    pub used_mib: u64,
    pub asked_mib: u64,
}

/// Time-slicing's cost per extra job sharing a GPU, a share of each job's
/// time: fitted on data/h100/collocation.csv (the simulator's calibration
/// checks the fit).
pub const SWITCH_OVERHEAD: f64 = 0.106;

/// How many times slower than alone jobs time-sliced on one GPU run, given
/// each one's solo `(busy, sm)`: their busy times add up past the GPU's
/// whole time, and each extra job costs `switch_overhead` more.
pub fn timeslice_slowdown(jobs: &[(f64, f64)], switch_overhead: f64) -> f64 {
    let busy: f64 = jobs.iter().map(|j| j.0).sum();
    busy.max(1.0) * (1.0 + switch_overhead * jobs.len().saturating_sub(1) as f64)
}

/// What a GPU whose jobs are time-sliced reads `(SM activity, busy)`: the
/// SM work each does at its slowed pace, and the share of time any kernel
/// runs (the GPU is busy whenever one of its jobs would be).
pub fn timeslice_reading(jobs: &[(f64, f64)], switch_overhead: f64) -> (f64, f64) {
    let sm = jobs.iter().map(|j| j.1).sum::<f64>() / timeslice_slowdown(jobs, switch_overhead);
    (sm.min(1.0), jobs.iter().map(|j| j.0).sum::<f64>().min(1.0))
}

pub struct SimulatedGpus {
    file: PathBuf,
    gpus: Vec<SimGpu>,
    process_dir: PathBuf,
}

fn size(v: &serde_yaml::Value, key: &str, file: &Path) -> Result<u64, SourceError> {
    let text = match v {
        serde_yaml::Value::Number(n) => n.to_string(),
        serde_yaml::Value::String(s) => s.clone(),
        _ => String::new(),
    };
    carma_config::parse_size_mib(&text)
        .map_err(|e| SourceError(format!("simulated GPU file {}: {key}: {e}", file.display())))
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, String> {
    crate::fsutil::read_bounded(path, MAX_FILE_BYTES)?.ok_or_else(|| "does not exist".to_string())
}

impl SimulatedGpus {
    pub fn load(file: &Path) -> Result<SimulatedGpus, SourceError> {
        let bad = |m: String| SourceError(format!("simulated GPU file {}: {m}", file.display()));
        let bytes = read_bounded(file).map_err(bad)?;
        let raw: RawFile = serde_yaml::from_slice(&bytes).map_err(|e| bad(e.to_string().replace('\n', " ")))?;
        if raw.gpus.is_empty() || raw.gpus.len() > 64 {
            return Err(bad("gpus: list 1 to 64 GPUs".into()));
        }
        let mut gpus = Vec::new();
        for (i, g) in raw.gpus.into_iter().enumerate() {
            if g.index as usize != i {
                return Err(bad(format!("gpus: entry {i} has index {}; list GPUs in index order from 0", g.index)));
            }
            let total_mib = size(&g.memory_total, "memory_total", file)?;
            let base_used_mib = g.memory_used.as_ref().map(|v| size(v, "memory_used", file)).transpose()?.unwrap_or(0);
            let base_sm = g.sm_activity.unwrap_or(0.0);
            let base_busy = g.busy.unwrap_or(base_sm);
            if total_mib == 0
                || base_used_mib > total_mib
                || !(0.0..=1.0).contains(&base_sm)
                || !(0.0..=1.0).contains(&base_busy)
            {
                return Err(bad(format!(
                    "gpus[{i}]: need 0 < memory_used <= memory_total and 0 <= sm_activity, busy <= 1"
                )));
            }
            gpus.push(SimGpu {
                index: g.index,
                minor: g.minor.unwrap_or(g.index),
                uuid: g.uuid.unwrap_or_else(|| format!("GPU-sim-{i}")),
                total_mib,
                base_used_mib,
                base_sm,
                base_busy,
                power_w: g.power_w,
            });
        }
        let process_dir = PathBuf::from(raw.process_dir.unwrap_or_else(|| DEFAULT_PROCESS_DIR.into()));
        Ok(SimulatedGpus { file: file.to_path_buf(), gpus, process_dir })
    }

    pub fn file(&self) -> &Path {
        &self.file
    }

    /// The GPUs this process can reach, as CUDA enumerates them: each GPU
    /// whose device file (`/dev/nvidia<minor>`) the device cgroup lets it open
    /// (an open refused with EPERM hides the GPU; with no driver behind
    /// the file an allowed open fails with ENXIO; without device files at
    /// all every GPU is reachable), in index order.
    pub fn enumerated(&self) -> Vec<u32> {
        let dev = Path::new("/dev");
        let mut out: Vec<u32> = self
            .gpus
            .iter()
            .filter(|g| match fs::File::open(crate::devices::gpu_file(dev, g.minor)) {
                Err(e) => e.raw_os_error() != Some(libc::EPERM),
                Ok(_) => true,
            })
            .map(|g| g.index)
            .collect();
        out.sort_unstable();
        out
    }

    /// The GPU indices a `CUDA_VISIBLE_DEVICES` value names, read as CUDA
    /// reads it: indices into the GPUs this process can reach
    /// ([`Self::enumerated`]: under Slurm's ConstrainDevices=yes,
    /// `CUDA_VISIBLE_DEVICES=0` is the first GPU of the step's), or GPU UUIDs
    /// (Slurm 26.05's gres.conf `Flags=env_uuid` puts UUIDs there;
    /// SLURM_STEP_GPUS and SLURM_JOB_GPUS keep the node's indices).
    pub fn visible_indices(&self, visible: &str) -> Result<Vec<u32>, String> {
        let reachable = self.enumerated();
        visible
            .split(',')
            .map(str::trim)
            .map(|g| {
                let by_uuid =
                    || self.gpus.iter().find(|s| s.uuid == g && reachable.contains(&s.index)).map(|s| s.index);
                match g.parse::<usize>() {
                    Ok(i) if i < reachable.len() => Ok(reachable[i]),
                    Ok(_) => Err(format!(
                        "CUDA_VISIBLE_DEVICES={visible}: no GPU {g} among the {} this process can open (of {} in {})",
                        reachable.len(),
                        self.gpus.len(),
                        self.file.display()
                    )),
                    Err(_) => by_uuid().ok_or_else(|| {
                        format!("CUDA_VISIBLE_DEVICES={visible}: {g} is neither a GPU index nor the UUID of one")
                    }),
                }
            })
            .collect()
    }

    pub fn process_dir(&self) -> &Path {
        &self.process_dir
    }

    /// Live processes' registrations, skipping dead ones and bad files.
    /// The registered MPS clients' pids (the NVML stand-in lists them
    /// apart, as the driver does under MPS).
    pub fn mps_clients(&self) -> Vec<u32> {
        self.processes(None).into_iter().filter(|p| p.mps).map(|p| p.pid).collect()
    }

    /// The solo `(busy, sm)` of each live registered process on GPU
    /// `index` (MPS servers, which register none, left out): what a
    /// simulated job's speed depends on (`carma-fakejob --work`).
    /// The baseline load counts as one more, as in the readings.
    pub fn sharers(&self, index: u32) -> Vec<(f64, f64)> {
        let mut out: Vec<(f64, f64)> = self
            .processes(None)
            .iter()
            .flat_map(|p| p.gpus.iter().filter(|u| u.index == index && (u.sm > 0.0 || u.used_mib > 0)))
            .map(|u| (u.busy.unwrap_or(u.sm), u.sm))
            .collect();
        if let Some(g) = self.gpus.iter().find(|g| g.index == index && (g.base_sm > 0.0 || g.base_busy > 0.0)) {
            out.push((g.base_busy, g.base_sm));
        }
        out
    }

    fn processes(&self, skip_pid: Option<u32>) -> Vec<SimProcess> {
        let Ok(entries) = fs::read_dir(&self.process_dir) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for entry in entries.flatten().take(MAX_PROCESS_FILES) {
            let name = entry.file_name();
            let Some(pid) = name.to_str().and_then(|n| n.strip_suffix(".json")).and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if Some(pid) == skip_pid || !alive(pid) {
                continue;
            }
            let Ok(bytes) = read_bounded(&entry.path()) else {
                continue;
            };
            let Ok(meta) = entry.metadata() else { continue };
            match serde_json::from_slice::<SimProcess>(&bytes) {
                Ok(p) if p.pid == pid => out.push(SimProcess { uid: std::os::unix::fs::MetadataExt::uid(&meta), ..p }),
                _ => continue,
            }
        }
        out
    }

    fn readings(&self, procs: &[SimProcess]) -> Vec<GpuReading> {
        self.gpus
            .iter()
            .map(|g| {
                let mine: Vec<(u32, &SimUse)> = procs
                    .iter()
                    .flat_map(|p| p.gpus.iter().filter(|u| u.index == g.index).map(move |u| (p.pid, u)))
                    .collect();
                // MPS runs one server per GPU for one user: its clients' user.
                let mps_uid = procs.iter().find(|p| p.mps && p.gpus.iter().any(|u| u.index == g.index)).map(|p| p.uid);
                // Time-sliced as the simulator models a real GPU: the
                // baseline load is one more job where there is one.
                let mut solo: Vec<(f64, f64)> = mine
                    .iter()
                    .filter(|(_, u)| u.sm > 0.0 || u.used_mib > 0)
                    .map(|(_, u)| (u.busy.unwrap_or(u.sm), u.sm))
                    .collect();
                if g.base_sm > 0.0 || g.base_busy > 0.0 {
                    solo.push((g.base_busy, g.base_sm));
                }
                // Under an MPS server kernels overlap: the solo readings add up.
                let (sm_activity, busy) = match mps_uid {
                    Some(_) => {
                        let sum = |f: fn(&(f64, f64)) -> f64| solo.iter().map(f).sum::<f64>().min(1.0);
                        (sum(|j| j.1), sum(|j| j.0))
                    }
                    None => timeslice_reading(&solo, SWITCH_OVERHEAD),
                };
                GpuReading {
                    index: g.index,
                    uuid: g.uuid.clone(),
                    minor: Some(g.minor),
                    total_mib: g.total_mib,
                    used_mib: g.base_used_mib + mine.iter().map(|(_, u)| u.used_mib).sum::<u64>(),
                    sm_activity,
                    busy,
                    processes: mine.iter().map(|(pid, u)| GpuProcess { pid: *pid, used_mib: u.used_mib }).collect(),
                    power_w: g.power_w,
                    mps_uid,
                    sm_occupancy: None,
                    mps_server_pid: None,
                }
            })
            .collect()
    }

    fn lock(&self) -> std::io::Result<fs::File> {
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o666)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(self.process_dir.join(".lock"))?;
        let start = Instant::now();
        loop {
            match f.try_lock_exclusive() {
                Ok(()) => return Ok(f),
                Err(_) if start.elapsed() < Duration::from_secs(10) => std::thread::sleep(Duration::from_millis(2)),
                Err(e) => return Err(e),
            }
        }
    }

    /// Registers `pid` as using `used_mib` and `sm` on each of `gpus`
    /// (replacing its earlier registration), unless a GPU lacks the memory.
    pub fn allocate(
        &self,
        pid: u32,
        gpus: &[u32],
        used_mib: u64,
        sm: f64,
        busy: f64,
        mps: bool,
    ) -> Result<Result<(), SimOom>, SourceError> {
        let ioerr = |e: std::io::Error| SourceError(format!("simulated GPUs {}: {e}", self.process_dir.display()));
        let _lock = self.lock().map_err(ioerr)?;
        let others = self.readings(&self.processes(Some(pid)));
        for &i in gpus {
            let g = others
                .iter()
                .find(|g| g.index == i)
                .ok_or_else(|| SourceError(format!("GPU {i} is not in {}", self.file.display())))?;
            if g.used_mib + used_mib > g.total_mib {
                return Ok(Err(SimOom { gpu: i, total_mib: g.total_mib, used_mib: g.used_mib, asked_mib: used_mib }));
            }
        }
        let entry = SimProcess {
            pid,
            gpus: gpus.iter().map(|&index| SimUse { index, used_mib, sm, busy: Some(busy) }).collect(),
            mps,
            uid: 0,
        };
        let path = self.process_dir.join(format!("{pid}.json"));
        let tmp = self.process_dir.join(format!(".{pid}.tmp"));
        let mut f = OpenOptions::new().create(true).write(true).truncate(true).mode(0o644).open(&tmp).map_err(ioerr)?;
        f.write_all(&serde_json::to_vec(&entry).unwrap_or_default()).map_err(ioerr)?;
        fs::rename(&tmp, &path).map_err(ioerr)?;
        Ok(Ok(()))
    }

    /// Removes `pid`'s registration (its memory is freed).
    pub fn release(&self, pid: u32) {
        let _ = fs::remove_file(self.process_dir.join(format!("{pid}.json")));
    }
}

impl GpuSource for SimulatedGpus {
    fn read(&mut self) -> Result<Vec<GpuReading>, SourceError> {
        Ok(self.readings(&self.processes(None)))
    }

    fn name(&self) -> &'static str {
        "simulated"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::TempDir;

    fn sim(dir: &Path, extra: &str) -> SimulatedGpus {
        let f = dir.join("gpus.yaml");
        fs::write(
            &f,
            format!(
                "process_dir: {}\ngpus:\n  - {{index: 0, memory_total: 40G}}\n  - {{index: 1, memory_total: 16384, memory_used: 1G, sm_activity: 0.25, busy: 0.3}}\n{extra}",
                dir.display()
            ),
        )
        .unwrap();
        SimulatedGpus::load(&f).unwrap()
    }

    #[test]
    fn visible_devices_are_read_as_indices_or_uuids() {
        let d = TempDir::new();
        let s = sim(&d.0, "");
        assert_eq!(s.visible_indices("1"), Ok(vec![1]));
        assert_eq!(s.visible_indices("1,0"), Ok(vec![1, 0]));
        // The form env_uuid gives (UUIDs as NVML names them, here the
        // simulated GPUs' default UUIDs).
        assert_eq!(s.visible_indices("GPU-sim-1"), Ok(vec![1]));
        assert_eq!(s.visible_indices("GPU-sim-0, 1"), Ok(vec![0, 1]));
        let e = s.visible_indices("GPU-8932f937-d72c-4106-c12f-20bd9faed9f6").unwrap_err();
        assert!(e.contains("neither a GPU index nor the UUID"), "{e}");
        assert!(s.visible_indices("2").unwrap_err().contains("no GPU 2"));
    }

    #[test]
    fn device_minors_are_read_and_default_to_the_index() {
        let d = TempDir::new();
        let f = d.0.join("gpus.yaml");
        let gpus = "gpus:\n  - {index: 0, minor: 3, memory_total: 40G}\n  - {index: 1, memory_total: 40G}\n";
        fs::write(&f, format!("process_dir: {}\n{gpus}", d.0.display())).unwrap();
        let r = SimulatedGpus::load(&f).unwrap().read().unwrap();
        assert_eq!((r[0].minor, r[1].minor), (Some(3), Some(1)));
        assert_eq!((r[0].device_minor(), r[1].device_minor()), (3, 1));
    }

    #[test]
    fn reads_baseline_and_registered_processes() {
        let d = TempDir::new();
        let mut s = sim(&d.0, "");
        let me = std::process::id();
        assert_eq!(s.allocate(me, &[1], 4096, 0.5, 0.6, true).unwrap(), Ok(()));
        let r = s.read().unwrap();
        assert_eq!(r[0].used_mib, 0);
        assert_eq!(r[1].used_mib, 1024 + 4096);
        // An MPS client: kernels overlap, the solo readings add up.
        assert_eq!(r[1].sm_activity, 0.75);
        // Busy time adds up apart from SM activity, and saturates at 1.
        assert_eq!(r[1].busy, 0.3 + 0.6);
        assert_eq!((r[0].sm_activity, r[0].busy), (0.0, 0.0));
        assert_eq!(r[1].processes, vec![GpuProcess { pid: me, used_mib: 4096 }]);
        // An MPS client: the GPU's server serves its user (the file owner's).
        let mine = std::os::unix::fs::MetadataExt::uid(&fs::metadata(&d.0).unwrap());
        assert_eq!((r[0].mps_uid, r[1].mps_uid), (None, Some(mine)));
        // Re-registering replaces; an allocation that does not fit is an OOM.
        assert_eq!(s.allocate(me, &[1], 8192, 0.5, 0.9, false).unwrap(), Ok(()));
        assert_eq!(s.read().unwrap()[1].used_mib, 1024 + 8192);
        assert_eq!(s.read().unwrap()[1].mps_uid, None, "no MPS client left");
        assert_eq!(s.read().unwrap()[1].busy, 1.0);
        // Time-sliced with the baseline load: their SM work at the pace of
        // two jobs sharing a GPU asked for 1.2 of its time.
        let sm = s.read().unwrap()[1].sm_activity;
        assert!((sm - 0.75 / (1.2 * (1.0 + SWITCH_OVERHEAD))).abs() < 1e-9, "{sm}");
        // What a job's speed depends on: each sharer's solo readings.
        assert_eq!((s.sharers(0), s.sharers(1)), (vec![], vec![(0.9, 0.5), (0.3, 0.25)]));
        let oom = s.allocate(me, &[1], 16000, 0.5, 0.5, false).unwrap().unwrap_err();
        assert_eq!((oom.gpu, oom.used_mib, oom.asked_mib), (1, 1024, 16000));
        s.release(me);
        assert_eq!(s.read().unwrap()[1].used_mib, 1024);
    }

    #[test]
    fn dead_processes_and_junk_files_are_ignored() {
        let d = TempDir::new();
        let mut s = sim(&d.0, "");
        // pid_max is at most 2^22 on Linux: this pid cannot be alive.
        fs::write(d.0.join("4194999.json"), r#"{"pid":4194999,"gpus":[{"index":0,"used_mib":100,"sm":0.1}]}"#).unwrap();
        fs::write(d.0.join(format!("{}.json", std::process::id())), b"\x00garbage").unwrap();
        fs::write(d.0.join("notapid.json"), b"{}").unwrap();
        std::os::unix::fs::symlink("/etc/shadow", d.0.join("1.json")).unwrap();
        let r = s.read().unwrap();
        assert_eq!(r[0].used_mib, 0);
        assert!(r[0].processes.is_empty());
    }

    #[test]
    fn bad_files_give_one_line_naming_the_field() {
        let d = TempDir::new();
        for (text, needle) in [
            ("gpus: []\n", "gpus"),
            ("gpus:\n  - {index: 1, memory_total: 40G}\n", "index order"),
            ("gpus:\n  - {index: 0, memory_total: lots}\n", "memory_total"),
            ("gpus:\n  - {index: 0, memory_total: 4G, colour: red}\n", "colour"),
            ("\u{0}\u{1}", "simulated GPU file"),
        ] {
            let f = d.0.join("bad.yaml");
            fs::write(&f, text).unwrap();
            let e = SimulatedGpus::load(&f).err().unwrap().to_string();
            assert!(e.contains(needle) && !e.contains('\n'), "{text:?}: {e}");
        }
        let e = SimulatedGpus::load(&d.0.join("missing.yaml")).err().unwrap();
        assert!(e.to_string().contains("missing.yaml"));
    }
}
