//! Each job's CARMA record after it ends: its decision, estimate and
//! source, observed peak and recovery, in the job's AdminComment, where
//! `scontrol show job` shows it while Slurm keeps the job (MinJobAge) and
//! `sacct -o AdminComment` for good where slurmdbd stores jobs. Written by
//! the step that holds the job's GPUs last on a node, when its last task
//! there exits (slurmstepd, as root, while the job still runs: slurmctld
//! refuses updates to finished jobs). Other text in AdminComment is kept;
//! each node's entry (`carma@NODE: ...`) replaces that node's earlier one,
//! entries joined by ` | `. scontrol runs with fixed arguments, no shell,
//! bounded in time.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStringExt;
use std::path::Path;
use std::time::{Duration, Instant};

const SCONTROL_TIME: Duration = Duration::from_secs(5);
/// AdminComment is free text; a record of many nodes stays readable.
const MAX_LEN: usize = 2000;
const SEP: &[u8] = b" | ";

fn trim(b: &[u8]) -> &[u8] {
    b.trim_ascii()
}

/// `existing` with `node`'s entry replaced by `entry` (other entries and
/// non-CARMA text kept byte for byte; the oldest CARMA entries dropped
/// past MAX_LEN). Bytes, not text: the site's part may hold any byte, and
/// none of it may be lost.
pub fn merge(existing: &[u8], node: &str, entry: &str) -> Vec<u8> {
    let mine = format!("carma@{node}:");
    let mut parts: Vec<&[u8]> =
        split(existing).into_iter().map(trim).filter(|p| !p.is_empty() && !p.starts_with(mine.as_bytes())).collect();
    parts.push(entry.as_bytes());
    while parts.join(SEP).len() > MAX_LEN {
        match parts.iter().position(|p| p.starts_with(b"carma@") && *p != entry.as_bytes()) {
            Some(i) => {
                parts.remove(i);
            }
            None => break,
        }
    }
    parts.join(SEP)
}

fn split(b: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = b;
    while let Some(i) = rest.windows(SEP.len()).position(|w| w == SEP) {
        out.push(&rest[..i]);
        rest = &rest[i + SEP.len()..];
    }
    out.push(rest);
    out
}

/// Whole-write bound: the step's end waits for it (see `remote::task_exit`).
const TOTAL_TIME: Duration = Duration::from_secs(10);
/// How often a node writes its entry before it gives up.
const TRIES: u32 = 4;

fn slurm(bin_dir: Option<&Path>, prog: &str, args: &[&OsStr], deadline: Instant) -> Result<Vec<u8>, String> {
    let left = deadline.saturating_duration_since(Instant::now()).min(SCONTROL_TIME);
    if left.is_zero() {
        return Err(format!("{prog}: out of time ({} s for the record)", TOTAL_TIME.as_secs()));
    }
    carma_placement::command::run_bytes(&carma_placement::command::slurm_program(bin_dir, prog), args, left)
}

/// The job's AdminComment alone, as bytes: squeue prints just that field
/// (`-O admin_comment:0`: whole, unpadded), which only Slurm's
/// administrators (and root) can set. `scontrol show job`'s text is not
/// read: the job's name, command and working directory come before
/// AdminComment there, are the user's, and may hold a newline followed
/// by a forged `AdminComment=` line. An unset AdminComment prints
/// `(null)`.
fn admin_comment(bin_dir: Option<&Path>, job: &str, deadline: Instant) -> Result<Vec<u8>, String> {
    let args = ["-h", "-t", "all", "-j", job, "-O", "admin_comment:0"].map(OsStr::new);
    let mut out = slurm(bin_dir, "squeue", &args, deadline)?;
    if out.last() == Some(&b'\n') {
        out.pop();
    }
    if out.is_empty() {
        return Err(format!("squeue does not know job {job}"));
    }
    Ok(if out == b"(null)" { Vec::new() } else { out })
}

fn update(bin_dir: Option<&Path>, job: &str, comment: &[u8], deadline: Instant) -> Result<(), String> {
    let mut arg = OsString::from("admincomment=").into_vec();
    arg.extend_from_slice(comment);
    let arg = OsString::from_vec(arg);
    let jobid = OsString::from(format!("jobid={job}"));
    slurm(bin_dir, "scontrol", &[OsStr::new("update"), &jobid, &arg], deadline).map(drop)
}

/// Writes `entry` as `node`'s part of the job's AdminComment. AdminComment
/// is read, merged and written back, which is not atomic: the nodes of a
/// job that ends everywhere at once write together, and the last write
/// would drop the others' entries. So each write is read back, and written
/// again (after a pause that differs per process) while the entry is
/// missing. A job on one node has no other writer but the site's: its
/// entry is written once, without the pause. `bin_dir`: where scontrol is
/// (carma.yaml's `slurm_bin_dir`).
pub fn write(bin_dir: Option<&Path>, job: u32, node: &str, entry: &str, one_node: bool) -> Result<(), String> {
    let job = job.to_string();
    let deadline = Instant::now() + TOTAL_TIME;
    let pause = Duration::from_millis(10 + u64::from(std::process::id() % 8) * 5);
    let mut existing = admin_comment(bin_dir, &job, deadline)?;
    for attempt in 1..=TRIES {
        let merged = merge(&existing, node, entry);
        update(bin_dir, &job, &merged, deadline)?;
        if one_node {
            return Ok(());
        }
        std::thread::sleep(pause * attempt);
        existing = admin_comment(bin_dir, &job, deadline)?;
        if split(&existing).into_iter().any(|p| trim(p) == entry.as_bytes()) {
            return Ok(());
        }
    }
    Err(format!("written {TRIES} times, overwritten each time by another node's update"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn merge(existing: &str, node: &str, entry: &str) -> String {
        String::from_utf8(super::merge(existing.as_bytes(), node, entry)).unwrap()
    }
    const SEP: &str = " | ";

    #[test]
    fn a_nodes_entry_replaces_its_own_and_keeps_the_rest() {
        assert_eq!(merge("", "n1", "carma@n1: a"), "carma@n1: a");
        assert_eq!(merge("site note", "n1", "carma@n1: a"), "site note | carma@n1: a");
        assert_eq!(merge("carma@n1: old | carma@n2: b", "n1", "carma@n1: new"), "carma@n2: b | carma@n1: new");
        // The site's bytes, UTF-8 or not, newlines included, are kept as they are.
        assert_eq!(super::merge(b"jobstats \xff\nx", "n1", "carma@n1: a"), b"jobstats \xff\nx | carma@n1: a");
        // Past the bound the oldest CARMA entries go, never other text.
        let long = (0..100).map(|i| format!("carma@node{i}: {}", "x".repeat(30))).collect::<Vec<_>>().join(SEP);
        let m = merge(&format!("keep me{SEP}{long}"), "n1", "carma@n1: mine");
        assert!(m.len() <= MAX_LEN && m.starts_with("keep me | ") && m.ends_with("carma@n1: mine"), "{m}");
        assert!(!m.contains("carma@node0:") && m.contains("carma@node99:"));
    }
}
