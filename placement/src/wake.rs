//! Wake-up counters in a small root-owned file, mapped by every process
//! that places on this node. A step waiting for its queued request sleeps
//! on the counter of its ticket's slot with a futex and a timeout; a
//! decider bumps the slot of each ticket it answered, and whoever releases
//! the state lock bumps the slot of the oldest ticket still queued, which
//! then takes the lock. So a release wakes the steps it concerns, not every
//! waiter, with no helper thread and no polling. The flock stays the only
//! mutual exclusion; a wake-up only says "look again", and two tickets
//! sharing a slot just wake each other.
//!
//! All `unsafe` of the wake-up is here: mmap/munmap of the file and the
//! futex system call on the mapped word.

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

pub const WAKE_FILE: &str = "state.wake";
const PAGE: usize = 4096;
pub const SLOTS: usize = PAGE / 4;

pub struct Wake {
    words: *const AtomicU32,
}

// SAFETY: the mapping is only accessed through atomic operations and the
// futex system call, both safe from any thread.
unsafe impl Send for Wake {}

impl Wake {
    /// `None` when the file cannot be made or mapped (then callers poll).
    pub fn open(dir: &Path) -> Option<Wake> {
        let path = dir.join(WAKE_FILE);
        let file: File = crate::fsutil::open_for_write(&path, false).ok()?;
        let meta = file.metadata().ok()?;
        if !meta.is_file() {
            return None;
        }
        // Written, not truncated, to full size: a mapped page past the
        // written end of a full tmpfs would raise SIGBUS when touched.
        if meta.len() < PAGE as u64 || meta.blocks() == 0 {
            file.write_all_at(&[0u8; PAGE], 0).ok()?;
        }
        // SAFETY: a fresh shared mapping of a regular file we just made
        // PAGE bytes long; checked for failure below; unmapped on drop.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        Some(Wake { words: p as *const AtomicU32 })
    }

    fn word(&self, slot: usize) -> &AtomicU32 {
        // SAFETY: the page holds SLOTS aligned words, mapped for the
        // lifetime of self; the index is reduced modulo SLOTS.
        unsafe { &*self.words.add(slot % SLOTS) }
    }

    pub fn generation(&self, slot: usize) -> u32 {
        self.word(slot).load(Ordering::SeqCst)
    }

    /// Returns when the slot's counter differs from `seen`, on a wake-up, or
    /// after `timeout` (a missed bump costs at most that).
    pub fn wait(&self, slot: usize, seen: u32, timeout: Duration) {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: the futex word is mapped and 4-byte aligned; a shared
        // (not PRIVATE) futex, as other processes wake it. Errors (EAGAIN:
        // already changed, ETIMEDOUT, EINTR) all mean "look again".
        unsafe {
            let word: *const AtomicU32 = self.word(slot);
            libc::syscall(libc::SYS_futex, word, libc::FUTEX_WAIT, seen, &ts as *const libc::timespec, 0usize, 0u32);
        }
    }

    /// Bumps the slot's counter and wakes its waiters.
    pub fn bump(&self, slot: usize) {
        let word = self.word(slot);
        word.fetch_add(1, Ordering::SeqCst);
        // SAFETY: as in `wait`.
        unsafe {
            libc::syscall(libc::SYS_futex, word as *const AtomicU32, libc::FUTEX_WAKE, i32::MAX, 0usize, 0usize, 0u32);
        }
    }
}

/// The slot a ticket's owner sleeps on (FNV-1a of its name).
pub fn slot_of(name: &str) -> usize {
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    (h % SLOTS as u64) as usize
}

impl Drop for Wake {
    fn drop(&mut self) {
        // SAFETY: mapped in `open` with this length; no reference outlives self.
        unsafe {
            libc::munmap(self.words as *mut libc::c_void, PAGE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::tests_support::TempDir;
    use std::time::Instant;

    #[test]
    fn a_bump_wakes_a_waiter_in_another_mapping() {
        let d = TempDir::new();
        let (a, b) = (Wake::open(&d.0).unwrap(), Wake::open(&d.0).unwrap());
        let slot = slot_of("some.ticket");
        let seen = a.generation(slot);
        let t = Instant::now();
        // Unchanged and nobody bumps: the wait times out.
        a.wait(slot, seen, Duration::from_millis(50));
        assert!(t.elapsed() >= Duration::from_millis(40));
        // Another slot's bump does not change ours.
        b.bump(slot + 1);
        assert_eq!(a.generation(slot), seen);
        let waiter = std::thread::spawn(move || {
            let t = Instant::now();
            a.wait(slot, seen, Duration::from_secs(20));
            (t.elapsed(), a.generation(slot))
        });
        std::thread::sleep(Duration::from_millis(100));
        b.bump(slot);
        let (took, now) = waiter.join().unwrap();
        assert!(took < Duration::from_secs(10), "not woken: {took:?}");
        assert_eq!(now, seen.wrapping_add(1));
    }
}
