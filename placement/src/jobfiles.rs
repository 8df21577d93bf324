//! Small per-job files in the root-owned state directory that carry what
//! Slurm does not: why a job was requeued (written by carma-epilog) and its
//! restart count (written by the job prolog), read by slurmstepd's placement;
//! and that slurmstepd placed a job by transparent collocation (it declared
//! nothing, so only this root-owned mark tells carma-epilog to recover it).
//!
//! Two writers because of measured Slurm 22.05 behaviour: a job requeued
//! from the epilog restarts on the same node without the prolog running
//! again, and S_SLURM_RESTART_COUNT reads 0 in a requeued batch step.

use carma_config::RecoveryMode;
use std::io::Write;
use std::path::{Path, PathBuf};

/// How a requeued job is to be rerun.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recovery {
    pub mode: RecoveryMode,
    /// What the crashed run needed (looser mode), MiB.
    pub need_mib: Option<u64>,
}

fn recovery_path(dir: &Path, job: u32) -> PathBuf {
    dir.join(format!("recovery-{job}"))
}

fn restart_path(dir: &Path, job: u32) -> PathBuf {
    dir.join(format!("restart-{job}"))
}

fn gpus_path(dir: &Path, job: u32) -> PathBuf {
    dir.join(format!("gpus-{job}"))
}

fn transparent_path(dir: &Path, job: u32) -> PathBuf {
    dir.join(format!("transparent-{job}"))
}

/// Writes atomically (temp file, fsync, rename).
fn write_atomic(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

fn read_small(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut s = String::new();
    std::fs::File::open(path).ok()?.take(256).read_to_string(&mut s).ok()?;
    Some(s)
}

pub fn write_recovery(dir: &Path, job: u32, r: Recovery) -> std::io::Result<()> {
    let need = r.need_mib.map(|m| format!(" {m}")).unwrap_or_default();
    write_atomic(&recovery_path(dir, job), &format!("{}{need}\n", r.mode.name()))
}

pub fn read_recovery(dir: &Path, job: u32) -> Option<Recovery> {
    let text = read_small(&recovery_path(dir, job))?;
    let mut words = text.split_whitespace();
    let mode = RecoveryMode::parse(words.next()?)?;
    Some(Recovery { mode, need_mib: words.next().and_then(|w| w.parse().ok()) })
}

pub fn write_restarts(dir: &Path, job: u32, count: u32) -> std::io::Result<()> {
    write_atomic(&restart_path(dir, job), &format!("{count}\n"))
}

pub fn read_restarts(dir: &Path, job: u32) -> u32 {
    read_small(&restart_path(dir, job)).and_then(|t| t.trim().parse().ok()).unwrap_or(0)
}

/// The GPUs Slurm allocated to the job on this node (gres/gpu, or the GPU
/// of its shards), as the job prolog saw them in slurmd's environment.
pub fn write_gpus(dir: &Path, job: u32, gpus: &[u32]) -> std::io::Result<()> {
    write_atomic(&gpus_path(dir, job), &format!("{}\n", crate::index_list(gpus)))
}

/// `None` where the prolog wrote nothing: the job holds no Slurm GPU here.
pub fn read_gpus(dir: &Path, job: u32) -> Option<Vec<u32>> {
    let text = read_small(&gpus_path(dir, job))?;
    text.trim().split(',').map(|g| g.parse().ok()).collect()
}

/// A job CARMA placed on this node by transparent collocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transparent {
    /// Which scope (`partition:gpu`).
    pub scope: String,
    /// Its history signature, under which an OOM's need is remembered.
    pub signature: Option<String>,
}

pub fn write_transparent(dir: &Path, job: u32, t: &Transparent) -> std::io::Result<()> {
    let sig = t.signature.as_deref().map(|s| format!(" {s}")).unwrap_or_default();
    write_atomic(&transparent_path(dir, job), &format!("{}{sig}\n", t.scope))
}

pub fn read_transparent(dir: &Path, job: u32) -> Option<Transparent> {
    let text = read_small(&transparent_path(dir, job))?;
    let mut words = text.split_whitespace();
    let scope = words.next()?.to_string();
    Some(Transparent { scope, signature: words.next().map(str::to_string) })
}

/// Forgets a run's files of a job. The prolog's GPU list stays: a job
/// requeued from the epilog reruns here without the prolog (see above).
pub fn remove(dir: &Path, job: u32) {
    let _ = std::fs::remove_file(recovery_path(dir, job));
    let _ = std::fs::remove_file(restart_path(dir, job));
    let _ = std::fs::remove_file(transparent_path(dir, job));
}

/// Forgets every file of a job that has ended for good.
pub fn forget(dir: &Path, job: u32) {
    remove(dir, job);
    let _ = std::fs::remove_file(gpus_path(dir, job));
}

/// Jobs with a file here last written more than `age` ago, oldest first,
/// at most `max`. A job's files normally go at its end on this node; these
/// may belong to jobs that will never end here (cancelled while requeued,
/// or rerun on another node), which the epilog asks Slurm about.
pub fn older_than(dir: &Path, age: std::time::Duration, max: usize) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let now = std::time::SystemTime::now();
    let mut old: Vec<(std::time::SystemTime, u32)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let name = name.to_str()?;
            let job = ["recovery-", "restart-", "transparent-", "gpus-"]
                .iter()
                .find_map(|p| name.strip_prefix(p))?
                .parse()
                .ok()?;
            let written = e.metadata().ok()?.modified().ok()?;
            (now.duration_since(written).ok()? > age).then_some((written, job))
        })
        .collect();
    old.sort();
    let mut jobs: Vec<u32> = Vec::new();
    for (_, job) in old {
        if !jobs.contains(&job) && jobs.len() < max {
            jobs.push(job);
        }
    }
    jobs
}

/// True at most once per `every` per state directory (a stamp file's
/// time), so that a busy node's epilogs do not all ask Slurm.
pub fn sweep_due(dir: &Path, every: std::time::Duration) -> bool {
    crate::fsutil::stamp_due(&dir.join("jobfiles.swept"), every)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::TempDir;

    #[test]
    fn round_trip() {
        let d = TempDir::new();
        assert_eq!(read_recovery(&d.0, 7), None);
        assert_eq!(read_restarts(&d.0, 7), 0);
        let r = Recovery { mode: RecoveryMode::Looser, need_mib: Some(30000) };
        write_recovery(&d.0, 7, r).unwrap();
        write_restarts(&d.0, 7, 2).unwrap();
        let t = Transparent { scope: "partition:gpu".into(), signature: Some("1000:job:00ff".into()) };
        write_transparent(&d.0, 7, &t).unwrap();
        assert_eq!(read_transparent(&d.0, 7), Some(t));
        assert_eq!(read_recovery(&d.0, 7), Some(r));
        assert_eq!(read_restarts(&d.0, 7), 2);
        write_recovery(&d.0, 8, Recovery { mode: RecoveryMode::Exclusive, need_mib: None }).unwrap();
        assert_eq!(read_recovery(&d.0, 8).unwrap().mode, RecoveryMode::Exclusive);
        remove(&d.0, 7);
        assert_eq!((read_recovery(&d.0, 7), read_restarts(&d.0, 7), read_transparent(&d.0, 7)), (None, 0, None));
        std::fs::write(d.0.join("recovery-9"), "bogus").unwrap();
        assert_eq!(read_recovery(&d.0, 9), None);
    }

    #[test]
    fn old_files_are_listed_oldest_first_and_sweeps_are_spaced() {
        use std::time::{Duration, SystemTime};
        let d = TempDir::new();
        let age = |name: &str, secs: u64| {
            let f = std::fs::File::options().write(true).create(true).truncate(false).open(d.0.join(name)).unwrap();
            f.set_modified(SystemTime::now() - Duration::from_secs(secs)).unwrap();
        };
        age("recovery-5", 7200);
        age("restart-5", 7000);
        age("recovery-6", 9000);
        age("restart-7", 4000);
        age("transparent-4", 3700);
        age("recovery-8", 10); // recent: its job may restart here any moment
        age("recovery-x", 9999);
        age("state.json", 9999);
        let hour = Duration::from_secs(3600);
        assert_eq!(older_than(&d.0, hour, 10), vec![6, 5, 7, 4]);
        assert_eq!(older_than(&d.0, hour, 2), vec![6, 5]);
        assert!(sweep_due(&d.0, hour));
        assert!(!sweep_due(&d.0, hour), "a second sweep within the hour");
        assert!(sweep_due(&d.0, Duration::ZERO));
    }
}
