//! Prolog/epilog context: a fresh process that slurmd runs as root with an
//! environment Slurm sets (users cannot forge it). A failure here would
//! drain the node, so problems are logged and never returned.

use crate::error::{Context as _, Error};
use crate::log;
use crate::options;
use crate::spank::Spank;
use carma_placement::{Placer, jobfiles};

fn job_id() -> Option<u32> {
    std::env::var("SLURM_JOB_ID").ok()?.parse().ok()
}

/// Parses Slurm's GPU index list ("0,1", "0-2,5").
pub fn parse_gpu_list(text: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in text.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 1024 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    Some(out)
}

fn never_fail(what: &str, body: impl FnOnce() -> Result<(), Error>) -> Result<(), Error> {
    if let Err(e) = body() {
        let msg = format!("{what}: {e} (the job continues; the node is not drained)");
        log::error(&msg);
        // slurmd logs prolog errors only at debug level: keep them in CARMA's log.
        let log_file = options::config().ok().and_then(|c| c.log_file.clone());
        carma_placement::eventlog::record(log_file.as_deref(), &msg);
    }
    Ok(())
}

/// A bad plugstack.conf argument: one line in slurmd's log and in the
/// carma.log that the `config=` argument (or the default) names, if that
/// configuration loads; never an error, which would drain the node.
pub fn bad_args(what: &str, args: &[String], e: &Error) {
    let msg =
        format!("{what}: plugstack.conf: {e}; CARMA's {what} is skipped until it is fixed (the node is not drained)");
    log::error(&msg);
    let path = args.iter().find_map(|a| a.strip_prefix("config=")).unwrap_or(carma_config::DEFAULT_CONFIG_PATH);
    let log_file = carma_config::Config::load(std::path::Path::new(path)).ok().and_then(|c| c.log_file);
    carma_placement::eventlog::record(log_file.as_deref(), &msg);
}

/// Records the GPUs Slurm allocated to the job (gres/gpu, or its shards'
/// GPU) as held whole, until a step shows that it shares them (shards or
/// CARMA), and as the proof that the job holds a GPU Slurm accounts for.
pub fn prolog(_sp: &Spank) -> Result<(), Error> {
    never_fail("job_prolog", || {
        let Some(job) = job_id() else { return Ok(()) };
        let gpus = job_gpus().unwrap_or_default();
        if gpus.is_empty() {
            return Ok(());
        }
        let cfg = options::config()?;
        log::set_log_file(cfg.log_file.clone());
        // Opening the placer also creates and checks the state directory.
        let placer = Placer::from_config(cfg, log::event).context("placement")?;
        // What slurmstepd checks before it places a CARMA step: the job
        // holds a GPU Slurm accounts for (resolve::UNACCOUNTED).
        jobfiles::write_gpus(&cfg.state_dir, job, &gpus).context("recording the job's Slurm GPUs")?;
        jobs_changed(cfg, job);
        let recorded = placer.record_whole(job, &gpus).context("placement");
        // The rerun's verdict whatever became of the record.
        recovery_from_admin_comment(cfg, job).and(recorded)
    })
}

/// A rerun of a requeued job: carma-epilog's verdict on the run before it
/// (an OOM, so this run is a recovery) is in the job's AdminComment, for
/// the node slurmctld picked, which need not be the one that crashed. The
/// verdict there names the run it is for; where it names another (an
/// admin's requeue, a preemption, a node failure since), a verdict left
/// here by an older run is stale and goes. Slurm's restart count comes from
/// slurmd's environment. Two bounded squeue calls, for reruns only.
fn recovery_from_admin_comment(cfg: &carma_config::Config, job: u32) -> Result<(), Error> {
    let restart: u32 = std::env::var("SLURM_JOB_RESTART_COUNT").ok().and_then(|c| c.parse().ok()).unwrap_or(0);
    if restart == 0 {
        return Ok(());
    }
    // Whatever AdminComment says (or if it cannot be read), a verdict here
    // for another run is stale.
    if jobfiles::forget_recovery_unless_for(&cfg.state_dir, job, restart) {
        log::event(&format!("job {job}: an earlier run's recovery verdict here was forgotten (this is run {restart})"));
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let comment = carma_placement::admin_comment::read(cfg.slurm_bin_dir.as_deref(), job, deadline)
        .map_err(|e| Error::msg(format!("job {job}: recovery verdict not read from AdminComment: {e}")))?;
    if let Some(r) = jobfiles::recovery_in_comment(&comment, restart) {
        jobfiles::write_recovery(&cfg.state_dir, job, r, restart).context("recording the job's recovery")?;
        log::event(&format!("job {job}: run {restart} recovers from an OOM ({}, recovery {})", r.mode.name(), r.count));
    }
    Ok(())
}

/// The job's GPUs as slurmd's prolog and epilog environment names them.
fn job_gpus() -> Option<Vec<u32>> {
    std::env::var("SLURM_JOB_GPUS").ok().and_then(|l| parse_gpu_list(&l))
}

/// Marks that a job started or ended here, for carma-monitor's admission
/// count; a failure costs only that count's freshness.
fn jobs_changed(cfg: &carma_config::Config, job: u32) {
    if let Err(e) = jobfiles::touch_jobs_changed(&cfg.state_dir) {
        log::error(&format!("job {job}: cannot mark the node's jobs changed in {}: {e}", cfg.state_dir.display()));
    }
}

/// Releases whatever the job still holds on this node.
pub fn epilog(_sp: &Spank) -> Result<(), Error> {
    never_fail("job_epilog", || {
        let Some(job) = job_id() else { return Ok(()) };
        let cfg = options::config()?;
        log::set_log_file(cfg.log_file.clone());
        // As the prolog: only a job with GPUs can have held admission memory.
        if job_gpus().is_some_and(|g| !g.is_empty()) {
            jobs_changed(cfg, job);
        }
        if let Some(r) = Placer::from_config(cfg, log::event).context("release")?.release_job(job).context("release")? {
            log::event(&format!("job {job} ended: released gpu_indices={}", carma_placement::index_list(&r.gpus)));
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::parse_gpu_list;

    #[test]
    fn gpu_lists() {
        assert_eq!(parse_gpu_list("0,1"), Some(vec![0, 1]));
        assert_eq!(parse_gpu_list("0-2,5"), Some(vec![0, 1, 2, 5]));
        assert_eq!(parse_gpu_list(""), Some(vec![]));
        assert_eq!(parse_gpu_list("a"), None);
        assert_eq!(parse_gpu_list("3-1"), None);
        assert_eq!(parse_gpu_list("0-4000000000"), None);
    }
}
