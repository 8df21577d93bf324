//! The six CARMA placement policies and their user-facing names.

use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Policy {
    /// Only GPUs with no processes and no reservations.
    Exclusive,
    /// Round-robin over the eligible GPUs (cursor kept in node state).
    RoundRobin,
    /// Most available GPU memory.
    Magm,
    /// First eligible GPU by index.
    FirstFit,
    /// Least free memory that still fits.
    BestFit,
    /// Least utilized (lowest SM activity).
    LeastUtilized,
}

impl Policy {
    pub const ALL: [Policy; 6] =
        [Policy::Exclusive, Policy::RoundRobin, Policy::Magm, Policy::FirstFit, Policy::BestFit, Policy::LeastUtilized];
    pub const ACCEPTED: &'static str = "exclusive, rr, magm, ff, bf, lug";

    pub fn name(self) -> &'static str {
        match self {
            Policy::Exclusive => "exclusive",
            Policy::RoundRobin => "rr",
            Policy::Magm => "magm",
            Policy::FirstFit => "ff",
            Policy::BestFit => "bf",
            Policy::LeastUtilized => "lug",
        }
    }
}

impl FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Policy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("'{s}' is not a policy; use one of {}", Policy::ACCEPTED))
    }
}

impl TryFrom<String> for Policy {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<Policy> for String {
    fn from(p: Policy) -> String {
        p.name().to_string()
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in Policy::ALL {
            assert_eq!(p.name().parse::<Policy>(), Ok(p));
            assert!(Policy::ACCEPTED.contains(p.name()));
        }
        assert!("MAGM".parse::<Policy>().is_err());
        assert!("".parse::<Policy>().is_err());
    }
}
