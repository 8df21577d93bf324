//! Log lines of the command-line tools that open the node state (`carma`,
//! `carma-monitor`): to stderr and to carma.yaml's `log_file`, as a plain
//! `fn(&str)` (the placer's logger type).

use std::path::PathBuf;
use std::sync::OnceLock;

static LOG_FILE: OnceLock<Option<PathBuf>> = OnceLock::new();

/// Where [`log`] also writes; the first call wins.
pub fn set_file(file: Option<PathBuf>) {
    let _ = LOG_FILE.set(file);
}

pub fn log(msg: &str) {
    eprintln!("{msg}");
    record(msg);
}

/// To the log file (and syslog) only.
pub fn record(msg: &str) {
    carma_placement::eventlog::record(LOG_FILE.get().and_then(|p| p.as_deref()), msg);
}
