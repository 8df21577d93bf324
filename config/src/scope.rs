//! Transparent collocation: the partitions, accounts or QOS where the admin
//! has CARMA collocate jobs that ask for whole GPUs (`--gres=gpu:N`) and use
//! no CARMA option. slurmctld's job_submit/lua rewrites such jobs to shards
//! (`carma transparent-scopes` gives it this list); each node then places
//! them under the scope's policy and default size.

use crate::policy::Policy;
use std::fmt;

/// One `transparent:` entry. Every selector given must match; an absent
/// selector matches anything. At least one is required.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    pub partition: Option<String>,
    pub account: Option<String>,
    pub qos: Option<String>,
    /// Policy for the scope's jobs (default: `default_policy`).
    pub policy: Option<Policy>,
    /// Per-GPU estimate for a job with no history on the node; `None`
    /// gives such a job whole GPUs.
    pub default_mib: Option<u64>,
}

/// What Slurm says about a job: its partition, account and QOS.
#[derive(Debug, Clone, Copy, Default)]
pub struct JobScopeFacts<'a> {
    pub partition: Option<&'a str>,
    pub account: Option<&'a str>,
    pub qos: Option<&'a str>,
}

impl Scope {
    pub fn matches(&self, job: &JobScopeFacts<'_>) -> bool {
        let one = |want: &Option<String>, have: Option<&str>| want.as_deref().is_none_or(|w| Some(w) == have);
        one(&self.partition, job.partition) && one(&self.account, job.account) && one(&self.qos, job.qos)
    }

    /// The selectors as `partition:gpu,account:ml`, for logs and `CARMA_DECISION`.
    pub fn selectors(&self) -> String {
        let parts = [("partition", &self.partition), ("account", &self.account), ("qos", &self.qos)];
        let named: Vec<String> = parts.iter().filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}:{v}"))).collect();
        named.join(",")
    }
}

/// One line per scope for the job_submit/lua script, `*` for "any":
/// `scope partition=gpu account=* qos=*`. Names hold no blanks or `=`
/// (validated), so the line splits on blanks.
impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let any = |v: &Option<String>| v.clone().unwrap_or_else(|| "*".into());
        write!(f, "scope partition={} account={} qos={}", any(&self.partition), any(&self.account), any(&self.qos))
    }
}

/// A Slurm partition, account or QOS name as carma.yaml may give it.
pub fn valid_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name != "*"
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!("'{name}' is not a Slurm name; use letters, digits, '_', '-' and '.' (one name per entry)"))
    }
}

/// The first scope that covers the job.
pub fn find<'a>(scopes: &'a [Scope], job: &JobScopeFacts<'_>) -> Option<&'a Scope> {
    scopes.iter().find(|s| s.matches(job))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(partition: Option<&str>, account: Option<&str>) -> Scope {
        Scope {
            partition: partition.map(Into::into),
            account: account.map(Into::into),
            qos: None,
            policy: None,
            default_mib: None,
        }
    }

    #[test]
    fn every_given_selector_must_match() {
        let s = scope(Some("gpu"), Some("ml"));
        let job = |p, a| JobScopeFacts { partition: p, account: a, qos: Some("normal") };
        assert!(s.matches(&job(Some("gpu"), Some("ml"))));
        assert!(!s.matches(&job(Some("gpu"), Some("physics"))));
        assert!(!s.matches(&job(Some("cpu"), Some("ml"))));
        assert!(!s.matches(&job(None, Some("ml"))));
        assert!(scope(Some("gpu"), None).matches(&job(Some("gpu"), None)));
        let scopes = [scope(Some("a"), None), scope(None, Some("ml"))];
        assert_eq!(find(&scopes, &job(Some("b"), Some("ml"))).map(Scope::selectors).as_deref(), Some("account:ml"));
        assert!(find(&scopes, &job(Some("b"), Some("x"))).is_none());
    }

    #[test]
    fn lines_for_the_lua_script_mark_absent_selectors() {
        assert_eq!(scope(Some("gpu"), None).to_string(), "scope partition=gpu account=* qos=*");
        assert_eq!(scope(Some("gpu"), Some("ml")).selectors(), "partition:gpu,account:ml");
    }

    #[test]
    fn names_that_would_break_the_line_protocol_are_refused() {
        for bad in ["", "a b", "a=b", "*", "a,b", "x\ny"] {
            assert!(valid_name(bad).is_err(), "{bad:?}");
        }
        valid_name("gpu-shared_2.a").unwrap();
    }
}
