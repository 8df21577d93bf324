//! The state file: read forward-compatibly, written atomically (temp file
//! + fsync + rename + directory fsync).
//!
//! Read forward-compatibly because during a package upgrade running steps
//! keep the old plugin and old and new builds write one file: fields this
//! build does not know (top level, per reservation, in the counters) are
//! kept and written back as read; a file of a newer schema version (one an
//! older build cannot read safely) is never rewritten or set aside: every
//! update fails closed with one line until the newer build takes over. A
//! corrupt or unreadable file is moved aside with a log line and the node
//! starts from an empty state.

use super::{NodeState, STATE_VERSION, StateError, StateStore};
use serde::Deserialize;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

const STATE_FILE: &str = "state.json";
/// Far above any real state (64 GPUs × hundreds of jobs is ~100 KiB).
const MAX_STATE_BYTES: u64 = 16 << 20;

impl StateStore {
    pub fn state_path(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }

    /// Reads the state; anything unreadable is moved aside and replaced by
    /// an empty state, with a log line; a newer schema version fails (see
    /// [`StateError::Newer`]). Never drops silently.
    /// The state, and the file's bytes where it was read from one.
    pub(super) fn load(&self) -> Result<(NodeState, Option<Vec<u8>>), StateError> {
        let path = self.state_path();
        let text = match crate::fsutil::read_bounded(&path, MAX_STATE_BYTES) {
            Ok(Some(t)) => t,
            Ok(None) => return Ok((NodeState::default(), None)),
            Err(e) => return Ok((self.set_aside(&path, &e), None)),
        };
        // The version first: a newer schema may not parse as this one.
        #[derive(Deserialize)]
        struct Version {
            version: u32,
        }
        if let Ok(Version { version }) = serde_json::from_slice::<Version>(&text)
            && version > STATE_VERSION
        {
            return Err(StateError::Newer { path, version });
        }
        match serde_json::from_slice::<NodeState>(&text) {
            // An older version's fields read as this one's (new fields
            // default); it is written back as this version.
            Ok(mut s) => {
                s.version = STATE_VERSION;
                Ok((s, Some(text)))
            }
            Err(e) => Ok((self.set_aside(&path, &format!("not valid state JSON ({e})")), None)),
        }
    }

    fn set_aside(&self, path: &Path, why: &str) -> NodeState {
        let stamp = crate::clock::now_nanos();
        let aside = self.dir.join(format!("{STATE_FILE}.corrupt.{stamp}"));
        // What an empty state means: GPUs in use still count by their live
        // memory, activity and processes, but the holdings the file
        // recorded (whole-GPU and exclusive ones included) are gone until
        // their jobs' next steps record them again.
        let after =
            "starting from an empty state: recorded holdings are lost (GPUs in use still count by their live readings)";
        match fs::rename(path, &aside) {
            Ok(()) => (self.log)(&format!(
                "state file {} unreadable: {why}; moved to {}; {after}",
                path.display(),
                aside.display()
            )),
            Err(e) => (self.log)(&format!(
                "state file {} unreadable: {why}; could not move it aside ({e}); {after}",
                path.display()
            )),
        }
        NodeState::default()
    }

    pub(super) fn encode(state: &NodeState) -> Result<Vec<u8>, StateError> {
        serde_json::to_vec(state)
            .map_err(|e| StateError::Io { what: "encoding state".into(), err: std::io::Error::other(e) })
    }

    pub(super) fn write(&self, bytes: &[u8]) -> Result<(), StateError> {
        let path = self.state_path();
        let tmp = self.dir.join(format!("{STATE_FILE}.tmp.{}", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut f = crate::fsutil::open_for_write(&tmp, true)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            fs::rename(&tmp, &path)?;
            File::open(&self.dir)?.sync_all()
        };
        write().map_err(|e| {
            let _ = fs::remove_file(&tmp);
            StateError::Io { what: format!("writing {}", path.display()), err: e }
        })
    }
}
