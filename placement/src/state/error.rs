//! Why the state could not be read, written or locked.

use super::STATE_VERSION;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug)]
pub enum StateError {
    /// The lock was not obtained within the configured time.
    LockTimeout {
        path: PathBuf,
        waited: Duration,
    },
    /// The state directory is missing, unsafe or unwritable.
    Dir(String),
    /// The state file has a schema version newer than this build reads: a
    /// newer CARMA wrote it. It is left as it is (never set aside: that
    /// would forget the holdings it records).
    Newer {
        path: PathBuf,
        version: u32,
    },
    Io {
        what: String,
        err: std::io::Error,
    },
}

impl std::fmt::Display for StateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateError::LockTimeout { path, waited } => write!(
                f,
                "state lock {} not obtained within {:.1}s (another process holds it; raise timeouts.lock or find the holder with `fuser {}`)",
                path.display(),
                waited.as_secs_f64(),
                path.display()
            ),
            StateError::Dir(m) => f.write_str(m),
            StateError::Newer { path, version } => write!(
                f,
                "state file {} has schema version {version}, newer than this build of CARMA reads ({STATE_VERSION}): refusing to place or release with it (finish upgrading the carma package on this node; the file is left untouched)",
                path.display()
            ),
            StateError::Io { what, err } => write!(f, "{what}: {err}"),
        }
    }
}

impl std::error::Error for StateError {}

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> StateError {
    let what = what.into();
    move |err| StateError::Io { what, err }
}
