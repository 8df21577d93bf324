//! Whether a job slurmstepd handed back (no GPU fitted on its node,
//! `no_fit: hand_back`) may be requeued away from that node: from Slurm's
//! fields only (squeue `%x;%n;%P`, node names from `sinfo` and `scontrol
//! show hostnames`), never from text the job's user wrote.

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

    #[test]
    fn only_nodes_with_gpus_that_slurm_schedules_on_are_left() {
        let sinfo = "n1|mix|gpu:4,shard:32(S:0)\nn2|idle*|gpu:4\nn3|drain|gpu:4\nn4|idle|(null)\n\
                     n5|alloc|shard:8\nn6|down~|gpu:1\nn1|mix|gpu:4,shard:32(S:0)\nn7|idle|nic:1,gpu:a100:2\n";
        assert_eq!(usable_gpu_nodes(sinfo), ["n1", "n5", "n7"]);
    }
}
