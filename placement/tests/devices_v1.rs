//! Grants in a real cgroup v1 devices hierarchy shaped as Slurm's
//! task/cgroup builds it (job, step, task; everything denied but what the
//! job was given). Needs root and the v1 devices controller (CI has both).

use carma_placement::devices::{Device, grant_v1};
use std::path::{Path, PathBuf};

const ROOT: &str = "/sys/fs/cgroup/devices";

struct Tree(PathBuf);

impl Drop for Tree {
    fn drop(&mut self) {
        for sub in ["job_1/step_0/task_0", "job_1/step_0", "job_1/step_1", "job_1", ""] {
            let _ = std::fs::remove_dir(self.0.join(sub));
        }
    }
}

fn gpu(minor: u32) -> Device {
    Device { major: 195, minor }
}

fn list(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("devices.list")).unwrap()
}

/// job_1 (GPU 0 allowed, as Slurm allows a shard's device), step_0 and
/// its task_0, and a second step_1 of the same job holding GPU 0.
fn slurm_like_tree(name: &str) -> Option<Tree> {
    if !Path::new(ROOT).join("devices.allow").exists() {
        eprintln!("SKIPPED: no cgroup v1 devices controller at {ROOT}");
        return None;
    }
    let tree = Tree(Path::new(ROOT).join(format!("carma-test-{}-{name}", std::process::id())));
    let job = tree.0.join("job_1");
    std::fs::create_dir_all(&job).unwrap();
    std::fs::write(job.join("devices.deny"), "a").unwrap();
    for rule in ["c 1:3 rwm", "c 195:0 rwm"] {
        std::fs::write(job.join("devices.allow"), rule).unwrap();
    }
    for step in ["step_0", "step_1"] {
        std::fs::create_dir(job.join(step)).unwrap();
    }
    std::fs::create_dir(job.join("step_0/task_0")).unwrap();
    Some(tree)
}

#[test]
fn a_placement_on_another_gpu_is_granted_and_the_slurm_one_denied_for_that_step_only() {
    let Some(tree) = slurm_like_tree("grant") else { return };
    let job = tree.0.join("job_1");
    let levels = [job.clone(), job.join("step_0"), job.join("step_0/task_0")];
    // CARMA placed step 0 on GPU 1; Slurm had given the job GPU 0's shard.
    grant_v1(&levels, &[gpu(1)], &[gpu(0), gpu(2), gpu(3)]).unwrap();
    let task = list(&job.join("step_0/task_0"));
    assert!(task.contains("c 195:1 rwm") && !task.contains("c 195:0 rwm"), "{task}");
    assert!(list(&job.join("step_0")).contains("c 195:1 rwm"));
    // The job's level only gained GPU 1; the other step keeps GPU 0 alone.
    let j = list(&job);
    assert!(j.contains("c 195:0 rwm") && j.contains("c 195:1 rwm") && !j.contains("195:2"), "{j}");
    let other = list(&job.join("step_1"));
    assert!(other.contains("c 195:0 rwm") && !other.contains("c 195:1"), "{other}");
}

#[test]
fn a_level_whose_parent_forbids_the_device_fails_with_the_file_and_rule() {
    let Some(tree) = slurm_like_tree("parent") else { return };
    let job = tree.0.join("job_1");
    // Without the job's level, the step may not allow what the job denies.
    let err = grant_v1(&[job.join("step_0"), job.join("step_0/task_0")], &[gpu(2)], &[]).unwrap_err();
    assert!(err.contains("c 195:2 rwm") && err.contains("step_0/devices.allow"), "{err}");
    assert!(!list(&job.join("step_0")).contains("195:2"));
}
