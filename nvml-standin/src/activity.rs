//! How busy a GPU is: utilization samples and rates, and power draw.

use crate::code;
use crate::entry::{Ret, entry, gpu_of};
use crate::model::Call;
use std::collections::VecDeque;
use std::ffi::{c_uint, c_ulonglong, c_void};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

const SAMPLES_GPU_UTILIZATION: c_uint = 1;
const VALUE_TYPE_UNSIGNED_INT: c_uint = 1;

#[repr(C)]
pub struct Utilization {
    pub(crate) gpu: c_uint,
    pub(crate) memory: c_uint,
}

#[repr(C)]
pub struct Sample {
    pub(crate) time_stamp: c_ulonglong,
    pub(crate) value: c_ulonglong,
}

fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

/// The driver takes a busy-time sample every 200 ms and keeps about 14 s
/// of them (an H100, driver 580: 71 samples, 200 ms apart).
const SAMPLE_US: u64 = 200_000;
const KEPT_US: u64 = 14_000_000;

/// Looks kept per GPU at most: a caller in a tight loop must not grow
/// them without bound.
const LOOKS_KEPT: usize = 256;

/// Each GPU's busy time as this process saw it: (when, percent), oldest
/// first. The stand-in learns a GPU's busy time only when asked, so a
/// sample takes the value of the first look at or after its time: a
/// change shows from the look that saw it, and a reader that looked once
/// sees its whole ring at the value of now.
static SEEN: Mutex<Vec<VecDeque<(u64, u64)>>> = Mutex::new(Vec::new());

/// The ring's samples newer than `last_seen`, as of now, when the GPU is
/// `pct` busy.
fn samples_since(gpu: usize, last_seen: u64, pct: u64) -> Vec<Sample> {
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    // Read under the lock: looks are added in time order.
    let now = now_us();
    if seen.len() <= gpu {
        seen.resize_with(gpu + 1, VecDeque::new);
    }
    let looks = &mut seen[gpu];
    // The clock was set back: what was seen "later" says nothing now.
    if looks.back().is_some_and(|&(at, _)| at > now) {
        looks.clear();
    }
    looks.push_back((now, pct));
    while looks.len() > LOOKS_KEPT || looks.front().is_some_and(|&(at, _)| at.saturating_add(KEPT_US) < now) {
        looks.pop_front();
    }
    if last_seen >= now {
        return Vec::new();
    }
    let first = now.saturating_sub(KEPT_US).max(last_seen + 1).div_ceil(SAMPLE_US) * SAMPLE_US;
    (first..=now)
        .step_by(SAMPLE_US as usize)
        .map(|t| Sample { time_stamp: t, value: looks.iter().find(|&&(at, _)| at >= t).map_or(pct, |&(_, v)| v) })
        .collect()
}

/// Busy-time samples newer than `last_seen` (µs since the epoch) from the
/// driver's ring; `NOT_FOUND` when none is newer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSamples(
    device: *const c_void,
    kind: c_uint,
    last_seen: c_ulonglong,
    value_type: *mut c_uint,
    count: *mut c_uint,
    samples: *mut Sample,
) -> Ret {
    entry(|| {
        let (i, g) = gpu_of(device, Call::Utilization)?;
        if count.is_null() || value_type.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        if kind != SAMPLES_GPU_UTILIZATION {
            return Err(code::NOT_SUPPORTED);
        }
        let ring = samples_since(i, last_seen, (g.busy * 100.0).round() as u64);
        if ring.is_empty() {
            return Err(code::NOT_FOUND);
        }
        // SAFETY: checked non-null.
        unsafe { *value_type = VALUE_TYPE_UNSIGNED_INT };
        if samples.is_null() {
            // SAFETY: checked non-null.
            unsafe { *count = ring.len() as c_uint };
            return Ok(());
        }
        // The oldest that fit: a reader asks again from the newest it got.
        // SAFETY: checked non-null.
        let n = ring.len().min(unsafe { *count } as usize);
        for (k, sample) in ring.into_iter().take(n).enumerate() {
            // SAFETY: k < n <= the caller's count.
            unsafe { *samples.add(k) = sample };
        }
        // SAFETY: checked non-null.
        unsafe { *count = n as c_uint };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(device: *const c_void, util: *mut Utilization) -> Ret {
    entry(|| {
        let (_, g) = gpu_of(device, Call::Utilization)?;
        if util.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        let memory = (g.used_mib as f64 / g.total_mib.max(1) as f64 * 100.0 * g.busy).round() as c_uint;
        // SAFETY: checked non-null.
        unsafe { *util = Utilization { gpu: (g.busy * 100.0).round() as c_uint, memory } };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(device: *const c_void, milliwatts: *mut c_uint) -> Ret {
    entry(|| {
        let (_, g) = gpu_of(device, Call::Utilization)?;
        if milliwatts.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: checked non-null.
        unsafe { *milliwatts = (g.power_w * 1000.0).round() as c_uint };
        Ok(())
    })
}
