//! Node-local state: which job holds which GPUs, with what estimate, since
//! when, under which policy. One JSON file under the configured directory,
//! guarded by an flock with a bounded wait, replaced atomically (temp file +
//! fsync + rename + directory fsync).
//!
//! Read forward-compatibly, because during a package upgrade running steps
//! keep the old plugin and old and new builds write one file: fields this
//! build does not know (top level, per reservation, in the counters) are
//! kept and written back as read; a file of a newer schema version (one an
//! older build cannot read safely) is never rewritten or set aside: every
//! update fails closed with one line until the newer build takes over. A
//! corrupt or unreadable file is moved aside with a log line and the node
//! starts from an empty state.

use carma_config::Policy;
use fs2::FileExt;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::slots::Slots;

/// Raised only when a change is not additive (a field whose meaning an
/// older build would get wrong): new fields are kept by older builds
/// anyway, and a raised version makes every older build refuse the file.
pub const STATE_VERSION: u32 = 1;
const STATE_FILE: &str = "state.json";
const LOCK_FILE: &str = "state.lock";
/// Far above any real state (64 GPUs × hundreds of jobs is ~100 KiB).
const MAX_STATE_BYTES: u64 = 16 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Holding {
    /// Placed by CARMA.
    Carma,
    /// Whole GPUs Slurm gave a job that does not use CARMA: never shared.
    SlurmWhole,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reservation {
    pub job: u32,
    /// The node's GPU indices (never a count); older state files say `gpus`.
    #[serde(rename = "gpu_indices", alias = "gpus")]
    pub gpus: Vec<u32>,
    /// Memory held per GPU, MiB: the promise (estimate and headroom), or the
    /// whole GPU for exclusive holdings. On disk still `estimate_mib`, the name
    /// older builds read and write.
    #[serde(rename = "estimate_mib")]
    pub reserved_mib: u64,
    /// Which estimator source decided the estimate (declared, gpumemnet, ...).
    pub estimate_source: String,
    /// No other job may be placed on these GPUs.
    pub exclusive: bool,
    pub holding: Holding,
    pub policy: Option<Policy>,
    /// Unix seconds.
    pub since: u64,
    /// slurmstepd pids of the job's running steps on this node; a
    /// reservation without live holders is released. Empty = a job-level
    /// record (made by the prolog before any step), kept while the job runs.
    pub holders: Vec<u32>,
    /// The job's signature (model file and batch size, from srun/sbatch),
    /// under which its observed peak is remembered.
    #[serde(default)]
    pub signature: Option<String>,
    /// Highest per-GPU memory its processes were seen using (at placement
    /// decisions on this node): a lower bound of its peak.
    #[serde(default)]
    pub observed_mib: u64,
    /// Set for a job placed as an MPS client: its user, whom the GPU's MPS
    /// server will serve (no other user's MPS job may join until it ends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps_uid: Option<u32>,
    /// The model's part of the estimate it came with (the estimate less the
    /// stack's fixed part), where srun/sbatch estimated it from a model:
    /// with its observed peak, an observation of the node's fixed part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_mib: Option<u64>,
    /// The job's user as Slurm says it: whose learned fixed part its
    /// observation moves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
}

impl Reservation {
    /// The job prolog's record of GPUs Slurm allocated to `job` whole.
    pub fn slurm_whole(job: u32, gpus: Vec<u32>, since: u64) -> Reservation {
        Reservation {
            job,
            gpus,
            reserved_mib: 0,
            estimate_source: "slurm".into(),
            exclusive: true,
            holding: Holding::SlurmWhole,
            policy: None,
            since,
            holders: vec![],
            signature: None,
            observed_mib: 0,
            mps_uid: None,
            model_mib: None,
            uid: None,
        }
    }
}

/// The node's state. Read and written through [`wire`], which keeps the
/// fields a newer build wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeState {
    pub version: u32,
    /// Unix milliseconds of the last garbage collection.
    pub last_gc_ms: u64,
    /// Next GPU index the round-robin policy starts from.
    pub rr_cursor: u32,
    pub reservations: Vec<Reservation>,
    /// Observed peaks of ended jobs by signature, MiB (the `history`
    /// estimate). At most HISTORY_MAX entries.
    pub history: BTreeMap<String, u64>,
    /// When each signature of `history` was last used or raised, in the
    /// node's order of uses (missing: before any), for trimming the least
    /// recently used.
    pub history_used: BTreeMap<String, u64>,
    /// Ended jobs' observed peaks less their model parts, by user (the
    /// learned fixed memory, `learned.rs`).
    pub runtime_by_user: crate::learned::ByUser,
    /// Observations from before they were kept per user: read (so such a
    /// file loads) and dropped, since nobody knows whose they were.
    pub runtime_samples: Vec<u64>,
    /// What this node's placements came to, since the state file was made
    /// (carma-monitor exports them as counters).
    pub counters: Counters,
    /// Per job, what each of its later steps (by holder) added to the
    /// job's promise (`reserved_mib`), taken back when the step ends
    /// (see `decide::join`).
    pub step_parts: BTreeMap<u32, BTreeMap<u32, u64>>,
    /// Per job, its batch step's holder, where the batch step holds.
    pub batch_steps: BTreeMap<u32, u32>,
    /// Top-level fields a newer build wrote, kept as read.
    pub unknown: Unknown,
    /// Per job, the fields of its reservation that a newer build wrote,
    /// kept as read (here, so that [`Reservation`] stays a plain struct);
    /// dropped with the job's reservation.
    pub unknown_per_job: BTreeMap<u32, Unknown>,
}

/// Fields this build does not know, as read.
pub type Unknown = serde_json::Map<String, serde_json::Value>;

/// The state file's JSON: [`NodeState`]'s fields, plus whatever fields a
/// newer build added (each object's keys this build does not know are
/// collected by the flattened map and written back as read).
mod wire {
    use super::{BTreeMap, Counters, NodeState, Reservation, Unknown};
    use serde::{Deserialize, Serialize};

    #[derive(Deserialize)]
    struct In {
        version: u32,
        #[serde(default)]
        last_gc_ms: u64,
        rr_cursor: u32,
        reservations: Vec<InReservation>,
        #[serde(default)]
        history: BTreeMap<String, u64>,
        #[serde(default)]
        history_used: BTreeMap<String, u64>,
        #[serde(default)]
        runtime_by_user: crate::learned::ByUser,
        #[serde(default)]
        runtime_samples: Vec<u64>,
        #[serde(default)]
        counters: Counters,
        #[serde(default)]
        step_parts: BTreeMap<u32, BTreeMap<u32, u64>>,
        #[serde(default)]
        batch_steps: BTreeMap<u32, u32>,
        #[serde(flatten)]
        unknown: Unknown,
    }

    #[derive(Deserialize)]
    struct InReservation {
        #[serde(flatten)]
        known: Reservation,
        #[serde(flatten)]
        unknown: Unknown,
    }

    #[derive(Serialize)]
    struct Out<'a> {
        version: u32,
        last_gc_ms: u64,
        rr_cursor: u32,
        reservations: Vec<OutReservation<'a>>,
        history: &'a BTreeMap<String, u64>,
        #[serde(skip_serializing_if = "BTreeMap::is_empty")]
        history_used: &'a BTreeMap<String, u64>,
        #[serde(skip_serializing_if = "BTreeMap::is_empty")]
        runtime_by_user: &'a crate::learned::ByUser,
        counters: &'a Counters,
        #[serde(skip_serializing_if = "BTreeMap::is_empty")]
        step_parts: &'a BTreeMap<u32, BTreeMap<u32, u64>>,
        #[serde(skip_serializing_if = "BTreeMap::is_empty")]
        batch_steps: &'a BTreeMap<u32, u32>,
        #[serde(flatten)]
        unknown: &'a Unknown,
    }

    #[derive(Serialize)]
    struct OutReservation<'a> {
        #[serde(flatten)]
        known: &'a Reservation,
        #[serde(flatten)]
        unknown: &'a Unknown,
    }

    impl<'de> Deserialize<'de> for NodeState {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<NodeState, D::Error> {
            let w = In::deserialize(d)?;
            let mut unknown_per_job = BTreeMap::new();
            let reservations = w
                .reservations
                .into_iter()
                .map(|r| {
                    if !r.unknown.is_empty() {
                        unknown_per_job.insert(r.known.job, r.unknown);
                    }
                    r.known
                })
                .collect();
            Ok(NodeState {
                version: w.version,
                last_gc_ms: w.last_gc_ms,
                rr_cursor: w.rr_cursor,
                reservations,
                history: w.history,
                history_used: w.history_used,
                runtime_by_user: w.runtime_by_user,
                runtime_samples: w.runtime_samples,
                counters: w.counters,
                step_parts: w.step_parts,
                batch_steps: w.batch_steps,
                unknown: w.unknown,
                unknown_per_job,
            })
        }
    }

    impl Serialize for NodeState {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let none = Unknown::new();
            Out {
                version: self.version,
                last_gc_ms: self.last_gc_ms,
                rr_cursor: self.rr_cursor,
                reservations: self
                    .reservations
                    .iter()
                    .map(|r| OutReservation { known: r, unknown: self.unknown_per_job.get(&r.job).unwrap_or(&none) })
                    .collect(),
                history: &self.history,
                history_used: &self.history_used,
                runtime_by_user: &self.runtime_by_user,
                counters: &self.counters,
                step_parts: &self.step_parts,
                batch_steps: &self.batch_steps,
                unknown: &self.unknown,
            }
            .serialize(s)
        }
    }
}

/// Upper bounds of the buckets of ended jobs' observed peak / estimate
/// (the last bucket, beyond 2.0, is +Inf).
pub const ACCURACY_BOUNDS: [f64; 9] = [0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0];

/// Counts since the state file was made; a rebuilt state starts them
/// again (Prometheus reads that as a counter reset).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Counters {
    /// Steps and jobs placed (shared or exclusive).
    #[serde(default)]
    pub placements: u64,
    /// Steps that found no GPU at first and waited.
    #[serde(default)]
    pub waits: u64,
    /// Steps that were not placed, by reason (memory, activity, held,
    /// mps_user, gpu_count).
    #[serde(default)]
    pub no_fits: BTreeMap<String, u64>,
    /// Jobs requeued after an out-of-memory crash.
    #[serde(default)]
    pub oom_recoveries: u64,
    /// Ended shared jobs by observed peak / estimate: one count per bucket
    /// of [`ACCURACY_BOUNDS`], then the +Inf bucket (not cumulative).
    #[serde(default)]
    pub accuracy_buckets: Vec<u64>,
    #[serde(default)]
    pub accuracy_sum: f64,
    /// Counters a newer build keeps, as read.
    #[serde(flatten)]
    pub unknown: Unknown,
}

impl Counters {
    /// Counts one ended job's observed peak / estimate.
    pub fn observe_accuracy(&mut self, ratio: f64) {
        if !ratio.is_finite() || ratio < 0.0 {
            return;
        }
        self.accuracy_buckets.resize(ACCURACY_BOUNDS.len() + 1, 0);
        let i = ACCURACY_BOUNDS.iter().position(|b| ratio <= *b).unwrap_or(ACCURACY_BOUNDS.len());
        self.accuracy_buckets[i] += 1;
        self.accuracy_sum += ratio;
    }

    pub fn no_fit(&mut self, reason: &str) {
        *self.no_fits.entry(reason.to_string()).or_insert(0) += 1;
    }
}

/// Bounds the state file: beyond this, the least recently used signature
/// of the user with the most signatures is dropped.
pub const HISTORY_MAX: usize = 4096;

impl Default for NodeState {
    fn default() -> NodeState {
        NodeState {
            version: STATE_VERSION,
            last_gc_ms: 0,
            rr_cursor: 0,
            reservations: Vec::new(),
            history: BTreeMap::new(),
            history_used: BTreeMap::new(),
            runtime_by_user: BTreeMap::new(),
            runtime_samples: Vec::new(),
            counters: Counters::default(),
            step_parts: BTreeMap::new(),
            batch_steps: BTreeMap::new(),
            unknown: Unknown::new(),
            unknown_per_job: BTreeMap::new(),
        }
    }
}

impl NodeState {
    pub fn job(&self, job: u32) -> Option<&Reservation> {
        self.reservations.iter().find(|r| r.job == job)
    }

    pub fn job_mut(&mut self, job: u32) -> Option<&mut Reservation> {
        self.reservations.iter_mut().find(|r| r.job == job)
    }

    /// Drops holders that no longer hold their job (`holds(job, pid)`:
    /// dead, or a reused pid), then reservations left without any whose job no
    /// longer runs on this node; returns the released reservations.
    pub fn collect_garbage(
        &mut self,
        holds: impl Fn(u32, u32) -> bool,
        job_running: impl Fn(u32) -> bool,
    ) -> Vec<Reservation> {
        for r in &mut self.reservations {
            let job = r.job;
            let parts = self.step_parts.get_mut(&job);
            take_back_parts(r, parts, |pid| holds(job, pid));
        }
        // Slurm's whole GPUs stay the job's while Slurm says so, not while
        // a slurmstepd of it runs: an salloc without PrologFlags=Contain has
        // none between its sruns. The job epilog releases them, or the
        // epilog's sweep once Slurm says the job ended.
        let (keep, gone) = std::mem::take(&mut self.reservations)
            .into_iter()
            .partition(|r| r.holding == Holding::SlurmWhole || !r.holders.is_empty() || job_running(r.job));
        self.reservations = keep;
        for r in &gone {
            self.unknown_per_job.remove(&r.job);
            self.step_parts.remove(&r.job);
            self.batch_steps.remove(&r.job);
            self.remember(r);
        }
        gone
    }

    /// Removes one holder of a job; releases the job when none is left.
    pub fn release_holder(&mut self, job: u32, holder: u32) -> Option<Reservation> {
        let parts = self.step_parts.get_mut(&job);
        let r = self.reservations.iter_mut().find(|r| r.job == job)?;
        if !r.holders.contains(&holder) {
            return None;
        }
        take_back_parts(r, parts, |p| p != holder);
        // A CARMA step inside a job Slurm gave whole GPUs ran on them: the
        // GPUs stay the job's until its epilog (an salloc's next srun).
        if r.holders.is_empty() && r.holding != Holding::SlurmWhole { self.release_job(job) } else { None }
    }

    /// Forgets the job's whole-GPU record (the prolog's), if it has one.
    pub fn drop_whole(&mut self, job: u32) -> bool {
        match self.job(job) {
            Some(r) if r.holding == Holding::SlurmWhole => self.release_job(job).is_some(),
            _ => false,
        }
    }

    pub fn release_job(&mut self, job: u32) -> Option<Reservation> {
        let i = self.reservations.iter().position(|r| r.job == job)?;
        let r = self.reservations.remove(i);
        self.unknown_per_job.remove(&job);
        self.step_parts.remove(&job);
        self.batch_steps.remove(&job);
        self.remember(&r);
        Some(r)
    }

    /// Keeps an ended job's observed peak under its signature (the highest
    /// seen over its runs).
    /// Its peak less its model part is an observation of the node's fixed
    /// memory.
    fn remember(&mut self, r: &Reservation) {
        if r.observed_mib == 0 {
            return;
        }
        // How far the estimate was from what the job used: shared
        // reservations only (an exclusive one holds the whole GPU).
        if !r.exclusive && r.reserved_mib > 0 {
            self.counters.observe_accuracy(r.observed_mib as f64 / r.reserved_mib as f64);
        }
        if let (Some(model), Some(uid)) = (r.model_mib, r.uid) {
            crate::learned::observe(&mut self.runtime_by_user, uid, r.observed_mib, model);
        }
        if let Some(sig) = &r.signature {
            self.remember_peak(sig, r.observed_mib);
        }
    }

    /// Raises the peak remembered under `sig` to `mib` (never lowers it).
    pub fn remember_peak(&mut self, sig: &str, mib: u64) {
        let e = self.history.entry(sig.to_string()).or_insert(0);
        *e = (*e).max(mib);
        self.touch_history(sig);
        while self.history.len() > HISTORY_MAX {
            match self.history_victim() {
                Some(k) => {
                    self.history.remove(&k);
                    self.history_used.remove(&k);
                }
                None => break,
            }
        }
    }

    /// Marks `sig` as the most recently used signature.
    pub fn touch_history(&mut self, sig: &str) {
        let tick = self.history_used.values().max().copied().unwrap_or(0) + 1;
        self.history_used.insert(sig.to_string(), tick);
        // Uses of signatures trimmed since (or never kept) are not kept.
        let history = &self.history;
        self.history_used.retain(|k, _| history.contains_key(k));
    }

    /// The signature to drop from a full history: the least recently used
    /// of the user who has the most, so that one user's many signatures
    /// evict only that user's. Signatures are `uid:hash` (resolve.rs).
    fn history_victim(&self) -> Option<String> {
        fn owner(k: &str) -> &str {
            k.split_once(':').map_or("", |(uid, _)| uid)
        }
        let used = |k: &str| self.history_used.get(k).copied().unwrap_or(0);
        let mut count: BTreeMap<&str, usize> = BTreeMap::new();
        for k in self.history.keys() {
            *count.entry(owner(k)).or_insert(0) += 1;
        }
        let most = count.values().max().copied()?;
        self.history.keys().filter(|k| count[owner(k)] == most).min_by_key(|k| used(k)).cloned()
    }
}

/// Keeps the holders `keep` says, taking back what each one dropped added
/// to the promise.
fn take_back_parts(r: &mut Reservation, mut parts: Option<&mut BTreeMap<u32, u64>>, keep: impl Fn(u32) -> bool) {
    r.holders.retain(|&pid| {
        let kept = keep(pid);
        if !kept && let Some(part) = parts.as_mut().and_then(|p| p.remove(&pid)) {
            r.reserved_mib = r.reserved_mib.saturating_sub(part);
        }
        kept
    });
}

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

pub type Logger = Box<dyn Fn(&str) + Send + Sync>;

/// The state directory and its lock.
pub struct StateStore {
    dir: PathBuf,
    lock_timeout: Duration,
    log: Logger,
    /// `None` if the queue cannot be mapped: steps then wait for the lock.
    slots: Option<Slots>,
    /// Opened once: a step may try the lock several times.
    lock_file: std::sync::OnceLock<File>,
}

impl StateStore {
    /// Opens (creating if needed, mode 0755) the state directory. It must be
    /// owned by the effective user and writable by nobody else: users must
    /// not be able to change what CARMA promised.
    pub fn open(dir: &Path, lock_timeout: Duration, log: Logger) -> Result<StateStore, StateError> {
        if !dir.exists() {
            fs::create_dir_all(dir).map_err(io(format!("creating state_dir {}", dir.display())))?;
            fs::set_permissions(dir, fs::Permissions::from_mode(0o755))
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
                "state_dir {} must be owned by uid {euid} and writable only by it (found uid {}, mode {:o}); fix with chown {euid} and chmod 755",
                dir.display(),
                meta.uid(),
                meta.mode() & 0o7777
            )));
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

    pub fn state_path(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
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

    /// The queue of requests waiting for the lock (see [`crate::slots`]).
    pub fn slots(&self) -> Option<&Slots> {
        self.slots.as_ref()
    }

    /// The lock, waiting at most `wait`.
    fn lock(&self, exclusive: bool, wait: Duration) -> Result<File, StateError> {
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

    /// Reads the state; anything unreadable is moved aside and replaced by
    /// an empty state, with a log line; a newer schema version fails (see
    /// [`StateError::Newer`]). Never drops silently.
    /// The state, and the file's bytes where it was read from one.
    fn load(&self) -> Result<(NodeState, Option<Vec<u8>>), StateError> {
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

    fn encode(state: &NodeState) -> Result<Vec<u8>, StateError> {
        serde_json::to_vec(state)
            .map_err(|e| StateError::Io { what: "encoding state".into(), err: std::io::Error::other(e) })
    }

    fn write(&self, bytes: &[u8]) -> Result<(), StateError> {
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

/// The longest pause between two attempts at a contended lock: how late at
/// most a waiter notices that the lock was released.
const LOCK_POLL_MAX: Duration = Duration::from_millis(10);

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn store() -> (TempDir, StateStore, Arc<Mutex<Vec<String>>>) {
        let d = TempDir::new();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let l2 = lines.clone();
        let s = StateStore::open(
            &d.0,
            Duration::from_millis(300),
            Box::new(move |m| l2.lock().unwrap().push(m.to_string())),
        )
        .unwrap();
        (d, s, lines)
    }

    use crate::test_support::TempDir;

    fn res(job: u32, holder: u32) -> Reservation {
        Reservation {
            job,
            gpus: vec![0],
            reserved_mib: 1000,
            estimate_source: "declared".into(),
            exclusive: false,
            holding: Holding::Carma,
            policy: Some(Policy::Magm),
            since: 1,
            holders: vec![holder],
            signature: None,
            observed_mib: 0,
            mps_uid: None,
            model_mib: None,
            uid: None,
        }
    }

    #[test]
    fn update_persists_atomically_and_round_trips() {
        let (_d, s, _) = store();
        s.update(|st| st.reservations.push(res(7, 1))).unwrap();
        assert_eq!(s.snapshot().unwrap().reservations, vec![res(7, 1)]);
        let names: Vec<_> =
            fs::read_dir(s.dir()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert!(!names.iter().any(|n| n.contains(".tmp.")), "temp file left behind: {names:?}");
    }

    #[test]
    fn an_unchanged_state_is_not_written_again() {
        use std::os::unix::fs::MetadataExt;
        let (_d, s, _) = store();
        s.update(|st| st.reservations.push(res(7, 1))).unwrap();
        let inode = || fs::metadata(s.state_path()).unwrap().ino();
        let first = inode();
        s.update(|_| ()).unwrap();
        assert_eq!(inode(), first, "an unchanged state was replaced");
        s.update(|st| st.rr_cursor += 1).unwrap();
        assert_ne!(inode(), first, "a changed state was not written");
        assert_eq!(s.snapshot().unwrap().rr_cursor, 1);
    }

    #[test]
    fn corrupt_and_truncated_files_are_set_aside_with_a_log_line() {
        for bad in [&b"{\"version\": 1, \"rr_cursor\": 0, \"reserv"[..], b"\x00\xff garbage"] {
            let (_d, s, lines) = store();
            fs::write(s.state_path(), bad).unwrap();
            let st = s.update(|st| st.clone()).unwrap();
            assert_eq!(st, NodeState::default());
            let lines = lines.lock().unwrap();
            assert_eq!(lines.len(), 1, "{lines:?}");
            assert!(lines[0].contains("unreadable") && lines[0].contains("moved to"), "{}", lines[0]);
            assert!(lines[0].contains("recorded holdings are lost"), "the line says what follows: {}", lines[0]);
            let aside = fs::read_dir(s.dir())
                .unwrap()
                .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().contains(".corrupt."))
                .count();
            assert_eq!(aside, 1, "the bad file must be kept for inspection");
            // The rewritten state is valid again.
            assert_eq!(s.snapshot().unwrap(), NodeState::default());
        }
    }

    /// The state file main 8334099 (the previous release) writes.
    const PREVIOUS_RELEASE: &str = include_str!("../testdata/state-8334099.json");

    fn json(path: &Path) -> serde_json::Value {
        serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
    }

    /// Upgrading from the previous release: its file reads with every
    /// holding (MPS user, model part, whole-GPU and exclusive records), and
    /// an update that changes nothing leaves it as it was.
    #[test]
    fn the_previous_releases_state_reads_whole_and_writes_back_the_same() {
        let (_d, s, lines) = store();
        fs::write(s.state_path(), PREVIOUS_RELEASE).unwrap();
        let st = s.update(|st| st.clone()).unwrap();
        assert_eq!(st.reservations.iter().map(|r| r.job).collect::<Vec<_>>(), vec![101, 102, 103]);
        assert_eq!((st.job(101).unwrap().mps_uid, st.job(101).unwrap().model_mib), (Some(1001), Some(6500)));
        assert_eq!(st.job(102).unwrap().holding, Holding::SlurmWhole);
        assert!(st.job(103).unwrap().exclusive);
        assert_eq!((st.rr_cursor, st.counters.placements, st.runtime_samples.len()), (2, 12, 2));
        let mut before: serde_json::Value = serde_json::from_str(PREVIOUS_RELEASE).unwrap();
        // Its node-wide fixed-part samples are read and dropped: nobody
        // knows whose they were (learning is per user now, learned.rs).
        assert!(before.as_object_mut().unwrap().remove("runtime_samples").is_some());
        assert_eq!(json(&s.state_path()), before);
        // A release by this build keeps the others as the old build wrote them.
        s.update(|st| st.release_holder(103, 4300)).unwrap();
        s.update(|st| st.release_holder(103, 4301)).unwrap();
        let after = json(&s.state_path());
        assert_eq!(after["reservations"].as_array().unwrap().len(), 2);
        assert_eq!(after["reservations"][0], before["reservations"][0]);
        assert_eq!(after["reservations"][1], before["reservations"][1]);
        assert!(lines.lock().unwrap().is_empty(), "{:?}", lines.lock().unwrap());
    }

    /// A newer build's additions (same version: additive) survive this
    /// build's writes: top level, per reservation and in the counters.
    #[test]
    fn fields_a_newer_build_added_survive_this_builds_writes() {
        let (_d, s, lines) = store();
        let mut newer: serde_json::Value = serde_json::from_str(PREVIOUS_RELEASE).unwrap();
        newer["node_generation"] = serde_json::json!({"boot": 7});
        newer["reservations"][0]["mps_pipe"] = serde_json::json!("/run/carma/mps-101");
        newer["reservations"][1]["slurm_gres"] = serde_json::json!(["gpu:a100:1"]);
        newer["counters"]["mig_skips"] = serde_json::json!(3);
        fs::write(s.state_path(), serde_json::to_vec(&newer).unwrap()).unwrap();
        // Place one job, release another, move the cursor: a real write.
        s.update(|st| {
            st.reservations.push(res(200, 5000));
            st.rr_cursor = 0;
            st.counters.placements += 1;
        })
        .unwrap();
        s.update(|st| st.release_job(102)).unwrap();
        let after = json(&s.state_path());
        assert_eq!(after["node_generation"], serde_json::json!({"boot": 7}));
        assert_eq!(after["counters"]["mig_skips"], 3);
        assert_eq!(after["counters"]["placements"], 13);
        let job = |j: u64| after["reservations"].as_array().unwrap().iter().find(|r| r["job"] == j).cloned();
        assert_eq!(job(101).unwrap()["mps_pipe"], "/run/carma/mps-101");
        assert_eq!(job(101).unwrap()["mps_uid"], 1001);
        assert!(job(102).is_none(), "released");
        assert!(job(200).unwrap().get("mps_pipe").is_none(), "another job's field stays with its job");
        assert!(lines.lock().unwrap().is_empty());
    }

    /// A newer schema version is left untouched and every update fails
    /// closed with one line that says why: its holdings are never lost.
    #[test]
    fn a_newer_schema_version_fails_closed_and_is_left_untouched() {
        let (_d, s, lines) = store();
        let mut newer: serde_json::Value = serde_json::from_str(PREVIOUS_RELEASE).unwrap();
        newer["version"] = serde_json::json!(STATE_VERSION + 1);
        // A change an older build could not even parse.
        newer["rr_cursor"] = serde_json::json!({"per_partition": {}});
        let bytes = serde_json::to_vec(&newer).unwrap();
        fs::write(s.state_path(), &bytes).unwrap();
        let e = s.update(|st| st.reservations.clear()).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, StateError::Newer { .. }), "{msg}");
        assert!(msg.contains("newer than this build") && !msg.contains('\n'), "{msg}");
        assert!(s.snapshot().is_err());
        assert_eq!(fs::read(s.state_path()).unwrap(), bytes, "the newer file was changed");
        let names: Vec<_> =
            fs::read_dir(s.dir()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert!(!names.iter().any(|n| n.contains(".corrupt.")), "set aside: {names:?}");
        assert!(lines.lock().unwrap().is_empty());
    }

    #[test]
    fn symlinked_state_file_is_not_followed() {
        let (_d, s, lines) = store();
        std::os::unix::fs::symlink("/etc/passwd", s.state_path()).unwrap();
        let st = s.snapshot().unwrap();
        assert_eq!(st, NodeState::default());
        assert!(lines.lock().unwrap()[0].contains("cannot open"));
    }

    #[test]
    fn lock_wait_is_bounded() {
        let (_d, s, _) = store();
        let holder = File::create(s.dir().join(LOCK_FILE)).unwrap();
        holder.lock_exclusive().unwrap();
        let t = Instant::now();
        let e = s.update(|_| ()).unwrap_err();
        assert!(matches!(e, StateError::LockTimeout { .. }), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5));
        assert!(e.to_string().contains("not obtained within"));
        FileExt::unlock(&holder).unwrap();
        s.update(|_| ()).unwrap();
    }

    /// Descriptors of this process open on `path`.
    fn fds_on(path: &Path) -> usize {
        let want = fs::canonicalize(path).unwrap();
        fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
            .filter(|t| *t == want)
            .count()
    }

    #[test]
    fn a_timed_out_lock_wait_leaves_no_descriptor_or_thread_waiting() {
        let (_d, s, _) = store();
        let path = s.dir().join(LOCK_FILE);
        let holder = File::create(&path).unwrap();
        holder.lock_exclusive().unwrap();
        assert_eq!(fds_on(&path), 1);
        assert!(matches!(s.update(|_| ()).unwrap_err(), StateError::LockTimeout { .. }));
        // Only the holder's descriptor: none is left blocked in flock(2)
        // behind the holder, which keeps the lock.
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(fds_on(&path), 1, "a waiter's descriptor outlived its timeout");
        FileExt::unlock(&holder).unwrap();
    }

    /// Only a release wakes the oldest queued owner: a failed attempt at
    /// the lock (every launch of a burst makes one) must not, or waiters
    /// wake, retry and fail in turn, waking each other (it did: 11 flock
    /// calls and 7 futex calls per launch in a 64-launch burst).
    #[test]
    fn a_failed_lock_attempt_wakes_nobody() {
        let (_d, s, _) = store();
        let q = s.slots().expect("the queue is mapped");
        let req = crate::request::Request::declared(Policy::Magm, 1);
        let slot = q.enqueue(crate::request::StepRef { job: 1, holder: std::process::id() }, &req).unwrap();
        let seen = q.generation(slot);
        let holder = File::create(s.dir().join(LOCK_FILE)).unwrap();
        holder.lock_exclusive().unwrap();
        assert!(s.try_exclusive().unwrap().is_none(), "the lock is held");
        assert_eq!(q.generation(slot), seen, "a failed attempt woke the queue");
        FileExt::unlock(&holder).unwrap();
        drop(s.try_exclusive().unwrap().expect("free now"));
        assert_ne!(q.generation(slot), seen, "a release wakes the oldest queued owner");
    }

    #[test]
    fn unsafe_directory_is_refused() {
        let d = TempDir::new();
        fs::set_permissions(&d.0, fs::Permissions::from_mode(0o777)).unwrap();
        let e = StateStore::open(&d.0, Duration::from_secs(1), Box::new(|_| {}))
            .err()
            .expect("world-writable dir accepted");
        assert!(e.to_string().contains("writable only by it"), "{e}");
    }

    #[test]
    fn garbage_collection_and_release() {
        let mut st = NodeState {
            reservations: vec![res(1, 10), res(2, 20), Reservation { holders: vec![30, 31], ..res(3, 30) }],
            ..NodeState::default()
        };
        st.reservations.push(Reservation { holders: vec![], ..res(4, 0) });
        st.reservations.push(Reservation { holders: vec![], ..res(5, 0) });
        // The prolog's record of Slurm's whole GPUs, no step running.
        st.reservations.push(Reservation { holders: vec![], holding: Holding::SlurmWhole, ..res(6, 0) });
        let gone = st.collect_garbage(|_, pid| pid != 20 && pid != 30, |job| job == 4);
        assert_eq!(gone.iter().map(|r| r.job).collect::<Vec<_>>(), vec![2, 5], "jobs 4 and 6 still hold theirs");
        assert!(st.drop_whole(6), "the epilog (or its sweep) releases it");
        // A CARMA step in a job Slurm gave whole GPUs: its end leaves them the job's.
        st.reservations.push(Reservation { holders: vec![70], holding: Holding::SlurmWhole, ..res(7, 0) });
        assert!(st.release_holder(7, 70).is_none());
        assert_eq!(st.job(7).map(|r| (r.holding, r.holders.len())), Some((Holding::SlurmWhole, 0)));
        assert_eq!(st.job(3).unwrap().holders, vec![31]);
        assert!(st.release_holder(1, 99).is_none(), "unknown holder must not release");
        assert_eq!(st.release_holder(1, 10).map(|r| r.job), Some(1));
        assert!(st.job(1).is_none());
    }

    #[test]
    fn ended_jobs_count_their_estimates_accuracy() {
        let mut st = NodeState::default();
        for (job, est, seen) in [(1, 1000, 950), (2, 1000, 1300), (3, 1000, 0), (4, 1000, 5000)] {
            st.reservations.push(Reservation { reserved_mib: est, observed_mib: seen, ..res(job, 10 + job) });
            st.release_job(job);
        }
        // 0.95 in the bucket up to 1.0, 1.3 up to 1.5, 5.0 beyond 2.0; an
        // unobserved job is not counted.
        let c = &st.counters;
        assert_eq!(c.accuracy_buckets, vec![0, 0, 0, 0, 1, 0, 0, 1, 0, 1]);
        assert!((c.accuracy_sum - (0.95 + 1.3 + 5.0)).abs() < 1e-9);
        // Old state files have no counters: they read as zero.
        let old: NodeState = serde_json::from_str(r#"{"version":1,"rr_cursor":0,"reservations":[]}"#).unwrap();
        assert_eq!(old.counters, Counters::default());
    }

    /// #38.4: a full history drops the least recently used signature of
    /// the user with the most, never another user's (it used to drop the
    /// alphabetically smallest key, whoever it belonged to).
    #[test]
    fn a_user_with_many_signatures_evicts_only_their_own_history() {
        let mut st = NodeState::default();
        // uid 1000's signatures sort before the flood's ("1000:" < "9:").
        for i in 0..10 {
            st.remember_peak(&format!("1000:{i:016x}"), 5000 + i);
        }
        st.remember_peak("9:old", 100);
        for i in 0..HISTORY_MAX as u64 {
            st.remember_peak(&format!("9:{i:016x}"), 1);
        }
        assert_eq!(st.history.len(), HISTORY_MAX);
        for i in 0..10 {
            assert_eq!(st.history.get(&format!("1000:{i:016x}")), Some(&(5000 + i)), "another user's history kept");
        }
        assert!(!st.history.contains_key("9:old"), "the flooder's least recently used went first");
        assert_eq!(st.history_used.len(), HISTORY_MAX, "uses kept only for kept signatures");
        // Least recently used, not smallest: a used signature stays.
        // (the flood's first 10 went with "9:old": 11 over the bound)
        assert!(!st.history.contains_key("9:0000000000000009") && st.history.contains_key("9:000000000000000a"));
        st.touch_history("9:000000000000000a");
        st.remember_peak("9:new", 1);
        assert!(st.history.contains_key("9:000000000000000a"));
        assert!(!st.history.contains_key("9:000000000000000b"));
    }
}
