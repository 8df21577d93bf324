//! Readings that carma-monitor publishes in the state directory, and the
//! source placement uses when carma.yaml says `monitor: {published: true}`:
//! no GPU library is initialised in slurmstepd on the hot path. Readings
//! older than `stale_after`, missing or unreadable ones make the source
//! read the GPUs directly, and say so in the log (at most once a minute
//! per node) and in `carma status`.

use super::{GpuSource, SourceError, open_direct};
use crate::fsutil;
use crate::gpu::GpuReading;
use carma_config::Config;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub const READINGS_FILE: &str = "readings.json";
/// Bounds what a placing step reads (a node with 64 GPUs and many processes
/// stays far below).
const MAX_BYTES: u64 = 4 << 20;
const FALLBACK_STAMP: &str = "monitor.fallback";
const FALLBACK_LOG_EVERY: Duration = Duration::from_secs(60);

/// What one publication holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Published {
    /// When written, ms since the epoch.
    pub written_ms: u64,
    /// The monitor's sampling interval and averaging window, ms.
    pub interval_ms: u64,
    pub window_ms: u64,
    /// The source the monitor reads (`nvml`, `simulated`).
    pub source: String,
    /// Samples in the window behind these means.
    pub samples: u32,
    /// SM activity and busy time are means over the window; memory,
    /// processes and power are the latest sample.
    pub gpus: Vec<GpuReading>,
}

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Published {
    pub fn age(&self) -> Duration {
        Duration::from_millis(now_ms().saturating_sub(self.written_ms))
    }
}

pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(READINGS_FILE)
}

/// Writes atomically: a temp file (0644, root's), fsync, rename.
pub fn publish(state_dir: &Path, p: &Published) -> std::io::Result<()> {
    let target = path(state_dir);
    let tmp = state_dir.join(format!("{READINGS_FILE}.tmp"));
    let text = serde_json::to_vec(p).map_err(std::io::Error::other)?;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    f.write_all(&text)?;
    f.sync_all()?;
    std::fs::rename(&tmp, &target)
}

/// The latest publication, or why there is none.
pub fn read(state_dir: &Path) -> Result<Published, String> {
    let p = path(state_dir);
    let bytes = fsutil::read_bounded(&p, MAX_BYTES)
        .map_err(|e| format!("{}: {e}", p.display()))?
        .ok_or_else(|| format!("{} does not exist (is carma-monitor running?)", p.display()))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{}: unreadable ({e})", p.display()))
}

/// Whether published readings can be used now, and if not why.
pub fn fresh(state_dir: &Path, stale_after: Duration) -> Result<Published, String> {
    let p = read(state_dir)?;
    let age = p.age();
    if age > stale_after {
        return Err(format!(
            "{} is {:.1} s old (monitor.stale_after {} s; is carma-monitor running?)",
            path(state_dir).display(),
            age.as_secs_f64(),
            stale_after.as_secs()
        ));
    }
    Ok(p)
}

pub struct PublishedSource {
    /// state_dir, monitor.stale_after, and the direct source to fall back to.
    cfg: Config,
    direct: Option<Box<dyn GpuSource>>,
    log: fn(&str),
    /// Why the last read did not use published readings.
    pub fallback: Option<String>,
}

impl PublishedSource {
    pub fn new(cfg: &Config, log: fn(&str)) -> PublishedSource {
        PublishedSource { cfg: cfg.clone(), direct: None, log, fallback: None }
    }

    fn note_fallback(&mut self, why: String) {
        // One line a minute per node, whichever process sees it first.
        if fsutil::stamp_due(&self.cfg.state_dir.join(FALLBACK_STAMP), FALLBACK_LOG_EVERY) {
            (self.log)(&format!("monitor readings not used: {why}; reading the GPUs directly"));
        }
        self.fallback = Some(why);
    }
}

impl GpuSource for PublishedSource {
    fn read(&mut self) -> Result<Vec<GpuReading>, SourceError> {
        match fresh(&self.cfg.state_dir, self.cfg.monitor.stale_after) {
            Ok(p) => {
                self.fallback = None;
                Ok(p.gpus)
            }
            Err(why) => {
                self.note_fallback(why);
                if self.direct.is_none() {
                    self.direct = Some(open_direct(&self.cfg, self.log)?);
                }
                self.direct.as_mut().expect("just opened").read()
            }
        }
    }

    fn name(&self) -> &'static str {
        "published"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::TempDir;

    fn reading(sm: f64) -> GpuReading {
        GpuReading {
            index: 0,
            uuid: "GPU-x".into(),
            minor: None,
            total_mib: 40960,
            used_mib: 1000,
            sm_activity: sm,
            busy: sm,
            processes: vec![],
            power_w: None,
            mps_uid: None,
            sm_occupancy: None,
        }
    }

    fn publication(written_ms: u64, sm: f64) -> Published {
        Published {
            written_ms,
            interval_ms: 1000,
            window_ms: 60000,
            source: "simulated".into(),
            samples: 3,
            gpus: vec![reading(sm)],
        }
    }

    #[test]
    fn fresh_readings_round_trip_and_old_ones_are_stale() {
        let d = TempDir::new();
        assert!(fresh(&d.0, Duration::from_secs(10)).unwrap_err().contains("does not exist"));
        publish(&d.0, &publication(now_ms(), 0.25)).unwrap();
        assert_eq!(fresh(&d.0, Duration::from_secs(10)).unwrap().gpus[0].sm_activity, 0.25);
        publish(&d.0, &publication(now_ms() - 30_000, 0.25)).unwrap();
        let why = fresh(&d.0, Duration::from_secs(10)).unwrap_err();
        assert!(why.contains("s old") && why.contains("stale_after 10 s"), "{why}");
        std::fs::write(path(&d.0), b"{half").unwrap();
        assert!(fresh(&d.0, Duration::from_secs(10)).unwrap_err().contains("unreadable"));
    }

    #[test]
    fn a_stale_publication_falls_back_to_the_configured_source() {
        let d = TempDir::new();
        let gpus = d.0.join("gpus.yaml");
        std::fs::write(&gpus, "gpus:\n  - {index: 0, uuid: GPU-direct, memory_total: 16G}\n").unwrap();
        let cfg = Config {
            state_dir: d.0.clone(),
            gpu_source: carma_config::GpuSource::Simulated(gpus),
            ..Config::default()
        };
        let mut src = PublishedSource::new(&cfg, |_| {});
        publish(&d.0, &publication(now_ms(), 0.5)).unwrap();
        assert_eq!(src.read().unwrap()[0].uuid, "GPU-x");
        assert!(src.fallback.is_none());
        publish(&d.0, &publication(now_ms() - 60_000, 0.5)).unwrap();
        assert_eq!(src.read().unwrap()[0].uuid, "GPU-direct");
        assert!(src.fallback.as_deref().is_some_and(|w| w.contains("s old")));
        assert!(d.0.join(FALLBACK_STAMP).exists(), "the fallback was logged");
    }
}
