//! A GPU stand-in behind NVML's C interface: `libnvidia-ml.so.1` for
//! nodes without GPUs (the test cluster, CI, the demo). CARMA's production
//! code loads it through nvml-wrapper exactly as it loads the driver's, so
//! the NVML source, GPM sampling, per-process memory and MPS detection run
//! in CI. Below this interface everything is simulated: the GPUs and their
//! load come from the simulated GPUs' description file and the workloads
//! registered there (`carma-fakejob`), see [`model`].
//!
//! It answers as the driver does call by call where CARMA depends on it:
//! versioned structs are checked, a process list that does not fit the
//! caller's buffer is `NVML_ERROR_INSUFFICIENT_SIZE` with the count, GPM
//! is `NVML_ERROR_NOT_SUPPORTED` on the A100 profile, and faults (no
//! driver, a lost GPU, a process race, a hung call) come from the file.
//! Every entry catches panics: nothing unwinds into the caller.

#![allow(clippy::missing_safety_doc)]

pub mod model;
pub mod replay;

use model::Call;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};
use std::path::PathBuf;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// NVML's return codes (nvml.h).
pub mod code {
    pub const SUCCESS: u32 = 0;
    pub const UNINITIALIZED: u32 = 1;
    pub const INVALID_ARGUMENT: u32 = 2;
    pub const NOT_SUPPORTED: u32 = 3;
    pub const NO_PERMISSION: u32 = 4;
    pub const NOT_FOUND: u32 = 6;
    pub const INSUFFICIENT_SIZE: u32 = 7;
    pub const DRIVER_NOT_LOADED: u32 = 9;
    pub const GPU_IS_LOST: u32 = 15;
    pub const LIB_RM_VERSION_MISMATCH: u32 = 18;
    pub const ARGUMENT_VERSION_MISMATCH: u32 = 25;
    pub const UNKNOWN: u32 = 999;
}

type Ret = c_uint;
const MIB: u64 = 1024 * 1024;
const MAX_GPUS: usize = 64;
const GPM_SUPPORT_VERSION: c_uint = 1;
const GPM_METRICS_GET_VERSION: c_uint = 1;
const GPM_METRIC_MAX: usize = 210;
const GPM_SM_UTIL: c_uint = 2;
const GPM_SM_OCCUPANCY: c_uint = 3;
const SAMPLES_GPU_UTILIZATION: c_uint = 1;
const VALUE_TYPE_UNSIGNED_INT: c_uint = 1;

/// Device handles point into this array: handle i is `&DEVICES[i]`.
static DEVICES: [u8; MAX_GPUS] = [0; MAX_GPUS];

#[repr(C)]
pub struct Memory {
    total: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

#[repr(C)]
pub struct MemoryV2 {
    version: c_uint,
    total: c_ulonglong,
    reserved: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

/// nvmlProcessInfo_t of the _v3 process calls.
#[repr(C)]
pub struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

#[repr(C)]
pub struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

#[repr(C)]
pub struct Sample {
    time_stamp: c_ulonglong,
    value: c_ulonglong,
}

#[repr(C)]
pub struct GpmSupport {
    version: c_uint,
    is_supported_device: c_uint,
}

#[repr(C)]
pub struct GpmMetric {
    metric_id: c_uint,
    nvml_return: c_uint,
    value: f64,
    short_name: *const c_char,
    long_name: *const c_char,
    unit: *const c_char,
}

#[repr(C)]
pub struct GpmMetricsGet {
    version: c_uint,
    num_metrics: c_uint,
    sample1: *mut GpmSample,
    sample2: *mut GpmSample,
    metrics: [GpmMetric; GPM_METRIC_MAX],
}

/// What one nvmlGpmSampleGet saw.
pub struct GpmSample {
    gpu: Option<usize>,
    at: Option<Instant>,
    sm: f64,
    occupancy: f64,
}

/// Runs an entry point: a panic becomes NVML_ERROR_UNKNOWN, never an unwind.
fn entry(f: impl FnOnce() -> Result<(), Ret>) -> Ret {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => code::SUCCESS,
        Ok(Err(c)) => c,
        Err(_) => code::UNKNOWN,
    }
}

fn device_index(device: *const c_void) -> Result<usize, Ret> {
    let base = DEVICES.as_ptr() as usize;
    let at = device as usize;
    (base..base + MAX_GPUS).contains(&at).then(|| at - base).ok_or(code::INVALID_ARGUMENT)
}

/// Writes `text` NUL-terminated into a caller's buffer of `length` bytes.
unsafe fn write_str(text: &str, out: *mut c_char, length: c_uint) -> Result<(), Ret> {
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

fn gpu_of(device: *const c_void, call: Call) -> Result<(usize, model::Gpu), Ret> {
    let i = device_index(device)?;
    model::with_gpus(call, Some(i as u32), |gpus, _| gpus[i].clone()).map(|g| (i, g))
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

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> Ret {
    entry(|| {
        if count.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        let n = model::with_gpus(Call::DeviceCount, None, |gpus, _| gpus.len().min(MAX_GPUS))?;
        // SAFETY: checked non-null.
        unsafe { *count = n as c_uint };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut *const c_void) -> Ret {
    entry(|| {
        let n = model::with_gpus(Call::DeviceCount, None, |gpus, _| gpus.len().min(MAX_GPUS))?;
        if device.is_null() || index as usize >= n {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: checked non-null; the handle points into DEVICES.
        unsafe { *device = DEVICES.as_ptr().add(index as usize).cast() };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: *const c_void, index: *mut c_uint) -> Ret {
    entry(|| {
        let i = device_index(device)?;
        if index.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: checked non-null.
        unsafe { *index = i as c_uint };
        Ok(())
    })
}

/// MIG mode now and after the next reset: 1 for GPUs the `mig` fault
/// names, else 0 (as a MIG-capable GPU with MIG off answers).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: *const c_void,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> Ret {
    entry(|| {
        let i = device_index(device)?;
        if current.is_null() || pending.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        let on = model::with_gpus(Call::DeviceCount, Some(i as u32), |_, s| s.mig(i as u32))?;
        // SAFETY: checked non-null; the caller's integers.
        unsafe {
            *current = on.into();
            *pending = on.into();
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(device: *const c_void, minor: *mut c_uint) -> Ret {
    entry(|| {
        let (_, g) = gpu_of(device, Call::DeviceCount)?;
        if minor.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: checked non-null.
        unsafe { *minor = g.minor };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(device: *const c_void, name: *mut c_char, length: c_uint) -> Ret {
    entry(|| {
        let i = device_index(device)?;
        let profile = model::with_gpus(Call::DeviceCount, Some(i as u32), |_, s| s.profile())?;
        unsafe { write_str(profile.name, name, length) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(device: *const c_void, uuid: *mut c_char, length: c_uint) -> Ret {
    entry(|| {
        let (_, g) = gpu_of(device, Call::DeviceCount)?;
        unsafe { write_str(&g.uuid, uuid, length) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: *const c_void, memory: *mut Memory) -> Ret {
    entry(|| {
        let (_, g) = gpu_of(device, Call::MemoryInfo)?;
        if memory.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        let (total, used) = (g.total_mib * MIB, g.used_mib.min(g.total_mib) * MIB);
        // SAFETY: checked non-null; the caller's struct.
        unsafe { *memory = Memory { total, free: total - used, used } };
        Ok(())
    })
}

/// NVML_STRUCT_VERSION(Memory, 2).
const MEMORY_V2: c_uint = (std::mem::size_of::<MemoryV2>() as c_uint) | (2 << 24);

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(device: *const c_void, memory: *mut MemoryV2) -> Ret {
    entry(|| {
        let (_, g) = gpu_of(device, Call::MemoryInfo)?;
        if memory.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: checked non-null; the caller set its version.
        if unsafe { (*memory).version } != MEMORY_V2 {
            return Err(code::ARGUMENT_VERSION_MISMATCH);
        }
        let (total, used) = (g.total_mib * MIB, g.used_mib.min(g.total_mib) * MIB);
        // SAFETY: as above.
        unsafe { *memory = MemoryV2 { version: MEMORY_V2, total, reserved: 0, free: total - used, used } };
        Ok(())
    })
}

/// NVML's contract for process lists: a buffer too small for the
/// processes (a count query passes none) is INSUFFICIENT_SIZE with the
/// count written back; an empty list is SUCCESS with 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: *const c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    // SAFETY: the caller's pointers, passed on as NVML got them.
    unsafe { process_list(device, count, infos, |g| &g.processes) }
}

/// Under MPS the compute list names the server; this one names its
/// clients, with their memory (NVML's MPS list, same contract).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    device: *const c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    // SAFETY: as above.
    unsafe { process_list(device, count, infos, |g| &g.mps_clients) }
}

/// One of a GPU's process lists (`pick`), under NVML's contract.
unsafe fn process_list(
    device: *const c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
    pick: fn(&model::Gpu) -> &Vec<(u32, u64)>,
) -> Ret {
    entry(|| {
        let i = device_index(device)?;
        if count.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: checked non-null.
        let room = unsafe { *count } as usize;
        let (procs, extra) = model::with_gpus(Call::Processes, Some(i as u32), |gpus, s| {
            // Processes started between the caller's count and this copy.
            let extra = if infos.is_null() { 0 } else { s.take_race() as usize };
            (pick(&gpus[i]).clone(), extra)
        })?;
        let n = procs.len() + extra;
        if n > room || (infos.is_null() && n > 0) {
            // SAFETY: checked non-null.
            unsafe { *count = n as c_uint };
            return Err(code::INSUFFICIENT_SIZE);
        }
        for (k, (pid, mib)) in procs.iter().enumerate() {
            // SAFETY: k < n <= room, the caller's buffer length.
            unsafe {
                *infos.add(k) = ProcessInfo {
                    pid: *pid,
                    used_gpu_memory: mib * MIB,
                    gpu_instance_id: u32::MAX,
                    compute_instance_id: u32::MAX,
                }
            };
        }
        // SAFETY: checked non-null.
        unsafe { *count = procs.len() as c_uint };
        Ok(())
    })
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

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmQueryDeviceSupport(device: *const c_void, support: *mut GpmSupport) -> Ret {
    entry(|| {
        let i = device_index(device)?;
        let profile = model::with_gpus(Call::DeviceCount, Some(i as u32), |_, s| s.profile())?;
        if support.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: checked non-null; the caller set its version.
        if unsafe { (*support).version } != GPM_SUPPORT_VERSION {
            return Err(code::ARGUMENT_VERSION_MISMATCH);
        }
        // SAFETY: as above.
        unsafe { (*support).is_supported_device = c_uint::from(profile.gpm) };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleAlloc(sample: *mut *mut GpmSample) -> Ret {
    entry(|| {
        if sample.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        let s = Box::new(GpmSample { gpu: None, at: None, sm: 0.0, occupancy: 0.0 });
        // SAFETY: checked non-null; freed by nvmlGpmSampleFree.
        unsafe { *sample = Box::into_raw(s) };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleFree(sample: *mut GpmSample) -> Ret {
    entry(|| {
        if sample.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: allocated by nvmlGpmSampleAlloc, freed once (NVML's contract).
        drop(unsafe { Box::from_raw(sample) });
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleGet(device: *const c_void, sample: *mut GpmSample) -> Ret {
    entry(|| {
        let i = device_index(device)?;
        let (profile, g) = model::with_gpus(Call::GpmSample, Some(i as u32), |gpus, s| (s.profile(), gpus[i].clone()))?;
        if !profile.gpm {
            return Err(code::NOT_SUPPORTED);
        }
        if sample.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: checked non-null; a sample from nvmlGpmSampleAlloc.
        unsafe { *sample = GpmSample { gpu: Some(i), at: Some(Instant::now()), sm: g.sm, occupancy: g.occupancy } };
        Ok(())
    })
}

/// SM activity and occupancy between two samples of one GPU, in percent:
/// the mean of what the two saw (the stand-in's load is steady between
/// changes of its description or its workloads).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmMetricsGet(request: *mut GpmMetricsGet) -> Ret {
    entry(|| {
        if request.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: checked non-null; the caller's request.
        let r = unsafe { &mut *request };
        if r.version != GPM_METRICS_GET_VERSION {
            return Err(code::ARGUMENT_VERSION_MISMATCH);
        }
        if r.sample1.is_null() || r.sample2.is_null() || r.num_metrics as usize > GPM_METRIC_MAX {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: samples from nvmlGpmSampleAlloc, checked non-null.
        let (a, b) = unsafe { (&*r.sample1, &*r.sample2) };
        let (Some(ga), Some(gb), Some(ta), Some(tb)) = (a.gpu, b.gpu, a.at, b.at) else {
            return Err(code::INVALID_ARGUMENT);
        };
        if ga != gb || tb < ta {
            return Err(code::INVALID_ARGUMENT);
        }
        for m in r.metrics.iter_mut().take(r.num_metrics as usize) {
            let (value, name): (f64, &'static std::ffi::CStr) = match m.metric_id {
                GPM_SM_UTIL => ((a.sm + b.sm) / 2.0 * 100.0, c"SM_UTIL"),
                GPM_SM_OCCUPANCY => ((a.occupancy + b.occupancy) / 2.0 * 100.0, c"SM_OCCUPANCY"),
                _ => {
                    m.nvml_return = code::NOT_SUPPORTED;
                    continue;
                }
            };
            m.nvml_return = code::SUCCESS;
            m.value = value;
            m.short_name = name.as_ptr();
            m.long_name = name.as_ptr();
            m.unit = c"%".as_ptr();
        }
        Ok(())
    })
}
