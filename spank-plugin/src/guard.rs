//! The barrier between Slurm and Rust: no panic crosses it, every failure
//! becomes one log line and `-1` (SPANK's error code).

use crate::error::Error;
use std::panic::{AssertUnwindSafe, catch_unwind};

pub const SPANK_OK: i32 = 0;
pub const SPANK_FAIL: i32 = -1;

/// Runs a hook body; `Ok` → 0, `Err` or panic → one line through `log`, -1.
pub fn guard_with(hook: &str, log: &dyn Fn(&str), body: impl FnOnce() -> Result<(), Error>) -> i32 {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => SPANK_OK,
        Ok(Err(e)) => {
            log(&if hook.is_empty() { e.to_string() } else { format!("{hook}: {e}") });
            SPANK_FAIL
        }
        Err(payload) => {
            log(&format!("{hook}: {}", internal_error(payload.as_ref())));
            SPANK_FAIL
        }
    }
}

/// A caught panic as one line: `internal error: <its message>`.
pub fn internal_error(payload: &(dyn std::any::Any + Send)) -> String {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    format!("internal error: {}", crate::error::one_line(&what))
}

/// [`guard_with`] logging through Slurm at error level.
pub fn guard(hook: &str, body: impl FnOnce() -> Result<(), Error>) -> i32 {
    guard_with(hook, &crate::log::error, body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    fn run(body: impl FnOnce() -> Result<(), Error>) -> (i32, Vec<String>) {
        let lines = RefCell::new(Vec::new());
        let rc = guard_with("init_post_opt", &|l: &str| lines.borrow_mut().push(l.to_string()), body);
        (rc, lines.into_inner())
    }

    #[test]
    fn ok_returns_zero_and_logs_nothing() {
        assert_eq!(run(|| Ok(())), (SPANK_OK, vec![]));
    }

    #[test]
    fn error_returns_minus_one_with_one_line() {
        let (rc, lines) = run(|| Err(Error::msg("state lock: timed out after 5s")));
        assert_eq!(rc, SPANK_FAIL);
        assert_eq!(lines, vec!["init_post_opt: state lock: timed out after 5s".to_string()]);
    }

    #[test]
    fn panic_is_caught_and_logged_as_one_line() {
        let (rc, lines) = run(|| panic!("index out of bounds\nsecond line"));
        assert_eq!(rc, SPANK_FAIL);
        assert_eq!(lines.len(), 1);
        assert!(lines[0].starts_with("init_post_opt: internal error: index out of bounds"), "{lines:?}");
        assert!(!lines[0].contains('\n'));
        let (rc, lines) = run(|| {
            let v: Vec<u32> = Vec::new();
            let _ = v[3];
            Ok(())
        });
        assert_eq!(rc, SPANK_FAIL);
        assert!(lines[0].contains("index out of bounds"), "{lines:?}");
    }
}
