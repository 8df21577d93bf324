//! GPU Performance Monitoring (Hopper and newer): SM activity and
//! occupancy between two samples; not supported on the A100 profile.

use crate::code;
use crate::entry::{Ret, device_index, entry};
use crate::model::{self, Call};
use std::ffi::{c_char, c_uint, c_void};
use std::time::Instant;

const GPM_SUPPORT_VERSION: c_uint = 1;
const GPM_METRICS_GET_VERSION: c_uint = 1;
const GPM_METRIC_MAX: usize = 210;
const GPM_SM_UTIL: c_uint = 2;
const GPM_SM_OCCUPANCY: c_uint = 3;

#[repr(C)]
pub struct GpmSupport {
    pub(crate) version: c_uint,
    pub(crate) is_supported_device: c_uint,
}

#[repr(C)]
pub struct GpmMetric {
    pub(crate) metric_id: c_uint,
    pub(crate) nvml_return: c_uint,
    pub(crate) value: f64,
    pub(crate) short_name: *const c_char,
    pub(crate) long_name: *const c_char,
    pub(crate) unit: *const c_char,
}

#[repr(C)]
pub struct GpmMetricsGet {
    pub(crate) version: c_uint,
    pub(crate) num_metrics: c_uint,
    pub(crate) sample1: *mut GpmSample,
    pub(crate) sample2: *mut GpmSample,
    pub(crate) metrics: [GpmMetric; GPM_METRIC_MAX],
}

/// What one nvmlGpmSampleGet saw.
pub struct GpmSample {
    pub(crate) gpu: Option<usize>,
    pub(crate) at: Option<Instant>,
    pub(crate) sm: f64,
    pub(crate) occupancy: f64,
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
