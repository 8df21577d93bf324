//! A job reaches only its GPUs (ConstrainDevices=yes; cgroup v1 on this
//! host and its chroots, Slurm's cgroup/v2 in tests/vm.sh's VM): every job
//! opens every GPU device file (`/dev/nvidia0`..`7`: the first node's GPUs
//! 0-3, the second's 4-7; made by tests/cluster.sh as the driver makes them,
//! with no driver behind them)
//! and reports each open: ENXIO ("No such device or address") means the
//! device cgroup let it through, EPERM that it denied it.

mod common;
use common::*;
use std::collections::BTreeSet;

fn srun_probe(opts: &[&str]) -> (BTreeSet<u32>, BTreeSet<u32>) {
    let mut args = vec!["srun"];
    args.extend_from_slice(opts);
    args.extend_from_slice(&["bash", "-c", PROBE]);
    let r = user(&args, 90).ok();
    let lines = probe_lines(&r.stdout);
    assert_eq!(lines.len(), 1, "srun {opts:?}: {}\n{}", r.stdout, r.stderr);
    lines[0].clone()
}

fn set(v: &[u32]) -> BTreeSet<u32> {
    v.iter().copied().collect()
}

#[test]
fn plain_whole_gpu_and_carma_steps_open_exactly_their_gpus() {
    require_cluster();
    // No GPU asked for: none can be opened.
    let (told, opened) = srun_probe(&["-p", "debug"]);
    assert!(told.is_empty() && opened.is_empty(), "plain job opened {opened:?}");
    // Whole GPUs from Slurm: exactly those.
    let (told, opened) = srun_probe(&["-p", "debug", "--gres=gpu:2"]);
    assert_eq!((told.len(), &opened), (2, &told));
    // CARMA steps, one GPU and two, without any GRES from Slurm.
    for gpus in ["1", "2"] {
        let (told, opened) =
            srun_probe(&["-p", "debug", &format!("--carma-gpus={gpus}"), "--carma-mem=4G", "--carma-policy=magm"]);
        assert_eq!(told.len(), gpus.parse::<usize>().unwrap());
        assert_eq!(opened, told, "CARMA placed the step on {told:?}");
    }
    wait_released();
}

/// The first node's GPU 0 nearly full: 36G of 40G held by a CARMA job with
/// a shard on it (first fit on the idle node puts it on GPU 0). Slurm gives
/// the next shard jobs GPU 0's shards (the first GPU with shards free);
/// CARMA places them elsewhere, so a step opens its GPU only through
/// CARMA's grant. Cancelled when dropped.
fn hold_gpu0() -> Cancel {
    let holder = script(&unique("holder"), "sleep 300");
    let args =
        ["sbatch", "--parsable", "-p", "debug", "--gres=shard:1", "--carma-mem=36G", "--carma-policy=ff", &holder];
    let id = user(&args, 30).ok().stdout.trim().to_string();
    let cancel = Cancel(vec![id]);
    wait_reservations(1);
    cancel
}

fn release(holder: Cancel) {
    let id = holder.0[0].clone();
    drop(holder);
    wait_completed(&id);
    wait_released();
}

#[test]
fn a_carma_placement_away_from_slurms_shard_opens_its_gpu_and_not_the_shards() {
    require_cluster();
    let holder = hold_gpu0();
    let (told, opened) = srun_probe(&["-p", "debug", "--gres=shard:1", "--carma-mem=4G", "--carma-policy=magm"]);
    assert_eq!(told.len(), 1);
    assert!(!told.contains(&0), "placed on the full GPU 0: {told:?}");
    assert_eq!(opened, told, "the shard's GPU 0 must stay closed, CARMA's GPU open");
    release(holder);
}

#[test]
fn two_jobs_collocated_on_one_gpu_each_open_only_it() {
    require_cluster();
    // First fit puts both 4G jobs on GPU 1 (GPU 0 is full), where Slurm's
    // shards are GPU 0's; each probes while the other runs.
    let holder = hold_gpu0();
    let body = format!("{PROBE}\nsleep 8");
    let name = unique("pair");
    let mut outs = Vec::new();
    let mut ids = Vec::new();
    for k in 0..2 {
        let out = work_dir().join(format!("{name}-{k}.out")).to_string_lossy().into_owned();
        let path = script(&format!("{name}-{k}"), &body);
        let args = ["sbatch", "--parsable", "-p", "debug", "--carma-mem=4G", "--carma-policy=ff", "-o", &out, &path];
        ids.push(user(&args, 30).ok().stdout.trim().to_string());
        outs.push(out);
        // One at a time: a shard job's prolog records its shard's GPU as
        // held until its first step shows it shares, and a placement in
        // that moment passes the GPU over (docs/architecture.md).
        wait_reservations(k + 2);
    }
    for id in &ids {
        wait_completed(id);
    }
    let lines: Vec<_> = outs.iter().map(|o| probe_lines(&std::fs::read_to_string(o).unwrap())).collect();
    for l in &lines {
        assert_eq!(l.len(), 1, "{lines:?}");
        assert_eq!(l[0].1, l[0].0, "a collocated job opened other than its GPU: {lines:?}");
    }
    assert_eq!(lines[0][0].0, set(&[1]));
    assert_eq!(lines[1][0].0, set(&[1]), "both on GPU 1 (first fit past the full GPU 0)");
    release(holder);
}

#[test]
fn transparent_and_two_node_jobs_open_exactly_their_placements() {
    require_cluster();
    // On the first node CARMA's GPU is then never Slurm's shard's.
    let holder = hold_gpu0();
    // A batch job that asks Slurm for a whole GPU in a transparent scope
    // runs as a CARMA shard job.
    let body = format!("echo DECISION=${{CARMA_DECISION:-none}}\n{PROBE}");
    let (r, text) = sbatch_wait(&["-p", "shared", "--gres=gpu:1"], &[], &body, 90);
    r.ok();
    assert!(!text.contains("DECISION=none"), "not collocated by CARMA: {text}");
    let lines = probe_lines(&text);
    assert_eq!(lines.len(), 1, "{text}");
    assert_eq!((lines[0].0.len(), &lines[0].1), (1, &lines[0].0));
    assert!(!lines[0].0.contains(&0), "placed on the full GPU 0: {text}");
    // The same over two nodes: the step on each node opens its placement.
    let body = format!("srun bash -c '{PROBE}'");
    let (r, text) = sbatch_wait(&["-p", "multi", "-N", "2", "--gres=gpu:1"], &[], &body, 90);
    r.ok();
    let lines = probe_lines(&text);
    assert_eq!(lines.len(), 2, "{text}");
    for (told, opened) in &lines {
        assert_eq!((told.len(), opened), (1, told), "{text}");
    }
    // One task on each node: each opens what its node's CARMA chose.
    let mut args = vec!["srun", "-p", "multi", "-N", "2", "--ntasks-per-node=1", "--carma-mem=4G", "bash", "-c"];
    args.push(PROBE);
    let r = user(&args, 90).ok();
    let lines = probe_lines(&r.stdout);
    assert_eq!(lines.len(), 2, "{}", r.stdout);
    for (told, opened) in &lines {
        assert_eq!((told.len(), opened), (1, told), "{}", r.stdout);
    }
    release(holder);
}

/// Moves the node's GPU device files away while alive: no grant can be
/// made (the files are what the grant names).
struct HiddenGpus;

impl HiddenGpus {
    fn new() -> HiddenGpus {
        for i in 0..4 {
            std::fs::rename(format!("/dev/nvidia{i}"), format!("/dev/carma-test-hidden-nvidia{i}")).unwrap();
        }
        HiddenGpus
    }
}

impl Drop for HiddenGpus {
    fn drop(&mut self) {
        for i in 0..4 {
            let _ = std::fs::rename(format!("/dev/carma-test-hidden-nvidia{i}"), format!("/dev/nvidia{i}"));
        }
    }
}

#[test]
fn a_grant_that_cannot_be_made_fails_the_step_with_the_reason_and_leaves_the_node_up() {
    require_cluster();
    let (r, text) = {
        let _hidden = HiddenGpus::new();
        // srun: the step does not run; srun prints why.
        let r = user(&["srun", "-p", "debug", "--carma-mem=4G", "bash", "-c", PROBE], 90);
        assert!(probe_lines(&r.stdout).is_empty(), "the step ran unisolated: {}", r.stdout);
        assert!(r.stderr.contains("GPU isolation failed") && r.stderr.contains("/dev/nvidia"), "{}", r.stderr);
        // A batch job: failed, its output file says why.
        sbatch_wait(&["-p", "debug", "--carma-mem=4G"], &[], PROBE, 90)
    };
    assert_ne!(r.code, 0, "sbatch --wait of the failed job: {}", r.stdout);
    assert!(probe_lines(&text).is_empty(), "the batch job ran unisolated: {text}");
    assert!(text.contains("carma: this step was not started") && text.contains("GPU isolation failed"), "{text}");
    // The node is not drained, and the next CARMA job runs isolated.
    let host = root(&["hostname", "-s"], 10).ok().stdout;
    let state = root(&["sinfo", "-h", "-n", host.trim(), "-o", "%T"], 20);
    assert!(!state.stdout.contains("drain"), "node drained: {}", state.stdout);
    let (told, opened) = srun_probe(&["-p", "debug", "--carma-mem=4G"]);
    assert_eq!((told.len(), &opened), (1, &told));
    report(
        "isolation",
        "GPU device files missing at grant time: srun and batch steps failed with the reason; node not drained",
    );
    wait_released();
}

/// Opens the node's devices of other kinds that Slurm hands out (gres.conf:
/// `nic`, `migcap`) and prints `EXTRA nic=open|EPERM migcap=...`.
const EXTRA: &str = r#"r=""
for d in nic:/dev/carma-nic0 migcap:/dev/nvidia-caps/nvidia-cap1; do
  e=$( (exec 3<${d#*:}) 2>&1 )
  case "$e" in
    *"not permitted"*) r="$r ${d%%:*}=EPERM" ;;
    *"No such device"*) r="$r ${d%%:*}=open" ;;
    *) r="$r ${d%%:*}=other($e)" ;;
  esac
done
echo "EXTRA$r""#;

fn extra_line(text: &str) -> &str {
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("EXTRA ")).collect();
    assert_eq!(lines.len(), 1, "{text}");
    lines[0]
}

/// Slurm denies the gres devices a step was not given, not only GPUs (a
/// NIC; a MIG capability file on 25.11 and 26.05, where 22.05 lets every
/// step open it, measured): a CARMA grant adds the placement's
/// GPUs to what Slurm allowed and keeps every other answer of Slurm's, on
/// v1 and v2 alike.
#[test]
fn a_carma_grant_keeps_every_device_slurm_denied() {
    require_cluster();
    // Slurm alone, for comparison: a plain job given one GPU.
    let r = user(&["srun", "-p", "debug", "--gres=gpu:1", "bash", "-c", EXTRA], 90).ok();
    let slurms = extra_line(&r.stdout).to_string();
    assert!(slurms.starts_with("EXTRA nic=EPERM "), "Slurm itself let the NIC through: {slurms}");
    // Pinned where measured, so that the comparison below cannot go empty.
    let version = root(&["scontrol", "--version"], 10).ok().stdout;
    let major: u32 = version.split_whitespace().last().and_then(|v| v.split('.').next()?.parse().ok()).unwrap_or(0);
    if major >= 25 {
        assert_eq!(slurms, "EXTRA nic=EPERM migcap=EPERM", "Slurm {version} let the MIG capability file through");
    }
    let both = format!("{PROBE}\n{EXTRA}");
    for opts in [&["--carma-mem=4G"][..], &["--gres=shard:1", "--carma-mem=4G"], &["--carma-gpus=2", "--carma-mem=4G"]]
    {
        let mut args = vec!["srun", "-p", "debug"];
        args.extend_from_slice(opts);
        args.extend_from_slice(&["bash", "-c", &both]);
        let r = user(&args, 90).ok();
        let lines = probe_lines(&r.stdout);
        assert_eq!(lines.len(), 1, "srun {opts:?}: {}\n{}", r.stdout, r.stderr);
        assert!(!lines[0].0.is_empty() && lines[0].0 == lines[0].1, "srun {opts:?}: {}", r.stdout);
        assert_eq!(extra_line(&r.stdout), slurms, "srun {opts:?}: a CARMA step's devices differ from Slurm's");
    }
    // What Slurm gave the step stays open under CARMA's grant. On the second
    // node: faults.rs restarts the first node's slurmd, after which 26.05's
    // slurmctld counted its NIC as 0 (measured: "gres/nic: Count changed on
    // node vm (1 != 0)"), and a NIC job there could never run.
    let n2 = node2();
    let args = ["srun", "-p", "wide", "-w", &n2, "--gres=shard:1,nic:1", "--carma-mem=4G", "bash", "-c", &both];
    let r = user(&args, 90).ok();
    let lines = probe_lines(&r.stdout);
    assert_eq!(lines.len(), 1, "{}\n{}", r.stdout, r.stderr);
    assert!(!lines[0].0.is_empty() && lines[0].0 == lines[0].1, "{}", r.stdout);
    assert_eq!(extra_line(&r.stdout), slurms.replace("nic=EPERM", "nic=open"), "the NIC Slurm gave was lost");
    wait_released();
}

/// The second node's GPU of NVML index i is `/dev/nvidia(i+4)` (its
/// minor number; tests/cluster.sh): Slurm's own steps and CARMA's open the
/// files of the GPUs they were given, which a grant by index would miss.
#[test]
fn on_a_node_whose_minors_differ_from_its_indices_steps_open_their_gpus() {
    require_cluster();
    let n2 = node2();
    for opts in [
        &["--gres=gpu:1"][..],
        &["--gres=gpu:2"],
        &["--carma-mem=4G"],
        &["--carma-gpus=2", "--carma-mem=4G", "--carma-policy=lug"],
        &["--gres=shard:1", "--carma-mem=4G"],
    ] {
        let mut args = vec!["-p", "wide", "-w", &n2];
        args.extend_from_slice(opts);
        let (told, opened) = srun_probe(&args);
        assert!(!told.is_empty(), "{opts:?}: no GPU given");
        assert_eq!(opened, told, "{opts:?}: on {n2} the step opened other GPUs than its own (by NVML index)");
    }
    wait_released();
}
