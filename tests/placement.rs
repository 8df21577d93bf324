//! Real-Slurm placement tests with simulated GPUs: jobs run carma-fakejob,
//! which registers memory on the GPUs the plugin chose and fails like
//! PyTorch when a GPU runs out of memory.

mod common;
use common::*;
use std::collections::HashMap;
use std::process::Command;
use std::thread;

/// One finished job: the GPU(s) it ran on and when.
#[derive(Debug, Clone)]
struct Span {
    gpus: String,
    start: f64,
    end: f64,
    rc: i32,
    out: String,
}

const GPU_BODY: &str = "echo \"START $(date +%s.%N) $SLURM_STEP_GPUS\"\n\
                        carma-fakejob $FAKE\nrc=$?\necho \"END $(date +%s.%N) $rc\"\nexit $rc";

fn parse_span(out: &str) -> Span {
    let field = |tag: &str, i: usize| -> String {
        out.lines()
            .find(|l| l.starts_with(tag))
            .and_then(|l| l.split_whitespace().nth(i))
            .unwrap_or_else(|| panic!("no {tag} line in job output:\n{out}"))
            .to_string()
    };
    Span {
        gpus: field("START", 2),
        start: field("START", 1).parse().unwrap(),
        end: field("END", 1).parse().unwrap(),
        rc: field("END", 2).parse().unwrap(),
        out: out.to_string(),
    }
}

/// Submits all jobs at once (sbatch --wait each, in parallel threads).
fn run_all(jobs: Vec<(Vec<String>, String)>) -> Vec<Span> {
    let handles: Vec<_> = jobs
        .into_iter()
        .map(|(opts, fake)| {
            thread::spawn(move || {
                let o: Vec<&str> = opts.iter().map(String::as_str).collect();
                let (r, out) = sbatch_wait(&o, &[("FAKE", &fake)], GPU_BODY, 240);
                assert!(r.code == 0 || out.contains("END"), "sbatch failed: {} {}\n{out}", r.stdout, r.stderr);
                parse_span(&out)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn overlap(a: &Span, b: &Span) -> bool {
    a.start < b.end && b.start < a.end
}

fn opts(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// Greatest number of jobs running on one GPU at the same moment.
fn peak_per_gpu(spans: &[Span]) -> HashMap<String, usize> {
    let mut peak = HashMap::new();
    for s in spans {
        let at_start = spans.iter().filter(|o| o.gpus == s.gpus && o.start <= s.start && s.start < o.end).count();
        let e = peak.entry(s.gpus.clone()).or_insert(0);
        *e = (*e).max(at_start);
    }
    peak
}

fn assert_state_empty() {
    let r = root(&["carma", "status", "--json"], 30).ok();
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["reservations"].as_array().map(Vec::len), Some(0), "reservations left behind: {}", r.stdout);
}

#[test]
fn magm_collocates_eight_jobs_without_exceeding_memory() {
    require_cluster();
    // 14 GiB estimate + 2 GiB headroom: two fit on a 40 GiB GPU, a third does not.
    let jobs = (0..8)
        .map(|_| (opts(&["--carma-policy=magm", "--carma-mem=14G"]), "--mem 12G --seconds 6 --ramp 1".to_string()))
        .collect();
    let spans = run_all(jobs);
    for s in &spans {
        assert_eq!(s.rc, 0, "a job failed (OOM?):\n{}", s.out);
    }
    let peak = peak_per_gpu(&spans);
    assert!(peak.values().all(|&n| n <= 2), "more than two 14G jobs shared a GPU: {peak:?}");
    assert!(peak.values().any(|&n| n == 2), "no collocation happened: {peak:?}");
    assert_eq!(peak.len(), 4, "magm should spread over all four GPUs: {peak:?}");
    assert_state_empty();
}

#[test]
fn exclusive_never_collocates_and_waiting_jobs_start_when_a_gpu_frees() {
    require_cluster();
    let jobs = (0..6)
        .map(|_| (opts(&["--carma-policy=exclusive", "--carma-mem=4G"]), "--mem 3G --seconds 4".to_string()))
        .collect();
    let spans = run_all(jobs);
    for (i, a) in spans.iter().enumerate() {
        assert_eq!(a.rc, 0, "{}", a.out);
        for b in &spans[i + 1..] {
            assert!(!(a.gpus == b.gpus && overlap(a, b)), "exclusive jobs shared GPU {}: {a:?} {b:?}", a.gpus);
        }
    }
    // Six jobs on four GPUs: two must have waited for a GPU to free.
    let first_end = spans.iter().map(|s| s.end).fold(f64::MAX, f64::min);
    let late = spans.iter().filter(|s| s.start >= first_end - 0.5).count();
    assert!(late >= 2, "expected two jobs to wait: {spans:?}");
    assert_state_empty();
}

#[test]
fn a_job_that_cannot_fit_waits_and_starts_when_memory_frees() {
    require_cluster();
    // Four 30G jobs fill every GPU (30 + 2 headroom leaves 8 GiB); a 20G job
    // must wait until one of them ends.
    let mut jobs: Vec<(Vec<String>, String)> = (0..4)
        .map(|_| (opts(&["--carma-policy=ff", "--carma-mem=30G"]), "--mem 30G --seconds 6".to_string()))
        .collect();
    let big = thread::spawn(move || run_all(std::mem::take(&mut jobs)));
    wait_reservations(4);
    let late = run_all(vec![(opts(&["--carma-policy=ff", "--carma-mem=20G"]), "--mem 20G --seconds 1".to_string())]);
    let big = big.join().unwrap();
    let first_end = big.iter().map(|s| s.end).fold(f64::MAX, f64::min);
    assert_eq!(late[0].rc, 0, "{}", late[0].out);
    assert!(late[0].start >= first_end - 0.3, "the 20G job started before memory freed: {late:?} {big:?}");
    assert!(big.iter().all(|s| s.rc == 0));
}

#[test]
fn parallel_sruns_never_get_the_same_last_slot() {
    require_cluster();
    // Three GPUs held exclusively; GPU 3 can take one 20G job but not two.
    let mut hold: Vec<(Vec<String>, String)> = (0..3)
        .map(|_| (opts(&["--carma-policy=exclusive", "--carma-mem=1G"]), "--mem 1G --seconds 8".to_string()))
        .collect();
    let holders = thread::spawn(move || run_all(std::mem::take(&mut hold)));
    wait_reservations(3);
    let racers: Vec<_> = (0..2)
        .map(|_| {
            thread::spawn(|| {
                let r = user_env(
                    &[("CARMA_MEM", "20G")],
                    &["srun", "--carma-policy=ff", "bash", "-c", "echo \"START $(date +%s.%N) $SLURM_STEP_GPUS\"; carma-fakejob --mem 20G --seconds 2; echo \"END $(date +%s.%N) $?\""],
                    120,
                );
                parse_span(&r.stdout)
            })
        })
        .collect();
    let racers: Vec<Span> = racers.into_iter().map(|h| h.join().unwrap()).collect();
    let holders = holders.join().unwrap();
    assert!(racers.iter().all(|s| s.rc == 0), "{racers:?}");
    if racers[0].gpus == racers[1].gpus {
        assert!(!overlap(&racers[0], &racers[1]), "two 20G jobs shared the last slot at once: {racers:?}");
    }
    for r in &racers {
        for h in &holders {
            assert!(!(r.gpus == h.gpus && overlap(r, h)), "placed on an exclusive GPU: {r:?} {h:?}");
        }
    }
}

#[test]
fn gpus_slurm_gave_whole_are_never_collocation_targets() {
    require_cluster();
    // A job without CARMA holds GPU 0 whole through Slurm's gres.
    let hold =
        thread::spawn(|| user(&["srun", "--gres=gpu:1", "bash", "-c", "echo GPU=$SLURM_STEP_GPUS; sleep 6"], 60));
    wait_slurm_whole(1);
    let r = user(&["srun", "--carma-policy=ff", "--carma-mem=1G", "printenv", "SLURM_STEP_GPUS"], 60).ok();
    let held = hold.join().unwrap().ok();
    let held_gpu = held.stdout.trim().trim_start_matches("GPU=").to_string();
    assert_eq!(held_gpu, "0");
    assert_eq!(r.stdout.trim(), "1", "first-fit must skip the GPU Slurm gave whole to another job");
    // A shard job without CARMA does not block its GPU.
    let hold = thread::spawn(|| {
        user(&["srun", "--gres=shard:1", "bash", "-c", "touch /tmp/carma-tests/shard-up; sleep 5"], 60)
    });
    let up = std::path::Path::new("/tmp/carma-tests/shard-up");
    let start = std::time::Instant::now();
    while !up.exists() {
        assert!(start.elapsed() < std::time::Duration::from_secs(60), "shard job never started");
        thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = std::fs::remove_file(up);
    let r = user(&["srun", "--carma-policy=ff", "--carma-mem=1G", "printenv", "SLURM_STEP_GPUS"], 60).ok();
    hold.join().unwrap().ok();
    assert_eq!(r.stdout.trim(), "0", "a shard job's GPU stays a collocation target");
    assert_state_empty();
}

#[test]
fn every_decision_is_logged_with_its_reason() {
    require_cluster();
    let name = unique("logged");
    let r = user(&["srun", "-J", &name, "--carma-policy=bf", "--carma-mem=2G", "printenv", "SLURM_JOB_ID"], 60).ok();
    let job = r.stdout.trim().to_string();
    let log = std::fs::read_to_string("/var/log/carma/carma.log").unwrap();
    let line = log
        .lines()
        .find(|l| l.contains(&format!("job {job} step 0: policy=bf")))
        .unwrap_or_else(|| panic!("no decision line for job {job}"));
    assert!(line.contains("estimate=2048M source=declared") && line.contains("effective_free="), "{line}");
    assert!(line.contains("gpu_count=1 gpu_indices="), "indices and count named apart: {line}");
    // A readable UTC time that date(1) agrees with, not seconds since 1970.
    let stamp = line.split(' ').next().unwrap();
    assert!(stamp.len() == 24 && stamp.as_bytes()[10] == b'T' && stamp.ends_with('Z'), "{line}");
    let parsed = root(&["date", "-u", "-d", stamp, "+%s"], 10).ok().stdout.trim().parse::<u64>().unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    assert!(now.abs_diff(parsed) < 120, "{stamp} is not now ({now})");
    let srun_job = job;
    // The batch step is named as Slurm names it, never 4294967291.
    let (r, out) = sbatch_wait(&["--carma-mem=1G"], &[], "echo \"$CARMA_DECISION\"; echo JOB=$SLURM_JOB_ID", 60);
    assert_eq!(r.code, 0, "{out}");
    let job = out.lines().find_map(|l| l.strip_prefix("JOB=")).unwrap_or_else(|| panic!("{out}")).to_string();
    assert!(out.contains("gpu_count=1 gpu_indices="), "{out}");
    let log = std::fs::read_to_string("/var/log/carma/carma.log").unwrap();
    assert!(log.contains(&format!("job {job} step batch: policy=")), "no batch step line for job {job}");
    assert!(!log.contains("4294967291"), "a step id Slurm never shows");
    // (slurmstepd releases after srun returns: looked for after the batch job.)
    assert!(log.contains(&format!("job {srun_job} step 0 released gpu_indices=")), "release not logged");
}

#[test]
fn an_unplaceable_job_fails_with_its_reason_and_never_drains_the_node() {
    require_cluster();
    // Five shards (all from one GPU) for five GPUs: slurmctld lets it
    // through (five shards could be five GPUs), slurmstepd refuses it at
    // once with what to ask for.
    let (r, out) = sbatch_wait(&["--gres=shard:5", "--carma-gpus=5", "--carma-mem=1G"], &[], "echo SHOULD-NOT-RUN", 60);
    assert_ne!(r.code, 0, "a job needing 5 GPUs on 5 shards succeeded");
    assert!(!out.contains("SHOULD-NOT-RUN"), "{out}");
    assert!(
        out.contains("carma: this step was not started")
            && out.contains("asks for 5 GPUs but Slurm charged the job")
            && out.contains("--gres=gpu:5"),
        "{out}"
    );
    let r = user(&["srun", "--gres=shard:5", "--carma-gpus=5", "--carma-mem=1G", "true"], 60);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("--gres=gpu:5"), "{}", r.stderr);
    let state = root(&["sinfo", "-h", "-o", "%T"], 10).stdout;
    assert!(!state.contains("drain"), "node drained: {state}");
}

/// Issue 58: under gpu_owner: carma (this cluster), `--gres=shard:1
/// --carma-gpus=4 --carma-policy=exclusive` ran with four whole GPUs while
/// Slurm charged one shard and counted the other three GPUs free. A step
/// uses at most the GPUs Slurm allocated its job: N GPUs need gpu:N.
#[test]
fn one_shard_opens_one_gpus_worth_and_n_gpus_need_n_from_slurm() {
    require_cluster();
    // Refused before submission (job_submit.lua), in one line.
    let s = script(&unique("four"), "echo SHOULD-NOT-RUN");
    for cmd in [vec!["sbatch", s.as_str()], vec!["srun", "true"]] {
        let mut args = vec![cmd[0], "--gres=shard:1", "--carma-gpus=4", "--carma-policy=exclusive", "--carma-mem=1G"];
        args.extend_from_slice(&cmd[1..]);
        let r = user_env_as_given(&[], &args, 60);
        assert_ne!(r.code, 0, "{args:?} was accepted");
        assert!(
            r.stderr.contains("carma: --carma-gpus=4 asks for 4 GPUs") && r.stderr.contains("--gres=gpu:4"),
            "{}",
            r.stderr
        );
    }
    // Past the client (CARMA_GPUS set in a step of a one-shard job, which
    // no job_submit sees): slurmstepd refuses the step, the job goes on.
    let body = "CARMA_GPUS=4 CARMA_POLICY=exclusive srun printenv CUDA_VISIBLE_DEVICES; echo AFTER";
    let (r, out) = sbatch_wait(&["--gres=shard:1", "--carma-mem=1G"], &[], body, 90);
    assert_eq!(r.code, 0, "{out}");
    assert!(
        out.contains("carma: this step was not started: ")
            && out.contains("--carma-gpus=4: the step asks for 4 GPUs but Slurm charged the job 1")
            && out.contains("--gres=gpu:4")
            && out.contains("AFTER"),
        "{out}"
    );
    // One shard, exclusive: one GPU, as before.
    let (r, out) = sbatch_wait(
        &["--gres=shard:1", "--carma-policy=exclusive", "--carma-mem=1G"],
        &[],
        "echo CVD=$CUDA_VISIBLE_DEVICES",
        60,
    );
    assert_eq!(r.code, 0, "{out}");
    let cvd = out.lines().find_map(|l| l.strip_prefix("CVD=")).unwrap_or_else(|| panic!("{out}"));
    assert_eq!(cvd.split(',').count(), 1, "one shard opened {cvd}");
    // Four GPUs from Slurm: four.
    let (r, out) = sbatch_wait(
        &["--gres=gpu:4", "--carma-gpus=4", "--carma-policy=exclusive", "--carma-mem=1G"],
        &[],
        "echo CVD=$CUDA_VISIBLE_DEVICES",
        60,
    );
    assert_eq!(r.code, 0, "{out}");
    let cvd = out.lines().find_map(|l| l.strip_prefix("CVD=")).unwrap_or_else(|| panic!("{out}"));
    assert_eq!(cvd.split(',').count(), 4, "{out}");
    let state = root(&["sinfo", "-h", "-o", "%T"], 10).stdout;
    assert!(!state.contains("drain"), "node drained: {state}");
    wait_released();
    report(
        "privilege",
        "one shard opens one GPU's worth under gpu_owner: carma: --carma-gpus=N above the GPUs or shards a job asks Slurm for is refused at sbatch/srun, and a step asking more GPUs than Slurm allocated its job (CARMA_GPUS in the step) is refused by slurmstepd with the gres to ask; gpu:N gives N",
    );
}

#[test]
fn the_capped_reading_is_chosen_in_carma_yaml_and_named_in_decisions_status_and_dry_runs() {
    require_cluster();
    // On the second node, whose placement reads carma-monitor's readings:
    // SM activity is measured by NVML GPM between the monitor's samples (a
    // one-off NVML read in slurmstepd has busy time only).
    const N2: &str = "/etc/slurm/node2/carma.yaml";
    let node = node2();
    let reservations = || {
        let v: serde_json::Value =
            serde_json::from_str(&root(&["carma", "status", "--json", "--config", N2], 20).stdout).unwrap_or_default();
        v["reservations"].as_array().map_or(0, Vec::len)
    };
    let released = || {
        let start = std::time::Instant::now();
        while reservations() > 0 {
            assert!(start.elapsed().as_secs() < 30, "reservations on {node} not released");
            thread::sleep(std::time::Duration::from_millis(100));
        }
    };
    released();
    // Outside CARMA, a light time-sliced job on GPU 0: its kernels run 90%
    // of the time but keep only 10% of the SMs busy.
    let mut light = Command::new("runuser")
        .args(["-u", USER, "--", "env", "CUDA_VISIBLE_DEVICES=0"])
        .args(["carma-fakejob", "--config", N2, "--mem", "2G", "--sm", "0.1", "--busy", "0.9", "--seconds", "120"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let status = || root(&["carma", "status", "--config", N2], 20).stdout;
    let start = std::time::Instant::now();
    // The window's means reach the job's own readings (2 s window).
    while !status().lines().any(|l| l.starts_with("0 ") && l.contains(" 0.10  0.90 ")) {
        assert!(start.elapsed().as_secs() < 30, "{}", status());
        thread::sleep(std::time::Duration::from_millis(100));
    }
    let st = status();
    assert!(st.starts_with("precondition: sm <= 0.80") && st.contains(" SM  BUSY "), "{st}");
    let dry =
        || root(&["carma", "place", "--dry-run", "--config", N2, "--mem", "4G", "--policy", "ff"], 20).ok().stdout;
    // Capping SM activity (the default), GPU 0 takes the job.
    let out = dry();
    assert!(out.contains("would place on gpu_indices=0") && out.contains("GPU0: chosen (SM activity 0.10"), "{out}");
    assert!(out.contains("GPU1: qualifies, ranked after the chosen"), "{out}");
    let srun = [
        "srun",
        "-p",
        "multi",
        "-w",
        node.as_str(),
        "--carma-policy=ff",
        "--carma-mem=1G",
        "printenv",
        "CARMA_DECISION",
    ];
    let r = user(&srun, 60).ok();
    assert!(r.stdout.contains("gpu_indices=0 ") && r.stdout.contains(" sm=0.10"), "{}", r.stdout);
    released();

    // Capping busy time instead: GPU 0 is refused, and every report says why.
    let _conf = Restore::new(N2);
    let conf = std::fs::read_to_string(N2).unwrap();
    std::fs::write(N2, format!("{conf}activity_metric: busy\nbusy_cap: 0.85\n")).unwrap();
    let out = dry();
    assert!(out.contains("precondition: busy <= 0.85"), "{out}");
    assert!(out.contains("would place on gpu_indices=1") && out.contains("GPU0: no: busy 0.90 > cap 0.85"), "{out}");
    let r = user(&srun, 60).ok();
    assert!(r.stdout.contains("gpu_indices=1 ") && r.stdout.contains(" busy=0.00"), "{}", r.stdout);
    // A job that needs GPU 0 too does not fit now, and the reason names the
    // reading (a real step would wait up to timeouts.wait for it).
    released();
    let out = root(&["carma", "place", "--dry-run", "--config", N2, "--mem", "1G", "--gpus", "4"], 20).ok().stdout;
    assert!(out.contains("would not place now: 3 of 4 GPUs qualify, 4 needed"), "{out}");
    assert!(out.contains("GPU0: no: busy 0.90 > cap 0.85"), "{out}");
    // Dry runs reserve nothing.
    assert_eq!(reservations(), 0);
    let _ = light.kill();
    let _ = light.wait();
}
