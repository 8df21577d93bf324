//! Slurm's SPANK interface as Rust: the bindings, a typed handle whose
//! methods return `Result`, and Slurm's logger. C return codes are turned
//! into errors in exactly one place: [`check`]. The bottom floor of the
//! plugin: it calls nothing of it ([`crate::hooks`], above every other
//! module, exports the entry points).

use crate::error::Error;
use carma_config::OptionName;
use std::ffi::{CStr, CString, c_char, c_int};

pub(crate) mod sys {
    #![allow(non_upper_case_globals, non_camel_case_types, non_snake_case, dead_code)]
    include!(concat!(env!("OUT_DIR"), "/spank_sys.rs"));
}

// Unit tests run outside Slurm: they take the spank_* symbols from the
// library every Slurm binary links. The released .so never links it.
#[cfg(test)]
#[link(name = "slurmfull")]
unsafe extern "C" {}

/// A step as Slurm names it (`scontrol`, `sacct`): `batch`, `extern`,
/// `interactive`, or its number.
pub fn step_name(id: u32) -> String {
    match id {
        sys::SLURM_BATCH_SCRIPT => "batch".into(),
        sys::SLURM_EXTERN_CONT => "extern".into(),
        sys::SLURM_INTERACTIVE_STEP => "interactive".into(),
        sys::SLURM_PENDING_STEP => "pending".into(),
        n => n.to_string(),
    }
}

pub fn is_batch_step(id: u32) -> bool {
    id == sys::SLURM_BATCH_SCRIPT
}

/// Where the plugin is running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Context {
    /// srun
    Local,
    /// slurmstepd
    Remote,
    /// sbatch, salloc
    Allocator,
    Slurmd,
    /// prolog/epilog
    JobScript,
    Unknown,
}

pub fn context() -> Context {
    use sys::spank_context::*;
    // SAFETY: spank_context takes no arguments and only reads global state.
    match unsafe { sys::spank_context() } {
        S_CTX_LOCAL => Context::Local,
        S_CTX_REMOTE => Context::Remote,
        S_CTX_ALLOCATOR => Context::Allocator,
        S_CTX_SLURMD => Context::Slurmd,
        S_CTX_JOB_SCRIPT => Context::JobScript,
        _ => Context::Unknown,
    }
}

/// Converts a SPANK return code into a `Result`: the one place that does.
fn check(rc: sys::spank_err_t, what: &str) -> Result<(), Error> {
    if rc == sys::ESPANK_SUCCESS {
        return Ok(());
    }
    // SAFETY: spank_strerror returns a static string for any code.
    let text = unsafe { CStr::from_ptr(sys::spank_strerror(rc)) }.to_string_lossy();
    Err(Error::msg(format!("{what}: {text}")))
}

fn cstring(s: &str, what: &str) -> Result<CString, Error> {
    CString::new(s).map_err(|_| Error::msg(format!("{what}: contains a NUL byte")))
}

/// Items of the job that the plugin reads.
#[derive(Debug, Clone, Copy)]
pub enum Item {
    JobId,
    StepId,
    JobUid,
    /// The task's pid (`pid_t*`, 32 bits): in task_post_fork.
    TaskPid,
    /// How many tasks of the step run on this node (`uint32_t*`).
    LocalTaskCount,
}

/// The handle Slurm passes to each hook.
pub struct Spank {
    raw: sys::spank_t,
    /// What Slurm calls with a `--carma-*` option's value.
    option_cb: sys::spank_opt_cb_f,
}

impl Spank {
    /// The handle Slurm passed a hook, and the option callback to register.
    pub(crate) fn new(raw: sys::spank_t, option_cb: sys::spank_opt_cb_f) -> Spank {
        Spank { raw, option_cb }
    }

    /// A 32-bit item of the job (ids are `uint32_t*`, uid/gid `uid_t*`).
    pub fn item_u32(&self, item: Item) -> Result<u32, Error> {
        use sys::spank_item::*;
        let code = match item {
            Item::JobId => S_JOB_ID,
            Item::StepId => S_JOB_STEPID,
            Item::JobUid => S_JOB_UID,
            Item::TaskPid => S_TASK_PID,
            Item::LocalTaskCount => S_JOB_LOCAL_TASK_COUNT,
        };
        let mut value: u32 = 0;
        // SAFETY: each of these items writes one 32-bit value through the pointer.
        let rc = unsafe { sys::spank_get_item(self.raw, code, &mut value as *mut u32) };
        check(rc, &format!("spank_get_item({item:?})"))?;
        Ok(value)
    }

    /// The step's command line (remote context). For a batch step Slurm
    /// gives the path of its own copy of the script in slurmd's spool.
    pub fn argv(&self) -> Result<Vec<Vec<u8>>, Error> {
        let mut argc: c_int = 0;
        let mut argv: *mut *mut c_char = std::ptr::null_mut();
        // SAFETY: S_JOB_ARGV writes an int and a char** through the pointers.
        let rc = unsafe {
            sys::spank_get_item(self.raw, sys::spank_item::S_JOB_ARGV, &mut argc as *mut c_int, &mut argv as *mut _)
        };
        check(rc, "spank_get_item(S_JOB_ARGV)")?;
        if argv.is_null() {
            return Ok(Vec::new());
        }
        let n = usize::try_from(argc).unwrap_or(0).min(4096);
        // SAFETY: Slurm's argv holds argc NUL-terminated strings, owned by
        // slurmstepd for the life of the step; we copy them out at once.
        let args = (0..n)
            .map(|i| unsafe { *argv.add(i) })
            .take_while(|p| !p.is_null())
            .map(|p| unsafe { CStr::from_ptr(p) }.to_bytes().to_vec())
            .collect();
        Ok(args)
    }

    /// A variable of the job's environment; `None` if unset.
    pub fn getenv(&self, name: &str) -> Result<Option<String>, Error> {
        let cname = cstring(name, "getenv")?;
        let mut buf = vec![0u8; 8192];
        // SAFETY: buf is writable for its full length, which we pass.
        let rc = unsafe { sys::spank_getenv(self.raw, cname.as_ptr(), buf.as_mut_ptr().cast(), buf.len() as c_int) };
        if rc == sys::slurm_err_t::ESPANK_ENV_NOEXIST {
            return Ok(None);
        }
        check(rc, &format!("getenv {name}"))?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        buf.truncate(end);
        String::from_utf8(buf).map(Some).map_err(|_| Error::msg(format!("getenv {name}: value is not UTF-8")))
    }

    /// Sets a variable in the job's (task's) environment.
    pub fn setenv(&self, name: &str, value: &str) -> Result<(), Error> {
        let (n, v) = (cstring(name, "setenv")?, cstring(value, "setenv")?);
        // SAFETY: both strings are NUL-terminated and outlive the call.
        let rc = unsafe { sys::spank_setenv(self.raw, n.as_ptr(), v.as_ptr(), 1) };
        check(rc, &format!("setenv {name}"))
    }

    /// Sets or (with `None`) removes a variable in this srun/sbatch
    /// process's own environment, which Slurm exports to the job (spank_setenv
    /// works only in remote context). srun and sbatch change their own
    /// environment the same way while processing options.
    pub fn process_setenv(&self, name: &str, value: Option<&str>) -> Result<(), Error> {
        let n = cstring(name, "setenv")?;
        let rc = match value {
            Some(value) => {
                let v = cstring(value, "setenv")?;
                // SAFETY: NUL-terminated strings; glibc copies them.
                unsafe { libc::setenv(n.as_ptr(), v.as_ptr(), 1) }
            }
            // SAFETY: as above.
            None => unsafe { libc::unsetenv(n.as_ptr()) },
        };
        if rc == 0 { Ok(()) } else { Err(Error::msg(format!("setenv {name}: {}", std::io::Error::last_os_error()))) }
    }

    /// Kills the task `pid` that slurmstepd forked and holds before exec
    /// (task_post_fork): it never runs, and the step fails as a task that
    /// died, which Slurm does not blame on the node (a failing
    /// task_post_fork of a batch step drains it on Slurm 22.05).
    pub fn kill_unstarted_task(&self, pid: u32) -> Result<(), Error> {
        let pid =
            libc::pid_t::try_from(pid).ok().filter(|p| *p > 0).ok_or_else(|| Error::msg("task pid out of range"))?;
        // SAFETY: kill(2) takes plain integers; `pid` is this slurmstepd's
        // child, blocked until every task_post_fork has returned, so it
        // cannot have been reaped and its pid reused.
        let rc = unsafe { libc::kill(pid, libc::SIGKILL) };
        if rc == 0 { Ok(()) } else { Err(Error::msg(format!("kill task {pid}: {}", std::io::Error::last_os_error()))) }
    }

    /// Passes a value from srun/sbatch to the job: it appears as
    /// `SLURM_SPANK_<name>` in the job and `SPANK_<name>` in prolog/epilog.
    pub fn job_control_setenv(&self, name: &str, value: &str) -> Result<(), Error> {
        let (n, v) = (cstring(name, "job_control_setenv")?, cstring(value, "job_control_setenv")?);
        // SAFETY: both strings are NUL-terminated and outlive the call.
        let rc = unsafe { sys::spank_job_control_setenv(self.raw, n.as_ptr(), v.as_ptr(), 1) };
        check(rc, &format!("job_control_setenv {name}"))
    }

    /// Registers the `--carma-*` options (in init, every option context).
    pub fn register_options(&self) -> Result<(), Error> {
        for option in OptionName::ALL {
            // Slurm keeps the pointer for the life of the process: leak one
            // small struct per option, once per process.
            let leak = |s: &str| CString::new(s).unwrap_or_default().into_raw();
            let opt = Box::leak(Box::new(sys::spank_option {
                name: leak(option.flag()),
                arginfo: leak(option.arginfo()),
                usage: leak(option.usage()),
                has_arg: 1,
                val: option.id(),
                cb: self.option_cb,
            }));
            // SAFETY: opt points to a valid, never-freed spank_option.
            let rc = unsafe { sys::spank_option_register(self.raw, opt) };
            check(rc, &format!("register --{}", option.flag()))?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
pub enum LogLevel {
    Error,
    Info,
    Debug,
}

/// Logs one line through Slurm's logger (the message is never a format string).
pub fn slurm_log(level: LogLevel, msg: &str) {
    let clean: String = msg.chars().filter(|&c| c != '\0').collect();
    let Ok(c) = CString::new(clean) else { return };
    let fmt = c"%s".as_ptr();
    // SAFETY: "%s" with one valid C string argument.
    unsafe {
        match level {
            LogLevel::Error => sys::slurm_error(fmt, c.as_ptr()),
            LogLevel::Info => sys::slurm_info(fmt, c.as_ptr()),
            LogLevel::Debug => sys::slurm_debug(fmt, c.as_ptr()),
        }
    }
}

/// Writes `line` to this slurmstepd's stderr only if it can be written now
/// (poll with no wait): that descriptor is the batch job's stderr (Slurm's
/// job_log_init), which may be a FIFO or pipe nobody reads. One write of at
/// most PIPE_BUF bytes, so a pipe that polls writable takes it whole.
pub fn write_stderr_if_ready(line: &str) {
    let bytes = &line.as_bytes()[..line.len().min(libc::PIPE_BUF)];
    let mut p = libc::pollfd { fd: libc::STDERR_FILENO, events: libc::POLLOUT, revents: 0 };
    // SAFETY: one valid pollfd, count 1, no timeout.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    let broken = libc::POLLERR | libc::POLLHUP | libc::POLLNVAL;
    if n == 1 && p.revents & libc::POLLOUT != 0 && p.revents & broken == 0 {
        // SAFETY: the pointer and length are those of a live slice.
        let _ = unsafe { libc::write(libc::STDERR_FILENO, bytes.as_ptr().cast(), bytes.len()) };
    }
}
