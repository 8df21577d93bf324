//! Real-Slurm tests of the estimator path: `--carma-model` is read and
//! estimated by sbatch/srun as the submitting user, the estimate reaches
//! slurmstepd and decides placement; bad or hostile model files are
//! refused at submit time with one line, and nothing is submitted.

mod common;
use common::*;
use std::path::PathBuf;
use std::process::Command;
use std::thread;

const BODY: &str = "echo \"DECISION $CARMA_DECISION\"\necho \"GPU $SLURM_STEP_GPUS\"\nsleep 6";

fn field<'a>(out: &'a str, tag: &str) -> &'a str {
    out.lines().find_map(|l| l.strip_prefix(tag)).unwrap_or_else(|| panic!("no {tag} in job output:\n{out}"))
}

#[test]
fn model_estimates_reach_the_job_and_decide_placement() {
    require_cluster();
    let big = user_copy("onnx/resnet50.onnx");
    let small = user_copy("carma/model-summaries/resnet18_cifar100.model");
    // Batch 192: about 20 GiB (ResNet-50 trains in ~13 GiB at 128).
    let (big_mib, big_src) = cli_estimate(&big, "192");
    let (small_mib, _) = cli_estimate(&small, "128");
    // Two big ones cannot share a 40 GiB GPU (with 2 GiB headroom each);
    // a small one fits next to a big one.
    assert!(big_mib + 2048 > 20 * 1024 && big_mib + small_mib + 2048 < 40 * 1024, "{big_mib} {small_mib}");
    let jobs = [(big.clone(), "192"), (big.clone(), "192"), (small.clone(), "128"), (small.clone(), "128")];
    let mut handles = Vec::new();
    for (i, (model, batch)) in jobs.into_iter().enumerate() {
        let opts =
            ["--carma-policy=ff".to_string(), format!("--carma-model={model}"), format!("--carma-batch-size={batch}")];
        handles.push(thread::spawn(move || {
            let o: Vec<&str> = opts.iter().map(String::as_str).collect();
            sbatch_wait(&o, &[], BODY, 120)
        }));
        // One at a time, so first-fit's order is the submission order.
        wait_reservations(i + 1);
    }
    let outs: Vec<String> = handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .map(|(r, out)| {
            assert_eq!(r.code, 0, "{} {}\n{out}", r.stdout, r.stderr);
            out
        })
        .collect();
    let gpu = |i: usize| field(&outs[i], "GPU ").to_string();
    assert!(field(&outs[0], "DECISION ").contains(&format!("estimate={big_mib}M source={big_src}")), "{}", outs[0]);
    assert!(field(&outs[2], "DECISION ").contains(&format!("estimate={small_mib}M")), "{}", outs[2]);
    assert_ne!(gpu(0), gpu(1), "two {big_mib} MiB jobs shared a GPU");
    assert_eq!(gpu(2), gpu(0), "first-fit should put a {small_mib} MiB job next to the first big one");
    assert_eq!(gpu(3), gpu(0));
}

#[test]
fn srun_estimates_too_and_declared_memory_wins() {
    require_cluster();
    let model = user_copy("carma/model-summaries/resnet18_cifar100.model");
    let (mib, _) = cli_estimate(&model, "64");
    let m = format!("--carma-model={model}");
    let r = user(&["srun", &m, "--carma-batch-size=64", "printenv", "CARMA_DECISION"], 60).ok();
    assert!(r.stdout.contains(&format!("estimate={mib}M source=layers")), "{}", r.stdout);
    let r = user(&["srun", &m, "--carma-batch-size=64", "--carma-mem=3G", "printenv", "CARMA_DECISION"], 60).ok();
    assert!(r.stdout.contains("estimate=3072M source=declared"), "{}", r.stdout);
}

/// The second node (tests/cluster.sh) learns its fixed memory from its last
/// 3 jobs. Three jobs whose estimates carry carma.yaml's fixed part but which
/// peak at their model part + that + 1000 MiB (a bigger software stack) teach
/// their user that figure; the user's next model-based job there gets its
/// model part + it. The
/// node's carma-monitor records the peaks. Exclusive, so that no MPS fence
/// (that node's sharing mode) stops the jobs at their estimates.
#[test]
fn a_node_learns_its_fixed_memory_from_finished_jobs() {
    require_cluster();
    const N2: &str = "/etc/slurm/node2/carma.yaml";
    let node = node2();
    let model = user_copy("carma/model-summaries/resnet18_cifar100.model");
    let m = format!("--carma-model={model}");
    let on_node2 = ["-p", "multi", "-w", node.as_str(), "--gres=shard:1", "--carma-policy=exclusive", m.as_str()];
    // Three batch sizes: three signatures, so that no job's history decides.
    for batch in ["32", "64", "128"] {
        let (mib, _) = cli_estimate(&model, batch);
        let body =
            format!("echo \"DECISION $CARMA_DECISION\"\ncarma-fakejob --config {N2} --mem {}M --seconds 3", mib + 1000);
        let b = format!("--carma-batch-size={batch}");
        let mut opts = on_node2.to_vec();
        opts.push(&b);
        let (r, out) = sbatch_wait(&opts, &[], &body, 90);
        assert_eq!(r.code, 0, "{} {}\n{out}", r.stdout, r.stderr);
        assert!(!field(&out, "DECISION ").contains("runtime=learned"), "learned before 3 jobs ended: {out}");
    }
    // Each job's release (its step's end, or the epilog) adds its observation.
    let start = std::time::Instant::now();
    let runtime = loop {
        let status = root(&["carma", "status", "--config", N2, "--json"], 20).ok().stdout;
        let v: serde_json::Value = serde_json::from_str(&status).unwrap();
        if v["runtime"]["observed_jobs"].as_u64() == Some(3) || start.elapsed().as_secs() > 30 {
            break v["runtime"].clone();
        }
        thread::sleep(std::time::Duration::from_millis(200));
    };
    // Learned for the user whose jobs they were; the node's value needs two users.
    let configured = runtime["configured_mib"].as_u64().unwrap();
    let learned = configured + 1000;
    let users = runtime["users"].as_object().unwrap();
    assert_eq!(users.len(), 1, "{runtime}");
    let (uid, mine) = users.iter().next().unwrap();
    assert_eq!((mine["learned_mib"].as_u64(), mine["observed_jobs"].as_u64()), (Some(learned), Some(3)), "{runtime}");
    assert!(runtime["learned_mib"].is_null(), "one user's jobs set the node's value: {runtime}");
    let line = root(&["carma", "status", "--config", N2], 20).ok().stdout;
    assert!(line.contains(&format!("uid {uid}: {learned} MiB learned from 3 jobs")), "{line}");
    // The user's next model-based job on that node: model part + the learned value.
    let (mib, _) = cli_estimate(&model, "96");
    let mut args = vec!["srun"];
    args.extend_from_slice(&on_node2);
    args.extend_from_slice(&["--carma-batch-size=96", "printenv", "CARMA_DECISION"]);
    let d = user(&args, 60).ok().stdout;
    let want = format!("estimate={}M source=layers runtime=learned:{learned}M learned_from=user ", mib + 1000);
    assert!(d.contains(&want), "{d}");
    // The first node does not learn (min_jobs: 0): the same job keeps its estimate.
    let d = user(&["srun", &m, "--carma-batch-size=96", "printenv", "CARMA_DECISION"], 60).ok().stdout;
    assert!(d.contains(&format!("estimate={mib}M source=layers ")), "{d}");
}

/// One error line naming the option and the file; nothing submitted; the
/// file's content never echoed.
fn refused(model: &str, expect: &str) {
    for cmd in ["sbatch", "srun"] {
        let name = unique("badmodel");
        let s = script(&name, "true");
        let m = format!("--carma-model={model}");
        let mut args = vec![cmd, "-J", &name, &m, "--carma-batch-size=8"];
        args.push(if cmd == "sbatch" { &s } else { "true" });
        let r = user(&args, 30);
        assert_ne!(r.code, 0, "{cmd} accepted {model}");
        let line = r
            .stderr
            .lines()
            .find(|l| l.contains("--carma-model: "))
            .unwrap_or_else(|| panic!("{cmd} {model}: no error line in {:?}", r.stderr));
        assert!(line.contains("carma: ") && line.contains(expect), "{cmd} {model}: {line}");
        assert!(!r.stderr.contains("root:"), "{cmd} {model}: content echoed: {}", r.stderr);
        assert!(jobs_named(&name).is_empty(), "{cmd} {model}: a job was submitted");
        let shown = line.split("--carma-model: ").nth(1).unwrap_or(line);
        report("hostile", &format!("{cmd} --carma-model={model}: refused before submission: {shown}"));
    }
}

#[test]
fn malformed_and_hostile_model_files_are_refused_at_submit_time() {
    require_cluster();
    let dir = work_dir();
    let chown = |p: &PathBuf| {
        Command::new("chown").args(["-h", USER, p.to_str().unwrap()]).status().unwrap();
    };
    // A truncated torchsummary table: file and line named.
    let summary = std::fs::read_to_string(data().join("carma/model-summaries/resnet50_32.model")).unwrap();
    let cut: String = summary.lines().take(12).collect::<Vec<_>>().join("\n") + "\n  Conv2d-13   [32, 64";
    let truncated = dir.join("truncated.model");
    std::fs::write(&truncated, cut).unwrap();
    chown(&truncated);
    refused(truncated.to_str().unwrap(), "truncated.model line 13: expected ']' closing the output shape");
    // Binary garbage that looks like protobuf, and a truncated ONNX file.
    let garbage = dir.join("garbage.onnx");
    std::fs::write(&garbage, [0x08u8, 0xff, 0xff, 0xff, 0x00, 0x12, 0x99, 0x01, 0x02]).unwrap();
    chown(&garbage);
    refused(garbage.to_str().unwrap(), "not an ONNX model");
    let onnx = std::fs::read(data().join("onnx/resnet50.onnx")).unwrap();
    let half = dir.join("half.onnx");
    std::fs::write(&half, &onnx[..onnx.len() / 2]).unwrap();
    chown(&half);
    refused(half.to_str().unwrap(), "half.onnx: ");
    // Files the user may not read, followed links included.
    refused("/etc/shadow", "Permission denied");
    let link = dir.join("shadow-link.onnx");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink("/etc/shadow", &link).unwrap();
    chown(&link);
    refused(link.to_str().unwrap(), "Permission denied");
    // Not regular files: no blocking on a FIFO, no endless read of /dev/zero.
    let fifo = dir.join("model.fifo");
    let _ = std::fs::remove_file(&fifo);
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    chown(&fifo);
    refused(fifo.to_str().unwrap(), "not a regular file");
    refused("/dev/zero", "not a regular file");
    // A directory is a Hugging Face model directory: without config.json, refused.
    refused(dir.to_str().unwrap(), "a model directory is read through its config.json");
    // Larger than the 16 MiB bound: refused before reading.
    let huge = dir.join("huge.model");
    let f = std::fs::File::create(&huge).unwrap();
    f.set_len(3 << 30).unwrap();
    chown(&huge);
    refused(huge.to_str().unwrap(), "larger than the 16777216-byte limit");
    let _ = std::fs::remove_file(&huge);
    refused(dir.join("no-such-file.onnx").to_str().unwrap(), "No such file");
}

#[test]
fn an_observed_peak_raises_the_next_estimate_of_the_same_job() {
    require_cluster();
    let model = user_copy("carma/model-summaries/resnet34_cifar100.model");
    // A batch size of this run's own: the node's history outlives test runs.
    let batch = 16 + std::process::id() % 997;
    let (mib, _) = cli_estimate(&model, &batch.to_string());
    let m = format!("--carma-model={model}");
    let b = format!("--carma-batch-size={batch}");
    let opts = ["--carma-policy=ff", m.as_str(), b.as_str()];
    // The job uses 6 GiB, far above its estimate (but it fits: no OOM).
    let first = {
        let o: Vec<String> = opts.iter().map(|s| s.to_string()).collect();
        thread::spawn(move || {
            let o: Vec<&str> = o.iter().map(String::as_str).collect();
            sbatch_wait(&o, &[], "echo \"DECISION $CARMA_DECISION\"\ncarma-fakejob --mem 6G --seconds 5", 120)
        })
    };
    wait_reservations(1);
    thread::sleep(std::time::Duration::from_secs(2));
    // Any placement on the node samples what placed jobs use.
    user(&["srun", "--carma-mem=1G", "true"], 60).ok();
    let (r, out) = first.join().unwrap();
    assert_eq!(r.code, 0, "{out}");
    assert!(field(&out, "DECISION ").contains(&format!("estimate={mib}M source=layers")), "{out}");
    // The same model and batch size again: its history (6144 MiB + 10%) wins.
    let (r, out) = sbatch_wait(&opts, &[], "echo \"DECISION $CARMA_DECISION\"", 60);
    assert_eq!(r.code, 0, "{out}");
    assert!(field(&out, "DECISION ").contains("estimate=6758M source=history"), "{out}");
    // Another batch size is another job: no history.
    let other = format!("--carma-batch-size={}", batch + 1000);
    let (r, out) = sbatch_wait(&["--carma-policy=ff", &m, &other], &[], "echo \"DECISION $CARMA_DECISION\"", 60);
    assert_eq!(r.code, 0, "{out}");
    assert!(field(&out, "DECISION ").contains("source=layers"), "{out}");
}

/// Qwen2-0.5B's config.json (494,032,768 parameters), as a user passes it.
const QWEN2_05B: &str = r#"{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
  "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
  "vocab_size": 151936, "max_position_embeddings": 32768, "tie_word_embeddings": true}"#;

#[test]
fn sequence_length_and_precision_reach_the_estimate_from_options_and_environment() {
    require_cluster();
    let path = work_dir().join(format!("{}-config.json", unique("qwen2")));
    std::fs::write(&path, QWEN2_05B).unwrap();
    std::process::Command::new("chown").args([USER, path.to_str().unwrap()]).status().unwrap();
    let model = path.to_string_lossy().into_owned();
    let cli = |extra: &[&str]| -> u64 {
        let mut args = vec!["carma", "estimate", "--model", &model, "--batch-size", "4", "--json"];
        args.extend_from_slice(extra);
        let r = user(&args, 30).ok();
        serde_json::from_str::<serde_json::Value>(&r.stdout).unwrap()["mib"].as_u64().unwrap()
    };
    // 32k positions by default: far beyond any GPU; at 2048 tokens in bf16 it fits.
    let (full, short, short_bf16) =
        (cli(&[]), cli(&["--seq-len", "2048"]), cli(&["--seq-len", "2048", "--precision", "bf16"]));
    assert!(full > 80 * 1024 && short < full && short_bf16 < short, "{full} {short} {short_bf16}");
    let m = format!("--carma-model={model}");
    // What a job with these options is told (its CARMA_DECISION).
    let decided = |model_opt: &str| {
        let args = [
            "srun",
            model_opt,
            "--carma-batch-size=4",
            "--carma-seq-len=2048",
            "--carma-precision=bf16",
            "printenv",
            "CARMA_DECISION",
        ];
        user(&args, 60).ok().stdout
    };
    let out = decided(&m);
    assert!(out.contains(&format!("estimate={short_bf16}M source=analytic")), "{out}");
    // The same from the environment.
    let r = user_env(
        &[("CARMA_SEQ_LEN", "2048"), ("CARMA_PRECISION", "bf16")],
        &["srun", &m, "--carma-batch-size=4", "printenv", "CARMA_DECISION"],
        60,
    )
    .ok();
    assert!(r.stdout.contains(&format!("estimate={short_bf16}M")), "{}", r.stdout);
    // A Hugging Face model directory is read through its config.json.
    let dir = work_dir().join(unique("qwen2-dir"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(&path, dir.join("config.json")).unwrap();
    std::process::Command::new("chown").args(["-R", USER, dir.to_str().unwrap()]).status().unwrap();
    let d = format!("--carma-model={}", dir.display());
    let out = decided(&d);
    assert!(out.contains(&format!("estimate={short_bf16}M source=analytic")), "{out}");
}
