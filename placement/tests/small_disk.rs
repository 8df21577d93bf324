//! A state directory too small for the placement queue (`queue.slots`).
//!
//! Every process that opens the store (placing steps, releasing steps, the
//! job epilog, `carma status`) used to try to create the queue file there:
//! it wrote 260 KiB of zeros to a temporary file, which filled the disk
//! until the attempt was undone. A state write at that moment failed with
//! "No space left on device" on a disk that had room, and a test that
//! filled the disk during such an attempt believed it full when it was not.
//! (Issue: a `--carma-mem` job in the full-disk fault test ran placed while
//! the test expected its placement to fail.)
//!
//! Needs root (it mounts a tmpfs), as the whole test command does.

use carma_placement::StateStore;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = std::env::temp_dir().join(format!("carma-small-disk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0755"), "tmpfs"])
            .arg(&dir)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "cannot mount a tmpfs on {}: run the tests as root (sudo tests/run.sh)", dir.display());
        Tmpfs(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn store(dir: &std::path::Path, log: Arc<Mutex<Vec<String>>>) -> StateStore {
    StateStore::open(dir, Duration::from_secs(5), Box::new(move |m: &str| log.lock().unwrap().push(m.into()))).unwrap()
}

#[test]
fn opening_the_store_where_the_queue_cannot_fit_never_takes_the_state_writes_space() {
    // 200 KiB: room for the state file many times over, not for the queue.
    let disk = Tmpfs::mount("200k");
    let log = Arc::new(Mutex::new(Vec::new()));
    let writer = store(&disk.0, log.clone());
    writer.update(|st| st.rr_cursor = 1).unwrap();
    assert!(writer.slots().is_none(), "a 260 KiB queue on a 200 KiB disk");

    // Other processes open the store all the time (one per placement,
    // release, epilog and status call) while this one writes the state.
    let stop = Arc::new(AtomicBool::new(false));
    let openers: Vec<_> = (0..2)
        .map(|_| {
            let (dir, stop, log) = (disk.0.clone(), stop.clone(), log.clone());
            std::thread::spawn(move || {
                let mut n = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    drop(store(&dir, log.clone()));
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut failures = Vec::new();
    for i in 0..3000u32 {
        if let Err(e) = writer.update(|st| st.rr_cursor = i + 2) {
            failures.push(e.to_string());
        }
    }
    stop.store(true, Ordering::Relaxed);
    let opened: u32 = openers.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(opened > 100, "only {opened} concurrent opens: the test did not exercise the race");
    assert!(
        failures.is_empty(),
        "{} of 3000 state writes failed while {opened} opens ran, first: {}",
        failures.len(),
        failures[0]
    );
    let left: Vec<_> = std::fs::read_dir(&disk.0).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(!left.iter().any(|n| n.to_string_lossy().contains(".tmp.")), "temporary files left: {left:?}");
}
