//! An MPS client's environment for a step that shares its GPU.

use crate::log;
use carma_config::Config;

/// The environment of an MPS client of `gpu`'s control daemon, fenced to
/// `fence_mib` (the device is 0 as the job sees it), and the decision's
/// note. Without a running daemon the step shares by time-slicing, and
/// the log says so.
pub(super) fn client(cfg: &Config, gpu: u32, fence_mib: u64, job: u32) -> (Vec<(&'static str, String)>, String) {
    let pipe = cfg.mps.pipe_dir.join(gpu.to_string());
    if !pipe.join("control").exists() {
        log::event(&format!(
            "job {job}: no MPS control daemon for GPU {gpu} ({} missing): the job shares the GPU by time-slicing, without a memory fence",
            pipe.join("control").display()
        ));
        return (Vec::new(), " sharing=timeslice (no MPS daemon)".into());
    }
    let env = vec![
        ("CUDA_MPS_PIPE_DIRECTORY", pipe.display().to_string()),
        ("CUDA_MPS_LOG_DIRECTORY", cfg.mps.log_dir.join(gpu.to_string()).display().to_string()),
        ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", format!("0={fence_mib}M")),
    ];
    (env, format!(" sharing=mps fence=0={fence_mib}M"))
}
