//! One request against a node's state and GPU readings: reuse the job's
//! GPUs, or apply the node's learned fixed part and the job's history,
//! choose (preconditions and policy), and record the reservation. Pure: the
//! plugin's placer runs it under the state lock, the trace simulator on its
//! simulated nodes.

use crate::gpu::GpuReading;
use crate::learned;
use crate::policy::{Demand, NoFit, Params, choose, history_estimate};
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
    if req.shares {
        st.drop_whole(step.job);
    }
    if let Some(r) = st.job_mut(step.job) {
        if !r.holders.contains(&step.holder) {
            r.holders.push(step.holder);
        }
        return Ok(Decision {
            gpus: r.gpus.clone(),
            exclusive: r.exclusive,
            reserve_mib: r.estimate_mib,
            reused: true,
            history_mib: None,
            free_mib: vec![],
            metric: params.metric,
            activity: vec![],
            learned_runtime_mib: None,
            learned_from: None,
        });
    }
    let mut demand =
        Demand { policy: req.policy, count: req.count, estimate_mib: req.estimate_mib, mps_uid: req.mps_uid };
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
        uid: req.uid,
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
        learned_runtime_mib: learned.map(|(l, _)| l),
        learned_from: learned.map(|(_, w)| w),
    })
}
