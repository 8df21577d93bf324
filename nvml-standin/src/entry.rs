//! What every entry point shares: running it without unwinding into the
//! caller, device handles, and strings written into the caller's buffers.

use crate::code;
use crate::model::{self, Call};
use std::ffi::{c_char, c_uint, c_void};

pub(crate) type Ret = c_uint;
pub(crate) const MIB: u64 = 1024 * 1024;
pub(crate) const MAX_GPUS: usize = 64;

/// Device handles point into this array: handle i is `&DEVICES[i]`.
pub(crate) static DEVICES: [u8; MAX_GPUS] = [0; MAX_GPUS];

/// Runs an entry point: a panic becomes NVML_ERROR_UNKNOWN, never an unwind.
pub(crate) fn entry(f: impl FnOnce() -> Result<(), Ret>) -> Ret {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => code::SUCCESS,
        Ok(Err(c)) => c,
        Err(_) => code::UNKNOWN,
    }
}

pub(crate) fn device_index(device: *const c_void) -> Result<usize, Ret> {
    let base = DEVICES.as_ptr() as usize;
    let at = device as usize;
    (base..base + MAX_GPUS).contains(&at).then(|| at - base).ok_or(code::INVALID_ARGUMENT)
}

/// Writes `text` NUL-terminated into a caller's buffer of `length` bytes.
pub(crate) unsafe fn write_str(text: &str, out: *mut c_char, length: c_uint) -> Result<(), Ret> {
    if out.is_null() {
        return Err(code::INVALID_ARGUMENT);
    }
    if text.len() + 1 > length as usize {
        return Err(code::INSUFFICIENT_SIZE);
    }
    // SAFETY: the caller gave `length` writable bytes; we write len+1 <= length.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), out.cast::<u8>(), text.len());
        *out.add(text.len()) = 0;
    }
    Ok(())
}

pub(crate) fn gpu_of(device: *const c_void, call: Call) -> Result<(usize, model::Gpu), Ret> {
    let i = device_index(device)?;
    model::with_gpus(call, Some(i as u32), |gpus, _| gpus[i].clone()).map(|g| (i, g))
}
