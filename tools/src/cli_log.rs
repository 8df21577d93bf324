//! Log lines of the command-line tools that open the node state (`carma`,
//! `carma-monitor`): to stderr and to carma.yaml's `log_file` (the sink
//! `carma_placement::eventlog` keeps), as a plain `fn(&str)` (the placer's
//! logger type).

use std::path::PathBuf;

/// Where [`log`] also writes; the first call wins.
pub fn set_file(file: Option<PathBuf>) {
    carma_placement::eventlog::set_file(file);
}

pub fn log(msg: &str) {
    eprintln!("{msg}");
    record(msg);
}

/// To the log file (and syslog) only.
pub fn record(msg: &str) {
    carma_placement::eventlog::event(msg);
}
