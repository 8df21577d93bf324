//! One GPU's identity, memory and process lists.

use crate::code;
use crate::entry::{DEVICES, MAX_GPUS, MIB, Ret, device_index, entry, gpu_of, write_str};
use crate::model::{self, Call};
use std::ffi::{c_char, c_uint, c_ulonglong, c_void};

#[repr(C)]
pub struct Memory {
    pub(crate) total: c_ulonglong,
    pub(crate) free: c_ulonglong,
    pub(crate) used: c_ulonglong,
}

#[repr(C)]
pub struct MemoryV2 {
    pub(crate) version: c_uint,
    pub(crate) total: c_ulonglong,
    pub(crate) reserved: c_ulonglong,
    pub(crate) free: c_ulonglong,
    pub(crate) used: c_ulonglong,
}

/// nvmlProcessInfo_t of the _v3 process calls.
#[repr(C)]
pub struct ProcessInfo {
    pub(crate) pid: c_uint,
    pub(crate) used_gpu_memory: c_ulonglong,
    pub(crate) gpu_instance_id: c_uint,
    pub(crate) compute_instance_id: c_uint,
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
