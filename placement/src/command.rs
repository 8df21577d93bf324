//! Slurm's commands (scontrol, squeue) run by CARMA's root parts: fixed
//! arguments, never a shell, bounded in time and in what is read back.

use std::ffi::OsStr;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// More output than this is not read (a job's or node's record is a few KiB).
const MAX_OUTPUT: u64 = 1 << 20;

/// squeue's first argument wherever CARMA asks about a job of this cluster
/// (every job CARMA asks about runs, or ran, here; a federation, where a
/// requeued job's live record may move to its origin cluster, is not
/// supported for recovery and hand-back): without it each squeue
/// also asks slurmctld for the federation (sdiag: a `REQUEST_FED_INFO`
/// beside `REQUEST_JOB_INFO_SINGLE` and `REQUEST_PARTITION_INFO`, on
/// 22.05 and 26.05), a third of what every call costs slurmctld.
pub const SQUEUE_LOCAL: &str = "--local";

/// The Slurm command `name` (scontrol, squeue) to run: in `bin_dir`
/// (carma.yaml's `slurm_bin_dir`, for a Slurm installed under its own
/// prefix), else the bare name, found through PATH.
pub fn slurm_program(bin_dir: Option<&Path>, name: &str) -> String {
    match bin_dir {
        Some(dir) => dir.join(name).to_string_lossy().into_owned(),
        None => name.to_string(),
    }
}

/// Runs `prog args`, killed after `timeout`; its standard output on
/// success, else one line with its standard error. Output is read while
/// it runs, so a full pipe cannot hold it up. Output that is not UTF-8 is
/// an error, never silently empty (see [`run_bytes`] for raw bytes).
pub fn run(prog: &str, args: &[&str], timeout: Duration) -> Result<String, String> {
    let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    let out = run_bytes(prog, &args, timeout)?;
    String::from_utf8(out).map_err(|_| format!("{} printed output that is not UTF-8", describe(prog, &args)))
}

fn describe(prog: &str, args: &[&OsStr]) -> String {
    let args: Vec<_> = args.iter().map(|a| a.to_string_lossy()).collect();
    format!("{prog} {}", args.join(" "))
}

/// [`run`] with arguments and output as bytes: for fields (and values
/// written back) that may hold any byte.
pub fn run_bytes(prog: &str, args: &[&OsStr], timeout: Duration) -> Result<Vec<u8>, String> {
    let child = Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {prog}: {e}"))?;
    let Some((status, out, err)) = wait_bounded(child, MAX_OUTPUT, timeout) else {
        return Err(format!("{} timed out after {} s", describe(prog, args), timeout.as_secs_f64()));
    };
    if status.success() {
        Ok(out)
    } else {
        let err = String::from_utf8_lossy(&err);
        Err(format!("{} failed ({status}): {}", describe(prog, args), err.trim().replace('\n', " ")))
    }
}

/// [`run_bytes`] within what is left until `deadline`, at most `cap`:
/// calls that share one deadline share its time, and none starts once it
/// has passed.
pub fn run_bytes_by(prog: &str, args: &[&OsStr], deadline: Instant, cap: Duration) -> Result<Vec<u8>, String> {
    let left = deadline.saturating_duration_since(Instant::now()).min(cap);
    if left.is_zero() {
        return Err(format!("no time left for `{}`", describe(prog, args)));
    }
    run_bytes(prog, args, left)
}

/// Waits for `child` at most `timeout`, reading what it writes to its
/// piped stdout and stderr meanwhile (at most `limit` bytes of each, so a
/// full pipe never blocks it); past the bound it is killed and reaped
/// (`None`). A pipe still held open after the child has exited (by a
/// process it left behind) is waited for within the same bound. The Slurm
/// commands and the epilog's as-user reader end here.
pub fn wait_bounded(mut child: Child, limit: u64, timeout: Duration) -> Option<(ExitStatus, Vec<u8>, Vec<u8>)> {
    let reader = |pipe: Option<Box<dyn Read + Send>>| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(p) = pipe {
                let _ = p.take(limit).read_to_end(&mut bytes);
            }
            let _ = tx.send(bytes);
        });
        rx
    };
    let out = reader(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let err = reader(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                // Reaped if it dies within a second: one stuck in the
                // kernel (a hung file system) is left, never waited on.
                let _ = child.kill();
                for _ in 0..200 {
                    if !matches!(child.try_wait(), Ok(None)) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                return None;
            }
        }
    };
    let left = || deadline.saturating_duration_since(Instant::now());
    let out = out.recv_timeout(left()).ok()?;
    let err = err.recv_timeout(left()).ok()?;
    Some((status, out, err))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_failures_and_hangs() {
        let s = Duration::from_secs(5);
        assert_eq!(run("printf", &["a b"], s).unwrap(), "a b");
        let e = run("ls", &["/nonexistent-carma"], s).unwrap_err();
        assert!(e.starts_with("ls /nonexistent-carma failed") && e.contains("No such file"), "{e}");
        let t = Instant::now();
        let e = run("sleep", &["10"], Duration::from_millis(200)).unwrap_err();
        assert!(e.contains("timed out") && t.elapsed() < Duration::from_secs(2), "{e}");
        // A command that exits at once, leaving a process that holds its
        // output open: still bounded.
        let t = Instant::now();
        let e = run("sh", &["-c", "sleep 5 & echo hi"], Duration::from_millis(300)).unwrap_err();
        assert!(e.contains("timed out") && t.elapsed() < Duration::from_secs(2), "{e} after {:?}", t.elapsed());
        // More than a pipe holds, while the command runs.
        let big = run("head", &["-c", "300000", "/dev/zero"], s).unwrap();
        assert_eq!(big.len(), 300000);
        assert!(run("no-such-command-carma", &[], s).unwrap_err().contains("cannot run"));
        // Bytes that are not UTF-8: an error from run (never ""), kept by run_bytes.
        let e = run("printf", &["a\\377b"], s).unwrap_err();
        assert!(e.contains("not UTF-8"), "{e}");
        assert_eq!(run_bytes("printf", &[OsStr::new("a\\377b")], s).unwrap(), b"a\xffb");
    }

    #[test]
    fn slurm_commands_run_from_the_configured_directory() {
        let s = Duration::from_secs(5);
        // A directory holding a `scontrol` that PATH does not reach.
        let dir = std::env::temp_dir().join(format!("carma-slurm-bin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink("/bin/echo", dir.join("scontrol")).unwrap();
        let prog = slurm_program(Some(&dir), "scontrol");
        assert_eq!(prog, dir.join("scontrol").to_string_lossy());
        assert_eq!(run(&prog, &["show", "job", "7"], s).unwrap(), "show job 7\n");
        assert_eq!(slurm_program(None, "squeue"), "squeue");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
