//! carma-monitor: the node's GPU monitor, a root daemon (systemd unit in
//! slurm-conf-examples/carma-monitor.service). It samples every GPU each
//! `monitor.interval` and publishes windowed readings in `state_dir` for
//! placement (with `monitor: {published: true}`) and `carma status`.
#![deny(clippy::undocumented_unsafe_blocks)]

use carma_tools::cli::ConfigArg;
use carma_tools::cli_log::log;
use std::sync::atomic::{AtomicBool, Ordering};

/// The node's GPU monitor: samples every GPU each `monitor.interval` and
/// publishes windowed readings in carma.yaml's `state_dir`.
#[derive(clap::Parser, Debug)]
#[command(name = "carma-monitor", version, help_expected = true, args_override_self = true)]
struct Cli {
    /// Sample once, publish, and exit
    #[arg(long)]
    once: bool,
    #[command(flatten)]
    config: ConfigArg,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn main() {
    let result = (|| -> Result<(), String> {
        let a = carma_tools::cli::parse::<Cli>()?;
        let cfg = a.config.load()?;
        // SAFETY: the handler only stores to an atomic.
        unsafe {
            libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
            libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        }
        carma_tools::monitor::run(&cfg, &STOP, a.once, log)
    })();
    if let Err(e) = result {
        log(&format!("carma-monitor: {e}"));
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[test]
    fn options_parse_as_before() {
        Cli::command().debug_assert();
        let a = Cli::try_parse_from(["carma-monitor"]).unwrap();
        assert!(!a.once);
        assert_eq!(a.config.path, std::path::PathBuf::from(carma_config::DEFAULT_CONFIG_PATH));
        let a = Cli::try_parse_from(["carma-monitor", "--config", "/n2/carma.yaml", "--once"]).unwrap();
        assert!(a.once);
        assert_eq!(a.config.path, std::path::PathBuf::from("/n2/carma.yaml"));
        let e = carma_tools::cli::one_line(&Cli::try_parse_from(["carma-monitor", "--onse"]).unwrap_err());
        assert!(e.contains("'--onse'") && e.contains("'--once'") && !e.contains('\n'), "{e}");
    }
}
