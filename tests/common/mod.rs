//! Helpers for tests that drive the real local Slurm cluster started by
//! `tests/cluster.sh start`. Every command is bounded by `timeout`.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

/// The unprivileged user jobs run as (created by cluster.sh).
pub const USER: &str = "carmatest";

#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    fn from(out: Output) -> Run {
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    pub fn ok(self) -> Run {
        assert_eq!(self.code, 0, "command failed\nstdout: {}\nstderr: {}", self.stdout, self.stderr);
        self
    }

    /// Value of `NAME=value` in stdout (as printed by `env`).
    pub fn var(&self, name: &str) -> Option<String> {
        let prefix = format!("{name}=");
        self.stdout.lines().find_map(|l| l.strip_prefix(&prefix).map(str::to_string))
    }
}

/// Runs a command as root with a time limit, with `CARMA_*` cleared so the
/// test's own environment cannot leak in.
/// The repository: the suites' package is its tests/ folder.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

pub fn root(args: &[&str], secs: u32) -> Run {
    let mut c = Command::new("timeout");
    c.arg(secs.to_string()).args(args).current_dir("/tmp");
    clean_env(&mut c);
    Run::from(c.output().expect("cannot run timeout(1)"))
}

/// Runs a command as the unprivileged test user, with extra env. A CARMA
/// job submitted without GPU GRES is given `--gres=shard:1`, or
/// `--gres=gpu:N` for `--carma-gpus=N` above 1, as a user must
/// (slurm-conf-examples/README.md, "Who owns a GPU": a step uses at most
/// the GPUs Slurm allocated its job, and a job's shards come from one GPU);
/// [`user_env_as_given`] submits exactly what it is given.
pub fn user_env(env: &[(&str, &str)], args: &[&str], secs: u32) -> Run {
    let args = with_shard(env, args);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    user_env_as_given(env, &args, secs)
}

/// `args` with `--gres=shard:1` (or `gpu:N`, see [`user_env`]) after the
/// command where it submits a CARMA job (a `--carma-*` option or `CARMA_*`
/// in `env`) that names no GPUs.
pub fn with_shard(env: &[(&str, &str)], args: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let submits = args.first().is_some_and(|c| ["sbatch", "srun", "salloc"].contains(c));
    let opts = &args[1.min(args.len())..];
    let carma = opts.iter().any(|a| a.starts_with("--carma-")) || env.iter().any(|(k, _)| k.starts_with("CARMA_"));
    let gpus = opts.iter().any(|a| ["--gres", "--gpus", "-G"].iter().any(|p| a.starts_with(p)));
    if submits && carma && !gpus {
        let n = opts
            .iter()
            .find_map(|a| a.strip_prefix("--carma-gpus="))
            .and_then(|n| n.parse::<u32>().ok())
            .filter(|n| (1..=8).contains(n))
            .unwrap_or(1);
        out.insert(1, if n == 1 { "--gres=shard:1".to_string() } else { format!("--gres=gpu:{n}") });
    }
    out
}

/// Runs a command as the unprivileged test user, with extra env, as given.
pub fn user_env_as_given(env: &[(&str, &str)], args: &[&str], secs: u32) -> Run {
    let mut c = Command::new("timeout");
    c.arg(secs.to_string()).args(["runuser", "-u", USER, "--", "env"]);
    for (k, v) in env {
        c.arg(format!("{k}={v}"));
    }
    c.args(args).current_dir(work_dir());
    clean_env(&mut c);
    Run::from(c.output().expect("cannot run timeout(1)"))
}

pub fn user(args: &[&str], secs: u32) -> Run {
    user_env(&[], args, secs)
}

fn clean_env(c: &mut Command) {
    for (k, _) in std::env::vars() {
        if k.starts_with("CARMA_") || k.starts_with("SLURM_") || k.starts_with("SPANK_") {
            c.env_remove(k);
        }
    }
}

/// The second node's name: `tests/cluster.sh` names it after this host.
pub fn node2() -> String {
    format!("{}b", root(&["hostname", "-s"], 10).ok().stdout.trim())
}

/// A directory the test user can write job scripts and output to.
pub fn work_dir() -> PathBuf {
    let d = PathBuf::from("/tmp/carma-tests");
    if !d.exists() {
        std::fs::create_dir_all(&d).unwrap();
        Command::new("chown").args([USER, d.to_str().unwrap()]).status().unwrap();
    }
    d
}

/// A job name unique to this test process and call, and to this run: a
/// fresh machine hands out the same pids run after run, and outputs are
/// appended (`--open-mode=append`), so a name from an earlier run would
/// read that run's lines as this one's.
pub fn unique(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    static RUN: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let run = RUN.get_or_init(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        (t.as_micros() % 1_000_000_000) as u32
    });
    format!("t{}-{run}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed), tag)
}

/// Writes an executable batch script owned by the test user; returns its path.
pub fn script(name: &str, body: &str) -> String {
    let p = work_dir().join(format!("{name}.sh"));
    std::fs::write(&p, format!("#!/bin/bash\nset -u\n{body}\n")).unwrap();
    Command::new("chmod").args(["755", p.to_str().unwrap()]).status().unwrap();
    Command::new("chown").args([USER, p.to_str().unwrap()]).status().unwrap();
    p.to_string_lossy().into_owned()
}

/// Submits with `sbatch --wait` as the test user; returns the run and the output file's text.
pub fn sbatch_wait(opts: &[&str], env: &[(&str, &str)], body: &str, secs: u32) -> (Run, String) {
    let name = unique("job");
    let path = script(&name, body);
    let out = work_dir().join(format!("{name}.out"));
    let out_s = out.to_string_lossy().into_owned();
    let mut args = vec!["sbatch", "--wait", "-J", &name, "-o", &out_s];
    args.extend_from_slice(opts);
    args.push(&path);
    let run = user_env(env, &args, secs);
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    (run, text)
}

/// Jobs with this name known to slurmctld (any state).
pub fn jobs_named(name: &str) -> Vec<String> {
    let r = root(&["squeue", "-h", "-t", "all", "-n", name, "-o", "%i"], 20);
    r.stdout.lines().map(str::to_string).collect()
}

/// Fails the test early with a clear message if the cluster is not up, and
/// waits until the jobs of the test (or suite) before have let go of their
/// GPUs: slurmstepd releases a reservation after sbatch and srun have
/// returned, and a test that expects empty GPUs would otherwise see them.
pub fn require_cluster() {
    let r = root(&["sinfo", "-h", "-o", "%T"], 10);
    assert!(
        r.code == 0 && !r.stdout.trim().is_empty(),
        "the local Slurm cluster is not running: start it with `sudo tests/cluster.sh start`\n{}",
        r.stderr
    );
    wait_released();
}

/// Cancels the jobs when dropped, so a test that fails while its jobs still
/// run does not leave them holding GPUs for the tests after it.
pub struct Cancel(pub Vec<String>);

impl Drop for Cancel {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            let mut args = vec!["scancel"];
            args.extend(self.0.iter().map(String::as_str));
            let _ = root(&args, 20);
        }
    }
}

/// Waits (at most 60 s) until CARMA has placed at least `n` jobs on the
/// node. The prolog's record of the GPUs Slurm gave a job is not a
/// placement: a shard job's stands only until its step is placed, and a
/// test that went on at that record would race the placement it waits for.
pub fn wait_reservations(n: usize) {
    wait_holding(n, "carma");
}

/// Waits (at most 60 s) until the prologs have recorded at least `n` jobs
/// holding GPUs Slurm gave them whole.
pub fn wait_slurm_whole(n: usize) {
    wait_holding(n, "slurm_whole");
}

/// The node's reservations from `carma status --json` (`None` if it did
/// not answer), and its whole output for messages.
fn reservations() -> (Option<Vec<serde_json::Value>>, String) {
    let r = root(&["carma", "status", "--json"], 20);
    let list = serde_json::from_str::<serde_json::Value>(&r.stdout)
        .ok()
        .and_then(|mut v| v["reservations"].as_array_mut().map(std::mem::take));
    (list, r.stdout)
}

fn wait_holding(n: usize, holding: &str) {
    let start = std::time::Instant::now();
    loop {
        let count = reservations().0.map_or(0, |a| a.iter().filter(|r| r["holding"] == holding).count());
        if count >= n {
            return;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "only {count} of {n} jobs held ({holding}) after 60 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Waits (at most 30 s) until no CARMA reservation is left: a step's
/// slurmstepd releases its GPUs after srun has already returned.
pub fn wait_released() {
    let start = std::time::Instant::now();
    loop {
        let (list, shown) = reservations();
        if list.is_some_and(|l| l.is_empty()) {
            return;
        }
        assert!(start.elapsed() < std::time::Duration::from_secs(30), "reservations still held after 30 s: {shown}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Where tests record what they injected and survived, for
/// docs/reliability.md (tests/run.sh starts it empty).
pub const REPORT: &str = "/tmp/carma-tests/reliability.log";

/// Records one line for the reliability report (only reached when the
/// test's assertions before it held).
pub fn report(section: &str, text: &str) {
    use std::io::Write;
    let line = format!("{section}: {}", text.replace('\n', " "));
    println!("reliability: {line}");
    work_dir();
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(REPORT) {
        let _ = writeln!(f, "{line}");
    }
}

/// Waits (at most 60 s) until the job has ended and Slurm has finished
/// with it on the node: its steps' slurmstepds are gone and its epilog has
/// run (the job leaves COMPLETING).
pub fn wait_completed(job: &str) {
    let start = std::time::Instant::now();
    loop {
        let st = root(&["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"], 20).stdout.trim().to_string();
        if !st.is_empty() && !["PENDING", "CONFIGURING", "RUNNING", "COMPLETING"].contains(&st.as_str()) {
            return;
        }
        assert!(start.elapsed() < std::time::Duration::from_secs(60), "job {job} still {st:?} after 60 s");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Puts a file back as it was (content and mode) when dropped.
pub struct Restore {
    path: &'static str,
    saved: Option<Vec<u8>>,
    mode: Option<u32>,
}

impl Restore {
    pub fn new(path: &'static str) -> Restore {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).ok().map(|m| m.permissions().mode());
        Restore { path, saved: std::fs::read(path).ok(), mode }
    }

    /// What the file held when the guard was made.
    pub fn saved(&self) -> Option<Vec<u8>> {
        self.saved.clone()
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        use std::os::unix::fs::PermissionsExt;
        if let Some(mode) = self.mode {
            let _ = std::fs::set_permissions(self.path, std::fs::Permissions::from_mode(mode));
        }
        if let Some(s) = &self.saved {
            let _ = std::fs::write(self.path, s);
        }
    }
}

/// Device isolation probes (tests/isolation.rs, tests/recovery.rs): every job
/// opens every GPU device file here (`/dev/nvidia0`..`7`, made by
/// tests/cluster.sh with no driver behind them): ENXIO ("No such device or
/// address") means the device cgroup let the open through, EPERM that it
/// denied it. The first node's GPUs are nvidia0-3, the second's nvidia4-7
/// (minor = NVML index + 4): a grant by index would open the wrong files.
///
/// Prints `PROBE node=<SLURMD_NODENAME> gpus=<the node's GPU indices>
/// cvd=<CUDA_VISIBLE_DEVICES> gpu0=open|EPERM ...` (one line). The node's
/// indices are SLURM_STEP_GPUS (set by CARMA, or by Slurm in an srun step),
/// else SLURM_JOB_GPUS (a batch step with whole GPUs).
pub const PROBE: &str = r#"r=""
for i in 0 1 2 3 4 5 6 7; do
  e=$( (exec 3</dev/nvidia$i) 2>&1 )
  case "$e" in
    *"not permitted"*) r="$r gpu$i=EPERM" ;;
    *"No such device"*) r="$r gpu$i=open" ;;
    *) r="$r gpu$i=other($e)" ;;
  esac
done
echo "PROBE node=${SLURMD_NODENAME:-} gpus=${SLURM_STEP_GPUS:-${SLURM_JOB_GPUS:-}} cvd=${CUDA_VISIBLE_DEVICES:-}$r""#;

/// The minor number of NVML index 0 on `node` (tests/cluster.sh).
fn minor_offset(node: &str) -> u32 {
    if node == node2() { 4 } else { 0 }
}

/// What one probe line says: the node's GPUs the job was given, and those
/// it could open (every other open of the node's GPU files must have been
/// denied), both as NVML indices. The other node's files are not this
/// node's GPUs (one /dev serves both test nodes): left out. CUDA numbers
/// the GPUs a process can open from 0: CUDA_VISIBLE_DEVICES must be
/// 0..n-1 for n given GPUs.
pub fn probe(line: &str) -> (std::collections::BTreeSet<u32>, std::collections::BTreeSet<u32>) {
    let rest = line.split_once("PROBE ").map(|(_, l)| l).unwrap_or_else(|| panic!("not a probe line: {line}"));
    let list = |v: &str| -> Vec<u32> { v.split(',').filter(|s| !s.is_empty()).map(|s| s.parse().unwrap()).collect() };
    let mut told = Vec::new();
    let mut cvd = Vec::new();
    let mut offset = None;
    let mut answers = Vec::new();
    for w in rest.split_whitespace() {
        let (key, value) = w.split_once('=').unwrap_or_else(|| panic!("{line}"));
        match (key, value) {
            ("node", v) => offset = Some(minor_offset(v)),
            ("gpus", v) => told = list(v),
            ("cvd", v) => cvd = list(v),
            (gpu, answer) => answers.push((gpu.trim_start_matches("gpu").parse::<u32>().unwrap(), answer)),
        }
    }
    let offset = offset.unwrap_or_else(|| panic!("no node in {line}"));
    let mut opened = std::collections::BTreeSet::new();
    for (minor, answer) in answers {
        match answer {
            "open" if (offset..offset + 4).contains(&minor) => {
                opened.insert(minor - offset);
            }
            "open" | "EPERM" => {}
            other => panic!("gpu{minor}: unexpected answer {other} in {line}"),
        }
    }
    assert_eq!(cvd, (0..told.len() as u32).collect::<Vec<_>>(), "CUDA numbering: {line}");
    (told.into_iter().collect(), opened)
}

pub fn probe_lines(text: &str) -> Vec<(std::collections::BTreeSet<u32>, std::collections::BTreeSet<u32>)> {
    text.lines().filter(|l| l.contains("PROBE ")).map(probe).collect()
}

/// The repository's data/ (read through the test binary's manifest dir).
pub fn data() -> PathBuf {
    let d = repo().join("data");
    assert!(d.join("onnx").is_dir(), "no {}: the repository's data/ is missing", d.display());
    d
}

/// A copy of `data/REL` in the work directory, owned by the test user.
pub fn user_copy(rel: &str) -> String {
    let src = data().join(rel);
    let dst = work_dir().join(src.file_name().unwrap());
    std::fs::copy(&src, &dst).unwrap();
    std::process::Command::new("chown").args([USER, dst.to_str().unwrap()]).status().unwrap();
    dst.to_string_lossy().into_owned()
}

/// What `carma estimate` (run as the user) says for this file and batch.
pub fn cli_estimate(model: &str, batch: &str) -> (u64, String) {
    let r = user(&["carma", "estimate", "--model", model, "--batch-size", batch, "--json"], 60).ok();
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    (v["mib"].as_u64().unwrap(), v["source"].as_str().unwrap().to_string())
}

/// A field of `scontrol show job` (Comment= runs to the end of its line:
/// it may hold blanks).
pub fn job_field(job: &str, key: &str) -> String {
    let r = root(&["scontrol", "show", "job", job], 20);
    r.stdout
        .lines()
        .flat_map(|l| if key.ends_with("Comment") { vec![l.trim()] } else { l.split_whitespace().collect() })
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// carma-monitor for the first node while alive (the second node's runs
/// always); on drop the node's admission count is set back to its
/// configured 160.
pub struct Node1Monitor(std::process::Child, String);

impl Node1Monitor {
    pub fn start(host: &str) -> Node1Monitor {
        let child = std::process::Command::new("carma-monitor")
            .args(["--config", "/etc/slurm/carma.yaml"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("carma-monitor");
        Node1Monitor(child, host.to_string())
    }
}

impl Drop for Node1Monitor {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let gres = "Gres=gpu:4,shard:32,carmamem:160";
        let _ = root(&["scontrol", "update", &format!("NodeName={}", self.1), gres], 20);
    }
}

/// `dpkg-query ARGS` as root: its output.
pub fn dpkg_query(args: &[&str]) -> String {
    root(&[&["dpkg-query"], args].concat(), 20).ok().stdout
}

/// Where `tests/cluster.sh` built the packages from.
pub fn bin_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| repo().join("target"));
    target.join(std::env::var("PROFILE").unwrap_or_else(|_| "release".into()))
}
