//! A job's AdminComment as CARMA's root parts write it: entries joined by
//! ` | `, each CARMA entry under a key of its own (`carma@NODE:` for a
//! node's record, `carma-recovery:` for carma-epilog's OOM verdict). Only
//! Slurm's administrators (and root) can set AdminComment, so what CARMA
//! reads back from it is what CARMA wrote. Other text is the site's and is
//! kept byte for byte (but for a comment that is the text `(null)`, which
//! squeue prints for an unset one). Slurm's commands run through [`crate::command`]:
//! fixed arguments, no shell, bounded in time.

use crate::command::SQUEUE_LOCAL;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStringExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// One scontrol or squeue call at most this long.
const CALL_TIME: Duration = Duration::from_secs(5);
/// AdminComment is free text; a record of many nodes stays readable.
pub const MAX_LEN: usize = 2000;
const SEP: &[u8] = b" | ";
/// How often an entry is written before the writer gives up.
const TRIES: u32 = 4;

fn trim(b: &[u8]) -> &[u8] {
    b.trim_ascii()
}

/// A job as Slurm's commands must name it to reach it alone: a task of a
/// job array by `ARRAY_TASK` (`squeue -j` and `scontrol update jobid=` given
/// the id of the array task whose id is the array's, take every task).
/// Found by [`JobRef::resolve`], from slurmctld: neither the job's
/// environment (which the user sets, and which slurmstepd copies into its
/// SPANK array items for srun steps) nor slurmd's prolog and epilog
/// environment (which has no array ids) can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobRef {
    pub id: u32,
    /// The array's id and this task's, for a task of a job array.
    pub array: Option<(u32, u32)>,
}

impl JobRef {
    pub fn plain(id: u32) -> JobRef {
        JobRef { id, array: None }
    }

    /// How squeue's `-j` and scontrol's `jobid=` must name it.
    pub fn selector(&self) -> String {
        match self.array {
            Some((a, t)) => format!("{a}_{t}"),
            None => self.id.to_string(),
        }
    }

    /// Job `id` as slurmctld knows it: one bounded `squeue` of numbers
    /// only (`%A %F %K`: job id, array id, array task id), the line whose
    /// job id is `id`.
    pub fn resolve(bin_dir: Option<&Path>, id: u32, deadline: Instant) -> Result<JobRef, String> {
        let job = id.to_string();
        let args = [SQUEUE_LOCAL, "-h", "-t", "all", "-j", &job, "-o", "%A %F %K"].map(OsStr::new);
        let out = slurm(bin_dir, "squeue", &args, deadline)?;
        let text = String::from_utf8_lossy(&out);
        JobRef::from_squeue(id, &text).ok_or_else(|| format!("squeue does not know job {id}"))
    }

    fn from_squeue(id: u32, text: &str) -> Option<JobRef> {
        text.lines().find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next()?.parse::<u32>().ok()? == id).then_some(())?;
            let array = w.next().and_then(|a| a.parse::<u32>().ok());
            let task = w.next().and_then(|t| t.parse::<u32>().ok());
            Some(JobRef { id, array: array.zip(task) })
        })
    }
}

/// The entries of an AdminComment, as written (untrimmed).
pub fn split(b: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = b;
    while let Some(i) = rest.windows(SEP.len()).position(|w| w == SEP) {
        out.push(&rest[..i]);
        rest = &rest[i + SEP.len()..];
    }
    out.push(rest);
    out
}

/// The text after `key` of the entry that starts with it, if any.
pub fn entry<'a>(comment: &'a [u8], key: &str) -> Option<&'a [u8]> {
    split(comment).into_iter().map(trim).find_map(|p| p.strip_prefix(key.as_bytes())).map(trim)
}

/// `existing` with the entry under `key` replaced by `entry` (other entries
/// and non-CARMA text kept byte for byte; the oldest node records
/// (`carma@`) dropped past MAX_LEN). Bytes, not text: the site's part may
/// hold any byte, and none of it may be lost.
pub fn merge(existing: &[u8], key: &str, entry: &str) -> Vec<u8> {
    // Parts are compared trimmed and kept as they are.
    let mut parts: Vec<&[u8]> = if existing.is_empty() {
        Vec::new()
    } else {
        split(existing).into_iter().filter(|p| !trim(p).starts_with(key.as_bytes())).collect()
    };
    parts.push(entry.as_bytes());
    while parts.join(SEP).len() > MAX_LEN {
        match parts.iter().position(|p| trim(p).starts_with(b"carma@") && *p != entry.as_bytes()) {
            Some(i) => {
                parts.remove(i);
            }
            None => break,
        }
    }
    parts.join(SEP)
}

fn slurm(bin_dir: Option<&Path>, prog: &str, args: &[&OsStr], deadline: Instant) -> Result<Vec<u8>, String> {
    crate::command::run_bytes_by(&crate::command::slurm_program(bin_dir, prog), args, deadline, CALL_TIME)
}

/// The job's AdminComment alone, as bytes: squeue prints just that field
/// (`-O admin_comment:0`: whole, unpadded). `scontrol show job`'s text is
/// not read: the job's name, command and working directory come before
/// AdminComment there, are the user's, and may hold a newline followed by
/// a forged `AdminComment=` line. An unset AdminComment prints `(null)`.
/// An AdminComment that is the text `(null)` reads as unset.
pub fn read(bin_dir: Option<&Path>, job: u32, deadline: Instant) -> Result<Vec<u8>, String> {
    read_ref(bin_dir, JobRef::resolve(bin_dir, job, deadline)?, deadline)
}

/// [`read`] for a job already resolved.
pub fn read_ref(bin_dir: Option<&Path>, job: JobRef, deadline: Instant) -> Result<Vec<u8>, String> {
    let job = job.selector();
    let args = [SQUEUE_LOCAL, "-h", "-t", "all", "-j", &job, "-O", "admin_comment:0"].map(OsStr::new);
    let mut out = slurm(bin_dir, "squeue", &args, deadline)?;
    if out.last() == Some(&b'\n') {
        out.pop();
    }
    if out.is_empty() {
        return Err(format!("squeue does not know job {job}"));
    }
    Ok(if out == b"(null)" { Vec::new() } else { out })
}

fn update(bin_dir: Option<&Path>, job: JobRef, comment: &[u8], deadline: Instant) -> Result<(), String> {
    let mut arg = OsString::from("admincomment=").into_vec();
    arg.extend_from_slice(comment);
    let arg = OsString::from_vec(arg);
    let jobid = OsString::from(format!("jobid={}", job.selector()));
    slurm(bin_dir, "scontrol", &[OsStr::new("update"), &jobid, &arg], deadline).map(drop)
}

/// Writes `entry` (which starts with `key`) into the job's AdminComment,
/// within `total`. AdminComment is read, merged and written back, which is
/// not atomic: writers that may meet (the nodes of a job that ends
/// everywhere at once) pass `verify`, and each write is then read back and
/// written again (after a pause that differs per process) while the entry
/// is missing. A lone writer (`verify` false) writes once.
pub fn write_entry(
    bin_dir: Option<&Path>,
    job: u32,
    key: &str,
    entry: &str,
    verify: bool,
    total: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + total;
    let job = JobRef::resolve(bin_dir, job, deadline)?;
    write_entry_ref(bin_dir, job, key, entry, verify, deadline)
}

/// [`write_entry`] for a job already resolved, by `deadline`.
pub fn write_entry_ref(
    bin_dir: Option<&Path>,
    job: JobRef,
    key: &str,
    entry: &str,
    verify: bool,
    deadline: Instant,
) -> Result<(), String> {
    let pause = Duration::from_millis(10 + u64::from(std::process::id() % 8) * 5);
    let mut existing = read_ref(bin_dir, job, deadline)?;
    for attempt in 1..=TRIES {
        update(bin_dir, job, &merge(&existing, key, entry), deadline)?;
        if !verify {
            return Ok(());
        }
        std::thread::sleep(pause * attempt);
        existing = read_ref(bin_dir, job, deadline)?;
        if split(&existing).into_iter().any(|p| p == entry.as_bytes()) {
            return Ok(());
        }
    }
    Err(format!("written {TRIES} times, overwritten each time by another node's update"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn merge(existing: &str, key: &str, entry: &str) -> String {
        String::from_utf8(super::merge(existing.as_bytes(), key, entry)).unwrap()
    }
    const SEP: &str = " | ";

    #[test]
    fn an_entry_replaces_its_own_key_and_keeps_the_rest() {
        assert_eq!(merge("", "carma@n1:", "carma@n1: a"), "carma@n1: a");
        assert_eq!(merge("site note", "carma@n1:", "carma@n1: a"), "site note | carma@n1: a");
        assert_eq!(merge("carma@n1: old | carma@n2: b", "carma@n1:", "carma@n1: new"), "carma@n2: b | carma@n1: new");
        // The site's bytes, UTF-8 or not, newlines, blanks and empty parts
        // included, are kept as they are.
        assert_eq!(super::merge(b"jobstats \xff\nx", "carma@n1:", "carma@n1: a"), b"jobstats \xff\nx | carma@n1: a");
        assert_eq!(merge("a  |  b\n", "carma@n1:", "carma@n1: a"), "a  |  b\n | carma@n1: a");
        assert_eq!(merge("x |  | y | carma@n1: old", "carma@n1:", "carma@n1: a"), "x |  | y | carma@n1: a");
        assert_eq!(merge(" ", "carma@n1:", "carma@n1: a"), "  | carma@n1: a");
        // Past the bound the oldest node records go, never other text.
        let long = (0..100).map(|i| format!("carma@node{i}: {}", "x".repeat(30))).collect::<Vec<_>>().join(SEP);
        let m = merge(
            &format!("keep me{SEP}carma-recovery: exclusive n=1 restart=1{SEP}{long}"),
            "carma@n1:",
            "carma@n1: mine",
        );
        assert!(
            m.len() <= MAX_LEN && m.starts_with("keep me | carma-recovery: ") && m.ends_with("carma@n1: mine"),
            "{m}"
        );
        assert!(!m.contains("carma@node0:") && m.contains("carma@node99:"));
    }

    #[test]
    fn an_array_task_is_named_alone() {
        // squeue -j 7 of an array's task 7 lists every task; non-arrays print N/A.
        let all = "9 7 2\n7 7 0\n8 7 1\n";
        assert_eq!(JobRef::from_squeue(7, all).unwrap().selector(), "7_0");
        assert_eq!(JobRef::from_squeue(9, all).unwrap().selector(), "7_2");
        assert_eq!(JobRef::from_squeue(5, "5 5 N/A\n").unwrap().selector(), "5");
        assert_eq!(JobRef::from_squeue(5, "6 6 N/A\n"), None);
        assert_eq!(JobRef::from_squeue(5, ""), None);
        assert_eq!(JobRef::plain(5).selector(), "5");
    }

    #[test]
    fn a_recovery_verdict_and_node_records_live_side_by_side() {
        let c = merge("site | carma@n1: policy=ff", "carma-recovery:", "carma-recovery: exclusive n=1 restart=1");
        assert_eq!(entry(c.as_bytes(), "carma-recovery:"), Some(&b"exclusive n=1 restart=1"[..]));
        let c = merge(&c, "carma@n1:", "carma@n1: policy=ff recovery=exclusive");
        assert_eq!(c, "site | carma-recovery: exclusive n=1 restart=1 | carma@n1: policy=ff recovery=exclusive");
        let c = merge(&c, "carma-recovery:", "carma-recovery: exclusive n=2 restart=3");
        assert_eq!(entry(c.as_bytes(), "carma-recovery:"), Some(&b"exclusive n=2 restart=3"[..]));
        assert_eq!(entry(b"site text only", "carma-recovery:"), None);
    }
}
