//! The raw carma.yaml ([`super::raw`]) validated into the typed [`Config`]:
//! one function per section of the file, each error naming its key.

use super::ConfigError;
use super::defaults::DEFAULT_METRICS_ADDR;
use super::raw::{RawConfig, RawEstimator, RawLearnRuntime, RawMonitor, RawRecovery, RawScope, RawTimeouts, Scalar};
use super::typed::{
    Config, EstimatorConfig, EstimatorMethod, GpuSource, HttpEndpoint, LearnRuntime, MonitorConfig, NoFitAction,
    RecoveryMode, Timeouts, UnknownEstimate,
};
use crate::activity::ActivityMetric;
use crate::gpu_owner::GpuOwner;
use crate::scope::{self, Scope};
use crate::sharing::Sharing;
use crate::units::{parse_duration, parse_size_mib};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

impl RawConfig {
    pub(super) fn validate(self, path: &Path) -> Result<Config, ConfigError> {
        let v = Check { path };
        let mut c = Config { path: path.to_path_buf(), ..Config::default() };
        v.placement(&self, &mut c)?;
        if let Some(m) = &self.monitor {
            v.monitor(m, &mut c.monitor)?;
        }
        v.sharing(&self, &mut c)?;
        // Under MPS a step alone on an idle GPU is predicted 1.14x (MPS's
        // own cost): a bound at or below that refuses every shared step.
        if c.sharing == Sharing::Mps && c.max_slowdown <= crate::sharing::MPS_SOLO_SLOWDOWN {
            return Err(v.bad(
                "max_slowdown",
                format!(
                    "{} refuses every shared step under sharing: mps, where a job alone runs {}x slower than a plain process; use more than that (1.6 admits pairs of light jobs), or off",
                    c.max_slowdown,
                    crate::sharing::MPS_SOLO_SLOWDOWN
                ),
            ));
        }
        v.gpus(&self, &mut c)?;
        v.paths(&self, &mut c)?;
        v.no_fit(&self, &mut c)?;
        if let Some(r) = &self.recovery {
            v.recovery(r, &mut c)?;
        }
        v.oom_patterns(self.oom_patterns, self.extra_oom_patterns, &mut c.oom_patterns)?;
        if let Some(t) = &self.timeouts {
            v.timeouts(t, &mut c.timeouts)?;
        }
        if let Some(e) = &self.estimator {
            v.estimator(e, &mut c.estimator)?;
        }
        for (i, raw) in self.transparent.into_iter().flatten().enumerate() {
            c.transparent.push(v.transparent_scope(i, raw)?);
        }
        for (i, raw) in self.admission.into_iter().flatten().enumerate() {
            c.admission.push(v.admission_scope(i, raw)?);
        }
        Ok(c)
    }
}

/// Makes the one-line errors for one file, and reads the kinds of value
/// that several sections share (sizes, durations, absolute paths).
struct Check<'a> {
    path: &'a Path,
}

impl Check<'_> {
    fn bad(&self, key: &str, message: String) -> ConfigError {
        ConfigError { path: self.path.to_path_buf(), key: key.to_string(), message }
    }

    fn size(&self, key: &str, v: &Scalar) -> Result<u64, ConfigError> {
        parse_size_mib(&v.to_string()).map_err(|e| self.bad(key, format!("{e}; write a size like 2G or 2048M")))
    }

    fn duration(&self, key: &str, v: &Scalar) -> Result<Duration, ConfigError> {
        parse_duration(&v.to_string()).map_err(|e| self.bad(key, format!("{e}; write a duration like 60s or 5m")))
    }

    fn abs_path(&self, key: &str, v: &str) -> Result<PathBuf, ConfigError> {
        let p = PathBuf::from(v);
        if p.is_absolute() { Ok(p) } else { Err(self.bad(key, format!("'{v}' is not an absolute path"))) }
    }

    /// The placement preconditions: default policy, the capped reading
    /// and its caps, headroom and the activity window.
    fn placement(&self, raw: &RawConfig, c: &mut Config) -> Result<(), ConfigError> {
        if let Some(p) = &raw.default_policy {
            c.default_policy = p.parse().map_err(|e| self.bad("default_policy", e))?;
        }
        if let Some(m) = &raw.activity_metric {
            c.activity_metric = ActivityMetric::parse(m).map_err(|e| self.bad("activity_metric", e))?;
        }
        for (key, value, field) in [
            ("sm_activity_cap", raw.sm_activity_cap, &mut c.sm_activity_cap),
            ("busy_cap", raw.busy_cap, &mut c.busy_cap),
        ] {
            if let Some(cap) = value {
                if !(0.05..=1.0).contains(&cap) {
                    return Err(self.bad(key, format!("{cap} is out of range; use a fraction from 0.05 to 1.0")));
                }
                *field = cap;
            }
        }
        if let Some(v) = &raw.max_slowdown {
            c.max_slowdown = self.slowdown_bound("max_slowdown", v)?;
        }
        if let Some(v) = &raw.max_slowdown_unprofiled {
            c.max_slowdown_unprofiled = self.slowdown_bound("max_slowdown_unprofiled", v)?;
        }
        // Unset, it follows max_slowdown up (Params::unprofiled_bound).
        if raw.max_slowdown_unprofiled.is_some()
            && c.max_slowdown.is_finite()
            && c.max_slowdown_unprofiled < c.max_slowdown
        {
            return Err(self.bad(
                "max_slowdown_unprofiled",
                format!(
                    "{} is below max_slowdown {}; a job not yet profiled is bounded at least as loosely (raise it or remove it)",
                    c.max_slowdown_unprofiled, c.max_slowdown
                ),
            ));
        }
        if let Some(v) = raw.idle_first {
            c.idle_first = v;
        }
        if let Some(v) = &raw.headroom {
            c.headroom_mib = self.size("headroom", v)?;
        }
        if let Some(v) = &raw.monitor_window {
            c.monitor_window = self.duration("monitor_window", v)?;
            if c.monitor_window < Duration::from_secs(1) {
                return Err(self.bad("monitor_window", "must be at least 1s".into()));
            }
        }
        Ok(())
    }

    /// A slowdown bound: a factor from 1.05 to 10, or `off`.
    fn slowdown_bound(&self, key: &str, v: &Scalar) -> Result<f64, ConfigError> {
        let text = v.to_string();
        match text.trim() {
            "off" => Ok(f64::INFINITY),
            t => match t.parse::<f64>() {
                Ok(x) if (1.05..=10.0).contains(&x) => Ok(x),
                _ => Err(self.bad(
                    key,
                    format!("'{text}' is not a bound; use a factor from 1.05 to 10 (1.6: a shared job runs at most 1.6x slower than alone) or off"),
                )),
            },
        }
    }

    /// `monitor:`, carma-monitor's sampling, publishing and serving.
    fn monitor(&self, m: &RawMonitor, c: &mut MonitorConfig) -> Result<(), ConfigError> {
        if let Some(p) = m.published {
            c.published = p;
        }
        if let Some(v) = &m.interval {
            c.interval = self.duration("monitor.interval", v)?;
            if !(Duration::from_millis(100)..=Duration::from_secs(60)).contains(&c.interval) {
                return Err(self.bad("monitor.interval", "use 100ms to 60s".into()));
            }
        }
        if let Some(v) = &m.stale_after {
            c.stale_after = self.duration("monitor.stale_after", v)?;
        }
        if let Some(url) = &m.dcgm_exporter {
            c.dcgm_exporter = Some(HttpEndpoint::parse(url).map_err(|e| self.bad("monitor.dcgm_exporter", e))?);
        }
        if let Some(n) = &m.slurm_node {
            scope::valid_name(n).map_err(|e| self.bad("monitor.slurm_node", e))?;
            c.slurm_node = Some(n.clone());
        }
        if let Some(v) = &m.admission_interval {
            c.admission_interval = self.duration("monitor.admission_interval", v)?;
            if !(Duration::from_secs(1)..=Duration::from_secs(600)).contains(&c.admission_interval) {
                return Err(self.bad("monitor.admission_interval", "use 1s to 600s".into()));
            }
        }
        if let Some(a) = &m.metrics {
            c.metrics = self.metrics_addr(a)?;
        }
        if c.stale_after < 2 * c.interval {
            return Err(self.bad("monitor.stale_after", "must be at least twice monitor.interval".into()));
        }
        Ok(())
    }

    /// `monitor.metrics`: an IP:PORT to serve on, or `off`.
    fn metrics_addr(&self, a: &str) -> Result<Option<SocketAddr>, ConfigError> {
        if a == "off" {
            return Ok(None);
        }
        match a.parse::<SocketAddr>() {
            Ok(addr) if addr.port() != 0 => Ok(Some(addr)),
            _ => Err(self.bad(
                "monitor.metrics",
                format!(
                    "'{a}' is not IP:PORT; write e.g. {DEFAULT_METRICS_ADDR} (or 0.0.0.0:9402 for every interface), or off"
                ),
            )),
        }
    }

    /// How collocated jobs share a GPU: `sharing`, `gpu_owner` and `mps:`.
    fn sharing(&self, raw: &RawConfig, c: &mut Config) -> Result<(), ConfigError> {
        if let Some(m) = &raw.sharing {
            c.sharing = Sharing::parse(m).map_err(|e| self.bad("sharing", e))?;
        }
        if let Some(m) = &raw.gpu_owner {
            c.gpu_owner = GpuOwner::parse(m).map_err(|e| self.bad("gpu_owner", e))?;
        }
        if let Some(m) = &raw.mps {
            if let Some(d) = &m.pipe_dir {
                c.mps.pipe_dir = self.abs_path("mps.pipe_dir", d)?;
            }
            if let Some(d) = &m.log_dir {
                c.mps.log_dir = self.abs_path("mps.log_dir", d)?;
            }
        }
        Ok(())
    }

    /// Which GPUs CARMA may place on (`gpu_indices`) and where their
    /// readings come from (`gpu_source`).
    fn gpus(&self, raw: &RawConfig, c: &mut Config) -> Result<(), ConfigError> {
        if let Some(list) = &raw.gpu_indices {
            let mut seen = std::collections::BTreeSet::new();
            if list.is_empty() || !list.iter().all(|i| *i < 1024 && seen.insert(*i)) {
                return Err(self.bad(
                    "gpu_indices",
                    format!("{list:?}: list each GPU index gres.conf gives Slurm once, e.g. [0, 1, 3]"),
                ));
            }
            c.gpu_indices = Some(list.clone());
        }
        if let Some(v) = &raw.gpu_source {
            c.gpu_source = parse_gpu_source(v).map_err(|m| self.bad("gpu_source", m))?;
            match &c.gpu_source {
                GpuSource::Simulated(p) => {
                    self.abs_path("gpu_source.simulated", &p.to_string_lossy())?;
                }
                GpuSource::Nvml { library: Some(p) } => {
                    self.abs_path("gpu_source.nvml.library", &p.to_string_lossy())?;
                }
                GpuSource::Nvml { library: None } => {}
            }
        }
        Ok(())
    }

    /// Where CARMA keeps state, logs, and finds Slurm's commands.
    fn paths(&self, raw: &RawConfig, c: &mut Config) -> Result<(), ConfigError> {
        if let Some(d) = &raw.state_dir {
            c.state_dir = self.abs_path("state_dir", d)?;
        }
        if let Some(f) = &raw.log_file {
            c.log_file = Some(self.abs_path("log_file", f)?);
        }
        if let Some(d) = &raw.slurm_bin_dir {
            c.slurm_bin_dir = Some(self.abs_path("slurm_bin_dir", d)?);
        }
        Ok(())
    }

    /// What a job without an estimate is given (`unknown_estimate`), and
    /// what a step does when no GPU fits (`no_fit`, `max_hand_backs`,
    /// `hand_back_pause`).
    fn no_fit(&self, raw: &RawConfig, c: &mut Config) -> Result<(), ConfigError> {
        if let Some(v) = &raw.unknown_estimate {
            c.unknown_estimate = match v {
                Scalar::Text(t) if t == "exclusive" => UnknownEstimate::Exclusive,
                other => UnknownEstimate::Mib(self.size("unknown_estimate", other).map_err(|_| {
                    self.bad("unknown_estimate", format!("'{other}' is neither 'exclusive' nor a size like 8G"))
                })?),
            };
        }
        if let Some(a) = &raw.no_fit {
            c.no_fit = match a.as_str() {
                "wait" => NoFitAction::Wait,
                "fail" => NoFitAction::Fail,
                "hand_back" => NoFitAction::HandBack,
                _ => {
                    return Err(self.bad("no_fit", format!("'{a}' is not an action; use wait, fail or hand_back")));
                }
            };
        }
        if let Some(n) = raw.max_hand_backs {
            if n > 10 {
                return Err(self.bad("max_hand_backs", format!("{n} is out of range; use 0 to 10")));
            }
            c.max_hand_backs = n;
        }
        if let Some(v) = &raw.hand_back_pause {
            let d = self.duration("hand_back_pause", v)?;
            if d > Duration::from_secs(3600) {
                return Err(self.bad("hand_back_pause", format!("{v} is out of range; use 0s to 1h")));
            }
            c.hand_back_pause = d;
        }
        if let Some(n) = raw.max_pauses {
            if !(1..=1000).contains(&n) {
                return Err(self.bad(
                    "max_pauses",
                    format!(
                        "{n} is out of range; use 1 to 1000 (hand_back_pause: 0s fails the job instead of pausing it)"
                    ),
                ));
            }
            c.max_pauses = n;
        }
        Ok(())
    }

    /// `recovery:`, how an OOM-crashed job is rerun.
    fn recovery(&self, r: &RawRecovery, c: &mut Config) -> Result<(), ConfigError> {
        if let Some(m) = &r.mode {
            c.recovery_mode = RecoveryMode::parse(m).ok_or_else(|| {
                self.bad("recovery.mode", format!("'{m}' is not a mode; use exclusive, none or looser"))
            })?;
        }
        if let Some(n) = r.max_recoveries {
            if n > 10 {
                return Err(self.bad("recovery.max_recoveries", format!("{n} is out of range; use 0 to 10")));
            }
            c.max_recoveries = n;
        }
        if let Some(v) = &r.looser_margin {
            c.looser_margin_mib = self.size("recovery.looser_margin", v)?;
        }
        Ok(())
    }

    /// `oom_patterns` replaces the built-in list, `extra_oom_patterns`
    /// adds to it.
    fn oom_patterns(
        &self,
        replace: Option<Vec<String>>,
        extra: Option<Vec<String>>,
        patterns: &mut Vec<String>,
    ) -> Result<(), ConfigError> {
        if let Some(p) = replace {
            *patterns = p;
        }
        patterns.extend(extra.unwrap_or_default());
        if let Some(i) = patterns.iter().position(|p| p.trim().len() < 4) {
            return Err(self.bad(
                "oom_patterns",
                format!("pattern {} is shorter than 4 characters and would match almost anything", i + 1),
            ));
        }
        Ok(())
    }

    fn timeouts(&self, t: &RawTimeouts, c: &mut Timeouts) -> Result<(), ConfigError> {
        if let Some(v) = &t.lock {
            c.lock = self.duration("timeouts.lock", v)?;
        }
        if let Some(v) = &t.wait {
            c.wait = self.duration("timeouts.wait", v)?;
        }
        if let Some(v) = &t.poll {
            c.poll = self.duration("timeouts.poll", v)?;
        }
        if let Some(v) = &t.gpu_read {
            c.gpu_read = self.duration("timeouts.gpu_read", v)?;
            if !(Duration::from_millis(100)..=Duration::from_secs(60)).contains(&c.gpu_read) {
                return Err(self.bad("timeouts.gpu_read", "give 100ms to 60s".into()));
            }
        }
        if c.lock.is_zero() || c.poll.is_zero() {
            return Err(self.bad("timeouts", "lock and poll must be longer than 0".into()));
        }
        Ok(())
    }

    fn estimator(&self, e: &RawEstimator, c: &mut EstimatorConfig) -> Result<(), ConfigError> {
        if let Some(v) = &e.runtime {
            c.runtime_mib = self.size("estimator.runtime", v)?;
            if c.runtime_mib > 64 * 1024 {
                return Err(self.bad("estimator.runtime", "more than 64G is not a runtime overhead".into()));
            }
        }
        if let Some(m) = e.method.as_deref() {
            c.method = match m {
                "continuous" => EstimatorMethod::Continuous,
                "gpumemnet" => EstimatorMethod::Gpumemnet,
                _ => return Err(self.bad("estimator.method", format!("'{m}' is unknown; use continuous or gpumemnet"))),
            };
        }
        if let Some(l) = &e.learn_runtime {
            self.learn_runtime(l, &mut c.learn_runtime)?;
        }
        Ok(())
    }

    fn learn_runtime(&self, l: &RawLearnRuntime, d: &mut LearnRuntime) -> Result<(), ConfigError> {
        let key = |f: &str| format!("estimator.learn_runtime.{f}");
        d.min_jobs = l.min_jobs.unwrap_or(d.min_jobs);
        d.window = l.window.unwrap_or(d.window);
        if !(1..=256).contains(&d.window) {
            return Err(self.bad(&key("window"), format!("{} is out of range; use 1 to 256 jobs", d.window)));
        }
        if d.min_jobs > d.window {
            let m = format!("{} is more than window ({}); use at most the window", d.min_jobs, d.window);
            return Err(self.bad(&key("min_jobs"), m));
        }
        if let Some(q) = l.quantile {
            if !(0.5..=1.0).contains(&q) {
                return Err(
                    self.bad(&key("quantile"), format!("{q} is out of range; use 0.5 to 1 (0.75: the upper quartile)"))
                );
            }
            d.quantile = q;
        }
        if let Some(v) = &l.max {
            d.max_mib = self.size(&key("max"), v)?;
            if d.max_mib > 64 * 1024 {
                return Err(self.bad(&key("max"), "more than 64G is not a runtime overhead".into()));
            }
        }
        Ok(())
    }

    /// `transparent[i]`: selectors, and the scope's policy and default size.
    fn transparent_scope(&self, i: usize, raw: RawScope) -> Result<Scope, ConfigError> {
        let key = |field: &str| format!("transparent[{i}].{field}");
        let mut s = self.selectors(&key, &raw)?;
        s.policy = raw.policy.map(|p| p.parse().map_err(|e| self.bad(&key("policy"), e))).transpose()?;
        s.default_mib = raw.default_mem.as_ref().map(|v| self.size(&key("default_mem"), v)).transpose()?;
        if s.partition.is_none() && s.account.is_none() && s.qos.is_none() {
            return Err(self.bad(
                &format!("transparent[{i}]"),
                "names no partition, account or qos; give at least one (an entry for every job would collocate the whole cluster)".into(),
            ));
        }
        Ok(s)
    }

    /// `admission[i]`: selectors only.
    fn admission_scope(&self, i: usize, raw: RawScope) -> Result<Scope, ConfigError> {
        let key = |field: &str| format!("admission[{i}].{field}");
        if raw.policy.is_some() || raw.default_mem.is_some() {
            let field = if raw.policy.is_some() { "policy" } else { "default_mem" };
            return Err(self.bad(
                &key(field),
                "admission scopes name only partition, account or qos (policies and sizes belong to transparent:)"
                    .into(),
            ));
        }
        let s = self.selectors(&key, &raw)?;
        if s.partition.is_none() && s.account.is_none() && s.qos.is_none() {
            return Err(
                self.bad(&format!("admission[{i}]"), "names no partition, account or qos; give at least one".into())
            );
        }
        Ok(s)
    }

    /// A scope with `raw`'s partition, account and QOS names (checked in
    /// that order), and no policy or default size yet.
    fn selectors(&self, key: &dyn Fn(&str) -> String, raw: &RawScope) -> Result<Scope, ConfigError> {
        let name = |field: &str, v: &Option<String>| -> Result<Option<String>, ConfigError> {
            v.as_ref()
                .map(|v| scope::valid_name(v).map(|()| v.clone()).map_err(|e| self.bad(&key(field), e)))
                .transpose()
        };
        Ok(Scope {
            partition: name("partition", &raw.partition)?,
            account: name("account", &raw.account)?,
            qos: name("qos", &raw.qos)?,
            policy: None,
            default_mib: None,
        })
    }
}

/// `gpu_source`: `nvml`, `{nvml: {library: PATH}}` or `{simulated: PATH}`.
fn parse_gpu_source(v: &serde_yaml::Value) -> Result<GpuSource, String> {
    const HINT: &str =
        "use 'nvml', '{nvml: {library: /path/to/libnvidia-ml.so.1}}' or '{simulated: /path/to/gpus.yaml}'";
    match v {
        serde_yaml::Value::String(s) if s == "nvml" => Ok(GpuSource::Nvml { library: None }),
        serde_yaml::Value::Mapping(m) if m.len() == 1 => match (m.get("simulated"), m.get("nvml")) {
            (Some(serde_yaml::Value::String(p)), _) => Ok(GpuSource::Simulated(PathBuf::from(p))),
            (_, Some(serde_yaml::Value::Mapping(n))) if n.len() == 1 => match n.get("library") {
                Some(serde_yaml::Value::String(p)) => Ok(GpuSource::Nvml { library: Some(PathBuf::from(p)) }),
                _ => Err(format!("nvml: the only key is library; {HINT}")),
            },
            _ => Err(format!("unknown source; {HINT}")),
        },
        _ => Err(format!("unknown source; {HINT}")),
    }
}
