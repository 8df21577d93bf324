//! The cgroup v2 grant on a real cgroup2 mount, against device programs
//! attached as Slurm's cgroup/v2 plugin attaches them (job and step with
//! BPF_F_ALLOW_OVERRIDE, the task without flags; here built with our own
//! loader, as Slurm's cannot run on this machine: docs/isolation.md). A
//! process in the task's cgroup opens GPU-like device files made with
//! mknod (c 195:N, no driver): ENXIO = allowed, EPERM = denied. Needs root
//! and bpf(2) (CI has both).

use carma_placement::bpf;
use carma_placement::devices::{Device, grant_v2};
use std::path::{Path, PathBuf};
use std::process::Command;

struct Fixture {
    cgroup: PathBuf,
    dev: PathBuf,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        for sub in ["job_1/step_0/task_0", "job_1/step_0", "job_1", ""] {
            let _ = std::fs::remove_dir(self.cgroup.join(sub));
        }
        let _ = std::fs::remove_dir_all(&self.dev);
    }
}

fn cgroup2_mount() -> Option<PathBuf> {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mi.lines().find_map(|l| {
        let (before, after) = l.split_once(" - ")?;
        if after.split(' ').next()? != "cgroup2" {
            return None;
        }
        Some(PathBuf::from(before.split(' ').nth(4)?))
    })
}

fn gpu(minor: u32) -> Device {
    Device { major: 195, minor }
}

fn fixture(name: &str) -> Option<Fixture> {
    let Some(mount) = cgroup2_mount() else {
        eprintln!("SKIPPED: no cgroup2 mount");
        return None;
    };
    let id = format!("carma-test-{}-{name}", std::process::id());
    let f = Fixture { cgroup: mount.join(&id), dev: std::env::temp_dir().join(id) };
    std::fs::create_dir_all(f.cgroup.join("job_1/step_0/task_0")).unwrap();
    std::fs::create_dir_all(&f.dev).unwrap();
    for i in 0..4 {
        let path = f.dev.join(format!("nvidia{i}"));
        let ok = Command::new("mknod").arg(&path).args(["c", "195", &i.to_string()]).status().unwrap().success();
        assert!(ok, "mknod {}", path.display());
    }
    Some(f)
}

/// Slurm's programs for a step given GPU 0: every other GPU denied.
fn slurm_programs(f: &Fixture, task_level: bool) {
    let step_prog = bpf::load(&bpf::deny_program(&[gpu(1), gpu(2), gpu(3)])).unwrap();
    for level in ["job_1", "job_1/step_0"] {
        bpf::attach(&f.cgroup.join(level), &step_prog, bpf::BPF_F_ALLOW_OVERRIDE).unwrap();
    }
    if task_level {
        bpf::attach(&f.cgroup.join("job_1/step_0/task_0"), &step_prog, 0).unwrap();
    }
}

/// The GPUs a process in `cgroup` can open.
fn opens(cgroup: &Path, dev: &Path) -> Vec<u32> {
    let script = format!(
        "echo $$ > {}/cgroup.procs || exit 9; for i in 0 1 2 3; do (exec 3<{}/nvidia$i) 2>&1; done; true",
        cgroup.display(),
        dev.display()
    );
    let out = Command::new("sh").args(["-c", &script]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (0..4)
        .filter(|i| {
            let line = text.lines().find(|l| l.contains(&format!("nvidia{i}"))).unwrap_or_else(|| panic!("{text}"));
            assert!(line.contains("not permitted") || line.contains("No such device"), "{line}");
            line.contains("No such device")
        })
        .collect()
}

#[test]
fn the_task_program_is_replaced_by_the_placement() {
    let Some(f) = fixture("task") else { return };
    let task = f.cgroup.join("job_1/step_0/task_0");
    slurm_programs(&f, true);
    assert_eq!(opens(&task, &f.dev), [0], "Slurm's own programs give GPU 0");
    // CARMA placed the step on GPU 1.
    grant_v2(&task, &[gpu(0), gpu(2), gpu(3)]).unwrap();
    assert_eq!(opens(&task, &f.dev), [1]);
    assert_eq!(bpf::attached_flags(&task).unwrap(), Some(0));
    // The step's own program is untouched: another task there keeps GPU 0.
    assert_eq!(opens(&f.cgroup.join("job_1/step_0"), &f.dev), [0]);
}

#[test]
fn a_batch_step_without_a_task_program_gets_one_that_overrides_the_steps() {
    let Some(f) = fixture("batch") else { return };
    let task = f.cgroup.join("job_1/step_0/task_0");
    slurm_programs(&f, false);
    assert_eq!(bpf::attached_flags(&task).unwrap(), None);
    assert_eq!(opens(&task, &f.dev), [0]);
    grant_v2(&task, &[gpu(0), gpu(3)]).unwrap();
    assert_eq!(opens(&task, &f.dev), [1, 2], "a two-GPU placement");
}

#[test]
fn a_task_under_a_program_that_forbids_overrides_fails_with_the_reason() {
    let Some(f) = fixture("forbid") else { return };
    // A step program attached without BPF_F_ALLOW_OVERRIDE: nothing below
    // it may attach.
    let prog = bpf::load(&bpf::deny_program(&[gpu(1)])).unwrap();
    bpf::attach(&f.cgroup.join("job_1/step_0"), &prog, 0).unwrap();
    let task = f.cgroup.join("job_1/step_0/task_0");
    let err = grant_v2(&task, &[gpu(0)]).unwrap_err();
    assert!(err.contains("attaching the device program") && err.contains("task_0"), "{err}");
    assert_eq!(opens(&task, &f.dev), [0, 2, 3], "the step's program still in force");
}
