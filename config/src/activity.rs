//! Which GPU reading the placement precondition caps.

use std::fmt;

/// SM activity (DCGM SMACT, NVML GPM SM_UTIL: how much of the SMs work) or
/// busy time (NVML utilization.gpu: the share of time any kernel runs).
/// Time-slicing exhausts busy time long before SM activity, and a
/// time-sliced GPU reads less SM activity the more jobs slow each other
/// (docs/simulation.md); under MPS kernels overlap and SM activity says
/// how much room is left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActivityMetric {
    #[default]
    Sm,
    Busy,
}

impl ActivityMetric {
    /// The name carma.yaml, `CARMA_DECISION` and the logs use.
    pub fn name(self) -> &'static str {
        match self {
            ActivityMetric::Sm => "sm",
            ActivityMetric::Busy => "busy",
        }
    }

    /// How reasons and `carma status` spell the reading.
    pub fn label(self) -> &'static str {
        match self {
            ActivityMetric::Sm => "SM activity",
            ActivityMetric::Busy => "busy",
        }
    }

    pub fn parse(s: &str) -> Result<ActivityMetric, String> {
        match s {
            "sm" => Ok(ActivityMetric::Sm),
            "busy" => Ok(ActivityMetric::Busy),
            _ => {
                Err(format!("unknown metric '{s}'; expected sm (SM activity) or busy (share of time any kernel runs)"))
            }
        }
    }
}

impl fmt::Display for ActivityMetric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
