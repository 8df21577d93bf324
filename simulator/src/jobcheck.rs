//! The slowdown model (`carma_placement::slowdown`) held against measured
//! sets, job by job: each job's predicted slowdown beside the others, its
//! measured one (its it/s alone as a plain process over its it/s in the
//! set), and whether the guard would admit each job into the set. Any file
//! in data/h100/collocation.csv's format: `carma calibrate` prints it, so a
//! site checks the model on its own GPUs.

use crate::calibration::Measured;
use carma_config::Sharing;
use carma_placement::slowdown::{Model, Profile};
use std::collections::HashMap;
use std::fmt::Write;

/// One job of one measured set.
#[derive(Debug, Clone, PartialEq)]
pub struct JobCheck {
    pub sharing: Sharing,
    /// The set's jobs, joined by `+`.
    pub set: String,
    pub job: String,
    pub measured: f64,
    pub predicted: f64,
}

impl JobCheck {
    /// The prediction's relative error.
    pub fn error(&self) -> f64 {
        self.predicted / self.measured - 1.0
    }
}

/// Each job's solo profile and throughput: the time-sliced rows of one job
/// (a plain process alone).
pub fn solo_profiles(rows: &[Measured]) -> HashMap<String, (Profile, f64)> {
    rows.iter()
        .filter(|r| r.sharing == Sharing::Timeslice && r.jobs.len() == 1 && !r.throughputs.is_empty())
        .map(|r| (r.jobs[0].clone(), (Profile { busy: r.busy, sm: r.sm }, r.throughputs[0])))
        .collect()
}

/// Every job of every set that is not a plain solo run.
pub fn job_checks(rows: &[Measured]) -> Result<Vec<JobCheck>, String> {
    let solo = solo_profiles(rows);
    let mut out = Vec::new();
    for r in rows.iter().filter(|r| !r.jobs.is_empty() && (r.sharing != Sharing::Timeslice || r.jobs.len() > 1)) {
        if r.throughputs.len() != r.jobs.len() || r.throughputs.iter().any(|t| !(*t > 0.0 && t.is_finite())) {
            return Err(format!("set {}: give one positive it/s per job, joined by '+'", r.jobs.join("+")));
        }
        let known = |j: &String| solo.get(j).copied().ok_or_else(|| format!("no solo time-sliced run of '{j}'"));
        let solos: Vec<(Profile, f64)> = r.jobs.iter().map(known).collect::<Result<_, _>>()?;
        let profiles: Vec<Profile> = solos.iter().map(|s| s.0).collect();
        let predicted = Model::of(r.sharing).slowdowns(&profiles);
        for (i, job) in r.jobs.iter().enumerate() {
            out.push(JobCheck {
                sharing: r.sharing,
                set: r.jobs.join("+"),
                job: job.clone(),
                measured: solos[i].1 / r.throughputs[i],
                predicted: predicted[i],
            });
        }
    }
    Ok(out)
}

/// Median, 90th percentile (linear between ranks) and largest absolute
/// error of the checks.
pub fn error_summary(checks: &[JobCheck]) -> (f64, f64, f64) {
    let mut e: Vec<f64> = checks.iter().map(|c| c.error().abs()).collect();
    if e.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    e.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let k = (e.len() - 1) as f64 * q;
        let (lo, hi) = (k.floor() as usize, k.ceil() as usize);
        e[lo] + (e[hi] - e[lo]) * (k - lo as f64)
    };
    (at(0.5), at(0.9), e[e.len() - 1])
}

/// The report `carma calibrate` prints: every job's predicted and measured
/// slowdown, the errors' summary per sharing mode, and per set whether the
/// guard admits it (its worst predicted slowdown within `bound`) against
/// whether it should (its worst measured one within).
pub fn report(checks: &[JobCheck], bound: f64) -> String {
    let mut out =
        String::from("sharing    set                                   job               measured  predicted  error\n");
    for c in checks {
        let _ = writeln!(
            out,
            "{:<10} {:<37} {:<17} {:>7.2}x  {:>8.2}x  {:>+5.1}%",
            c.sharing.name(),
            c.set,
            c.job,
            c.measured,
            c.predicted,
            100.0 * c.error()
        );
    }
    for sharing in [Sharing::Timeslice, Sharing::Mps] {
        let of: Vec<JobCheck> = checks.iter().filter(|c| c.sharing == sharing).cloned().collect();
        if !of.is_empty() {
            let (med, p90, max) = error_summary(&of);
            let _ = writeln!(
                out,
                "{}: {} jobs, per-job error median {:.1} %, p90 {:.1} %, max {:.1} %",
                sharing.name(),
                of.len(),
                100.0 * med,
                100.0 * p90,
                100.0 * max
            );
        }
    }
    let (med, p90, max) = error_summary(checks);
    let _ = writeln!(
        out,
        "all: per-job error median {:.1} %, p90 {:.1} %, max {:.1} %",
        100.0 * med,
        100.0 * p90,
        100.0 * max
    );
    let _ = writeln!(out, "guard at max_slowdown {bound:.2}:");
    for (sharing, set, measured, predicted) in set_worsts(checks) {
        let verdict = |x: f64| if x <= bound { "admit" } else { "refuse" };
        let agree = if verdict(measured) == verdict(predicted) { "" } else { "  (disagrees)" };
        let _ = writeln!(
            out,
            "  {:<10} {:<37} worst measured {:.2}x: {:<6} predicted {:.2}x: {}{agree}",
            sharing.name(),
            set,
            measured,
            verdict(measured),
            predicted,
            verdict(predicted)
        );
    }
    out
}

/// Per set (in order): its worst measured and worst predicted slowdown.
pub fn set_worsts(checks: &[JobCheck]) -> Vec<(Sharing, String, f64, f64)> {
    let mut out: Vec<(Sharing, String, f64, f64)> = Vec::new();
    for c in checks {
        match out.iter_mut().find(|s| s.0 == c.sharing && s.1 == c.set) {
            Some(s) => {
                s.2 = s.2.max(c.measured);
                s.3 = s.3.max(c.predicted);
            }
            None => out.push((c.sharing, c.set.clone(), c.measured, c.predicted)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibration::read_collocation;
    use std::path::Path;

    fn checks() -> Vec<JobCheck> {
        let rows =
            read_collocation(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/h100/collocation.csv")).unwrap();
        job_checks(&rows).unwrap()
    }

    #[test]
    fn the_slowdown_model_predicts_each_jobs_slowdown_on_the_h100_sets() {
        let c = checks();
        // 4 time-sliced pairs, 4 MPS pairs and resnet50 alone under MPS.
        assert_eq!(c.len(), 17);
        let (med, p90, max) = error_summary(&c);
        println!("{}", report(&c, 1.6));
        assert!(med <= 0.05 && p90 <= 0.12, "median {med:.3}, p90 {p90:.3}, max {max:.3}");
        // The heavy job of a time-sliced pair is the one slowed most, as
        // measured (one slowdown per GPU, the old model, cannot say so).
        let s = |set: &str, job: &str| {
            c.iter().find(|x| x.set == set && x.job == job && x.sharing == Sharing::Timeslice).unwrap().predicted
        };
        assert!(
            s("resnet50_64+mobilenetv3_32", "resnet50_64") > s("resnet50_64+mobilenetv3_32", "mobilenetv3_32") + 0.3
        );
    }

    #[test]
    fn the_guard_agrees_with_every_measured_set_at_the_default_bound() {
        let c = checks();
        for (sharing, set, measured, predicted) in set_worsts(&c) {
            assert_eq!(
                measured <= 1.6,
                predicted <= 1.6,
                "{} {set}: measured {measured:.2}, predicted {predicted:.2}",
                sharing.name()
            );
        }
    }

    #[test]
    fn a_set_with_fewer_throughputs_than_jobs_is_refused_not_a_panic() {
        let rows = vec![Measured {
            sharing: Sharing::Timeslice,
            jobs: vec!["a".into(), "b".into()],
            throughputs: vec![1.0],
            power_w: 0.0,
            busy: 1.0,
            sm: 1.0,
        }];
        assert!(job_checks(&rows).unwrap_err().contains("one positive it/s per job"));
    }

    #[test]
    fn a_set_without_its_jobs_solo_runs_is_refused_naming_the_job() {
        let rows = vec![Measured {
            sharing: Sharing::Mps,
            jobs: vec!["a".into(), "b".into()],
            throughputs: vec![1.0, 1.0],
            power_w: 0.0,
            busy: 1.0,
            sm: 1.0,
        }];
        assert!(job_checks(&rows).unwrap_err().contains("no solo time-sliced run of 'a'"));
    }
}
