//! Requests queued while the state lock is held are decided by its holder
//! (see `carma_placement::slots`): answered, placed or refused with why,
//! and never promised beyond capacity however many launches race.

use carma_config::Policy;
use carma_placement::slots::Slots;
use carma_placement::source::SimulatedGpus;
use carma_placement::{LinuxProcesses, LiveHolders, Params, Placer, Request, StateStore, StepRef};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::Duration;

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A state directory and simulated GPUs of `mib` each.
fn node(name: &str, gpus: usize, mib: u64) -> Dir {
    let d = std::env::temp_dir().join(format!("carma-combining-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join("procs")).unwrap();
    std::fs::create_dir_all(d.join("state")).unwrap();
    std::fs::set_permissions(d.join("state"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut yaml = format!("process_dir: {}\ngpus:\n", d.join("procs").display());
    for i in 0..gpus {
        yaml.push_str(&format!("  - {{index: {i}, memory_total: {mib}}}\n"));
    }
    std::fs::write(d.join("gpus.yaml"), yaml).unwrap();
    Dir(d)
}

// This test process holds its reservations while it lives (LiveHolders):
// what is tested here is the queue, not who holds. Its jobs are never
// profiled, so the slowdown guard is off: memory decides (the guard's own
// tests are placement/src/policy/guard_tests.rs).
fn placer(dir: &Path) -> Placer {
    let store = StateStore::open(&dir.join("state"), Duration::from_secs(10), Box::new(|_| {})).unwrap();
    let source = Box::new(SimulatedGpus::load(&dir.join("gpus.yaml")).unwrap());
    let params = Params { max_slowdown: f64::INFINITY, ..Params::default() };
    Placer::new(store, source, params, Box::new(LiveHolders), Box::new(|_| {}))
}

fn request(policy: Policy, mib: u64) -> Request {
    Request::declared(policy, mib)
}

/// Queue slots in use.
fn busy(dir: &Path) -> usize {
    Slots::open(&dir.join("state")).expect("queue mapped").busy()
}

#[test]
fn the_lock_holder_decides_a_queued_request_and_answers_it() {
    let d = node("answer", 2, 20480);
    let me = std::process::id();
    let waiting = StepRef { job: 7, holder: me };
    let mut p = placer(&d.0);
    let q = Slots::open(&d.0.join("state")).unwrap();
    let slot = q.enqueue(waiting, &request(Policy::Magm, 4096), None).unwrap();
    assert!(q.take_answer(slot).is_none(), "answered before anyone decided");
    let own = p.try_place(StepRef { job: 8, holder: me }, &request(Policy::Magm, 4096)).unwrap();
    let answer = q.take_answer(slot).expect("the queued request was answered").expect("placed");
    assert_eq!(answer.reserve_mib, 4096);
    // magm spreads the two: each went to the GPU with more room.
    assert_ne!(answer.gpus, own.gpus);
    let st =
        StateStore::open(&d.0.join("state"), Duration::from_secs(5), Box::new(|_| {})).unwrap().snapshot().unwrap();
    let mut jobs: Vec<u32> = st.reservations.iter().map(|r| r.job).collect();
    jobs.sort();
    assert_eq!(jobs, vec![7, 8], "both recorded");
    assert_eq!(busy(&d.0), 0, "slots left in use");
}

/// One 20 GiB GPU that job 1 shares (an exclusive request finds it not
/// idle), its placer and its queue.
fn one_gpu_shared(name: &str) -> (Dir, Placer, Slots) {
    let d = node(name, 1, 20480);
    let mut p = placer(&d.0);
    p.try_place(StepRef { job: 1, holder: std::process::id() }, &request(Policy::Magm, 4096)).unwrap();
    let q = Slots::open(&d.0.join("state")).unwrap();
    (d, p, q)
}

/// The node's state, read under the lock.
fn state(d: &Dir) -> carma_placement::NodeState {
    StateStore::open(&d.0.join("state"), Duration::from_secs(5), Box::new(|_| {})).unwrap().snapshot().unwrap()
}

#[test]
fn a_queued_request_that_does_not_fit_is_answered_with_why() {
    let (d, mut p, q) = one_gpu_shared("nofit");
    let me = std::process::id();
    // An exclusive request finds no idle GPU: refused by the lock holder,
    // with the reason, so that its owner need not pass the lock to learn it.
    let slot = q.enqueue(StepRef { job: 2, holder: me }, &request(Policy::Exclusive, 4096), None).unwrap();
    p.try_place(StepRef { job: 3, holder: me }, &request(Policy::Magm, 4096)).unwrap();
    let why = q.take_answer(slot).expect("answered").expect_err("placed on a shared GPU").why;
    assert_eq!(why.wanted, 1);
    assert!(why.to_string().contains("GPU0: not idle (job 1 placed here)"), "{why}");
    assert_eq!(busy(&d.0), 0, "the slot was not freed");
    assert!(state(&d).reservations.iter().all(|r| r.job != 2), "the refused job was recorded");
}

/// An older build's owner cannot read a refusal: its request goes back to
/// the queue, for it to decide, as before refusals were answered.
#[test]
fn an_older_builds_request_that_does_not_fit_is_left_to_it() {
    let (d, mut p, q) = one_gpu_shared("older");
    let me = std::process::id();
    let slot = q.enqueue(StepRef { job: 2, holder: me }, &request(Policy::Exclusive, 4096), None).unwrap();
    // As an older build writes it: without the field (an unknown one is
    // ignored), in place in the mapped file.
    let path = d.0.join("state").join(carma_placement::slots::SLOTS_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    let field = b"\"reads_refusals\":true";
    let at = bytes.windows(field.len()).position(|w| w == field).expect("the request's payload");
    bytes[at + 1] = b'z';
    std::os::unix::fs::FileExt::write_all_at(&std::fs::File::options().write(true).open(&path).unwrap(), &bytes, 0)
        .unwrap();
    p.try_place(StepRef { job: 3, holder: me }, &request(Policy::Magm, 4096)).unwrap();
    assert!(q.take_answer(slot).is_none(), "an older owner was answered");
    assert_eq!(busy(&d.0), 1, "the request left the queue");
    assert!(q.withdraw(slot).is_none());
}

/// A refused launch does not pass the lock again to count its refusal:
/// the holder counts it in the state write that decides it.
#[test]
fn the_holder_counts_a_refusal_it_answers() {
    use carma_placement::slots::RefusalCount;
    let (d, mut p, q) = one_gpu_shared("counted");
    let me = std::process::id();
    let waits = q.enqueue(StepRef { job: 2, holder: me }, &request(Policy::Exclusive, 4096), Some(RefusalCount::Wait));
    let gives_up =
        q.enqueue(StepRef { job: 3, holder: me }, &request(Policy::Exclusive, 4096), Some(RefusalCount::NoFit));
    let silent = q.enqueue(StepRef { job: 4, holder: me }, &request(Policy::Exclusive, 4096), None);
    p.try_place(StepRef { job: 5, holder: me }, &request(Policy::Magm, 4096)).unwrap();
    let counted = |s| q.take_answer(s).expect("answered").expect_err("placed").counted;
    assert!(counted(waits.unwrap()) && counted(gives_up.unwrap()) && !counted(silent.unwrap()));
    let st = state(&d);
    assert_eq!(st.counters.waits, 1);
    assert_eq!(st.counters.no_fits.get("held"), Some(&1), "{:?}", st.counters.no_fits);
    assert_eq!(st.counters.placements, 2);
}

/// Launches racing with no wait: each refusal counted once, by its holder
/// or its owner, never both.
/// 24 launches at once, each with its own placer: how many `launch` says
/// were placed.
fn race(d: &Arc<Dir>, launch: impl Fn(&mut Placer, u32) -> bool + Send + Sync + Copy + 'static) -> usize {
    let start = Arc::new(Barrier::new(24));
    let handles: Vec<_> = (0..24u32)
        .map(|i| {
            let (d, start) = (d.clone(), start.clone());
            std::thread::spawn(move || {
                let mut p = placer(&d.0);
                start.wait();
                launch(&mut p, i)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).filter(|ok| *ok).count()
}

#[test]
fn racing_launches_count_each_refusal_once() {
    let d = Arc::new(node("race-count", 2, 10240));
    let me = std::process::id();
    let placed = race(&d, move |p, i| {
        let step = StepRef { job: i + 1, holder: me };
        p.place(step, &request(Policy::Magm, 3072), Duration::ZERO, Duration::from_millis(10), &mut || true).is_ok()
    });
    let st = state(&d);
    assert_eq!(placed, 4);
    assert_eq!(st.counters.placements, 4);
    assert_eq!(st.counters.no_fits.values().sum::<u64>(), 20, "{:?}", st.counters.no_fits);
    assert_eq!(st.counters.waits, 0);
}

#[test]
fn racing_launches_never_overcommit_and_leave_nothing_queued() {
    // 2 GPUs of 10 GiB, 2 GiB headroom, 3 GiB jobs: 2 fit per GPU.
    let d = Arc::new(node("race", 2, 10240));
    let me = std::process::id();
    for round in 0..5u32 {
        let placed = race(&d, move |p, i| {
            let policy = [Policy::Magm, Policy::FirstFit, Policy::BestFit, Policy::LeastUtilized, Policy::RoundRobin]
                [i as usize % 5];
            p.try_place(StepRef { job: round * 100 + i + 1, holder: me }, &request(policy, 3072)).is_ok()
        });
        let store = StateStore::open(&d.0.join("state"), Duration::from_secs(5), Box::new(|_| {})).unwrap();
        let st = store.snapshot().unwrap();
        assert_eq!(placed, 4, "round {round}: {placed} placed, state {:?}", st.reservations);
        assert_eq!(st.reservations.len(), 4);
        for gpu in 0..2 {
            let promised: u64 = st.reservations.iter().filter(|r| r.gpus.contains(&gpu)).map(|r| r.reserved_mib).sum();
            assert!(promised <= 10240 - 2048, "GPU {gpu} promised {promised} MiB");
        }
        assert_eq!(busy(&d.0), 0, "round {round} left slots in use");
        let p = placer(&d.0);
        for r in st.reservations {
            p.release_job(r.job).unwrap();
        }
    }
}

const HELPER_DIR: &str = "CARMA_TEST_QUEUE_DIR";

/// Run in a child process by the test below: queues a request, says so,
/// and waits to be killed.
#[test]
#[ignore = "helper process of a_dead_steps_queued_request_is_dropped_not_decided"]
fn helper_queue_and_hang() {
    let Some(dir) = std::env::var_os(HELPER_DIR) else { return };
    let q = Slots::open(Path::new(&dir)).unwrap();
    q.enqueue(StepRef { job: 99, holder: std::process::id() }, &request(Policy::Magm, 1024), None).unwrap();
    println!("queued");
    std::io::Write::flush(&mut std::io::stdout()).unwrap();
    std::thread::sleep(Duration::from_secs(120));
}

#[test]
fn a_dead_steps_queued_request_is_dropped_not_decided() {
    use std::io::BufRead;
    let d = node("dead", 1, 20480);
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "helper_queue_and_hang", "--nocapture"])
        .env(HELPER_DIR, d.0.join("state"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = std::io::BufReader::new(child.stdout.take().unwrap());
    assert!(out.lines().map_while(Result::ok).any(|l| l.contains("queued")), "helper did not queue");
    assert_eq!(busy(&d.0), 1);
    child.kill().unwrap();
    child.wait().unwrap();
    // The next lock holder frees the slot of the killed step (garbage
    // collection runs first on a fresh state) instead of deciding it.
    let me = std::process::id();
    placer(&d.0).try_place(StepRef { job: 1, holder: me }, &request(Policy::Magm, 1024)).unwrap();
    assert_eq!(busy(&d.0), 0, "the dead step's slot is still in use");
    let st =
        StateStore::open(&d.0.join("state"), Duration::from_secs(5), Box::new(|_| {})).unwrap().snapshot().unwrap();
    assert_eq!(st.reservations.iter().map(|r| r.job).collect::<Vec<_>>(), vec![1], "a dead step was placed");
}

/// A GPU source whose every read fails, counting the attempts.
struct Unreadable(Arc<std::sync::atomic::AtomicUsize>);
impl carma_placement::GpuSource for Unreadable {
    fn read(&mut self) -> Result<Vec<carma_placement::GpuReading>, carma_placement::SourceError> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Err(carma_placement::SourceError("unreadable".into()))
    }
    fn name(&self) -> &'static str {
        "unreadable"
    }
}

fn unreadable_placer(dir: &Path) -> (Placer, Arc<std::sync::atomic::AtomicUsize>) {
    let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let store = StateStore::open(&dir.join("state"), Duration::from_secs(10), Box::new(|_| {})).unwrap();
    let p = Placer::new(
        store,
        Box::new(Unreadable(reads.clone())),
        Params::default(),
        Box::new(LinuxProcesses),
        Box::new(|_| {}),
    );
    (p, reads)
}

#[test]
fn a_launch_answered_while_queued_reads_no_gpus() {
    // Only the lock holder reads the GPUs: a queued launch is decided on
    // the holder's readings, so its own source is never read.
    let d = node("noread", 1, 20480);
    let elsewhere = node("noread-elsewhere", 1, 20480);
    let me = std::process::id();
    let step = StepRef { job: 9, holder: me };
    let decided = placer(&elsewhere.0).try_place(step, &request(Policy::Magm, 4096)).unwrap();
    let (mut waiter, reads) = unreadable_placer(&d.0);
    // The lock, held here for the whole test (flock: this descriptor
    // excludes the waiter's even within one process).
    let lock = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(d.0.join("state/state.lock"))
        .unwrap();
    fs2::FileExt::lock_exclusive(&lock).unwrap();
    let t = std::thread::spawn(move || waiter.try_place(step, &request(Policy::Magm, 4096)));
    let q = Slots::open(&d.0.join("state")).unwrap();
    let start = std::time::Instant::now();
    let taken = loop {
        let t = q.take_queued(&[], &|_| {});
        if !t.is_empty() {
            break t;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "the launch never queued");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(taken.len(), 1);
    assert!(q.answer(taken[0].slot, &Ok(decided.clone())));
    let got = t.join().unwrap().expect("placed on the holder's answer");
    assert_eq!(got.gpus, decided.gpus);
    assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 0, "a queued launch read the GPUs");
    drop(lock);
}

#[test]
fn a_failed_read_under_the_lock_gives_the_lock_back_and_leaves_no_slot() {
    let d = node("readfail", 1, 20480);
    let me = std::process::id();
    let (mut p, reads) = unreadable_placer(&d.0);
    let e = p.try_place(StepRef { job: 3, holder: me }, &request(Policy::Magm, 4096)).unwrap_err();
    assert!(e.to_string().contains("unreadable"), "{e}");
    assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(busy(&d.0), 0, "slots left in use");
    // The lock is free again: another launch is placed at once.
    placer(&d.0).try_place(StepRef { job: 4, holder: me }, &request(Policy::Magm, 4096)).unwrap();
}

/// During an upgrade an older build may hold the lock and decide a newer
/// launch's queued request without keeping to the job's Slurm GPUs (it does
/// not know `within`): the launch refuses such an answer and gives it back,
/// rather than run on a GPU Slurm may hand whole to another job.
#[test]
fn an_answer_outside_the_jobs_slurm_gpus_is_given_back_and_refused() {
    let d = node("foreign", 2, 20480);
    let me = std::process::id();
    let step = StepRef { job: 9, holder: me };
    let req = Request { within: Some(vec![0]), ..request(Policy::Magm, 4096) };
    let store = StateStore::open(&d.0.join("state"), Duration::from_secs(10), Box::new(|_| {})).unwrap();
    let lock = store.exclusive().unwrap();
    let launch = {
        let (dir, req) = (d.0.clone(), req.clone());
        std::thread::spawn(move || placer(&dir).try_place(step, &req))
    };
    // The "older holder" (this thread, holding the lock): takes the queued
    // request, records it on GPU 1 as a policy that knew nothing of
    // `within` might, and answers.
    let q = Slots::open(&d.0.join("state")).unwrap();
    let taken = loop {
        let t = q.take_queued(&[], &|_| {});
        if !t.is_empty() {
            break t;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(taken[0].request.within, Some(vec![0]), "the request kept its Slurm GPUs through the queue");
    let mut lock = lock;
    let mut st = lock.load().unwrap();
    let mut r = carma_placement::Reservation::slurm_whole(9, vec![1], 1);
    (r.holding, r.exclusive, r.holders, r.reserved_mib) = (carma_placement::Holding::Carma, false, vec![me], 4096);
    st.reservations.push(r);
    lock.store(&st).unwrap();
    let foreign = carma_placement::Decision {
        gpus: vec![1],
        exclusive: false,
        reserve_mib: 4096,
        reused: false,
        history_mib: None,
        free_mib: vec![20480],
        metric: carma_config::ActivityMetric::Sm,
        activity: vec![0.0],
        slowdown: vec![1.0],
        learned_runtime_mib: None,
        learned_from: None,
    };
    assert!(q.answer(taken[0].slot, &Ok(foreign)));
    drop(lock);
    let err = launch.join().unwrap().unwrap_err().to_string();
    assert!(err.contains("not among the job's Slurm GPU(s) 0") && err.contains("given back"), "{err}");
    let st = store.snapshot().unwrap();
    assert!(
        st.reservations.iter().all(|r| r.job != 9),
        "the foreign answer's reservation stayed: {:?}",
        st.reservations
    );
    assert_eq!(busy(&d.0), 0);
}
