//! carma.yaml from arbitrary bytes: an error line naming the file, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Err(e) = carma_config::Config::parse(text, Path::new("/etc/slurm/carma.yaml")) {
            let line = e.to_string();
            assert!(!line.contains('\n'), "multi-line error: {line:?}");
            assert!(line.starts_with("config /etc/slurm/carma.yaml"));
        }
    }
});
