//! The state's tests: records, the file, the lock and the history.

use super::lock::LOCK_FILE;
use super::*;
use carma_config::Policy;
use fs2::FileExt;
use std::fs::{self, File};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn store() -> (TempDir, StateStore, Arc<Mutex<Vec<String>>>) {
    let d = TempDir::new();
    // As CARMA makes it: a looser one is tightened with a log line, which
    // the tests of other log lines would see.
    fs::set_permissions(&d.0, fs::Permissions::from_mode(0o700)).unwrap();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let l2 = lines.clone();
    let s =
        StateStore::open(&d.0, Duration::from_millis(300), Box::new(move |m| l2.lock().unwrap().push(m.to_string())))
            .unwrap();
    (d, s, lines)
}

use crate::test_support::TempDir;

fn res(job: u32, holder: u32) -> Reservation {
    Reservation { since: 1, ..crate::test_support::carma(job, vec![0], 1000, holder) }
}

#[test]
fn update_persists_atomically_and_round_trips() {
    let (_d, s, _) = store();
    s.update(|st| st.reservations.push(res(7, 1))).unwrap();
    assert_eq!(s.snapshot().unwrap().reservations, vec![res(7, 1)]);
    let names: Vec<_> = fs::read_dir(s.dir()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
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
const PREVIOUS_RELEASE: &str = include_str!("../../testdata/state-8334099.json");

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
    let names: Vec<_> = fs::read_dir(s.dir()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
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
/// wake, retry and fail in turn, waking each other.
#[test]
fn a_failed_lock_attempt_wakes_nobody() {
    let (_d, s, _) = store();
    let q = s.slots().expect("the queue is mapped");
    let req = crate::request::Request::declared(Policy::Magm, 1);
    let slot = q.enqueue(crate::request::StepRef { job: 1, holder: std::process::id() }, &req, None).unwrap();
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
    let e =
        StateStore::open(&d.0, Duration::from_secs(1), Box::new(|_| {})).err().expect("world-writable dir accepted");
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

/// A full history drops the least recently used signature of the user
/// with the most, never another user's.
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

/// Issue 58: any user who could open `state.lock` could hold its flock (a
/// read descriptor suffices) and stall every placement and release. The
/// directory and everything CARMA makes in it are its owner's only.
#[test]
fn the_state_directory_and_its_files_are_the_owners_only() {
    use std::os::unix::fs::MetadataExt;
    let d = TempDir::new();
    let dir = d.0.join("state");
    let s = StateStore::open(&dir, Duration::from_secs(1), Box::new(|_| {})).unwrap();
    s.update(|st| st.reservations.push(res(7, 1))).unwrap();
    crate::jobfiles::write_gpus(&dir, 7, &[0]).unwrap();
    crate::fsutil::stamp_due(&dir.join("stamp"), Duration::from_secs(1));
    assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o7777, 0o700, "state_dir");
    for name in ["state.json", LOCK_FILE, crate::slots::SLOTS_FILE, "gpus-7", "stamp"] {
        let m = fs::metadata(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(m.mode() & 0o7777, 0o600, "{name}");
    }
    // What a user's `flock -s state.lock sleep infinity` would do: the
    // lock cannot be opened at all. Becoming another user takes root (the
    // README's test command and CI run as root; a plain `cargo test` checks
    // the modes above only).
    if !carma_config::ownership::running_as_root() {
        return;
    }
    let lock = dir.join(LOCK_FILE);
    let r = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "flock", "-n", "-s"])
        .arg(&lock)
        .arg("true")
        .output()
        .unwrap();
    assert!(!r.status.success(), "a user took the state lock");
    assert!(String::from_utf8_lossy(&r.stderr).contains("Permission denied"), "{r:?}");
}

/// A node upgraded from a build that made the directory 0755 and its files
/// 0644: the first open tightens them, and says so once.
#[test]
fn an_older_builds_open_state_directory_is_tightened_with_a_log_line() {
    use std::os::unix::fs::MetadataExt;
    let d = TempDir::new();
    for name in ["state.json", LOCK_FILE, "recovery-3"] {
        fs::write(d.0.join(name), b"{}").unwrap();
        fs::set_permissions(d.0.join(name), fs::Permissions::from_mode(0o644)).unwrap();
    }
    // A link is left alone (not followed to its target).
    let target = TempDir::new();
    fs::write(target.0.join("elsewhere"), b"").unwrap();
    fs::set_permissions(target.0.join("elsewhere"), fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::symlink(target.0.join("elsewhere"), d.0.join("link")).unwrap();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let l2 = lines.clone();
    let open = || {
        let l2 = l2.clone();
        StateStore::open(&d.0, Duration::from_secs(1), Box::new(move |m| l2.lock().unwrap().push(m.to_string())))
            .unwrap()
    };
    drop(open());
    assert_eq!(fs::metadata(&d.0).unwrap().mode() & 0o7777, 0o700);
    for name in ["state.json", LOCK_FILE, "recovery-3"] {
        assert_eq!(fs::metadata(d.0.join(name)).unwrap().mode() & 0o7777, 0o600, "{name}");
    }
    assert_eq!(fs::metadata(target.0.join("elsewhere")).unwrap().mode() & 0o7777, 0o644, "followed a link");
    let said = lines.lock().unwrap().clone();
    assert!(said.len() == 1 && said[0].contains("was mode 755") && said[0].contains("made it 700"), "{said:?}");
    drop(open());
    assert_eq!(lines.lock().unwrap().len(), 1, "logged again once tight");
}
