//! The state's flock: exclusive for updates, shared for snapshots, always
//! with a bounded wait; releasing it wakes the oldest queued request.

use super::{NodeState, StateError, StateStore, io};
use fs2::FileExt;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub(super) const LOCK_FILE: &str = "state.lock";

/// The longest pause between two attempts at a contended lock: how late at
/// most a waiter notices that the lock was released.
const LOCK_POLL_MAX: Duration = Duration::from_millis(10);

impl StateStore {
    pub fn lock_path(&self) -> PathBuf {
        self.dir.join(LOCK_FILE)
    }

    pub fn lock_timeout(&self) -> Duration {
        self.lock_timeout
    }

    /// The exclusive lock, waiting at most the configured time.
    pub fn exclusive(&self) -> Result<Locked<'_>, StateError> {
        let file = self.lock(true, self.lock_timeout)?;
        Ok(Locked { store: self, file: LockFile::Own(file), loaded: None })
    }

    /// The exclusive lock if nobody holds the lock now. Tried on a file
    /// kept open, so a retry costs one system call. (Only for a lock that
    /// is never waited for: a helper thread left blocking on a shared
    /// descriptor could not release what it got.)
    pub fn try_exclusive(&self) -> Result<Option<Locked<'_>>, StateError> {
        let file = match self.lock_file.get() {
            Some(f) => f,
            None => {
                let path = self.lock_path();
                let f = crate::fsutil::open_for_write(&path, false)
                    .map_err(|e| StateError::Io { what: format!("opening {}", path.display()), err: e })?;
                self.lock_file.get_or_init(|| f)
            }
        };
        // Lazily: a Locked built for a failed attempt would, when dropped,
        // unlock and wake the oldest queued owner for nothing.
        let got = match file.try_lock_exclusive() {
            Ok(()) => true,
            r => try_got(r, &self.lock_path())?,
        };
        Ok(got.then(|| Locked { store: self, file: LockFile::Kept(file), loaded: None }))
    }

    /// The lock, waiting at most `wait`.
    pub(super) fn lock(&self, exclusive: bool, wait: Duration) -> Result<File, StateError> {
        let path = self.dir.join(LOCK_FILE);
        let file = crate::fsutil::open_for_write(&path, false).map_err(io(format!("opening {}", path.display())))?;
        // Non-blocking attempts until the deadline: a blocking flock(2)
        // cannot be cancelled, so a thread left waiting in it (and its
        // descriptor) would outlive the timeout for as long as a hung
        // holder keeps the lock. Giving up drops the descriptor; nothing is
        // left behind. Placement bursts queue in `slots` instead, woken at
        // once; these waits (releases, reads) are rare and short.
        let start = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            if try_got(if exclusive { file.try_lock_exclusive() } else { FileExt::try_lock_shared(&file) }, &path)? {
                return Ok(file);
            }
            let waited = start.elapsed();
            if waited >= wait {
                return Err(StateError::LockTimeout { path, waited });
            }
            std::thread::sleep(pause.min(wait - waited));
            pause = (pause * 2).min(LOCK_POLL_MAX);
        }
    }
}

/// A non-blocking flock's outcome: taken, or held by someone else.
fn try_got(r: std::io::Result<()>, path: &Path) -> Result<bool, StateError> {
    match r {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.raw_os_error() == Some(libc::EWOULDBLOCK) => {
            Ok(false)
        }
        Err(e) => Err(StateError::Io { what: format!("locking {}", path.display()), err: e }),
    }
}

enum LockFile<'a> {
    Own(File),
    Kept(&'a File),
}

/// The exclusive lock on the state, held until dropped.
pub struct Locked<'a> {
    store: &'a StateStore,
    file: LockFile<'a>,
    /// The bytes `load` read (or `store` wrote), to skip writing a state
    /// that encodes the same: comparing bytes costs less than keeping a
    /// copy of the state to compare with.
    loaded: Option<Vec<u8>>,
}

impl Drop for Locked<'_> {
    /// Unlocks, then wakes the owner of the oldest queued request: it
    /// takes the lock next and decides the queue.
    fn drop(&mut self) {
        let _ = match &self.file {
            LockFile::Own(f) => FileExt::unlock(f),
            LockFile::Kept(f) => FileExt::unlock(*f),
        };
        if let Some(q) = &self.store.slots {
            q.wake_oldest();
        }
    }
}

impl Locked<'_> {
    /// Reads the state (moving a corrupt file aside; see StateStore::load).
    pub fn load(&mut self) -> Result<NodeState, StateError> {
        let (state, bytes) = self.store.load()?;
        self.loaded = bytes;
        Ok(state)
    }

    /// Writes the state atomically unless it equals what is on disk.
    pub fn store(&mut self, state: &NodeState) -> Result<(), StateError> {
        let bytes = StateStore::encode(state)?;
        if self.loaded.as_ref() == Some(&bytes) && self.store.state_path().exists() {
            return Ok(());
        }
        self.store.write(&bytes)?;
        self.loaded = Some(bytes);
        Ok(())
    }
}
