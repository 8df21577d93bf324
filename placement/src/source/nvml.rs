//! Live readings from NVIDIA's NVML (libnvidia-ml, loaded at run time).
//!
//! SM activity as CARMA means it (DCGM's SM_ACTIVE: the share of time an SM
//! has at least one warp, averaged over SMs) comes from NVML GPM's SmUtil,
//! between two samples, on Hopper and newer; carma-monitor keeps the last
//! sample of each GPU for that ([`NvmlSource::init_sampling`]). Without GPM
//! (older GPUs, or a one-off read in slurmstepd) busy time stands in.

use super::{GpuSource, SourceError};
use crate::gpu::{GpuProcess, GpuReading};
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::Sampling;
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::{GpmSample, gpm_metrics_get};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const MIB: u64 = 1024 * 1024;

pub struct NvmlSource {
    /// One per process, never shut down: GPM samples borrow it.
    nvml: &'static Nvml,
    window: Duration,
    /// The last GPM sample of each device (sampling sources only).
    gpm: Option<Vec<Option<GpmSample<'static>>>>,
    /// The newest busy-time sample read of each device (sampling sources
    /// only): each read takes the samples since, so that the monitor's
    /// window is made of what each interval saw. Taking the whole window
    /// on every read averaged it twice: an H100 busy 0.93 read 0.58.
    busy_seen: BTreeMap<u32, u64>,
    /// GPUs left out of the readings, and why (said once each, and again
    /// when they answer).
    left_out: BTreeMap<u32, &'static str>,
    log: fn(&str),
}

/// The library this process loaded (once: NVML is initialised per process).
static NVML: std::sync::OnceLock<Nvml> = std::sync::OnceLock::new();

/// Why a GPU gave no reading: lost, in MIG mode (CARMA places whole
/// GPUs' processes and memory, not MIG instances), or an error. Each
/// leaves the GPU out, with a log line; the node's other GPUs still serve.
enum Miss {
    Lost,
    Mig,
    Failed(SourceError),
}

/// How often a process list is asked for again when it grew between
/// NVML's count and its copy (each try leaves room for 5 more).
const PROCESS_LIST_TRIES: usize = 3;

impl NvmlSource {
    /// A source for one-off reads (slurmstepd, `carma status`), from the
    /// driver's `libnvidia-ml.so.1` on the loader's path or `library`.
    pub fn init(library: Option<&Path>, window: Duration, log: fn(&str)) -> Result<NvmlSource, SourceError> {
        let unavailable = |e: NvmlError| {
            let from = library.map(|l| format!(" from {}", l.display())).unwrap_or_default();
            SourceError(format!("NVML unavailable{from} ({e}); is the NVIDIA driver installed and loaded?"))
        };
        let nvml = match NVML.get() {
            Some(n) => n,
            None => {
                let n = match library {
                    Some(path) => Nvml::builder().lib_path(path.as_os_str()).init(),
                    None => Nvml::init(),
                }
                .map_err(unavailable)?;
                NVML.get_or_init(|| n)
            }
        };
        Ok(NvmlSource { nvml, window, gpm: None, busy_seen: BTreeMap::new(), left_out: BTreeMap::new(), log })
    }

    /// A source read at intervals (carma-monitor): SM activity and
    /// occupancy from GPM between consecutive reads, where supported.
    /// The first GPM sample of each GPU is taken here, so that the first
    /// read already measures SM activity (else busy time would stand in
    /// for a whole window).
    pub fn init_sampling(library: Option<&Path>, window: Duration, log: fn(&str)) -> Result<NvmlSource, SourceError> {
        let mut s = NvmlSource { gpm: Some(Vec::new()), ..NvmlSource::init(library, window, log)? };
        let count = s.nvml.device_count().unwrap_or(0);
        let first: Vec<Option<GpmSample<'static>>> =
            (0..count).map(|i| s.nvml.device_by_index(i).ok().and_then(|d| d.gpm_sample().ok())).collect();
        s.gpm = Some(first);
        Ok(s)
    }

    /// The device's compute processes. NVML counts them, then copies them
    /// into a buffer 5 larger: processes started in between can outgrow it
    /// (`Insufficient Size`), and the list is asked for again.
    fn processes(dev: &nvml_wrapper::Device<'static>) -> Result<Vec<GpuProcess>, NvmlError> {
        let mut tries = 0;
        let list = loop {
            tries += 1;
            match dev.running_compute_processes() {
                Err(NvmlError::InsufficientSize(_)) if tries < PROCESS_LIST_TRIES => continue,
                other => break other?,
            }
        };
        // Under MPS the compute list names the server, and only the MPS
        // list names its clients (the jobs) with their memory. Older
        // drivers lack the call: then the compute list is all there is.
        let mut list = list;
        if let Ok(clients) = dev.mps_running_compute_processes() {
            for c in clients {
                list.retain(|p| p.pid != c.pid);
                list.push(c);
            }
        }
        Ok(list
            .into_iter()
            .map(|p| GpuProcess {
                pid: p.pid,
                used_mib: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => b.div_ceil(MIB),
                    UsedGpuMemory::Unavailable => 0,
                },
            })
            .collect())
    }

    fn read_present(&mut self, index: u32, since_us: u64) -> Result<GpuReading, Miss> {
        let miss = |what: &'static str| {
            move |e: NvmlError| match e {
                NvmlError::GpuLost => Miss::Lost,
                e => Miss::Failed(SourceError(format!("NVML {what} of GPU {index}: {e}"))),
            }
        };
        let dev = self.nvml.device_by_index(index).map_err(miss("device"))?;
        // A GPU without MIG support answers NotSupported: not in MIG mode.
        match dev.mig_mode() {
            Ok(m) if m.current == 1 => return Err(Miss::Mig),
            Err(NvmlError::GpuLost) => return Err(Miss::Lost),
            _ => {}
        }
        let mem = dev.memory_info().map_err(miss("memory info"))?;
        let processes = Self::processes(&dev).map_err(miss("processes"))?;
        // Windowed busy time (utilization.gpu: the share of time any
        // kernel ran): over the window for a one-off read, since the last
        // read for a sampling one; the instantaneous rate only if the
        // driver keeps no samples for this device, or none came since.
        let sampling = self.gpm.is_some();
        // The last sample read, where it lies within the window: after a
        // clock step back, or a gap longer than the window (a GPU left out
        // for a while, a stalled monitor), the window's samples instead.
        let now_us = since_us.saturating_add(self.window.as_micros() as u64);
        let seen = self.busy_seen.get(&index).copied().filter(|&t| since_us <= t && t <= now_us);
        let since = if sampling { seen.unwrap_or(since_us) } else { since_us };
        let samples = dev.samples(Sampling::GpuUtilization, since).ok();
        if let Some(newest) = samples.iter().flatten().map(|s| s.timestamp).max().filter(|_| sampling) {
            self.busy_seen.insert(index, newest);
        }
        let busy = samples
            .as_deref()
            .and_then(mean_sample)
            .or_else(|| dev.utilization_rates().ok().map(|u| f64::from(u.gpu) / 100.0))
            .unwrap_or(1.0);
        // Without GPM busy time stands in for SM activity: it is never
        // below it (an H100 read busy 0.92 at SM activity 0.01), so the
        // SM cap errs on the safe side.
        let (sm_activity, sm_occupancy) = match self.gpm_since_last(index, &dev) {
            Some((sm, occ)) => (sm, Some(occ)),
            None => (busy, None),
        };
        // An MPS server runs as a compute process of its GPU, as the
        // user it serves.
        let server = processes.iter().find_map(|p| crate::procs::mps_server_uid(p.pid).map(|uid| (p.pid, uid)));
        let (mps_server_pid, mps_uid) = (server.map(|s| s.0), server.map(|s| s.1));
        Ok(GpuReading {
            index,
            uuid: dev.uuid().unwrap_or_else(|_| format!("GPU-{index}")),
            minor: dev.minor_number().ok(),
            total_mib: mem.total / MIB,
            used_mib: mem.used.div_ceil(MIB),
            sm_activity,
            busy,
            processes,
            power_w: dev.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
            mps_uid,
            sm_occupancy,
            mps_server_pid,
        })
    }

    /// SM activity and occupancy of device `index` since its last sample,
    /// as fractions; `None` without GPM or on the first read.
    fn gpm_since_last(&mut self, index: u32, dev: &nvml_wrapper::Device<'static>) -> Option<(f64, f64)> {
        let slots = self.gpm.as_mut()?;
        if slots.len() <= index as usize {
            slots.resize_with(index as usize + 1, || None);
        }
        let now = dev.gpm_sample().ok()?;
        let before = slots[index as usize].replace(now)?;
        let after = slots[index as usize].as_ref()?;
        let ids = [GpmMetricId::SmUtil, GpmMetricId::SmOccupancy];
        let got = gpm_metrics_get(self.nvml, &before, after, &ids).ok()?;
        let value = |i: usize| got.get(i)?.as_ref().ok().map(|m| (m.value / 100.0).clamp(0.0, 1.0));
        Some((value(0)?, value(1).unwrap_or(0.0)))
    }
}

/// Mean of the driver's buffered utilization samples newer than `since_us`
/// (no monitoring daemon needed), as a fraction.
fn mean_sample(samples: &[nvml_wrapper::struct_wrappers::device::Sample]) -> Option<f64> {
    let values: Vec<f64> = samples
        .iter()
        .map(|s| match s.value {
            SampleValue::F64(v) => v,
            SampleValue::U32(v) => f64::from(v),
            SampleValue::U64(v) => v as f64,
            SampleValue::I64(v) => v as f64,
        })
        .collect();
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64 / 100.0)
}

impl GpuSource for NvmlSource {
    fn read(&mut self) -> Result<Vec<GpuReading>, SourceError> {
        let count = self.nvml.device_count().map_err(|e| SourceError(format!("NVML device count: {e}")))?;
        let since_us = SystemTime::now()
            .checked_sub(self.window)
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        let mut out = Vec::with_capacity(count as usize);
        let mut first_error = None;
        for index in 0..count {
            let (why, detail) = match self.read_present(index, since_us) {
                Ok(r) => {
                    if self.left_out.remove(&index).is_some() {
                        (self.log)(&format!("GPU {index} answers NVML again; it is placed on again"));
                    }
                    out.push(r);
                    continue;
                }
                Err(Miss::Lost) => ("lost", "NVML says the GPU is lost (fallen off the bus?)".to_string()),
                Err(Miss::Mig) => ("mig", "in MIG mode, which CARMA does not place on".to_string()),
                Err(Miss::Failed(e)) => {
                    let line = format!("{e}");
                    first_error.get_or_insert(e);
                    ("error", line)
                }
            };
            // Left out: nothing is placed on it, and the node's other GPUs
            // still serve. Said once, and again if the reason changes.
            if self.left_out.insert(index, why) != Some(why) {
                (self.log)(&format!("GPU {index}: {detail}; nothing is placed on it until that changes"));
            }
        }
        // Errors on every GPU: the read fails, saying why (no GPU to offer).
        match first_error {
            Some(e) if out.is_empty() => Err(e),
            _ => Ok(out),
        }
    }

    fn name(&self) -> &'static str {
        "nvml"
    }
}
