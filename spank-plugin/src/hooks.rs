//! The entry points Slurm looks up in the .so: the plugin's identity, and
//! every `extern "C"` hook as a one-liner into [`crate::guard`] +
//! [`crate::dispatch`]. The top floor: nothing in the plugin calls it.

#![allow(non_upper_case_globals)]

use crate::dispatch;
use crate::guard::guard;
use crate::spank::{Spank, sys};
use std::ffi::{CStr, c_char, c_int, c_uint};

/// Slurm identifies the plugin by this name; `srun` inside `sbatch` inherits
/// options through `SLURM_SPANK__SLURM_SPANK_OPTION_carma_*`: keep it stable.
#[unsafe(no_mangle)]
pub static plugin_name: [u8; 6] = *b"carma\0";
#[unsafe(no_mangle)]
pub static plugin_type: [u8; 6] = *b"spank\0";
/// Must equal the running Slurm's major.minor, taken from its headers.
#[unsafe(no_mangle)]
pub static plugin_version: c_uint = sys::SLURM_VERSION_NUMBER;

/// The Slurm series this plugin was built for, as text in the .so:
/// packaging/build-deb.sh reads it to refuse packaging a plugin built
/// against another release's headers.
#[used]
static SLURM_SERIES: &str = concat!("carma-slurm-series=", env!("CARMA_SLURM_SERIES"), ";");

/// 25.05+ reads this when a required plugin's `slurm_spank_init` fails:
/// ESPANK_JOB_FAILURE fails the job instead of draining the node (Slurm's
/// default, ESPANK_NODE_FAILURE). CARMA's init fails only in srun/sbatch
/// (a bad plugstack line, refused before anything is submitted); in
/// slurmstepd it logs and lets task_init fail CARMA steps, so this is the
/// floor under that rule, not the rule. Older releases never look it up.
#[cfg(slurm_init_failure_mode)]
#[unsafe(no_mangle)]
pub static slurm_spank_init_failure_mode: c_int = sys::slurm_err_t::ESPANK_JOB_FAILURE as c_int;

/// Plugin arguments from plugstack.conf as strings (non-UTF-8 is replaced).
fn args(ac: c_int, av: *mut *mut c_char) -> Vec<String> {
    if av.is_null() || ac <= 0 {
        return Vec::new();
    }
    (0..ac as usize)
        .map(|i| {
            // SAFETY: Slurm passes `ac` valid C strings in `av`.
            let p = unsafe { *av.add(i) };
            if p.is_null() {
                return String::new();
            }
            // SAFETY: non-null, and NUL-terminated as Slurm's strings are.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        })
        .collect()
}

extern "C" fn option_cb(val: c_int, optarg: *const c_char, remote: c_int) -> c_int {
    guard("", || {
        let value: &[u8] = if optarg.is_null() {
            b""
        } else {
            // SAFETY: Slurm passes the option's argument as a C string.
            unsafe { CStr::from_ptr(optarg) }.to_bytes()
        };
        dispatch::option(val, value, remote != 0)
    })
}

/// Defines an exported SPANK hook that runs `handler` behind the guard.
macro_rules! hook {
    ($symbol:ident, $label:literal, $handler:path) => {
        #[unsafe(no_mangle)]
        pub extern "C" fn $symbol(sp: sys::spank_t, ac: c_int, av: *mut *mut c_char) -> c_int {
            guard($label, || $handler(&Spank::new(sp, Some(option_cb)), &args(ac, av)))
        }
    };
}

hook!(slurm_spank_init, "init", dispatch::init);
hook!(slurm_spank_init_post_opt, "init_post_opt", dispatch::init_post_opt);
hook!(slurm_spank_task_init, "task_init", dispatch::task_init);
hook!(slurm_spank_task_post_fork, "task_post_fork", dispatch::task_post_fork);
hook!(slurm_spank_task_exit, "task_exit", dispatch::task_exit);
hook!(slurm_spank_exit, "exit", dispatch::exit);
hook!(slurm_spank_job_prolog, "job_prolog", dispatch::job_prolog);
hook!(slurm_spank_job_epilog, "job_epilog", dispatch::job_epilog);
