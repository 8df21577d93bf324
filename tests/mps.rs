//! `sharing: mps` on the real cluster's second node (tests/cluster.sh): its
//! carma.yaml says `sharing: mps` with pipe directories /run/carma-mps/<gpu>,
//! each with its MPS control daemon (the stand-in carma-fake-mps-control,
//! run as root as nvidia-cuda-mps-control) and its `control` pipe.
//! carma-fakejob behaves as an MPS client there: the daemon starts its
//! user's server, and it fails an allocation past its fence with CUDA's
//! OOM message, as CUDA under MPS does. What only a GPU can show (real MPS
//! servers, a real fence) is in tests/gpu/.

mod common;
use common::*;
use std::process::Command;
use std::time::{Duration, Instant};

const USER2: &str = "carmatest2";
const PIPE: &str = "/run/carma-mps";

fn on_node2<'a>(node: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["srun", "-p", "multi", "-w", node, "--gres=shard:1"];
    v.extend_from_slice(extra);
    v
}

/// Runs a command as the second test user.
fn user2(args: &[&str], secs: u32) -> Run {
    let out = Command::new("timeout")
        .arg(secs.to_string())
        .args(["runuser", "-u", USER2, "--"])
        .args(common::with_shard(&[], args))
        .current_dir("/tmp")
        .env_remove("SLURM_JOB_ID")
        .output()
        .unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// What the second node's placement read last, for a failure's message:
/// its published readings, its state, and its log's last lines.
fn node2_now() -> String {
    let tail = |p: &str| {
        let t = std::fs::read_to_string(p).unwrap_or_default();
        t.lines().rev().take(12).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
    };
    format!(
        "readings: {}\nstate: {}\nlog:\n{}",
        std::fs::read_to_string("/run/carma2/readings.json").unwrap_or_default(),
        std::fs::read_to_string("/run/carma2/state.json").unwrap_or_default(),
        tail(&format!("/var/log/carma/carma-{}.log", node2()))
    )
}

fn decision_of(text: &str) -> String {
    text.lines().find(|l| l.contains("policy=")).unwrap_or_default().trim().to_string()
}

#[test]
fn a_shared_step_is_an_mps_client_fenced_to_its_reservation() {
    require_cluster();
    let node = node2();
    let args = on_node2(&node, &["--carma-mem=4G", "--carma-policy=ff", "env"]);
    let r = user(&args, 60).ok();
    let gpu = r.var("SLURM_STEP_GPUS").unwrap();
    assert_eq!(r.var("CUDA_MPS_PIPE_DIRECTORY"), Some(format!("{PIPE}/{gpu}")), "{}", r.stdout);
    assert_eq!(r.var("CUDA_MPS_LOG_DIRECTORY"), Some(format!("/var/log/carma-mps/{gpu}")));
    // The fence is the reservation, on the device as the job sees it.
    assert_eq!(r.var("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT").as_deref(), Some("0=4096M"));
    assert!(r.var("CARMA_DECISION").unwrap().ends_with("sharing=mps fence=0=4096M"));
    // Whole GPUs and multi-GPU steps (two GPUs from Slurm: a shard is at
    // most one GPU's worth) are not MPS clients.
    let two = ["srun", "-p", "multi", "-w", &node, "--gres=gpu:2", "--carma-gpus=2", "--carma-mem=4G", "env"];
    for (extra, a) in [
        (
            ["--carma-policy=exclusive", "--carma-mem=4G"],
            on_node2(&node, &["--carma-policy=exclusive", "--carma-mem=4G", "env"]),
        ),
        (["--carma-gpus=2", "--carma-mem=4G"], two.to_vec()),
    ] {
        let r = user(&a, 60).ok();
        assert!(r.var("CUDA_MPS_PIPE_DIRECTORY").is_none(), "{extra:?}: {}", r.stdout);
        assert!(!r.var("CARMA_DECISION").unwrap().contains("sharing="), "{extra:?}");
    }
}

#[test]
fn a_gpu_serving_one_users_mps_jobs_takes_no_other_users_job() {
    require_cluster();
    let node = node2();
    wait_gpus_idle();
    // carmatest's MPS job holds GPU0 (first fit) for a while.
    let body =
        "echo \"DECISION $CARMA_DECISION\"\ncarma-fakejob --config /etc/slurm/node2/carma.yaml --mem 2G --seconds 12";
    let name = unique("mpsA");
    let path = script(&name, body);
    let out = work_dir().join(format!("{name}.out")).to_string_lossy().into_owned();
    let a = user(
        &[
            "sbatch",
            "--parsable",
            "-p",
            "multi",
            "-w",
            &node,
            "--gres=shard:1",
            "--carma-policy=ff",
            "--carma-mem=2G",
            "-o",
            &out,
            &path,
        ],
        30,
    )
    .ok()
    .stdout
    .trim()
    .to_string();
    let start = Instant::now();
    while !std::fs::read_to_string(&out).unwrap_or_default().contains("carma-fakejob: pid") {
        assert!(start.elapsed() < Duration::from_secs(30), "job {a} did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(decision_of(&std::fs::read_to_string(&out).unwrap()).contains("gpu_indices=0 "));
    // Past the monitor's 2 s window, the job's activity is in the readings
    // and no longer also counted as a recent placement (policy.rs,
    // expected_activity): what is tested below is MPS's one-user rule
    // alone, not the burst rule.
    std::thread::sleep(Duration::from_secs(3));
    // Another user, first fit too: not GPU0 while carmatest's server runs there.
    let ff = on_node2(&node, &["--carma-policy=ff", "--carma-mem=2G", "printenv", "CARMA_DECISION"]);
    let other = user2(&ff, 60);
    assert_eq!(other.code, 0, "{}", other.stderr);
    assert!(other.stdout.contains("gpu_indices=1 "), "{}\n{}", other.stdout, node2_now());
    // The same user joins its own server.
    let same = user(&ff, 60).ok();
    assert!(same.stdout.contains("gpu_indices=0 "), "{}\n{}", same.stdout, node2_now());
    wait_completed(&a);
    // Once carmatest's jobs are gone, and the monitor's readings (up to one
    // interval old) show no MPS user on GPU0, it serves whoever comes.
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string("/run/carma2/readings.json").unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        if v["gpus"][0].get("mps_uid").is_none_or(|u| u.is_null()) && !text.is_empty() {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "GPU0 still serves: {text}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let later = user2(&ff, 60);
    assert!(later.stdout.contains("gpu_indices=0 "), "{}", later.stdout);
    report("mps", "a GPU serving one user's MPS jobs took no other user's job until they ended");
}

#[test]
fn a_job_past_its_fence_fails_alone_and_its_rerun_gets_a_gpu_of_its_own() {
    require_cluster();
    let node = node2();
    wait_gpus_idle();
    // The neighbour: 3G of a 4G fence, 10 s.
    let calm = script(&unique("calm"), "carma-fakejob --config /etc/slurm/node2/carma.yaml --mem 3G --seconds 10");
    // Grows to 6G past its 4G fence after 2 s (the GPU has 40G: without the
    // fence it would not fail).
    let body = "echo \"DECISION $CARMA_DECISION\"\ncarma-fakejob --config /etc/slurm/node2/carma.yaml --mem 2G --grow-to 6G --grow-after 2 --seconds 5";
    let greedy = script(&unique("greedy"), body);
    let opts = ["-p", "multi", "-w", node.as_str(), "--gres=shard:1", "--carma-policy=ff", "--carma-mem=4G"];
    let submit = |path: &str, tag: &str| {
        let out = work_dir().join(format!("{}.out", unique(tag))).to_string_lossy().into_owned();
        let mut args = vec!["sbatch", "--parsable", "--open-mode=append", "-o", out.as_str()];
        args.extend_from_slice(&opts);
        args.push(path);
        (user(&args, 30).ok().stdout.trim().to_string(), out)
    };
    let (calm_id, calm_out) = submit(&calm, "calm");
    let (greedy_id, greedy_out) = submit(&greedy, "greedy");
    wait_completed(&calm_id);
    let calm_text = std::fs::read_to_string(&calm_out).unwrap();
    assert!(calm_text.contains("carma-fakejob: done"), "the neighbour was hurt: {calm_text}");
    // The greedy one hit its fence, was requeued, and reran unfenced on a GPU of its own.
    let start = Instant::now();
    loop {
        let st = root(&["scontrol", "show", "job", &greedy_id], 20).stdout;
        if st.contains("JobState=COMPLETED") && st.contains("Restarts=1") {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(90), "{st}");
        std::thread::sleep(Duration::from_millis(300));
    }
    let text = std::fs::read_to_string(&greedy_out).unwrap();
    assert!(text.contains("CUDA out of memory. Tried to allocate 6144 MiB"), "{text}");
    let decisions: Vec<&str> = text.lines().filter(|l| l.starts_with("DECISION ")).collect();
    assert_eq!(decisions.len(), 2, "{text}");
    assert!(decisions[0].ends_with("sharing=mps fence=0=4096M"), "{}", decisions[0]);
    assert!(decisions[1].contains("exclusive=true") && !decisions[1].contains("fence"), "{}", decisions[1]);
    assert!(text.contains("carma-fakejob: done"), "{text}");
    report(
        "mps",
        "a job past its MPS fence failed alone (its neighbour finished), was requeued and completed on a GPU of its own",
    );
}

#[test]
fn without_an_mps_daemon_steps_share_by_time_slicing_and_say_so() {
    require_cluster();
    let node = node2();
    // Hide GPU0's daemon from CARMA for this test: its `control` pipe.
    let control = format!("{PIPE}/0/control");
    let moved = format!("{PIPE}/0/control.away");
    std::fs::rename(&control, &moved).unwrap();
    struct Back(String, String);
    impl Drop for Back {
        fn drop(&mut self) {
            let _ = std::fs::rename(&self.1, &self.0);
        }
    }
    let _back = Back(control, moved);
    wait_gpus_idle();
    let r = user(&on_node2(&node, &["--carma-policy=ff", "--carma-mem=2G", "env"]), 60).ok();
    assert_eq!(r.var("SLURM_STEP_GPUS").as_deref(), Some("0"));
    assert!(r.var("CUDA_MPS_PIPE_DIRECTORY").is_none(), "{}", r.stdout);
    assert!(r.var("CARMA_DECISION").unwrap().ends_with("sharing=timeslice (no MPS daemon)"));
    let log = std::fs::read_to_string(format!("/var/log/carma/carma-{node}.log")).unwrap_or_default();
    assert!(log.contains(&format!("no MPS control daemon for GPU 0 ({PIPE}/0/control missing)")), "no log line");
}

/// Waits (at most 60 s) until no CARMA job holds a GPU of the second node.
fn wait_gpus_idle() {
    let start = Instant::now();
    loop {
        let r = root(&["carma", "status", "--json", "--config", "/etc/slurm/node2/carma.yaml"], 20);
        let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap_or_default();
        if v["reservations"].as_array().is_some_and(Vec::is_empty) {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "second node still busy: {}", r.stdout);
        std::thread::sleep(Duration::from_millis(200));
    }
}
