//! Readings that carma-monitor publishes in the state directory, and the
//! source placement uses when carma.yaml says `monitor: {published: true}`:
//! no GPU library is initialised in slurmstepd. Readings older than
//! `stale_after`, missing or unreadable ones fail the read with the reason
//! (CARMA steps are refused, closed), said in the log (at most once a
//! minute per node) and in `carma status`. Never the driver instead: a
//! stale monitor most often means a driver that hangs, and every placing
//! slurmstepd would then be stuck in it (a bound limits the wait, not the
//! thread stuck in the driver).

use super::{GpuSource, SourceError};
use crate::fsutil;
use crate::gpu::GpuReading;
use carma_config::Config;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const READINGS_FILE: &str = "readings.json";
/// Bounds what a placing step reads (a node with 64 GPUs and many processes
/// stays far below).
const MAX_BYTES: u64 = 4 << 20;
const STALE_STAMP: &str = "monitor.stale";
const STALE_LOG_EVERY: Duration = Duration::from_secs(60);

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

impl Published {
    pub fn age(&self) -> Duration {
        Duration::from_millis(crate::clock::now_ms().saturating_sub(self.written_ms))
    }
}

/// How far ahead of the reader's clock a publication may be dated.
const FUTURE_SLACK_MS: u64 = 1000;

pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(READINGS_FILE)
}

/// Writes atomically: a temp file (0600, root's: the state directory's
/// files are its owner's only), fsync, rename.
pub fn publish(state_dir: &Path, p: &Published) -> std::io::Result<()> {
    let target = path(state_dir);
    let tmp = state_dir.join(format!("{READINGS_FILE}.tmp"));
    let text = serde_json::to_vec(p).map_err(std::io::Error::other)?;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(crate::fsutil::PRIVATE_FILE_MODE)
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
    // Dated ahead of this clock (it was set back): its age says nothing.
    let ahead = p.written_ms.saturating_sub(crate::clock::now_ms());
    if ahead > FUTURE_SLACK_MS {
        return Err(format!(
            "{} is dated {:.1} s ahead of this node's clock (was the clock set back?)",
            path(state_dir).display(),
            ahead as f64 / 1000.0
        ));
    }
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

/// What a step is told when the readings cannot be used.
pub fn refusal(why: &str) -> String {
    format!("carma-monitor's readings are not usable: {why}; CARMA steps are refused until it publishes again")
}

pub struct PublishedSource {
    /// state_dir and monitor.stale_after.
    cfg: Config,
    log: fn(&str),
    /// The last read publication's `written_ms`.
    written_ms: Option<u64>,
}

impl PublishedSource {
    pub fn new(cfg: &Config, log: fn(&str)) -> PublishedSource {
        PublishedSource { cfg: cfg.clone(), log, written_ms: None }
    }
}

impl GpuSource for PublishedSource {
    fn read(&mut self) -> Result<Vec<GpuReading>, SourceError> {
        self.written_ms = None;
        let p = fresh(&self.cfg.state_dir, self.cfg.monitor.stale_after).map_err(|why| {
            // One line a minute per node, whichever process sees it first;
            // each refused step says it in its own error.
            let refused = refusal(&why);
            if fsutil::stamp_due(&self.cfg.state_dir.join(STALE_STAMP), STALE_LOG_EVERY) {
                (self.log)(&refused);
            }
            SourceError(refused)
        })?;
        self.written_ms = Some(p.written_ms);
        Ok(p.gpus)
    }

    fn name(&self) -> &'static str {
        "published"
    }

    fn as_of_ms(&self) -> Option<u64> {
        self.written_ms
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
            mps_server_pid: None,
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
        publish(&d.0, &publication(crate::clock::now_ms(), 0.25)).unwrap();
        assert_eq!(fresh(&d.0, Duration::from_secs(10)).unwrap().gpus[0].sm_activity, 0.25);
        publish(&d.0, &publication(crate::clock::now_ms() - 30_000, 0.25)).unwrap();
        let why = fresh(&d.0, Duration::from_secs(10)).unwrap_err();
        assert!(why.contains("s old") && why.contains("stale_after 10 s"), "{why}");
        publish(&d.0, &publication(crate::clock::now_ms() + 60_000, 0.25)).unwrap();
        let why = fresh(&d.0, Duration::from_secs(10)).unwrap_err();
        assert!(why.contains("ahead of this node's clock"), "{why}");
        std::fs::write(path(&d.0), b"{half").unwrap();
        assert!(fresh(&d.0, Duration::from_secs(10)).unwrap_err().contains("unreadable"));
    }

    /// A stale publication fails the read with its reason and never opens
    /// the configured source (here NVML from a library whose every call
    /// would hang or fail: it must not even be loaded).
    #[test]
    fn a_stale_publication_fails_closed_without_opening_the_driver() {
        let d = TempDir::new();
        let cfg = Config {
            state_dir: d.0.clone(),
            gpu_source: carma_config::GpuSource::Nvml { library: Some("/nonexistent/libnvidia-ml.so.1".into()) },
            ..Config::default()
        };
        let mut src = PublishedSource::new(&cfg, |_| {});
        publish(&d.0, &publication(crate::clock::now_ms(), 0.5)).unwrap();
        assert_eq!(src.read().unwrap()[0].uuid, "GPU-x");
        publish(&d.0, &publication(crate::clock::now_ms() - 60_000, 0.5)).unwrap();
        let t = std::time::Instant::now();
        let e = src.read().unwrap_err().0;
        assert!(e.contains("s old") && e.contains("CARMA steps are refused"), "{e}");
        assert!(!e.contains("NVML"), "the driver was tried: {e}");
        assert!(t.elapsed() < Duration::from_millis(200));
        assert!(d.0.join(STALE_STAMP).exists(), "the refusal was logged");
        std::fs::remove_file(path(&d.0)).unwrap();
        assert!(src.read().unwrap_err().0.contains("does not exist"));
    }
}
