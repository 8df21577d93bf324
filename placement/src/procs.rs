//! Which job a GPU process belongs to: a process belongs to a holder (a
//! slurmstepd) when the holder is among its ancestors. Reads /proc only.

use std::collections::HashMap;

/// Parent pid from /proc/<pid>/stat; `None` if the process is gone.
pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: skip
    // past the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The user of `pid` if it is an MPS server (`nvidia-cuda-mps-server`,
/// whose command name the kernel keeps as `nvidia-cuda-mps`).
pub fn mps_server_uid(pid: u32) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    let name = comm.trim_end();
    (name == "nvidia-cuda-mps" || name.starts_with("nvidia-cuda-mps-s"))
        .then(|| std::fs::metadata(format!("/proc/{pid}")).ok().map(|m| m.uid()))
        .flatten()
}

/// A process that exists and is not a zombie: a slurmstepd killed with
/// SIGKILL stays a zombie until slurmd reaps it, and holds nothing.
pub fn alive(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let state = stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next());
    !matches!(state, Some("Z") | Some("X") | None)
}

/// Maps each pid to the first of `holders` found among its ancestors.
pub fn owners(pids: impl IntoIterator<Item = u32>, holders: &[u32]) -> HashMap<u32, u32> {
    let mut out = HashMap::new();
    for pid in pids {
        let mut cur = pid;
        // Bounded walk: process trees are shallow; a cycle cannot hang us.
        for _ in 0..64 {
            if holders.contains(&cur) {
                out.insert(pid, cur);
                break;
            }
            match parent_of(cur) {
                Some(p) if p != 0 && p != cur => cur = p,
                _ => break,
            }
        }
    }
    out
}

/// The real uid of `pid` (`Uid:` in /proc/<pid>/status, first field).
/// A user cannot make it 0: running a setuid-root program changes the
/// effective uid only, and argv[0] (the title) is the user's to choose.
fn real_uid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("Uid:"))?.split_whitespace().next()?.parse().ok()
}

/// True if `pid` is a live slurmstepd of `job`: a root process (real uid
/// 0, which no user process has) titled `slurmstepd: [JOB.STEP]`, the
/// title slurmstepd gives itself. The title alone is forgeable (any
/// process sets its own argv); the uid ties it to root. A recorded
/// holder's pid reused by another process fails the same test unless it
/// is again a slurmstepd of the same job, which holds the same
/// reservation.
pub fn stepd_of(job: u32, pid: u32) -> bool {
    if !alive(pid) || real_uid(pid) != Some(0) {
        return false;
    }
    // Only the first bytes matter: never read a whole (up to 2 MiB) command line.
    use std::io::Read;
    let mut head = Vec::with_capacity(64);
    std::fs::File::open(format!("/proc/{pid}/cmdline"))
        .and_then(|f| f.take(64).read_to_end(&mut head))
        .is_ok_and(|_| head.starts_with(format!("slurmstepd: [{job}.").as_bytes()))
}

/// True if a slurmstepd of `job` runs on this node (see [`stepd_of`]).
pub fn job_has_stepd(job: u32) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .any(|pid| stepd_of(job, pid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_owned_by_its_parent() {
        let me = std::process::id();
        let parent = parent_of(me).expect("own parent");
        let map = owners([me], &[parent]);
        assert_eq!(map.get(&me), Some(&parent));
        assert!(owners([me], &[999_999_999]).is_empty());
        assert!(alive(me));
        assert_eq!(mps_server_uid(me), None, "the test is no MPS server");
        assert!(!alive(0));
        // A zombie (exited, not yet reaped) holds nothing.
        let child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(std::path::Path::new(&format!("/proc/{pid}")).exists(), "zombie should still be listed");
        assert!(!alive(pid), "a zombie counted as alive");
        drop(child);
    }

    /// A user's process titled like a slurmstepd of a job that has ended
    /// does not keep that job's reservation.
    #[test]
    fn a_user_process_titled_slurmstepd_is_no_stepd() {
        use std::os::unix::process::CommandExt;
        let job = 4_000_000_000u32 - std::process::id() % 1000;
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg0(format!("slurmstepd: [{job}.0]")).arg("30");
        let root = carma_config::ownership::running_as_root();
        if root {
            cmd.uid(65534).gid(65534); // nobody, as a user's job would run
        }
        let mut child = cmd.spawn().unwrap();
        let pid = child.id();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let title = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        assert!(title.starts_with(format!("slurmstepd: [{job}.0]").as_bytes()), "the forged title is in place");
        let (has, of) = (job_has_stepd(job), stepd_of(job, pid));
        let _ = child.kill();
        let _ = child.wait();
        assert!(!has, "a user process titled 'slurmstepd: [{job}.0]' counted as the job's slurmstepd");
        assert!(!of, "a user process counted as a holder of job {job}");
        // Root's own process with that title is one (slurmstepd's case).
        if root {
            let mut root =
                std::process::Command::new("sleep").arg0(format!("slurmstepd: [{job}.1]")).arg("30").spawn().unwrap();
            std::thread::sleep(std::time::Duration::from_millis(200));
            let (has, of) = (job_has_stepd(job), stepd_of(job, root.id()));
            let _ = root.kill();
            let _ = root.wait();
            assert!(has && of, "root's process titled as the job's slurmstepd not found");
            assert!(!stepd_of(job + 1, root.id()), "a stepd of one job counted for another");
        }
    }
}
