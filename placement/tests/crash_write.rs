//! A writer killed with SIGKILL at any moment never leaves a torn state
//! file: updates go to a temp file, are fsync'ed and renamed into place.

use carma_placement::StateStore;
use carma_placement::state::{Holding, Reservation};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const CHILD: &str = "CARMA_CRASH_WRITER_DIR";

/// The child: rewrites a large state over and over until killed.
#[test]
fn writer_loop() {
    let Some(dir) = std::env::var_os(CHILD) else { return };
    let store = StateStore::open(&PathBuf::from(dir), Duration::from_secs(5), Box::new(|_| {})).unwrap();
    for round in 0u32.. {
        store
            .update(|st| {
                st.reservations = (0..400)
                    .map(|job| Reservation {
                        job: job + round,
                        gpus: vec![job % 8],
                        reserved_mib: 1000 + u64::from(round),
                        estimate_source: "declared".into(),
                        exclusive: false,
                        holding: Holding::Carma,
                        policy: None,
                        since: 0,
                        holders: vec![std::process::id()],
                        signature: None,
                        observed_mib: 0,
                        mps_uid: None,
                        model_mib: None,
                        uid: None,
                        profile: None,
                        profile_key: None,
                        alone_since: None,
                    })
                    .collect();
            })
            .unwrap();
    }
}

#[test]
fn state_survives_writers_killed_mid_update() {
    let dir = std::env::temp_dir().join(format!("carma-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let exe = std::env::current_exe().unwrap();
    const KILLS: u64 = 100;
    let mut checked = 0;
    for i in 0..KILLS {
        let mut child =
            Command::new(&exe).args(["--exact", "writer_loop", "--nocapture"]).env(CHILD, &dir).spawn().unwrap();
        std::thread::sleep(Duration::from_micros(20_000 + (i * 7919) % 40_000));
        child.kill().unwrap();
        child.wait().unwrap();
        let Ok(bytes) = std::fs::read(dir.join("state.json")) else {
            continue; // killed before its first update
        };
        let v: serde_json::Value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("kill {i}: torn state file ({} bytes): {e}", bytes.len()));
        assert_eq!(v["reservations"].as_array().map(Vec::len), Some(400), "kill {i}");
        checked += 1;
    }
    // A writer that never wrote (it failed, or every kill came first)
    // would otherwise pass: most kills must find a state to check.
    println!("{checked} of {KILLS} kills left a state file to check");
    assert!(checked >= KILLS / 2, "only {checked} of {KILLS} kills found a state file: the writer is not writing");
    let _ = std::fs::remove_dir_all(&dir);
}
