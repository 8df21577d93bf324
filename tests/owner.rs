//! One owner per GPU (docs/architecture.md, "Who owns a GPU") on the real
//! cluster: every GPU a CARMA job uses is one Slurm accounts to it (a gpu
//! or shard GRES). A `--carma-*` job without one is refused by
//! job_submit.lua at submission, with one line naming what to add; a step
//! that sets `CARMA_*` only inside a job (the submit filter never saw it)
//! is refused by slurmstepd, from the prolog's record of Slurm's GPUs,
//! which the job's environment cannot forge.

mod common;
use common::*;

/// What the user is told: the options to add.
const FIX: &str = "add --gres=shard:1 to share a GPU, or --gres=gpu:N for whole GPUs";

#[test]
fn a_carma_job_without_a_slurm_gpu_is_refused_at_submission() {
    require_cluster();
    let script = script(&unique("unacc"), "echo SHOULD-NOT-RUN");
    type Case<'a> = (&'a [(&'a str, &'a str)], Vec<&'a str>);
    let cases: [Case; 4] = [
        (&[], vec!["sbatch", "-p", "debug", "--carma-mem=6G", &script]),
        (&[], vec!["srun", "-p", "debug", "--carma-mem=6G", "echo", "SHOULD-NOT-RUN"]),
        (&[], vec!["sbatch", "-p", "wide", "--carma-policy=exclusive", &script]),
        // CARMA_* in the environment is a CARMA request like the options.
        (&[("CARMA_MEM", "6G")], vec!["srun", "-p", "debug", "echo", "SHOULD-NOT-RUN"]),
    ];
    for (env, args) in cases {
        let r = user_env_as_given(env, &args, 60);
        let told: Vec<&str> = r.stderr.lines().filter(|l| l.contains(FIX)).collect();
        assert!(r.code != 0 && told.len() == 1, "{args:?} {env:?} was not refused in one line:\n{r:?}");
        assert!(!r.stdout.contains("SHOULD-NOT-RUN"), "{args:?} ran:\n{r:?}");
    }
    // With a shard it is accepted and placed; sacct counts the shard.
    let r = user_env_as_given(
        &[],
        &["srun", "-p", "debug", "--gres=shard:1", "--carma-mem=6G", "printenv", "CARMA_DECISION"],
        60,
    )
    .ok();
    assert!(r.stdout.contains("gpu_indices="), "{r:?}");
    wait_released();
}

#[test]
fn slurmstepd_refuses_a_carma_step_of_a_job_without_a_slurm_gpu() {
    require_cluster();
    // The job asks nothing of CARMA (job_submit.lua lets it through); its
    // step sets CARMA_MEM and claims GPUs and shards in its environment.
    let forged = "CARMA_MEM=1G SLURM_SHARDS_ON_NODE=1 SLURM_JOB_GPUS=0 SLURM_STEP_GPUS=0 CUDA_VISIBLE_DEVICES=0";
    let body = format!("{forged} srun printenv CARMA_DECISION; echo STEP-EXIT=$?");
    let name = unique("bypass");
    let path = script(&name, &body);
    let out = work_dir().join(format!("{name}.out")).to_string_lossy().into_owned();
    let r = user_env_as_given(&[], &["sbatch", "--wait", "-p", "debug", "-J", &name, "-o", &out, &path], 90);
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    assert!(!text.contains("gpu_indices="), "the step was placed:\n{text}\n{r:?}");
    assert!(text.contains("carma: this step was not started") && text.contains(FIX), "no reason given:\n{text}");
    let exit = text.lines().find_map(|l| l.strip_prefix("STEP-EXIT=")).unwrap_or("?");
    assert_ne!(exit, "0", "the step succeeded:\n{text}");
    wait_released();
}

/// A node answering slurmctld: no `*` (not responding), not drained or down.
fn assert_nodes_responding() {
    for _ in 0..10 {
        let r = root(&["sinfo", "-h", "-N", "-o", "%N %T"], 20).ok();
        for line in r.stdout.lines() {
            let bad = line.contains('*') || ["drain", "down", "fail"].iter().any(|s| line.contains(s));
            assert!(!bad, "a node stopped answering or was taken out: {line}\n{}", r.stdout);
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}

#[test]
fn scancel_of_a_waiting_step_ends_it_at_once_and_the_node_keeps_answering() {
    require_cluster();
    let host = root(&["hostname", "-s"], 10).ok().stdout.trim().to_string();
    let sub = |mem: &str| {
        let name = unique("wait");
        let path = script(&name, "echo \"PLACED $CARMA_DECISION\"; sleep 120");
        let out = work_dir().join(format!("{name}.out")).to_string_lossy().into_owned();
        let mem = format!("--carma-mem={mem}");
        let args = ["sbatch", "--parsable", "-p", "debug", "-w", &host, "-J", &name, "-o", &out, &mem, &path];
        (user(&args, 30).ok().stdout.trim().to_string(), out)
    };
    // Four 30G jobs fill the node's four 40G GPUs; a fifth waits in its
    // batch step's init_post_opt (carma.yaml here: timeouts.wait 60s).
    let holders: Vec<String> = (0..4).map(|_| sub("30G").0).collect();
    let mut all = holders.clone();
    let _cancel = Cancel(holders.clone());
    wait_reservations(4);
    let (waiter, out) = sub("30G");
    all.push(waiter.clone());
    let _cancel_all = Cancel(all);
    let start = std::time::Instant::now();
    while root(&["squeue", "-h", "-j", &waiter, "-o", "%T"], 20).stdout.trim() != "RUNNING" {
        assert!(start.elapsed().as_secs() < 30, "job {waiter} never started");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert!(!std::fs::read_to_string(&out).unwrap_or_default().contains("PLACED"), "the fifth job was placed");
    let t0 = std::time::Instant::now();
    root(&["scancel", &waiter], 20).ok();
    wait_completed(&waiter);
    let took = t0.elapsed();
    println!("scancel of a step waiting for a GPU: the job ended {:.2} s later", took.as_secs_f64());
    // 2 s on a node; the VM (tests/vm.sh) emulates its CPUs (TCG) and runs
    // every command of the path many times slower.
    let bound = if std::env::var("CARMA_CHROOT").as_deref() == Ok("vm") { 6 } else { 2 };
    assert!(took < std::time::Duration::from_secs(bound), "the cancelled step ended only after {took:?}");
    assert_nodes_responding();
    for h in &holders {
        root(&["scancel", h], 20).ok();
    }
    for h in &holders {
        wait_completed(h);
    }
    wait_released();
    assert_nodes_responding();
    report(
        "owner",
        &format!("scancel of a waiting step: ended {:.2} s later, nodes kept answering", took.as_secs_f64()),
    );
}

/// Each GPU of the first node and its owner in `carma status --json`, as
/// (index, kind, jobs).
fn owners() -> Vec<(u64, String, Vec<u64>)> {
    let r = root(&["carma", "status", "--json"], 20).ok();
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    v["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            let jobs = g["owner"]["jobs"].as_array().unwrap().iter().map(|j| j.as_u64().unwrap()).collect();
            (g["index"].as_u64().unwrap(), g["owner"]["kind"].as_str().unwrap().to_string(), jobs)
        })
        .collect()
}

/// An salloc without PrologFlags=Contain has no slurmstepd between its
/// sruns: the GPU Slurm gave it whole stays its own then (its prolog's
/// record is kept until the job's epilog), and a CARMA job that would take
/// the first free GPU (ff) is placed beside it, never on it.
#[test]
fn an_sallocs_whole_gpu_stays_its_own_between_its_sruns() {
    require_cluster();
    let r = user(&["salloc", "--no-shell", "-p", "debug", "--gres=gpu:1"], 60);
    let job = r
        .stderr
        .lines()
        .find_map(|l| l.split("Granted job allocation ").nth(1))
        .unwrap_or_else(|| panic!("no allocation: {r:?}"))
        .trim()
        .to_string();
    let _cancel = Cancel(vec![job.clone()]);
    user(&["srun", "--jobid", &job, "true"], 60).ok();
    let id: u64 = job.parse().unwrap();
    let held = |o: &[(u64, String, Vec<u64>)]| o.iter().find(|(_, k, j)| k == "slurm_whole" && j == &[id]).map(|g| g.0);
    let gpu = held(&owners()).unwrap_or_else(|| panic!("job {job}'s GPU is not shown as its own: {:?}", owners()));
    // No step of it runs now; the next placement collects garbage (at most
    // once a second, and always before it refuses).
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let r =
        user(&["srun", "-p", "debug", "--carma-policy=ff", "--carma-mem=2G", "printenv", "CARMA_DECISION"], 60).ok();
    let placed: Vec<u64> = r
        .stdout
        .split_whitespace()
        .find_map(|w| w.strip_prefix("gpu_indices="))
        .unwrap_or_else(|| panic!("not placed: {r:?}"))
        .split(',')
        .map(|g| g.parse().unwrap())
        .collect();
    assert!(!placed.contains(&gpu), "a CARMA job was placed on the salloc's GPU {gpu} between its sruns: {}", r.stdout);
    assert_eq!(held(&owners()), Some(gpu), "{:?}", owners());
    // The salloc's next srun still has its GPU.
    user(&["srun", "--jobid", &job, "true"], 60).ok();
    root(&["scancel", &job], 20).ok();
    wait_completed(&job);
    let start = std::time::Instant::now();
    while held(&owners()).is_some() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "the ended job still holds its GPU: {:?}",
            owners()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    report("fault", "an salloc's whole GPU is not collocated on between its sruns (no PrologFlags=Contain)");
}

/// The first node's carma.yaml.
const CONF: &str = "/etc/slurm/carma.yaml";

/// Slurm's major release on this cluster (22 for 22.05).
fn slurm_major() -> u32 {
    let version = root(&["scontrol", "--version"], 10).ok().stdout;
    version
        .split_whitespace()
        .last()
        .and_then(|v| v.split('.').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no Slurm version in {version:?}"))
}

/// The reverse order: CARMA jobs first, then plain whole-GPU jobs in
/// CARMA's partition and in another. A CARMA job runs on the GPU of its
/// shard (Slurm's choice), where magm alone would pick the emptiest GPU:
/// slurmctld never hands a GPU with shards allocated whole to a plain job,
/// so no plain job shares a GPU with a CARMA job (device probes and
/// `carma status`'s owners). A magm job on an empty GPU would be on one
/// slurmctld still counts free, and the plain job given that GPU would
/// share it without asking.
#[test]
fn plain_gpu_jobs_started_after_carma_jobs_never_share_their_gpus() {
    require_cluster();
    // carma.yaml's default (the test cluster sets gpu_owner: carma).
    let _conf = Restore::new(CONF);
    let text = std::fs::read_to_string(CONF).unwrap();
    std::fs::write(CONF, text.replace("\ngpu_owner: carma\n", "\ngpu_owner: slurm\n")).unwrap();
    let status: serde_json::Value =
        serde_json::from_str(&root(&["carma", "status", "--json"], 20).ok().stdout).unwrap();
    assert_eq!(status["gpu_owner"], "slurm", "carma status does not say who owns the GPUs");
    let host = root(&["hostname", "-s"], 10).ok().stdout.trim().to_string();
    let run = |opts: &[&str], body: &str| {
        let name = unique("reverse");
        let path = script(&name, body);
        let out = work_dir().join(format!("{name}.out")).to_string_lossy().into_owned();
        let mut args = vec!["sbatch", "--parsable", "-w", &host, "-J", &name, "-o", &out];
        args.extend_from_slice(opts);
        args.push(&path);
        (user_env_as_given(&[], &args, 30).ok().stdout.trim().to_string(), out)
    };
    let body = format!("{PROBE}\nsleep 40");
    // 20G on a shard, then a small magm job: both shards come from the
    // first GPU with shards free.
    let big = run(&["-p", "debug", "--gres=shard:1", "--carma-mem=20G"], &body);
    let _c1 = Cancel(vec![big.0.clone()]);
    wait_reservations(1);
    let magm = run(&["-p", "debug", "--gres=shard:1", "--carma-mem=4G", "--carma-policy=magm"], &body);
    let _c2 = Cancel(vec![magm.0.clone()]);
    wait_reservations(2);
    // Plain jobs: two GPUs in the CARMA jobs' partition, one in another.
    let plain_debug = run(&["-p", "debug", "--gres=gpu:2"], &body);
    let _c3 = Cancel(vec![plain_debug.0.clone()]);
    let plain_wide = run(&["-p", "wide", "--gres=gpu:1"], &body);
    let _c4 = Cancel(vec![plain_wide.0.clone()]);
    let probe_of = |out: &str| {
        let start = std::time::Instant::now();
        loop {
            let text = std::fs::read_to_string(out).unwrap_or_default();
            if let Some(p) = probe_lines(&text).into_iter().next() {
                return p;
            }
            assert!(start.elapsed().as_secs() < 40, "no probe in {out}:\n{text}");
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    };
    let carma: Vec<_> = [&big, &magm].iter().map(|(_, out)| probe_of(out)).collect();
    for (given, opened) in &carma {
        assert_eq!(given, opened, "a CARMA job could open other GPUs than it was placed on");
    }
    let shared: std::collections::BTreeSet<u32> = carma.iter().flat_map(|(g, _)| g.iter().copied()).collect();
    let owners_now = owners();
    // Each CARMA job runs on its shard's GPU: Slurm took both shards from
    // one GPU, so both jobs are on one GPU, never the emptiest.
    assert_eq!(shared.len(), 1, "the CARMA jobs left their shards' GPU: {carma:?} {owners_now:?}");
    if slurm_major() < 23 {
        // Measured (docs/architecture.md, "Who owns a GPU"): 22.05 may
        // hand a GPU whose shards are allocated whole to a plain job.
        println!("Slurm 22.05: the plain jobs' GPUs are Slurm's choice, not checked against the shards");
    } else {
        for (job, out) in [&plain_debug, &plain_wide] {
            let (given, opened) = probe_of(out);
            assert!(!given.is_empty() && given == opened, "plain job {job}: {given:?} {opened:?}");
            assert!(
                opened.is_disjoint(&shared),
                "plain job {job} can open {opened:?}, where CARMA jobs run ({shared:?}): {owners_now:?}"
            );
        }
        assert!(!owners_now.iter().any(|(_, kind, _)| kind == "conflict"), "{owners_now:?}");
    }
    for (job, _) in [&big, &magm, &plain_debug, &plain_wide] {
        root(&["scancel", job], 20).ok();
    }
    for (job, _) in [&big, &magm, &plain_debug, &plain_wide] {
        wait_completed(job);
    }
    wait_released();
    report("owner", "plain GPU jobs after CARMA jobs: no GPU shared (CARMA jobs stay on their shards' GPU)");
}
