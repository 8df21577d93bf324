//! `carma status`: GPUs, live memory, SM activity, busy time, promises and
//! jobs; `carma place --dry-run`: where a job would go now, and why not
//! elsewhere, from the plugin's own precondition and policy code.

use carma_config::{EstimatorConfig, LearnRuntime};
use carma_placement::policy::{Demand, NoFit, Params, assess, effective_free_mib, promised_mib};
use carma_placement::slowdown::Profile;
use carma_placement::{Decision, GpuReading, LinuxProcesses, NodeState, Processes, Request, StepRef};
use serde_json::json;
use std::collections::HashMap;

fn owners(gpus: &[GpuReading], state: &NodeState) -> HashMap<u32, u32> {
    LinuxProcesses.owners_on(gpus, state)
}

/// Drops from the readings processes that ended between the reading and
/// the /proc walk that attributes them (their memory is freed as a process
/// exits): shown, they would count once as used and once more inside their
/// job's promise. Placement keeps them, erring on the safe side.
pub fn settle(mut gpus: Vec<GpuReading>, state: &NodeState) -> Vec<GpuReading> {
    let owners = owners(&gpus, state);
    for g in &mut gpus {
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut g.processes)
            .into_iter()
            .partition(|p| !owners.contains_key(&p.pid) && !carma_placement::procs::alive(p.pid));
        g.used_mib = g.used_mib.saturating_sub(gone.iter().map(|p| p.used_mib).sum());
        g.processes = kept;
    }
    gpus
}

/// Who owns a GPU now (docs/architecture.md, "Who owns a GPU"): nobody;
/// one job whole (Slurm's allocation, or a CARMA exclusive placement); CARMA
/// jobs sharing it; or processes CARMA ties to no job. `Conflict` is what
/// must never be: a job Slurm gave the GPU whole beside any other holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    Free,
    SlurmWhole(u32),
    Exclusive(u32),
    Shared(Vec<u32>),
    Unclaimed(usize),
    Conflict(Vec<u32>),
}

impl Owner {
    pub fn of(g: &GpuReading, state: &NodeState, owners: &HashMap<u32, u32>) -> Owner {
        use carma_placement::Holding;
        let on: Vec<_> = state.reservations.iter().filter(|r| r.gpus.contains(&g.index)).collect();
        let jobs: Vec<u32> = on.iter().map(|r| r.job).collect();
        let whole = on.iter().find(|r| r.holding == Holding::SlurmWhole || r.exclusive);
        match (whole, on.len()) {
            (Some(_), n) if n > 1 => Owner::Conflict(jobs),
            (Some(r), _) if r.holding == Holding::SlurmWhole => Owner::SlurmWhole(r.job),
            (Some(r), _) => Owner::Exclusive(r.job),
            (None, 0) if Owner::stray(g, owners) > 0 => Owner::Unclaimed(Owner::stray(g, owners)),
            (None, 0) => Owner::Free,
            (None, _) => Owner::Shared(jobs),
        }
    }

    /// Processes on the GPU that CARMA ties to no job's slurmstepd (on a
    /// GPU Slurm gave whole, the job's own tasks are among them: its steps
    /// are no CARMA holders).
    fn stray(g: &GpuReading, owners: &HashMap<u32, u32>) -> usize {
        g.processes.iter().filter(|p| !owners.contains_key(&p.pid)).count()
    }

    fn kind(&self) -> &'static str {
        match self {
            Owner::Free => "free",
            Owner::SlurmWhole(_) => "slurm_whole",
            Owner::Exclusive(_) => "exclusive",
            Owner::Shared(_) => "shared",
            Owner::Unclaimed(_) => "unclaimed",
            Owner::Conflict(_) => "conflict",
        }
    }

    fn jobs(&self) -> Vec<u32> {
        match self {
            Owner::SlurmWhole(j) | Owner::Exclusive(j) => vec![*j],
            Owner::Shared(j) | Owner::Conflict(j) => j.clone(),
            Owner::Free | Owner::Unclaimed(_) => vec![],
        }
    }

    /// With the count of processes on a CARMA GPU that no CARMA job holds
    /// (`+Nproc`): something outside Slurm's and CARMA's view shares it.
    fn shown(&self, g: &GpuReading, owners: &HashMap<u32, u32>) -> String {
        match (self, Owner::stray(g, owners)) {
            (Owner::Exclusive(_) | Owner::Shared(_), n) if n > 0 => format!("{self}+{n}proc"),
            _ => self.to_string(),
        }
    }

    fn json(&self, g: &GpuReading, owners: &HashMap<u32, u32>) -> serde_json::Value {
        json!({"kind": self.kind(), "jobs": self.jobs(), "unclaimed_processes": Owner::stray(g, owners)})
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |j: &[u32]| j.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        match self {
            Owner::Free => write!(f, "free"),
            Owner::SlurmWhole(j) => write!(f, "slurm:{j}"),
            Owner::Exclusive(j) => write!(f, "carma:{j}"),
            Owner::Shared(j) => write!(f, "shared:{}", list(j)),
            Owner::Unclaimed(n) => write!(f, "unclaimed:{n}proc"),
            Owner::Conflict(j) => write!(f, "CONFLICT:{}", list(j)),
        }
    }
}

pub fn table(gpus: &[GpuReading], state: &NodeState) -> String {
    let owners = owners(gpus, state);
    let mut out = format!(
        "{:<4} {:<14} {:>8} {:>8} {:>9} {:>9} {:>5} {:>5}  {:<16} {}\n",
        "GPU", "UUID", "USED", "TOTAL", "PROMISED", "EFF.FREE", "SM", "BUSY", "OWNER", "JOBS (id:policy:reserve)"
    );
    for g in gpus {
        let jobs: Vec<String> = state
            .reservations
            .iter()
            .filter(|r| r.gpus.contains(&g.index))
            .map(|r| {
                let policy = r.policy.map(|p| p.name()).unwrap_or("slurm-whole");
                let excl = if r.exclusive { ":excl" } else { "" };
                format!("{}:{policy}:{}M{excl}", r.job, r.reserved_mib)
            })
            .collect();
        out.push_str(&format!(
            "{:<4} {:<14} {:>7}M {:>7}M {:>8}M {:>8}M {:>5.2} {:>5.2}  {:<16} {}\n",
            g.index,
            g.uuid.chars().take(14).collect::<String>(),
            g.used_mib,
            g.total_mib,
            promised_mib(g, state, &owners),
            effective_free_mib(g, state, &owners),
            g.sm_activity,
            g.busy,
            Owner::of(g, state, &owners).shown(g, &owners),
            if jobs.is_empty() { "-".into() } else { jobs.join(" ") }
        ));
    }
    out
}

pub fn to_json(gpus: &[GpuReading], state: &NodeState) -> serde_json::Value {
    let owners = owners(gpus, state);
    json!({
        "gpus": gpus.iter().map(|g| json!({
            "index": g.index,
            "uuid": g.uuid,
            "minor": g.minor,
            "total_mib": g.total_mib,
            "used_mib": g.used_mib,
            "promised_mib": promised_mib(g, state, &owners),
            "effective_free_mib": effective_free_mib(g, state, &owners),
            "sm_activity": g.sm_activity,
            "busy": g.busy,
            "sm_occupancy": g.sm_occupancy,
            "mps_uid": g.mps_uid,
            "power_w": g.power_w,
            "processes": g.processes,
            "jobs": state.reservations.iter().filter(|r| r.gpus.contains(&g.index)).map(|r| r.job).collect::<Vec<_>>(),
            "owner": Owner::of(g, state, &owners).json(g, &owners),
        })).collect::<Vec<_>>(),
        "reservations": state.reservations,
        "rr_cursor": state.rr_cursor,
    })
}

/// The node's fixed memory per job (the stack's part of model-based
/// estimates), configured and learned (per user, and the node's value over
/// its users: placement/src/learned.rs): a line and JSON.
pub fn runtime(est: &EstimatorConfig, state: &NodeState) -> (String, serde_json::Value) {
    use carma_placement::learned;
    let l = &est.learn_runtime;
    let configured = est.runtime_mib;
    if l.min_jobs == 0 {
        let v =
            json!({"configured_mib": configured, "learned_mib": null, "observed_jobs": 0, "min_jobs": 0, "users": {}});
        return (format!("runtime: {configured} MiB (estimator.runtime; learning off)"), v);
    }
    let node = learned::node_value(&state.runtime_by_user, l);
    let mut users = serde_json::Map::new();
    let mut parts = Vec::new();
    let mut seen_all = 0;
    for (uid, u) in &state.runtime_by_user {
        let seen = u.samples.len().min(l.window as usize);
        seen_all += seen;
        let v = learned::value(&u.samples, l);
        users.insert(uid.to_string(), json!({"learned_mib": v, "observed_jobs": seen}));
        parts.push(match v {
            Some(v) => format!("uid {uid}: {v} MiB learned from {seen} jobs"),
            None => format!("uid {uid}: {seen} of {} jobs observed", l.min_jobs),
        });
    }
    let node_part = match node {
        Some(v) if v > configured => format!("node: {v} MiB (more than half of its users), used in place of it"),
        Some(v) => format!("node: {v} MiB, not above it"),
        None => "node: not learned (two users need a learned value)".to_string(),
    };
    let users_part = if parts.is_empty() { "no job observed yet".to_string() } else { parts.join(", ") };
    let line = format!(
        "runtime: {configured} MiB (estimator.runtime); {node_part}; per user (quantile {} of the latest {}, used in place of it where larger): {users_part}",
        l.quantile, l.window
    );
    let v = json!({"configured_mib": configured, "learned_mib": node, "observed_jobs": seen_all,
        "min_jobs": l.min_jobs, "users": users});
    (line, v)
}

/// The precondition in force, as one line: `precondition: sm <= 0.80, headroom 2048 MiB`.
pub fn precondition(p: &Params) -> String {
    let guard = if p.max_slowdown.is_finite() {
        format!("predicted slowdown <= {:.2}x ({} model; max_slowdown)", p.max_slowdown, p.sharing.name())
    } else {
        "no slowdown guard (max_slowdown: off)".into()
    };
    let idle = if p.idle_first { ", idle GPUs first" } else { "" };
    format!(
        "precondition: {} <= {:.2} (activity_metric), {guard}, headroom {} MiB{idle}",
        p.metric,
        p.cap(),
        p.headroom_mib
    )
}

/// What the slowdown guard sees on each GPU: its jobs' profiles (what each
/// did to a GPU alone; unprofiled ones count as filling it) and their
/// predicted slowdowns together, as lines and JSON.
pub fn slowdowns(gpus: &[GpuReading], state: &NodeState, p: &Params) -> (String, serde_json::Value) {
    let model = p.model();
    let mut text = String::new();
    let mut per_gpu = Vec::new();
    for g in gpus {
        let jobs: Vec<&carma_placement::Reservation> = state
            .reservations
            .iter()
            .filter(|r| r.gpus.contains(&g.index) && r.holding == carma_placement::Holding::Carma && !r.exclusive)
            .collect();
        if jobs.is_empty() {
            continue;
        }
        let profiles: Vec<Profile> = jobs.iter().map(|r| r.profile.unwrap_or(Profile::UNKNOWN)).collect();
        let predicted = model.slowdowns(&profiles);
        let shown: Vec<String> = jobs
            .iter()
            .zip(&predicted)
            .map(|(r, s)| match r.profile {
                Some(pr) => format!("job {} {s:.2}x (busy {:.2}, SM {:.2} alone)", r.job, pr.busy, pr.sm),
                None => format!("job {} {s:.2}x (not yet profiled)", r.job),
            })
            .collect();
        text.push_str(&format!("slowdown: GPU{}: {}\n", g.index, shown.join(", ")));
        per_gpu.push(json!({
            "index": g.index,
            "jobs": jobs.iter().zip(&predicted).map(|(r, s)| json!({
                "job": r.job, "predicted_slowdown": s, "profile": r.profile,
            })).collect::<Vec<_>>(),
        }));
    }
    let v = json!({
        "max_slowdown": if p.max_slowdown.is_finite() { json!(p.max_slowdown) } else { json!("off") },
        "model": p.sharing.name(),
        "gpus": per_gpu,
        "profiles_learned": state.profiles.len(),
    });
    text.push_str(&format!("profiles learned on this node: {} (per user and job)\n", state.profiles.len()));
    (text, v)
}

/// A job id no Slurm job has (Slurm's ids stay below 2^26): the dry run's
/// reservation in the state copy is never an existing job's, reused.
const DRY_RUN_JOB: u32 = u32::MAX;

/// What a dry run found: the plugin's decision, the per-GPU estimate it
/// decided with (after history and the learned fixed part), and each
/// GPU's verdict as lines.
pub struct DryRun {
    pub decision: Result<Decision, NoFit>,
    pub estimate_mib: Option<u64>,
    pub verdicts: String,
}

/// Where `req` would be placed now: the plugin's own decision
/// (`carma_placement::decide`: the job's history, the node's learned fixed
/// part, preconditions and policy) on a copy of the state, so nothing is
/// reserved or written; and every GPU's verdict.
pub fn dry_run(
    gpus: &[GpuReading],
    state: &NodeState,
    req: &Request,
    p: &Params,
    learn: &LearnRuntime,
    now_secs: u64,
) -> DryRun {
    let owners = owners(gpus, state);
    let step = StepRef { job: DRY_RUN_JOB, holder: 0 };
    let mut copy = state.clone();
    let decision =
        carma_placement::decide::decide(&mut copy, step, req, gpus, &owners, p, learn, now_secs, &mut |_| false);
    // The estimate the decision was made with, as decide derived it.
    let estimate_mib = match &decision {
        Ok(d) => d.history_mib.or_else(|| {
            let learned = d.learned_runtime_mib.zip(req.runtime_mib).zip(req.estimate_mib);
            learned.map(|((l, rt), e)| e.saturating_sub(rt) + l).or(req.estimate_mib)
        }),
        Err(_) => req.estimate_mib,
    };
    let profile = req.profile_key.as_ref().and_then(|k| state.profiles.get(k)).copied();
    let reasons = match &decision {
        Err(n) => n.reasons.clone(),
        Ok(_) => {
            let demand = Demand { policy: req.policy, count: req.count, estimate_mib, mps_uid: req.mps_uid, profile };
            assess(gpus, state, &demand, p, &owners).2
        }
    };
    let chosen: &[u32] = decision.as_ref().map(|c| c.gpus.as_slice()).unwrap_or(&[]);
    let mut out = String::new();
    for (g, (index, why)) in gpus.iter().zip(&reasons) {
        let reading = format!(
            "{} {:.2}, effective free {} MiB, predicted slowdown {:.2}x",
            p.metric.label(),
            g.activity(p.metric),
            effective_free_mib(g, state, &owners),
            carma_placement::policy::predicted_slowdown(g, state, profile, p)
        );
        let verdict = match why {
            Some(r) => format!("no: {r}"),
            None if chosen.contains(index) => format!("chosen ({reading})"),
            None => format!("qualifies, ranked after the chosen ({reading})"),
        };
        out.push_str(&format!("GPU{index}: {verdict}\n"));
    }
    DryRun { decision, estimate_mib, verdicts: out }
}

#[cfg(test)]
mod tests {
    use super::*;
    use carma_placement::GpuProcess;

    fn reading(index: u32, used_mib: u64) -> GpuReading {
        GpuReading { used_mib, sm_activity: 0.1, busy: 0.1, ..GpuReading::idle(index, format!("GPU-{index}"), 40960) }
    }

    #[test]
    fn a_dry_run_decides_as_the_plugin_does_where_history_changes_the_answer() {
        use carma_config::Policy;
        // GPU0 has 24 GiB free, GPU1 36 GiB. The job asks 8 GiB, but its
        // history says it peaked at 30000 MiB: best fit picks GPU0 for
        // 8 GiB, and only GPU1 fits what history asks.
        let gpus = vec![reading(0, 16384), reading(1, 4096)];
        let mut state = NodeState::default();
        state.history.insert("1000:sig".into(), 30000);
        let req = Request {
            policy: Policy::BestFit,
            count: 1,
            estimate_mib: Some(8192),
            estimate_source: "declared".into(),
            shares: true,
            signature: Some("1000:sig".into()),
            history_first: false,
            mps_uid: None,
            runtime_mib: None,
            batch_step: false,
            uid: None,
            within: None,
            profile_key: None,
        };
        let p = Params {
            metric: carma_config::ActivityMetric::Sm,
            sm_activity_cap: 0.8,
            busy_cap: 0.8,
            headroom_mib: 2048,
            ..Params::default()
        };
        let learn = LearnRuntime::default();
        let dry = dry_run(&gpus, &state, &req, &p, &learn, 100);
        // The plugin's placement on the same state.
        let mut real_state = state.clone();
        let real = carma_placement::decide::decide(
            &mut real_state,
            StepRef { job: 42, holder: 4242 },
            &req,
            &gpus,
            &HashMap::new(),
            &p,
            &learn,
            100,
            &mut |_| false,
        )
        .unwrap();
        let d = dry.decision.unwrap();
        assert_eq!((d.gpus.clone(), d.history_mib), (real.gpus.clone(), real.history_mib));
        assert_eq!(d.gpus, vec![1], "history asks 33000 MiB: only GPU1 fits");
        assert_eq!(dry.estimate_mib, Some(33000));
        assert!(dry.verdicts.contains("GPU0: no: effective free"), "{}", dry.verdicts);
        assert!(state.reservations.is_empty(), "the dry run reserved nothing");
    }

    /// Each GPU's owner, the conflict that must never be included.
    #[test]
    fn each_gpu_has_one_owner_and_a_conflict_is_named() {
        use carma_placement::{Holding, Reservation};
        let me = std::process::id();
        let mut gpus: Vec<GpuReading> = (0..6).map(|i| GpuReading::idle(i, format!("GPU-{i}"), 40960)).collect();
        gpus[5].processes = vec![GpuProcess { pid: me, used_mib: 100 }];
        let res = |job: u32, gpus: Vec<u32>, holding: Holding, exclusive: bool| Reservation {
            holding,
            exclusive,
            reserved_mib: 1024,
            ..Reservation::slurm_whole(job, gpus, 0)
        };
        let state = NodeState {
            reservations: vec![
                res(10, vec![1], Holding::SlurmWhole, true),
                res(11, vec![2], Holding::Carma, true),
                res(12, vec![3], Holding::Carma, false),
                res(13, vec![3], Holding::Carma, false),
                res(14, vec![4], Holding::SlurmWhole, true),
                res(15, vec![4], Holding::Carma, false),
            ],
            ..NodeState::default()
        };
        let owners = HashMap::new();
        let of: Vec<String> = gpus.iter().map(|g| Owner::of(g, &state, &owners).shown(g, &owners)).collect();
        assert_eq!(of, ["free", "slurm:10", "carma:11", "shared:12,13", "CONFLICT:14,15", "unclaimed:1proc"]);
        // A process no CARMA job holds, on a GPU CARMA jobs share.
        gpus[3].processes = vec![GpuProcess { pid: me, used_mib: 100 }];
        assert_eq!(Owner::of(&gpus[3], &state, &owners).shown(&gpus[3], &owners), "shared:12,13+1proc");
        let v = to_json(&gpus, &state);
        assert_eq!(v["gpus"][4]["owner"]["kind"], "conflict");
        assert_eq!(v["gpus"][3]["owner"]["jobs"], json!([12, 13]));
        assert!(table(&gpus, &state).contains("CONFLICT:14,15"));
    }

    #[test]
    fn processes_gone_since_the_reading_are_not_shown_as_using_memory() {
        let me = std::process::id();
        // Beyond any pid_max: no such process.
        let gone = 4_000_000;
        let g = GpuReading {
            index: 0,
            uuid: "GPU-0".into(),
            minor: None,
            total_mib: 40960,
            used_mib: 3000,
            sm_activity: 0.0,
            busy: 0.0,
            processes: vec![GpuProcess { pid: me, used_mib: 1000 }, GpuProcess { pid: gone, used_mib: 2000 }],
            power_w: None,
            mps_uid: None,
            sm_occupancy: None,
            mps_server_pid: None,
        };
        let s = settle(vec![g], &NodeState::default());
        assert_eq!(s[0].used_mib, 1000);
        assert_eq!(s[0].processes, vec![GpuProcess { pid: me, used_mib: 1000 }], "a live process stays");
    }

    #[test]
    fn status_shows_each_shared_jobs_profile_and_predicted_slowdown() {
        use carma_placement::{Holding, Reservation};
        let carma = |job: u32, profile: Option<Profile>| Reservation {
            holding: Holding::Carma,
            exclusive: false,
            holders: vec![1],
            profile,
            ..Reservation::slurm_whole(job, vec![0], 1)
        };
        let mut state = NodeState::default();
        state.reservations.push(carma(1, Some(Profile { busy: 0.541, sm: 0.312 })));
        state.reservations.push(carma(2, None));
        let (text, json) = slowdowns(&[reading(0, 0), reading(1, 0)], &state, &Params::default());
        assert!(text.contains("GPU0: job 1 1.") && text.contains("(busy 0.54, SM 0.31 alone)"), "{text}");
        assert!(text.contains("job 2 ") && text.contains("(not yet profiled)") && !text.contains("GPU1"), "{text}");
        assert_eq!(json["max_slowdown"], 1.6);
        assert!(json["gpus"][0]["jobs"][1]["predicted_slowdown"].as_f64().unwrap() > 1.6, "{json}");
        let off = Params { max_slowdown: f64::INFINITY, ..Params::default() };
        assert!(precondition(&off).contains("no slowdown guard"), "{}", precondition(&off));
        assert!(precondition(&Params::default()).contains("predicted slowdown <= 1.60x (timeslice model"));
    }
}
