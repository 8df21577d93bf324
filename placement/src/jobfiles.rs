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

fn hand_back_path(dir: &Path, job: u32) -> PathBuf {
    dir.join(format!("handback-{job}"))
}

fn jobs_changed_path(dir: &Path) -> PathBuf {
    dir.join("jobs-changed")
}

/// A job started or ended on this node (the job prolog or epilog ran):
/// carma-monitor reads the admission count again until slurmctld has
/// caught up with it (`tools/src/admission.rs`). Its time is the mark.
pub fn touch_jobs_changed(dir: &Path) -> std::io::Result<()> {
    write_atomic(&jobs_changed_path(dir), "")
}

/// When a job last started or ended here, if one did.
pub fn jobs_changed_at(dir: &Path) -> Option<std::time::SystemTime> {
    std::fs::symlink_metadata(jobs_changed_path(dir)).ok()?.modified().ok()
}

/// Root writes these, mode 0600, in a directory users cannot enter; still,
/// no planted link or FIFO is ever followed (see fsutil::write_atomic_mode).
fn write_atomic(path: &Path, text: &str) -> std::io::Result<()> {
    crate::fsutil::write_private(path, text.as_bytes())
}

fn read_small(path: &Path) -> Option<String> {
    String::from_utf8(crate::fsutil::read_bounded(path, 256).ok()??).ok()
}

impl Recovery {
    /// `MODE [NEED] n=COUNT`.
    fn words(&self) -> String {
        let need = self.need_mib.map(|m| format!(" {m}")).unwrap_or_default();
        format!("{}{need} n={}", self.mode.name(), self.count)
    }

    /// [`Recovery::words`]' form; without `n=` (an older epilog's file) it
    /// counts one recovery. Other `key=value` words are left to the caller.
    fn parse(text: &str) -> Option<Recovery> {
        let mut words = text.split_whitespace();
        let mode = RecoveryMode::parse(words.next()?)?;
        let mut r = Recovery { mode, need_mib: None, count: 1 };
        for w in words {
            match w.strip_prefix("n=") {
                Some(n) => r.count = n.parse().unwrap_or(1),
                None if !w.contains('=') => r.need_mib = r.need_mib.or_else(|| w.parse().ok()),
                None => {}
            }
        }
        Some(r)
    }
}

/// The verdict for the job's run with Slurm restart count `restart`.
pub fn write_recovery(dir: &Path, job: u32, r: Recovery, restart: u32) -> std::io::Result<()> {
    write_atomic(&recovery_path(dir, job), &format!("{} restart={restart}\n", r.words()))
}

pub fn read_recovery(dir: &Path, job: u32) -> Option<Recovery> {
    Recovery::parse(&read_small(&recovery_path(dir, job))?)
}

/// Which run the verdict here is for (`None`: an older epilog's file, which
/// does not say).
pub fn recovery_run(dir: &Path, job: u32) -> Option<u32> {
    read_small(&recovery_path(dir, job))?.split_whitespace().find_map(|w| w.strip_prefix("restart="))?.parse().ok()
}

/// Forgets the job's verdict here if it is for another run than the one
/// with restart count `restart` (a verdict from a run before an admin's
/// requeue, say, when this run is no recovery).
pub fn forget_recovery_unless_for(dir: &Path, job: u32, restart: u32) -> bool {
    match recovery_run(dir, job) {
        Some(run) if run != restart => std::fs::remove_file(recovery_path(dir, job)).is_ok(),
        _ => false,
    }
}

/// The key of carma-epilog's verdict in the job's AdminComment
/// ([`crate::admin_comment`]), where the job's next run finds it on
/// whichever node slurmctld starts it: the local file only reaches a rerun
/// on the node that crashed.
pub const RECOVERY_KEY: &str = "carma-recovery:";

/// The verdict as an AdminComment entry, for the run whose Slurm restart
/// count is `restart` (the crashed run's plus one): an admin's later
/// requeue starts a run with another count, which the verdict is not for.
pub fn recovery_entry(r: Recovery, restart: u32) -> String {
    format!("{RECOVERY_KEY} {} restart={restart}", r.words())
}

/// The verdict in an AdminComment for the run with Slurm restart count
/// `restart`, if it is that run's.
pub fn recovery_in_comment(comment: &[u8], restart: u32) -> Option<Recovery> {
    let text = std::str::from_utf8(crate::admin_comment::entry(comment, RECOVERY_KEY)?).ok()?;
    let for_run = text.split_whitespace().find_map(|w| w.strip_prefix("restart="))?.parse::<u32>().ok()?;
    (for_run == restart).then(|| Recovery::parse(text)).flatten()
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

/// The longest reason a hand-back file keeps (it is read back bounded).
const HAND_BACK_REASON: usize = 200;

/// slurmstepd found no GPU for the job's batch step here (`no_fit:
/// hand_back`) and failed it: carma-epilog is to requeue the job away
/// from this node. `reason`: why, as the step's error said it (cut short).
pub fn write_hand_back(dir: &Path, job: u32, reason: &str) -> std::io::Result<()> {
    let line: String = reason.chars().filter(|c| !c.is_control()).take(HAND_BACK_REASON).collect();
    write_atomic(&hand_back_path(dir, job), &format!("{line}\n"))
}

/// The reason slurmstepd handed the job back here, if it did.
pub fn read_hand_back(dir: &Path, job: u32) -> Option<String> {
    let text = String::from_utf8(crate::fsutil::read_bounded(&hand_back_path(dir, job), 1024).ok()??).ok()?;
    Some(text.trim().to_string())
}

pub fn forget_hand_back(dir: &Path, job: u32) {
    let _ = std::fs::remove_file(hand_back_path(dir, job));
}

/// Hand-backs as an AdminComment entry, read back wherever the job reruns:
/// its hand-backs since it last paused (this one included), the node it
/// last left, the nodes CARMA added to its exclusions (taken out again when
/// it pauses; the job's own and an administrator's stay) and how often it
/// has paused.
pub const HAND_BACK_KEY: &str = "carma-hand-back:";

pub fn hand_back_entry(count: u32, node: &str, carma_excluded: &[String], pauses: u32, reason: &str) -> String {
    let reason: String = reason.chars().filter(|c| !c.is_control() && *c != '|').take(120).collect();
    format!("{HAND_BACK_KEY} n={count} from={node} c={} p={pauses} ({reason})", carma_excluded.join(","))
}

/// The entry's fields, before its reason: a reason's words (a model's
/// file name may be among them) never pose as a field.
fn hand_back_field<T>(comment: &[u8], key: &str, parse: impl Fn(&str) -> Option<T>) -> Option<T> {
    let text = crate::admin_comment::entry(comment, HAND_BACK_KEY)?;
    let text = String::from_utf8_lossy(text);
    let fields = text.split('(').next().unwrap_or("");
    fields.split_whitespace().find_map(|w| parse(w.strip_prefix(key)?))
}

/// Hand-backs the job had since it last paused, from its AdminComment (0
/// without one).
pub fn hand_backs_in_comment(comment: &[u8]) -> u32 {
    hand_back_field(comment, "n=", |v| v.parse().ok()).unwrap_or(0)
}

/// How often the job paused after its hand-backs (0 without an entry).
pub fn pauses_in_comment(comment: &[u8]) -> u32 {
    hand_back_field(comment, "p=", |v| v.parse().ok()).unwrap_or(0)
}

/// The nodes CARMA added to the job's exclusions since it last paused;
/// an older build's entry (no `c=`) names the node it last left only.
pub fn carma_exclusions_in_comment(comment: &[u8]) -> Vec<String> {
    let names = |v: &str| v.split(',').filter(|n| !n.is_empty()).map(str::to_string).collect::<Vec<_>>();
    hand_back_field(comment, "c=", |v| Some(names(v)))
        .or_else(|| hand_back_field(comment, "from=", |v| Some(names(v))))
        .unwrap_or_default()
}

/// Forgets a run's files of a job. The prolog's GPU list stays: a job
/// requeued from the epilog reruns here without the prolog (see above).
pub fn remove(dir: &Path, job: u32) {
    let _ = std::fs::remove_file(recovery_path(dir, job));
    let _ = std::fs::remove_file(restart_path(dir, job));
    let _ = std::fs::remove_file(transparent_path(dir, job));
    let _ = std::fs::remove_file(output_path(dir, job));
    forget_hand_back(dir, job);
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
            let job = ["recovery-", "restart-", "transparent-", "output-", "gpus-", "handback-"]
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
        write_recovery(&d.0, 7, r, 1).unwrap();
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
        write_recovery(&d.0, 8, Recovery { mode: RecoveryMode::Exclusive, need_mib: None, count: 1 }, 1).unwrap();
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

    /// A hand-back's reason is kept on one short line, and its count
    /// travels in AdminComment, where no text of the reason can pose as
    /// another entry or another count.
    #[test]
    fn a_hand_back_is_kept_here_and_counted_in_admin_comment() {
        let d = TempDir::new();
        assert_eq!(read_hand_back(&d.0, 5), None);
        write_hand_back(&d.0, 5, &format!("no GPU fits\nfake line {}", "x".repeat(400))).unwrap();
        let kept = read_hand_back(&d.0, 5).unwrap();
        assert!(kept.starts_with("no GPU fitsfake line x") && kept.chars().count() == 200, "{kept}");
        remove(&d.0, 5);
        assert_eq!(read_hand_back(&d.0, 5), None);
        let added = ["node1".to_string(), "node3".to_string()];
        let e = hand_back_entry(2, "node1", &added, 1, "model n=9 c=a p=4 | carma-hand-back: n=0");
        assert_eq!(e, "carma-hand-back: n=2 from=node1 c=node1,node3 p=1 (model n=9 c=a p=4  carma-hand-back: n=0)");
        let comment = crate::admin_comment::merge(b"site note", HAND_BACK_KEY, &e);
        assert_eq!(hand_backs_in_comment(&comment), 2);
        assert_eq!(pauses_in_comment(&comment), 1);
        assert_eq!(carma_exclusions_in_comment(&comment), added);
        let none = hand_back_entry(0, "node2", &[], 1, "why");
        let comment = crate::admin_comment::merge(b"", HAND_BACK_KEY, &none);
        assert!(carma_exclusions_in_comment(&comment).is_empty());
        assert_eq!((hand_backs_in_comment(&comment), pauses_in_comment(&comment)), (0, 1));
        assert_eq!(hand_backs_in_comment(b"site note | carma@n1: policy=ff"), 0);
        // An older build's entry: counted, the node it left CARMA's; its
        // reason's words are not fields.
        let old = b"carma-hand-back: n=1 from=node1 (c=evil p=9)";
        assert_eq!((hand_backs_in_comment(old), pauses_in_comment(old)), (1, 0));
        assert_eq!(carma_exclusions_in_comment(old), vec!["node1".to_string()]);
    }

    /// The verdict travels in AdminComment to the run it is for, and to no
    /// other (an admin's later requeue starts a run with another count).
    #[test]
    fn a_verdict_in_admin_comment_is_for_one_run() {
        let r = Recovery { mode: RecoveryMode::Looser, need_mib: Some(30000), count: 2 };
        let e = recovery_entry(r, 3);
        assert_eq!(e, "carma-recovery: looser 30000 n=2 restart=3");
        let comment = crate::admin_comment::merge(b"site | carma@n1: policy=ff", RECOVERY_KEY, &e);
        assert_eq!(recovery_in_comment(&comment, 3), Some(r));
        assert_eq!(recovery_in_comment(&comment, 4), None, "a later run (an admin's requeue)");
        assert_eq!(recovery_in_comment(&comment, 2), None);
        let ex = Recovery { mode: RecoveryMode::Exclusive, need_mib: None, count: 1 };
        assert_eq!(recovery_in_comment(recovery_entry(ex, 1).as_bytes(), 1), Some(ex));
        assert_eq!(recovery_in_comment(b"carma-recovery: exclusive n=1", 1), None, "no run named");
        assert_eq!(recovery_in_comment(b"carma-recovery: bogus restart=1", 1), None);
        assert_eq!(recovery_in_comment(b"", 1), None);
        // The local file names its run too: a stale one goes, the
        // current one and an older epilog's (which names none) stay.
        let d = TempDir::new();
        write_recovery(&d.0, 5, r, 3).unwrap();
        assert!(!forget_recovery_unless_for(&d.0, 5, 3));
        assert_eq!(read_recovery(&d.0, 5), Some(r));
        assert!(forget_recovery_unless_for(&d.0, 5, 4));
        assert_eq!(read_recovery(&d.0, 5), None);
        std::fs::write(d.0.join("recovery-6"), "exclusive n=1\n").unwrap();
        assert!(!forget_recovery_unless_for(&d.0, 6, 4));
        assert!(read_recovery(&d.0, 6).is_some());
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
        write_recovery(&d.0, 7, Recovery { mode: RecoveryMode::Looser, need_mib: None, count: 1 }, 1).unwrap();
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
