//! Requests waiting for the state lock, so that whoever holds it decides
//! them all in one state read and write ("combining"). Without this, a
//! burst of N launches passes the lock N times, one read-decide-write each;
//! with it, the waiters of a burst are decided together, each woken by its
//! answer (see [`crate::wake`]).
//!
//! A ticket is a file `queue/<time>.<job>.<holder>.<pid>.<n>.req` holding
//! the request; the decider answers with `<same>.done` holding the
//! decision, after the state that records it is written. A request that
//! does not fit is left for its owner, which decides it itself and reports
//! why. The queue lives in the root-owned state directory; a ticket whose
//! holder is gone is removed during garbage collection.

use crate::fsutil::open_for_write;
use crate::place::{Decision, Request, StepRef};
use crate::state::{StateError, io};
use serde::{Deserialize, Serialize};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

pub const QUEUE_DIR: &str = "queue";
/// Requests and answers are a few hundred bytes.
const MAX_TICKET_BYTES: u64 = 64 << 10;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    /// `<time>.<job>.<holder>.<pid>.<n>`: sorts by arrival.
    pub name: String,
    dir: PathBuf,
}

#[derive(Serialize, Deserialize)]
struct Wire {
    job: u32,
    holder: u32,
    request: Request,
}

/// Writes `bytes` to `path` atomically (temp + rename), so a decider never
/// reads half a request. No fsync: a request matters only to a live
/// waiter.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StateError> {
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        open_for_write(&tmp, true)?.write_all(bytes)?;
        fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = fs::remove_file(&tmp);
        StateError::Io { what: format!("writing {}", path.display()), err: e }
    })
}

impl Ticket {
    fn path(&self, ext: &str) -> PathBuf {
        self.dir.join(format!("{}.{ext}", self.name))
    }

    /// Queues the request of `step` in `state_dir`.
    pub fn enqueue(state_dir: &Path, step: StepRef, req: &Request) -> Result<Ticket, StateError> {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = state_dir.join(QUEUE_DIR);
        let nanos = crate::state::now_nanos();
        let name = format!(
            "{nanos:020}.{}.{}.{}.{}",
            step.job,
            step.holder,
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let t = Ticket { name, dir };
        let wire = Wire { job: step.job, holder: step.holder, request: req.clone() };
        let bytes = serde_json::to_vec(&wire).map_err(|e| StateError::Io {
            what: "encoding a placement request".into(),
            err: std::io::Error::other(e),
        })?;
        match write_atomic(&t.path("req"), &bytes) {
            Err(StateError::Io { err, .. }) if err.kind() == std::io::ErrorKind::NotFound => {
                // The first request on this node: make the queue directory.
                match fs::create_dir(&t.dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(StateError::Io { what: format!("creating {}", t.dir.display()), err: e }),
                }
                write_atomic(&t.path("req"), &bytes)?;
            }
            other => other?,
        }
        Ok(t)
    }

    /// The answer a decider left, consumed. An answer still being written
    /// does not parse yet and is left for the next look (its writer wakes
    /// us when done).
    pub fn take_answer(&self) -> Option<Decision> {
        let path = self.path("done");
        let bytes = crate::fsutil::read_bounded(&path, MAX_TICKET_BYTES).ok()??;
        let d = serde_json::from_slice(&bytes).ok()?;
        let _ = fs::remove_file(&path);
        Some(d)
    }

    /// Answers this ticket (the state recording `d` is already written),
    /// then takes it off the queue. Written in place, not renamed: the
    /// owner reads only a complete answer (see `take_answer`).
    pub fn answer(&self, d: &Decision) -> Result<(), StateError> {
        let path = self.path("done");
        let bytes = serde_json::to_vec(d)
            .map_err(|e| StateError::Io { what: "encoding a decision".into(), err: std::io::Error::other(e) })?;
        open_for_write(&path, true)
            .and_then(|mut f| f.write_all(&bytes))
            .map_err(io(format!("writing {}", path.display())))?;
        fs::remove_file(self.path("req")).map_err(io(format!("removing {}", self.path("req").display())))
    }

    /// The owner got its answer: the request is normally gone already
    /// (removed by the decider), unless removing it failed.
    pub fn answered(&self) {
        let _ = fs::remove_file(self.path("req"));
    }

    /// The owner is done with the ticket, whatever happened.
    pub fn withdraw(&self) {
        let _ = fs::remove_file(self.path("req"));
        let _ = fs::remove_file(self.path("done"));
    }

    fn holder(&self) -> Option<u32> {
        self.name.split('.').nth(2)?.parse().ok()
    }
}

/// Queued requests in arrival order. Unreadable tickets are removed with
/// a log line (they can only come from a crash mid-write or tampering by
/// root).
pub fn pending(state_dir: &Path, log: &dyn Fn(&str)) -> Vec<(Ticket, StepRef, Request)> {
    let dir = state_dir.join(QUEUE_DIR);
    let Ok(entries) = fs::read_dir(&dir) else { return Vec::new() };
    let mut names: Vec<String> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_suffix(".req")).map(str::to_string))
        .collect();
    names.sort();
    names
        .into_iter()
        .filter_map(|name| {
            let t = Ticket { name, dir: dir.clone() };
            let parsed = match crate::fsutil::read_bounded(&t.path("req"), MAX_TICKET_BYTES) {
                Ok(None) => return None, // withdrawn meanwhile
                Ok(Some(b)) => serde_json::from_slice::<Wire>(&b).map_err(|e| e.to_string()),
                Err(e) => Err(e),
            };
            match parsed {
                Ok(w) => Some((t, StepRef { job: w.job, holder: w.holder }, w.request)),
                Err(e) => {
                    log(&format!("placement request {} unreadable ({e}); removed", t.path("req").display()));
                    t.withdraw();
                    None
                }
            }
        })
        .collect()
}

/// The name of the oldest queued request, if any.
pub fn oldest(state_dir: &Path) -> Option<String> {
    fs::read_dir(state_dir.join(QUEUE_DIR))
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_suffix(".req")).map(str::to_string))
        .min()
}

/// Removes tickets and answers whose holder is gone.
pub fn sweep(state_dir: &Path, alive: &dyn Fn(u32) -> bool) {
    let dir = state_dir.join(QUEUE_DIR);
    let Ok(entries) = fs::read_dir(&dir) else { return };
    for e in entries.flatten() {
        let Some(name) = e.file_name().to_str().map(str::to_string) else { continue };
        let stem = name.rsplit_once('.').map_or(name.as_str(), |(s, _)| s).to_string();
        let t = Ticket { name: stem, dir: dir.clone() };
        if t.holder().is_some_and(|h| !alive(h)) {
            let _ = fs::remove_file(e.path());
        }
    }
}
