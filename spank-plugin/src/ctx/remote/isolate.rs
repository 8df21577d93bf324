//! The task's devices: task_post_fork lets it open exactly its placement's
//! GPUs (the device cgroup), task_init numbers them for CUDA.

use super::Granted;
use crate::error::Error;
use crate::log;
use crate::spank::{Item, Spank};
use carma_placement::devices::{self, Cgroup};
use std::path::Path;

/// The task may open exactly its placement's GPUs. When that cannot be
/// done the task is killed before it execs: the step fails with the
/// reason in its stderr (slurmstepd's error lines), slurmd's log and
/// carma.log, and the node stays up (a failing task_post_fork would drain
/// it for a batch step).
pub(super) fn confine(sp: &Spank, d: &Granted) -> Result<(), Error> {
    let pid = sp.item_u32(Item::TaskPid)?;
    if let Err(e) = isolate(&d.minors, pid) {
        let msg =
            format!("job {} step {}: GPU isolation failed, the task was not started: {e}", d.step.job, d.step_name);
        log::error(&format!("task_post_fork: {msg}"));
        log::record_failure(&msg);
        let batch = d.step_name == "batch";
        if batch {
            tell_task(&msg);
        }
        sp.kill_unstarted_task(pid)?;
        // Failing a batch step's hook would drain the node (Slurm 22.05);
        // srun shows a failed hook's message with the launch failure (the
        // task's stderr pipe is not read yet at this point).
        if !batch {
            return Err(Error::msg(msg));
        }
    }
    Ok(())
}

/// Writes `msg` where the unstarted batch task's stderr goes (the job's
/// output file): slurmstepd put task 0's stderr on its own fd 2 before it
/// forked (job_log_init), so the user sees why the job died, through the
/// descriptor slurmstepd opened as the user. Never reopened as root: on a
/// root-squashed file system that would fail, and a file the user named
/// must not be opened with root's rights. Never waited on (a FIFO nobody
/// reads). Best effort: the logs have it anyway.
fn tell_task(msg: &str) {
    crate::spank::write_stderr_if_ready(&format!("carma: this step was not started: {msg}\n"));
}

/// Grants the GPUs whose device minor numbers are `minors` (their files
/// `/dev/nvidia<minor>`) and denies the node's other GPU files.
fn isolate(minors: &[u32], pid: u32) -> Result<(), String> {
    let dev = Path::new("/dev");
    // Read from what constrains the task (a device program, a devices
    // list): a constraint CARMA cannot find is an error, not "none".
    let cgroup = devices::of_task(pid)?;
    if cgroup == Cgroup::Unconstrained {
        return Ok(());
    }
    let allow =
        minors.iter().map(|&m| devices::char_device(&devices::gpu_file(dev, m))).collect::<Result<Vec<_>, _>>()?;
    let deny: Vec<_> = devices::gpu_files(dev)
        .into_iter()
        .filter(|(m, _)| !minors.contains(m))
        .filter_map(|(_, f)| devices::char_device(&f).ok())
        .collect();
    match cgroup {
        Cgroup::V1(levels) => devices::grant_v1(&levels, &allow, &deny),
        Cgroup::V2 { task, program_at } => devices::grant_v2(&task, &program_at, &allow, &deny),
        Cgroup::Unconstrained => Ok(()),
    }
}

/// Sets the task's GPU numbering: CUDA numbers the GPUs a process can
/// open, so where the device cgroup shows the task only its placement,
/// its first GPU is CUDA's 0, as Slurm numbers CUDA_VISIBLE_DEVICES under
/// ConstrainDevices=yes. SLURM_STEP_GPUS keeps the node's indices.
pub(super) fn number_gpus(sp: &Spank, d: &Granted) -> Result<(), Error> {
    let node_indices = carma_placement::index_list(&d.gpus);
    let (cuda, order) = cuda_devices(d.gpus.len(), &node_indices, constrained(&d.minors));
    sp.setenv("CUDA_VISIBLE_DEVICES", &cuda)?;
    if let Some(order) = order {
        sp.setenv("CUDA_DEVICE_ORDER", order)?;
    }
    sp.setenv("GPU_DEVICE_ORDINAL", &cuda)?;
    sp.setenv("SLURM_STEP_GPUS", &node_indices)
}

/// Whether a device cgroup constrains this task: task_init runs after
/// task_post_fork's grant, as the user, who may not ask the kernel which
/// program is attached (cgroup v2's BPF_PROG_QUERY needs root), but whose
/// access(2) to the GPUs outside the placement the cgroup answers. A
/// placement of every GPU the node has is numbered alike either way.
/// Limits (docs/isolation.md): a file mode that refuses the user answers
/// first, and a container's own /dev may hold no other GPU.
fn constrained(placed_minors: &[u32]) -> bool {
    devices::gpu_files(Path::new("/dev"))
        .into_iter()
        .filter(|(minor, _)| !placed_minors.contains(minor))
        .any(|(_, file)| devices::cgroup_denies(&file))
}

/// `0,1,..` for a task whose devices a cgroup constrains (task_post_fork
/// left it exactly its placement), else the node's indices, in the PCI
/// order NVML numbers them by (CUDA's default order is fastest first).
fn cuda_devices(count: usize, node_indices: &str, constrained: bool) -> (String, Option<&'static str>) {
    if constrained {
        ((0..count).map(|i| i.to_string()).collect::<Vec<_>>().join(","), None)
    } else {
        (node_indices.to_string(), Some("PCI_BUS_ID"))
    }
}
