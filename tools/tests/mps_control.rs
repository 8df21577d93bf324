//! The test stand-in for NVIDIA's MPS control daemon
//! (`carma-fake-mps-control`, which the test cluster installs as
//! `nvidia-cuda-mps-control`) with `carma-fakejob` as its MPS client on the
//! NVML stand-in's GPUs: the server it starts is what CARMA takes for an MPS
//! server (its parent root's `nvidia-cuda-mps-control`, its user the
//! client's), one at a time for one user, and it ends with its last client.
//! Starting servers as users needs root (CI runs as root): skipped otherwise.

use carma_placement::procs::{alive, mps_server_uid, parent_of};
use carma_placement::source::{GpuSource, SimulatedGpus};
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const DAEMON: &str = env!("CARGO_BIN_EXE_carma-fake-mps-control");
const FAKEJOB: &str = env!("CARGO_BIN_EXE_carma-fakejob");
const NOBODY: u32 = 65534;

/// A node of two simulated GPUs in a directory any user may read: the
/// stand-in's description (beside a library that need not exist), its
/// process directory, GPU 1's pipe directory, the daemon under NVIDIA's
/// file name and the fake job.
struct Node {
    dir: PathBuf,
    daemon: Option<Child>,
}

impl Node {
    fn new(tag: &str) -> Node {
        let dir = std::env::temp_dir().join(format!("carma-mps-control-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (sub, mode) in [("", 0o755), ("procs", 0o1777), ("pipe", 0o755), ("pipe/1", 0o755), ("bin", 0o755)] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
            std::fs::set_permissions(dir.join(sub), std::fs::Permissions::from_mode(mode)).unwrap();
        }
        let node = Node { dir, daemon: None };
        let gpus = "gpus:\n  - {index: 0, memory_total: 40G}\n  - {index: 1, memory_total: 40G}\n";
        std::fs::write(node.sim_file(), format!("process_dir: {}\n{gpus}", node.dir.join("procs").display())).unwrap();
        let library = node.dir.join("libnvidia-ml.so.1");
        std::fs::write(node.config(), format!("gpu_source: {{nvml: {{library: {}}}}}\n", library.display())).unwrap();
        // Linked or copied, never a symbolic link: /proc/PID/exe names the
        // file a link leads to. In the directory, so that nobody runs them.
        for (from, to) in [(DAEMON, "nvidia-cuda-mps-control"), (FAKEJOB, "carma-fakejob")] {
            let to = node.dir.join("bin").join(to);
            if std::fs::hard_link(from, &to).is_err() {
                std::fs::copy(from, &to).unwrap();
            }
        }
        node
    }

    fn sim_file(&self) -> PathBuf {
        self.dir.join("sim-gpus.yaml")
    }

    fn config(&self) -> PathBuf {
        self.dir.join("carma.yaml")
    }

    fn pipe(&self) -> PathBuf {
        self.dir.join("pipe/1")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    /// Starts the daemon of GPU 1 (as root) and waits for its socket and
    /// its `control` pipe.
    fn start_daemon(&mut self) -> u32 {
        let log = std::fs::File::create(self.dir.join("daemon.log")).unwrap();
        let child = Command::new(self.dir.join("bin/nvidia-cuda-mps-control"))
            .arg("--pipe-dir")
            .arg(self.pipe())
            .args(["--gpu", "1", "--sim-gpus"])
            .arg(self.sim_file())
            .stderr(log)
            .spawn()
            .unwrap();
        let pid = child.id();
        self.daemon = Some(child);
        let up = || {
            let fifo = std::fs::symlink_metadata(self.pipe().join("control")).is_ok_and(|m| m.file_type().is_fifo());
            fifo && std::fs::symlink_metadata(self.pipe().join("control.sock")).is_ok_and(|m| m.mode() & 0o777 == 0o666)
        };
        wait_for(Duration::from_secs(10), up, || format!("the daemon did not come up: {}", self.log()));
        pid
    }

    /// `carma-fakejob` as an MPS client of GPU 1, as `uid`.
    fn fakejob(&self, uid: u32, seconds: &str) -> Child {
        Command::new(self.dir.join("bin/carma-fakejob"))
            .arg("--config")
            .arg(self.config())
            .args(["--mem", "1G", "--sm", "0.2", "--seconds", seconds])
            .env("CUDA_VISIBLE_DEVICES", "1")
            .env("CUDA_MPS_PIPE_DIRECTORY", self.pipe())
            .env_remove("CARMA_NVML_STANDIN")
            .env_remove("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
            .current_dir(&self.dir)
            .uid(uid)
            .gid(uid)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn registered(&self, pid: u32) -> Option<std::fs::Metadata> {
        std::fs::metadata(self.dir.join(format!("procs/{pid}.json"))).ok()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            terminate(d.id());
            let start = Instant::now();
            while d.try_wait().ok().flatten().is_none() && start.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = d.kill();
            let _ = d.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn terminate(pid: u32) {
    // SAFETY: kill(2) with a pid and a signal number.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
}

fn wait_for(limit: Duration, mut done: impl FnMut() -> bool, why: impl Fn() -> String) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{}", why());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The live children of `parent`.
fn children(parent: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| parent_of(p) == Some(parent) && alive(p))
        .collect()
}

/// Real, effective, saved and file-system uid of `pid`.
fn uids(pid: u32) -> Vec<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:")).unwrap_or_default();
    line.split_whitespace().filter_map(|u| u.parse().ok()).collect()
}

fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim_end().to_string()
}

fn exe_name(pid: u32) -> String {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    exe.file_name().unwrap_or_default().to_string_lossy().into_owned()
}

/// The daemon's answer to what this process sends, read for at most `wait`.
fn ask(pipe: &Path, request: &[u8], wait: Duration) -> (UnixStream, std::io::Result<String>) {
    let mut conn = UnixStream::connect(pipe.join("control.sock")).unwrap();
    conn.write_all(request).unwrap();
    conn.set_read_timeout(Some(wait)).unwrap();
    let mut buf = [0u8; 64];
    let answer = conn.read(&mut buf).map(|n| String::from_utf8_lossy(&buf[..n]).into_owned());
    (conn, answer)
}

fn finish(job: Child, what: &str) {
    let out = job.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.contains("carma-fakejob: done"), "{what}: {stdout}{stderr}");
}

#[test]
fn the_server_is_roots_daemons_child_running_as_its_clients_user_until_its_last_client_ends() {
    if !carma_config::ownership::running_as_root() {
        eprintln!("skipped: the MPS control daemon stand-in runs as root");
        return;
    }
    let mut node = Node::new("serve");
    let daemon = node.start_daemon();
    // A request that is not the client's is refused, with a log line.
    let (_c, answer) = ask(&node.pipe(), b"start_server -uid 0\n", Duration::from_secs(5));
    let answer = answer.unwrap();
    assert!(answer.starts_with("error an unknown request \"start_server -uid 0\""), "{answer}");
    assert!(node.log().contains(&format!("refused a request of pid {} (uid 0)", std::process::id())), "{}", node.log());

    // Two jobs of one user: one server, as that user, under root's daemon.
    // Long enough to outlast their registration (up to 10 s) and the check
    // that another user waits.
    let jobs = [node.fakejob(NOBODY, "15"), node.fakejob(NOBODY, "15")];
    for j in &jobs {
        let why = || format!("job {} did not register: {}", j.id(), node.log());
        wait_for(Duration::from_secs(10), || node.registered(j.id()).is_some(), why);
    }
    let servers = children(daemon);
    assert_eq!(servers.len(), 1, "one server for one user: {servers:?}\n{}", node.log());
    let server = servers[0];
    assert_eq!(comm(server), "nvidia-cuda-mps", "named as NVIDIA's server (the kernel keeps 15 bytes)");
    assert_eq!(uids(server), [NOBODY; 4], "the server runs as its clients' user");
    assert_eq!((uids(daemon)[0], exe_name(daemon)), (0, "nvidia-cuda-mps-control".to_string()));
    assert_eq!(mps_server_uid(server), Some(NOBODY), "CARMA takes it for the MPS server of its user");
    // Registered on the daemon's GPU with no memory, as its user; the jobs
    // as MPS clients.
    assert_eq!(node.registered(server).map(|m| m.uid()), Some(NOBODY));
    let mut sim = SimulatedGpus::load(&node.sim_file()).unwrap();
    let listed = &sim.read().unwrap()[1].processes;
    assert!(listed.iter().any(|p| p.pid == server && p.used_mib == 0), "{listed:?}");
    let clients = sim.mps_clients();
    assert!(jobs.iter().all(|j| clients.contains(&j.id())), "{clients:?}");

    // Another user's client waits while the server serves its user.
    let (root_client, answer) = ask(&node.pipe(), b"client\n", Duration::from_millis(500));
    assert!(answer.is_err(), "root's client was answered while nobody's server runs: {answer:?}");
    for (i, j) in jobs.into_iter().enumerate() {
        finish(j, &format!("job {i}"));
    }
    // The last client gone, the server ends, and root's client gets its own.
    let why = || format!("the server outlived its clients: {}", node.log());
    wait_for(Duration::from_secs(5), || !alive(server), why);
    let mut root_client = root_client;
    root_client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 64];
    let n = root_client.read(&mut buf).unwrap();
    let answer = String::from_utf8_lossy(&buf[..n]).into_owned();
    let second: u32 = answer.trim_end().strip_prefix("server ").and_then(|p| p.parse().ok()).unwrap_or_else(|| {
        panic!("root's client: {answer:?}\n{}", node.log());
    });
    assert_ne!(second, server);
    assert_eq!((parent_of(second), uids(second)[0], mps_server_uid(second)), (Some(daemon), 0, Some(0)));
    drop(root_client);
    wait_for(
        Duration::from_secs(5),
        || !alive(second),
        || format!("root's server outlived its client: {}", node.log()),
    );
    assert!(node.registered(second).is_none(), "the server's registration stayed");

    // SIGTERM stops the daemon, which takes its socket and pipe away.
    terminate(daemon);
    let mut d = node.daemon.take().unwrap();
    let why = || format!("the daemon did not stop: {}", node.log());
    wait_for(Duration::from_secs(5), || d.try_wait().ok().flatten().is_some(), why);
    assert!(d.wait().unwrap().success());
    assert!(!node.pipe().join("control.sock").exists() && !node.pipe().join("control").exists());
    let log = node.log();
    assert!(log.contains(&format!("started server {server} for uid {NOBODY}")), "{log}");
    assert!(log.contains(&format!("stopped server {server} (uid {NOBODY}): its last client is gone")), "{log}");
}

/// A client on the stand-in whose pipe directory has no daemon says so and
/// fails (as CUDA cannot start under MPS without one).
#[test]
fn an_mps_client_without_a_daemon_fails_saying_so() {
    let node = Node::new("none");
    let mut cmd = Command::new(node.dir.join("bin/carma-fakejob"));
    cmd.arg("--config").arg(node.config()).args(["--mem", "1G", "--seconds", "1"]);
    let out = cmd
        .env("CUDA_VISIBLE_DEVICES", "1")
        .env("CUDA_MPS_PIPE_DIRECTORY", node.pipe())
        .env_remove("CARMA_NVML_STANDIN")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let socket = node.pipe().join("control.sock");
    assert!(err.contains(&format!("no MPS control daemon answers at {}", socket.display())), "{err}");
}
