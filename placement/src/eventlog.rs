//! Decision and recovery lines for admins: syslog (when /dev/log exists)
//! and carma.yaml's `log_file`. Failing to log never fails a job.

use once_cell::sync::OnceCell;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

type Syslog = syslog::Logger<syslog::LoggerBackend, syslog::Formatter3164>;
static SYSLOG: OnceCell<Option<Mutex<Syslog>>> = OnceCell::new();

static LOG_FILE: OnceLock<Option<PathBuf>> = OnceLock::new();

/// This process's log file (carma.yaml's `log_file`), for [`event`]; the
/// first call wins (a process serves one carma.yaml).
pub fn set_file(file: Option<PathBuf>) {
    let _ = LOG_FILE.set(file);
}

/// [`record`] to the log file set by [`set_file`], if any.
pub fn event(msg: &str) {
    record(LOG_FILE.get().and_then(|p| p.as_deref()), msg);
}

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

/// Appends one line. The directory is created (0755) if missing; carma.yaml
/// is refused when a user could write it (config's ownership check), and a
/// link or FIFO planted at the file is refused without blocking.
fn append(path: &Path, msg: &str) {
    if let Some(dir) = path.parent() {
        use std::os::unix::fs::DirBuilderExt;
        let _ = std::fs::DirBuilder::new().recursive(true).mode(0o755).create(dir);
    }
    if let Ok(mut f) = crate::fsutil::open_append(path) {
        // One write(2): every slurmstepd and monitor of the node appends to
        // this file, and O_APPEND keeps a single write whole where
        // writeln!'s piece-by-piece writes interleave with another's.
        let line = format!("{} carma[{}]: {msg}\n", rfc3339_utc(SystemTime::now()), std::process::id());
        let _ = f.write_all(line.as_bytes());
    }
}

/// `2026-11-23T11:35:00.123Z`: what admins read and `date -d` parses.
pub fn rfc3339_utc(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (y, m, day) = civil_from_days((secs / 86_400) as i64);
    let s = secs % 86_400;
    format!("{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z", s / 3600, s % 3600 / 60, s % 60, d.subsec_millis())
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian
/// calendar (H. Hinnant's `civil_from_days`): no time zone data needed.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

#[cfg(test)]
mod tests {
    use super::rfc3339_utc;
    use std::time::{Duration, UNIX_EPOCH};

    /// A FIFO (or a link) planted as the log file neither blocks the
    /// writer (slurmstepd) nor is written through.
    #[test]
    fn a_planted_fifo_or_link_is_refused_at_once() {
        let d = crate::test_support::TempDir::new();
        let fifo = d.0.join("carma.log");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let (tx, rx) = std::sync::mpsc::channel();
        let f = fifo.clone();
        std::thread::spawn(move || {
            super::record(Some(&f), "one line");
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(3)).expect("logging to a FIFO blocked");
        let victim = d.0.join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let link = d.0.join("link.log");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        super::record(Some(&link), "one line");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        let plain = d.0.join("sub/carma.log");
        super::record(Some(&plain), "one line");
        assert!(std::fs::read_to_string(&plain).unwrap().ends_with("one line\n"));
    }

    /// Lines appended at once by many writers stay whole (they were
    /// written in pieces, and the pieces of two slurmstepds interleaved).
    #[test]
    fn lines_written_at_once_stay_whole() {
        let d = crate::test_support::TempDir::new();
        let path = d.0.join("carma.log");
        let writers: Vec<_> = (0..8)
            .map(|w| {
                let path = path.clone();
                std::thread::spawn(move || {
                    for i in 0..300 {
                        super::append(&path, &format!("writer {w} line {i} {}", "x".repeat(200)));
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 8 * 300);
        let pid = format!(" carma[{}]: writer ", std::process::id());
        for line in text.lines() {
            let whole = line.len() > 24 && line[24..].starts_with(&pid) && line.ends_with(&"x".repeat(200));
            assert!(whole, "a line came apart: {line}");
        }
    }

    #[test]
    fn timestamps_match_gnu_date() {
        // Expected values from `date -u -d @SECS +%FT%TZ` (leap days, a
        // century that is not a leap year).
        for (secs, want) in [
            (0, "1970-01-01T00:00:00"),
            (951_782_400, "2000-02-29T00:00:00"),
            (1_709_251_199, "2024-02-29T23:59:59"),
            (1_795_434_299, "2026-11-23T11:44:59"),
            (4_107_542_399, "2100-02-28T23:59:59"),
        ] {
            let t = UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(7);
            assert_eq!(rfc3339_utc(t), format!("{want}.007Z"), "{secs}");
        }
    }
}
