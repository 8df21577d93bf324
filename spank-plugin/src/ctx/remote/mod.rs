//! slurmstepd (remote). The placement decision is made once per step in
//! `init_post_opt`, the last hook that runs as root before tasks fork
//! (`user_init` already runs as the job's user and could not write the
//! root-owned state); `task_init` (in each forked task, as the user) only
//! copies the decision into the task's environment; `task_post_fork` (in
//! slurmstepd, root, once the task plugin has constrained the task's
//! cgroups and before the task execs) lets the task open its placement's
//! GPUs and no other (`carma_placement::devices`); `task_exit` (root, as
//! each task ends) writes the job's record; `exit` (root again) releases
//! the step's hold on its GPUs.

use super::transparent;
use crate::error::{Context as _, Error};
use crate::log;
use crate::options;
use crate::spank::{Item, Spank};
use carma_config::{Config, JobRequest};
use carma_placement::command::SQUEUE_LOCAL;
use carma_placement::resolve::{self, NodeFacts, Resolution, StepFacts};
use carma_placement::{Placer, StepRef, jobfiles};
use once_cell::sync::OnceCell;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// What the step was granted (the placer's decision, its device minors and
/// the task's environment), made in init_post_opt, read after fork (lock-free).
struct Granted {
    gpus: Vec<u32>,
    /// The device minor number of each of `gpus` (`/dev/nvidia<minor>`).
    minors: Vec<u32>,
    summary: String,
    /// More of the task's environment (an MPS client's pipe and fence).
    env: Vec<(&'static str, String)>,
    step: StepRef,
    /// As Slurm names it: `batch`, `extern`, `interactive` or the number.
    step_name: String,
}
/// `Err` holds why a CARMA step could not be placed. It is reported by
/// task_init, in the task: a failing init_post_opt would make slurmd drain
/// the node for a batch step, and the user would never see the reason.
static GRANTED: OnceCell<Result<Granted, String>> = OnceCell::new();

/// Options given to this step win; then values resolved at submit time
/// (sbatch/salloc pass them as SLURM_SPANK_CARMA_*, which survives
/// --export=NONE); then CARMA_* in the step's environment (a direct srun
/// exports the user's environment, already validated by srun).
fn request(sp: &Spank) -> Result<JobRequest, Error> {
    let mut req = options::request();
    req.fill_from_env(|name| {
        let spank = sp.getenv(&format!("SLURM_SPANK_{name}")).ok().flatten();
        spank.or_else(|| sp.getenv(name).ok().flatten()).map(String::into_bytes)
    })?;
    Ok(req)
}

/// Everything placement needs from Slurm, read once (the job's script,
/// which only a transparently collocated step needs, is read by
/// [`try_place`] when the resolution says it is one).
fn read_facts(sp: &Spank) -> Result<StepFacts, Error> {
    let request = request(sp)?;
    let shards_on_node = sp.getenv("SLURM_SHARDS_ON_NODE")?.map(|v| v.trim().parse().unwrap_or(1));
    let mut f = StepFacts { request, shards_on_node, ..StepFacts::default() };
    if f.request.is_empty() && f.shards_on_node.is_none() {
        // Not CARMA's and not sharing: nothing more is read.
        return Ok(f);
    }
    let env = carma_config::ESTIMATE_ENV;
    // The step's own estimate first: an inner srun may name another model.
    f.estimate = sp.getenv(env)?.or(sp.getenv(&format!("SLURM_SPANK_{env}"))?);
    f.job = sp.item_u32(Item::JobId)?;
    f.uid = sp.item_u32(Item::JobUid)?;
    f.batch_step = crate::spank::is_batch_step(sp.item_u32(Item::StepId)?);
    f.partition = sp.getenv("SLURM_JOB_PARTITION")?;
    f.account = sp.getenv("SLURM_JOB_ACCOUNT")?;
    f.qos = sp.getenv("SLURM_JOB_QOS")?;
    Ok(f)
}

/// Never fails: a CARMA step's failure is deferred to task_init, anything
/// else is logged (the step runs as without CARMA). A panic is a failure
/// like any other: it must neither fail this hook (a batch step's failure
/// here drains the node) nor leave a CARMA step without a decision.
pub fn place(sp: &Spank) -> Result<(), Error> {
    let mut carma = false;
    let started = std::time::Instant::now();
    let placed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| try_place(sp, &mut carma, started)))
        .unwrap_or_else(|p| Err(Error::msg(crate::guard::internal_error(p.as_ref()))));
    if let Err(e) = placed {
        let msg = format!("{}: {e}", step_label(sp));
        log::error(&format!("init_post_opt: {msg}"));
        if carma {
            // The admin finds every CARMA step in carma.log, placed or not
            // (wherever the failure came before carma.yaml was read).
            if let Ok(cfg) = options::config() {
                log::set_log_file(cfg.log_file.clone());
            }
            // How long the step was held here: tests/hook-times.sh prints
            // the longest over a run.
            log::record_failure(&format!("not placed: {msg} in_hook={}ms", started.elapsed().as_millis()));
            let _ = GRANTED.set(Err(msg));
        }
    }
    Ok(())
}

/// `job 12 step batch`, as far as Slurm tells it.
fn step_label(sp: &Spank) -> String {
    let job = sp.item_u32(Item::JobId).map_or_else(|_| "?".into(), |j| j.to_string());
    let step = sp.item_u32(Item::StepId).map_or_else(|_| "?".into(), crate::spank::step_name);
    format!("job {job} step {step}")
}

/// The step asked for CARMA: options given to it or to its job, or
/// `CARMA_*` in its environment; or it holds shards in a transparent scope.
fn is_carma_step(sp: &Spank) -> bool {
    match read_facts(sp) {
        Err(_) => true,
        Ok(f) => !f.request.is_empty() || options::config().is_ok_and(|cfg| resolve::is_carma(&f, cfg)),
    }
}

/// Slurm's facts → a plan (`carma_placement::resolve`) → the placer's
/// decision → what the task will be given.
fn try_place(sp: &Spank, carma: &mut bool, started: std::time::Instant) -> Result<(), Error> {
    let facts = read_facts(sp);
    *carma = facts.as_ref().map_or(true, |f| !f.request.is_empty());
    let mut facts = facts?;
    if facts.request.is_empty() && facts.shards_on_node.is_none() {
        // Not a CARMA step and not sharing: nothing to do, no lock taken.
        return Ok(());
    }
    let cfg = options::config()?;
    log::set_log_file(cfg.log_file.clone());
    *carma |= resolve::is_carma(&facts, cfg);
    let step_id = sp.item_u32(Item::StepId)?;
    if facts.request.is_empty() && *carma {
        // Transparently collocated: its history is keyed by its script.
        facts.job_signature = transparent::signature(sp, crate::spank::is_batch_step(step_id));
    }
    let job = facts.job;
    // The root-owned job files matter only to a CARMA step: a plain shard
    // step (its whole-GPU record dropped) opens none of them.
    let node = if *carma { NodeFacts::read(&cfg.state_dir, job) } else { NodeFacts::default() };
    // The state directory first: where it is unsafe or full, the job
    // prolog could not record the job's Slurm GPUs either, and that, not
    // a missing GPU, is the reason to give.
    let mut placer = Placer::from_config(cfg, log::event).context("placement")?;
    if *carma && facts.batch_step {
        // A hand-back mark is this run's only: one an earlier run left (its
        // epilog lost) must not make this run's other failure a hand-back.
        // (After from_config: the state directory is checked safe.)
        jobfiles::forget_hand_back(&cfg.state_dir, job);
    }
    let resolution = resolve::resolve(&facts, &node, cfg).map_err(|e| {
        match (e.as_str() == resolve::UNACCOUNTED).then(|| unwritable(&cfg.state_dir)).flatten() {
            Some(why) => Error::msg(format!("the job prolog could not record the job's Slurm GPUs: {why}")),
            None => Error::msg(e),
        }
    })?;
    let plan = match resolution {
        Resolution::Nothing => return Ok(()),
        Resolution::DropWhole => {
            // A shard step without CARMA: only forget the prolog's record.
            placer.drop_whole(job).context("placement")?;
            return Ok(());
        }
        Resolution::Place(plan) => plan,
    };
    for note in &plan.notes {
        log::info(note);
    }
    let step_name = crate::spank::step_name(step_id);
    let step = StepRef { job, holder: std::process::id() };
    // Slurm is asked while the step waits, first ALIVE_EVERY after it
    // began, then every ALIVE_EVERY, and every ALIVE_LATER once it has
    // waited ALIVE_FAST_FOR: a cancel ends it within about that, at a
    // bounded cost to slurmctld (2 RPCs a question; tests/scale.sh).
    let began = std::time::Instant::now();
    let mut asked = (began, true);
    let mut alive = || {
        let every = if began.elapsed() < ALIVE_FAST_FOR { ALIVE_EVERY } else { ALIVE_LATER };
        if asked.0.elapsed() >= every {
            asked = (std::time::Instant::now(), job_alive(cfg.slurm_bin_dir.as_deref(), job));
        }
        asked.1
    };
    let decision = placer
        .place(step, &plan.request, plan.wait, cfg.timeouts.poll, &mut alive)
        .map_err(|e| Error::msg(refused(cfg, &plan, job, &e)))?;
    if let Some(mark) = plan.transparent.as_ref().filter(|_| !decision.reused) {
        // carma-epilog recovers only CARMA jobs: this mark says it is one,
        // and under which signature to remember what an OOM needed. The
        // step that decided writes it (a batch job's batch step): later
        // steps, with their own command lines, must not re-key it.
        if let Err(e) = jobfiles::write_transparent(&cfg.state_dir, job, mark) {
            log::error(&format!("job {job}: cannot mark it transparent in {}: {e}", cfg.state_dir.display()));
        }
    }
    let (env, sharing) = match (plan.request.mps_uid, decision.gpus.as_slice()) {
        (Some(_), [gpu]) if !decision.exclusive => mps_client(cfg, *gpu, decision.reserve_mib, job),
        _ => (Vec::new(), String::new()),
    };
    let minors = match device_minors(&mut placer, &decision.gpus) {
        Ok(m) => m,
        Err(e) => {
            // Placed but not grantable: give the promise back now, since
            // no decision is kept for exit() to release.
            if let Err(r) = placer.release(step) {
                log::error(&format!("job {job} step {step_name}: releasing after a failed grant: {r}"));
            }
            return Err(Error::msg(e));
        }
    };
    let summary = plan.summary(&decision, &sharing);
    log::event(&format!("job {job} step {step_name}: {summary} in_hook={}ms", started.elapsed().as_millis()));
    let _ = GRANTED.set(Ok(Granted { gpus: decision.gpus, minors, summary, env, step, step_name }));
    Ok(())
}

/// Why the step was not placed; for a batch step with `no_fit: hand_back`
/// that found no GPU, the mark that has carma-epilog requeue the job away
/// from this node (Slurm's choice of node, not a wait here, tries again).
fn refused(cfg: &Config, plan: &resolve::Plan, job: u32, e: &carma_placement::PlaceError) -> String {
    let why = plan.failure(e);
    if !(plan.hand_back && e.is_no_fit()) {
        return why;
    }
    match jobfiles::write_hand_back(&cfg.state_dir, job, &why) {
        Ok(()) => format!(
            "{why}; handed back to Slurm (no_fit: hand_back): carma-epilog requeues the job away from this node unless it was handed back {} time(s) already",
            cfg.max_hand_backs
        ),
        Err(w) => {
            log::error(&format!("job {job}: cannot hand it back ({}: {w})", cfg.state_dir.display()));
            why
        }
    }
}

/// Why root cannot write a byte in `dir` now (a full disk), if it cannot.
fn unwritable(dir: &std::path::Path) -> Option<String> {
    let probe = dir.join(format!(".write-probe.{}", std::process::id()));
    let r = carma_placement::fsutil::write_atomic(&probe, b"x");
    let _ = std::fs::remove_file(&probe);
    r.err().map(|e| format!("{}: {e}", dir.display()))
}

/// How often a waiting step asks slurmctld whether its job still runs:
/// every ALIVE_EVERY in its first ALIVE_FAST_FOR of waiting, then every
/// ALIVE_LATER (a cancel of a long wait ends it within that).
const ALIVE_EVERY: std::time::Duration = std::time::Duration::from_millis(1500);
const ALIVE_FAST_FOR: std::time::Duration = std::time::Duration::from_secs(10);
const ALIVE_LATER: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether slurmctld still runs the job, asked while its step waits for a
/// GPU: slurmstepd shows a hook nothing of a cancel (its terminate handler
/// first waits for the step to start, Slurm's slurmstepd/req.c), and slurmd
/// stops answering while it waits. An unanswered question keeps waiting
/// (the wait is bounded anyway).
fn job_alive(bin_dir: Option<&std::path::Path>, job: u32) -> bool {
    let job = job.to_string();
    let args = [SQUEUE_LOCAL, "-h", "-j", &job, "-o", "%T"];
    let squeue = carma_placement::command::slurm_program(bin_dir, "squeue");
    match carma_placement::command::run(&squeue, &args, std::time::Duration::from_secs(1)) {
        Ok(state) => {
            let state = state.trim();
            state.is_empty() || ["RUNNING", "CONFIGURING"].contains(&state)
        }
        Err(_) => true,
    }
}

/// The environment of an MPS client of `gpu`'s control daemon, fenced to
/// `fence_mib` (the device is 0 as the job sees it), and the decision's
/// note. Without a running daemon the step shares by time-slicing, and
/// the log says so.
fn mps_client(cfg: &Config, gpu: u32, fence_mib: u64, job: u32) -> (Vec<(&'static str, String)>, String) {
    let pipe = cfg.mps.pipe_dir.join(gpu.to_string());
    if !pipe.join("control").exists() {
        log::event(&format!(
            "job {job}: no MPS control daemon for GPU {gpu} ({} missing): the job shares the GPU by time-slicing, without a memory fence",
            pipe.join("control").display()
        ));
        return (Vec::new(), " sharing=timeslice (no MPS daemon)".into());
    }
    let env = vec![
        ("CUDA_MPS_PIPE_DIRECTORY", pipe.display().to_string()),
        ("CUDA_MPS_LOG_DIRECTORY", cfg.mps.log_dir.join(gpu.to_string()).display().to_string()),
        ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", format!("0={fence_mib}M")),
    ];
    (env, format!(" sharing=mps fence=0={fence_mib}M"))
}

/// The device minor number of each GPU of `gpus` (node indices), as the
/// GPU source reads it (carma-monitor's publication: no driver call here);
/// the index where the source does not know it.
fn device_minors(placer: &mut Placer, gpus: &[u32]) -> Result<Vec<u32>, String> {
    let (readings, _) = placer.status().map_err(|e| format!("the placed GPUs' device numbers: {e}"))?;
    gpus.iter()
        .map(|&i| {
            let g = readings.iter().find(|g| g.index == i);
            g.map(|g| g.device_minor()).ok_or_else(|| format!("GPU {i} is gone from the GPU readings"))
        })
        .collect()
}

/// Whether a device cgroup constrains this task: task_init runs after
/// task_post_fork's grant, as the user, who may not ask the kernel which
/// program is attached (cgroup v2's BPF_PROG_QUERY needs root), but whose
/// access(2) to the GPUs outside the placement the cgroup answers. A
/// placement of every GPU the node has is numbered alike either way.
/// Limits (docs/isolation.md): a file mode that refuses the user answers
/// first, and a container's own /dev may hold no other GPU.
fn constrained(placed_minors: &[u32]) -> bool {
    use carma_placement::devices;
    devices::gpu_files(std::path::Path::new("/dev"))
        .into_iter()
        .filter(|(minor, _)| !placed_minors.contains(minor))
        .any(|(_, file)| devices::cgroup_denies(&file))
}

pub fn task_init(sp: &Spank) -> Result<(), Error> {
    // Runs in the forked task: no locks, no NVML, no logging on success.
    match GRANTED.get() {
        // No decision for a step that asked for CARMA (placement never ran
        // in this slurmstepd): it must not run unplaced beside others.
        None if is_carma_step(sp) => {
            let why = "no CARMA placement decision was made for this step (slurmd's log says why)";
            eprintln!("carma: this step was not started: {why}");
            Err(Error::msg(why))
        }
        None => Ok(()),
        Some(Ok(d)) => {
            // CUDA numbers the GPUs a process can open: where the device
            // cgroup shows the task only its placement, its first GPU is
            // CUDA's 0, as Slurm numbers CUDA_VISIBLE_DEVICES under
            // ConstrainDevices=yes. SLURM_STEP_GPUS keeps the node's indices.
            let node_indices = carma_placement::index_list(&d.gpus);
            let (cuda, order) = cuda_devices(d.gpus.len(), &node_indices, constrained(&d.minors));
            sp.setenv("CUDA_VISIBLE_DEVICES", &cuda)?;
            if let Some(order) = order {
                sp.setenv("CUDA_DEVICE_ORDER", order)?;
            }
            sp.setenv("GPU_DEVICE_ORDINAL", &cuda)?;
            sp.setenv("SLURM_STEP_GPUS", &node_indices)?;
            for (var, value) in &d.env {
                sp.setenv(var, value)?;
            }
            sp.setenv("CARMA_DECISION", &d.summary)
        }
        Some(Err(why)) => {
            // The task's stderr is the job's: the user sees why.
            eprintln!("carma: this step was not started: {why}");
            Err(Error::msg(why.clone()))
        }
    }
}

/// The task may open exactly its placement's GPUs. When that cannot be
/// done the task is killed before it execs: the step fails with the
/// reason in its stderr (slurmstepd's error lines), slurmd's log and
/// carma.log, and the node stays up (a failing task_post_fork would drain
/// it for a batch step).
pub fn task_post_fork(sp: &Spank) -> Result<(), Error> {
    let Some(Ok(d)) = GRANTED.get() else { return Ok(()) };
    let pid = sp.item_u32(Item::TaskPid)?;
    if let Err(e) = isolate(&d.minors, pid) {
        let msg =
            format!("job {} step {}: GPU isolation failed, the task was not started: {e}", d.step.job, d.step_name);
        log::error(&format!("task_post_fork: {msg}"));
        log::record_failure(&msg);
        let batch = d.step_name == "batch";
        if batch {
            tell_task(&msg);
        }
        sp.kill_unstarted_task(pid)?;
        // Failing a batch step's hook would drain the node (Slurm 22.05);
        // srun shows a failed hook's message with the launch failure (the
        // task's stderr pipe is not read yet at this point).
        if !batch {
            return Err(Error::msg(msg));
        }
    }
    Ok(())
}

/// Writes `msg` where the unstarted batch task's stderr goes (the job's
/// output file): slurmstepd put task 0's stderr on its own fd 2 before it
/// forked (job_log_init), so the user sees why the job died, through the
/// descriptor slurmstepd opened as the user. Never reopened as root: on a
/// root-squashed file system that would fail, and a file the user named
/// must not be opened with root's rights. Never waited on (a FIFO nobody
/// reads). Best effort: the logs have it anyway.
fn tell_task(msg: &str) {
    crate::spank::write_stderr_if_ready(&format!("carma: this step was not started: {msg}\n"));
}

/// Grants the GPUs whose device minor numbers are `minors` (their files
/// `/dev/nvidia<minor>`) and denies the node's other GPU files.
fn isolate(minors: &[u32], pid: u32) -> Result<(), String> {
    use carma_placement::devices::{self, Cgroup};
    let dev = std::path::Path::new("/dev");
    // Read from what constrains the task (a device program, a devices
    // list): a constraint CARMA cannot find is an error, not "none".
    let cgroup = devices::of_task(pid)?;
    if cgroup == Cgroup::Unconstrained {
        return Ok(());
    }
    let allow =
        minors.iter().map(|&m| devices::char_device(&devices::gpu_file(dev, m))).collect::<Result<Vec<_>, _>>()?;
    let deny: Vec<_> = devices::gpu_files(dev)
        .into_iter()
        .filter(|(m, _)| !minors.contains(m))
        .filter_map(|(_, f)| devices::char_device(&f).ok())
        .collect();
    match cgroup {
        Cgroup::V1(levels) => devices::grant_v1(&levels, &allow, &deny),
        Cgroup::V2 { task, program_at } => devices::grant_v2(&task, &program_at, &allow, &deny),
        Cgroup::Unconstrained => Ok(()),
    }
}

/// `0,1,..` for a task whose devices a cgroup constrains (task_post_fork
/// left it exactly its placement), else the node's indices, in the PCI
/// order NVML numbers them by (CUDA's default order is fastest first).
fn cuda_devices(count: usize, node_indices: &str, constrained: bool) -> (String, Option<&'static str>) {
    if constrained {
        ((0..count).map(|i| i.to_string()).collect::<Vec<_>>().join(","), None)
    } else {
        (node_indices.to_string(), Some("PCI_BUS_ID"))
    }
}

/// Writes the job's record in its AdminComment (crate::record): the
/// decision without its moment's readings, and the peak its processes were
/// seen at. False if it could not (logged).
fn record_job(sp: &Spank, cfg: &carma_config::Config, d: &Granted, r: &carma_placement::Reservation) -> bool {
    let one_node = sp.getenv("SLURM_JOB_NUM_NODES").ok().flatten().is_some_and(|n| n.trim() == "1");
    let node = cfg.monitor.node_name();
    let kept: Vec<&str> = d
        .summary
        .split_whitespace()
        .filter(|t| !["effective_free=", "sm=", "busy="].iter().any(|p| t.starts_with(p)))
        .collect();
    let peak = if r.observed_mib > 0 { format!("{}M", r.observed_mib) } else { "unseen".into() };
    let entry = format!("carma@{node}: {} peak={peak}", kept.join(" "));
    match crate::record::write(cfg.slurm_bin_dir.as_deref(), r.job, &node, &entry, one_node) {
        Ok(()) => true,
        Err(e) => {
            log::error(&format!("job {}: record not written to AdminComment: {e}", r.job));
            false
        }
    }
}

/// Tasks of this step that have exited on this node.
static TASKS_EXITED: AtomicU32 = AtomicU32::new(0);
/// The job's record was written by this slurmstepd.
static RECORDED: AtomicBool = AtomicBool::new(false);

/// Once the step's last task on this node has exited, and before
/// slurmstepd reports the exits to srun: writes the job's record if this
/// step is the job's last hold on the node. `exit` comes too late for a
/// job srun started, since srun ends the job as soon as its tasks are
/// reported and slurmctld then refuses the update ("Job has already
/// finished", on every such job). Never fails; costs the step's end a few
/// scontrol calls, bounded in time.
pub fn task_exit(sp: &Spank) -> Result<(), Error> {
    let Some(Ok(d)) = GRANTED.get() else { return Ok(()) };
    let exited = TASKS_EXITED.fetch_add(1, Ordering::SeqCst) + 1;
    if exited < sp.item_u32(Item::LocalTaskCount).unwrap_or(1) {
        return Ok(());
    }
    let record = || -> Result<(), Error> {
        let cfg = options::config()?;
        let st = Placer::from_config(cfg, log::event).context("record")?.state().context("record")?;
        // Another step still holding the job's GPUs here writes it instead.
        if let Some(r) = st.job(d.step.job).filter(|r| r.holders == [d.step.holder]) {
            RECORDED.store(record_job(sp, cfg, d, r), Ordering::SeqCst);
        }
        Ok(())
    };
    if let Err(e) = record() {
        log::error(&format!("task_exit: {e}"));
    }
    Ok(())
}

/// Releases the step's hold; failures are logged only (garbage collection
/// reclaims the reservation once this slurmstepd is gone).
pub fn exit(sp: &Spank) -> Result<(), Error> {
    let Some(Ok(d)) = GRANTED.get() else { return Ok(()) };
    let release = || -> Result<(), Error> {
        let placer = Placer::from_config(options::config()?, log::event).context("release")?;
        if let Some(r) = placer.release(d.step).context("release")? {
            log::event(&format!(
                "job {} step {} released gpu_indices={}",
                r.job,
                d.step_name,
                carma_placement::index_list(&r.gpus)
            ));
            // Written at the last task's exit where this step was the last
            // hold then; else now (a batch job is still running here).
            if !RECORDED.load(Ordering::SeqCst) {
                record_job(sp, options::config()?, d, &r);
            }
        }
        Ok(())
    };
    if let Err(e) = release() {
        log::error(&format!("exit: {e}"));
    }
    Ok(())
}
