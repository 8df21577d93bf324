//! Running a piece of work with a job user's credentials: files that users
//! name (their job's output) are never opened by root. The epilog re-executes
//! its own binary with the user's uid and gid (std drops root's
//! supplementary groups), no shell, bounded output and time.

use std::ffi::OsString;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
}

/// Runs this executable as `user` with `args`; returns its stdout (at most
/// `limit` bytes). The child is killed after `timeout`.
pub fn run_self_as(user: User, args: &[OsString], limit: usize, timeout: Duration) -> Result<Vec<u8>, String> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own executable: {e}"))?;
    let mut child = Command::new(exe)
        .args(args)
        .uid(user.uid)
        .gid(user.gid)
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start helper as uid {}: {e}", user.uid))?;
    let mut out = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = (&mut out).take(limit as u64).read_to_end(&mut buf);
        buf
    });
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if start.elapsed() < timeout => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("helper as uid {} timed out after {:?}", user.uid, timeout));
            }
        }
    }
    reader.join().map_err(|_| "helper output reader failed".to_string())
}
