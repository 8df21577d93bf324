//! srun (local) and sbatch/salloc (allocator): runs as the submitting user.
//! Resolves the request (command line over `CARMA_*` environment), rejects
//! bad values before anything is submitted, estimates the job's GPU memory
//! from `--carma-model` (read here, with the user's own rights), and passes
//! the resolved values to the job with `spank_job_control_setenv`.

use crate::error::{Context as _, Error};
use crate::log;
use crate::options;
use crate::spank::Spank;
use carma_config::{Config, JobRequest, OptionName};
use std::os::unix::ffi::OsStringExt;

pub fn init_post_opt(sp: &Spank) -> Result<(), Error> {
    let mut req = options::request();
    req.fill_from_env(|name| std::env::var_os(name).map(OsStringExt::into_vec))?;
    if req.is_empty() {
        return Ok(());
    }
    for option in OptionName::ALL {
        if let Some(value) = req.get(option) {
            sp.job_control_setenv(option.env(), &value).context("passing options to the job")?;
        }
    }
    if req.model.is_some() && req.mem_mib.is_none() {
        let value = estimate(&req, options::config()?)?;
        // sbatch/salloc: SLURM_SPANK_CARMA_ESTIMATE in the job; srun: the
        // step's environment (job-control variables do not reach a direct
        // srun's step). An inner srun with its own model overrides both.
        sp.job_control_setenv(carma_config::ESTIMATE_ENV, &value).context("passing the estimate to the job")?;
        sp.process_setenv(carma_config::ESTIMATE_ENV, Some(&value)).context("passing the estimate to the job")?;
    } else {
        // Not inherited from an earlier submission made inside a job.
        sp.process_setenv(carma_config::ESTIMATE_ENV, None).context("clearing CARMA_ESTIMATE")?;
    }
    log::debug(&format!("request {req:?}"));
    Ok(())
}

/// One line on the user's terminal at `-v`; errors name the option.
fn estimate(req: &JobRequest, cfg: &Config) -> Result<String, Error> {
    let model = req.model.as_deref().unwrap_or(std::path::Path::new(""));
    let fail = |e: &dyn std::fmt::Display| Error::msg(format!("--carma-model: {e}"));
    let bytes = carma_estimator::read_bounded_bytes(model).map_err(|e| fail(&e))?;
    let settings = carma_estimator::Settings {
        seq_len: req.seq_len.map(u64::from),
        precision: req.precision.unwrap_or_default(),
        ..carma_estimator::Settings::from_config(&cfg.estimator)
    };
    let name = model.display().to_string();
    let signature = signature(&bytes, req);
    let est =
        std::panic::catch_unwind(|| carma_estimator::estimate(bytes, &name, req.batch_size.map(u64::from), &settings))
            .map_err(|_| fail(&format!("{name}: the estimator failed on this file (please report it)")))?
            .map_err(|e| fail(&e))?;
    log::info(&format!("estimate {} MiB per GPU ({}, {}): {}", est.mib, est.source, est.format, est.why));
    Ok(carma_config::format_estimate(est.mib, est.source, signature))
}

/// FNV-1a over the model file, the batch size, the sequence length and the
/// precision: the same job submitted again finds its observed peak in the
/// node's history.
fn signature(model: &[u8], req: &JobRequest) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let batch = req.batch_size.unwrap_or(0).to_le_bytes();
    let seq = req.seq_len.unwrap_or(0).to_le_bytes();
    let precision = req.precision.unwrap_or_default().name().as_bytes();
    for b in model.iter().chain(&batch).chain(&seq).chain(precision) {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}
