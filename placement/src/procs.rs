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

/// True if a slurmstepd of `job` runs on this node: slurmstepd titles
/// itself `slurmstepd: [JOB.STEP]`.
pub fn job_has_stepd(job: u32) -> bool {
    let prefix = format!("slurmstepd: [{job}.");
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    dir.flatten().filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))).any(|e| {
        // Only the first bytes matter: never read a whole (up to 2 MiB) command line.
        use std::io::Read;
        let mut head = Vec::with_capacity(64);
        std::fs::File::open(e.path().join("cmdline"))
            .and_then(|f| f.take(64).read_to_end(&mut head))
            .is_ok_and(|_| head.starts_with(prefix.as_bytes()))
    })
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
}
