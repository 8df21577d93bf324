//! Generates SPANK bindings from the installed <slurm/spank.h> and exposes
//! the installed Slurm's version number, which the plugin must export as
//! `plugin_version` (Slurm refuses any other major.minor).

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=spank-plugin/wrapper.h");
    println!("cargo:rerun-if-changed=/usr/include/slurm/spank.h");
    println!("cargo:rerun-if-changed=/usr/include/slurm/slurm_version.h");
    println!("cargo:rerun-if-changed=/usr/include/slurm/slurm.h");
    // Only unit tests link libslurmfull (for the spank_* symbols); the
    // released .so resolves them from the host process (srun, slurmstepd...).
    println!("cargo:rustc-link-search=native=/usr/lib/x86_64-linux-gnu/slurm-wlm");

    let bindings = bindgen::Builder::default()
        .header("spank-plugin/wrapper.h")
        .allowlist_function("spank_.*")
        .allowlist_function("slurm_(info|error|verbose|debug|debug2|spank_log)")
        .allowlist_type("spank_.*")
        .allowlist_var("SLURM_VERSION_NUMBER")
        // The ids of Slurm's special steps (batch, extern, interactive).
        .allowlist_var("SLURM_(BATCH_SCRIPT|EXTERN_CONT|INTERACTIVE_STEP|PENDING_STEP)")
        .allowlist_var("ESPANK_.*")
        // ESPANK_SUCCESS and friends are #defines/ints: keep them constants.
        .constified_enum_module("spank_item|spank_context|slurm_err_t")
        .layout_tests(false)
        .generate()
        .expect("bindgen failed on <slurm/spank.h>: install libslurm-dev and libclang-dev");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("spank_sys.rs");
    bindings.write_to_file(&out).expect("cannot write bindings");
}
