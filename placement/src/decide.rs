//! One request against a node's state and GPU readings: reuse the job's
//! GPUs, or apply the node's learned fixed part and the job's history,
//! choose (preconditions and policy), and record the reservation. Pure: the
//! plugin's placer runs it under the state lock, the trace simulator on its
//! simulated nodes.

use crate::gpu::GpuReading;
use crate::learned;
use crate::policy::{Demand, NoFit, Params, Reject, choose, effective_free_mib, history_estimate};
use crate::request::{Decision, Request, StepRef};
use crate::state::{Holding, NodeState, Reservation};
use carma_config::LearnRuntime;
use std::collections::HashMap;

/// `retry`: called once a choice fails; `true` when it changed the state
/// (collected stale reservations) and the choice is worth trying again.
#[allow(clippy::too_many_arguments)]
pub fn decide(
    st: &mut NodeState,
    step: StepRef,
    req: &Request,
    readings: &[GpuReading],
    owners: &HashMap<u32, u32>,
    params: &Params,
    learn: &LearnRuntime,
    now_secs: u64,
    retry: &mut dyn FnMut(&mut NodeState) -> bool,
) -> Result<Decision, NoFit> {
    // Recent placements count against the activity cap from now on.
    let params = &Params { now_secs, ..*params };
    if req.shares {
        st.drop_whole(step.job);
    }
    if st.job(step.job).is_some() {
        return join(st, step, req, readings, owners, params);
    }
    let profile = req.profile_key.as_ref().and_then(|k| st.profiles.get(k)).copied();
    let mut demand =
        Demand { policy: req.policy, count: req.count, estimate_mib: req.estimate_mib, mps_uid: req.mps_uid, profile };
    // The model's part, and the node's own fixed part where it learned
    // a larger one than the estimate carries.
    let model_mib = req.runtime_mib.zip(req.estimate_mib).map(|(r, e)| e.saturating_sub(r));
    let mut learned = req.runtime_mib.and_then(|r| learned::raise(&st.runtime_by_user, req.uid, learn, r));
    if let (Some(m), Some((l, _))) = (model_mib, learned) {
        demand.estimate_mib = Some(m + l);
    }
    let history_mib = history_estimate(st, req.signature.as_deref(), demand.estimate_mib, req.history_first);
    if history_mib.is_some() {
        demand.estimate_mib = history_mib;
        learned = None;
    }
    if let Some(sig) = req.signature.as_deref().filter(|s| st.history.contains_key(*s)) {
        st.touch_history(sig);
    }
    // Only the GPUs Slurm allocated to the job are candidates.
    let slurms: Vec<GpuReading>;
    let readings = match &req.within {
        Some(within) => {
            slurms = readings.iter().filter(|g| within.contains(&g.index)).cloned().collect();
            &slurms[..]
        }
        None => readings,
    };
    // A Slurm GPU no reading has is named, not passed over in silence.
    let unread = |mut e: NoFit| {
        for &g in req.within.iter().flatten().filter(|g| !readings.iter().any(|r| r.index == **g)) {
            e.reasons.push((g, Some(Reject::NotRead)));
        }
        e
    };
    let choice = match choose(readings, st, &demand, params, owners) {
        Ok(c) => c,
        Err(e) if !retry(st) => return Err(unread(e)),
        Err(_) => choose(readings, st, &demand, params, owners).map_err(unread)?,
    };
    st.reservations.push(Reservation {
        job: step.job,
        gpus: choice.gpus.clone(),
        reserved_mib: choice.reserve_mib,
        estimate_source: if history_mib.is_some() { "history".into() } else { req.estimate_source.clone() },
        exclusive: choice.exclusive,
        holding: Holding::Carma,
        policy: Some(req.policy),
        since: now_secs,
        holders: vec![step.holder],
        signature: req.signature.clone(),
        observed_mib: 0,
        mps_uid: req.mps_uid.filter(|_| !choice.exclusive),
        model_mib,
        uid: req.uid,
        profile,
        profile_key: req.profile_key.clone(),
        alone_since: None,
    });
    if req.batch_step {
        st.batch_steps.insert(step.job, step.holder);
    }
    Ok(Decision {
        gpus: choice.gpus,
        exclusive: choice.exclusive,
        reserve_mib: choice.reserve_mib,
        reused: false,
        history_mib,
        free_mib: choice.free_mib,
        metric: params.metric,
        activity: choice.activity,
        slowdown: choice.slowdown,
        learned_runtime_mib: learned.map(|(l, _)| l),
        learned_from: learned.map(|(_, w)| w),
    })
}

/// A later step of a job that holds GPUs here: it runs on them. It asks
/// for more GPUs than the job holds: refused, saying so (the job's GPUs
/// are the first step's). Its memory: a step that runs while only the
/// batch step does shares the job's promise (srun in a batch script,
/// whose options it inherits) and raises it where it asks more; every
/// other concurrent step adds its own estimate. What it adds must
/// fit the job's GPUs (else it waits like any step that does not fit),
/// and is taken back when the step ends ([`NodeState::release_holder`]).
fn join(
    st: &mut NodeState,
    step: StepRef,
    req: &Request,
    readings: &[GpuReading],
    owners: &HashMap<u32, u32>,
    params: &Params,
) -> Result<Decision, NoFit> {
    let r = st.job(step.job).expect("the caller found it").clone();
    let decision = |reserve_mib: u64| Decision {
        gpus: r.gpus.clone(),
        exclusive: r.exclusive,
        reserve_mib,
        reused: true,
        history_mib: None,
        free_mib: vec![],
        metric: params.metric,
        activity: vec![],
        slowdown: vec![],
        learned_runtime_mib: None,
        learned_from: None,
    };
    if r.holders.contains(&step.holder) {
        return Ok(decision(r.reserved_mib));
    }
    if req.count as usize > r.gpus.len() {
        let held = r.gpus.len() as u32;
        let why = |_| Some(Reject::JobHolds { job: step.job, held });
        return Err(NoFit { wanted: req.count, reasons: r.gpus.iter().map(|g| (*g, why(g))).collect() });
    }
    // GPUs Slurm gave the job whole may carry jobs CARMA placed (under
    // `gpu_owner: carma` CARMA may place a shard job away from its shard's
    // GPU, and Slurm, which counts the shard there, then hands this GPU
    // whole; on 22.05 Slurm may do so itself). The job starts there only
    // where its size fits beside them (of unknown size: where none is),
    // else it waits like any step that does not fit, instead of running
    // out of memory beside them (seen in a 16-node replay).
    if r.holding == Holding::SlurmWhole && r.holders.is_empty() {
        let reasons: Vec<_> = r
            .gpus
            .iter()
            .map(|&g| {
                let other = st
                    .reservations
                    .iter()
                    .find(|o| o.holding == Holding::Carma && o.job != step.job && o.gpus.contains(&g));
                let why = other.and_then(|o| match (req.estimate_mib, readings.iter().find(|x| x.index == g)) {
                    (Some(est), Some(reading)) => {
                        let free = effective_free_mib(reading, st, owners);
                        (free < est.saturating_add(params.headroom_mib)).then_some(Reject::Memory {
                            free_mib: free,
                            estimate_mib: est,
                            headroom_mib: params.headroom_mib,
                        })
                    }
                    _ => Some(Reject::NotIdleJob(o.job)),
                });
                (g, why)
            })
            .collect();
        if reasons.iter().any(|(_, why)| why.is_some()) {
            return Err(NoFit { wanted: req.count, reasons });
        }
    }
    // An exclusive holding is the job's whole GPUs: nothing to add.
    let asked = req.estimate_mib.filter(|_| !r.exclusive).unwrap_or(0);
    let base = r.reserved_mib.saturating_sub(st.step_parts.get(&step.job).map_or(0, |p| p.values().sum()));
    // Inside the batch script (or after the job's steps ended): the
    // job's promise is there for it.
    let batch = st.batch_steps.get(&step.job);
    let in_batch = r.holders.iter().all(|h| Some(h) == batch);
    let (part, mine) = if in_batch { (asked.saturating_sub(base), asked.max(base)) } else { (asked, asked) };
    if part > 0 {
        let reasons: Vec<_> = readings
            .iter()
            .filter(|g| r.gpus.contains(&g.index))
            .map(|g| {
                let free = effective_free_mib(g, st, owners);
                let short = free < part + params.headroom_mib;
                (
                    g.index,
                    short.then_some(Reject::Memory {
                        free_mib: free,
                        estimate_mib: part,
                        headroom_mib: params.headroom_mib,
                    }),
                )
            })
            .collect();
        if reasons.iter().any(|(_, why)| why.is_some()) {
            return Err(NoFit { wanted: req.count, reasons });
        }
        st.step_parts.entry(step.job).or_default().insert(step.holder, part);
    }
    if req.batch_step {
        st.batch_steps.insert(step.job, step.holder);
    }
    let r = st.job_mut(step.job).expect("found above");
    r.holders.push(step.holder);
    r.reserved_mib += part;
    Ok(decision(if r.exclusive { r.reserved_mib } else { mine }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use carma_config::Policy;

    fn gpus(used: u64) -> Vec<GpuReading> {
        (0..2).map(|i| GpuReading { used_mib: used, ..GpuReading::idle(i, format!("GPU-{i}"), 40960) }).collect()
    }

    fn step(st: &mut NodeState, holder: u32, req: &Request, readings: &[GpuReading]) -> Result<Decision, NoFit> {
        let p = Params::default();
        let learn = LearnRuntime::default();
        decide(st, StepRef { job: 7, holder }, req, readings, &HashMap::new(), &p, &learn, 1, &mut |_| false)
    }

    fn mem(mib: u64) -> Request {
        Request::declared(Policy::FirstFit, mib)
    }

    /// A step goes to the GPU Slurm allocated to its job, even where
    /// another GPU has more room: Slurm may hand that one whole to a job
    /// that did not opt in to sharing (docs/architecture.md, "Who owns a
    /// GPU").
    #[test]
    fn a_step_is_placed_only_on_its_jobs_slurm_gpus() {
        let mut st = NodeState::default();
        let mut g = gpus(0);
        g[0].used_mib = 30720;
        let magm = |within| Request { within, ..Request::declared(Policy::Magm, 4096) };
        assert_eq!(step(&mut st, 100, &magm(None), &g).unwrap().gpus, vec![1], "any GPU: the emptier one");
        let mut st = NodeState::default();
        assert_eq!(step(&mut st, 100, &magm(Some(vec![0])), &g).unwrap().gpus, vec![0], "Slurm's GPU 0");
        let mut st = NodeState::default();
        let big = Request { within: Some(vec![0]), ..Request::declared(Policy::Magm, 16384) };
        let no = step(&mut st, 100, &big, &g).unwrap_err();
        assert_eq!(no.reasons.len(), 1, "GPU 1 is not the job's: {no}");
        assert!(st.reservations.is_empty());
    }

    /// GPUs Slurm gave a job whole, on which CARMA placed another job
    /// (`gpu_owner: carma`: Slurm counts that job's shard on another GPU):
    /// the whole job's step starts where its size fits beside it, else
    /// waits, naming why, and runs once the other has ended; of unknown
    /// size it waits for the GPU to be free. A stale whole-GPU record of
    /// another job does not hold it back.
    #[test]
    fn a_whole_gpu_job_waits_for_a_job_carma_placed_on_its_gpus_where_it_does_not_fit() {
        // (Job 5 has not touched its memory yet: its promise counts.)
        let g = gpus(0);
        let fresh = || {
            let mut st = NodeState::default();
            let mut other = Reservation { job: 5, holders: vec![50], ..Reservation::slurm_whole(5, vec![1], 1) };
            (other.holding, other.exclusive, other.reserved_mib) = (Holding::Carma, false, 30720);
            st.reservations.push(other);
            st.reservations.push(Reservation::slurm_whole(6, vec![0], 1));
            st.reservations.push(Reservation::slurm_whole(7, vec![0, 1], 1));
            st
        };
        let req = |mib| Request { count: 2, within: Some(vec![0, 1]), shares: false, ..mem(mib) };
        let mut st = fresh();
        let no = step(&mut st, 100, &req(20480), &g).unwrap_err();
        assert_eq!(no.reasons[0], (0, None), "job 6's whole record is stale: {no}");
        assert!(matches!(no.reasons[1], (1, Some(Reject::Memory { free_mib: 10240, .. }))), "{no}");
        assert!(st.job(7).unwrap().holders.is_empty(), "nothing recorded for the refused step");
        let unknown = Request { estimate_mib: None, ..req(0) };
        assert_eq!(step(&mut st, 100, &unknown, &g).unwrap_err().reasons[1], (1, Some(Reject::NotIdleJob(5))));
        // It fits beside it.
        let d = step(&mut fresh(), 100, &req(4096), &g).unwrap();
        assert!(d.reused && d.exclusive && d.gpus == vec![0, 1], "{d:?}");
        st.release_job(5);
        let d = step(&mut st, 100, &req(20480), &g).unwrap();
        assert!(d.reused && d.gpus == vec![0, 1], "{d:?}");
    }

    /// A Slurm GPU that no reading has (Slurm's indices are not NVML's) is
    /// named in the refusal, not left out of it.
    #[test]
    fn a_slurm_gpu_without_a_reading_is_named() {
        let mut st = NodeState::default();
        let g = gpus(0);
        let req = Request { within: Some(vec![5]), ..Request::declared(Policy::Magm, 4096) };
        let no = step(&mut st, 100, &req, &g).unwrap_err();
        assert_eq!(no.reasons, vec![(5, Some(Reject::NotRead))], "{no}");
        assert!(
            no.to_string().contains("GPU5: Slurm gave the job this GPU, but no GPU with this index was read"),
            "{no}"
        );
        assert_eq!(no.class(), "gpu_count");
    }

    /// Two concurrent `srun --carma-mem=10G &` steps (no batch step, as
    /// under salloc) promise 20 GiB; each one's part goes when it ends.
    #[test]
    fn concurrent_steps_promises_add_up() {
        let mut st = NodeState::default();
        let g = gpus(0);
        assert_eq!(step(&mut st, 100, &mem(10240), &g).unwrap().gpus, vec![0]);
        let second = step(&mut st, 101, &mem(10240), &g).unwrap();
        assert!(second.reused && second.gpus == vec![0]);
        assert_eq!(st.job(7).unwrap().reserved_mib, 20480);
        assert_eq!(crate::policy::promised_mib(&g[0], &st, &HashMap::new()), 20480);
        assert!(st.release_holder(7, 101).is_none());
        assert_eq!(st.job(7).unwrap().reserved_mib, 10240, "the ended step's part is taken back");
        // A third, after the second ended, again adds to the first.
        step(&mut st, 102, &mem(4096), &g).unwrap();
        assert_eq!(st.job(7).unwrap().reserved_mib, 14336);
        // Garbage collection takes a dead step's part back too.
        st.collect_garbage(|_, pid| pid != 102, |_| true);
        assert_eq!(st.job(7).unwrap().reserved_mib, 10240);
    }

    /// srun inside a batch script shares the batch step's promise (it
    /// inherits the job's options), raises it where it asks more, and a
    /// second concurrent srun adds its own.
    #[test]
    fn steps_inside_a_batch_script_share_its_promise() {
        let mut st = NodeState::default();
        let g = gpus(0);
        let batch = Request { batch_step: true, ..mem(10240) };
        step(&mut st, 100, &batch, &g).unwrap();
        step(&mut st, 101, &mem(10240), &g).unwrap();
        assert_eq!(st.job(7).unwrap().reserved_mib, 10240, "one srun in the script: the job's promise");
        step(&mut st, 102, &mem(10240), &g).unwrap();
        assert_eq!(st.job(7).unwrap().reserved_mib, 20480, "a second concurrent srun adds");
        st.release_holder(7, 102);
        st.release_holder(7, 101);
        // A later srun asking more than the job holds raises the promise.
        let d = step(&mut st, 103, &mem(16384), &g).unwrap();
        assert_eq!((d.reserve_mib, st.job(7).unwrap().reserved_mib), (16384, 16384));
        st.release_holder(7, 103);
        assert_eq!(st.job(7).unwrap().reserved_mib, 10240);
    }

    /// A step asking more than the job's GPUs can take waits (a memory
    /// refusal); one asking more GPUs than the job holds is refused at once,
    /// saying how to ask.
    #[test]
    fn a_step_asking_more_than_fits_is_refused_clearly() {
        let mut st = NodeState::default();
        step(&mut st, 100, &mem(10240), &gpus(0)).unwrap();
        let e = step(&mut st, 101, &mem(30720), &gpus(0)).unwrap_err();
        assert_eq!(e.class(), "memory", "{e}");
        assert_eq!(st.job(7).unwrap().reserved_mib, 10240, "nothing added by a refused step");
        assert!(!st.job(7).unwrap().holders.contains(&101));
        let two = Request { count: 2, ..mem(1024) };
        let e = step(&mut st, 102, &two, &gpus(0)).unwrap_err();
        assert_eq!(e.class(), "gpu_count", "{e}");
        assert!(e.to_string().contains("--carma-gpus"), "{e}");
    }

    #[test]
    fn a_later_run_of_a_profiled_job_is_placed_with_its_profile() {
        // decide takes the key's profile: a light job is predicted 1.00x
        // beside mobilenet; one of a key not yet profiled, at its worst (as
        // if it filled the GPU), 1.98x.
        use crate::slowdown::Profile;
        let mobilenet = Profile { busy: 0.541, sm: 0.312 };
        let mut st = NodeState::default();
        st.profiles.insert("7:light".into(), Profile { busy: 0.2, sm: 0.1 });
        st.reservations
            .push(Reservation { profile: Some(mobilenet), ..crate::test_support::carma(1, vec![0], 4096, 1001) });
        let g = [GpuReading {
            sm_activity: 0.31,
            busy: 0.54,
            used_mib: 4096,
            processes: vec![crate::gpu::GpuProcess { pid: 101, used_mib: 4096 }],
            ..GpuReading::idle(0, "GPU-0", 81920)
        }];
        let req = |key: &str| Request { profile_key: Some(key.into()), ..Request::declared(Policy::Magm, 4096) };
        let run = |st: &mut NodeState, key: &str, job: u32| {
            decide(
                st,
                StepRef { job, holder: 1000 + job },
                &req(key),
                &g,
                &HashMap::from([(101, 1001)]),
                &Params { now_secs: 1000, ..Params::default() },
                &carma_config::LearnRuntime::default(),
                1000,
                &mut |_| false,
            )
        };
        let unknown = run(&mut st.clone(), "7:unknown", 5).unwrap();
        assert!(unknown.to_string().contains("predicted_slowdown=1.98"), "{unknown}");
        let d = run(&mut st, "7:light", 6).unwrap();
        assert!(d.to_string().contains("predicted_slowdown=1.00"), "{d}");
        assert_eq!(st.job(6).and_then(|r| r.profile), Some(Profile { busy: 0.2, sm: 0.1 }));
    }
}
