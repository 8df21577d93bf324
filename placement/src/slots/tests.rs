//! The queue's slots: taking, answering, withdrawing, recovering.

use super::*;
use crate::test_support::TempDir;
use carma_config::Policy;
use std::time::Instant;

fn req(sig: Option<String>) -> Request {
    Request { signature: sig, ..Request::declared(Policy::Magm, 1000) }
}

fn decision() -> Decision {
    Decision {
        gpus: vec![1],
        exclusive: false,
        reserve_mib: 1000,
        reused: false,
        history_mib: None,
        free_mib: vec![9],
        metric: carma_config::ActivityMetric::Sm,
        learned_runtime_mib: None,
        learned_from: None,
        activity: vec![0.25],
        slowdown: vec![1.0],
    }
}

#[test]
fn a_request_is_taken_once_answered_and_its_owner_woken_in_another_mapping() {
    let d = TempDir::new();
    let (owner, decider) = (Slots::open(&d.0).unwrap(), Slots::open(&d.0).unwrap());
    let step = StepRef { job: 7, holder: 1 };
    let s = owner.enqueue(step, &req(None), None).unwrap();
    assert!(owner.take_answer(s).is_none(), "answered before anyone decided");
    let taken = decider.take_queued(&[], &|_| {});
    assert_eq!(taken.len(), 1);
    assert_eq!((taken[0].step, &taken[0].request), (step, &req(None)));
    assert!(decider.take_queued(&[], &|_| {}).is_empty(), "taken twice");
    let seen = owner.generation(s);
    let sleeper = std::thread::spawn(move || {
        let t = Instant::now();
        owner.wait(s, seen, Duration::from_secs(20));
        (t.elapsed(), owner.take_answer(s), owner.busy())
    });
    std::thread::sleep(Duration::from_millis(100));
    assert!(decider.answer(taken[0].slot, &Ok(decision())));
    let (took, answer, busy) = sleeper.join().unwrap();
    assert!(took < Duration::from_secs(10), "not woken: {took:?}");
    assert_eq!(answer, Some(Ok(decision())));
    assert_eq!(busy, 0, "slot not freed");
}

#[test]
fn withdrawn_put_back_recovered_and_dead_owners_slots() {
    let d = TempDir::new();
    let q = Slots::open(&d.0).unwrap();
    let a = q.enqueue(StepRef { job: 1, holder: 1 }, &req(None), None).unwrap();
    let b = q.enqueue(StepRef { job: 2, holder: 1 }, &req(None), None).unwrap();
    assert_eq!(q.withdraw(a), None);
    assert_eq!(q.busy(), 1);
    // A withdrawn slot's reuse is not someone else's to withdraw.
    let c = q.enqueue(StepRef { job: 3, holder: 1 }, &req(None), None).unwrap();
    assert_eq!(c.index, a.index);
    assert_eq!(q.withdraw(a), None);
    assert_eq!(q.busy(), 2, "withdrawing a stale claim freed another request");
    // Taken by a decider that died: put back for the next one.
    let t = q.take_queued(&[], &|_| {});
    assert_eq!(t.iter().map(|t| t.step.job).collect::<Vec<_>>(), vec![2, 3], "oldest first");
    q.recover_taken();
    let t = q.take_queued(&[b], &|_| {});
    assert_eq!(t.iter().map(|t| t.step.job).collect::<Vec<_>>(), vec![3], "skip list ignored");
    q.put_back(t[0].slot);
    assert_eq!(q.take_queued(&[], &|_| {}).len(), 2);
    // Owners are known by pid: ours is alive.
    q.reclaim(&|pid| pid == std::process::id());
    assert_eq!(q.busy(), 2);
    q.reclaim(&|_| false);
    assert_eq!(q.busy(), 0);
}

#[test]
fn full_queue_oversized_requests_and_garbage_payloads() {
    let d = TempDir::new();
    let q = Slots::open(&d.0).unwrap();
    assert!(q.enqueue(StepRef { job: 1, holder: 1 }, &req(Some("x".repeat(PAYLOAD))), None).is_none());
    let all: Vec<_> = (0..SLOTS).map(|j| q.enqueue(StepRef { job: j as u32, holder: 1 }, &req(None), None)).collect();
    assert!(all.iter().all(Option::is_some));
    assert!(q.enqueue(StepRef { job: 99, holder: 1 }, &req(None), None).is_none(), "more slots than exist");
    q.reclaim(&|_| false);
    let s = q.enqueue(StepRef { job: 1, holder: 1 }, &req(None), None).unwrap();
    q.write_payload(s.index, b"{not json");
    let lines = std::sync::Mutex::new(Vec::new());
    assert!(q.take_queued(&[], &|l| lines.lock().unwrap().push(l.to_string())).is_empty());
    assert!(lines.lock().unwrap()[0].contains("unreadable"));
    assert_eq!(q.busy(), 0);
}

/// A refusal travels with its reasons; a placement is the decision's
/// own JSON, as builds that answered placements only read it.
#[test]
fn refusals_are_answered_with_their_reasons_and_placements_as_before() {
    use crate::policy::{NoFit, Reject};
    let d = TempDir::new();
    let q = Slots::open(&d.0).unwrap();
    let why = NoFit { wanted: 1, reasons: vec![(0, Some(Reject::Exclusive(4))), (1, None)] };
    assert!(Slots::refusal_fits(&why));
    let s = q.enqueue(StepRef { job: 1, holder: 1 }, &req(None), Some(RefusalCount::Wait)).unwrap();
    let t = q.take_queued(&[], &|_| {});
    assert!(t[0].reads_refusals && t[0].count == Some(RefusalCount::Wait));
    let refusal = Refusal { why, counted: true };
    assert!(q.answer(t[0].slot, &Err(refusal.clone())));
    // An older build's owner parses it as a decision: it must fail.
    assert!(serde_json::from_slice::<Decision>(&q.read_payload(s.index)).is_err());
    assert_eq!(q.take_answer(s), Some(Err(refusal)));
    // An older build's request says nothing of refusals.
    let s = q.enqueue(StepRef { job: 4, holder: 1 }, &req(None), None).unwrap();
    let older = serde_json::to_vec(&serde_json::json!({"job": 4, "holder": 1, "request": req(None)})).unwrap();
    q.write_payload(s.index, &older);
    let t = q.take_queued(&[], &|_| {});
    assert!(!t[0].reads_refusals && t[0].count.is_none());
    q.put_back(t[0].slot);
    assert_eq!(q.withdraw(s), None);
    let s = q.enqueue(StepRef { job: 2, holder: 1 }, &req(None), None).unwrap();
    let t = q.take_queued(&[], &|_| {});
    assert!(q.answer(t[0].slot, &Ok(decision())));
    let older: Decision = serde_json::from_slice(&q.read_payload(s.index)).unwrap();
    assert_eq!(older, decision());
    assert_eq!(q.take_answer(s), Some(Ok(decision())));
    assert_eq!(q.busy(), 0);
    // Too large for the slot: queued again, for its owner to decide.
    let huge = Reject::NotIdleProcesses { count: usize::MAX, used_mib: u64::MAX };
    let why = NoFit { wanted: 1, reasons: (0..64).map(|g| (g, Some(huge.clone()))).collect() };
    assert!(!Slots::refusal_fits(&why));
    let s = q.enqueue(StepRef { job: 3, holder: 1 }, &req(None), None).unwrap();
    let t = q.take_queued(&[], &|_| {});
    assert!(!q.answer(t[0].slot, &Err(Refusal { why, counted: false })));
    assert_eq!(q.take_answer(s), None);
    assert_eq!(q.take_queued(&[], &|_| {}).len(), 1, "it left the queue");
}

#[test]
fn a_file_of_another_size_is_not_mapped() {
    let d = TempDir::new();
    std::fs::write(d.0.join(SLOTS_FILE), [0u8; 4096]).unwrap();
    assert!(Slots::open(&d.0).is_none());
}

/// A queue another user could write (or that another owns) carries that
/// user's word for requests and answers: not mapped (issue 58). Ours,
/// created here, is its owner's only.
#[test]
fn a_queue_file_others_may_write_or_own_is_not_mapped() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let d = TempDir::new();
    drop(Slots::open(&d.0).expect("created and mapped"));
    let path = d.0.join(SLOTS_FILE);
    assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o7777, 0o600);
    for mode in [0o646, 0o620] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        assert!(Slots::open(&d.0).is_none(), "mapped at mode {mode:o}");
    }
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
    assert!(Slots::open(&d.0).is_none(), "mapped a file another user owns");
    std::os::unix::fs::chown(&path, Some(0), None).unwrap();
    assert!(Slots::open(&d.0).is_some());
}
