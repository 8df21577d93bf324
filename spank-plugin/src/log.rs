//! Plugin log lines, every one prefixed with `carma: `. In srun/sbatch they
//! reach the user's terminal; in slurmstepd, slurmd's log. Placement
//! decisions also go to syslog (if /dev/log exists) and to carma.yaml's
//! `log_file`; neither failing ever fails a job.

use crate::spank::{LogLevel, slurm_log};
use once_cell::sync::OnceCell;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Mutex;

pub fn error(msg: &str) {
    slurm_log(LogLevel::Error, &format!("carma: {msg}"));
}

pub fn info(msg: &str) {
    slurm_log(LogLevel::Info, &format!("carma: {msg}"));
}

pub fn debug(msg: &str) {
    slurm_log(LogLevel::Debug, &format!("carma: {msg}"));
}

type Syslog = syslog::Logger<syslog::LoggerBackend, syslog::Formatter3164>;
static SYSLOG: OnceCell<Option<Mutex<Syslog>>> = OnceCell::new();
static LOG_FILE: OnceCell<Option<PathBuf>> = OnceCell::new();

/// Sets the optional log file (from carma.yaml) once per process.
pub fn set_log_file(path: Option<PathBuf>) {
    let _ = LOG_FILE.set(path);
}

/// A decision or state change: Slurm's log, syslog and the log file.
pub fn event(msg: &str) {
    info(msg);
    let syslog = SYSLOG.get_or_init(|| {
        let f = syslog::Formatter3164 {
            facility: syslog::Facility::LOG_DAEMON,
            hostname: None,
            process: "carma".into(),
            pid: std::process::id(),
        };
        syslog::unix(f).ok().map(Mutex::new)
    });
    if let Some(l) = syslog {
        if let Ok(mut l) = l.lock() {
            let _ = l.info(msg);
        }
    }
    if let Some(Some(path)) = LOG_FILE.get() {
        append(path, msg);
    }
}

fn append(path: &PathBuf, msg: &str) {
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path);
    if let Ok(mut f) = file {
        let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let _ = writeln!(f, "{secs} carma[{}]: {msg}", std::process::id());
    }
}
