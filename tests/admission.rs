//! Cluster-wide admission by GPU memory (docs/admission.md) on the real
//! cluster: in partition `wide` (both nodes; carma.yaml `admission:`),
//! job_submit.lua adds the count-only GRES `carmamem` (GiB per node, 160
//! per node here: 4 GPUs of 40G) to each CARMA job, so slurmctld sends a
//! job only to a node with that much GPU memory unpromised; CARMA still
//! chooses the GPU there (and grants its device: tests/isolation.rs).

mod common;
use common::job_field as field;
use common::*;
use std::time::{Duration, Instant};

fn submit(opts: &[&str], body: &str) -> (String, String) {
    let name = unique("adm");
    let path = script(&name, body);
    let out = work_dir().join(format!("{name}.out")).to_string_lossy().into_owned();
    let mut args = vec!["sbatch", "--parsable", "-J", &name, "-o", &out];
    args.extend_from_slice(opts);
    args.push(&path);
    (user(&args, 30).ok().stdout.trim().to_string(), out)
}

fn carma_logs() -> String {
    let mut text = String::new();
    for f in ["/var/log/carma/carma.log", &format!("/var/log/carma/carma-{}.log", node2())] {
        text += &std::fs::read_to_string(f).unwrap_or_default();
    }
    text
}

#[test]
fn a_job_that_fits_only_on_the_empty_node_is_sent_there() {
    require_cluster();
    let host = root(&["hostname", "-s"], 10).ok().stdout.trim().to_string();
    // Node 1's four 40G GPUs each hold a 36G CARMA job: 4 x 38 GiB of its
    // 160 admitted (36G + 2G headroom each); node 2 is empty.
    let holders: Vec<String> =
        (0..4).map(|_| submit(&["-p", "wide", "-w", &host, "--carma-mem=36G"], "sleep 120").0).collect();
    let _cancel = Cancel(holders.clone());
    wait_reservations(4);
    for h in &holders {
        assert!(field(h, "TresPerNode").contains("carmamem:38"), "{h}: {}", field(h, "TresPerNode"));
    }
    // An 8G job needs 10 GiB: node 1 has 8 left, so Slurm sends it to node 2.
    let t0 = Instant::now();
    let (r, text) =
        sbatch_wait(&["-p", "wide", "--carma-mem=8G"], &[], "echo \"NODE $SLURMD_NODENAME $CARMA_DECISION\"", 60);
    r.ok();
    let line = text.lines().find(|l| l.starts_with("NODE ")).unwrap_or_else(|| panic!("{text}"));
    assert!(line.starts_with(&format!("NODE {} ", node2())), "sent to a full node: {line}");
    assert!(line.contains("gpu_indices="), "{line}");
    assert!(t0.elapsed() < Duration::from_secs(30), "it waited: {:?}", t0.elapsed());
    for h in &holders {
        root(&["scancel", h], 20).ok();
    }
    for h in &holders {
        wait_completed(h);
    }
    wait_released();
    report("admission", "full node + empty node: the 8G job was sent to the empty node by Slurm, placed at once");
}

#[test]
fn a_burst_of_mixed_jobs_over_two_nodes_never_fails_for_no_fit() {
    require_cluster();
    // 32 jobs of 6 to 22G (the GPUs hold 40G each): more than both nodes
    // hold at once, so Slurm queues what does not fit anywhere.
    let sizes = [6, 10, 14, 18, 22];
    let jobs: Vec<String> = (0..32)
        .map(|i| {
            let mem = format!("--carma-mem={}G", sizes[i % sizes.len()]);
            submit(&["-p", "wide", &mem], "echo \"NODE $SLURMD_NODENAME $CARMA_DECISION\"\nsleep 4").0
        })
        .collect();
    let start = Instant::now();
    for j in &jobs {
        loop {
            let st = field(j, "JobState");
            if !["PENDING", "CONFIGURING", "RUNNING", "COMPLETING"].contains(&st.as_str()) {
                assert_eq!(st, "COMPLETED", "job {j}");
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(240), "job {j} still {st}");
            std::thread::sleep(Duration::from_millis(250));
        }
    }
    let logs = carma_logs();
    let failed: Vec<&String> = jobs
        .iter()
        .filter(|j| logs.lines().any(|l| l.contains(&format!("job {j} ")) && l.contains("no GPU fit")))
        .collect();
    assert!(failed.is_empty(), "jobs failed for no fit: {failed:?}");
    let nodes: std::collections::BTreeSet<String> = jobs.iter().map(|j| field(j, "NodeList")).collect();
    assert_eq!(nodes.len(), 2, "both nodes used: {nodes:?}");
    report(
        "admission",
        &format!("32 mixed jobs over 2 nodes: all completed, none failed for no fit, in {:?}", start.elapsed()),
    );
    wait_released();
}

#[test]
fn an_estimated_job_asks_for_its_estimate_and_headroom() {
    require_cluster();
    let model = user_copy("carma/model-summaries/resnet18_cifar100.model");
    let (mib, _) = cli_estimate(&model, "128");
    let m = format!("--carma-model={model}");
    let (id, out) = submit(&["-p", "wide", &m, "--carma-batch-size=128"], "echo \"D $CARMA_DECISION\"");
    wait_completed(&id);
    let want = (mib + 2048).div_ceil(1024);
    assert!(field(&id, "TresPerNode").ends_with(&format!("carmamem:{want}")), "{}", field(&id, "TresPerNode"));
    assert!(
        field(&id, "Comment").contains(&format!("admitted by GPU memory, carmamem:{want}")),
        "{}",
        field(&id, "Comment")
    );
    let text = std::fs::read_to_string(out).unwrap();
    assert!(text.contains(&format!("estimate={mib}M source=layers")), "{text}");
}

/// The node's admission count as slurmctld has it.
fn count(node: &str) -> u64 {
    let r = root(&["scontrol", "show", "node", "-o", node], 20).ok();
    let gres = r.stdout.split_whitespace().find_map(|w| w.strip_prefix("Gres=")).unwrap_or_default().to_string();
    gres.split(',').find_map(|e| e.strip_prefix("carmamem:")).and_then(|n| n.parse().ok()).unwrap_or(0)
}

fn wait_count(node: &str, want: u64) {
    let start = Instant::now();
    while count(node) != want {
        assert!(start.elapsed() < Duration::from_secs(20), "{node}: carmamem {} after 20 s, want {want}", count(node));
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn gpus_taken_whole_leave_the_count_and_the_next_job_goes_elsewhere() {
    require_cluster();
    let host = root(&["hostname", "-s"], 10).ok().stdout.trim().to_string();
    let _monitor = Node1Monitor::start(&host);
    wait_count(&host, 160);
    // Two jobs take GPUs of node 1 whole (Slurm's gres/gpu, no CARMA): the
    // monitor withdraws their 80 GiB from the node's count.
    let whole: Vec<String> =
        (0..2).map(|_| submit(&["-p", "wide", "-w", &host, "--gres=gpu:1"], "sleep 120").0).collect();
    let _cancel = Cancel(whole.clone());
    wait_count(&host, 80);
    // Three 36G CARMA jobs (38 GiB each): at most two fit node 1's 80, the
    // rest are sent to node 2. Counting shards alone, Slurm would have put all
    // three on node 1, where the third finds no GPU.
    let t0 = Instant::now();
    let jobs: Vec<String> = (0..3).map(|_| submit(&["-p", "wide", "--carma-mem=36G"], "sleep 3").0).collect();
    for j in &jobs {
        wait_completed(j);
        assert_eq!(field(j, "JobState"), "COMPLETED", "job {j}");
    }
    let on_node1 = jobs.iter().filter(|j| field(j, "NodeList") == host).count();
    assert!(on_node1 <= 2, "{:?}", jobs.iter().map(|j| field(j, "NodeList")).collect::<Vec<_>>());
    assert!(t0.elapsed() < Duration::from_secs(40), "a job waited: {:?}", t0.elapsed());
    for j in &whole {
        root(&["scancel", j], 20).ok();
        wait_completed(j);
    }
    wait_count(&host, 160);
    wait_released();
    report("admission", "two GPUs of node 1 taken whole: its count fell to 80 GiB, the third 36G job went to node 2");
}

/// The count is what CARMA can still promise; slurmctld takes what it
/// allocated to running jobs off it again (a margin kept on purpose:
/// docs/admission.md), so an 8G job (10 GiB of carmamem) leaves Slurm
/// 152 - 10 = 142 GiB to give.
#[test]
fn a_running_jobs_ask_is_taken_off_the_promisable_count() {
    require_cluster();
    let host = root(&["hostname", "-s"], 10).ok().stdout.trim().to_string();
    let _monitor = Node1Monitor::start(&host);
    wait_count(&host, 160);
    // Its GPU can promise 32 GiB more, the others 40 each: 152.
    let (job, _) = submit(&["-p", "wide", "-w", &host, "--carma-mem=8G"], "sleep 120");
    let _cancel = Cancel(vec![job.clone()]);
    wait_reservations(1);
    wait_count(&host, 152);
    let node = root(&["scontrol", "-d", "show", "node", "-o", &host], 20).ok().stdout;
    assert!(node.contains("carmamem:10"), "Slurm allocated no carmamem: {node}");
    root(&["scancel", &job], 20).ok();
    wait_completed(&job);
    wait_count(&host, 160);
    wait_released();
    report("admission", "an 8G job running on node 1: count 152 GiB promisable, 10 allocated by Slurm on top");
}

#[test]
fn a_plain_gpu_job_collocated_transparently_asks_for_its_default_size() {
    require_cluster();
    // widet: transparent (default 4G) and admitted by memory: the job's
    // whole GPU becomes a shard, and 4G + 2G headroom = 6 GiB of carmamem.
    let (id, out) = submit(&["-p", "widet", "--gres=gpu:1"], "echo \"D $CARMA_DECISION\"");
    wait_completed(&id);
    assert_eq!(field(&id, "JobState"), "COMPLETED");
    let tres = field(&id, "TresPerNode").replace("gres/", "gres:");
    assert_eq!(tres, "gres:shard:1,gres:carmamem:6");
    let comment = field(&id, "Comment");
    assert!(comment.contains("transparent collocation") && comment.contains("carmamem:6"), "{comment}");
    let text = std::fs::read_to_string(out).unwrap();
    assert!(text.contains("estimate=4096M"), "{text}");
}
