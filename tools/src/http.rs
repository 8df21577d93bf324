//! carma-monitor's metrics endpoint: read-only, bounded, and apart from
//! sampling. The sampling loop renders a page each interval and swaps it in;
//! connections only copy the page out. Each connection has a thread of its
//! own, at most MAX_CONNECTIONS at once (more are closed unanswered), at
//! most REQUEST_BYTES of request and REQUEST_TIME to send it (a slow or
//! endless sender is cut off), and WRITE_TIME to take the answer.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const MAX_CONNECTIONS: usize = 16;
pub const REQUEST_BYTES: usize = 8192;
pub const REQUEST_TIME: Duration = Duration::from_secs(2);
const WRITE_TIME: Duration = Duration::from_secs(5);
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The page the endpoint serves; the sampling loop replaces it.
#[derive(Clone, Default)]
pub struct Page(Arc<Mutex<Arc<String>>>);

impl Page {
    pub fn set(&self, text: String) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(text);
    }

    fn get(&self) -> Arc<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Binds `addr` and serves `page` from a thread of its own; the address
/// actually bound (port 0 picks one).
pub fn serve(addr: SocketAddr, page: Page, log: fn(&str)) -> Result<SocketAddr, String> {
    let listener = TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    let open = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("carma-metrics".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(stream) = conn else { continue };
                if open.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
                    open.fetch_sub(1, Ordering::SeqCst);
                    drop(stream); // closed unanswered: a scraper retries
                    continue;
                }
                let (page, mine) = (page.clone(), open.clone());
                let spawned = std::thread::Builder::new().name("carma-metrics-conn".into()).spawn(move || {
                    answer(stream, &page);
                    mine.fetch_sub(1, Ordering::SeqCst);
                });
                if spawned.is_err() {
                    open.fetch_sub(1, Ordering::SeqCst);
                    log("carma-monitor: metrics: cannot start a connection thread");
                }
            }
        })
        .map_err(|e| format!("cannot start the metrics thread: {e}"))?;
    Ok(bound)
}

/// Reads one request (bounded in size and time) and answers it.
fn answer(mut s: TcpStream, page: &Page) {
    let _ = s.set_write_timeout(Some(WRITE_TIME));
    let start = Instant::now();
    let mut req = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    let complete = loop {
        if req.windows(4).any(|w| w == b"\r\n\r\n") || req.windows(2).any(|w| w == b"\n\n") {
            break true;
        }
        if req.len() > REQUEST_BYTES {
            respond(&mut s, "431 Request Header Fields Too Large", "request too large\n");
            linger(&mut s);
            return;
        }
        let left = REQUEST_TIME.saturating_sub(start.elapsed());
        if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
            break false;
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break false,
            Ok(n) => req.extend_from_slice(&buf[..n]),
        }
    };
    if !complete {
        respond(&mut s, "408 Request Timeout", "request not received in time\n");
        return;
    }
    let line = req.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => {
            let body = page.get();
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: {CONTENT_TYPE}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = s.write_all(head.as_bytes()).and_then(|()| s.write_all(body.as_bytes()));
        }
        ("GET", "/") => respond(&mut s, "200 OK", "carma-monitor: metrics at /metrics\n"),
        ("GET", _) => respond(&mut s, "404 Not Found", "not found; metrics at /metrics\n"),
        _ => respond(&mut s, "405 Method Not Allowed", "read-only: GET /metrics\n"),
    }
}

/// Closes after an answer sent before the request was read whole: the
/// rest is read and dropped for a moment (at most 1 MiB, 500 ms), so the
/// close does not reset the connection before the client reads the answer.
fn linger(s: &mut TcpStream) {
    let _ = s.shutdown(std::net::Shutdown::Write);
    let start = Instant::now();
    let mut buf = [0u8; 8192];
    let mut left = 1usize << 20;
    while left > 0 && start.elapsed() < Duration::from_millis(500) {
        let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

fn respond(s: &mut TcpStream, status: &str, body: &str) {
    let _ = write!(
        s,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}
