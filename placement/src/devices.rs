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
//! (overridable) and the task; the program in force for the task (the
//! nearest one up its cgroup path) is read back, and the task gets one that
//! allows the placement's GPUs, denies the node's other GPUs and then
//! answers as Slurm's does for every other device ([`grant_v2`],
//! `crate::bpf`).
//!
//! Whether a task is constrained is read from what constrains it, never
//! from directory names (Slurm 26.05 names v2 job directories by SLUID,
//! `CgroupJobIdPaths=yes` by `job_N`, and nests `user/task_N`): on v2 a
//! device program attached at the task's level or above, on v1 a
//! `devices.list` that is not `a *:* rwm` or a Slurm job directory.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

pub use crate::device::Device;

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

/// The device file of the GPU whose device minor number is `minor` under
/// `dev_dir` (`/dev/nvidia<minor>`: the driver numbers its files by minor
/// number, which can differ from the NVML index; `GpuReading::minor`).
pub fn gpu_file(dev_dir: &Path, minor: u32) -> PathBuf {
    dev_dir.join(format!("nvidia{minor}"))
}

/// Whether this process's device cgroup denies it `file`, a character
/// device. access(2) runs the cgroup's check (v1 lists, v2 programs) after
/// the file mode's, and only the cgroup answers EPERM (a mode answers
/// EACCES; read only: a write check of an immutable file answers EPERM
/// too). Any user may ask, and unlike open(2) it wakes no driver.
pub fn cgroup_denies(file: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::FileTypeExt;
    if !std::fs::metadata(file).is_ok_and(|m| m.file_type().is_char_device()) {
        return false;
    }
    let Ok(path) = std::ffi::CString::new(file.as_os_str().as_bytes()) else { return false };
    #[allow(unsafe_code)] // access(2): std has no call that answers without opening
    // SAFETY: `path` is NUL-terminated and outlives the call.
    let rc = unsafe { libc::access(path.as_ptr(), libc::R_OK) };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
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
    /// The unified hierarchy: the task's directory, and the directory (it
    /// or an ancestor) whose device program is in force for the task.
    V2 { task: PathBuf, program_at: PathBuf },
    /// Nothing constrains the task's devices (`ConstrainDevices=no`, or no
    /// task/cgroup plugin).
    Unconstrained,
}

/// Where a task's cgroup is, before asking what constrains it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// cgroup v1's devices controller: the task's directory, and the
    /// job's, step's and task's levels where the path has a `job_N` (the
    /// v1 plugin's layout).
    V1 { task: PathBuf, levels: Option<Vec<PathBuf>> },
    /// The unified hierarchy: its mount and the task's directory.
    V2 { mount: PathBuf, task: PathBuf },
}

/// The cgroups of a task from its `/proc/PID/cgroup` and this process's
/// `/proc/self/mountinfo` (mount points as this process sees them): its
/// v1 devices cgroup where that controller is mounted, then its unified
/// one. On a hybrid node both can constrain (the kernel runs the v2 device
/// programs before the v1 lists).
pub fn parse(proc_cgroup: &str, mountinfo: &str) -> Result<Vec<Location>, String> {
    let mut found = Vec::new();
    for line in proc_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (_, controllers, path) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
        if controllers.split(',').any(|c| c == "devices") {
            let mount = mount_point(mountinfo, |fstype, options| {
                fstype == "cgroup" && options.split(',').any(|o| o == "devices")
            })
            .ok_or("the cgroup v1 devices controller is not mounted here")?;
            let levels = job_levels(path).map(|l| l.iter().map(|l| join(&mount, l)).collect());
            found.push(Location::V1 { task: join(&mount, path), levels });
            break;
        }
    }
    if let Some(path) = proc_cgroup.lines().find_map(|l| l.strip_prefix("0::")) {
        match mount_point(mountinfo, |fstype, _| fstype == "cgroup2") {
            Some(mount) => found.push(Location::V2 { task: join(&mount, path), mount }),
            None if found.is_empty() => return Err("the unified cgroup hierarchy is not mounted here".into()),
            None => {}
        }
    }
    if found.is_empty() {
        return Err("the task is in no devices cgroup and no unified hierarchy".into());
    }
    Ok(found)
}

/// `/slurm/uid_0/job_5/step_0/task_0` → the paths of the job's level and
/// every level below it; `None` outside a v1 job's cgroup.
fn job_levels(path: &str) -> Option<Vec<String>> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let job = parts.iter().position(|p| p.strip_prefix("job_").is_some_and(|id| id.parse::<u32>().is_ok()))?;
    Some((job..parts.len()).map(|i| parts[..=i].join("/")).collect())
}

/// What constrains the task at `location`: on v2 the nearest device
/// program up its path (Slurm's task, step or job program); on v1 the
/// job's levels, or nothing where the task's `devices.list` allows all.
/// A constraint CARMA cannot place itself in is an error, never
/// `Unconstrained`.
pub fn constraint(location: Location) -> Result<Cgroup, String> {
    match location {
        Location::V1 { levels: Some(levels), .. } => Ok(Cgroup::V1(levels)),
        Location::V1 { task, levels: None } => {
            let list_path = task.join("devices.list");
            let list = std::fs::read_to_string(&list_path).map_err(|e| format!("{}: {e}", list_path.display()))?;
            if list.lines().any(|l| l.trim() == "a *:* rwm") {
                Ok(Cgroup::Unconstrained)
            } else {
                Err(format!(
                    "{}: the task's devices are constrained, but not in a Slurm job's cgroup (no job_N level)",
                    list_path.display()
                ))
            }
        }
        Location::V2 { mount, task } => {
            let mut dir = task.as_path();
            loop {
                if crate::bpf::attached(dir)?.is_some() {
                    return Ok(Cgroup::V2 { program_at: dir.to_path_buf(), task });
                }
                if dir == mount {
                    return Ok(Cgroup::Unconstrained);
                }
                dir = dir.parent().filter(|p| p.starts_with(&mount)).ok_or("the task's cgroup is outside the mount")?;
            }
        }
    }
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

/// What constrains the task `pid`'s devices, read from /proc and the
/// cgroup file system.
pub fn of_task(pid: u32) -> Result<Cgroup, String> {
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).map_err(|e| format!("/proc/{pid}/cgroup: {e}"))?;
    let mi = std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
    for location in parse(&cg, &mi)? {
        match constraint(location)? {
            Cgroup::Unconstrained => continue,
            constrained => return Ok(constrained),
        }
    }
    Ok(Cgroup::Unconstrained)
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

/// Gives the task's cgroup v2 directory a device program that allows
/// `allow` (the placement's GPUs), denies `deny` (the node's other GPUs)
/// and answers every other access as the program in force at
/// `program_at` (Slurm's: it or an ancestor) does, so every device Slurm
/// denied the step (other GRES, `/dev/nvidia-caps`) stays denied. It
/// replaces the program Slurm attached to the task (same flags: the kernel
/// swaps it in one step), or, where Slurm attached none at the task's
/// level (batch steps), overrides the step's (Slurm attaches job and step
/// programs with BPF_F_ALLOW_OVERRIDE). The program attached is read back
/// and compared.
pub fn grant_v2(task: &Path, program_at: &Path, allow: &[Device], deny: &[Device]) -> Result<(), String> {
    use crate::bpf::{self, Policy, Rule};
    let (flags, id) =
        bpf::attached(program_at)?.ok_or_else(|| format!("{}: the device program is gone", program_at.display()))?;
    if flags & bpf::BPF_F_ALLOW_MULTI != 0 {
        // Such programs all run, ours beside it: it would still deny.
        return Err(format!(
            "{}: its device program is attached with BPF_F_ALLOW_MULTI (not Slurm's), which no grant can override",
            program_at.display()
        ));
    }
    let slurm = bpf::decode(&bpf::program(id)?)
        .map_err(|e| format!("the device program of {} is not one CARMA can read: {e}", program_at.display()))?;
    let mut rules: Vec<Rule> = allow.iter().map(|&d| Rule::char_device(d, true)).collect();
    rules.extend(deny.iter().filter(|d| !allow.contains(d)).map(|&d| Rule::char_device(d, false)));
    rules.extend(slurm.rules);
    let policy = Policy { rules, default_allow: slurm.default_allow };
    let flags = if program_at == task { flags } else { 0 };
    let program = bpf::load(&bpf::encode(&policy))?;
    bpf::attach(task, &program, flags)?;
    let (_, now) = bpf::attached(task)?
        .ok_or_else(|| format!("{}: no device program attached after the grant", task.display()))?;
    match bpf::decode(&bpf::program(now)?) {
        Ok(p) if p == policy => Ok(()),
        _ => Err(format!("{}: the device program attached is not the grant's", task.display())),
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

    fn v1(task: &Path, levels: Option<Vec<PathBuf>>) -> Location {
        Location::V1 { task: task.to_path_buf(), levels }
    }

    #[test]
    fn a_v1_task_grants_at_its_job_step_and_task_levels() {
        let cg = "9:name=systemd:/\n5:devices:/slurm/uid_1000/job_12/step_0/task_3\n0::/\n";
        let root = Path::new("/sys/fs/cgroup/devices/slurm/uid_1000");
        let levels = vec![root.join("job_12"), root.join("job_12/step_0"), root.join("job_12/step_0/task_3")];
        let unified = Location::V2 { mount: "/sys/fs/cgroup/unified".into(), task: "/sys/fs/cgroup/unified/".into() };
        assert_eq!(parse(cg, MOUNTINFO).unwrap(), [v1(&root.join("job_12/step_0/task_3"), Some(levels)), unified]);
        // A batch step without task cgroups, and another slurmd's prefix.
        let cg = "5:devices:/slurm_vmb/uid_0/job_7/step_batch\n";
        let root = Path::new("/sys/fs/cgroup/devices/slurm_vmb/uid_0");
        let levels = vec![root.join("job_7"), root.join("job_7/step_batch")];
        assert_eq!(parse(cg, MOUNTINFO).unwrap(), [v1(&root.join("job_7/step_batch"), Some(levels))]);
    }

    #[test]
    fn v2_paths_are_located_whatever_slurm_names_its_directories() {
        let unified = Path::new("/sys/fs/cgroup/unified");
        for path in [
            "/system.slice/slurmstepd.scope/job_4/step_0/user/task_0",
            // 26.05: job directories named by SLUID.
            "/system.slice/vm_slurmstepd.scope/s8CXM88T7FN000/step_0/user/task_0",
            "/system.slice/vm_slurmstepd.scope/s8CXM88T7FN000/step_batch/user/task_0",
        ] {
            let loc = parse(&format!("0::{path}\n"), MOUNTINFO).unwrap();
            let task = unified.join(path.trim_start_matches('/'));
            assert_eq!(loc, [Location::V2 { mount: unified.to_path_buf(), task }]);
        }
    }

    #[test]
    fn outside_a_v1_job_cgroup_the_devices_list_decides() {
        let dir = std::env::temp_dir().join(format!("carma-devlist-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("devices.list"), "a *:* rwm\n").unwrap();
        assert_eq!(constraint(v1(&dir, None)).unwrap(), Cgroup::Unconstrained);
        // Constrained somewhere CARMA does not know: an error.
        std::fs::write(dir.join("devices.list"), "c 195:0 rwm\nc 1:3 rwm\n").unwrap();
        assert!(constraint(v1(&dir, None)).unwrap_err().contains("constrained"));
        std::fs::remove_dir_all(&dir).unwrap();
        // A devices line but no devices mount: an error, not a silent skip.
        let mi = "25 30 0:22 / /sys/fs/cgroup ro - tmpfs tmpfs ro\n";
        assert!(parse("5:devices:/slurm/uid_0/job_1/step_0\n", mi).unwrap_err().contains("not mounted"));
        assert!(parse("0::/x\n", mi).unwrap_err().contains("not mounted"));
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
