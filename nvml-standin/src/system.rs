//! Initialisation, shutdown, versions and error strings: the calls that
//! name no GPU.

use crate::code;
use crate::entry::{Ret, entry, write_str};
use crate::model;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::path::PathBuf;

/// This library's own path (where the dynamic loader found it).
fn own_path() -> Option<PathBuf> {
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr reads the loader's tables for an address of this library.
    let found = unsafe { libc::dladdr(own_path as *const c_void, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(std::ffi::OsStr::new(std::str::from_utf8(name.to_bytes()).ok()?)))
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> Ret {
    entry(|| {
        let path = carma_placement::source::simulated::standin_description(own_path().as_deref());
        match model::init(&path) {
            code::SUCCESS => Ok(()),
            c => Err(c),
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit() -> Ret {
    nvmlInit_v2()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    nvmlInit_v2()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> Ret {
    entry(|| match model::shutdown() {
        code::SUCCESS => Ok(()),
        c => Err(c),
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: Ret) -> *const c_char {
    let s: &'static [u8] = match result {
        code::SUCCESS => b"Success\0",
        code::UNINITIALIZED => b"Uninitialized\0",
        code::INVALID_ARGUMENT => b"Invalid Argument\0",
        code::NOT_SUPPORTED => b"Not Supported\0",
        code::NO_PERMISSION => b"Insufficient Permissions\0",
        code::NOT_FOUND => b"Not Found\0",
        code::INSUFFICIENT_SIZE => b"Insufficient Size\0",
        code::DRIVER_NOT_LOADED => b"Driver Not Loaded\0",
        code::GPU_IS_LOST => b"GPU is lost\0",
        code::LIB_RM_VERSION_MISMATCH => b"RM has detected an NVML/RM version mismatch.\0",
        code::ARGUMENT_VERSION_MISMATCH => b"Version mismatch\0",
        _ => b"Unknown Error\0",
    };
    s.as_ptr().cast()
}

/// The driver branch the H100 facts were measured on.
const DRIVER_VERSION: &str = "580.159.00";

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> Ret {
    entry(|| unsafe { write_str(DRIVER_VERSION, version, length) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> Ret {
    entry(|| unsafe { write_str("13.580.159", version, length) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> Ret {
    entry(|| {
        if version.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: checked non-null; the caller's int.
        unsafe { *version = 13000 };
        Ok(())
    })
}
