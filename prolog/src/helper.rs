//! The modes the epilog re-executes itself in as the job's user
//! (`asuser`): reading the tail of the job's output, appending a message
//! to it; the command lines that start them, and the output ends
//! (`SIZE DEV INO PATH`) passed to and from them.

use crate::asuser::run_self_as;
use crate::job_env::{env, job_user};
use crate::paths::{JobFields, Resolved, resolve};
use carma_placement::jobfiles;
use std::ffi::OsString;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

/// Tail of the job output that is scanned: the most a helper reads.
pub const TAIL_BYTES: u64 = 64 * 1024;
pub const HELPER_TIMEOUT: Duration = Duration::from_secs(5);

/// A helper's command line: `lead` arguments, then the job's fields.
pub fn command_args(lead: &[&str]) -> Vec<OsString> {
    lead.iter()
        .map(OsString::from)
        .chain(JobFields::from_slurm_env().to_args().into_iter().map(OsString::from))
        .collect()
}

/// The earlier ends as one helper argument: `SIZE DEV INO PATH` lines.
pub fn earlier_arg(earlier: &[jobfiles::OutputEnd]) -> String {
    earlier.iter().map(|e| format!("{} {} {} {}\n", e.size, e.dev, e.ino, e.path)).collect()
}

/// `SIZE DEV INO PATH`.
pub fn parse_end(text: &str) -> Option<jobfiles::OutputEnd> {
    let mut w = text.splitn(4, ' ');
    let (size, dev, ino) = (w.next()?.parse().ok()?, w.next()?.parse().ok()?, w.next()?.parse().ok()?);
    Some(jobfiles::OutputEnd { dev, ino, size, path: w.next()?.to_string() })
}

/// Splits a helper's arguments into its `n` leading ones and the job fields.
fn parse(args: &[OsString], n: usize) -> Option<(Vec<String>, JobFields)> {
    let a: Vec<String> = args.iter().map(|s| s.to_string_lossy().into_owned()).collect();
    let (lead, rest) = a.split_at_checked(n)?;
    Some((lead.to_vec(), JobFields::from_args(rest)?))
}

/// `--as-user-read-tail PATTERN TAIL EARLIER <job fields>`: resolves the
/// pattern and prints "FILE SIZE DEV INO PATH" and at most TAIL bytes of
/// the file's end, from where EARLIER (the last run's ends) says this
/// file ended if it is the same file and has not shrunk since; or one line
/// saying why not.
pub fn read_tail(args: &[OsString]) -> i32 {
    let Some((lead, fields)) = parse(args, 3) else {
        println!("ERROR helper arguments");
        return 2;
    };
    let path = match resolve(&lead[0], &fields) {
        Resolved::File(p) => p,
        Resolved::NotFound(p) => {
            println!("NOTFOUND {p} does not exist or is not readable by the job's user");
            return 0;
        }
        Resolved::Ambiguous(m) => {
            println!("AMBIGUOUS {m}; not guessing");
            return 0;
        }
    };
    let tail: u64 = lead[1].parse().unwrap_or(0).min(TAIL_BYTES);
    let earlier: Vec<jobfiles::OutputEnd> = lead[2].lines().filter_map(parse_end).collect();
    let read = || -> std::io::Result<(jobfiles::OutputEnd, Vec<u8>)> {
        use std::os::unix::fs::MetadataExt;
        // O_NONBLOCK: a FIFO must not block us; only regular files are read.
        let mut f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&path)?;
        let meta = f.metadata()?;
        if !meta.is_file() {
            return Err(std::io::Error::other("not a regular file"));
        }
        let size = meta.len();
        let run_start =
            earlier.iter().find(|e| e.dev == meta.dev() && e.ino == meta.ino() && e.size <= size).map_or(0, |e| e.size);
        f.seek(SeekFrom::Start(size.saturating_sub(tail).max(run_start)))?;
        let mut buf = Vec::new();
        f.take(tail).read_to_end(&mut buf)?;
        let end = jobfiles::OutputEnd { dev: meta.dev(), ino: meta.ino(), size, path: path.display().to_string() };
        Ok((end, buf))
    };
    match read() {
        Ok((end, buf)) => {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "FILE {} {} {} {}", end.size, end.dev, end.ino, end.path);
            let _ = out.write_all(&buf);
        }
        Err(e) => println!("UNREADABLE {}: {e}", path.display()),
    }
    0
}

/// Tells the user in the job's own output, written with the user's rights.
pub fn append_to_job_output(msg: &str, log: &dyn Fn(&str)) {
    let Ok(user) = job_user() else { return };
    let pattern = [env("SLURM_JOB_STDERR"), env("SLURM_JOB_STDOUT")].into_iter().find(|p| !p.is_empty());
    let Some(pattern) = pattern else { return };
    let args = command_args(&["--as-user-append", &pattern, msg]);
    if let Err(e) = run_self_as(user, &args, 1024, HELPER_TIMEOUT) {
        log(&format!("could not write to the job's output: {e}"));
    }
}

/// `--as-user-append PATTERN MESSAGE <job fields>`
pub fn append(args: &[OsString]) -> i32 {
    let Some((lead, fields)) = parse(args, 2) else { return 2 };
    let Resolved::File(path) = resolve(&lead[0], &fields) else { return 1 };
    let f = std::fs::OpenOptions::new().append(true).custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW).open(path);
    match f {
        Ok(mut f) if f.metadata().is_ok_and(|m| m.is_file()) => {
            // One write(2), so the line stays whole beside the job's own.
            let _ = f.write_all(format!("{}\n", lead[1]).as_bytes());
            0
        }
        _ => 1,
    }
}
