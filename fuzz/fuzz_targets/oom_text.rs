//! Job output (written by users) through the OOM matcher and the parser of
//! PyTorch's "Tried to allocate" message: never a panic.
#![no_main]
use carma_prolog::oom::{find_oom, needed_mib};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let patterns = carma_config::Config::default().oom_patterns;
    if let Some(line) = find_oom(&text, &patterns) {
        assert!(patterns.iter().any(|p| line.contains(p.as_str())));
        let _ = needed_mib(line);
    }
    let _ = needed_mib(&text);
});
