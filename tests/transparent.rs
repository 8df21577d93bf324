//! Transparent collocation on the real cluster: jobs that ask for whole GPUs
//! and know nothing of CARMA. tests/cluster.sh makes partitions `shared`
//! (default size 14G) and `multi` (both nodes, 4G) transparent scopes in
//! carma.yaml, and loads slurm-conf-examples/job_submit.lua into slurmctld;
//! `debug` is outside every scope.

mod common;
use common::job_field as field;
use common::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The scope's default size in tests/cluster.sh's carma.yaml.
const SHARED_DEFAULT_MIB: u64 = 14 * 1024;

/// Submits `path` as the test user; returns (job id, output file).
fn submit(opts: &[&str], name: &str, path: &str) -> (String, String) {
    let out = work_dir().join(format!("{}.out", unique(name))).to_string_lossy().into_owned();
    let mut args = vec!["sbatch", "--parsable", "-J", name, "-o", &out];
    args.extend_from_slice(opts);
    args.push(path);
    let id = user(&args, 30).ok().stdout.trim().to_string();
    (id, out)
}

/// A TRES string in one spelling: Slurm 22.05 writes `gres:gpu:1`, 23.11
/// and later `gres/gpu:1` (and each accepts only its own: the rewrite
/// keeps the spelling it was given).
fn one_spelling(tres: &str) -> String {
    tres.replace("gres/", "gres:")
}

/// The job's TresPerNode, in 22.05's spelling.
fn tres(job: &str) -> String {
    one_spelling(&field(job, "TresPerNode"))
}

/// `scontrol update` as the user. Slurm 24.11 and 26.05 answer a pending
/// job's partition change with EAGAIN ("Resource temporarily unavailable")
/// about half the time, with or without a job_submit.lua of ours (measured
/// with a pass-through script): try again, a bounded number of times.
fn update_as_user(job: &str, what: &str) {
    for _ in 0..20 {
        let r = user(&["scontrol", "update", &format!("jobid={job}"), what], 20);
        if r.code == 0 {
            return;
        }
        assert!(r.stderr.contains("Resource temporarily unavailable"), "scontrol update {what}: {}", r.stderr);
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!("scontrol update jobid={job} {what}: still refused after 20 tries");
}

/// Waits for a final state that stays put (an OOM-requeued job is briefly
/// FAILED before it restarts).
fn wait_final(job: &str, secs: u64) -> String {
    let start = Instant::now();
    loop {
        let st = field(job, "JobState");
        if ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"].contains(&st.as_str()) {
            let restarts = field(job, "Restarts");
            std::thread::sleep(Duration::from_millis(2500));
            if field(job, "JobState") == st && field(job, "Restarts") == restarts {
                wait_completed(job);
                return st;
            }
        }
        assert!(start.elapsed() < Duration::from_secs(secs), "job {job} still {st} after {secs} s");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn output_line(out: &str, prefix: &str) -> String {
    let text = std::fs::read_to_string(out).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} in {out}:\n{text}"))
        .into()
}

/// GPU index -> CARMA placements on it, from `carma status --json`, and
/// (job, holding, GPUs) of each reservation for messages. Slurm gives a
/// shard job's prolog SLURM_JOB_GPUS (measured), so the prolog records it
/// as holding that GPU whole until its first step shows it shares: those
/// short-lived records are not placements.
fn reservations_per_gpu() -> (usize, BTreeMap<u64, usize>, Vec<String>) {
    let r = root(&["carma", "status", "--json"], 20);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap_or_default();
    let all = v["reservations"].as_array().cloned().unwrap_or_default();
    let what = all.iter().map(|r| format!("{}:{}:{}", r["job"], r["holding"], r["gpu_indices"])).collect();
    let list: Vec<_> = all.into_iter().filter(|r| r["holding"] == "carma").collect();
    let mut per = BTreeMap::new();
    for res in &list {
        for g in res["gpu_indices"].as_array().into_iter().flatten() {
            *per.entry(g.as_u64().unwrap()).or_insert(0) += 1;
        }
    }
    (list.len(), per, what)
}

const TRAIN: &str =
    "echo \"DECISION $CARMA_DECISION\"\necho \"GPUS $SLURM_STEP_GPUS\"\ncarma-fakejob --mem 12G --seconds 15";

#[test]
fn unchanged_gpu_jobs_in_a_scope_share_gpus_and_one_that_outgrows_its_default_is_recovered_and_learns() {
    require_cluster();
    let status = root(&["carma", "status"], 20).ok().stdout;
    assert!(status.contains("transparent collocation: partition:shared (policy magm, default 14336 MiB)"), "{status}");
    let train = script(&unique("train"), TRAIN);
    // The one that outgrows the scope's default: 30G after 3 s, beside a
    // neighbour of 12G on a 40G GPU.
    let grow_to_mib = 30 * 1024;
    let big_name = unique("big");
    let big = script(
        &big_name,
        "echo \"DECISION $CARMA_DECISION\"\ncarma-fakejob --mem 12G --grow-to 30G --grow-after 3 --seconds 8",
    );
    // One name for the seven: the same job, new to the node's history.
    let train_name = unique("train");
    let mut jobs: Vec<(String, String)> =
        (0..7).map(|_| submit(&["-p", "shared", "--gres=gpu:1"], &train_name, &train)).collect();
    wait_reservations(7);
    let (big_id, big_out) = submit(&["-p", "shared", "--gres=gpu:1"], &big_name, &big);
    // All eight run at once, two per GPU (14G each, 40G GPUs, 2G headroom).
    let start = Instant::now();
    let (per_gpu, what) = loop {
        let (n, per_gpu, what) = reservations_per_gpu();
        if n == 8 {
            break (per_gpu, what);
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{n} placed: {per_gpu:?} {what:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(per_gpu.values().copied().collect::<Vec<_>>(), vec![2, 2, 2, 2], "{per_gpu:?} {what:?}");
    jobs.push((big_id.clone(), big_out.clone()));
    for (id, _) in &jobs {
        assert_eq!(tres(id), "gres:shard:1", "job {id}");
        assert!(
            one_spelling(&field(id, "Comment")).contains("gres:gpu:1 -> gres:shard:1"),
            "job {id}: {}",
            field(id, "Comment")
        );
    }
    for (id, out) in &jobs[..7] {
        assert_eq!(wait_final(id, 120), "COMPLETED", "job {id}");
        let d = output_line(out, "DECISION ");
        assert!(d.contains(&format!("estimate={SHARED_DEFAULT_MIB}M source=scope_default")), "{d}");
        assert!(d.contains("transparent=partition:shared") && d.contains("exclusive=false"), "{d}");
    }
    // The big one ran out of memory, was requeued and reran on a GPU of its own.
    assert_eq!(wait_final(&big_id, 180), "COMPLETED", "{}", std::fs::read_to_string(&big_out).unwrap_or_default());
    assert_eq!(field(&big_id, "Restarts"), "1");
    let d = output_line(&big_out, "DECISION ");
    assert!(d.contains("exclusive=true") && d.ends_with("recovery=exclusive transparent=partition:shared"), "{d}");
    let log = std::fs::read_to_string("/var/log/carma/carma.log").unwrap();
    assert!(log.contains(&format!("job {big_id} ran out of GPU memory")), "no OOM line for job {big_id}");
    assert!(log.contains(&format!("job {big_id}: remembered a need of {grow_to_mib} MiB")), "nothing learned");
    // Submitted again, unchanged: the learned peak (+10%) is its estimate,
    // and it runs through without a crash.
    let (again, again_out) = submit(&["-p", "shared", "--gres=gpu:1"], &big_name, &big);
    assert_eq!(wait_final(&again, 120), "COMPLETED");
    assert_eq!(field(&again, "Restarts"), "0");
    let d = output_line(&again_out, "DECISION ");
    let learned = grow_to_mib + grow_to_mib / 10;
    assert!(d.contains(&format!("estimate={learned}M source=history")), "{d}");
    report(
        "transparent",
        &format!(
            "8 unchanged --gres=gpu:1 jobs ran 2 per GPU; OOM job {big_id} recovered; resubmission estimated {learned} MiB from history"
        ),
    );
}

#[test]
fn the_same_jobs_outside_every_scope_get_whole_gpus() {
    require_cluster();
    let body = "echo \"DECISION ${CARMA_DECISION:-none}\"\necho \"GPUS $CUDA_VISIBLE_DEVICES\"\ncarma-fakejob --mem 12G --seconds 4";
    let train = script(&unique("whole"), body);
    let jobs: Vec<(String, String)> =
        (0..8).map(|_| submit(&["-p", "debug", "--gres=gpu:1"], "whole", &train)).collect();
    let ids: Vec<&str> = jobs.iter().map(|(id, _)| id.as_str()).collect();
    let mut most = 0;
    let start = Instant::now();
    while jobs.iter().any(|(id, _)| !["COMPLETED", "FAILED", "CANCELLED"].contains(&field(id, "JobState").as_str())) {
        let r = root(&["squeue", "-h", "-t", "R", "-j", &ids.join(","), "-o", "%i"], 20);
        most = most.max(r.stdout.lines().count());
        assert!(start.elapsed() < Duration::from_secs(120), "jobs did not finish");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(most, 4, "whole GPUs: at most 4 of the 8 run at once, and 4 do");
    for (id, out) in &jobs {
        wait_completed(id);
        assert_eq!(field(id, "JobState"), "COMPLETED", "job {id}");
        assert_eq!(tres(id), "gres:gpu:1");
        assert!(!field(id, "Comment").contains("carma"), "job {id}");
        assert_eq!(output_line(out, "DECISION "), "none");
    }
}

#[test]
fn opting_out_with_exclusive_keeps_a_whole_gpu_in_the_scope() {
    require_cluster();
    let body =
        "echo \"DECISION $CARMA_DECISION\"\necho \"JOBGPUS ${SLURM_JOB_GPUS:-}\"\ncarma-fakejob --mem 2G --seconds 6";
    let s = script(&unique("optout"), body);
    let (id, out) = submit(&["-p", "shared", "--gres=gpu:1", "--carma-policy=exclusive"], "optout", &s);
    assert_eq!(tres(&id), "gres:gpu:1");
    assert!(!field(&id, "Comment").contains("carma"));
    // Its GPU stays Slurm's: the prolog's whole-GPU record is what it holds.
    wait_slurm_whole(1);
    // A transparent job placed meanwhile does not share its GPU.
    let (r, text) = sbatch_wait(&["-p", "shared", "--gres=gpu:1"], &[], "echo \"DECISION $CARMA_DECISION\"", 60);
    assert_eq!(r.code, 0, "{text}");
    assert_eq!(wait_final(&id, 60), "COMPLETED");
    let whole = output_line(&out, "JOBGPUS ");
    assert!(!whole.is_empty(), "Slurm gave it a whole GPU");
    assert!(output_line(&out, "DECISION ").contains("exclusive=true"));
    let other = text.lines().find_map(|l| l.strip_prefix("DECISION ")).unwrap_or_default();
    assert!(other.contains("transparent=partition:shared"), "{other}");
    assert!(!other.contains(&format!("gpu_indices={whole} ")), "shared the opted-out GPU {whole}: {other}");
}

#[test]
fn multi_gpu_multi_node_and_srun_jobs_get_a_decision_on_every_node() {
    require_cluster();
    // Two nodes, one GPU each: every node decides for its own part.
    let body = "srun bash -c 'echo \"STEP $SLURMD_NODENAME $CARMA_DECISION\"'";
    let (r, text) = sbatch_wait(&["-p", "multi", "-N", "2", "--gres=gpu:1"], &[], body, 90);
    assert_eq!(r.code, 0, "{text}");
    let steps: BTreeMap<&str, &str> = text.lines().filter_map(|l| l.strip_prefix("STEP ")?.split_once(' ')).collect();
    assert_eq!(steps.len(), 2, "{text}");
    for d in steps.values() {
        assert!(d.contains("estimate=4096M source=scope_default gpu_count=1"), "{d}");
        assert!(d.contains("transparent=partition:multi"), "{d}");
    }
    // The second node had never seen the job: its own decision, not a reuse.
    assert_eq!(steps.values().filter(|d| d.contains("reused=yes")).count(), 1, "{text}");
    // --gpus=2 on one node keeps its two whole GPUs, under gpu_owner: carma
    // too (issue 58: as shard:2, both from one GPU, it was one GPU in
    // Slurm's books and two in CARMA's); the user's comment is untouched.
    let (r, text) = sbatch_wait(
        &["-p", "shared", "--gpus=2", "--comment=mine"],
        &[],
        "echo \"DECISION ${CARMA_DECISION:-none} GPUS=$SLURM_JOB_GPUS\"\nscontrol show job $SLURM_JOB_ID | grep -o 'Comment=.*'",
        60,
    );
    assert_eq!(r.code, 0, "{text}");
    assert!(text.contains("DECISION none GPUS=") && !text.contains("shard"), "{text}");
    assert!(text.contains("Comment=mine") && !one_spelling(&text).contains("-> gres:shard"), "{text}");
    // Steps that ask for GPUs inside such a job (cli_filter.lua turns
    // their request into the job's shards).
    let body = "srun --gres=gpu:1 printenv CARMA_DECISION\nsrun --gpus=1 printenv CARMA_DECISION";
    let (r, text) = sbatch_wait(&["-p", "shared", "--gres=gpu:1"], &[], body, 60);
    assert_eq!(r.code, 0, "{text}");
    assert_eq!(text.matches("reused=yes transparent=partition:shared").count(), 2, "{text}");
    // A job started by srun itself keeps whole GPUs: its own step asks
    // Slurm for gpu.
    let r = user(&["srun", "-p", "shared", "--gres=gpu:1", "printenv", "SLURM_STEP_GPUS"], 60).ok();
    assert!(!r.stdout.trim().is_empty(), "{}", r.stdout);
}

#[test]
fn the_batch_steps_signature_stays_the_jobs_while_its_steps_run() {
    require_cluster();
    // carma-epilog remembers an OOM's need under the signature in the
    // job's mark; a step with its own command line must not re-key it.
    let s = script(&unique("mark"), "sleep 2\nsrun true\nsrun printenv CARMA_DECISION\nsleep 2");
    let (id, _) = submit(&["-p", "shared", "--gres=gpu:1"], "mark", &s);
    let mark = format!("/run/carma/transparent-{id}");
    let start = Instant::now();
    let first = loop {
        if let Ok(t) = std::fs::read_to_string(&mark) {
            break t;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "no {mark}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(first.starts_with("partition:shared ") && first.contains(":job:"), "{first}");
    std::thread::sleep(Duration::from_millis(3500));
    assert_eq!(std::fs::read_to_string(&mark).unwrap_or_default(), first, "re-keyed by a step");
    wait_final(&id, 60);
    assert!(!std::path::Path::new(&mark).exists(), "the epilog removes the mark");
}

#[test]
fn requests_the_rewrite_cannot_keep_are_left_whole() {
    require_cluster();
    // --cpus-per-gpu refers to GPUs: shards would break it.
    let (r, text) = sbatch_wait(
        &["-p", "shared", "--gres=gpu:1", "--cpus-per-gpu=1"],
        &[],
        "echo \"DECISION ${CARMA_DECISION:-none}\"",
        60,
    );
    assert_eq!(r.code, 0, "{text}");
    assert!(text.contains("DECISION none"), "{text}");
    // A pending job moved into the scope keeps its GPUs whole (Slurm does
    // not let a pending job trade gpu for shard); one given GPUs by an
    // update in the scope is rewritten.
    let s = script(&unique("held"), "true");
    let (moved, _) = submit(&["-H", "-p", "debug", "--gres=gpu:1"], "held", &s);
    update_as_user(&moved, "partition=shared");
    assert_eq!((field(&moved, "Partition"), tres(&moved)), ("shared".into(), "gres:gpu:1".into()));
    let (updated, _) = submit(&["-H", "-p", "shared"], "held", &s);
    update_as_user(&updated, "gres=gpu:1");
    assert_eq!(tres(&updated), "gres:shard:1");
    root(&["scancel", &moved, &updated], 20).ok();
}

/// slurmctld reloads job_submit.lua when its file changes, and with it the
/// scopes file (read otherwise at most once a minute).
fn reload_submit_lua() {
    let lua = "/etc/slurm/job_submit.lua";
    let text = std::fs::read(lua).unwrap();
    // A later mtime, whatever the clock's granularity.
    std::thread::sleep(Duration::from_millis(1100));
    std::fs::write(lua, text).unwrap();
}

/// Restores carma.yaml and the scopes file, then has slurmctld read them.
struct OwnerRestored(#[allow(dead_code)] Restore, #[allow(dead_code)] Restore);

impl Drop for OwnerRestored {
    fn drop(&mut self) {
        let _ = std::fs::write("/etc/slurm/carma.yaml", self.0.saved().unwrap_or_default());
        let _ = std::fs::write("/etc/slurm/carma-scopes", self.1.saved().unwrap_or_default());
        reload_submit_lua();
    }
}

/// With carma.yaml `gpu_owner: slurm` (the default; the test cluster sets
/// carma), a job runs on the GPU its shards are on, and Slurm takes a job's
/// shards from one GPU: a request of two GPUs in a scope stays whole, one
/// GPU still becomes a shard (`--gres=gpu:2` as `shard:2` would be one
/// GPU's shards, and its step would fail: "1 of 1 GPUs qualify, 2 needed").
#[test]
fn under_gpu_owner_slurm_a_job_of_two_gpus_in_a_scope_keeps_them_whole() {
    require_cluster();
    let _restore = OwnerRestored(Restore::new("/etc/slurm/carma.yaml"), Restore::new("/etc/slurm/carma-scopes"));
    let conf = std::fs::read_to_string("/etc/slurm/carma.yaml").unwrap();
    std::fs::write("/etc/slurm/carma.yaml", conf.replace("\ngpu_owner: carma\n", "\ngpu_owner: slurm\n")).unwrap();
    let status: serde_json::Value =
        serde_json::from_str(&root(&["carma", "status", "--json"], 20).ok().stdout).unwrap();
    assert_eq!(status["gpu_owner"], "slurm", "the switch to gpu_owner: slurm did not take");
    root(
        &["carma", "transparent-scopes", "--config", "/etc/slurm/carma.yaml", "--output", "/etc/slurm/carma-scopes"],
        20,
    )
    .ok();
    reload_submit_lua();
    let body = "echo \"DECISION ${CARMA_DECISION:-none}\"";
    let (r, text) = sbatch_wait(&["-p", "shared", "--gres=gpu:2"], &[], body, 60);
    assert_eq!(r.code, 0, "the two-GPU job failed:\n{text}");
    assert!(text.contains("DECISION none"), "the two-GPU job was collocated: {text}");
    let (r, text) = sbatch_wait(&["-p", "shared", "--gres=gpu:1"], &[], body, 60);
    assert_eq!(r.code, 0, "{text}");
    assert!(text.contains("DECISION policy="), "the one-GPU job was not collocated: {text}");
    wait_released();
}
