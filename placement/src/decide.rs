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
    let mut demand =
        Demand { policy: req.policy, count: req.count, estimate_mib: req.estimate_mib, mps_uid: req.mps_uid };
    // The model's part, and the node's own fixed part where it learned
    // a larger one than the estimate carries.
    let model_mib = req.runtime_mib.zip(req.estimate_mib).map(|(r, e)| e.saturating_sub(r));
    let mut learned_runtime_mib = req.runtime_mib.and_then(|r| learned::raise(&st.runtime_samples, learn, r));
    if let (Some(m), Some(l)) = (model_mib, learned_runtime_mib) {
        demand.estimate_mib = Some(m + l);
    }
    let history_mib = history_estimate(st, req.signature.as_deref(), demand.estimate_mib, req.history_first);
    if history_mib.is_some() {
        demand.estimate_mib = history_mib;
        learned_runtime_mib = None;
    }
    let choice = match choose(readings, st, &demand, params, owners) {
        Ok(c) => c,
        Err(e) if !retry(st) => return Err(e),
        Err(_) => choose(readings, st, &demand, params, owners)?,
    };
    st.reservations.push(Reservation {
        job: step.job,
        gpus: choice.gpus.clone(),
        estimate_mib: choice.reserve_mib,
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
    });
    Ok(Decision {
        gpus: choice.gpus,
        exclusive: choice.exclusive,
        reserve_mib: choice.reserve_mib,
        reused: false,
        history_mib,
        free_mib: choice.free_mib,
        metric: params.metric,
        activity: choice.activity,
        learned_runtime_mib,
    })
}

/// A later step of a job that holds GPUs here: it runs on them. It asks
/// for more GPUs than the job holds: refused, saying so (the job's GPUs
/// are the first step's). Its memory: a step that runs while only the
/// first step does shares the first step's promise (srun in a batch
/// script, whose options it inherits) and raises it where it asks more;
/// each further concurrent step adds its own estimate. What it adds must
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
        learned_runtime_mib: None,
    };
    if r.holders.contains(&step.holder) {
        return Ok(decision(r.estimate_mib));
    }
    if req.count as usize > r.gpus.len() {
        let held = r.gpus.len() as u32;
        let why = |_| Some(Reject::JobHolds { job: step.job, held });
        return Err(NoFit { wanted: req.count, reasons: r.gpus.iter().map(|g| (*g, why(g))).collect() });
    }
    // An exclusive holding is the job's whole GPUs: nothing to add.
    let asked = req.estimate_mib.filter(|_| !r.exclusive).unwrap_or(0);
    let base = r.estimate_mib.saturating_sub(st.step_parts.get(&step.job).map_or(0, |p| p.values().sum()));
    let alone_with_first = r.holders.len() <= 1;
    let (part, mine) = if alone_with_first { (asked.saturating_sub(base), asked.max(base)) } else { (asked, asked) };
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
    let r = st.job_mut(step.job).expect("found above");
    r.holders.push(step.holder);
    r.estimate_mib += part;
    Ok(decision(if r.exclusive { r.estimate_mib } else { mine }))
}
