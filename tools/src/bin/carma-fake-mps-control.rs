//! A TEST stand-in for NVIDIA's MPS control daemon (`nvidia-cuda-mps-control
//! -d`), for nodes without GPUs; never for a GPU node, where NVIDIA's daemon
//! runs. The test cluster (tests/cluster.sh) installs it from the
//! carma-slurm-sim package as /usr/lib/carma-sim/nvidia-cuda-mps-control
//! (a copy: /proc/PID/exe names the file a link leads to) and runs one, as
//! root, per GPU pipe directory.
//!
//! Like NVIDIA's daemon it starts the GPU's MPS server itself, as the user
//! the server serves: the server's parent is a root process whose
//! executable is named `nvidia-cuda-mps-control`, which is how CARMA tells
//! a server from a process that only took its name
//! (`carma_placement::procs::mps_server_uid`). The server is a forked child
//! given the client's groups, group and user (setgroups, setgid, setuid),
//! named `nvidia-cuda-mps-server`, and registered on the GPU with no memory
//! of its own (so the NVML stand-in lists it among the GPU's compute
//! processes); it ends when its last client is gone or the daemon ends.
//!
//! Clients (`carma-fakejob` as an MPS client) speak the protocol of
//! `carma_tools::mps_standin` on `control.sock` in the pipe directory. The
//! user a server runs as is the connecting process's (SO_PEERCRED, read by
//! the kernel): no request can name another. One server at a time, for one
//! user, as NVIDIA's: another user's client waits until the server's last
//! client is gone. It also makes the pipe directory's `control` fifo, the
//! file CARMA takes for a running daemon, if it is missing, and removes it
//! and its socket when it stops (SIGTERM). Everything is bounded: request
//! lines ([`mps_standin::MAX_LINE`] bytes, 1 s), clients, groups, waits;
//! malformed requests are refused with a log line.
#![deny(clippy::undocumented_unsafe_blocks)]

use carma_placement::source::SimulatedGpus;
use carma_tools::mps_standin::{self, SOCKET};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A TEST stand-in for NVIDIA's MPS control daemon of one simulated GPU
/// (installed as nvidia-cuda-mps-control; run as root).
#[derive(clap::Parser, Debug)]
#[command(name = "carma-fake-mps-control", version, help_expected = true, args_override_self = true)]
struct Cli {
    /// The GPU's pipe directory (its clients' CUDA_MPS_PIPE_DIRECTORY)
    #[arg(long, value_name = "DIR")]
    pipe_dir: PathBuf,
    /// The GPU it serves: its index in --sim-gpus
    #[arg(long, value_name = "INDEX")]
    gpu: u32,
    /// The simulated GPUs' description (the NVML stand-in's sim-gpus.yaml)
    #[arg(long, value_name = "FILE")]
    sim_gpus: PathBuf,
}

/// Clients served and waiting, at most.
const MAX_CLIENTS: usize = 256;
/// Supplementary groups of a client, at most (a client with more is refused).
const MAX_GROUPS: usize = 1024;
const MAX_ACCEPTS_PER_TICK: usize = 16;
const TICK: Duration = Duration::from_millis(100);
/// How long a connection may take to send its request.
const REQUEST_WAIT: Duration = Duration::from_secs(1);
/// How long a server may take to run as its user and register.
const START_WAIT: Duration = Duration::from_secs(5);
/// How long a server may take to end after SIGTERM, before SIGKILL.
const STOP_WAIT: Duration = Duration::from_secs(2);

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// A connected client: its connection (open while it runs) and who it is.
struct Client {
    conn: UnixStream,
    pid: i32,
    uid: u32,
    gid: u32,
    groups: Vec<libc::gid_t>,
}

/// The running server: its pid, its user and the clients it serves.
struct Server {
    pid: libc::pid_t,
    uid: u32,
    clients: Vec<Client>,
}

struct Daemon {
    gpu: u32,
    sim: SimulatedGpus,
    listener: UnixListener,
    active: Option<Server>,
    waiting: Vec<Client>,
}

fn main() {
    if let Err(e) = run() {
        eprintln!("carma-fake-mps-control: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let a = carma_tools::cli::parse::<Cli>()?;
    if !carma_config::ownership::running_as_root() {
        return Err("must run as root: it starts each user's MPS server as that user".into());
    }
    let sim = SimulatedGpus::load(&a.sim_gpus).map_err(|e| e.to_string())?;
    if !sim.enumerated().contains(&a.gpu) {
        return Err(format!("GPU {} is not among the GPUs of {}", a.gpu, a.sim_gpus.display()));
    }
    if !a.pipe_dir.is_dir() {
        return Err(format!("{}: no such directory", a.pipe_dir.display()));
    }
    let socket = a.pipe_dir.join(SOCKET);
    // A socket left behind by a daemon killed before it could clean up.
    if std::fs::symlink_metadata(&socket).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(&socket);
    }
    let listener = UnixListener::bind(&socket).map_err(|e| format!("{}: {e}", socket.display()))?;
    // Every user's job may be a client, as with NVIDIA's pipes.
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666))
        .and_then(|()| listener.set_nonblocking(true))
        .map_err(|e| format!("{}: {e}", socket.display()))?;
    let control = a.pipe_dir.join("control");
    make_fifo(&control)?;
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
    }
    let mut d = Daemon { gpu: a.gpu, sim, listener, active: None, waiting: Vec::new() };
    d.say(&format!("serving GPU {} at {} (a test stand-in for nvidia-cuda-mps-control)", a.gpu, socket.display()));
    while !STOP.load(Ordering::SeqCst) {
        d.tick();
    }
    d.shutdown();
    let _ = std::fs::remove_file(&socket);
    if std::fs::symlink_metadata(&control).is_ok_and(|m| m.file_type().is_fifo()) {
        let _ = std::fs::remove_file(&control);
    }
    Ok(())
}

/// Makes `path` a root-only fifo, as the pipe NVIDIA's daemon makes, unless
/// something is there already.
fn make_fifo(path: &Path) -> Result<(), String> {
    if std::fs::symlink_metadata(path).is_ok() {
        return Ok(());
    }
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| format!("{}: a NUL in the path", path.display()))?;
    // SAFETY: a NUL-terminated path and a mode.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
        return Err(format!("mkfifo {}: {}", path.display(), std::io::Error::last_os_error()));
    }
    Ok(())
}

impl Daemon {
    fn say(&self, msg: &str) {
        eprintln!("carma-fake-mps-control[GPU {}]: {msg}", self.gpu);
    }

    fn clients(&self) -> impl Iterator<Item = &Client> {
        self.active.iter().flat_map(|s| s.clients.iter()).chain(self.waiting.iter())
    }

    /// One round: waits (at most a tick) for a connection or a client's
    /// news, takes new clients, drops those gone, stops a server without
    /// clients and starts the next user's.
    fn tick(&mut self) {
        let mut fds: Vec<libc::pollfd> = std::iter::once(self.listener.as_raw_fd())
            .chain(self.clients().map(|c| c.conn.as_raw_fd()))
            .map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 })
            .collect();
        // SAFETY: fds is a live array of fds.len() pollfds; a signal ends the wait early.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, TICK.as_millis() as libc::c_int) };
        for _ in 0..MAX_ACCEPTS_PER_TICK {
            match self.listener.accept() {
                Ok((conn, _)) => self.admit(conn),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    self.say(&format!("accept: {e}"));
                    break;
                }
            }
        }
        let gpu = self.gpu;
        let gone = |c: &Client| {
            let g = is_gone(&c.conn);
            if g {
                eprintln!("carma-fake-mps-control[GPU {gpu}]: client pid {} (uid {}) is gone", c.pid, c.uid);
            }
            !g
        };
        if let Some(s) = &mut self.active {
            s.clients.retain(gone);
        }
        self.waiting.retain(gone);
        self.reap();
        if let Some(s) = self.active.take_if(|s| s.clients.is_empty()) {
            self.stop_server(s, "its last client is gone");
        }
        if self.active.is_none() && !self.waiting.is_empty() {
            self.start_next();
        }
    }

    /// Reads a new connection's request and takes it as a client of its
    /// user, or refuses it with a log line.
    fn admit(&mut self, mut conn: UnixStream) {
        let cred = match peer_cred(&conn) {
            Ok(c) => c,
            Err(e) => return self.say(&format!("refused a connection without its peer's credentials: {e}")),
        };
        let refuse = |d: &Daemon, conn: &UnixStream, why: &str| {
            d.say(&format!("refused a request of pid {} (uid {}): {why}", cred.pid, cred.uid));
            let _ = (&*conn).write_all(format!("error {why}\n").as_bytes());
        };
        let checked = match mps_standin::read_line(&mut conn, REQUEST_WAIT) {
            Ok(line) => mps_standin::parse_request(&line),
            Err(e) => Err(format!("no request within {REQUEST_WAIT:?}: {e}")),
        };
        let checked = checked
            .and_then(|()| {
                peer_groups(&conn).map_err(|e| format!("cannot read its groups (at most {MAX_GROUPS}): {e}"))
            })
            .and_then(|g| conn.set_nonblocking(true).map(|()| g).map_err(|e| e.to_string()));
        let groups = match checked {
            Ok(_) if self.clients().count() >= MAX_CLIENTS => return refuse(self, &conn, "too many clients"),
            Ok(g) => g,
            Err(why) => return refuse(self, &conn, &why),
        };
        let client = Client { conn, pid: cred.pid, uid: cred.uid, gid: cred.gid, groups };
        match &mut self.active {
            Some(s) if s.uid == client.uid => {
                if answer(&client.conn, s.pid) {
                    eprintln!(
                        "carma-fake-mps-control[GPU {}]: client pid {} joins server {}",
                        self.gpu, client.pid, s.pid
                    );
                    s.clients.push(client);
                }
            }
            Some(s) => {
                let msg =
                    format!("client pid {} (uid {}) waits: the server serves uid {}", client.pid, client.uid, s.uid);
                self.say(&msg);
                self.waiting.push(client);
            }
            None => self.waiting.push(client),
        }
    }

    /// Reaps servers that ended by themselves (none else is a child).
    fn reap(&mut self) {
        for _ in 0..64 {
            let mut status = 0;
            // SAFETY: waitpid on any child, without blocking.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid <= 0 {
                return;
            }
            if let Some(s) = self.active.take_if(|s| s.pid == pid) {
                self.say(&format!(
                    "server {} (uid {}) ended by itself (status {status}); its clients dropped",
                    s.pid, s.uid
                ));
            }
        }
    }

    /// Starts the server of the first waiting client's user, for every
    /// waiting client of that user.
    fn start_next(&mut self) {
        let uid = self.waiting[0].uid;
        let (mine, rest): (Vec<Client>, Vec<Client>) =
            std::mem::take(&mut self.waiting).into_iter().partition(|c| c.uid == uid);
        self.waiting = rest;
        let theirs: Vec<RawFd> = mine.iter().map(|c| c.conn.as_raw_fd()).collect();
        match self.start_server(&mine[0], &theirs) {
            Ok(pid) => {
                self.say(&format!("started server {pid} for uid {uid} (client pid {})", mine[0].pid));
                let clients = mine.into_iter().filter(|c| answer(&c.conn, pid)).collect();
                self.active = Some(Server { pid, uid, clients });
            }
            Err(why) => {
                self.say(&format!("cannot start a server for uid {uid}: {why}"));
                for c in &mine {
                    let _ = (&c.conn).write_all(format!("error {why}\n").as_bytes());
                }
            }
        }
    }

    /// Forks the server of `client`'s user and waits until it runs as that
    /// user and is registered on the GPU. `theirs`: the connections of the
    /// clients it is for (no longer among the daemon's).
    fn start_server(&self, client: &Client, theirs: &[RawFd]) -> Result<libc::pid_t, String> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two fds into the array.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(format!("pipe: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: two fresh fds, owned here only.
        let (ready_r, ready_w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // What the server must not keep: the socket, its clients' connections.
        let inherited: Vec<RawFd> = std::iter::once(self.listener.as_raw_fd())
            .chain(self.clients().map(|c| c.conn.as_raw_fd()))
            .chain(theirs.iter().copied())
            .chain(std::iter::once(ready_r.as_raw_fd()))
            .collect();
        let daemon = std::process::id() as libc::pid_t;
        // SAFETY: fork in a process with one thread (this daemon starts
        // none); the child runs only this thread and ends with _exit.
        match unsafe { libc::fork() } {
            -1 => Err(format!("fork: {}", std::io::Error::last_os_error())),
            0 => serve(&self.sim, self.gpu, client, File::from(ready_w), &inherited, daemon),
            pid => {
                drop(ready_w);
                wait_ready(File::from(ready_r)).map(|()| pid).inspect_err(|_| {
                    // SAFETY: kill and reap our own child.
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                        libc::waitpid(pid, std::ptr::null_mut(), 0);
                    }
                })
            }
        }
    }

    /// Ends a server (SIGTERM, then SIGKILL) and drops its clients.
    fn stop_server(&self, s: Server, why: &str) {
        // SAFETY: signals our own child, not yet reaped.
        unsafe { libc::kill(s.pid, libc::SIGTERM) };
        let start = Instant::now();
        loop {
            // SAFETY: waitpid on our own child, without blocking.
            let r = unsafe { libc::waitpid(s.pid, std::ptr::null_mut(), libc::WNOHANG) };
            if r != 0 {
                break;
            }
            if start.elapsed() > STOP_WAIT {
                // SAFETY: kills and reaps our own child.
                unsafe {
                    libc::kill(s.pid, libc::SIGKILL);
                    libc::waitpid(s.pid, std::ptr::null_mut(), 0);
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.say(&format!("stopped server {} (uid {}): {why}", s.pid, s.uid));
    }

    fn shutdown(&mut self) {
        if let Some(s) = self.active.take() {
            self.stop_server(s, "the daemon stops");
        }
        for c in std::mem::take(&mut self.waiting) {
            let _ = (&c.conn).write_all(b"error the MPS control daemon stops\n");
        }
        self.say("stopped");
    }
}

/// The server, in the forked child: the client's groups, group and user
/// (in that order: each needs the powers the one before leaves), NVIDIA's
/// server's name, a registration on `gpu` with no memory; then it waits
/// for SIGTERM or its daemon's end. Says `ok` or `error WHY` on `ready`.
fn serve(
    sim: &SimulatedGpus,
    gpu: u32,
    client: &Client,
    mut ready: File,
    inherited: &[RawFd],
    daemon: libc::pid_t,
) -> ! {
    for &fd in inherited {
        // SAFETY: fds this child inherited and does not use.
        unsafe { libc::close(fd) };
    }
    // SAFETY: prctl with a NUL-terminated name.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"nvidia-cuda-mps-server".as_ptr() as libc::c_ulong, 0, 0, 0) };
    let last = || std::io::Error::last_os_error();
    // SAFETY: a pointer to groups.len() gids.
    if unsafe { libc::setgroups(client.groups.len(), client.groups.as_ptr()) } != 0 {
        fail(&mut ready, &format!("setgroups({:?}): {}", client.groups, last()));
    }
    // SAFETY: setgid has no memory preconditions.
    if unsafe { libc::setgid(client.gid) } != 0 {
        fail(&mut ready, &format!("setgid({}): {}", client.gid, last()));
    }
    // SAFETY: setuid has no memory preconditions.
    if unsafe { libc::setuid(client.uid) } != 0 {
        fail(&mut ready, &format!("setuid({}): {}", client.uid, last()));
    }
    // The change of user cleared the parent-death signal: set it now, then
    // see that the daemon did not end before.
    // SAFETY: prctl with a signal number; getppid has no preconditions.
    let (set, parent) =
        unsafe { (libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong, 0, 0, 0), libc::getppid()) };
    if set != 0 || parent != daemon {
        fail(&mut ready, "the daemon ended");
    }
    let me = std::process::id();
    match sim.allocate(me, &[gpu], 0, 0.0, 0.0, false) {
        Ok(Ok(())) => {}
        Ok(Err(oom)) => {
            fail(&mut ready, &format!("GPU {} is full ({} of {} MiB used)", oom.gpu, oom.used_mib, oom.total_mib))
        }
        Err(e) => fail(&mut ready, &e.to_string()),
    }
    let _ = ready.write_all(b"ok\n");
    drop(ready);
    // SAFETY: getppid has no preconditions.
    while !STOP.load(Ordering::SeqCst) && unsafe { libc::getppid() } == daemon {
        std::thread::sleep(Duration::from_millis(100));
    }
    sim.release(me);
    // SAFETY: ends the child without the parent's exit work.
    unsafe { libc::_exit(0) }
}

fn fail(ready: &mut File, why: &str) -> ! {
    let _ = ready.write_all(format!("error {}\n", why.replace('\n', " ")).as_bytes());
    // SAFETY: ends the child without the parent's exit work.
    unsafe { libc::_exit(1) }
}

/// Waits (at most [`START_WAIT`]) for the server's `ok` or `error WHY`.
fn wait_ready(mut ready: File) -> Result<(), String> {
    let deadline = Instant::now() + START_WAIT;
    let mut said = Vec::new();
    let mut chunk = [0u8; 256];
    while !said.contains(&b'\n') && said.len() < 4096 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("the server was not ready within {START_WAIT:?}"));
        }
        let mut p = libc::pollfd { fd: ready.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one live pollfd.
        if unsafe { libc::poll(&mut p, 1, left.as_millis().max(1) as libc::c_int) } <= 0 {
            continue;
        }
        match ready.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => said.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("the server's answer: {e}")),
        }
    }
    let said = String::from_utf8_lossy(&said);
    match said.trim_end() {
        "ok" => Ok(()),
        "" => Err("the server ended before it was ready".into()),
        other => Err(other.strip_prefix("error ").unwrap_or(other).to_string()),
    }
}

/// Answers a client with its server's pid; false if it is gone.
fn answer(conn: &UnixStream, server: libc::pid_t) -> bool {
    let mut w = conn;
    w.write_all(format!("server {server}\n").as_bytes()).is_ok()
}

/// True once the client closed its connection (or it failed); what a
/// client sends after its request is read and dropped, a little a round.
fn is_gone(conn: &UnixStream) -> bool {
    let mut r = conn;
    let mut sink = [0u8; 64];
    for _ in 0..16 {
        match r.read(&mut sink) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) => {
                return false;
            }
            Err(_) => return true,
        }
    }
    false
}

/// The connecting process's pid, uid and gid, as the kernel recorded them.
fn peer_cred(conn: &UnixStream) -> std::io::Result<libc::ucred> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred is a ucred and len its size.
    let rc = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if len as usize != std::mem::size_of::<libc::ucred>() {
        return Err(std::io::Error::other("a short SO_PEERCRED answer"));
    }
    Ok(cred)
}

/// The connecting process's supplementary groups (at most [`MAX_GROUPS`]).
fn peer_groups(conn: &UnixStream) -> std::io::Result<Vec<libc::gid_t>> {
    let mut groups: Vec<libc::gid_t> = vec![0; MAX_GROUPS];
    let mut len = (MAX_GROUPS * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
    // SAFETY: groups has room for len bytes.
    let rc = unsafe {
        libc::getsockopt(conn.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERGROUPS, groups.as_mut_ptr().cast(), &mut len)
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    groups.truncate(len as usize / std::mem::size_of::<libc::gid_t>());
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[test]
    fn options_parse() {
        Cli::command().debug_assert();
        let a = Cli::try_parse_from(["x", "--pipe-dir", "/run/m/1", "--gpu", "1", "--sim-gpus", "/e/s.yaml"]).unwrap();
        assert_eq!((a.pipe_dir, a.gpu, a.sim_gpus), (PathBuf::from("/run/m/1"), 1, PathBuf::from("/e/s.yaml")));
        assert!(Cli::try_parse_from(["x", "--pipe-dir", "/run/m/1", "--gpu", "-1", "--sim-gpus", "f"]).is_err());
        assert!(Cli::try_parse_from(["x", "--gpu", "1", "--sim-gpus", "f"]).is_err());
    }

    #[test]
    fn the_peer_is_who_the_kernel_says() {
        let (a, b) = UnixStream::pair().unwrap();
        let cred = peer_cred(&a).unwrap();
        // SAFETY: getuid/getgid have no preconditions.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        assert_eq!((cred.pid, cred.uid, cred.gid), (std::process::id() as i32, uid, gid));
        assert!(peer_groups(&a).is_ok());
        a.set_nonblocking(true).unwrap();
        assert!(!is_gone(&a));
        (&b).write_all(b"chatter").unwrap();
        assert!(!is_gone(&a), "what a client says after its request does not end it");
        drop(b);
        assert!(is_gone(&a));
    }
}
