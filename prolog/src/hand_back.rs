//! A job slurmstepd handed back (no GPU fitted on its node, `no_fit:
//! hand_back`) requeued away from that node. Whether it may be is judged
//! from Slurm's fields only (squeue `%x;%n;%P`, node names from `sinfo`
//! and `scontrol show hostnames`), never from text the job's user wrote.

use crate::helper::append_to_job_output;
use crate::job_env::env;
use crate::slurm::{FollowUp, prompt_later, scontrol, slurm_output, slurm_output_by};
use carma_config::Config;
use carma_placement::admin_comment::{self, JobRef};
use carma_placement::command::SQUEUE_LOCAL;
use carma_placement::jobfiles;
use std::path::Path;
use std::time::{Duration, Instant};

/// squeue's format for [`JobPlace::parse`]: excluded nodes, required
/// nodes, partitions. None of them can hold `;` (slurm.conf names). A job
/// that has run shows the partition it ran in only: one submitted to
/// several is judged by that one.
pub const SQUEUE_FORMAT: &str = "%x;%n;%P";

/// sinfo's format (with `-N`) for [`usable_gpu_nodes`]: name, state, GRES.
pub const SINFO_FORMAT: &str = "%N|%t|%G";

/// Where slurmctld may run the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobPlace {
    /// Excluded nodes as a hostlist (`node[1-3]`); empty for none.
    pub excluded: String,
    /// Nodes the job requires (`-w`); empty for none.
    pub required: String,
    /// Its partitions, comma-separated.
    pub partitions: String,
}

impl JobPlace {
    /// One line of [`SQUEUE_FORMAT`]. More than one line is a
    /// heterogeneous job (squeue lists every component), which is refused:
    /// an update of its leader would change every component.
    pub fn parse(text: &str) -> Result<JobPlace, String> {
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let [line] = lines.as_slice() else {
            return Err(match lines.len() {
                0 => "squeue does not know the job".into(),
                n => format!("squeue lists {n} components: a heterogeneous job is not handed back"),
            });
        };
        let f: Vec<&str> = line.split(';').map(str::trim).collect();
        let [excluded, required, partitions] = f.as_slice() else {
            return Err(format!("squeue answered '{line}', not three fields"));
        };
        let unset = |s: &str| if s == "(null)" { String::new() } else { s.to_string() };
        if unset(partitions).is_empty() {
            return Err("squeue named no partition".into());
        }
        Ok(JobPlace { excluded: unset(excluded), required: unset(required), partitions: unset(partitions) })
    }

    /// The excluded nodes with `node` added, as `ExcNodeList=` takes them.
    pub fn excluding(&self, node: &str) -> String {
        if self.excluded.is_empty() { node.to_string() } else { format!("{},{node}", self.excluded) }
    }

    /// Why the job must not be handed back from `node`: it requires nodes
    /// (an exclusion would leave it pending for ever), or no node of its
    /// partitions (`partition_nodes`) is left outside `excluded` (its
    /// exclusions with `node`, expanded).
    pub fn refusal(&self, node: &str, partition_nodes: &[String], excluded: &[String]) -> Option<String> {
        if !self.required.is_empty() {
            return Some(format!("it requires nodes {} (-w)", self.required));
        }
        let left = partition_nodes.iter().any(|n| n != node && !excluded.contains(n));
        (!left).then(|| format!("no node of partition(s) {} is left once {node} is excluded", self.partitions))
    }
}

/// The nodes of [`SINFO_FORMAT`] lines that could run the job: with GPUs
/// (gpu or shard GRES) and in a state slurmctld schedules on (not down,
/// drained, failed, future, or not responding: a `*` after the state).
/// Features and reservations are not weighed: the bound still holds.
pub fn usable_gpu_nodes(text: &str) -> Vec<String> {
    const UNUSABLE: [&str; 9] = ["down", "drain", "drng", "fail", "futr", "future", "maint", "inval", "unk"];
    let usable = |line: &&str| {
        let mut f = line.split('|').map(str::trim);
        let (_, state, gres) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
        let gpus = gres.split(',').any(|g| g.starts_with("gpu") || g.starts_with("shard"));
        gpus && !state.ends_with('*') && !UNUSABLE.iter().any(|u| state.starts_with(u))
    };
    names(&text.lines().filter(usable).filter_map(|l| l.split('|').next()).collect::<Vec<_>>().join("\n"))
}

/// Node names, one per line (`sinfo -N -o %N`, `scontrol show hostnames`).
pub fn names(text: &str) -> Vec<String> {
    let mut v: Vec<String> = text.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect();
    v.sort();
    v.dedup();
    v
}

/// A hand-back's Slurm calls before its requeue, and again those after it
/// (the requeue, a timed-out requeue's check and the release have
/// SCONTROL_TIMEOUT each; with the output scans and write and the stale-file sweep,
/// about 95 s at worst).
const HAND_BACK_TIMEOUT: Duration = Duration::from_secs(20);

/// Requeues a job slurmstepd handed back (no GPU fitted here) to run on
/// another node: this node joins its excluded nodes, counted in its
/// AdminComment, wherever it runs next. Past `max_hand_backs` since it last paused, or
/// with no other node to go to, it pauses instead: requeued to start no
/// sooner than `hand_back_pause` from now, on any node its own exclusions
/// allow (CARMA's are lifted), its count started again; with a pause of 0
/// it fails, with the reason in its output. A job the cluster has no room
/// for now thus waits in Slurm's queue, not in slurmstepd, and does not
/// fail for want of a GPU while another node may have room. It is requeued
/// held and released only once its exclusions and count are in slurmctld,
/// so neither a short requeue delay nor a failed update lets it start here
/// again or past the bound; without Slurm's answers it is not requeued at all.
pub fn hand_back(
    cfg: &Config,
    job: &str,
    job_no: u32,
    reason: &str,
    status: i32,
    restart: Option<u32>,
    log: &dyn Fn(&str),
) {
    let bin = cfg.slurm_bin_dir.as_deref();
    let node = env("SLURMD_NODENAME");
    let tell = |msg: &str| {
        log(msg);
        append_to_job_output(msg, log);
    };
    // A job cancelled while its step waited ends with status 0, which the
    // caller never hands back; one killed by a signal is not requeued either.
    if status & 0x7f != 0 {
        return log(&format!("job {job} ended by signal {}: not handed back", status & 0x7f));
    }
    if node.is_empty() {
        return tell(&format!("carma: job {job} was not handed back: slurmd named no node"));
    }
    let no = |why: &str| tell(&format!("carma: job {job} found no GPU on {node}; not handed back: {why}: {reason}"));
    // Bounds for all of Slurm's answers together (about a dozen calls):
    // the epilog ends well inside PrologEpilogTimeout. One for what is
    // asked, one for what is recorded after the requeue; the requeue and
    // the release have their own, so no read's slowness keeps a job from
    // being requeued or, once recorded, released. A recording cut short
    // leaves the job held, and says so, for an administrator.
    let deadline = Instant::now() + HAND_BACK_TIMEOUT;
    let Ok(job_ref) = JobRef::resolve(bin, job_no, deadline) else {
        return no("slurmctld did not say which job it is");
    };
    let this = HandBack { bin, job, job_ref, sel: job_ref.selector(), node: &node, restart };
    let sel = &this.sel;
    let asked = match this.ask(deadline) {
        Ok(r) => r,
        Err(e) => return no(&format!("slurmctld did not answer ({e})")),
    };
    let (count, max) = (jobfiles::hand_backs_in_comment(&asked.comment), cfg.max_hand_backs);
    let pauses = jobfiles::pauses_in_comment(&asked.comment);
    // The nodes CARMA excluded since the job last paused; the rest of its
    // exclusions are its own (or an administrator's) and stay.
    let carmas = jobfiles::carma_exclusions_in_comment(&asked.comment);
    let stay = if count >= max {
        Some(format!("handed back {count} time(s) since it last paused (max_hand_backs={max})"))
    } else {
        asked.place.refusal(&node, &asked.partition_nodes, &asked.excluded)
    };
    // Each pause of the same job twice the last, up to an hour: a job no
    // node has room for for long costs slurmctld a requeue less often.
    let pause = cfg.hand_back_pause.as_secs();
    let this_pause = (pause << pauses.min(6)).min(3600);
    let next = match &stay {
        None => Next {
            excluded: asked.place.excluding(&node),
            entry: jobfiles::hand_back_entry(count + 1, &node, &[carmas, vec![node.clone()]].concat(), pauses, reason),
            follow_up: FollowUp::Prompt,
        },
        Some(why) => {
            if let Some(fails) = may_not_pause(cfg, pauses) {
                return tell(&format!(
                    "carma: job {job} found no GPU on {node}; {why}; not handed back again: {fails}: {reason}"
                ));
            }
            Next {
                excluded: asked.without(&node, &carmas),
                entry: jobfiles::hand_back_entry(0, &node, &[], pauses + 1, reason),
                follow_up: FollowUp::Pause(this_pause),
            }
        }
    };
    // The requeue has its own bound: one cut short may still be applied.
    if let Err(e) = scontrol(bin, &["requeuehold", sel]) {
        if !e.contains("timed out") {
            return no(&format!("Slurm did not requeue it ({e})"));
        }
        if !this.requeued() {
            return tell(&format!(
                "carma: job {job} found no GPU on {node}; Slurm did not confirm its requeue ({e}): if it was requeued it is held (`scontrol release {sel}` runs it again): {reason}"
            ));
        }
    }
    // A pause is set before the job is released: the follow-up sets its
    // start, then releases it (or, not started, it is released here and
    // starts after Slurm's requeue delay).
    let pausing = matches!(next.follow_up, FollowUp::Pause(_));
    let release = || scontrol(bin, &["release", sel]);
    if let Err(e) = this.record(&asked, &next, log).and_then(|()| if pausing { Ok(()) } else { release() }) {
        return tell(&format!(
            "carma: job {job} was requeued held, but its hand-back could not be recorded in Slurm ({e}); an administrator's `scontrol release {sel}` runs it again"
        ));
    }
    if let Err(e) = prompt_later(bin, sel, next.follow_up) {
        log(&format!("job {job}: {e}; it starts after Slurm's requeue delay"));
        if pausing && let Err(e) = release() {
            return tell(&format!(
                "carma: job {job} was requeued held to pause, but was not released ({e}); an administrator's `scontrol release {sel}` runs it again"
            ));
        }
    }
    tell(&match stay {
        None => format!(
            "carma: job {job} found no GPU on {node}; handed back to Slurm, requeued to run on another node (hand-back {} of {max}): {reason}",
            count + 1
        ),
        Some(why) => format!(
            "carma: job {job} found no GPU on {node}; {why}: requeued to wait {this_pause}s (hand_back_pause, pause {}), then to run again on any node it may use: {reason}",
            pauses + 1
        ),
    });
}

/// Why a job that is to pause fails instead, if it does: pauses are off,
/// or it has paused `max_pauses` times (a job no node had room for in all
/// of them, or one refused for what no wait changes: a node's GPU its
/// driver lost, gres.conf's GPUs out of the readings' order).
fn may_not_pause(cfg: &Config, pauses: u32) -> Option<String> {
    if cfg.hand_back_pause.is_zero() {
        Some("hand_back_pause=0".to_string())
    } else {
        (pauses >= cfg.max_pauses).then(|| format!("it paused {pauses} time(s) (max_pauses={})", cfg.max_pauses))
    }
}

/// What the requeued job is to be: its exclusions, its AdminComment entry
/// and the follow-up that sets its start.
struct Next {
    excluded: String,
    entry: String,
    follow_up: FollowUp,
}

/// The job being handed back, as the steps of its hand-back need it.
struct HandBack<'a> {
    bin: Option<&'a Path>,
    job: &'a str,
    job_ref: JobRef,
    /// The job as Slurm's commands name it (`JOB` or `ARRAY_TASK`).
    sel: String,
    node: &'a str,
    restart: Option<u32>,
}

/// What slurmctld says: the job's AdminComment, where it may run, the
/// nodes of its partitions and its exclusions with this node, expanded.
struct Asked {
    comment: Vec<u8>,
    place: JobPlace,
    partition_nodes: Vec<String>,
    excluded: Vec<String>,
}

impl Asked {
    /// Its exclusions less `node` and the nodes CARMA excluded (`carmas`),
    /// as `ExcNodeList=` takes them (empty: none).
    fn without(&self, node: &str, carmas: &[String]) -> String {
        let own: Vec<&str> =
            self.excluded.iter().filter(|n| *n != node && !carmas.contains(n)).map(String::as_str).collect();
        own.join(",")
    }
}

impl HandBack<'_> {
    fn ask(&self, deadline: Instant) -> Result<Asked, String> {
        let slurm = |name: &str, args: &[&str]| slurm_output_by(self.bin, name, args, deadline);
        let comment = admin_comment::read_ref(self.bin, self.job_ref, deadline)?;
        let place = JobPlace::parse(&slurm(
            "squeue",
            &[SQUEUE_LOCAL, "-h", "-t", "all", "-j", &self.sel, "-o", SQUEUE_FORMAT],
        )?)?;
        let partition_nodes =
            usable_gpu_nodes(&slurm("sinfo", &["-h", "-N", "-p", &place.partitions, "-o", SINFO_FORMAT])?);
        let excluded = names(&slurm("scontrol", &["show", "hostnames", &place.excluding(self.node)])?);
        Ok(Asked { comment, place, partition_nodes, excluded })
    }

    /// Whether a requeue that timed out was applied: then the job's restart
    /// count is this run's plus one (its state reads COMPLETING until this
    /// epilog ends, requeued or not).
    fn requeued(&self) -> bool {
        let count =
            slurm_output(self.bin, "squeue", &[SQUEUE_LOCAL, "-h", "-t", "all", "-j", &self.sel, "-O", "restartcnt"]);
        self.restart.is_some_and(|r| count.is_ok_and(|c| c.trim().parse() == Ok(r + 1)))
    }

    /// Holds the requeued job, sets its exclusions and counts the hand-back
    /// (with an OOM recovery's verdict carried to its next run) in slurmctld.
    fn record(&self, asked: &Asked, next: &Next, log: &dyn Fn(&str)) -> Result<(), String> {
        let (bin, job, job_ref, sel) = (self.bin, self.job, self.job_ref, &self.sel);
        let deadline = Instant::now() + HAND_BACK_TIMEOUT;
        let scontrol = |args: &[&str]| slurm_output_by(bin, "scontrol", args, deadline).map(drop);
        // Verified: another writer's read-modify-write must not drop the count.
        let entry = |key: &str, text: &str| admin_comment::write_entry_ref(bin, job_ref, key, text, true, deadline);
        // An administrator's hold (requeuehold's is the user's, which the
        // user could release before the exclusion is in). An empty list
        // clears the exclusions (a pause with none of the job's own).
        let mut recorded = scontrol(&["hold", sel])
            .and_then(|()| scontrol(&["update", &format!("JobId={sel}"), &format!("ExcNodeList={}", next.excluded)]))
            .and_then(|()| entry(jobfiles::HAND_BACK_KEY, &next.entry));
        // An OOM recovery's verdict names the run it is for; the requeue
        // starts the next one, which it is for now.
        if self.restart.is_none() {
            log(&format!(
                "job {job}: no SLURM_JOB_RESTART_COUNT: an OOM recovery's verdict is not carried to its next run"
            ));
        }
        let carried = self.restart.and_then(|r| jobfiles::recovery_in_comment(&asked.comment, r).map(|v| (r, v)));
        if let Some((run, verdict)) = carried {
            recorded =
                recorded.and_then(|()| entry(jobfiles::RECOVERY_KEY, &jobfiles::recovery_entry(verdict, run + 1)));
        }
        recorded
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squeue_fields_and_what_they_refuse() {
        let p = JobPlace::parse("(null);(null);multi\n").unwrap();
        assert_eq!(p, JobPlace { excluded: String::new(), required: String::new(), partitions: "multi".into() });
        assert_eq!(p.excluding("n1"), "n1");
        let nodes = names("n1\nn2\nn1\n");
        assert_eq!(nodes, ["n1", "n2"]);
        assert_eq!(p.refusal("n1", &nodes, &names("n1")), None);
        let none_left = p.refusal("n2", &nodes, &names("n1\nn2")).unwrap();
        assert!(none_left.contains("no node of partition(s) multi"), "{none_left}");
        let q = JobPlace::parse("n[3-4];n1;a,b").unwrap();
        assert_eq!(q.excluding("n2"), "n[3-4],n2");
        assert_eq!(q.refusal("n1", &nodes, &[]).unwrap(), "it requires nodes n1 (-w)");
        assert!(JobPlace::parse("a;b;c\nd;e;f\n").unwrap_err().contains("heterogeneous"));
        assert!(JobPlace::parse("").is_err() && JobPlace::parse("a;b").is_err());
        assert_eq!(JobPlace::parse(";;(null)").unwrap_err(), "squeue named no partition");
    }

    /// A job to pause fails instead with pauses off, and at its
    /// max_pauses+1-th pause.
    #[test]
    fn a_job_to_pause_fails_with_pauses_off_or_over_their_bound() {
        let cfg = Config { max_pauses: 2, ..Config::default() };
        assert_eq!(may_not_pause(&cfg, 0), None);
        assert_eq!(may_not_pause(&cfg, 1), None);
        assert_eq!(may_not_pause(&cfg, 2).unwrap(), "it paused 2 time(s) (max_pauses=2)");
        let off = Config { hand_back_pause: std::time::Duration::ZERO, ..cfg };
        assert_eq!(may_not_pause(&off, 0).unwrap(), "hand_back_pause=0");
    }

    #[test]
    fn only_nodes_with_gpus_that_slurm_schedules_on_are_left() {
        let sinfo = "n1|mix|gpu:4,shard:32(S:0)\nn2|idle*|gpu:4\nn3|drain|gpu:4\nn4|idle|(null)\n\
                     n5|alloc|shard:8\nn6|down~|gpu:1\nn1|mix|gpu:4,shard:32(S:0)\nn7|idle|nic:1,gpu:a100:2\n";
        assert_eq!(usable_gpu_nodes(sinfo), ["n1", "n5", "n7"]);
    }
}
