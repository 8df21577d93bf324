//! Hierarchical module listings from arbitrary text: a listing or one
//! error line naming the file, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Err(e) = carma_estimator::listing::parse(&text, "net.model") {
        let line = e.to_string();
        assert!(line.starts_with("net.model") && !line.chars().any(char::is_control), "{line:?}");
    }
});
