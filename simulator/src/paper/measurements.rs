//! The sections drawn from the H100 measurements: the models' calibration
//! and where each workload's activity comes from.

use crate::calibration::{fit_power, power_checks, read_collocation};
use crate::jobcheck::{error_summary, job_checks};
use crate::{PowerProfile, Sharing};
use carma_placement::slowdown::Model;
use std::path::Path;

/// The calibration section: the models against data/h100/collocation.csv.
pub(super) fn calibration(measured: &Path) -> Result<String, String> {
    let rows = read_collocation(measured)?;
    let (ts, mps) = (Model::H100_TIMESLICE, Model::H100_MPS);
    let mut md = format!(
        "## Calibration on real collocation measurements\n\n\
         `data/h100/collocation.csv`: training jobs alone and together on one H100, time-sliced and under MPS.\n\n\
         **Interference** (`--sharing`): each job's own slowdown, from the model the plugin's slowdown guard predicts\n\
         with (`carma_placement::slowdown`; `carma calibrate` prints the same check). A shared resource is divided\n\
         by weighted water-filling: each job asks for what it uses alone and, where the asks exceed the capacity,\n\
         gets the smaller of its ask and a share weighted by ask^w; it runs ask / share times slower.\n\
         - time-slicing: the resource is the GPU's time, a job's ask its solo *busy* share (NVML utilization.gpu), the\n\
           capacity 1 / (1 + {sw} × (n − 1)) for n jobs (context switches), w = {tw};\n\
         - MPS: the resource is the SMs, a job's ask its solo *SM activity*, the capacity {cap} (kernels overlap), w =\n\
           {mw}, and an MPS client runs {base}× slower even alone (a job that is not one, exclusive or on 2 GPUs, does not).\n\n\
         The simulated GPUs follow this model over the jobs' true solo readings; the guard predicts with the\n\
         profiles each node learns from its readings. Predicted vs measured slowdown of each job of each measured\n\
         set (its it/s alone as a plain process over its it/s in the set):\n\n\
         | sharing | set | job | measured | predicted | error |\n|---|---|---|---|---|---|\n",
        sw = ts.switch,
        tw = ts.weight_exp,
        cap = mps.capacity,
        mw = mps.weight_exp,
        base = mps.base,
    );
    let checks = job_checks(&rows)?;
    for c in &checks {
        md.push_str(&format!(
            "| {} | {} | {} | {:.2} | {:.2} | {:+.1}% |\n",
            c.sharing.name(),
            c.set,
            c.job,
            c.measured,
            c.predicted,
            c.error() * 100.0
        ));
    }
    let errors: Vec<String> = [Sharing::Timeslice, Sharing::Mps]
        .iter()
        .map(|&sharing| {
            let of: Vec<_> = checks.iter().filter(|c| c.sharing == sharing).cloned().collect();
            let (median, _, max) = error_summary(&of);
            format!("{}: median {:.1}%, worst {:.1}%", sharing.name(), median * 100.0, max * 100.0)
        })
        .collect();
    let p = fit_power(&rows, "h100-80gb")?;
    md.push_str(&format!(
        "\nPer-job error, {} (in-sample: the model was fitted on these sets).\n\n\
         **Power** (`--gpu`, `--idle-w`, `--active-w`, `--sm-w`): idle + a floor while any job runs + a part linear in SM\n\
         activity. Least squares over the measured rows (idle measured): {:.1} W + {:.1} W + {:.0} W × SM activity.\n\
         The A100-40GB profile, which the paper's traces ran on, is not measured here: the H100 fit's dynamic part\n\
         scaled by the TDP ratio (400/700 W) with 60 W idle: {:.0} W + {:.1} W + {:.0} W × SM activity.\n\n\
         | row | measured (W) | predicted (W) | error |\n|---|---|---|---|\n",
        errors.join("; "),
        p.idle_w,
        p.active_w,
        p.sm_w,
        PowerProfile::A100_40GB.idle_w,
        PowerProfile::A100_40GB.active_w,
        PowerProfile::A100_40GB.sm_w,
    ));
    for (row, meas, pred) in power_checks(&rows, &p) {
        md.push_str(&format!("| {row} | {meas:.1} | {pred:.1} | {:+.1}% |\n", (pred / meas - 1.0) * 100.0));
    }
    md.push_str(
        "\nThe tiny MLP is the worst row: a nearly idle GPU (SM activity 0.006) still raised its clocks. Collocated\n\
         pairs draw less than the same work done alone, because the idle power and the floor are paid once.\n\n",
    );
    Ok(md)
}

/// Workloads per measured job they take their activity from.
pub(super) fn activity_section(map: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(map).map_err(|e| format!("{}: {e}", map.display()))?;
    let mut by: Vec<(String, String, usize)> = Vec::new();
    for line in text.lines().skip(1).filter(|l| !l.is_empty()) {
        let f: Vec<&str> = line.splitn(3, ',').collect();
        let (m, why) = (f.get(1).copied().unwrap_or(""), f.get(2).copied().unwrap_or(""));
        match by.iter_mut().find(|b| b.0 == m) {
            Some(b) => b.2 += 1,
            None => by.push((m.to_string(), why.to_string(), 1)),
        }
    }
    let mut md = String::from(
        "## Workload activity\n\n\
         The paper's traces carry no GPU readings. Each workload takes the solo busy fraction and SM activity of the\n\
         nearest job measured on the H100 (`data/h100/workload-map.csv`; no GPU machine was lent for measuring the\n\
         paper's exact architectures):\n\n| measured job | workloads | why |\n|---|---|---|\n",
    );
    for (m, why, n) in by {
        md.push_str(&format!("| {m} | {n} | {why} |\n"));
    }
    md.push_str(
        "\nThe jobs ran on an A100 in the paper and were measured on an H100, which is faster: on an A100 the same\n\
         jobs keep the GPU busier, so these readings understate interference somewhat.\n\n",
    );
    Ok(md)
}
