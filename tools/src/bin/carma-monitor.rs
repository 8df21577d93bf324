//! carma-monitor: the node's GPU monitor, a root daemon (systemd unit in
//! slurm-conf-examples/carma-monitor.service). It samples every GPU each
//! `monitor.interval` and publishes windowed readings in `state_dir` for
//! placement (with `monitor: {published: true}`) and `carma status`.
//!
//!   carma-monitor [--config /etc/slurm/carma.yaml] [--once]
#![deny(clippy::undocumented_unsafe_blocks)]

use carma_config::Config;
use carma_tools::args::Args;
use carma_tools::cli_log::log;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn main() {
    let result = (|| -> Result<(), String> {
        let a = Args::parse(std::env::args().skip(1), &["config"], &["once"])?;
        let cfg = Config::load(Path::new(a.get("config").unwrap_or(carma_config::DEFAULT_CONFIG_PATH)))
            .map_err(|e| e.to_string())?;
        carma_tools::cli_log::set_file(cfg.log_file.clone());
        // SAFETY: the handler only stores to an atomic.
        unsafe {
            libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
            libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        }
        carma_tools::monitor::run(&cfg, &STOP, a.has("once"), log)
    })();
    if let Err(e) = result {
        log(&format!("carma-monitor: {e}"));
        std::process::exit(1);
    }
}
