//! Any text given as --carma-model (torchsummary, module listing, Hugging
//! Face config.json, or none of them), through the same dispatch srun and
//! sbatch use: an estimate or one error line naming the file, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let batch = data.first().map(|b| u64::from(*b) + 1);
    match carma_estimator::estimate(data.to_vec(), "net.model", batch, &carma_estimator::Settings::default()) {
        Ok(e) => assert!(e.mib > 0),
        Err(e) => {
            let line = e.to_string();
            assert!(line.starts_with("net.model") && !line.chars().any(char::is_control), "{line:?}");
        }
    }
});
