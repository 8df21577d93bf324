//! The protocol of the test cluster's stand-in for NVIDIA's MPS control
//! daemon (`carma-fake-mps-control`, installed as `nvidia-cuda-mps-control`)
//! and its client's side (`carma-fakejob` run as an MPS client on the NVML
//! stand-in). For nodes without GPUs only: on a GPU node NVIDIA's daemon
//! and CUDA speak their own protocol.
//!
//! A client connects to the Unix socket [`SOCKET`] in its
//! CUDA_MPS_PIPE_DIRECTORY and writes [`REQUEST`] and a newline; the daemon
//! answers `server PID` once the GPU's server for the client's user runs,
//! or `error WHY`. The user is the connecting process's (SO_PEERCRED): no
//! request names one. The client keeps the connection open while it runs;
//! its end tells the daemon the client is gone.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// The daemon's socket in its pipe directory (beside `control`, the pipe
/// whose presence CARMA takes for a running daemon).
pub const SOCKET: &str = "control.sock";
/// The one request: "I am a client: start or join my user's server".
pub const REQUEST: &str = "client";
/// The longest line either side reads, newline included.
pub const MAX_LINE: usize = 64;

/// Checks a request line as read (newline included or not): only
/// [`REQUEST`]. The error quotes what came, shortened and escaped.
pub fn parse_request(line: &[u8]) -> Result<(), String> {
    let body = line.strip_suffix(b"\n").unwrap_or(line);
    if body == REQUEST.as_bytes() {
        return Ok(());
    }
    let shown: String = String::from_utf8_lossy(&body[..body.len().min(32)]).escape_debug().collect();
    if body.is_empty() {
        Err("an empty request".into())
    } else if body.len() >= MAX_LINE || !line.ends_with(b"\n") {
        Err(format!("a request longer than {} bytes or unended (\"{shown}...\")", MAX_LINE - 1))
    } else {
        Err(format!("an unknown request \"{shown}\" (expected \"{REQUEST}\")"))
    }
}

/// Reads one line of at most [`MAX_LINE`] bytes, waiting at most `wait`
/// in all: what came until the newline, the limit, the peer's end or the
/// deadline (an error only if nothing came).
pub fn read_line(conn: &mut UnixStream, wait: Duration) -> std::io::Result<Vec<u8>> {
    let deadline = Instant::now() + wait;
    let mut line = Vec::with_capacity(MAX_LINE);
    let mut chunk = [0u8; MAX_LINE];
    while !line.contains(&b'\n') && line.len() < MAX_LINE {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        conn.set_read_timeout(Some(left))?;
        match conn.read(&mut chunk[..MAX_LINE - line.len()]) {
            Ok(0) => break,
            Ok(n) => line.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if line.is_empty() => return Err(e),
            Err(_) => break,
        }
    }
    Ok(line)
}

/// Asks the daemon of `pipe_dir` for this process's server, waiting at most
/// `wait` (while another user's server runs on the GPU, a client waits, as
/// under NVIDIA's MPS). The connection, to keep open while the client
/// runs, and the server's pid.
pub fn connect(pipe_dir: &Path, wait: Duration) -> Result<(UnixStream, u32), String> {
    let socket = pipe_dir.join(SOCKET);
    let mut conn = UnixStream::connect(&socket)
        .map_err(|e| format!("no MPS control daemon answers at {}: {e}", socket.display()))?;
    conn.write_all(format!("{REQUEST}\n").as_bytes())
        .map_err(|e| format!("MPS control daemon at {}: {e}", socket.display()))?;
    let line = read_line(&mut conn, wait).map_err(|e| {
        format!("the MPS control daemon at {} started no server within {wait:?}: {e}", socket.display())
    })?;
    let text = String::from_utf8_lossy(&line);
    let text = text.trim_end();
    match text.strip_prefix("server ").and_then(|p| p.parse::<u32>().ok()) {
        Some(pid) => Ok((conn, pid)),
        None if text.is_empty() => {
            Err(format!("the MPS control daemon at {} started no server within {wait:?}", socket.display()))
        }
        None => Err(format!("the MPS control daemon at {} answered: {}", socket.display(), text.escape_debug())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_client_request_is_taken() {
        assert!(parse_request(b"client\n").is_ok());
        assert!(parse_request(b"client").is_ok(), "the peer's end ends a line too");
        for (line, says) in [
            (&b"\n"[..], "an empty request"),
            (b"client -uid 0\n", "an unknown request \"client -uid 0\""),
            (b"quit\n", "an unknown request \"quit\""),
            (b"cli\xffnt\n", "an unknown request \"cli\u{fffd}nt\""),
            (b"a\"b\n", "an unknown request \"a\\\"b\""),
            (&[b'x'; MAX_LINE], "longer than 63 bytes or unended"),
        ] {
            let e = parse_request(line).unwrap_err();
            assert!(e.contains(says), "{line:?}: {e}");
        }
    }

    #[test]
    fn a_line_is_read_bounded_in_size_and_time() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        b.write_all(b"client\nmore").unwrap();
        assert_eq!(read_line(&mut a, Duration::from_secs(1)).unwrap(), b"client\nmore");
        b.write_all(&[b'y'; 100]).unwrap();
        assert_eq!(read_line(&mut a, Duration::from_secs(1)).unwrap().len(), MAX_LINE);
        // The rest, unended: what came by the deadline.
        assert_eq!(read_line(&mut a, Duration::from_millis(200)).unwrap().len(), 100 - MAX_LINE);
        let t = Instant::now();
        assert!(read_line(&mut a, Duration::from_millis(200)).is_err(), "nothing came");
        assert!(t.elapsed() < Duration::from_secs(2));
        drop(b);
        assert!(read_line(&mut a, Duration::from_secs(1)).unwrap().is_empty(), "the peer's end");
    }
}
