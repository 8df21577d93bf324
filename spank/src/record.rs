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

use std::path::Path;
use std::time::{Duration, Instant};

const SCONTROL_TIME: Duration = Duration::from_secs(5);
/// AdminComment is free text; a record of many nodes stays readable.
const MAX_LEN: usize = 2000;
const SEP: &str = " | ";

/// `existing` with `node`'s entry replaced by `entry` (other entries and
/// non-CARMA text kept; the oldest CARMA entries dropped past MAX_LEN).
pub fn merge(existing: &str, node: &str, entry: &str) -> String {
    let mine = format!("carma@{node}:");
    let mut parts: Vec<&str> =
        existing.split(SEP).map(str::trim).filter(|p| !p.is_empty() && !p.starts_with(&mine)).collect();
    parts.push(entry);
    while parts.join(SEP).len() > MAX_LEN {
        match parts.iter().position(|p| p.starts_with("carma@") && *p != entry) {
            Some(i) => {
                parts.remove(i);
            }
            None => break,
        }
    }
    parts.join(SEP)
}

/// Whole-write bound: the step's end waits for it (see `remote::task_exit`).
const TOTAL_TIME: Duration = Duration::from_secs(10);
/// How often a node writes its entry before it gives up.
const TRIES: u32 = 4;

fn scontrol(bin_dir: Option<&Path>, args: &[&str], deadline: Instant) -> Result<String, String> {
    let left = deadline.saturating_duration_since(Instant::now()).min(SCONTROL_TIME);
    if left.is_zero() {
        return Err(format!("scontrol {}: out of time ({} s for the record)", args.join(" "), TOTAL_TIME.as_secs()));
    }
    carma_placement::command::run(&carma_placement::command::slurm_program(bin_dir, "scontrol"), args, left)
}

fn admin_comment(bin_dir: Option<&Path>, job: &str, deadline: Instant) -> Result<String, String> {
    let shown = scontrol(bin_dir, &["show", "job", job], deadline)?;
    Ok(shown
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("AdminComment="))
        .map(str::trim_end)
        .unwrap_or("")
        .to_string())
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
        scontrol(bin_dir, &["update", &format!("jobid={job}"), &format!("admincomment={merged}")], deadline)?;
        if one_node {
            return Ok(());
        }
        std::thread::sleep(pause * attempt);
        existing = admin_comment(bin_dir, &job, deadline)?;
        if existing.split(SEP).any(|p| p.trim() == entry) {
            return Ok(());
        }
    }
    Err(format!("written {TRIES} times, overwritten each time by another node's update"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nodes_entry_replaces_its_own_and_keeps_the_rest() {
        assert_eq!(merge("", "n1", "carma@n1: a"), "carma@n1: a");
        assert_eq!(merge("site note", "n1", "carma@n1: a"), "site note | carma@n1: a");
        assert_eq!(merge("carma@n1: old | carma@n2: b", "n1", "carma@n1: new"), "carma@n2: b | carma@n1: new");
        // Past the bound the oldest CARMA entries go, never other text.
        let long = (0..100).map(|i| format!("carma@node{i}: {}", "x".repeat(30))).collect::<Vec<_>>().join(SEP);
        let m = merge(&format!("keep me{SEP}{long}"), "n1", "carma@n1: mine");
        assert!(m.len() <= MAX_LEN && m.starts_with("keep me | ") && m.ends_with("carma@n1: mine"), "{m}");
        assert!(!m.contains("carma@node0:") && m.contains("carma@node99:"));
    }
}
