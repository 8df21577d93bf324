//! torchsummary tables from arbitrary text: a layer list or one error line
//! naming the file, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match carma_estimator::torchsummary::parse(&text, "net.model") {
        Ok(n) => assert!(!n.layers.is_empty()),
        Err(e) => {
            let line = e.to_string();
            assert!(line.starts_with("net.model") && !line.chars().any(char::is_control), "{line:?}");
        }
    }
});
