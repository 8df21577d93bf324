//! srun (local) and sbatch/salloc (allocator): runs as the submitting user.
//! Resolves the request (command line over `CARMA_*` environment), rejects
//! bad values before anything is submitted, and passes the resolved values
//! to the job with `spank_job_control_setenv`.

use crate::error::{Context as _, Error};
use crate::log;
use crate::options;
use crate::spank::Spank;
use carma_config::OptionName;
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
    log::debug(&format!("request {req:?}"));
    Ok(())
}
