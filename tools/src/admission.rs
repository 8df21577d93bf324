//! The node's admission count in slurmctld (docs/admission.md): the
//! count-only GRES `carmamem` of this node is kept at the GPU memory CARMA
//! could still promise here. slurmctld takes what it has allocated to the
//! node's jobs off that count again, so a running job's memory is held
//! twice, CARMA's promise and Slurm's allocation: a margin, kept on purpose
//! (a count of the promisable GiB plus Slurm's allocations failed 23 of 320
//! jobs of a burst where this one failed 2; docs/replay.md). Run by
//! carma-monitor; `scontrol` is run without a shell, with fixed arguments
//! and a time limit.

use carma_config::ADMISSION_GRES;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// How long a count set (or found right) stands while the node's
/// promisable GiB stay the same: slurmctld is asked again after it, to
/// undo an administrator's edit or a slurmctld restart's reset.
pub const RESYNC_EVERY: Duration = Duration::from_secs(300);
/// How old a job start or end mark must be for the read that follows it
/// to stand (one more read is made once it is): slurmctld has changed the
/// job's allocation before the prolog or epilog marks, and this second
/// read covers a slurmctld slow to show it.
pub const SETTLE: Duration = Duration::from_secs(30);

/// `scontrol show node -o`'s `Gres=` of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeGres {
    /// The configured list, as `scontrol update Gres=` takes it back.
    pub gres: String,
    /// The admission GRES's count now.
    pub count: u64,
}

/// Splits a GRES list at the commas outside parentheses
/// (`gpu:2(IDX:0-1),shard:(null):0(0/8,0/8)`).
fn entries(list: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in list.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&list[start..]);
    out.into_iter().filter(|e| !e.is_empty()).collect()
}

/// An entry without its trailing annotation (`gpu:4(S:0)` → `gpu:4`,
/// `gpu:(null):1(IDX:2)` → `gpu:(null):1`).
fn bare(entry: &str) -> &str {
    match entry.rfind('(') {
        Some(i) if entry.ends_with(')') => &entry[..i],
        _ => entry,
    }
}

/// The count of the admission GRES in a list, if it is there
/// (`carmamem:160`, `carmamem:(null):38`).
fn count_of(list: &str) -> Option<u64> {
    entries(list).into_iter().map(bare).find_map(|e| {
        let (name, rest) = e.split_once(':')?;
        (name == ADMISSION_GRES).then(|| rest.rsplit(':').next()?.parse().ok())?
    })
}

/// The node's GRES facts from `scontrol show node -o NAME`; `None` when it
/// has no admission GRES.
pub fn parse_node(text: &str) -> Option<NodeGres> {
    let field = |key: &str| text.split_whitespace().find_map(|w| w.strip_prefix(key));
    let gres = field("Gres=")?;
    let count = count_of(gres)?;
    let list: Vec<&str> = entries(gres).into_iter().map(bare).collect();
    Some(NodeGres { gres: list.join(","), count })
}

/// The node's list with the admission GRES's count set to `count` (the
/// update replaces the whole list: everything else stays as it was).
pub fn with_count(gres: &str, count: u64) -> String {
    entries(gres)
        .into_iter()
        .map(|e| match e.split_once(':') {
            Some((name, _)) if name == ADMISSION_GRES => format!("{ADMISSION_GRES}:{count}"),
            _ => e.to_string(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn scontrol(bin_dir: Option<&Path>, args: &[&str]) -> Result<String, String> {
    let prog = carma_placement::command::slurm_program(bin_dir, "scontrol");
    carma_placement::command::run(&prog, args, std::time::Duration::from_secs(10))
}

/// Keeps one node's admission count.
pub struct Admission {
    node: String,
    /// Where scontrol is (carma.yaml's `slurm_bin_dir`).
    bin_dir: Option<PathBuf>,
    /// The node has no admission GRES: said once, then nothing is done.
    off: bool,
    /// What the count was last found right for (the promisable GiB and the
    /// time of the node's last job start or end), when, and whether that
    /// mark was then younger than SETTLE.
    synced: Option<Synced>,
    /// The mark last seen, and when this monitor first saw it (its age is
    /// taken on the monotonic clock: a wall clock stepped back must not
    /// keep it young).
    mark_seen: Option<(Option<SystemTime>, Instant)>,
    /// RESYNC_EVERY and up to a minute more, differing per node: monitors
    /// restarted together (an upgrade) do not ask slurmctld together.
    resync: Duration,
}

#[derive(Debug, Clone, Copy)]
struct Synced {
    gib: u64,
    mark: Option<SystemTime>,
    at: Instant,
    young: bool,
}

impl Admission {
    pub fn new(node: String, bin_dir: Option<PathBuf>) -> Admission {
        // FNV-1a of the node's name (PIDs repeat on nodes booted alike).
        let spread =
            node.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
        let resync = RESYNC_EVERY + Duration::from_secs(spread % 60);
        Admission { node, bin_dir, off: false, synced: None, mark_seen: None, resync }
    }

    /// Sets the node's count to `free_gib`, if it differs. Returns the change made, as a log line. `jobs_changed`
    /// is when a job last started or ended here (`jobfiles::jobs_changed_at`).
    /// `scontrol show node` loads every node's record and the partitions
    /// (measured on 22.05 and 26.05): asked every interval by every node, it
    /// would cost slurmctld in the square of the cluster's size. So it is
    /// asked only when something may have moved: `free_gib` or the mark
    /// changed since the count was last found right, once more when a mark
    /// found young reaches SETTLE, after an update, and every `resync`. (The
    /// marks and SETTLE were for a count that added Slurm's allocations,
    /// which slurmctld changes around a job's prolog and epilog; the count
    /// no longer reads them, and the re-reads they cause may go: #42.)
    pub fn sync(&mut self, free_gib: u64, jobs_changed: Option<SystemTime>) -> Result<Option<String>, String> {
        self.sync_at(free_gib, jobs_changed, Instant::now())
    }

    /// [`Admission::sync`] at the monotonic time `now`.
    fn sync_at(
        &mut self,
        free_gib: u64,
        jobs_changed: Option<SystemTime>,
        now: Instant,
    ) -> Result<Option<String>, String> {
        if self.off {
            return Ok(None);
        }
        let seen = match self.mark_seen {
            Some((mark, at)) if mark == jobs_changed => at,
            _ => self.mark_seen.insert((jobs_changed, now)).1,
        };
        let young = jobs_changed.is_some() && now.saturating_duration_since(seen) < SETTLE;
        if self.synced.is_some_and(|s| {
            s.gib == free_gib
                && s.mark == jobs_changed
                && now.saturating_duration_since(s.at) < self.resync
                && (young || !s.young)
        }) {
            return Ok(None);
        }
        let change = self.set_count(free_gib)?;
        // Only a count found right stands: after an update the next check
        // reads again (an administrator's edit or a restart between).
        self.synced = change.is_none().then_some(Synced { gib: free_gib, mark: jobs_changed, at: now, young });
        Ok(change)
    }

    fn set_count(&mut self, free_gib: u64) -> Result<Option<String>, String> {
        let text = scontrol(self.bin_dir.as_deref(), &["show", "node", "-o", &self.node])?;
        let Some(now) = parse_node(&text) else {
            self.off = true;
            return Ok(Some(format!(
                "node {} has no {ADMISSION_GRES} GRES in Slurm: its admission count is not kept",
                self.node
            )));
        };
        // Slurm drops a GRES whose count is set to 0 from the node's list
        // (measured on 22.05), and this monitor would then find none: 1
        // GiB stands for none, less than any job asks (its headroom alone
        // is more with the default 2G).
        let want = free_gib.max(1);
        if want == now.count {
            return Ok(None);
        }
        let gres = format!("Gres={}", with_count(&now.gres, want));
        scontrol(self.bin_dir.as_deref(), &["update", &format!("NodeName={}", self.node), &gres])?;
        Ok(Some(format!(
            "node {} {ADMISSION_GRES} {} -> {want} (GiB promisable; slurmctld takes what it allocated here off it again)",
            self.node, now.count
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_count() {
        let text = "NodeName=vm Arch=x86_64 CoresPerSocket=1 Gres=gpu:4(S:0),shard:32(S:0),carmamem:160 \
                    NodeAddr=127.0.0.1 GresUsed=gpu:(null):1(IDX:2),shard:(null):3(1/8,2/8,0/8,0/8),carmamem:38 State=MIXED";
        let n = parse_node(text).unwrap();
        assert_eq!(n, NodeGres { gres: "gpu:4,shard:32,carmamem:160".into(), count: 160 });
        assert_eq!(with_count(&n.gres, 118), "gpu:4,shard:32,carmamem:118");
        assert_eq!(count_of("gpu:(null):0(IDX:N/A),carmamem:(null):12"), Some(12));
        assert_eq!(parse_node("NodeName=x Gres=gpu:4,shard:32 GresUsed=gpu:0"), None);
    }

    /// A Slurm under its own prefix: scontrol is run from `slurm_bin_dir`,
    /// which PATH does not reach.
    #[test]
    fn scontrol_runs_from_the_configured_directory() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("carma-admission-bin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let calls = dir.join("calls");
        // Slurm's count: 100 until updated.
        let count = dir.join("count");
        let script = format!(
            "#!/bin/sh\necho \"$*\" >>{calls}\nc=$(cat {count} 2>/dev/null || echo 100)\n\
             [ \"$1\" = show ] && echo \"NodeName=n1 Gres=gpu:4,carmamem:$c GresUsed=carmamem:(null):10\"\n\
             [ \"$1\" = update ] && echo \"${{3##*:}}\" >{count}\nexit 0\n",
            calls = calls.display(),
            count = count.display()
        );
        std::fs::write(dir.join("scontrol"), script).unwrap();
        std::fs::set_permissions(dir.join("scontrol"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut a = Admission::new("n1".into(), Some(dir.clone()));
        let change = a.sync(50, None).unwrap().unwrap();
        // The promisable GiB, whatever Slurm allocated (10 here): slurmctld
        // takes that off again.
        assert!(change.contains("100 -> 50"), "{change}");
        let said = std::fs::read_to_string(&calls).unwrap();
        assert_eq!(said, "show node -o n1\nupdate NodeName=n1 Gres=gpu:4,carmamem:50\n");
        let calls_now = || std::fs::read_to_string(&calls).unwrap().lines().count();
        // After an update the next check reads again and finds it right;
        // then the same promisable GiB ask nothing until the resync, and
        // a change asks at once.
        assert_eq!(a.sync(50, None).unwrap(), None);
        assert_eq!(calls_now(), 3);
        assert_eq!(a.sync(50, None).unwrap(), None);
        assert_eq!(calls_now(), 3);
        assert!(a.sync(51, None).unwrap().unwrap().contains("50 -> 51"));
        assert_eq!(calls_now(), 5);
        assert_eq!(a.sync(51, None).unwrap(), None);
        assert_eq!(a.sync(51, None).unwrap(), None);
        assert_eq!(calls_now(), 6);
        // A job started or ended here (a new mark): asked at once, then
        // once more when the mark is SETTLE old (on this monitor's clock),
        // though the GiB stay the same.
        let (mark, t) = (SystemTime::now(), Instant::now());
        a.sync_at(51, Some(mark), t).unwrap();
        a.sync_at(51, Some(mark), t).unwrap();
        assert_eq!(calls_now(), 7);
        a.sync_at(51, Some(mark), t + SETTLE).unwrap();
        a.sync_at(51, Some(mark), t + SETTLE).unwrap();
        assert_eq!(calls_now(), 8);
        assert_eq!(a.sync_at(51, Some(mark), t + SETTLE + a.resync).unwrap(), None);
        assert_eq!(calls_now(), 9);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
