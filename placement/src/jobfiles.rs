//! Small per-job files in the root-owned state directory that carry what
//! Slurm does not: carma-epilog's verdict that a job crashed for lack of
//! GPU memory and is requeued to recover (read by slurmstepd's placement
//! and by the next run's epilog, which counts recoveries from it); where
//! each of the job's output files ended when its last run here ended (so
//! that the next run's epilog scans only that run's output, with
//! `--open-mode=append`); and that slurmstepd placed a job by transparent
//! collocation (it declared nothing, so only this root-owned mark tells
//! carma-epilog to recover it).
//!
//! Only the epilog's own verdict makes a recovery: Slurm's restart count
//! also counts an admin's `scontrol requeue`, preemption and node failure.

use carma_config::RecoveryMode;
use std::path::{Path, PathBuf};

/// How a requeued job is to be rerun.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recovery {
    pub mode: RecoveryMode,
    /// What the crashed run needed (looser mode), MiB.
    pub need_mib: Option<u64>,
    /// OOM recoveries of the job so far, this one included.
    pub count: u32,
}

fn recovery_path(dir: &Path, job: u32) -> PathBuf {
    dir.join(format!("recovery-{job}"))
}

/// Left by versions that took Slurm's restart count for a recovery; only
/// removed now.
fn restart_path(dir: &Path, job: u32) -> PathBuf {
    dir.join(format!("restart-{job}"))
}

fn output_path(dir: &Path, job: u32) -> PathBuf {
    dir.join(format!("output-{job}"))
}

fn gpus_path(dir: &Path, job: u32) -> PathBuf {
    dir.join(format!("gpus-{job}"))
}

fn transparent_path(dir: &Path, job: u32) -> PathBuf {
    dir.join(format!("transparent-{job}"))
}

/// Root writes these in a directory users cannot write; still, no planted
/// link or FIFO is ever followed (see fsutil::write_atomic).
fn write_atomic(path: &Path, text: &str) -> std::io::Result<()> {
    crate::fsutil::write_atomic(path, text.as_bytes())
}

fn read_small(path: &Path) -> Option<String> {
    String::from_utf8(crate::fsutil::read_bounded(path, 256).ok()??).ok()
}

/// `MODE [NEED] n=COUNT`; a file without `n=` (an older epilog's) counts
/// one recovery.
pub fn write_recovery(dir: &Path, job: u32, r: Recovery) -> std::io::Result<()> {
    let need = r.need_mib.map(|m| format!(" {m}")).unwrap_or_default();
    write_atomic(&recovery_path(dir, job), &format!("{}{need} n={}\n", r.mode.name(), r.count))
}

pub fn read_recovery(dir: &Path, job: u32) -> Option<Recovery> {
    let text = read_small(&recovery_path(dir, job))?;
    let mut words = text.split_whitespace();
    let mode = RecoveryMode::parse(words.next()?)?;
    let mut r = Recovery { mode, need_mib: None, count: 1 };
    for w in words {
        match w.strip_prefix("n=") {
            Some(n) => r.count = n.parse().unwrap_or(1),
            None => r.need_mib = r.need_mib.or_else(|| w.parse().ok()),
        }
    }
    Some(r)
}

/// Where one of a job's output files ended when a run of it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputEnd {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub path: String,
}

/// One `SIZE DEV INO PATH` line per output file (the path last: it may
/// hold spaces).
pub fn write_output_ends(dir: &Path, job: u32, ends: &[OutputEnd]) -> std::io::Result<()> {
    let text: String = ends.iter().map(|e| format!("{} {} {} {}\n", e.size, e.dev, e.ino, e.path)).collect();
    write_atomic(&output_path(dir, job), &text)
}

pub fn read_output_ends(dir: &Path, job: u32) -> Vec<OutputEnd> {
    use std::io::Read;
    let mut text = String::new();
    // Two paths of at most PATH_MAX each.
    let Ok(f) = std::fs::File::open(output_path(dir, job)) else { return Vec::new() };
    if f.take(16 * 1024).read_to_string(&mut text).is_err() {
        return Vec::new();
    }
    text.lines()
        .filter_map(|l| {
            let mut w = l.splitn(4, ' ');
            let (size, dev, ino) = (w.next()?.parse().ok()?, w.next()?.parse().ok()?, w.next()?.parse().ok()?);
            Some(OutputEnd { dev, ino, size, path: w.next()?.to_string() })
        })
        .collect()
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
    let _ = std::fs::remove_file(output_path(dir, job));
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
            let job = ["recovery-", "restart-", "transparent-", "output-", "gpus-"]
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
        let r = Recovery { mode: RecoveryMode::Looser, need_mib: Some(30000), count: 2 };
        write_recovery(&d.0, 7, r).unwrap();
        let t = Transparent { scope: "partition:gpu".into(), signature: Some("1000:job:00ff".into()) };
        write_transparent(&d.0, 7, &t).unwrap();
        let ends = vec![
            OutputEnd { dev: 2049, ino: 77, size: 1234, path: "/home/u/my run/slurm-7.out".into() },
            OutputEnd { dev: 2049, ino: 78, size: 0, path: "/home/u/e".into() },
        ];
        write_output_ends(&d.0, 7, &ends).unwrap();
        assert_eq!(read_output_ends(&d.0, 7), ends);
        assert_eq!(read_transparent(&d.0, 7), Some(t));
        assert_eq!(read_recovery(&d.0, 7), Some(r));
        write_recovery(&d.0, 8, Recovery { mode: RecoveryMode::Exclusive, need_mib: None, count: 1 }).unwrap();
        assert_eq!(read_recovery(&d.0, 8).unwrap().mode, RecoveryMode::Exclusive);
        // An older epilog's marker: one recovery.
        std::fs::write(d.0.join("recovery-10"), "looser 9000\n").unwrap();
        assert_eq!(
            read_recovery(&d.0, 10),
            Some(Recovery { mode: RecoveryMode::Looser, need_mib: Some(9000), count: 1 })
        );
        remove(&d.0, 7);
        assert_eq!((read_recovery(&d.0, 7), read_transparent(&d.0, 7)), (None, None));
        assert!(read_output_ends(&d.0, 7).is_empty());
        std::fs::write(d.0.join("recovery-9"), "bogus").unwrap();
        assert_eq!(read_recovery(&d.0, 9), None);
    }

    /// A link planted where a job file or its temp file goes is replaced,
    /// never written through.
    #[test]
    fn planted_links_are_not_written_through() {
        let d = TempDir::new();
        let victim = d.0.join("victim");
        std::fs::write(&victim, "keep").unwrap();
        for name in ["recovery-7.tmp".to_string(), format!("recovery-7.tmp.{}", std::process::id())] {
            std::os::unix::fs::symlink(&victim, d.0.join(name)).unwrap();
        }
        std::os::unix::fs::symlink(&victim, d.0.join("output-7")).unwrap();
        write_recovery(&d.0, 7, Recovery { mode: RecoveryMode::Looser, need_mib: None, count: 1 }).unwrap();
        let end = OutputEnd { dev: 1, ino: 2, size: 3, path: "/o".into() };
        write_output_ends(&d.0, 7, std::slice::from_ref(&end)).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep", "written through a planted link");
        assert_eq!(read_recovery(&d.0, 7).map(|r| r.mode), Some(RecoveryMode::Looser));
        assert_eq!(read_output_ends(&d.0, 7), vec![end]);
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
