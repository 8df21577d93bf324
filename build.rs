//! Generates SPANK bindings from one Slurm release's <slurm/spank.h> and
//! exposes that release's version number, which the plugin must export as
//! `plugin_version` (Slurm refuses any other major.minor).
//!
//! Where Slurm is, in this order (the first that holds `slurm/spank.h`):
//! - `CARMA_SLURM_INCLUDE`: the include directory holding one release's
//!   `slurm/` headers (packaging/build-plugin.sh builds one plugin per
//!   series this way);
//! - `SLURM_PREFIX`: the prefix Slurm was installed under (`/opt/slurm`,
//!   SchedMD's `./configure --prefix`): `include/` and `lib{64,}/slurm/`;
//! - pkg-config's `slurm` (SchedMD's slurm-devel ships slurm.pc);
//! - `/usr/include` (any distribution's Slurm development package).
//!
//! Only `slurm/` is taken from the include directory, through a directory
//! holding nothing but a link to it: a foreign /usr/include would mix two
//! glibc's headers into the build. Only the unit tests link libslurmfull
//! (for the spank_* symbols), found the same way, with the usual system
//! places (RPM's `/usr/lib64/slurm`, Debian's multiarch `slurm-wlm`) last.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=spank-plugin/wrapper.h");
    for var in ["CARMA_SLURM_INCLUDE", "SLURM_PREFIX", "PKG_CONFIG_PATH"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo::rustc-check-cfg=cfg(slurm_init_failure_mode)");
    let prefix = env::var_os("SLURM_PREFIX").filter(|p| !p.is_empty()).map(PathBuf::from);
    let include = include_dir(prefix.as_deref());
    let slurm = include.join("slurm");
    for h in ["spank.h", "slurm_version.h", "slurm.h", "slurm_errno.h"] {
        println!("cargo:rerun-if-changed={}", slurm.join(h).display());
    }
    let spank_h = fs::read_to_string(slurm.join("spank.h")).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}; install Slurm's development headers (libslurm-dev, slurm-devel) \
             or set SLURM_PREFIX to the prefix Slurm was installed under",
            slurm.join("spank.h").display()
        )
    });
    let version_h = fs::read_to_string(slurm.join("slurm_version.h")).unwrap_or_default();
    let series = series_of(&version_h).unwrap_or_else(|| panic!("no SLURM_VERSION_NUMBER in {}", slurm.display()));
    println!("cargo:rustc-env=CARMA_SLURM_SERIES={series}");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    // Only unit tests link libslurmfull (for the spank_* symbols); the
    // released .so resolves them from the host process (srun, slurmstepd...).
    // A link to it from the build's own directory: cargo puts that (and
    // not a directory outside the target) on the tests' library path.
    let lib_link = out.join("slurm-lib");
    let _ = fs::remove_dir_all(&lib_link);
    fs::create_dir_all(&lib_link).expect("cannot create the library directory");
    match lib_dirs(prefix.as_deref()).into_iter().find(|d| d.join("libslurmfull.so").is_file()) {
        Some(dir) => {
            println!("cargo:rerun-if-changed={}", dir.join("libslurmfull.so").display());
            std::os::unix::fs::symlink(dir.join("libslurmfull.so"), lib_link.join("libslurmfull.so"))
                .expect("cannot link libslurmfull.so");
        }
        None => println!(
            "cargo:warning=no libslurmfull.so found (SLURM_PREFIX/lib/slurm, pkg-config slurm, /usr/lib64/slurm, \
             Debian's slurm-wlm): the plugin builds, its unit tests will not link"
        ),
    }
    println!("cargo:rustc-link-search=native={}", lib_link.display());

    let only_slurm = out.join("slurm-include");
    link_only(&slurm, &only_slurm);

    let mut builder = bindgen::Builder::default()
        .header("spank-plugin/wrapper.h")
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

/// The include directory holding `slurm/spank.h` (see the module's doc).
fn include_dir(prefix: Option<&Path>) -> PathBuf {
    if let Some(dir) = env::var_os("CARMA_SLURM_INCLUDE").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(p) = prefix {
        return p.join("include");
    }
    pkg_config("includedir")
        .filter(|d| d.join("slurm/spank.h").is_file())
        .unwrap_or_else(|| PathBuf::from("/usr/include"))
}

/// Where libslurmfull.so may be, most specific first: an explicit prefix,
/// pkg-config, then where distributions put it.
fn lib_dirs(prefix: Option<&Path>) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(p) = prefix {
        for lib in ["lib64", "lib"] {
            dirs.push(p.join(lib).join("slurm"));
            dirs.push(p.join(lib));
        }
    }
    if let Some(lib) = pkg_config("libdir") {
        dirs.push(lib.join("slurm"));
        dirs.push(lib.join("slurm-wlm"));
        dirs.push(lib);
    }
    // Debian/Ubuntu: /usr/lib/<multiarch>/slurm-wlm (x86_64-linux-gnu...).
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let libc = env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    dirs.push(PathBuf::from(format!("/usr/lib/{arch}-linux-{libc}/slurm-wlm")));
    dirs.push(PathBuf::from("/usr/lib64/slurm"));
    dirs.push(PathBuf::from("/usr/lib/slurm"));
    dirs
}

/// A variable of pkg-config's `slurm` module, if pkg-config knows it.
fn pkg_config(var: &str) -> Option<PathBuf> {
    let out = Command::new("pkg-config").args([&format!("--variable={var}"), "slurm"]).output().ok()?;
    let value = String::from_utf8(out.stdout).ok()?;
    let value = value.trim();
    (out.status.success() && !value.is_empty()).then(|| PathBuf::from(value))
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
