//! The cgroup v2 grant on a real cgroup2 mount, against device programs
//! built and attached as Slurm's cgroup/v2 plugin builds and attaches them
//! (job and step with BPF_F_ALLOW_OVERRIDE, the task without flags; the
//! rules of src/plugins/cgroup/v2/ebpf.c: each gres.conf device file
//! allowed or denied, then allow). A process in the task's cgroup opens
//! device files made with mknod (no driver): ENXIO = allowed, EPERM =
//! denied. Needs root and bpf(2) (CI has both).

use carma_placement::bpf::{self, Insn, Policy, Rule};
use carma_placement::devices::{self, Cgroup, Device, grant_v2};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Slurm 26.05's job directory (a SLUID), and `CgroupJobIdPaths=yes`'s.
const SLUID: &str = "s8CXM88T7FN000";
const JOB_ID: &str = "job_1";

/// Device files of the node: four GPUs, a MIG capability file (its major
/// is dynamic; 508 here) and a second GRES kind (a NIC-like `c 241:0`).
const FILES: [(&str, u32, u32); 6] = [
    ("nvidia0", 195, 0),
    ("nvidia1", 195, 1),
    ("nvidia2", 195, 2),
    ("nvidia3", 195, 3),
    ("nvidia-cap1", 508, 1),
    ("nic0", 241, 0),
];

struct Fixture {
    root: PathBuf,
    job: PathBuf,
    dev: PathBuf,
}

impl Fixture {
    fn step(&self) -> PathBuf {
        self.job.join("step_0")
    }
    fn task(&self) -> PathBuf {
        self.job.join("step_0/user/task_0")
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        for dir in [self.task(), self.job.join("step_0/user"), self.step(), self.job.clone(), self.root.clone()] {
            let _ = std::fs::remove_dir(dir);
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

fn dev(major: u32, minor: u32) -> Device {
    Device { major, minor }
}

fn gpu(minor: u32) -> Device {
    dev(195, minor)
}

fn fixture(name: &str, job_dir: &str) -> Option<Fixture> {
    let Some(mount) = cgroup2_mount() else {
        eprintln!("SKIPPED: no cgroup2 mount");
        return None;
    };
    let id = format!("carma-test-{}-{name}", std::process::id());
    let root = mount.join(&id);
    let f = Fixture { job: root.join(job_dir), root, dev: std::env::temp_dir().join(id) };
    std::fs::create_dir_all(f.task()).unwrap();
    std::fs::create_dir_all(&f.dev).unwrap();
    for (file, major, minor) in FILES {
        let path = f.dev.join(file);
        let ok = Command::new("mknod")
            .arg(&path)
            .args(["c", &major.to_string(), &minor.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "mknod {}", path.display());
    }
    Some(f)
}

/// Slurm's program for a step given GPU 0 (and no capability file, no
/// NIC): each gres.conf file allowed or denied, then allow.
fn slurm_policy() -> Policy {
    let mut rules = vec![Rule::char_device(gpu(0), true)];
    rules.extend([gpu(1), gpu(2), gpu(3), dev(508, 1), dev(241, 0)].map(|d| Rule::char_device(d, false)));
    Policy { rules, default_allow: true }
}

fn slurm_programs(f: &Fixture, task_level: bool) {
    let prog = bpf::load(&bpf::encode(&slurm_policy())).unwrap();
    for level in [f.job.clone(), f.step()] {
        bpf::attach(&level, &prog, bpf::BPF_F_ALLOW_OVERRIDE).unwrap();
    }
    if task_level {
        bpf::attach(&f.task(), &prog, 0).unwrap();
    }
}

/// The device files a process in `cgroup` can open.
fn opens(cgroup: &Path, dev: &Path) -> Vec<&'static str> {
    let names: Vec<&str> = FILES.iter().map(|(n, _, _)| *n).collect();
    let script = format!(
        "echo $$ > {}/cgroup.procs || exit 9; for f in {}; do (exec 3<{}/$f) 2>&1; done; true",
        cgroup.display(),
        names.join(" "),
        dev.display()
    );
    let out = Command::new("sh").args(["-c", &script]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    names
        .into_iter()
        .filter(|n| {
            let line = text.lines().find(|l| l.contains(&format!("/{n}:"))).unwrap_or_else(|| panic!("{n}: {text}"));
            assert!(line.contains("not permitted") || line.contains("No such device"), "{line}");
            line.contains("No such device")
        })
        .collect()
}

/// What constrains a process moved into `cgroup`, as the plugin reads it.
fn constraint_of_a_task_in(cgroup: &Path) -> Result<Cgroup, String> {
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    std::fs::write(cgroup.join("cgroup.procs"), child.id().to_string()).unwrap();
    let found = devices::of_task(child.id());
    child.kill().unwrap();
    child.wait().unwrap();
    found
}

#[test]
fn the_task_program_is_replaced_by_the_placement_and_keeps_slurms_denials() {
    // 26.05's layout: SLUID job directory, tasks under step_0/user.
    let Some(f) = fixture("task", SLUID) else { return };
    slurm_programs(&f, true);
    assert_eq!(opens(&f.task(), &f.dev), ["nvidia0"], "Slurm's own programs give GPU 0");
    // CARMA placed the step on GPU 1.
    grant_v2(&f.task(), &f.task(), &[gpu(1)], &[gpu(0), gpu(2), gpu(3)]).unwrap();
    assert_eq!(opens(&f.task(), &f.dev), ["nvidia1"], "the capability file and the NIC stay denied");
    assert_eq!(bpf::attached_flags(&f.task()).unwrap(), Some(0));
    // The step's own program is untouched: another task there keeps GPU 0.
    assert_eq!(opens(&f.step(), &f.dev), ["nvidia0"]);
}

#[test]
fn a_batch_step_without_a_task_program_gets_one_that_overrides_the_steps() {
    // CgroupJobIdPaths=yes names the job's directory job_N.
    let Some(f) = fixture("batch", JOB_ID) else { return };
    slurm_programs(&f, false);
    assert_eq!(bpf::attached_flags(&f.task()).unwrap(), None);
    assert_eq!(opens(&f.task(), &f.dev), ["nvidia0"]);
    grant_v2(&f.task(), &f.step(), &[gpu(1), gpu(2)], &[gpu(0), gpu(3)]).unwrap();
    assert_eq!(opens(&f.task(), &f.dev), ["nvidia1", "nvidia2"], "a two-GPU placement, nothing else");
}

#[test]
fn the_constraint_is_found_from_the_programs_attached_whatever_the_names() {
    let Some(f) = fixture("find", SLUID) else { return };
    // No program anywhere up the path: nothing constrains the task.
    assert_eq!(constraint_of_a_task_in(&f.task()).unwrap(), Cgroup::Unconstrained);
    // Job and step programs only (a batch step): the step's is in force.
    slurm_programs(&f, false);
    let found = constraint_of_a_task_in(&f.task()).unwrap();
    assert_eq!(found, Cgroup::V2 { task: f.task(), program_at: f.step() });
    slurm_programs(&f, true);
    let found = constraint_of_a_task_in(&f.task()).unwrap();
    assert_eq!(found, Cgroup::V2 { task: f.task(), program_at: f.task() });
}

#[test]
fn a_task_under_a_program_that_forbids_overrides_fails_with_the_reason() {
    let Some(f) = fixture("forbid", JOB_ID) else { return };
    // A step program attached without BPF_F_ALLOW_OVERRIDE: nothing below
    // it may attach.
    let prog = bpf::load(&bpf::deny_program(&[gpu(1)])).unwrap();
    bpf::attach(&f.step(), &prog, 0).unwrap();
    let err = grant_v2(&f.task(), &f.step(), &[gpu(0)], &[gpu(1)]).unwrap_err();
    assert!(err.contains("attaching the device program") && err.contains("task_0"), "{err}");
    assert_eq!(opens(&f.task(), &f.dev), ["nvidia0", "nvidia2", "nvidia3", "nvidia-cap1", "nic0"]);
}

#[test]
fn a_program_carma_cannot_read_fails_the_grant_and_stays_in_force() {
    let Some(f) = fixture("foreign", SLUID) else { return };
    // A program of another shape than Slurm's: one that tests the access
    // (here: denies reading GPU 1 only), as systemd's and lxc's do.
    let mut foreign = bpf::encode(&Policy { rules: vec![], default_allow: true });
    let allow = foreign.split_off(foreign.len() - 2);
    foreign.extend([
        Insn::new(0x55, 4, 0, 3, 195), // if major != 195 goto allow
        Insn::new(0x55, 3, 0, 2, 2),   // if access != read goto allow
        Insn::new(0xb7, 0, 0, 0, 0),   // return 0
        Insn::new(0x95, 0, 0, 0, 0),
    ]);
    foreign.extend(allow);
    let prog = bpf::load(&foreign).unwrap();
    bpf::attach(&f.task(), &prog, 0).unwrap();
    let err = grant_v2(&f.task(), &f.task(), &[gpu(1)], &[gpu(0)]).unwrap_err();
    assert!(err.contains("not one CARMA can read"), "{err}");
    // A program attached with BPF_F_ALLOW_MULTI (systemd's) cannot be
    // overridden: refused with the reason.
    let multi = bpf::load(&bpf::encode(&slurm_policy())).unwrap();
    bpf::attach(&f.step(), &multi, bpf::BPF_F_ALLOW_MULTI).unwrap();
    let err = grant_v2(&f.task(), &f.step(), &[gpu(1)], &[gpu(0)]).unwrap_err();
    assert!(err.contains("BPF_F_ALLOW_MULTI"), "{err}");
}
