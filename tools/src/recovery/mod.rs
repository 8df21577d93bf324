//! OOM recovery at job end: decide from the job's exit status and the tail
//! of its output whether it crashed for lack of GPU memory, and whether it
//! may be requeued.

pub mod asuser;
pub mod oom;
pub mod paths;

use carma_config::RecoveryMode;

/// What the epilog knows about a finished job.
#[derive(Debug, Clone)]
pub struct Facts {
    /// The job used CARMA (it has SPANK_CARMA_* variables).
    pub carma: bool,
    /// Raw wait status (SLURM_JOB_EXIT_CODE): 256 = exit 1; 15 = SIGTERM.
    pub status: i32,
    /// OOM recoveries the job had so far: carma-epilog's own verdicts,
    /// not Slurm's restart count (which also counts an admin's requeue,
    /// preemption and node failure).
    pub recoveries: u32,
    pub mode: RecoveryMode,
    pub max_recoveries: u32,
    /// The OOM line found in the output, if any.
    pub oom_line: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    NotCarma,
    Succeeded,
    /// Killed by a signal: cancelled, timed out, preempted. Never requeued.
    Signaled(i32),
    /// Failed, but not for lack of GPU memory.
    NotOom,
    /// OOM, but the job asked for no recovery.
    RecoveryOff,
    /// OOM and recovered `max` times already.
    LimitReached {
        max: u32,
    },
    Requeue,
}

/// Whether the job's output needs scanning at all.
pub fn needs_scan(carma: bool, status: i32) -> bool {
    carma && exited_nonzero(status)
}

fn exited_nonzero(status: i32) -> bool {
    status & 0x7f == 0 && (status >> 8) & 0xff != 0
}

pub fn decide(f: &Facts) -> Verdict {
    if !f.carma {
        return Verdict::NotCarma;
    }
    if f.status == 0 {
        return Verdict::Succeeded;
    }
    if !exited_nonzero(f.status) {
        return Verdict::Signaled(f.status & 0x7f);
    }
    if f.oom_line.is_none() {
        return Verdict::NotOom;
    }
    if f.mode == RecoveryMode::None {
        return Verdict::RecoveryOff;
    }
    if f.recoveries >= f.max_recoveries {
        return Verdict::LimitReached { max: f.max_recoveries };
    }
    Verdict::Requeue
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(status: i32, recoveries: u32, oom: bool) -> Facts {
        Facts {
            carma: true,
            status,
            recoveries,
            mode: RecoveryMode::Exclusive,
            max_recoveries: 1,
            oom_line: oom.then(|| "torch.OutOfMemoryError: CUDA out of memory.".into()),
        }
    }

    #[test]
    fn decisions() {
        assert_eq!(decide(&facts(256, 0, true)), Verdict::Requeue);
        assert_eq!(decide(&facts(256, 1, true)), Verdict::LimitReached { max: 1 });
        assert_eq!(decide(&facts(256, 0, false)), Verdict::NotOom);
        assert_eq!(decide(&facts(0, 0, true)), Verdict::Succeeded);
        assert_eq!(decide(&facts(15, 0, true)), Verdict::Signaled(15), "scancel: SIGTERM");
        assert_eq!(decide(&facts(9, 0, true)), Verdict::Signaled(9));
        assert_eq!(decide(&Facts { carma: false, ..facts(256, 0, true) }), Verdict::NotCarma);
        assert_eq!(decide(&Facts { mode: RecoveryMode::None, ..facts(256, 0, true) }), Verdict::RecoveryOff);
        assert_eq!(decide(&Facts { max_recoveries: 0, ..facts(256, 0, true) }), Verdict::LimitReached { max: 0 });
        assert!(needs_scan(true, 256) && !needs_scan(true, 15) && !needs_scan(false, 256) && !needs_scan(true, 0));
    }
}
