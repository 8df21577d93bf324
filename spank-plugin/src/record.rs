//! Each job's CARMA record after it ends: its decision, estimate and
//! source, observed peak and recovery, in the job's AdminComment, where
//! `scontrol show job` shows it while Slurm keeps the job (MinJobAge) and
//! `sacct -o AdminComment` for good where slurmdbd stores jobs. Written by
//! the step that holds the job's GPUs last on a node, when its last task
//! there exits (slurmstepd, as root, while the job still runs: slurmctld
//! refuses updates to finished jobs). Other text in AdminComment is kept;
//! each node's entry (`carma@NODE: ...`) replaces that node's earlier one
//! (carma_placement::admin_comment).

use carma_placement::admin_comment;
use std::path::Path;
use std::time::Duration;

/// Whole-write bound: the step's end waits for it (see `remote::task_exit`).
const TOTAL_TIME: Duration = Duration::from_secs(10);

/// Writes `entry` as `node`'s part of the job's AdminComment
/// ([`admin_comment::write_entry`]): the nodes of a job that ends
/// everywhere at once write together, so each write is read back and made
/// again while the entry is missing; a job on one node has no other writer
/// but the site's and writes once. `bin_dir`: where scontrol is
/// (carma.yaml's `slurm_bin_dir`).
pub fn write(bin_dir: Option<&Path>, job: u32, node: &str, entry: &str, one_node: bool) -> Result<(), String> {
    admin_comment::write_entry(bin_dir, job, &format!("carma@{node}:"), entry, !one_node, TOTAL_TIME)
}
