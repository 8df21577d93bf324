//! Slurm's output filename patterns (`%j`, `%x`, `%u`, ...) resolved to the
//! job's actual file. The epilog's environment has the pattern but not the
//! job name, so `%x` (and other unknown fields) match as wildcards within
//! their path component, and only a unique match counts: we never guess.

use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Default)]
pub struct JobFields {
    pub job_id: String,
    pub user: String,
    pub node: String,
    pub array_job_id: Option<String>,
    pub array_task_id: Option<String>,
    pub work_dir: PathBuf,
}

impl JobFields {
    /// From the epilog's environment (set by slurmd).
    pub fn from_slurm_env() -> JobFields {
        let env = |n: &str| std::env::var(n).unwrap_or_default();
        let opt = |n: &str| Some(env(n)).filter(|v| !v.is_empty());
        JobFields {
            job_id: env("SLURM_JOB_ID"),
            user: env("SLURM_JOB_USER"),
            node: env("SLURMD_NODENAME"),
            array_job_id: opt("SLURM_ARRAY_JOB_ID"),
            array_task_id: opt("SLURM_ARRAY_TASK_ID"),
            work_dir: PathBuf::from(env("SLURM_JOB_WORK_DIR")),
        }
    }

    /// As arguments for a helper process (the inverse of [`JobFields::from_args`]).
    pub fn to_args(&self) -> Vec<String> {
        vec![
            self.work_dir.to_string_lossy().into_owned(),
            self.job_id.clone(),
            self.user.clone(),
            self.node.clone(),
            self.array_job_id.clone().unwrap_or_default(),
            self.array_task_id.clone().unwrap_or_default(),
        ]
    }

    pub fn from_args(a: &[String]) -> Option<JobFields> {
        let [work_dir, job_id, user, node, array_job, array_task] = a else { return None };
        let opt = |s: &String| (!s.is_empty()).then(|| s.clone());
        Some(JobFields {
            work_dir: PathBuf::from(work_dir),
            job_id: job_id.clone(),
            user: user.clone(),
            node: node.clone(),
            array_job_id: opt(array_job),
            array_task_id: opt(array_task),
        })
    }
}

#[derive(Debug, PartialEq)]
pub enum Resolved {
    File(PathBuf),
    NotFound(String),
    Ambiguous(String),
}

/// One path component: literal text and wildcards.
#[derive(Debug, PartialEq)]
enum Piece {
    Lit(String),
    Any,
}

fn expand_component(comp: &str, f: &JobFields) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut lit = String::new();
    let mut chars = comp.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            lit.push(c);
            continue;
        }
        // Optional zero-padding width, as in %4j.
        let mut width = String::new();
        while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
            width.push(*d);
            chars.next();
        }
        let pad = |v: &str| format!("{v:0>w$}", w = width.parse::<usize>().unwrap_or(0).min(10));
        match chars.next() {
            Some('%') => lit.push('%'),
            Some('j') => lit.push_str(&pad(&f.job_id)),
            Some('u') => lit.push_str(&f.user),
            Some('N') => lit.push_str(&f.node),
            Some('n') | Some('t') => lit.push_str(&pad("0")),
            Some('A') if f.array_job_id.is_some() => lit.push_str(&pad(f.array_job_id.as_deref().unwrap_or(""))),
            Some('a') if f.array_task_id.is_some() => lit.push_str(&pad(f.array_task_id.as_deref().unwrap_or(""))),
            Some('A') => lit.push_str(&pad(&f.job_id)),
            Some(_) => {
                // %x (job name), %J, %s, %a without array...: unknown here.
                if !lit.is_empty() {
                    out.push(Piece::Lit(std::mem::take(&mut lit)));
                }
                if out.last() != Some(&Piece::Any) {
                    out.push(Piece::Any);
                }
            }
            None => lit.push('%'),
        }
    }
    if !lit.is_empty() {
        out.push(Piece::Lit(lit));
    }
    out
}

fn matches(pieces: &[Piece], name: &str) -> bool {
    match pieces.split_first() {
        None => name.is_empty(),
        Some((Piece::Lit(l), rest)) => name.strip_prefix(l.as_str()).is_some_and(|r| matches(rest, r)),
        Some((Piece::Any, rest)) => {
            (0..=name.len()).filter(|&i| name.is_char_boundary(i)).any(|i| matches(rest, &name[i..]))
        }
    }
}

/// Most entries read from one directory while resolving a wildcard.
const MAX_DIR_ENTRIES: usize = 10_000;

pub fn resolve(pattern: &str, f: &JobFields) -> Resolved {
    let full = if Path::new(pattern).is_absolute() { PathBuf::from(pattern) } else { f.work_dir.join(pattern) };
    let mut candidates = vec![PathBuf::from("/")];
    for comp in full.components().skip(1) {
        let comp = comp.as_os_str().to_string_lossy();
        let pieces = expand_component(&comp, f);
        let mut next = Vec::new();
        for base in &candidates {
            if !pieces.contains(&Piece::Any) {
                let lit: String = pieces.iter().map(|p| if let Piece::Lit(l) = p { l.as_str() } else { "" }).collect();
                next.push(base.join(lit));
                continue;
            }
            let Ok(dir) = std::fs::read_dir(base) else { continue };
            for e in dir.flatten().take(MAX_DIR_ENTRIES) {
                if e.file_name().to_str().is_some_and(|n| matches(&pieces, n)) {
                    next.push(e.path());
                }
            }
        }
        candidates = next;
    }
    candidates.retain(|p| p.is_file());
    match candidates.len() {
        0 => Resolved::NotFound(full.display().to_string()),
        1 => Resolved::File(candidates.remove(0)),
        n => Resolved::Ambiguous(format!("{} matches {n} files", full.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(dir: &Path) -> JobFields {
        JobFields {
            job_id: "42".into(),
            user: "alice".into(),
            node: "n1".into(),
            work_dir: dir.to_path_buf(),
            ..Default::default()
        }
    }

    #[test]
    fn expands_known_fields_and_globs_the_job_name() {
        let d = std::env::temp_dir().join(format!("carma-paths-{}", std::process::id()));
        std::fs::create_dir_all(d.join("logs")).unwrap();
        std::fs::write(d.join("logs/train-42.err"), "x").unwrap();
        std::fs::write(d.join("logs/train-43.err"), "x").unwrap();
        std::fs::write(d.join("slurm-42.out"), "x").unwrap();
        std::fs::write(d.join("alice-n1-00042.log"), "x").unwrap();
        let f = fields(&d);
        assert_eq!(resolve("slurm-%j.out", &f), Resolved::File(d.join("slurm-42.out")));
        assert_eq!(resolve("logs/%x-%j.err", &f), Resolved::File(d.join("logs/train-42.err")));
        assert_eq!(
            resolve(&format!("{}/%u-%N-%5j.log", d.display()), &f),
            Resolved::File(d.join("alice-n1-00042.log"))
        );
        assert!(matches!(resolve("logs/%x.err", &f), Resolved::Ambiguous(_)));
        assert!(matches!(resolve("missing-%j.out", &f), Resolved::NotFound(_)));
        assert!(matches!(resolve("%x/%j.out", &f), Resolved::NotFound(_)));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn fields_round_trip_through_helper_arguments() {
        let f = JobFields { array_task_id: Some("3".into()), ..fields(Path::new("/w")) };
        let back = JobFields::from_args(&f.to_args()).unwrap();
        assert_eq!((back.job_id, back.user, back.node, back.work_dir), (f.job_id, f.user, f.node, f.work_dir));
        assert_eq!((back.array_job_id, back.array_task_id), (None, Some("3".into())));
        assert!(JobFields::from_args(&["x".into()]).is_none());
    }

    #[test]
    fn percent_escapes() {
        let f = JobFields { job_id: "7".into(), ..Default::default() };
        assert_eq!(expand_component("a%%b%j", &f), vec![Piece::Lit("a%b7".into())]);
        assert_eq!(expand_component("%x%s", &f), vec![Piece::Any]);
    }
}
