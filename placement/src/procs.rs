//! Which job a GPU process belongs to: a process belongs to a holder (a
//! slurmstepd) when the holder is among its ancestors; and whose MPS server
//! a process is. Reads /proc only.

use std::collections::HashMap;

/// Parent pid from /proc/<pid>/stat; `None` if the process is gone.
pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: skip
    // past the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The file name of NVIDIA's MPS control daemon, the parent of every MPS
/// server (`nvidia-cuda-mps-control -d`, started by root).
pub const MPS_CONTROL_EXE: &str = "nvidia-cuda-mps-control";

/// The user `pid` serves if it is an MPS server, from facts a user cannot
/// forge. The command name alone (`nvidia-cuda-mps-server`, which the
/// kernel keeps as `nvidia-cuda-mps`) is anyone's to take (prctl
/// PR_SET_NAME, or a copy of any program under that name). So a server
/// counts only if its parent is NVIDIA's control daemon: a process whose
/// real uid is 0 (no user process has it) and whose executable
/// (/proc/PPID/exe, the file it runs) is a file named
/// `nvidia-cuda-mps-control` that only root can change (owned by root, not
/// writable by group or others: a root daemon run from a file a user could
/// replace is not one to trust). The daemon runs as root and starts each
/// server itself, as the user that server serves: a user can neither make a
/// root process its parent nor start root's daemon. The user is the
/// server's real uid (`Uid:` in its status), the one the daemon gave it.
pub fn mps_server_uid(pid: u32) -> Option<u32> {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    let name = comm.trim_end();
    if name != "nvidia-cuda-mps" && !name.starts_with("nvidia-cuda-mps-s") {
        return None;
    }
    let parent = parent_of(pid).filter(|&p| p != 0 && p != pid)?;
    if real_uid(parent) != Some(0) || !exe_named(parent, MPS_CONTROL_EXE) || !exe_roots_alone(parent) {
        return None;
    }
    real_uid(pid)
}

/// True if the executable of `pid` (/proc/PID/exe, symbolic links
/// resolved by the kernel) is a file named `name`; also once that file was
/// replaced or removed, which the kernel marks with ` (deleted)` (a
/// package upgrade while the daemon runs). False if unreadable (a kernel
/// thread, a process gone, or not ours to read).
fn exe_named(pid: u32, name: &str) -> bool {
    let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) else { return false };
    let Some(file) = exe.file_name().and_then(|f| f.to_str()) else { return false };
    file.strip_suffix(" (deleted)").unwrap_or(file) == name
}

/// True if the file `pid` runs (also once replaced or removed) is owned by
/// root and writable by nobody else.
fn exe_roots_alone(pid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}/exe")).is_ok_and(|m| m.uid() == 0 && m.mode() & 0o022 == 0)
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

    /// Copies of /bin/sh under NVIDIA's MPS file names (or others), in a
    /// directory of their own that any user may run them from.
    struct Copies(std::path::PathBuf);

    impl Copies {
        fn new(tag: &str, names: &[&str]) -> Copies {
            use std::os::unix::fs::PermissionsExt;
            let dir = std::env::temp_dir().join(format!("carma-procs-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir(&dir).unwrap();
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
            for name in names {
                // A copy, not a link: /proc/PID/exe names the file a link leads to.
                std::fs::copy("/bin/sh", dir.join(name)).unwrap();
                std::fs::set_permissions(dir.join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
            }
            Copies(dir)
        }

        fn path(&self, name: &str) -> std::path::PathBuf {
            self.0.join(name)
        }
    }

    /// Spawns `cmd`, again while its file is busy: a copy just written can
    /// be held open for writing by a child another test thread forked
    /// before its exec (ETXTBSY).
    fn spawn(cmd: &mut std::process::Command) -> std::process::Child {
        for _ in 0..50 {
            match cmd.spawn() {
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                    std::thread::sleep(std::time::Duration::from_millis(20))
                }
                other => return other.unwrap(),
            }
        }
        panic!("{cmd:?} stayed busy for a second");
    }

    impl Drop for Copies {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A process tree as NVIDIA's: `parent` (a shell, in a process group of
    /// its own, run as `uid` if given) starts `server` (a shell named as the
    /// server) as its child. The parent and the server's pid, once the
    /// server runs its own file.
    struct Tree {
        parent: std::process::Child,
        server: u32,
    }

    impl Tree {
        fn start(parent: &std::path::Path, server: &std::path::Path, uid: Option<u32>) -> Tree {
            use std::os::unix::process::CommandExt;
            let mut cmd = std::process::Command::new(parent);
            // `; exit 0`: the shell must not exec sleep in its own place.
            cmd.args(["-c", r#""$0" -c 'sleep 30; exit 0' & wait; exit 0"#]).arg(server).process_group(0);
            if let Some(uid) = uid {
                cmd.uid(uid).gid(uid);
            }
            let mut parent = spawn(&mut cmd);
            let ppid = parent.id();
            let start = std::time::Instant::now();
            // The child counts once it runs the server's file (before its
            // exec it is a copy of the parent).
            let server = loop {
                let found = std::fs::read_dir("/proc").unwrap().flatten().find_map(|e| {
                    let pid: u32 = e.file_name().to_str()?.parse().ok()?;
                    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
                    (parent_of(pid) == Some(ppid) && exe == server).then_some(pid)
                });
                if let Some(pid) = found {
                    break pid;
                }
                if start.elapsed() > std::time::Duration::from_secs(5) {
                    let _ = parent.kill();
                    let _ = parent.wait();
                    panic!("{} started no {}", parent_name(ppid), server.display());
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            };
            Tree { parent, server }
        }
    }

    fn parent_name(pid: u32) -> String {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim_end().to_string()
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            // The whole group: the shells and their sleep.
            let group = format!("-{}", self.parent.id());
            let _ = std::process::Command::new("kill").args(["-KILL", "--", &group]).status();
            let _ = self.parent.kill();
            let _ = self.parent.wait();
        }
    }

    /// A process named as NVIDIA's MPS server is one only if its parent is
    /// root's control daemon: named so, it is a user's forgery when its
    /// parent is the user's own process, or a user's process whose file is
    /// named `nvidia-cuda-mps-control`.
    #[test]
    fn a_process_named_as_the_mps_server_under_a_users_parent_is_no_server() {
        let files = Copies::new("forged", &["nvidia-cuda-mps-control", "nvidia-cuda-mps-server"]);
        let server = files.path("nvidia-cuda-mps-server");
        // Its parent is this test, whatever its user.
        let mut direct = spawn(std::process::Command::new(&server).args(["-c", "sleep 30; exit 0"]));
        std::thread::sleep(std::time::Duration::from_millis(200));
        let name = parent_name(direct.id());
        let direct_uid = mps_server_uid(direct.id());
        let _ = direct.kill();
        let _ = direct.wait();
        assert_eq!(name, "nvidia-cuda-mps", "the forged name is in place");
        assert_eq!(direct_uid, None, "a process named as the MPS server under this test counted as one");
        // Under a copy of the daemon's file run by a user (nobody when
        // this test is root, else this test's own user).
        let root = carma_config::ownership::running_as_root();
        let tree = Tree::start(&files.path("nvidia-cuda-mps-control"), &server, root.then_some(65534));
        assert_eq!(parent_name(tree.server), "nvidia-cuda-mps");
        assert_eq!(
            mps_server_uid(tree.server),
            None,
            "a server started by a user's nvidia-cuda-mps-control counted as an MPS server"
        );
    }

    /// Under root's `nvidia-cuda-mps-control` the server is one (also once
    /// the daemon's file was replaced, as by an upgrade); under a root
    /// process of another file it is not. Needs root (CI runs as root).
    #[test]
    fn a_server_under_roots_mps_control_daemon_is_one() {
        if !carma_config::ownership::running_as_root() {
            eprintln!("skipped: needs root (a root parent for the MPS server)");
            return;
        }
        let names = ["nvidia-cuda-mps-control", "nvidia-cuda-mps-server", "nvidia-cuda-mps-control.old"];
        let files = Copies::new("genuine", &names);
        let server = files.path("nvidia-cuda-mps-server");
        let tree = Tree::start(&files.path("nvidia-cuda-mps-control"), &server, None);
        assert_eq!(mps_server_uid(tree.server), Some(0), "a server under root's nvidia-cuda-mps-control");
        // Replaced while it runs: its exe reads `... (deleted)`.
        std::fs::remove_file(files.path("nvidia-cuda-mps-control")).unwrap();
        let exe = std::fs::read_link(format!("/proc/{}/exe", tree.parent.id())).unwrap();
        assert!(exe.to_string_lossy().ends_with("nvidia-cuda-mps-control (deleted)"), "{}", exe.display());
        assert_eq!(mps_server_uid(tree.server), Some(0), "the daemon's file replaced while it runs");
        drop(tree);
        // A root parent of another name is not NVIDIA's daemon.
        let tree = Tree::start(&files.path("nvidia-cuda-mps-control.old"), &server, None);
        assert_eq!(mps_server_uid(tree.server), None, "a server under root's nvidia-cuda-mps-control.old");
        drop(tree);
        // Nor is root running a file of that name that someone else may
        // change: writable by others or by its group, or a user's own.
        use std::os::unix::fs::PermissionsExt;
        let open = Copies::new("writable", &["nvidia-cuda-mps-control"]);
        let control = open.path("nvidia-cuda-mps-control");
        let tree = Tree::start(&control, &server, None);
        assert_eq!(mps_server_uid(tree.server), Some(0), "the same tree under a file root alone can change");
        for (mode, owner, what) in
            [(0o757, 0, "writable by others"), (0o775, 0, "writable by its group"), (0o755, 65534, "owned by a user")]
        {
            std::os::unix::fs::chown(&control, Some(owner), None).unwrap();
            std::fs::set_permissions(&control, std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(mps_server_uid(tree.server), None, "a server under root's nvidia-cuda-mps-control {what}");
            std::os::unix::fs::chown(&control, Some(0), None).unwrap();
            std::fs::set_permissions(&control, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
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
