//! Each job's CARMA record after it ends: its decision, estimate and
//! source, observed peak and recovery, in the job's AdminComment, where
//! `scontrol show job` shows it while Slurm keeps the job (MinJobAge) and
//! `sacct -o AdminComment` for good where slurmdbd stores jobs. Written by
//! the step that releases the job's last hold on a node (slurmstepd, as
//! root, while the job still runs: slurmctld refuses updates to finished
//! jobs). Other text in AdminComment is kept; each node's entry
//! (`carma@NODE: ...`) replaces that node's earlier one, entries joined by
//! ` | `. scontrol runs with fixed arguments, no shell, bounded in time.

use std::time::Duration;

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

fn scontrol(args: &[&str]) -> Result<String, String> {
    carma_placement::command::run("scontrol", args, SCONTROL_TIME)
}

/// Writes `entry` as `node`'s part of the job's AdminComment.
pub fn write(job: u32, node: &str, entry: &str) -> Result<(), String> {
    let job = job.to_string();
    let shown = scontrol(&["show", "job", &job])?;
    let existing =
        shown.lines().find_map(|l| l.trim_start().strip_prefix("AdminComment=")).map(str::trim_end).unwrap_or("");
    let merged = merge(existing, node, entry);
    scontrol(&["update", &format!("jobid={job}"), &format!("admincomment={merged}")]).map(|_| ())
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
