//! Reading this run's part of the job's stderr and stdout (through the
//! as-user helper) for a GPU OOM line, and where each file ends now.

use crate::asuser::run_self_as;
use crate::helper::{HELPER_TIMEOUT, command_args, earlier_arg, parse_end};
use crate::job_env::{env, job_user};
use crate::oom;
use carma_config::Config;
use carma_placement::jobfiles;
use std::path::PathBuf;

/// What scanning the job's output found, and where each file ends now.
pub struct Scan {
    pub result: Result<(Option<String>, Option<PathBuf>), String>,
    pub ends: Vec<jobfiles::OutputEnd>,
}

/// Finds the OOM line in this run's part of the job's stderr, then stdout,
/// read as the user: what follows where the last run here ended (`earlier`),
/// at most the last `tail` bytes (0: only where the files end now).
pub fn scan_output(cfg: &Config, job: &str, earlier: &[jobfiles::OutputEnd], tail: u64) -> Scan {
    let mut ends = Vec::new();
    let result = scan_each(cfg, job, earlier, tail, &mut ends);
    Scan { result, ends }
}

fn scan_each(
    cfg: &Config,
    job: &str,
    earlier: &[jobfiles::OutputEnd],
    tail: u64,
    ends: &mut Vec<jobfiles::OutputEnd>,
) -> Result<(Option<String>, Option<PathBuf>), String> {
    let user = job_user()?;
    let mut notes = Vec::new();
    let mut patterns: Vec<String> =
        [env("SLURM_JOB_STDERR"), env("SLURM_JOB_STDOUT")].into_iter().filter(|p| !p.is_empty()).collect();
    patterns.dedup();
    if patterns.is_empty() {
        return Err(format!(
            "job {job} failed but has no output file to scan (interactive job?); OOM recovery needs sbatch"
        ));
    }
    let mut found = None;
    for pattern in patterns {
        let args = command_args(&["--as-user-read-tail", &pattern, &tail.to_string(), &earlier_arg(earlier)]);
        let out = run_self_as(user, &args, (tail + 4096) as usize, HELPER_TIMEOUT)?;
        let text = String::from_utf8_lossy(&out);
        let (head, body) = text.split_once('\n').unwrap_or((&text, ""));
        let Some(end) = head.strip_prefix("FILE ").and_then(parse_end) else {
            return Err(format!("job {job}: cannot scan its output: {head}"));
        };
        let path = PathBuf::from(&end.path);
        if !ends.iter().any(|e: &jobfiles::OutputEnd| e.path == end.path) {
            ends.push(end);
        }
        if found.is_none() {
            match oom::find_oom(body, &cfg.oom_patterns) {
                Some(line) => found = Some((line.chars().take(300).collect(), path)),
                None => notes.push(path),
            }
        }
    }
    Ok(match found {
        Some((line, path)) => (Some(line), Some(path)),
        None => (None, notes.pop()),
    })
}
