//! Requests waiting for the state lock, so that whoever holds it decides
//! them all in one state read and write ("combining"). Without this, a
//! burst of N launches passes the lock N times, one read-decide-write each.
//!
//! The requests live in `state_dir/queue.slots`, a small root-owned file
//! that every placing process maps: SLOTS fixed-size slots, each a header
//! of atomic words (all headers in the first page, one cache line each, so
//! scanning the queue touches one page) and a payload page. A step that
//! finds the lock taken claims a free slot, writes its request (JSON)
//! there and sleeps on the slot's futex word. The lock holder takes every queued request, decides them
//! with its own, writes the state once, then writes each answer into its
//! slot and wakes its owner: the GPUs it was given, or why none fits (a
//! refusal sent back to be decided again would pass the lock once per
//! refused launch, serially). An answer too large for its slot sends the
//! request back to the queue: its owner decides it itself. Releasing the lock
//! wakes the oldest queued owner, which takes the lock next. No file is
//! created per request and a waiter makes no system call but the futex
//! wait and its lock attempts: a launch burst costs little CPU.
//!
//! The flock stays the only mutual exclusion for the state. A slot's
//! 64-bit tag (claim id and state) changes only by compare-and-swap, so a
//! request is decided at most once and nobody acts on a slot that was
//! freed and claimed again. Slots of dead owners are freed by the periodic
//! garbage collection; a slot left "taken" by a decider that died is put
//! back by the next lock holder.
//!
//! All `unsafe` of the queue is here: the mapping, the atomic views of its
//! header words, payload copies, and the futex system call.

use crate::nofit::NoFit;
use crate::request::{Decision, Request, StepRef};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

pub const SLOTS_FILE: &str = "queue.slots";
pub const SLOTS: usize = 64;
const HEADER: usize = 64;
/// Room for a request or an answer (a request with a 4 KiB signature does
/// not fit: its owner waits for the lock instead).
pub const PAYLOAD: usize = 4096;
const PAYLOADS_AT: usize = SLOTS * HEADER;
const FILE_BYTES: usize = PAYLOADS_AT + SLOTS * PAYLOAD;

// Slot states, the low byte of the tag; the rest is the claim id.
const FREE: u64 = 0;
const CLAIMED: u64 = 1;
const QUEUED: u64 = 2;
const TAKEN: u64 = 3;
const ANSWERED: u64 = 4;

fn tag(id: u64, state: u64) -> u64 {
    id << 8 | state
}

fn state_of(tag: u64) -> u64 {
    tag & 0xff
}

/// The pid that claimed the slot: claim ids are `pid << 24 | counter`, so
/// the owner is part of the tag and a reclaimer's compare-and-swap frees
/// exactly the claim whose owner it found dead.
fn owner_of(tag: u64) -> u32 {
    (tag >> 32) as u32
}

#[derive(Serialize, Deserialize)]
struct Wire {
    job: u32,
    holder: u32,
    request: Request,
    /// The owner reads refusals. Builds before did not (a refusal does not
    /// parse as their `Decision`): their requests that do not fit go back
    /// to the queue, for them to decide.
    #[serde(default)]
    reads_refusals: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    count: Option<RefusalCount>,
}

/// The counter a lock holder bumps, in the state it writes anyway, when it
/// refuses a queued request: the one its owner would bump otherwise, passing
/// the lock once more for it (a burst's refused launches one after another).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalCount {
    /// The step goes on to wait (`Counters::waits`).
    Wait,
    /// The step gives up (`Counters::no_fit`, by the refusal's class).
    NoFit,
}

/// A queued request that does not fit: why, and whether the holder bumped
/// the counter its owner asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub why: NoFit,
    pub counted: bool,
}

/// The answer to a queued request: what [`crate::decide::decide`] said.
pub type Answer = Result<Decision, Refusal>;

/// An answer on the wire. A placement is the decision itself, as builds
/// before refusals were answered wrote and read it; a refusal is an object
/// of its own, given only to owners that read it.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum AnswerWire {
    Placed(Decision),
    Refused {
        refused: NoFit,
        #[serde(default)]
        counted: bool,
    },
}

/// The mapped slots file.
pub struct Slots {
    base: *mut u8,
}

// SAFETY: the mapping is shared memory accessed through atomics and
// payload copies ordered by them; usable from any thread.
unsafe impl Send for Slots {}
// SAFETY: as for Send: every access goes through the atomics or payload
// copies they order; `&Slots` gives no unsynchronised access.
unsafe impl Sync for Slots {}

/// A queued request of ours: slot index and claim id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotRef {
    index: usize,
    id: u64,
}

/// A request taken from the queue by the lock holder.
pub struct Taken {
    pub slot: SlotRef,
    pub step: StepRef,
    pub request: Request,
    /// Its owner reads a refusal; the counter to bump if it is refused.
    pub reads_refusals: bool,
    pub count: Option<RefusalCount>,
}

impl Slots {
    /// Maps the slots file, creating it at full size first if needed.
    /// `None` if it cannot be made or mapped, has another size, or is not
    /// ours alone to write (another owner, group or other write bits: its
    /// answers would be someone else's word; callers then wait for the lock
    /// without queueing).
    pub fn open(dir: &Path) -> Option<Slots> {
        let path = dir.join(SLOTS_FILE);
        let file = match crate::fsutil::open_existing_rw(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => create(dir)?,
            Err(_) => return None,
        };
        let meta = file.metadata().ok()?;
        // Fully written, not sparse: a mapped page that tmpfs cannot back
        // would raise SIGBUS when touched.
        if !meta.is_file() || meta.len() != FILE_BYTES as u64 || meta.blocks() < (FILE_BYTES / 512) as u64 {
            return None;
        }
        if !owned_by_us(&meta) {
            return None;
        }
        // SAFETY: a shared mapping of a regular file of exactly FILE_BYTES,
        // checked for failure below, unmapped on drop.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                FILE_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        (p != libc::MAP_FAILED).then(|| Slots { base: p as *mut u8 })
    }

    fn tag(&self, i: usize) -> &AtomicU64 {
        // SAFETY: i < SLOTS; each header starts 64-aligned in the
        // page-aligned mapping, which lives as long as self; its words are
        // accessed only atomically.
        unsafe { &*(self.base.add(i * HEADER) as *const AtomicU64) }
    }

    fn wake_word(&self, i: usize) -> &AtomicU32 {
        // SAFETY: as in `tag`, at offset 8 (4-aligned).
        unsafe { &*(self.base.add(i * HEADER + 8) as *const AtomicU32) }
    }

    fn len(&self, i: usize) -> &AtomicU32 {
        // SAFETY: as in `tag`, at offset 16.
        unsafe { &*(self.base.add(i * HEADER + 16) as *const AtomicU32) }
    }

    fn seq(&self, i: usize) -> &AtomicU64 {
        // SAFETY: as in `tag`, at offset 24 (8-aligned).
        unsafe { &*(self.base.add(i * HEADER + 24) as *const AtomicU64) }
    }

    /// Copies `bytes` into slot i's payload. Only the slot's current
    /// holder (owner while claimed, decider while taken) writes it.
    fn write_payload(&self, i: usize, bytes: &[u8]) {
        debug_assert!(bytes.len() <= PAYLOAD);
        // SAFETY: the payload region of slot i holds PAYLOAD bytes; the
        // caller holds the slot (see above), so nobody reads it meanwhile.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(PAYLOADS_AT + i * PAYLOAD), bytes.len()) }
        self.len(i).store(bytes.len() as u32, Ordering::Relaxed);
    }

    fn read_payload(&self, i: usize) -> Vec<u8> {
        let n = (self.len(i).load(Ordering::Relaxed) as usize).min(PAYLOAD);
        let mut out = vec![0u8; n];
        // SAFETY: n <= PAYLOAD bytes of slot i's payload; written before
        // the tag change the caller acquired.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(PAYLOADS_AT + i * PAYLOAD), out.as_mut_ptr(), n) }
        out
    }

    fn bump(&self, i: usize) {
        let word = self.wake_word(i);
        word.fetch_add(1, Ordering::SeqCst);
        // SAFETY: a mapped, aligned futex word; shared (not PRIVATE), as
        // the sleeper is another process.
        unsafe {
            libc::syscall(libc::SYS_futex, word as *const AtomicU32, libc::FUTEX_WAKE, i32::MAX, 0usize, 0usize, 0u32);
        }
    }

    /// Queues the request of `step`; if it is refused, the holder bumps
    /// `count`. `None` if every slot is busy or the request is too large
    /// for one.
    pub fn enqueue(&self, step: StepRef, req: &Request, count: Option<RefusalCount>) -> Option<SlotRef> {
        static N: AtomicU64 = AtomicU64::new(0);
        let wire = Wire { job: step.job, holder: step.holder, request: req.clone(), reads_refusals: true, count };
        let bytes = serde_json::to_vec(&wire).ok()?;
        if bytes.len() > PAYLOAD {
            return None;
        }
        let pid = std::process::id();
        // Unique among live processes: pid and a per-process counter.
        let id = (pid as u64) << 24 | (N.fetch_add(1, Ordering::Relaxed) & 0xff_ffff);
        let start = pid as usize % SLOTS;
        let index = (0..SLOTS).map(|k| (start + k) % SLOTS).find(|&i| {
            self.tag(i).compare_exchange(FREE, tag(id, CLAIMED), Ordering::Acquire, Ordering::Relaxed).is_ok()
        })?;
        self.write_payload(index, &bytes);
        self.seq(index).store(crate::clock::now_nanos() as u64, Ordering::Relaxed);
        // Release: the payload is visible to whoever sees QUEUED.
        self.tag(index)
            .compare_exchange(tag(id, CLAIMED), tag(id, QUEUED), Ordering::Release, Ordering::Relaxed)
            .ok()?;
        Some(SlotRef { index, id })
    }

    /// The wake-up counter of our slot, read before looking for the answer.
    pub fn generation(&self, s: SlotRef) -> u32 {
        self.wake_word(s.index).load(Ordering::SeqCst)
    }

    /// Sleeps until our slot's counter moves on from `seen`, or `timeout`.
    pub fn wait(&self, s: SlotRef, seen: u32, timeout: Duration) {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: as in `bump`. Errors (EAGAIN: already changed,
        // ETIMEDOUT, EINTR) all mean "look again".
        unsafe {
            let word: *const AtomicU32 = self.wake_word(s.index);
            libc::syscall(libc::SYS_futex, word, libc::FUTEX_WAIT, seen, &ts as *const libc::timespec, 0usize, 0u32);
        }
    }

    /// Our answer, if the lock holder left one; the slot is freed.
    pub fn take_answer(&self, s: SlotRef) -> Option<Answer> {
        if self.tag(s.index).load(Ordering::Acquire) != tag(s.id, ANSWERED) {
            return None;
        }
        let a = serde_json::from_slice(&self.read_payload(s.index)).ok().map(|w| match w {
            AnswerWire::Placed(d) => Ok(d),
            AnswerWire::Refused { refused, counted } => Err(Refusal { why: refused, counted }),
        });
        let _ = self.tag(s.index).compare_exchange(tag(s.id, ANSWERED), FREE, Ordering::AcqRel, Ordering::Relaxed);
        a
    }

    /// Takes our request off the queue. Returns the answer if it was
    /// decided meanwhile. A request being decided right now (a decider
    /// that took it and then died, or one still at work) is left: the
    /// slot is freed once we are gone.
    pub fn withdraw(&self, s: SlotRef) -> Option<Answer> {
        let t = self.tag(s.index);
        if t.compare_exchange(tag(s.id, QUEUED), FREE, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            return None;
        }
        self.take_answer(s)
    }

    /// Under the state lock: puts back requests a dead decider had taken,
    /// so they are decided again.
    pub fn recover_taken(&self) {
        for i in 0..SLOTS {
            let t = self.tag(i).load(Ordering::Acquire);
            if state_of(t) == TAKEN {
                let _ = self.tag(i).compare_exchange(t, tag(t >> 8, QUEUED), Ordering::AcqRel, Ordering::Relaxed);
            }
        }
    }

    /// Under the state lock: takes the queued requests, oldest first,
    /// except those in `skip` (put back earlier in this pass). A slot that
    /// does not decode is freed with a log line; its owner decides alone.
    pub fn take_queued(&self, skip: &[SlotRef], log: &dyn Fn(&str)) -> Vec<Taken> {
        let mut queued: Vec<(u64, SlotRef)> = (0..SLOTS)
            .filter_map(|i| {
                let t = self.tag(i).load(Ordering::Acquire);
                let s = SlotRef { index: i, id: t >> 8 };
                (state_of(t) == QUEUED && !skip.contains(&s)).then(|| (self.seq(i).load(Ordering::Relaxed), s))
            })
            .collect();
        queued.sort_by_key(|(seq, s)| (*seq, s.index));
        let mut out = Vec::with_capacity(queued.len());
        for (_, s) in queued {
            let t = self.tag(s.index);
            if t.compare_exchange(tag(s.id, QUEUED), tag(s.id, TAKEN), Ordering::AcqRel, Ordering::Relaxed).is_err() {
                continue; // withdrawn meanwhile
            }
            match serde_json::from_slice::<Wire>(&self.read_payload(s.index)) {
                Ok(w) => out.push(Taken {
                    slot: s,
                    step: StepRef { job: w.job, holder: w.holder },
                    request: w.request,
                    reads_refusals: w.reads_refusals,
                    count: w.count,
                }),
                Err(e) => {
                    log(&format!("placement request in {SLOTS_FILE} slot {} unreadable ({e}); dropped", s.index));
                    let _ = t.compare_exchange(tag(s.id, TAKEN), FREE, Ordering::AcqRel, Ordering::Relaxed);
                }
            }
        }
        out
    }

    /// Whether a refusal of `why` would fit an answer's slot: one that
    /// does not goes back to its owner, which decides and counts it itself.
    pub fn refusal_fits(why: &NoFit) -> bool {
        let wire = AnswerWire::Refused { refused: why.clone(), counted: true };
        serde_json::to_vec(&wire).is_ok_and(|b| b.len() <= PAYLOAD)
    }

    /// Answers a taken request (the state recording a placement is
    /// written) and wakes its owner. An answer too large for the slot is not
    /// given: the request goes back to the queue and its owner decides it
    /// itself (a placement: finds its job's reservation). Returns whether
    /// it was answered.
    pub fn answer(&self, s: SlotRef, a: &Answer) -> bool {
        let wire = match a {
            Ok(d) => serde_json::to_vec(&AnswerWire::Placed(d.clone())),
            Err(r) => serde_json::to_vec(&AnswerWire::Refused { refused: r.why.clone(), counted: r.counted }),
        };
        match wire {
            Ok(bytes) if bytes.len() <= PAYLOAD => {
                self.write_payload(s.index, &bytes);
                let _ = self.tag(s.index).compare_exchange(
                    tag(s.id, TAKEN),
                    tag(s.id, ANSWERED),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                );
                self.bump(s.index);
                true
            }
            _ => {
                self.put_back(s);
                false
            }
        }
    }

    /// Returns a taken request to the queue, undecided.
    pub fn put_back(&self, s: SlotRef) {
        let _ = self.tag(s.index).compare_exchange(
            tag(s.id, TAKEN),
            tag(s.id, QUEUED),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }

    /// Wakes the owner of the oldest queued request (after the lock is
    /// released, so that it takes the lock next).
    pub fn wake_oldest(&self) {
        let oldest = (0..SLOTS)
            .filter(|&i| state_of(self.tag(i).load(Ordering::Acquire)) == QUEUED)
            .min_by_key(|&i| self.seq(i).load(Ordering::Relaxed));
        if let Some(i) = oldest {
            self.bump(i);
        }
    }

    /// Frees slots whose owner is gone (garbage collection).
    pub fn reclaim(&self, alive: &dyn Fn(u32) -> bool) {
        for i in 0..SLOTS {
            let t = self.tag(i).load(Ordering::Acquire);
            if t != FREE && !alive(owner_of(t)) {
                let _ = self.tag(i).compare_exchange(t, FREE, Ordering::AcqRel, Ordering::Relaxed);
            }
        }
    }

    /// Slots in use (for tests and status).
    pub fn busy(&self) -> usize {
        (0..SLOTS).filter(|&i| self.tag(i).load(Ordering::Acquire) != FREE).count()
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        // SAFETY: mapped in `open` with this length; no reference outlives self.
        unsafe {
            libc::munmap(self.base as *mut libc::c_void, FILE_BYTES);
        }
    }
}

/// Makes the slots file: written in full under a temporary name, then
/// linked into place, so nobody ever maps a file still being written. If
/// another process linked its file first, that one is used.
/// Free space the state directory must keep beside a new queue file: the
/// state file and its temporary copy must always fit.
const KEEP_FREE: u64 = 1 << 20;

/// The file is the effective user's and nobody else may write it.
fn owned_by_us(meta: &std::fs::Metadata) -> bool {
    // SAFETY: geteuid touches no memory and cannot fail.
    let euid = unsafe { libc::geteuid() };
    meta.uid() == euid && meta.mode() & 0o022 == 0
}

fn create(dir: &Path) -> Option<File> {
    // Writing the file on a disk without room for it would fill the disk
    // for as long as the attempt lasts, and a concurrent state write (a
    // placement, a release) would fail with ENOSPC on a disk that has room.
    // So: no queue there; steps wait for the lock instead.
    if fs2::available_space(dir).ok()? < FILE_BYTES as u64 + KEEP_FREE {
        return None;
    }
    let path = dir.join(SLOTS_FILE);
    let tmp = dir.join(format!("{SLOTS_FILE}.tmp.{}", std::process::id()));
    let made = (|| -> std::io::Result<()> {
        let f = crate::fsutil::open_for_write(&tmp, true)?;
        f.write_all_at(&vec![0u8; FILE_BYTES], 0)?;
        match std::fs::hard_link(&tmp, &path) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
            _ => Ok(()),
        }
    })();
    let _ = std::fs::remove_file(&tmp);
    made.ok()?;
    crate::fsutil::open_existing_rw(&path).ok()
}

#[cfg(test)]
mod tests;
