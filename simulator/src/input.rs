//! The trace (`seq,submit_offset_s,workload`) and the workload table (the
//! columns of the CARMA paper's workloads.csv; extra columns are ignored;
//! optional `busy` and `sm_activity` columns override the class defaults,
//! and [`apply_activity`] sets both from measured jobs).

use std::collections::HashMap;
use std::path::Path;

#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub name: String,
    pub gpus: u32,
    /// Run time alone on one GPU (exclusive), seconds.
    pub solo_s: f64,
    /// Measured peak GPU memory per GPU, MiB.
    pub peak_mib: u64,
    /// Estimates by column name (horus, faketensor, gpumemnet), MiB per GPU.
    pub estimates: HashMap<String, u64>,
    /// SM activity when running alone, 0–1.
    pub sm: f64,
    /// Share of time a kernel runs when running alone (NVML
    /// utilization.gpu), 0–1: what time-slicing shares out.
    pub busy: f64,
    /// The model description the user would pass as `--carma-model`
    /// (`model_summary`, relative to the table's `model-summaries/`), the
    /// batch size per GPU (`--carma-batch-size`) and the sequence length
    /// (`--carma-seq-len`): what our estimator reads. The table gives the
    /// first two; [`apply_job_options`] sets what the job's script says.
    pub model_file: Option<String>,
    pub batch_size: Option<u32>,
    pub seq_len: Option<u32>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TraceJob {
    pub seq: u32,
    pub submit_s: f64,
    pub workload: String,
}

/// Solo SM activity by dataset, when the table has no `sm_activity` column:
/// large-image CNNs and transformers keep an A100 busy, CIFAR-sized and
/// MNIST jobs barely do. Documented assumptions, not measurements.
pub fn default_sm(dataset: &str) -> f64 {
    match dataset {
        "imagenet" => 0.65,
        "wikitext-2" => 0.75,
        "coco" | "voc" => 0.60,
        "cifar100" => 0.25,
        "mnist" => 0.10,
        "criteo-terabyte" => 0.40,
        _ => 0.50,
    }
}

/// Solo busy fraction when nothing better is known: on the H100 every
/// measured training job was busy about 1.2–2× its SM activity
/// (data/h100/collocation.csv), so twice the SM activity, at most 1.
pub fn default_busy(sm: f64) -> f64 {
    (2.0 * sm).min(1.0)
}

fn rows(path: &Path) -> Result<(Vec<String>, Vec<Vec<String>>), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<String> = lines
        .next()
        .ok_or_else(|| format!("{}: empty", path.display()))?
        .split(',')
        .map(|s| s.trim().to_string())
        .collect();
    let body = lines.map(|l| l.split(',').map(|s| s.trim().to_string()).collect()).collect();
    Ok((header, body))
}

/// The index of a required column, or an error naming the file and column.
fn column(header: &[String], name: &str, path: &Path) -> Result<usize, String> {
    header.iter().position(|c| c == name).ok_or_else(|| format!("{}: no column '{name}'", path.display()))
}

pub fn read_workloads(path: &Path) -> Result<HashMap<String, Workload>, String> {
    let (h, body) = rows(path)?;
    let col = |name: &str| h.iter().position(|c| c == name);
    let need = |name: &str| column(&h, name, path);
    let (iw, ig, ipk) = (need("workload")?, need("gpus")?, need("measured_peak_mib")?);
    let (iex, imin, iep) = (col("exclusive_minutes"), col("minutes_per_epoch"), col("epochs"));
    let (ids, ism, ibusy) = (col("dataset"), col("sm_activity"), col("busy"));
    let (imodel, ibatch) = (col("model_summary"), col("batch_size"));
    let mut out = HashMap::new();
    for (n, r) in body.iter().enumerate() {
        let line = n + 2;
        let get = |i: usize| r.get(i).map(String::as_str).unwrap_or("");
        let num = |i: usize, what: &str| {
            get(i)
                .parse::<f64>()
                .map_err(|_| format!("{} line {line}: {what} '{}' is not a number", path.display(), get(i)))
        };
        let minutes = match iex.map(get).filter(|s| !s.is_empty()) {
            Some(m) => {
                m.parse::<f64>().map_err(|_| format!("{} line {line}: exclusive_minutes '{m}'", path.display()))?
            }
            // Missing run time (the paper's mnist row): minutes per epoch × epochs, else 1 minute.
            None => match (
                imin.map(get).and_then(|s| s.parse::<f64>().ok()),
                iep.map(get).and_then(|s| s.parse::<f64>().ok()),
            ) {
                (Some(m), Some(e)) => m * e,
                _ => 1.0,
            },
        };
        let mut estimates = HashMap::new();
        for (i, c) in h.iter().enumerate() {
            if let Some(name) = c.strip_suffix("_estimate_mib")
                && let Ok(v) = get(i).parse::<u64>()
            {
                estimates.insert(name.to_string(), v);
            }
        }
        let sm = match ism.map(get).filter(|s| !s.is_empty()) {
            Some(s) => s.parse::<f64>().map_err(|_| format!("{} line {line}: sm_activity '{s}'", path.display()))?,
            None => default_sm(ids.map(get).unwrap_or("")),
        };
        let busy = match ibusy.map(get).filter(|s| !s.is_empty()) {
            Some(s) => s.parse::<f64>().map_err(|_| format!("{} line {line}: busy '{s}'", path.display()))?,
            None => default_busy(sm),
        };
        let w = Workload {
            name: get(iw).to_string(),
            gpus: num(ig, "gpus")? as u32,
            solo_s: minutes * 60.0,
            peak_mib: num(ipk, "measured_peak_mib")? as u64,
            estimates,
            sm,
            busy,
            model_file: imodel.map(get).filter(|s| !s.is_empty()).map(str::to_string),
            batch_size: ibatch.map(get).and_then(|s| s.parse().ok()),
            seq_len: None,
        };
        out.insert(w.name.clone(), w);
    }
    Ok(out)
}

pub fn read_trace(path: &Path) -> Result<Vec<TraceJob>, String> {
    let (h, body) = rows(path)?;
    let col = |name: &str| column(&h, name, path);
    let (is, io, iw) = (col("seq")?, col("submit_offset_s")?, col("workload")?);
    let mut jobs = Vec::new();
    for (n, r) in body.iter().enumerate() {
        let bad = |what: &str| format!("{} line {}: bad {what}", path.display(), n + 2);
        jobs.push(TraceJob {
            seq: r.get(is).and_then(|s| s.parse().ok()).ok_or_else(|| bad("seq"))?,
            submit_s: r.get(io).and_then(|s| s.parse().ok()).ok_or_else(|| bad("submit_offset_s"))?,
            workload: r.get(iw).cloned().ok_or_else(|| bad("workload"))?,
        });
    }
    jobs.sort_by(|a, b| a.submit_s.total_cmp(&b.submit_s).then(a.seq.cmp(&b.seq)));
    Ok(jobs)
}

/// Solo readings of measured jobs (data/h100/collocation.csv: `timeslice`
/// rows with one job): name → (busy, SM activity).
pub fn read_solo_readings(path: &Path) -> Result<HashMap<String, (f64, f64)>, String> {
    Ok(crate::calibration::read_collocation(path)?
        .into_iter()
        .filter(|r| r.sharing == crate::model::Sharing::Timeslice && r.jobs.len() == 1)
        .map(|r| (r.jobs[0].clone(), (r.busy, r.sm)))
        .collect())
}

/// Sets each workload's busy fraction and SM activity from the measured job
/// a map names (`workload,measured_as[,why]`); returns how many it set.
pub fn apply_activity(
    workloads: &mut HashMap<String, Workload>,
    map: &Path,
    measured: &HashMap<String, (f64, f64)>,
) -> Result<usize, String> {
    let (h, body) = rows(map)?;
    let col = |name: &str| column(&h, name, map);
    let (iw, im) = (col("workload")?, col("measured_as")?);
    let mut set = 0;
    for (n, r) in body.iter().enumerate() {
        let get = |i: usize| r.get(i).map(String::as_str).unwrap_or("");
        let &(busy, sm) = measured
            .get(get(im))
            .ok_or_else(|| format!("{} line {}: no measured job '{}'", map.display(), n + 2, get(im)))?;
        if let Some(w) = workloads.get_mut(get(iw)) {
            w.busy = busy;
            w.sm = sm;
            set += 1;
        }
    }
    Ok(set)
}

/// One row of a job-options file: the options a workload's user gives
/// srun/sbatch (`--carma-batch-size` per GPU, `--carma-seq-len`; `None`:
/// not given) and where they were read (`source`, free text).
#[derive(Debug, Clone, PartialEq)]
pub struct JobOptions {
    pub line: usize,
    pub workload: String,
    pub batch_size: Option<u32>,
    pub seq_len: Option<u32>,
    pub source: String,
}

/// Reads `workload,batch_size,seq_len[,source]` rows; an empty cell is an
/// option not given, anything else must be a whole number > 0.
pub fn read_job_options(path: &Path) -> Result<Vec<JobOptions>, String> {
    let (h, body) = rows(path)?;
    let col = |name: &str| column(&h, name, path);
    let (iw, ib, is) = (col("workload")?, col("batch_size")?, col("seq_len")?);
    let isrc = h.iter().position(|c| c == "source");
    let mut out = Vec::new();
    for (n, r) in body.iter().enumerate() {
        let get = |i: usize| r.get(i).map(String::as_str).unwrap_or("");
        let whole =
            |i: usize, what: &str| match get(i) {
                "" => Ok(None),
                v => v.parse::<u32>().ok().filter(|&x| x > 0).map(Some).ok_or_else(|| {
                    format!("{} line {}: {what} '{v}' is not a whole number > 0", path.display(), n + 2)
                }),
            };
        out.push(JobOptions {
            line: n + 2,
            workload: get(iw).to_string(),
            batch_size: whole(ib, "batch_size")?,
            seq_len: whole(is, "seq_len")?,
            // The last column may hold commas.
            source: isrc.map(|i| r.get(i..).unwrap_or_default().join(",")).unwrap_or_default(),
        });
    }
    Ok(out)
}

/// Sets the options each job's user would give srun/sbatch from a
/// job-options file ([`read_job_options`]; `batch_size` is per GPU, an
/// option not given keeps what the table says); returns the rows read.
/// A row naming no workload of the table is an error: a typo would
/// otherwise leave a job's estimate silently unchanged.
pub fn apply_job_options(workloads: &mut HashMap<String, Workload>, path: &Path) -> Result<Vec<JobOptions>, String> {
    let opts = read_job_options(path)?;
    for o in &opts {
        let w = workloads
            .get_mut(&o.workload)
            .ok_or_else(|| format!("{} line {}: no workload '{}' in the table", path.display(), o.line, o.workload))?;
        w.batch_size = o.batch_size.or(w.batch_size);
        w.seq_len = o.seq_len.or(w.seq_len);
    }
    Ok(opts)
}

/// Draws in [0, 1) from a deterministic generator started at `seed` (a
/// linear congruential one: the same seed, the same draws, on any machine).
pub fn draws(seed: u64) -> impl FnMut() -> f64 {
    let mut state = seed;
    move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) as f64 / (1u64 << 31) as f64
    }
}

/// A synthetic trace: `jobs` of the table's single-GPU workloads, each
/// shortened 10x (at least 30 s), arriving every `mean_gap_s` on average,
/// drawn by a deterministic generator from `seed`. Returns the trace and
/// the shortened workloads it names.
pub fn synthetic(
    workloads: &HashMap<String, Workload>,
    jobs: u32,
    mean_gap_s: f64,
    seed: u64,
) -> (Vec<TraceJob>, HashMap<String, Workload>) {
    let mut names: Vec<&String> = workloads.iter().filter(|(_, x)| x.gpus == 1).map(|(k, _)| k).collect();
    names.sort();
    let short = workloads
        .iter()
        .map(|(k, x)| (k.clone(), Workload { solo_s: (x.solo_s / 10.0).max(30.0), ..x.clone() }))
        .collect();
    let mut next = draws(seed);
    let mut at = 0.0;
    let trace = (0..jobs)
        .map(|i| {
            at += next() * 2.0 * mean_gap_s;
            let workload = names[(next() * names.len() as f64) as usize % names.len().max(1)].clone();
            TraceJob { seq: i, submit_s: at, workload }
        })
        .collect();
    (trace, short)
}
