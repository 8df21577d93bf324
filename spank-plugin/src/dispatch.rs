//! Routes each SPANK hook to the module of the context it runs in.

use crate::ctx;
use crate::error::Error;
use crate::options;
use crate::spank::{Context, Spank, context};

pub fn init(sp: &Spank, args: &[String]) -> Result<(), Error> {
    let parsed = options::set_args(args);
    match context() {
        // srun/sbatch/salloc refuse to run: the admin sees the bad line at once.
        Context::Local | Context::Allocator => {
            parsed?;
            sp.register_options()
        }
        // In slurmstepd a failure would drain the node: log; CARMA steps then
        // fail in task_init with the reason (options::config reports it).
        Context::Remote => {
            if let Err(e) = parsed {
                crate::log::error(&format!("init: {e}"));
            }
            sp.register_options()
        }
        _ => Ok(()),
    }
}

pub fn option(id: i32, value: &[u8], _remote: bool) -> Result<(), Error> {
    options::set(id, value)
}

pub fn init_post_opt(sp: &Spank, _args: &[String]) -> Result<(), Error> {
    match context() {
        Context::Local | Context::Allocator => ctx::submit::init_post_opt(sp),
        // slurmstepd still runs as root here (user_init runs as the user),
        // so this is where the step is placed and the state written.
        Context::Remote => ctx::remote::place(sp),
        _ => Ok(()),
    }
}

pub fn task_init(sp: &Spank, _args: &[String]) -> Result<(), Error> {
    ctx::remote::task_init(sp)
}

pub fn task_post_fork(sp: &Spank, _args: &[String]) -> Result<(), Error> {
    match context() {
        Context::Remote => ctx::remote::task_post_fork(sp),
        _ => Ok(()),
    }
}

pub fn task_exit(sp: &Spank, _args: &[String]) -> Result<(), Error> {
    match context() {
        Context::Remote => ctx::remote::task_exit(sp),
        _ => Ok(()),
    }
}

pub fn exit(sp: &Spank, _args: &[String]) -> Result<(), Error> {
    match context() {
        Context::Remote => ctx::remote::exit(sp),
        _ => Ok(()),
    }
}

// A failure in the job prolog or epilog drains the node: a bad plugstack
// argument is logged there (slurmd's log and carma.log) and the job runs
// without CARMA's prolog/epilog work.
pub fn job_prolog(sp: &Spank, args: &[String]) -> Result<(), Error> {
    match options::set_args(args) {
        Ok(()) => ctx::job_script::prolog(sp),
        Err(e) => {
            ctx::job_script::bad_args("job_prolog", args, &e);
            Ok(())
        }
    }
}

pub fn job_epilog(sp: &Spank, args: &[String]) -> Result<(), Error> {
    match options::set_args(args) {
        Ok(()) => ctx::job_script::epilog(sp),
        Err(e) => {
            ctx::job_script::bad_args("job_epilog", args, &e);
            Ok(())
        }
    }
}
