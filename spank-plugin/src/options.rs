//! Values of the `--carma-*` options as Slurm hands them to the option
//! callback (in every context), and the plugin's configuration.

use crate::error::Error;
use carma_config::{Config, JobRequest, OptionName, PluginArgs};
use once_cell::sync::OnceCell;
use std::path::Path;
use std::sync::Mutex;

static REQUEST: Mutex<JobRequest> = Mutex::new(JobRequest {
    policy: None,
    model: None,
    batch_size: None,
    mem_mib: None,
    gpus: None,
    recovery: None,
    seq_len: None,
    precision: None,
});
static ARGS: OnceCell<Result<PluginArgs, String>> = OnceCell::new();
static CONFIG: OnceCell<Config> = OnceCell::new();

/// Stores one option value; a bad value fails srun/sbatch before submission.
pub fn set(id: i32, value: &[u8]) -> Result<(), Error> {
    let option = OptionName::from_id(id).ok_or_else(|| Error::msg(format!("unknown option id {id}")))?;
    let mut req = REQUEST.lock().unwrap_or_else(|p| p.into_inner());
    req.set(option, value, &format!("--{}", option.flag()))?;
    Ok(())
}

/// The options given on the command line (or inherited by an inner srun).
pub fn request() -> JobRequest {
    REQUEST.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Parses and remembers the plugstack.conf arguments; unknown keys fail.
pub fn set_args(args: &[String]) -> Result<(), Error> {
    let parsed = ARGS.get_or_init(|| PluginArgs::parse(args).map_err(|e| e.to_string()));
    parsed.as_ref().map(|_| ()).map_err(|e| Error::msg(e.clone()))
}

/// carma.yaml, read once per process from `config=` or the default path.
pub fn config() -> Result<&'static Config, Error> {
    CONFIG.get_or_try_init(|| {
        let args = match ARGS.get() {
            Some(Err(e)) => return Err(Error::msg(e.clone())),
            Some(Ok(a)) => a.config.clone(),
            None => None,
        };
        let path = args.unwrap_or_else(|| carma_config::DEFAULT_CONFIG_PATH.into());
        let (config, note) = Config::load_noted(Path::new(&path))?;
        // Which file root acts on, in slurmd's log; at debug level where
        // it would reach the user's terminal (srun, sbatch).
        match crate::spank::context() {
            crate::spank::Context::Local | crate::spank::Context::Allocator => crate::log::debug(&note),
            _ => crate::log::info(&note),
        }
        Ok(config)
    })
}
