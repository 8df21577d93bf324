//! carma-epilog: Slurm's node Epilog (slurm.conf `Epilog=`), run as root
//! once per job at its end. For a CARMA job that exited with a non-zero
//! status it reads the tail of the job's stderr/stdout as the job's user,
//! looks for a GPU out-of-memory crash and requeues the job (bounded by
//! recovery.max_recoveries) so that its next run gets GPU(s) of its own.
//!
//! It always exits 0: a failing epilog drains the node. Everything it
//! decides goes to syslog, carma.yaml's log_file and stderr.
#![forbid(unsafe_code)]

use carma_config::Config;
use carma_placement::eventlog;
use carma_prolog::job_env::env;
use carma_prolog::{epilog, helper, slurm};
use std::ffi::OsString;
use std::path::Path;

fn main() {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    // Helper modes, run as the job's user by the epilog itself.
    match args.first().and_then(|a| a.to_str()) {
        Some("--as-user-read-tail") => std::process::exit(helper::read_tail(&args[1..])),
        Some("--as-user-append") => std::process::exit(helper::append(&args[1..])),
        Some("--prompt-restart") => std::process::exit(slurm::prompt_restart(&args[1..])),
        _ => {}
    }
    let config_path = args
        .iter()
        .filter_map(|a| a.to_str())
        .find_map(|a| a.strip_prefix("--config="))
        .unwrap_or(carma_config::DEFAULT_CONFIG_PATH)
        .to_string();
    let log = |cfg: Option<&Config>, msg: &str| {
        eprintln!("carma-epilog: {msg}");
        eventlog::record(cfg.and_then(|c| c.log_file.as_deref()), msg);
    };
    match Config::load(Path::new(&config_path)) {
        Ok(cfg) => {
            if let Err(e) = epilog::run(&cfg, &|m| log(Some(&cfg), m)) {
                log(Some(&cfg), &format!("job {}: {e}", env("SLURM_JOB_ID")));
            }
        }
        Err(e) => log(None, &format!("{e}; OOM recovery is off until it is fixed")),
    }
    std::process::exit(0);
}
