//! Readings measured on a real GPU, replayed: rows of
//! data/h100/collocation.csv (busy time, GPM SM activity and occupancy,
//! power of real job mixes), named `MODE/JOBS` (`timeslice/resnet50_64`).

use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Row {
    pub busy: f64,
    pub sm: f64,
    pub occupancy: Option<f64>,
    pub power_w: Option<f64>,
}

/// The row `mix` (`MODE/JOBS`) of the CSV file `file`.
pub fn row(file: &Path, mix: &str) -> Result<Row, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("replay file {}: {e}", file.display()))?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or("").split(',').collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .ok_or_else(|| format!("replay file {}: no column {name}", file.display()))
    };
    let (mode, jobs) = (col("mode")?, col("jobs")?);
    let (busy, sm, occ, power) =
        (col("nvml_utilization_gpu_pct")?, col("gpm_sm_activity_pct")?, col("gpm_sm_occupancy_pct")?, col("power_w")?);
    let (want_mode, want_jobs) = mix
        .split_once('/')
        .ok_or_else(|| format!("replay mix '{mix}': write MODE/JOBS, e.g. timeslice/resnet50_64"))?;
    for line in lines {
        let f: Vec<&str> = line.split(',').collect();
        if f.get(mode) != Some(&want_mode) || f.get(jobs) != Some(&want_jobs) {
            continue;
        }
        let pct = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).map(|v| (v / 100.0).clamp(0.0, 1.0));
        return Ok(Row {
            busy: pct(busy).ok_or_else(|| format!("replay mix '{mix}': no busy figure"))?,
            sm: pct(sm).ok_or_else(|| format!("replay mix '{mix}': no SM activity figure"))?,
            occupancy: pct(occ),
            power_w: f.get(power).and_then(|v| v.parse().ok()),
        });
    }
    Err(format!("replay file {}: no row {mix}", file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/h100").join(name)
    }

    #[test]
    fn rows_of_the_h100_measurements() {
        let near = |a: f64, b: f64| (a - b).abs() < 1e-9;
        let r = row(&data("collocation.csv"), "timeslice/mobilenetv3_32+resnet18_32").unwrap();
        assert!(near(r.busy, 0.99) && near(r.sm, 0.567) && near(r.occupancy.unwrap(), 0.259), "{r:?}");
        assert_eq!(r.power_w, Some(368.1));
        let light = row(&data("probes.csv"), "timeslice/tiny_mlp+tiny_mlp").unwrap();
        assert!(near(light.busy, 0.92) && near(light.sm, 0.011), "{light:?}");
        assert_eq!((light.occupancy, light.power_w), (None, None));
        assert!(row(&data("collocation.csv"), "mps/nothing").unwrap_err().contains("no row mps/nothing"));
        assert!(row(&data("collocation.csv"), "resnet50_64").unwrap_err().contains("MODE/JOBS"));
    }
}
