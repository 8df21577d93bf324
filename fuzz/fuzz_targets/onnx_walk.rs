//! Any bytes given as an ONNX --carma-model, through the fast shape walk
//! that runs in slurmstepd (as root) on the user's file: it must return,
//! never panic, overflow or allocate without bound. The seeds are small
//! weight-free exports of the paper's networks and the GPUMemNet models.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| carma_estimator::onnx::fuzz_fast_walk(data));
