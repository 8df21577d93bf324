//! How busy a GPU is: utilization samples and rates, and power draw.

use crate::code;
use crate::entry::{Ret, entry, gpu_of};
use crate::model::Call;
use std::ffi::{c_uint, c_ulonglong, c_void};
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

/// Busy-time samples, one a second over the last 20 s at most (the driver
/// keeps a ring of them), newer than `last_seen` (µs since the epoch).
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
        let (_, g) = gpu_of(device, Call::Utilization)?;
        if count.is_null() || value_type.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        if kind != SAMPLES_GPU_UTILIZATION {
            return Err(code::NOT_SUPPORTED);
        }
        let now = now_us();
        if last_seen >= now {
            return Err(code::NOT_FOUND);
        }
        let available = (now - last_seen).div_ceil(1_000_000).clamp(1, 20) as usize;
        // SAFETY: checked non-null.
        unsafe { *value_type = VALUE_TYPE_UNSIGNED_INT };
        if samples.is_null() {
            // SAFETY: checked non-null.
            unsafe { *count = available as c_uint };
            return Ok(());
        }
        // SAFETY: checked non-null.
        let n = available.min(unsafe { *count } as usize);
        let pct = (g.busy * 100.0).round() as u64;
        for k in 0..n {
            // SAFETY: k < n <= the caller's count.
            unsafe { *samples.add(k) = Sample { time_stamp: now - (n - 1 - k) as u64 * 1_000_000, value: pct } };
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
