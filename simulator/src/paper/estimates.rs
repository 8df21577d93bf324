//! The sections on our estimator: its estimates against the measured
//! peaks, the options the jobs' users give, and where its estimates lose
//! makespan against the oracle's.

use super::{report_config, run_all};
use crate::input::read_job_options;
use crate::report::summarize;
use crate::{Assumptions, Estimator, Sharing, Workload};
use carma_config::{ActivityMetric, Policy};
use std::collections::HashMap;
use std::path::Path;

/// Our estimator against the measured peaks: how many workloads it
/// estimates, which it under-estimates, its median over-provision.
pub(super) fn estimator_section(w: &HashMap<String, Workload>, ours: &HashMap<String, Option<u64>>) -> String {
    let mut names: Vec<&String> = w.keys().collect();
    names.sort();
    let (mut under, mut whole, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for n in &names {
        match ours.get(*n).copied().flatten() {
            Some(e) if e < w[*n].peak_mib => under.push(format!("{n} ({e} < {} MiB)", w[*n].peak_mib)),
            Some(e) => ratios.push(e as f64 / w[*n].peak_mib as f64),
            None => whole.push(n.as_str()),
        }
    }
    ratios.sort_by(f64::total_cmp);
    format!(
        "## Our estimator on the trace workloads\n\n\
         {} of {} workloads estimated; under-estimates: {}; median over-provision {:.2}×. {}\n\n",
        under.len() + ratios.len(),
        names.len(),
        if under.is_empty() { "none".to_string() } else { under.join(", ") },
        ratios.get(ratios.len() / 2).copied().unwrap_or(0.0),
        if whole.is_empty() {
            "Every workload has an estimate (torchinfo tables included since #14; dlrm's table is for batch 32768, \
             its rows for batch 8, and mnist_train's is defective: data/README.md)."
                .to_string()
        } else {
            format!("Given whole GPUs (a model file the estimator refuses): {}.", whole.join(", "))
        }
    )
}

/// The options the jobs' users give (data/carma/job-options.csv), each
/// row with the estimate it makes and the one the model file alone makes.
pub(super) fn options_section(
    path: &Path,
    w: &HashMap<String, Workload>,
    ours: &HashMap<String, Option<u64>>,
    plain: &HashMap<String, Option<u64>>,
) -> Result<String, String> {
    let mut md = String::from(
        "The options each language-model job's user gives srun/sbatch (`--carma-batch-size` per GPU,\n\
         `--carma-seq-len`), read from the paper's training scripts (`data/carma/job-options.csv`; the other rows'\n\
         table batch is already per GPU, and their model files fix the input size):\n\n\
         | workload | GPUs | options | estimate (MiB) | without them | measured | the script says |\n\
         |---|---|---|---|---|---|---|\n",
    );
    let mib =
        |m: &HashMap<String, Option<u64>>, n: &str| m.get(n).copied().flatten().map_or("—".into(), |v| v.to_string());
    for o in read_job_options(path)? {
        let name = o.workload.as_str();
        let x = w.get(name).ok_or_else(|| format!("{} line {}: no workload '{name}'", path.display(), o.line))?;
        let opt = |flag: &str, v: Option<u32>| v.map(|v| format!("`--carma-{flag}={v}`"));
        let opts: Vec<String> =
            [opt("batch-size", x.batch_size), opt("seq-len", x.seq_len)].into_iter().flatten().collect();
        md.push_str(&format!(
            "| {name} | {} | {} | {} | {} | {} | {} |\n",
            x.gpus,
            opts.join(" "),
            mib(ours, name),
            mib(plain, name),
            x.peak_mib,
            o.source
        ));
    }
    md.push('\n');
    Ok(md)
}

/// Where our estimates lose makespan against the oracle's: the mean over
/// the CARMA policies of ours / oracle − 1 (and the same for the model
/// files alone, without the jobs' options), and how much of it goes when
/// one model file's workloads get their measured peaks instead, in the two
/// configurations where collocation pays.
pub(super) fn attribution(
    carma: &Path,
    w: &HashMap<String, Workload>,
    ours: &HashMap<String, Option<u64>>,
    plain: &HashMap<String, Option<u64>>,
    d: &Assumptions,
) -> Result<String, String> {
    let policies: Vec<Policy> = Policy::ALL.into_iter().filter(|p| *p != Policy::Exclusive).collect();
    let mut files: Vec<&str> = w
        .values()
        .filter(|x| ours.get(&x.name).copied().flatten() != Some(x.peak_mib))
        .filter_map(|x| x.model_file.as_deref())
        .collect();
    files.sort_unstable();
    files.dedup();
    let mut md = String::from(
        "\nWhere ours loses: the mean over the five policies of ours / oracle − 1 (makespan), and how much of it\n\
         goes when one model file's workloads get their measured peaks instead of our estimates (largest first;\n\
         a negative figure: that file's estimates *help*, by refusing collocations that slow the trace):\n\n\
         | trace | sharing | cap on | mean gap | without the jobs' options | closed by measuring (model file: points) |\n\
         |---|---|---|---|---|---|\n",
    );
    for (sharing, cap) in [(Sharing::Mps, ActivityMetric::Sm), (Sharing::Timeslice, ActivityMetric::Busy)] {
        for trace in ["trace_t1", "trace_t2"] {
            let path = carma.join(format!("{trace}.csv"));
            let makespans = |e: Estimator| -> Result<Vec<f64>, String> {
                let cfg = report_config(sharing, cap, e, d);
                Ok(run_all(&path, w, &cfg, &policies)?.iter().map(|o| summarize(o).makespan_s).collect())
            };
            let oracle = makespans(Estimator::Oracle)?;
            let gap = |e: Estimator| -> Result<f64, String> {
                let m = makespans(e)?;
                Ok(m.iter().zip(&oracle).map(|(a, b)| a / b - 1.0).sum::<f64>() / m.len() as f64)
            };
            let base = gap(Estimator::Given(ours.clone()))?;
            let without = gap(Estimator::Given(plain.clone()))?;
            let mut closed = Vec::new();
            for f in &files {
                let mut fixed = ours.clone();
                for x in w.values().filter(|x| x.model_file.as_deref() == Some(f)) {
                    fixed.insert(x.name.clone(), Some(x.peak_mib));
                }
                closed.push((base - gap(Estimator::Given(fixed))?, *f));
            }
            closed.sort_by(|a, b| b.0.abs().total_cmp(&a.0.abs()));
            let top: Vec<String> = closed
                .iter()
                .filter(|(c, _)| c.abs() >= 0.005)
                .take(4)
                .map(|(c, f)| format!("{f}: {:+.1}", c * 100.0))
                .collect();
            md.push_str(&format!(
                "| {trace} | {} | {} | {:+.1}% | {:+.1}% | {} |\n",
                sharing.name(),
                cap.name(),
                base * 100.0,
                without * 100.0,
                if top.is_empty() { "none above 0.5 points".to_string() } else { top.join("; ") }
            ));
        }
    }
    Ok(md)
}
