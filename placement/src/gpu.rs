//! One reading of one GPU, as every source reports it.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuProcess {
    pub pid: u32,
    pub used_mib: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuReading {
    pub index: u32,
    pub uuid: String,
    /// The device minor number (the driver's `/dev/nvidia<minor>`, `c
    /// 195:<minor>`), where the source knows it: it can differ from the
    /// index (NVML's nvmlDeviceGetMinorNumber, as Slurm's gpu/nvml reads it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<u32>,
    pub total_mib: u64,
    pub used_mib: u64,
    /// SM activity averaged over the monitoring window, 0.0–1.0.
    pub sm_activity: f64,
    /// Share of time any kernel ran (NVML utilization.gpu), 0.0–1.0.
    #[serde(default)]
    pub busy: f64,
    pub processes: Vec<GpuProcess>,
    /// Current power draw, where the source knows it.
    pub power_w: Option<f64>,
    /// The Unix user the GPU's MPS server serves now, if one runs: MPS
    /// serves one user at a time per GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps_uid: Option<u32>,
    /// Warps resident vs the SMs' maximum, 0.0–1.0, where the source
    /// measures it (NVML GPM in carma-monitor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_occupancy: Option<f64>,
    /// The GPU's MPS server among `processes`, if one runs: a process of
    /// NVIDIA's daemon, not of any job, which stays after its clients end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps_server_pid: Option<u32>,
}

impl GpuReading {
    /// An idle GPU of `total_mib` as a source with no more to say reads it:
    /// nothing used, no activity, no processes (tests and simulations build
    /// on it, so that a new field is set in one place).
    pub fn idle(index: u32, uuid: impl Into<String>, total_mib: u64) -> GpuReading {
        GpuReading {
            index,
            uuid: uuid.into(),
            total_mib,
            used_mib: 0,
            sm_activity: 0.0,
            busy: 0.0,
            processes: vec![],
            power_w: None,
            mps_uid: None,
            sm_occupancy: None,
            mps_server_pid: None,
            minor: None,
        }
    }

    /// The device minor number, the index where the source does not know
    /// it (GPUs numbered in PCI order have minor = index).
    pub fn device_minor(&self) -> u32 {
        self.minor.unwrap_or(self.index)
    }

    pub fn free_mib(&self) -> u64 {
        self.total_mib.saturating_sub(self.used_mib)
    }

    /// The reading a metric names.
    pub fn activity(&self, metric: carma_config::ActivityMetric) -> f64 {
        match metric {
            carma_config::ActivityMetric::Sm => self.sm_activity,
            carma_config::ActivityMetric::Busy => self.busy,
        }
    }
}

/// GPU indices as logs, `CARMA_DECISION` and `CUDA_VISIBLE_DEVICES` write
/// them: `0,2`.
pub fn index_list(indices: &[u32]) -> String {
    indices.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}
