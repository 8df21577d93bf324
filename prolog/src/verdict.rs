//! The verdict at job end: from the job's exit status and the tail of its
//! output, whether it crashed for lack of GPU memory and may be requeued;
//! and the whole-GPU request of its rerun.

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

/// The job's per-node TRES request (squeue `%b`: `gres/shard:1`, or
/// `gres:shard:1` before 23.11) with its shards asked as one whole GPU of
/// the same type: an exclusive rerun then holds a GPU Slurm counts as the
/// job's alone, and Slurm gives it one without shards allocated. `None`
/// where the job holds no shards, already asks for GPUs, or the request
/// is not one this rewrite understands (it is left as it was).
pub fn whole_gpu_for_shards(tres_per_node: &str) -> Option<String> {
    let mut out = Vec::new();
    let mut shards = 0;
    for item in tres_per_node.trim().split(',') {
        let (prefix, spec) = match (item.strip_prefix("gres/"), item.strip_prefix("gres:")) {
            (Some(s), _) => ("gres/", s),
            (_, Some(s)) => ("gres:", s),
            // Only GRES are rewritten around; anything else is left alone.
            _ => return None,
        };
        let mut parts: Vec<&str> = spec.split(':').collect();
        match parts.first() {
            Some(&"gpu") => return None,
            Some(&"shard") => {
                let count = parts.pop().filter(|c| !c.is_empty() && c.bytes().all(|b| b.is_ascii_digit()))?;
                if parts.len() > 2 || count == "0" {
                    return None;
                }
                shards += 1;
                parts[0] = "gpu";
                out.push(format!("{prefix}{}:1", parts.join(":")));
            }
            _ => out.push(item.to_string()),
        }
    }
    (shards == 1).then(|| out.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_become_one_whole_gpu_of_the_same_type() {
        assert_eq!(whole_gpu_for_shards("gres/shard:1").as_deref(), Some("gres/gpu:1"));
        assert_eq!(whole_gpu_for_shards("gres:shard:3\n").as_deref(), Some("gres:gpu:1"));
        assert_eq!(whole_gpu_for_shards("gres/shard:a100:2").as_deref(), Some("gres/gpu:a100:1"));
        assert_eq!(
            whole_gpu_for_shards("gres/shard:1,gres/carmamem:10").as_deref(),
            Some("gres/gpu:1,gres/carmamem:10")
        );
        for kept in [
            "gres/gpu:1",
            "gres/gpu:1,gres/shard:1",
            "",
            "gres/shard:x",
            "gres/shard:0",
            "gres/nic:1",
            "gres/shard:1,lic:2",
        ] {
            assert_eq!(whole_gpu_for_shards(kept), None, "{kept}");
        }
    }

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
