//! Generates SPANK bindings from one Slurm release's <slurm/spank.h> and
//! exposes that release's version number, which the plugin must export as
//! `plugin_version` (Slurm refuses any other major.minor).
//!
//! `CARMA_SLURM_INCLUDE` names the include directory that holds the
//! release's `slurm/` headers (default `/usr/include`, the host's
//! libslurm-dev): one plugin is built per Slurm series, the rest of the
//! workspace once. Only `slurm/` is taken from there, through a directory
//! holding nothing but a link to it: a foreign /usr/include would mix two
//! glibc's headers into the build.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=spank/wrapper.h");
    println!("cargo:rerun-if-env-changed=CARMA_SLURM_INCLUDE");
    println!("cargo::rustc-check-cfg=cfg(slurm_init_failure_mode)");
    let include = PathBuf::from(env::var("CARMA_SLURM_INCLUDE").unwrap_or_else(|_| "/usr/include".into()));
    let slurm = include.join("slurm");
    for h in ["spank.h", "slurm_version.h", "slurm.h", "slurm_errno.h"] {
        println!("cargo:rerun-if-changed={}", slurm.join(h).display());
    }
    let spank_h = fs::read_to_string(slurm.join("spank.h")).unwrap_or_else(|e| {
        panic!("cannot read {}: {e}; install libslurm-dev or set CARMA_SLURM_INCLUDE", slurm.join("spank.h").display())
    });
    let version_h = fs::read_to_string(slurm.join("slurm_version.h")).unwrap_or_default();
    let series = series_of(&version_h).unwrap_or_else(|| panic!("no SLURM_VERSION_NUMBER in {}", slurm.display()));
    println!("cargo:rustc-env=CARMA_SLURM_SERIES={series}");
    // Only unit tests link libslurmfull (for the spank_* symbols); the
    // released .so resolves them from the host process (srun, slurmstepd...).
    println!("cargo:rustc-link-search=native=/usr/lib/x86_64-linux-gnu/slurm-wlm");

    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let only_slurm = out.join("slurm-include");
    link_only(&slurm, &only_slurm);

    let mut builder = bindgen::Builder::default()
        .header("spank/wrapper.h")
        .clang_arg(format!("-I{}", only_slurm.display()))
        .allowlist_function("spank_.*")
        .allowlist_function("slurm_(info|error|verbose|debug|debug2|spank_log)")
        .allowlist_type("spank_.*")
        .allowlist_var("SLURM_VERSION_NUMBER")
        // The ids of Slurm's special steps (batch, extern, interactive).
        .allowlist_var("SLURM_(BATCH_SCRIPT|EXTERN_CONT|INTERACTIVE_STEP|PENDING_STEP)")
        .allowlist_var("ESPANK_.*")
        // ESPANK_SUCCESS and friends are #defines/ints: keep them constants.
        .constified_enum_module("spank_item|spank_context|slurm_err_t")
        .layout_tests(false);
    // 25.05+: a plugin may say how a failed slurm_spank_init is taken
    // (ESPANK_JOB_FAILURE: fail the job, do not drain the node).
    if spank_h.contains("slurm_spank_init_failure_mode") {
        println!("cargo:rustc-cfg=slurm_init_failure_mode");
        builder = builder.allowlist_var("ESPANK_JOB_FAILURE").allowlist_type("slurm_err_t");
    }
    let bindings =
        builder.generate().expect("bindgen failed on <slurm/spank.h>: install libslurm-dev and libclang-dev");
    bindings.write_to_file(out.join("spank_sys.rs")).expect("cannot write bindings");
}

/// `dir/slurm` -> `headers`, and nothing else in `dir`.
fn link_only(headers: &Path, dir: &Path) {
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir).expect("cannot create the include directory");
    std::os::unix::fs::symlink(headers, dir.join("slurm")).expect("cannot link the Slurm headers");
}

/// "24.11" from `#define SLURM_VERSION_NUMBER 0x180b05`.
fn series_of(version_h: &str) -> Option<String> {
    let hex = version_h.lines().find_map(|l| l.strip_prefix("#define SLURM_VERSION_NUMBER 0x"))?;
    let n = u32::from_str_radix(hex.split_whitespace().next()?, 16).ok()?;
    Some(format!("{}.{:02}", n >> 16, (n >> 8) & 0xff))
}
