//! The report's runs of every policy: per trace, estimator, sharing mode
//! and capped reading, the best CARMA policy against exclusive assignment,
//! our estimator against the oracle, and every run's table, CSV and plots.

use super::{plots, report_config, run_all};
use crate::engine::Outcome;
use crate::report::{Summary, csv, pct, summarize, table};
use crate::{Assumptions, Estimator, Sharing, Workload};
use carma_config::{ActivityMetric, Policy};
use std::collections::HashMap;
use std::path::Path;

/// The sharing modes, capped readings and estimators the report runs.
const CONFIGURATIONS: [(Sharing, ActivityMetric, &[&str]); 3] = [
    (Sharing::Timeslice, ActivityMetric::Sm, &["oracle", "carma", "gpumemnet", "faketensor"]),
    (Sharing::Timeslice, ActivityMetric::Busy, &["oracle", "carma"]),
    (Sharing::Mps, ActivityMetric::Sm, &["oracle", "carma"]),
];

/// The oracle's makespan per sharing mode, capped reading and policy, for
/// comparing ours with (the oracle runs first).
type OracleMakespans = HashMap<(&'static str, &'static str, String), f64>;

/// One run of every policy: the trace, estimator, sharing mode and reading
/// the cap applies to.
struct Setting<'a> {
    trace: &'a str,
    est: &'a str,
    sharing: Sharing,
    cap: ActivityMetric,
}

/// The report's tables of these runs, filled run by run.
pub(super) struct RunTables {
    /// "Where we stand": the best policy of each run against exclusive.
    pub(super) summary: String,
    /// Our estimator against the oracle, per policy.
    pub(super) ours_vs_oracle: String,
    /// Every run's table, and plots of the oracle's under MPS.
    pub(super) detail: String,
}

/// Runs every policy in every setting the report shows, writing each run's
/// CSV and plots under `img`.
pub(super) fn policy_runs(
    carma: &Path,
    img: &Path,
    w: &HashMap<String, Workload>,
    ours: &HashMap<String, Option<u64>>,
    d: &Assumptions,
) -> Result<RunTables, String> {
    let mut tables = RunTables::new();
    for trace in ["trace_t1", "trace_t2"] {
        let mut oracle: OracleMakespans = HashMap::new();
        for (sharing, cap, ests) in CONFIGURATIONS {
            for est in ests {
                let estimator = match *est {
                    "oracle" => Estimator::Oracle,
                    "carma" => Estimator::Given(ours.clone()),
                    other => Estimator::Column(other.into()),
                };
                let cfg = report_config(sharing, cap, estimator, d);
                let outcomes = run_all(&carma.join(format!("{trace}.csv")), w, &cfg, &Policy::ALL)?;
                let s = Setting { trace, est, sharing, cap };
                tables.add(&s, outcomes, &mut oracle, img)?;
            }
        }
    }
    Ok(tables)
}

impl RunTables {
    fn new() -> RunTables {
        RunTables {
            summary: String::from(
                "## Where we stand\n\n\
                 Best CARMA policy against exclusive assignment, per trace, estimator, sharing mode and the reading the\n\
                 0.80 cap applies to (`sm`: SM activity, CARMA's; `busy`: the share of time any kernel runs):\n\n\
                 | trace | estimates | sharing | cap on | best policy | makespan | SM activity | energy | OOMs (all recovered) | job slowdown p50 / p95 / max | placed unprofiled |\n\
                 |---|---|---|---|---|---|---|---|---|---|---|\n",
            ),
            ours_vs_oracle: String::from(
                "\nOur estimator against the oracle, per policy (makespan; goal: within 5%):\n\n\
                 | trace | sharing | cap on | policy | oracle (h) | ours (h) | difference | OOMs with ours | raised by history | by the learned fixed part |\n|---|---|---|---|---|---|---|---|---|---|\n",
            ),
            detail: String::new(),
        }
    }

    /// Adds one setting's runs of every policy to the tables.
    fn add(
        &mut self,
        s: &Setting,
        outcomes: Vec<Outcome>,
        oracle: &mut OracleMakespans,
        img: &Path,
    ) -> Result<(), String> {
        let rows: Vec<Summary> = outcomes.iter().map(summarize).collect();
        let unfinished = outcomes.iter().map(|o| o.jobs.iter().filter(|j| j.end_s.is_none()).count()).sum::<usize>();
        if unfinished > 0 {
            return Err(format!("{} {} {}: {unfinished} jobs never finished", s.trace, s.est, s.sharing.name()));
        }
        self.add_best(s, &rows)?;
        for r in &rows {
            match s.est {
                "oracle" => {
                    oracle.insert((s.sharing.name(), s.cap.name(), r.policy.clone()), r.makespan_s);
                }
                "carma" if r.policy != "exclusive" => {
                    let o = oracle[&(s.sharing.name(), s.cap.name(), r.policy.clone())];
                    let run = outcomes.iter().find(|x| x.policy.name() == r.policy).ok_or("no such run")?;
                    self.add_ours_vs_oracle(s, r, o, run);
                }
                _ => {}
            }
        }
        self.add_detail(s, &rows, outcomes, img)
    }

    /// The best CARMA policy against exclusive assignment.
    fn add_best(&mut self, s: &Setting, rows: &[Summary]) -> Result<(), String> {
        let base = rows.iter().find(|r| r.policy == "exclusive").ok_or("no exclusive run")?;
        let best = rows
            .iter()
            .filter(|r| r.policy != "exclusive")
            .min_by(|x, y| x.makespan_s.total_cmp(&y.makespan_s))
            .ok_or("no CARMA policy")?;
        self.summary.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2} / {:.2} / {:.2} | {} |\n",
            s.trace,
            s.est,
            s.sharing.name(),
            s.cap.name(),
            best.policy,
            pct(best.makespan_s, base.makespan_s),
            pct(best.sm_activity, base.sm_activity),
            pct(best.energy_kwh, base.energy_kwh),
            best.ooms,
            best.job_slowdown_p50,
            best.job_slowdown_p95,
            best.job_slowdown_max,
            best.unprofiled
        ));
        Ok(())
    }

    /// One policy's run with our estimates against the oracle's makespan `o`.
    fn add_ours_vs_oracle(&mut self, s: &Setting, r: &Summary, o: f64, run: &Outcome) {
        self.ours_vs_oracle.push_str(&format!(
            "| {} | {} | {} | {} | {:.2} | {:.2} | {} | {} | {} | {} |\n",
            s.trace,
            s.sharing.name(),
            s.cap.name(),
            r.policy,
            o / 3600.0,
            r.makespan_s / 3600.0,
            pct(r.makespan_s, o),
            r.ooms,
            run.history_raised,
            run.learned_raised
        ));
    }

    /// The setting's table and CSV, and, for the oracle under MPS, plots of
    /// exclusive against magm.
    fn add_detail(&mut self, s: &Setting, rows: &[Summary], outcomes: Vec<Outcome>, img: &Path) -> Result<(), String> {
        let (trace, est, sharing, cap) = (s.trace, s.est, s.sharing.name(), s.cap.name());
        self.detail
            .push_str(&format!("### {trace}, estimates: {est}, sharing: {sharing}, cap on {cap}\n\n{}\n", table(rows)));
        std::fs::create_dir_all(img).map_err(|e| e.to_string())?;
        std::fs::write(img.join(format!("{trace}-{est}-{sharing}-{cap}.csv")), csv(rows)).map_err(|e| e.to_string())?;
        if est == "oracle" && s.sharing == Sharing::Mps {
            let pair: Vec<Outcome> =
                outcomes.into_iter().filter(|o| matches!(o.policy, Policy::Exclusive | Policy::Magm)).collect();
            let files = plots(img, trace, &pair)?;
            let sm: Vec<String> =
                files.iter().filter(|f| f.contains("-sm-")).map(|f| format!("![{f}](simulation/{f})")).collect();
            self.detail
                .push_str(&format!("SM activity per GPU over time, exclusive vs magm:\n\n{}\n\n", sm.join("\n")));
        }
        Ok(())
    }
}
