//! Decision and recovery lines for admins: syslog (when /dev/log exists)
//! and carma.yaml's `log_file`. Failing to log never fails a job.

use once_cell::sync::OnceCell;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Mutex;

type Syslog = syslog::Logger<syslog::LoggerBackend, syslog::Formatter3164>;
static SYSLOG: OnceCell<Option<Mutex<Syslog>>> = OnceCell::new();

/// Writes `msg` to syslog and, if given, appends it to `log_file`.
pub fn record(log_file: Option<&Path>, msg: &str) {
    let syslog = SYSLOG.get_or_init(|| {
        let f = syslog::Formatter3164 {
            facility: syslog::Facility::LOG_DAEMON,
            hostname: None,
            process: "carma".into(),
            pid: std::process::id(),
        };
        syslog::unix(f).ok().map(Mutex::new)
    });
    if let Some(Ok(mut l)) = syslog.as_ref().map(Mutex::lock) {
        let _ = l.info(msg);
    }
    if let Some(path) = log_file {
        append(path, msg);
    }
}

fn append(path: &Path, msg: &str) {
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
        let secs = crate::state::now_secs();
        let _ = writeln!(f, "{secs} carma[{}]: {msg}", std::process::id());
    }
}
