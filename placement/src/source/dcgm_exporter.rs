//! SM activity and occupancy from a dcgm-exporter, for GPUs without NVML
//! GPM (Ampere and older, the CARMA paper's A100s). NVML alone has no SM
//! activity there: it reports the share of time any kernel ran, which the
//! cap would read as a busy GPU (an H100 read 0.92 for two tiny jobs at SM
//! activity 0.01). DCGM measures it (`DCGM_FI_PROF_SM_ACTIVE`, the field the
//! paper monitors), and many GPU clusters already run NVIDIA's dcgm-exporter,
//! which publishes it over HTTP in Prometheus' text format. Reading that
//! needs no DCGM library, no host engine of our own and no new dependency.
//!
//! carma-monitor wraps its GPU source with this when carma.yaml names the
//! endpoint (`monitor.dcgm_exporter`): memory, processes and busy time come
//! from the source, SM activity and occupancy from the exporter, matched by
//! GPU UUID (else index). A failed scrape is a failed reading: the monitor
//! logs it and its publication ages until placement reads NVML itself.

use super::{GpuSource, SourceError};
use crate::gpu::GpuReading;
use carma_config::HttpEndpoint;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

pub const SM_ACTIVE: &str = "DCGM_FI_PROF_SM_ACTIVE";
pub const SM_OCCUPANCY: &str = "DCGM_FI_PROF_SM_OCCUPANCY";
/// A node's metrics page is tens of KiB; more is not an exporter.
const MAX_BYTES: u64 = 4 << 20;

/// One GPU's profiling readings (ratios, 0–1).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Profile {
    pub sm_active: Option<f64>,
    pub sm_occupancy: Option<f64>,
}

/// The exporter's readings by GPU UUID (lower case) and by index.
#[derive(Debug, Default, PartialEq)]
pub struct Scrape {
    pub by_uuid: HashMap<String, Profile>,
    pub by_index: HashMap<u32, Profile>,
}

impl Scrape {
    fn of(&self, g: &GpuReading) -> Option<Profile> {
        self.by_uuid.get(&g.uuid.to_ascii_lowercase()).or_else(|| self.by_index.get(&g.index)).copied()
    }
}

/// A metric sample: (name, labels, value).
type Sample<'a> = (&'a str, Vec<(String, String)>, f64);

/// `name{label="value",...} value [timestamp]` → (name, labels, value).
fn sample(line: &str) -> Option<Sample<'_>> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(mut body) = rest.strip_prefix('{') {
        loop {
            body = body.trim_start_matches([',', ' ']);
            if let Some(after) = body.strip_prefix('}') {
                rest = after;
                break;
            }
            let (key, after) = body.split_once("=\"")?;
            // The value, with \" \\ \n escapes.
            let mut value = String::new();
            let mut chars = after.char_indices();
            let end = loop {
                match chars.next()? {
                    (i, '"') => break i,
                    (_, '\\') => {
                        let (_, c) = chars.next()?;
                        value.push(if c == 'n' { '\n' } else { c });
                    }
                    (_, c) => value.push(c),
                }
            };
            labels.push((key.trim().to_string(), value));
            body = &after[end + 1..];
        }
    }
    let value = rest.split_whitespace().next()?.parse::<f64>().ok()?;
    Some((name, labels, value))
}

/// The SM readings of a metrics page.
pub fn parse(text: &str) -> Scrape {
    let mut s = Scrape::default();
    for (name, labels, value) in text.lines().filter_map(sample) {
        let set: fn(&mut Profile, f64) = match name {
            SM_ACTIVE => |p, v| p.sm_active = Some(v),
            SM_OCCUPANCY => |p, v| p.sm_occupancy = Some(v),
            _ => continue,
        };
        // A field DCGM could not read is exported as NaN: no reading.
        if !value.is_finite() {
            continue;
        }
        let v = value.clamp(0.0, 1.0);
        for (key, val) in &labels {
            match key.as_str() {
                "UUID" => set(s.by_uuid.entry(val.to_ascii_lowercase()).or_default(), v),
                "gpu" => {
                    if let Ok(i) = val.parse() {
                        set(s.by_index.entry(i).or_default(), v)
                    }
                }
                _ => {}
            }
        }
    }
    s
}

/// GET over plain HTTP/1.0 (no chunked replies), every step bounded by
/// `timeout`; the body of a 200 reply.
pub fn fetch(e: &HttpEndpoint, timeout: Duration) -> Result<String, String> {
    let addr = (e.host.as_str(), e.port)
        .to_socket_addrs()
        .map_err(|err| format!("cannot resolve: {err}"))?
        .next()
        .ok_or("no address")?;
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|err| format!("cannot connect: {err}"))?;
    s.set_read_timeout(Some(timeout)).and_then(|()| s.set_write_timeout(Some(timeout))).map_err(|e| e.to_string())?;
    let request = format!("GET {} HTTP/1.0\r\nHost: {}:{}\r\nAccept: text/plain\r\n\r\n", e.path, e.host, e.port);
    s.write_all(request.as_bytes()).map_err(|err| format!("cannot send: {err}"))?;
    let mut reply = Vec::new();
    s.take(MAX_BYTES + 1).read_to_end(&mut reply).map_err(|err| format!("cannot read the reply: {err}"))?;
    if reply.len() as u64 > MAX_BYTES {
        return Err(format!("the reply is larger than {} MiB", MAX_BYTES >> 20));
    }
    let text = String::from_utf8_lossy(&reply);
    let (head, body) = text.split_once("\r\n\r\n").ok_or("a reply without headers")?;
    let status = head.lines().next().unwrap_or("");
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(format!("the reply is '{status}'"));
    }
    Ok(body.to_string())
}

/// A GPU source whose SM readings come from a dcgm-exporter.
pub struct WithDcgmExporter {
    inner: Box<dyn GpuSource>,
    endpoint: HttpEndpoint,
    timeout: Duration,
}

impl WithDcgmExporter {
    pub fn new(inner: Box<dyn GpuSource>, endpoint: HttpEndpoint, timeout: Duration) -> WithDcgmExporter {
        WithDcgmExporter { inner, endpoint, timeout }
    }
}

impl GpuSource for WithDcgmExporter {
    fn read(&mut self) -> Result<Vec<GpuReading>, SourceError> {
        let mut gpus = self.inner.read()?;
        let e = &self.endpoint;
        let scrape = parse(&fetch(e, self.timeout).map_err(|why| SourceError(format!("dcgm-exporter at {e}: {why}")))?);
        for g in &mut gpus {
            let p = scrape.of(g).unwrap_or_default();
            g.sm_activity = p.sm_active.ok_or_else(|| {
                SourceError(format!(
                    "dcgm-exporter at {e} publishes no {SM_ACTIVE} for GPU {} ({}): add it to the exporter's metrics \
                     (a profiling field: it needs DCGM's profiling module)",
                    g.index, g.uuid
                ))
            })?;
            g.sm_occupancy = p.sm_occupancy;
        }
        Ok(gpus)
    }

    fn name(&self) -> &'static str {
        match self.inner.name() {
            "nvml" => "nvml+dcgm-exporter",
            "simulated" => "simulated+dcgm-exporter",
            _ => "dcgm-exporter",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of a dcgm-exporter 3.x page (labels as it writes them).
    pub const PAGE: &str = r#"# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-aaaa",device="nvidia0",modelName="NVIDIA A100-SXM4-40GB",Hostname="n1"} 92
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-bbbb",device="nvidia1",modelName="NVIDIA A100-SXM4-40GB",Hostname="n1"} 0
# HELP DCGM_FI_PROF_SM_ACTIVE The ratio of cycles an SM has at least 1 warp assigned.
# TYPE DCGM_FI_PROF_SM_ACTIVE gauge
DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-aaaa",device="nvidia0",modelName="NVIDIA A100-SXM4-40GB",Hostname="n1",job="a \"quoted\" name"} 0.011000
DCGM_FI_PROF_SM_ACTIVE{gpu="1",UUID="GPU-bbbb",device="nvidia1",modelName="NVIDIA A100-SXM4-40GB",Hostname="n1"} 0.000000
DCGM_FI_PROF_SM_OCCUPANCY{gpu="0",UUID="GPU-aaaa",device="nvidia0",modelName="NVIDIA A100-SXM4-40GB",Hostname="n1"} 0.004 1700000000000
"#;

    #[test]
    fn reads_sm_activity_and_occupancy_by_uuid_and_index() {
        let s = parse(PAGE);
        assert_eq!(s.by_uuid["gpu-aaaa"], Profile { sm_active: Some(0.011), sm_occupancy: Some(0.004) });
        assert_eq!(s.by_index[&1], Profile { sm_active: Some(0.0), sm_occupancy: None });
        assert_eq!(s.by_uuid.len(), 2, "utilization lines are not SM readings");
        assert!(sample("garbage").is_none() && sample("x{a=\"1\"").is_none() && sample("x{a=1} 2").is_none());
        assert_eq!(sample("plain 3e-1").map(|s| s.2), Some(0.3));
        let nan = parse("DCGM_FI_PROF_SM_ACTIVE{gpu=\"0\",UUID=\"GPU-x\"} NaN\n");
        assert_eq!(nan.by_index.get(&0), None, "NaN is no reading");
    }
}
