//! The placer on carma-monitor's published readings: a job placed within
//! the monitor's window counts on top of them until the published window
//! has seen it, by the publication's time (readings up to an interval
//! old), not by the job's age now.

use carma_config::{Config, Policy};
use carma_placement::source::published::{Published, PublishedSource, publish};
use carma_placement::{GpuReading, LiveHolders, Params, Placer, Request, StateStore, StepRef};
use std::path::PathBuf;
use std::time::Duration;

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn reading(sm: f64) -> GpuReading {
    GpuReading { used_mib: 4096, sm_activity: sm, busy: sm, ..GpuReading::idle(0, "GPU-0", 40960) }
}

fn publication(written_ms: u64, sm: f64) -> Published {
    Published {
        written_ms,
        interval_ms: 2000,
        window_ms: 6000,
        source: "simulated".into(),
        samples: 3,
        gpus: vec![reading(sm)],
    }
}

/// One GPU with a job placed 6 s ago, a whole 6 s window, under a 0.8 cap.
/// Published 2 s ago, the window has seen at most 3 s of the job (a second
/// less for its start's rounding): it reads 0.67 and the job still counts
/// 0.2 on top, so a second job is refused. Published now, the readings
/// speak for it (0.67 < 0.8) and the second job is placed.
#[test]
fn a_job_placed_a_window_ago_counts_until_the_published_window_has_seen_it() {
    let d = Dir(std::env::temp_dir().join(format!("carma-published-window-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&d.0);
    std::fs::create_dir_all(&d.0).unwrap();
    let cfg = Config { state_dir: d.0.clone(), ..Config::default() };
    let now_ms = carma_placement::clock::now_ms();
    publish(&d.0, &publication(now_ms, 0.0)).unwrap();
    let store = StateStore::open(&d.0, Duration::from_secs(10), Box::new(|_| {})).unwrap();
    // The activity window's count is tested, not the slowdown guard (its
    // jobs are never profiled: guard_tests.rs).
    let params = Params { window_secs: 6, max_slowdown: f64::INFINITY, ..Params::default() };
    let mut p = Placer::new(
        store,
        Box::new(PublishedSource::new(&cfg, |_| {})),
        params,
        Box::new(LiveHolders),
        Box::new(|_| {}),
    );
    let me = std::process::id();
    p.try_place(StepRef { job: 1, holder: me }, &Request::declared(Policy::Magm, 4096)).unwrap();
    // Placed 6 s ago.
    let store = StateStore::open(&d.0, Duration::from_secs(10), Box::new(|_| {})).unwrap();
    store.update(|st| st.reservations[0].since = now_ms / 1000 - 6).unwrap();
    publish(&d.0, &publication(now_ms - 2000, 0.67)).unwrap();
    let second = StepRef { job: 2, holder: me };
    let e = p.try_place(second, &Request::declared(Policy::Magm, 4096)).unwrap_err();
    assert!(e.to_string().contains("with 1 job placed within the window"), "{e}");
    publish(&d.0, &publication(carma_placement::clock::now_ms(), 0.67)).unwrap();
    p.try_place(second, &Request::declared(Policy::Magm, 4096)).unwrap();
}
