//! --carma-* option values and plugstack arguments from arbitrary bytes:
//! accepted values round-trip, rejected ones give one printable line.
#![no_main]
use carma_config::{JobRequest, OptionName, PluginArgs};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, value)) = data.split_first() else { return };
    let option = OptionName::ALL[which as usize % OptionName::ALL.len()];
    let mut req = JobRequest::default();
    match req.set(option, value, "--carma-x") {
        Ok(()) => {
            // What travels to the job must be accepted again unchanged.
            let text = req.get(option).expect("stored");
            let mut again = JobRequest::default();
            again.set(option, text.as_bytes(), "SLURM_SPANK").expect("canonical value rejected");
            assert_eq!(again.get(option), Some(text));
        }
        Err(e) => {
            let line = e.to_string();
            assert!(!line.chars().any(char::is_control), "control characters in {line:?}");
            assert!(line.len() < 1000);
        }
    }
    if let Ok(text) = std::str::from_utf8(value) {
        let args: Vec<&str> = text.split(' ').collect();
        let _ = PluginArgs::parse(&args);
    }
});
