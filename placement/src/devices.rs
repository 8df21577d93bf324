//! A step reaches only the GPUs it was placed on: grants in the device
//! cgroup Slurm built for it.
//!
//! With `ConstrainDevices=yes` Slurm's task/cgroup plugin lets a step open
//! only the device files of the GRES it allocated. CARMA may place a step
//! on another GPU than the one whose shard Slurm gave it, or on a GPU when
//! Slurm gave it none (a count-only memory GRES): the step must then be
//! let open its placement's device files and no other GPU's. slurmstepd
//! runs SPANK's `task_post_fork` as root after the task plugin has
//! constrained the job, step and task cgroups and before the task execs,
//! so a grant made there leaves no window in which the task runs with
//! another access than its placement's.
//!
//! cgroup v1 (the devices controller): each level has its own exception
//! list, and a child may allow only what its parent allows, so grants go
//! outermost first: the job's level allows the placement's GPUs (the job's
//! other steps keep Slurm's explicit denials at their own levels, written
//! for every GPU of gres.conf), the step's and the task's allow them and
//! deny every other GPU of the node. Nothing is ever denied at the job's
//! level: a denial there would reach the job's other running steps.
//!
//! cgroup v2: Slurm attaches BPF device programs to the job and step
//! (overridable) and the task; the task's program is replaced by one that
//! denies the node's GPUs outside the placement and allows the rest
//! ([`grant_v2`], `crate::bpf`).

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// A character device as the device cgroup names it (`c MAJOR:MINOR`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Device {
    pub major: u32,
    pub minor: u32,
}

impl Device {
    /// The cgroup v1 rule granting or denying read, write and mknod.
    pub fn rule(&self) -> String {
        format!("c {}:{} rwm", self.major, self.minor)
    }
}

/// The character device `path` is (stat(2), following links).
pub fn char_device(path: &Path) -> Result<Device, String> {
    let m = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !m.file_type().is_char_device() {
        return Err(format!("{} is not a character device", path.display()));
    }
    let rdev = m.rdev();
    // glibc's gnu_dev_major/minor: the 64-bit dev_t's split fields.
    let major = ((rdev >> 32) & 0xffff_f000) | ((rdev >> 8) & 0x0fff);
    let minor = ((rdev >> 12) & 0xffff_ff00) | (rdev & 0x00ff);
    Ok(Device { major: major as u32, minor: minor as u32 })
}

/// The device file of GPU `index` under `dev_dir` (`/dev/nvidiaN`: the
/// driver numbers its files by the GPU's minor number, which is its index
/// on nodes whose GPUs enumerate in PCI order, as NVML and CUDA's
/// `PCI_BUS_ID` order do).
pub fn gpu_file(dev_dir: &Path, index: u32) -> PathBuf {
    dev_dir.join(format!("nvidia{index}"))
}

/// Every GPU device file under `dev_dir` (`nvidia` and digits), by number.
pub fn gpu_files(dev_dir: &Path) -> Vec<(u32, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dev_dir) else { return Vec::new() };
    let mut out: Vec<(u32, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let n = name.strip_prefix("nvidia")?;
            if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            Some((n.parse().ok()?, e.path()))
        })
        .collect();
    out.sort();
    out
}

/// Where a task's device access is decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cgroup {
    /// cgroup v1's devices controller: the job's, the step's and (where
    /// Slurm made one) the task's directory, outermost first.
    V1(Vec<PathBuf>),
    /// The unified hierarchy: the task's directory (Slurm's constraint is a
    /// BPF device program attached to it and its parents).
    V2(PathBuf),
    /// The task is in no job's cgroup: nothing constrains its devices
    /// (`ConstrainDevices=no`, or no task/cgroup plugin).
    Unconstrained,
}

/// The cgroup of a task from its `/proc/PID/cgroup` and this process's
/// `/proc/self/mountinfo` (mount points as this process sees them).
pub fn parse(proc_cgroup: &str, mountinfo: &str) -> Result<Cgroup, String> {
    for line in proc_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (_, controllers, path) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
        if controllers.split(',').any(|c| c == "devices") {
            let Some(levels) = job_levels(path) else { return Ok(Cgroup::Unconstrained) };
            let mount = mount_point(mountinfo, |fstype, options| {
                fstype == "cgroup" && options.split(',').any(|o| o == "devices")
            })
            .ok_or("the cgroup v1 devices controller is not mounted here")?;
            return Ok(Cgroup::V1(levels.iter().map(|l| join(&mount, l)).collect()));
        }
    }
    // No v1 devices controller: the unified hierarchy decides.
    let unified = proc_cgroup.lines().find_map(|l| l.strip_prefix("0::"));
    match unified.and_then(job_levels) {
        None => Ok(Cgroup::Unconstrained),
        Some(levels) => {
            let mount = mount_point(mountinfo, |fstype, _| fstype == "cgroup2")
                .ok_or("the unified cgroup hierarchy is not mounted here")?;
            let task = levels.last().ok_or("empty cgroup path")?;
            Ok(Cgroup::V2(join(&mount, task)))
        }
    }
}

/// `/slurm/uid_0/job_5/step_0/task_0` → the paths of the job's level and
/// every level below it; `None` outside a job's cgroup.
fn job_levels(path: &str) -> Option<Vec<String>> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let job = parts.iter().position(|p| p.strip_prefix("job_").is_some_and(|id| id.parse::<u32>().is_ok()))?;
    Some((job..parts.len()).map(|i| parts[..=i].join("/")).collect())
}

fn join(mount: &Path, relative: &str) -> PathBuf {
    mount.join(relative.trim_start_matches('/'))
}

/// The mount point of the first mount whose file system type and super
/// options satisfy `wanted` (mountinfo(5): fields, `-`, type, source,
/// super options).
fn mount_point(mountinfo: &str, wanted: impl Fn(&str, &str) -> bool) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        let mut a = after.split(' ');
        let (fstype, _source, options) = (a.next()?, a.next()?, a.next().unwrap_or(""));
        let root = before.split(' ').nth(3)?;
        let point = before.split(' ').nth(4)?;
        // A mount of a sub-tree (a container's view) would need the task's
        // path made relative to its root: not supported, refused.
        (wanted(fstype, options) && root == "/").then(|| PathBuf::from(unescape(point)))
    })
}

/// mountinfo escapes blanks and backslashes as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The task `pid`'s cgroup, read from /proc.
pub fn of_task(pid: u32) -> Result<Cgroup, String> {
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).map_err(|e| format!("/proc/{pid}/cgroup: {e}"))?;
    let mi = std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
    parse(&cg, &mi)
}

/// Lets cgroup v1 `levels` (job, step, task) open `allow` and denies
/// `deny` below the job's level; then checks the innermost level's list.
/// Any failure names the file and the rule.
pub fn grant_v1(levels: &[PathBuf], allow: &[Device], deny: &[Device]) -> Result<(), String> {
    let write = |dir: &Path, file: &str, d: &Device| {
        let path = dir.join(file);
        std::fs::write(&path, d.rule()).map_err(|e| format!("writing '{}' to {}: {e}", d.rule(), path.display()))
    };
    for dir in levels {
        for d in allow {
            write(dir, "devices.allow", d)?;
        }
    }
    for dir in levels.iter().skip(1) {
        for d in deny.iter().filter(|d| !allow.contains(d)) {
            write(dir, "devices.deny", d)?;
        }
    }
    let inner = levels.last().ok_or("no cgroup level to grant in")?;
    let list_path = inner.join("devices.list");
    let list = std::fs::read_to_string(&list_path).map_err(|e| format!("{}: {e}", list_path.display()))?;
    check_list(&list, allow, deny).map_err(|e| format!("{}: {e}", list_path.display()))
}

/// Gives the task's cgroup v2 directory a device program that denies
/// `deny` (the node's GPUs outside the placement) and allows every other
/// device, as Slurm's program does for the GRES it allocated. It replaces
/// the program Slurm attached there (same flags: the kernel swaps it in one
/// step), or, where Slurm attached none at the task's level (batch steps),
/// overrides the step's (Slurm attaches job and step programs with
/// BPF_F_ALLOW_OVERRIDE, so the nearest program is the one in force).
pub fn grant_v2(task: &Path, deny: &[Device]) -> Result<(), String> {
    let flags = crate::bpf::attached_flags(task)?.unwrap_or(0);
    let program = crate::bpf::load(&crate::bpf::deny_program(deny))?;
    crate::bpf::attach(task, &program, flags)?;
    match crate::bpf::attached_flags(task)? {
        Some(_) => Ok(()),
        None => Err(format!("{}: no device program attached after the grant", task.display())),
    }
}

/// A v1 `devices.list` lets the task open every `allow` and no `deny`.
/// A cgroup that allows by default (Slurm 22.05 denies only the GRES
/// files a step was not given) lists `a *:* rwm` and hides its denials:
/// there the kernel's acceptance of each write is the check.
pub fn check_list(list: &str, allow: &[Device], deny: &[Device]) -> Result<(), String> {
    if list.lines().any(|l| l.trim() == "a *:* rwm") {
        return Ok(());
    }
    let has = |d: &Device| list.lines().any(|l| l.trim() == d.rule());
    if let Some(d) = allow.iter().find(|d| !has(d)) {
        return Err(format!("'{}' is not allowed after the grant", d.rule()));
    }
    if let Some(d) = deny.iter().filter(|d| !allow.contains(d)).find(|d| has(d)) {
        return Err(format!("'{}' is still allowed after the denial", d.rule()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
25 30 0:22 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
31 25 0:27 / /sys/fs/cgroup/devices rw,nosuid shared:14 - cgroup cgroup rw,devices
32 25 0:28 / /sys/fs/cgroup/unified rw,nosuid shared:15 - cgroup2 cgroup2 rw,nsdelegate
";

    #[test]
    fn a_v1_task_grants_at_its_job_step_and_task_levels() {
        let cg = "9:name=systemd:/\n5:devices:/slurm/uid_1000/job_12/step_0/task_3\n0::/\n";
        let root = Path::new("/sys/fs/cgroup/devices/slurm/uid_1000");
        assert_eq!(
            parse(cg, MOUNTINFO).unwrap(),
            Cgroup::V1(vec![root.join("job_12"), root.join("job_12/step_0"), root.join("job_12/step_0/task_3")])
        );
        // A batch step without task cgroups, and another slurmd's prefix.
        let cg = "5:devices:/slurm_vmb/uid_0/job_7/step_batch\n";
        let root = Path::new("/sys/fs/cgroup/devices/slurm_vmb/uid_0");
        assert_eq!(parse(cg, MOUNTINFO).unwrap(), Cgroup::V1(vec![root.join("job_7"), root.join("job_7/step_batch")]));
    }

    #[test]
    fn outside_a_job_cgroup_nothing_constrains_and_v2_is_told_apart() {
        assert_eq!(parse("5:devices:/\n0::/user.slice\n", MOUNTINFO).unwrap(), Cgroup::Unconstrained);
        let v2 = "0::/system.slice/slurmstepd.scope/job_4/step_0/user/task_0\n";
        assert_eq!(
            parse(v2, MOUNTINFO).unwrap(),
            Cgroup::V2(PathBuf::from("/sys/fs/cgroup/unified/system.slice/slurmstepd.scope/job_4/step_0/user/task_0"))
        );
        // A devices line but no devices mount: an error, not a silent skip.
        let mi = "25 30 0:22 / /sys/fs/cgroup ro - tmpfs tmpfs ro\n";
        assert!(parse("5:devices:/slurm/uid_0/job_1/step_0\n", mi).unwrap_err().contains("not mounted"));
    }

    #[test]
    fn the_list_check_sees_a_missing_grant_and_a_left_over_access() {
        let gpu = |minor| Device { major: 195, minor };
        let list = "c 195:1 rwm\nc 1:3 rwm\n";
        assert!(check_list(list, &[gpu(1)], &[gpu(0), gpu(2)]).is_ok());
        assert!(check_list(list, &[gpu(2)], &[]).unwrap_err().contains("195:2"));
        assert!(check_list(list, &[gpu(0)], &[gpu(1)]).is_err());
        // Allowing by default, the list hides the denials it holds.
        assert!(check_list("a *:* rwm\n", &[gpu(0)], &[gpu(1)]).is_ok());
    }

    #[test]
    fn char_devices_by_major_and_minor() {
        // /dev/null is c 1:3 on every Linux.
        assert_eq!(char_device(Path::new("/dev/null")).unwrap(), Device { major: 1, minor: 3 });
        assert!(char_device(Path::new("/")).unwrap_err().contains("not a character device"));
        assert_eq!(unescape(r"/mnt/a\040b"), "/mnt/a b");
    }
}
