//! Human-friendly sizes and durations, as admins and users write them.

use std::time::Duration;

/// Parses a memory size into MiB. Accepts a plain number (MiB) or a number
/// with a binary suffix: `K`, `M`, `G`, `T` (optionally followed by `iB`/`B`).
/// `12G` = 12288 MiB; `1500M` = 1500 MiB; `512K` rounds up to 1 MiB.
pub fn parse_size_mib(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty size".into());
    }
    let split = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!("'{t}' does not start with a number"));
    }
    let value: f64 = num.parse().map_err(|_| format!("'{num}' is not a number"))?;
    let per_mib: f64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "M" | "MB" | "MIB" => 1.0,
        "K" | "KB" | "KIB" => 1.0 / 1024.0,
        "G" | "GB" | "GIB" => 1024.0,
        "T" | "TB" | "TIB" => 1024.0 * 1024.0,
        other => return Err(format!("unknown unit '{other}' (use K, M, G or T)")),
    };
    let mib = (value * per_mib).ceil();
    // 1 PiB is far beyond any GPU; larger values are typos, not requests.
    if !mib.is_finite() || mib > (1u64 << 30) as f64 {
        return Err(format!("'{t}' is too large"));
    }
    Ok(mib as u64)
}

/// Parses a duration: a plain number (seconds) or a number with `ms`, `s`,
/// `m` or `h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!("'{t}' does not start with a number"));
    }
    let value: f64 = num.parse().map_err(|_| format!("'{num}' is not a number"))?;
    let secs = match unit.trim() {
        "" | "s" => value,
        "ms" => value / 1000.0,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        other => return Err(format!("unknown unit '{other}' (use ms, s, m or h)")),
    };
    if !secs.is_finite() || secs > 7.0 * 24.0 * 3600.0 {
        return Err(format!("'{t}' is longer than a week"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size_mib("12G"), Ok(12 * 1024));
        assert_eq!(parse_size_mib("12000M"), Ok(12000));
        assert_eq!(parse_size_mib("12000"), Ok(12000));
        assert_eq!(parse_size_mib("1.5GiB"), Ok(1536));
        assert_eq!(parse_size_mib("512K"), Ok(1));
        assert_eq!(parse_size_mib("2t"), Ok(2 * 1024 * 1024));
        assert!(parse_size_mib("").is_err());
        assert!(parse_size_mib("G").is_err());
        assert!(parse_size_mib("-5G").is_err());
        assert!(parse_size_mib("5X").unwrap_err().contains("unknown unit"));
        assert!(parse_size_mib("99999999999999999999G").is_err());
        assert!(parse_size_mib("1.2.3G").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("3d").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("1000h").is_err());
    }
}
