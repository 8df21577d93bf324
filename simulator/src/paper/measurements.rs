//! The sections drawn from the H100 measurements: the models' calibration
//! and where each workload's activity comes from.

use crate::Assumptions;
use crate::PowerProfile;
use crate::calibration::{fit_interference, fit_power, power_checks, read_collocation, throughput_checks};
use std::path::Path;

/// The calibration section: the models against data/h100/collocation.csv.
pub(super) fn calibration(measured: &Path) -> Result<String, String> {
    let rows = read_collocation(measured)?;
    let d = Assumptions::default();
    let (ts, k, c, m) = fit_interference(&rows)?;
    let mut md = format!(
        "## Calibration on real collocation measurements\n\n\
         `data/h100/collocation.csv`: training jobs alone and together on one H100, time-sliced and under MPS.\n\n\
         **Interference models** (`--sharing`):\n\
         - time-slicing: kernels of different jobs never overlap, so a GPU whose jobs' solo *busy* fractions (NVML\n\
           utilization.gpu) sum to B runs each max(1, B)× slower, × (1 + {ts_d}) per extra job for switching\n\
           (`--switch-overhead`);\n\
         - MPS: kernels overlap up to the SMs' capacity, so a GPU whose jobs' solo *SM activities* sum to S runs each\n\
           max(1, S / {k_d})× slower (`--mps-capacity`), × (1 + {c_d}) per extra job (`--mps-overhead`), and a job under\n\
           MPS runs at {m_d} of its plain speed (`--mps-solo`: resnet50 alone under MPS did 22.3 it/s, plainly 25.8).\n\n\
         The defaults are the fit that minimises the worst error over the measured sets (grid search, re-done now:\n\
         switch overhead {ts:.3}, MPS capacity {k:.2}, overhead {c:.2}, solo {m:.2}). Predicted vs measured aggregate\n\
         throughput (Σ over the jobs of throughput / throughput alone):\n\n\
         | sharing | jobs | measured | predicted | error |\n|---|---|---|---|---|\n",
        ts_d = d.switch_overhead,
        k_d = d.mps_capacity,
        c_d = d.mps_overhead,
        m_d = d.mps_solo,
    );
    let checks = throughput_checks(&rows, &d)?;
    for ch in &checks {
        md.push_str(&format!(
            "| {} | {} | {:.3} | {:.3} | {:+.1}% |\n",
            ch.sharing.name(),
            ch.jobs,
            ch.measured,
            ch.predicted,
            ch.error() * 100.0
        ));
    }
    let worst = checks.iter().map(|c| c.error().abs()).fold(0.0, f64::max);
    let p = fit_power(&rows, "h100-80gb")?;
    md.push_str(&format!(
        "\nWorst error {:.1}% (target ≤ 10%; the fit is in-sample: 9 sets, 4 parameters).\n\n\
         **Power** (`--gpu`, `--idle-w`, `--active-w`, `--sm-w`): idle + a floor while any job runs + a part linear in SM\n\
         activity. Least squares over the measured rows (idle measured): {:.1} W + {:.1} W + {:.0} W × SM activity.\n\
         The A100-40GB profile, which the paper's traces ran on, is not measured here: the H100 fit's dynamic part\n\
         scaled by the TDP ratio (400/700 W) with 60 W idle: {:.0} W + {:.1} W + {:.0} W × SM activity.\n\n\
         | row | measured (W) | predicted (W) | error |\n|---|---|---|---|\n",
        worst * 100.0,
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
