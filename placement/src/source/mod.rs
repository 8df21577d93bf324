//! Where GPU readings come from: NVML on GPU nodes, a file of simulated GPUs
//! elsewhere. Chosen by `gpu_source` in carma.yaml, never by build flags.

mod bounded;
pub mod dcgm_exporter;
mod nvml;
pub mod published;
pub mod simulated;

use crate::gpu::GpuReading;
use carma_config::{Config, GpuSource as SourceConfig};
use std::fmt;
use std::time::Duration;

pub use bounded::Bounded;
pub use nvml::NvmlSource;
pub use simulated::SimulatedGpus;

pub trait GpuSource: Send {
    /// One reading of every GPU of the node, ordered by index.
    fn read(&mut self) -> Result<Vec<GpuReading>, SourceError>;
    /// Short name for log lines.
    fn name(&self) -> &'static str;
    /// When the last read's activity window ended, ms since the epoch,
    /// where it is older than the read (published readings); `None`: as of
    /// the read.
    fn as_of_ms(&self) -> Option<u64> {
        None
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SourceError(pub String);

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SourceError {}

/// The source placement reads: carma-monitor's published readings where
/// carma.yaml says so (stale ones fail the read), else the GPUs; only the
/// GPUs carma.yaml's `gpu_indices` names, where it names them.
pub fn open_source(cfg: &Config, log: fn(&str)) -> Result<Box<dyn GpuSource>, SourceError> {
    let source = if cfg.monitor.published {
        Box::new(published::PublishedSource::new(cfg, log))
    } else {
        open_direct(cfg, log)?
    };
    Ok(match &cfg.gpu_indices {
        Some(allowed) => Box::new(Allowed { source, allowed: allowed.clone() }),
        None => source,
    })
}

/// The GPUs Slurm knows on this node (gres.conf's, as carma.yaml's
/// `gpu_indices` lists them): a GPU the admin left out (faulty, reserved)
/// is never placed on.
struct Allowed {
    source: Box<dyn GpuSource>,
    allowed: Vec<u32>,
}

impl GpuSource for Allowed {
    fn read(&mut self) -> Result<Vec<GpuReading>, SourceError> {
        let mut r = self.source.read()?;
        r.retain(|g| self.allowed.contains(&g.index));
        Ok(r)
    }

    fn name(&self) -> &'static str {
        self.source.name()
    }

    fn as_of_ms(&self) -> Option<u64> {
        self.source.as_of_ms()
    }
}

/// NVML, opened and read in a thread of its own: each read is bounded by
/// `timeouts.gpu_read` ([`Bounded`]).
fn open_nvml(cfg: &Config, sampling: bool, log: fn(&str)) -> Result<Box<dyn GpuSource>, SourceError> {
    let SourceConfig::Nvml { library } = &cfg.gpu_source else {
        return Err(SourceError("gpu_source is not nvml".into()));
    };
    let (library, window) = (library.clone(), cfg.monitor_window);
    Ok(Box::new(Bounded::spawn("nvml", cfg.timeouts.gpu_read, move || {
        let l = library.as_deref();
        let s = if sampling { NvmlSource::init_sampling(l, window, log)? } else { NvmlSource::init(l, window, log)? };
        Ok(Box::new(s) as Box<dyn GpuSource>)
    })?))
}

/// The configured GPUs for a reader that samples at intervals (carma-monitor):
/// NVML then measures SM activity between samples with GPM, where supported.
pub fn open_sampling(cfg: &Config, log: fn(&str)) -> Result<Box<dyn GpuSource>, SourceError> {
    match &cfg.gpu_source {
        SourceConfig::Nvml { .. } => open_nvml(cfg, true, log),
        _ => open_direct(cfg, log),
    }
}

/// carma-monitor's source: [`open_sampling`], with SM activity and
/// occupancy from a dcgm-exporter where carma.yaml names one (GPUs without
/// GPM). Each scrape is bounded by the sampling interval (at most 2 s).
pub fn open_monitored(cfg: &Config, log: fn(&str)) -> Result<Box<dyn GpuSource>, SourceError> {
    let source = open_sampling(cfg, log)?;
    Ok(match &cfg.monitor.dcgm_exporter {
        Some(e) => {
            let timeout = cfg.monitor.interval.clamp(Duration::from_millis(100), Duration::from_secs(2));
            Box::new(dcgm_exporter::WithDcgmExporter::new(source, e.clone(), timeout))
        }
        None => source,
    })
}

/// Opens the configured GPUs themselves. NVML is loaded at run time: on a
/// node without a driver this returns an error in well under a millisecond.
pub fn open_direct(cfg: &Config, log: fn(&str)) -> Result<Box<dyn GpuSource>, SourceError> {
    match &cfg.gpu_source {
        SourceConfig::Nvml { .. } => open_nvml(cfg, false, log),
        SourceConfig::Simulated(path) => Ok(Box::new(SimulatedGpus::load(path)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where NVML cannot be loaded (no driver; here a library path that
    /// does not exist, as this machine may have the NVML stand-in on its
    /// loader's path), opening fails fast with a message that says why.
    #[test]
    fn nvml_without_driver_is_a_clear_error_not_a_crash() {
        let t = std::time::Instant::now();
        let cfg = Config {
            gpu_source: SourceConfig::Nvml { library: Some("/nonexistent/libnvidia-ml.so.1".into()) },
            ..Config::default()
        };
        let e = open_direct(&cfg, |_| {}).err().expect("NVML opened without a driver");
        let e = e.to_string();
        assert!(e.starts_with("NVML unavailable from /nonexistent/libnvidia-ml.so.1") && e.contains("driver"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(2));
    }
}
