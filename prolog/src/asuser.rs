//! Running a piece of work with a job user's credentials: files that users
//! name (their job's output) are never opened by root. The epilog re-executes
//! its own binary with the user's uid, gid and supplementary groups (as
//! slurmstepd runs the job: output in a group-shared project directory is
//! readable), no shell, bounded output and time. This module's `unsafe` is
//! the crate's only: the user database lookups and the credential switch
//! in the child.
#![allow(unsafe_code)]

use std::ffi::{CStr, OsString};
use std::process::{Command, Stdio};
use std::time::Duration;

#[derive(Debug, Clone, Copy)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
}

/// Runs this executable as `user` with `args`; returns its stdout (at most
/// `limit` bytes). The child is killed after `timeout`.
pub fn run_self_as(user: User, args: &[OsString], limit: usize, timeout: Duration) -> Result<Vec<u8>, String> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own executable: {e}"))?;
    // Where the user database cannot list them (NSS down), the user's own
    // gid alone: files readable by the user or that group are still read.
    let groups = groups_of(user).unwrap_or_else(|_| vec![user.gid]);
    let mut cmd = Command::new(exe);
    // SAFETY: the closure runs in the forked child before exec and makes
    // only async-signal-safe system calls (setgroups, setgid, setuid) on
    // memory allocated before the fork; no locks, no allocation.
    unsafe {
        cmd.pre_exec(move || {
            // Groups first, then gid, then uid: each needs root's rights.
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                || libc::setgid(user.gid) != 0
                || libc::setuid(user.uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd
        .args(args)
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start helper as uid {}: {e}", user.uid))?;
    match carma_placement::command::wait_bounded(child, limit as u64, timeout) {
        Some((_, out, _)) => Ok(out),
        None => Err(format!("helper as uid {} timed out after {:?}", user.uid, timeout)),
    }
}

/// The user's supplementary groups, as the system's user database (NSS)
/// lists them for login, the primary gid first.
pub fn groups_of(user: User) -> Result<Vec<libc::gid_t>, String> {
    let name = user_name(user.uid)?;
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    for _ in 0..8 {
        let mut n = groups.len() as libc::c_int;
        // SAFETY: `name` is a NUL-terminated string; `groups` holds `n`
        // entries, and getgrouplist writes at most `n` and sets `n` to the
        // count it has (or needs, when it returns -1).
        let rc = unsafe { libc::getgrouplist(name.as_ptr(), user.gid, groups.as_mut_ptr(), &mut n) };
        if rc >= 0 {
            groups.truncate(n.max(0) as usize);
            return Ok(groups);
        }
        // Too small: n says how many there are (glibc); grow and retry.
        groups.resize((n.max(0) as usize).max(groups.len() * 2).min(65536), 0);
    }
    Err(format!("cannot list the groups of uid {}", user.uid))
}

/// The login name of `uid`.
fn user_name(uid: u32) -> Result<std::ffi::CString, String> {
    let mut buf = vec![0u8; 4096];
    for _ in 0..6 {
        // SAFETY: an all-zero passwd is a valid value (null pointers, zero
        // ids), filled in by getpwuid_r.
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: `pwd` and `found` are valid for writes, `buf` holds
        // `buf.len()` bytes that getpwuid_r fills with the strings `pwd`
        // then points into; they are read below while `buf` lives.
        let rc = unsafe { libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr().cast(), buf.len(), &mut found) };
        if rc == libc::ERANGE {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if rc != 0 || found.is_null() || pwd.pw_name.is_null() {
            return Err(format!("uid {uid} is not in the user database"));
        }
        // SAFETY: getpwuid_r succeeded: pw_name points to a NUL-terminated
        // string inside `buf`.
        return Ok(unsafe { CStr::from_ptr(pwd.pw_name) }.to_owned());
    }
    Err(format!("uid {uid}: user database entry too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_has_its_groups_and_an_unknown_uid_is_refused() {
        let g = groups_of(User { uid: 0, gid: 0 }).unwrap();
        assert!(g.contains(&0), "{g:?}");
        // Every group /etc/group lists root in.
        let listed: Vec<u32> = std::fs::read_to_string("/etc/group")
            .unwrap()
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.len() == 4 && f[3].split(',').any(|m| m == "root")).then(|| f[2].parse().ok())?
            })
            .collect();
        for gid in listed {
            assert!(g.contains(&gid), "{gid} missing from {g:?}");
        }
        assert!(groups_of(User { uid: 3_999_999_999, gid: 0 }).unwrap_err().contains("not in the user database"));
    }
}
