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
    let settings = carma_estimator::Settings::for_job(&cfg.estimator, req);
    let name = model.display().to_string();
    let signature = signature(&bytes, req);
    let est =
        std::panic::catch_unwind(|| carma_estimator::estimate(bytes, &name, req.batch_size.map(u64::from), &settings))
            .map_err(|_| fail(&format!("{name}: the estimator failed on this file (please report it)")))?
            .map_err(|e| fail(&e))?;
    log::info(&format!("estimate {} MiB per GPU ({}, {}): {}", est.mib, est.source, est.format, est.why));
    // GPUMemNet's bins have no fixed part to replace.
    let runtime = (est.source != "gpumemnet").then_some(est.parts.runtime_mib);
    Ok(carma_config::format_estimate(est.mib, est.source, signature, runtime))
}

/// FNV-1a over the model file and the batch size, then the sequence length
/// and precision where given (so a job that names neither keeps the
/// signature earlier versions gave it): the same job submitted again finds
/// its observed peak in the node's history.
fn signature(model: &[u8], req: &JobRequest) -> u64 {
    let batch = req.batch_size.unwrap_or(0).to_le_bytes();
    let seq = req.seq_len.map(u32::to_le_bytes);
    let precision = req.precision.map(|p| p.name().as_bytes());
    let extra = seq.iter().flatten().chain(precision.into_iter().flatten());
    carma_config::fnv1a(model.iter().chain(&batch).chain(extra))
}

#[cfg(test)]
mod tests {
    use super::signature;
    use carma_config::{JobRequest, OptionName};

    /// FNV-1a over the model file and the batch size: the signature before
    /// --carma-seq-len and --carma-precision existed.
    fn before(model: &[u8], batch: u32) -> u64 {
        model
            .iter()
            .chain(&batch.to_le_bytes())
            .fold(0xcbf2_9ce4_8422_2325, |h: u64, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
    }

    #[test]
    fn a_job_without_the_new_options_keeps_its_history_signature() {
        let mut req = JobRequest::default();
        req.set(OptionName::BatchSize, b"64", "--carma-batch-size").unwrap();
        assert_eq!(signature(b"net", &req), before(b"net", 64));
        let plain = signature(b"net", &req);
        req.set(OptionName::SeqLen, b"2048", "--carma-seq-len").unwrap();
        let with_seq = signature(b"net", &req);
        req.set(OptionName::Precision, b"bf16", "--carma-precision").unwrap();
        let with_both = signature(b"net", &req);
        assert!(plain != with_seq && with_seq != with_both && plain != with_both);
    }
}
