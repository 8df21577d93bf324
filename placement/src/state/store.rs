//! The state directory: opened (and checked) once, then every read and
//! update of the state goes through it.

use super::{NodeState, StateError, io};
use crate::slots::Slots;
use std::fs::{self, File};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub type Logger = Box<dyn Fn(&str) + Send + Sync>;

/// The state directory's mode: its owner's only (see [`StateStore::open`]).
pub const DIR_MODE: u32 = 0o700;

/// At most this many entries are looked at when tightening an old state
/// directory (a node has a few files per running job).
const TIGHTEN_MAX: usize = 100_000;

/// Makes a state directory that others may enter (mode `found`, from a
/// build before issue 58) its owner's only, then each of its owner's
/// regular files that others could open: mode 0600. The directory first:
/// from then on no user opens anything new in it. A descriptor a user
/// opened before stays valid until that process ends.
fn tighten(dir: &Path, found: u32, euid: u32, log: &Logger) -> Result<(), StateError> {
    let private = fs::Permissions::from_mode(crate::fsutil::PRIVATE_FILE_MODE);
    fs::set_permissions(dir, fs::Permissions::from_mode(DIR_MODE))
        .map_err(io(format!("chmod 700 state_dir {}", dir.display())))?;
    let mut files = 0;
    for entry in fs::read_dir(dir).map_err(io(format!("listing state_dir {}", dir.display())))?.take(TIGHTEN_MAX) {
        let Ok(entry) = entry else { continue };
        // Not through a link: lstat, and only the owner's regular files
        // (nobody else could write into the directory).
        let Ok(m) = fs::symlink_metadata(entry.path()) else { continue };
        if m.is_file()
            && m.uid() == euid
            && m.mode() & 0o077 != 0
            && fs::set_permissions(entry.path(), private.clone()).is_ok()
        {
            files += 1;
        }
    }
    log(&format!(
        "state_dir {} was mode {:o}, which lets any user open its lock and stall placement: made it 700 and {files} of its files 600",
        dir.display(),
        found & 0o7777
    ));
    Ok(())
}

/// The state directory and its lock.
pub struct StateStore {
    pub(super) dir: PathBuf,
    pub(super) lock_timeout: Duration,
    pub(super) log: Logger,
    /// `None` if the queue cannot be mapped: steps then wait for the lock.
    pub(super) slots: Option<Slots>,
    /// Opened once: a step may try the lock several times.
    pub(super) lock_file: std::sync::OnceLock<File>,
}

impl StateStore {
    /// Opens (creating if needed, mode 0700) the state directory. It must be
    /// owned by the effective user and writable by nobody else: users must
    /// not be able to change what CARMA promised. Nor may they enter it: a
    /// user who can open `state.lock` can hold its flock (a read descriptor
    /// suffices) and stall every placement and release here (issue 58). A
    /// directory others may enter (an earlier build made it 0755) is
    /// tightened, with its files, and logged.
    pub fn open(dir: &Path, lock_timeout: Duration, log: Logger) -> Result<StateStore, StateError> {
        if !dir.exists() {
            fs::create_dir_all(dir).map_err(io(format!("creating state_dir {}", dir.display())))?;
            fs::set_permissions(dir, fs::Permissions::from_mode(DIR_MODE))
                .map_err(io(format!("chmod state_dir {}", dir.display())))?;
        }
        let meta = fs::symlink_metadata(dir).map_err(io(format!("state_dir {}", dir.display())))?;
        // SAFETY: geteuid touches no memory and cannot fail.
        #[allow(unsafe_code)]
        let euid = unsafe { libc::geteuid() };
        if !meta.is_dir() {
            return Err(StateError::Dir(format!("state_dir {} is not a directory", dir.display())));
        }
        if meta.uid() != euid || meta.mode() & 0o022 != 0 {
            return Err(StateError::Dir(format!(
                "state_dir {} must be owned by uid {euid} and writable only by it (found uid {}, mode {:o}); fix with chown {euid} and chmod 700",
                dir.display(),
                meta.uid(),
                meta.mode() & 0o7777
            )));
        }
        if meta.mode() & 0o077 != 0 {
            tighten(dir, meta.mode(), euid, &log)?;
        }
        Ok(StateStore {
            dir: dir.to_path_buf(),
            lock_timeout,
            log,
            slots: Slots::open(dir),
            lock_file: std::sync::OnceLock::new(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Runs `f` on the state under the exclusive lock; writes the state back
    /// atomically if `f` changed it. The lock wait is bounded.
    pub fn update<T>(&self, f: impl FnOnce(&mut NodeState) -> T) -> Result<T, StateError> {
        let mut lock = self.exclusive()?;
        let mut state = lock.load()?;
        let out = f(&mut state);
        lock.store(&state)?;
        Ok(out)
    }

    /// A consistent snapshot under a shared lock (for status displays).
    pub fn snapshot(&self) -> Result<NodeState, StateError> {
        let _lock = self.lock(false, self.lock_timeout)?;
        Ok(self.load()?.0)
    }

    /// The queue of requests waiting for the lock (see [`crate::slots`]).
    pub fn slots(&self) -> Option<&Slots> {
        self.slots.as_ref()
    }
}
