//! Live readings from NVIDIA's NVML (libnvidia-ml, loaded at run time).

use super::{GpuSource, SourceError};
use crate::gpu::{GpuProcess, GpuReading};
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::Sampling;
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const MIB: u64 = 1024 * 1024;

pub struct NvmlSource {
    nvml: Nvml,
    window: Duration,
}

impl NvmlSource {
    pub fn init(window: Duration) -> Result<NvmlSource, SourceError> {
        let nvml = Nvml::init()
            .map_err(|e| SourceError(format!("NVML unavailable ({e}); is the NVIDIA driver installed?")))?;
        Ok(NvmlSource { nvml, window })
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
        let err = |what: &str, e: nvml_wrapper::error::NvmlError| SourceError(format!("NVML {what}: {e}"));
        let count = self.nvml.device_count().map_err(|e| err("device count", e))?;
        let since_us = SystemTime::now()
            .checked_sub(self.window)
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        let mut out = Vec::with_capacity(count as usize);
        for index in 0..count {
            let dev = self.nvml.device_by_index(index).map_err(|e| err("device", e))?;
            let mem = dev.memory_info().map_err(|e| err("memory info", e))?;
            let processes: Vec<GpuProcess> = dev
                .running_compute_processes()
                .map_err(|e| err("processes", e))?
                .into_iter()
                .map(|p| GpuProcess {
                    pid: p.pid,
                    used_mib: match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => b.div_ceil(MIB),
                        UsedGpuMemory::Unavailable => 0,
                    },
                })
                .collect();
            // Windowed busy time (utilization.gpu: the share of time any
            // kernel ran); the instantaneous rate only if the driver keeps
            // no samples for this device.
            let busy = dev
                .samples(Sampling::GpuUtilization, since_us)
                .ok()
                .and_then(|s| mean_sample(&s))
                .or_else(|| dev.utilization_rates().ok().map(|u| f64::from(u.gpu) / 100.0))
                .unwrap_or(1.0);
            // NVML reads no SM activity without GPM (Hopper+) or DCGM,
            // which the node monitor is to read; until then busy time
            // stands in. It is never below SM activity (an H100 read busy
            // 0.92 at SM activity 0.01), so the SM cap errs on the safe side.
            let sm_activity = busy;
            // An MPS server runs as a compute process of its GPU, as the
            // user it serves.
            let mps_uid = processes.iter().find_map(|p| crate::procs::mps_server_uid(p.pid));
            out.push(GpuReading {
                index,
                uuid: dev.uuid().unwrap_or_else(|_| format!("GPU-{index}")),
                total_mib: mem.total / MIB,
                used_mib: mem.used.div_ceil(MIB),
                sm_activity,
                busy,
                processes,
                power_w: dev.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
                mps_uid,
            });
        }
        Ok(out)
    }

    fn name(&self) -> &'static str {
        "nvml"
    }
}
