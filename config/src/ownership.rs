//! Files root trusts because of what carma.yaml says (the file itself, the
//! NVML library it names, the log file it names) must not be writable by
//! anyone but root: owned by root, not group- or other-writable (group
//! root allowed), and the same for every directory above them, else a
//! user could swap the file or one of its directories. Checked only when
//! the reader runs as root; a user's own `carma --config` is their own.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// True when this process runs as root (the owner of /proc/self is the
/// effective uid).
pub fn running_as_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Why a non-root user could write `path` (or, when it does not exist,
/// create it), following symlinks; `None` when only root can.
pub fn writable_by_others(path: &Path) -> Option<String> {
    let mut checked = 0;
    let mut todo = vec![path.to_path_buf()];
    while let Some(p) = todo.pop() {
        checked += 1;
        if checked > 8 {
            return Some(format!("{}: too many symlinks to check", path.display()));
        }
        // Every existing component from / down, without following links.
        let mut at = PathBuf::new();
        // The last component was a root-owned sticky directory (/tmp): users
        // may add names there but not replace root's, so what exists below
        // it is judged on its own; what does not exist yet, a user could
        // create first.
        let mut below_sticky = false;
        for c in p.components() {
            at.push(c);
            let Ok(m) = std::fs::symlink_metadata(&at) else {
                if below_sticky {
                    return Some(format!(
                        "{} does not exist, and its directory is writable by every user: a user could create it first (create it as root, or move the file)",
                        at.display()
                    ));
                }
                break;
            };
            let mode = m.mode();
            let sticky_dir = m.is_dir() && mode & 0o1000 != 0 && at != p;
            below_sticky = false;
            let bad = if m.uid() != 0 {
                Some(format!("owned by uid {}", m.uid()))
            } else if m.file_type().is_symlink() {
                // A link's own mode means nothing; its target is checked below.
                let Ok(target) = std::fs::read_link(&at) else {
                    return Some(format!("{}: cannot read the link", at.display()));
                };
                let rest: PathBuf = p.strip_prefix(&at).map(Path::to_path_buf).unwrap_or_default();
                let base = at.parent().unwrap_or(Path::new("/"));
                todo.push(base.join(target).join(rest));
                break;
            } else if sticky_dir {
                below_sticky = true;
                None
            } else if mode & 0o002 != 0 {
                Some(format!("writable by every user (mode {:o})", mode & 0o7777))
            } else if mode & 0o020 != 0 && m.gid() != 0 {
                Some(format!("writable by group {} (mode {:o})", m.gid(), mode & 0o7777))
            } else {
                None
            };
            if let Some(why) = bad {
                let fix = if at == p {
                    "chown root:root; chmod go-w"
                } else {
                    "chown root:root; chmod go-w (or move the file)"
                };
                return Some(format!(
                    "{} is {why}; root will not trust a file a user could replace ({fix} {})",
                    at.display(),
                    at.display()
                ));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_writable_files_and_directories_are_named() {
        let d = std::env::temp_dir().join(format!("carma-own-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("sub")).unwrap();
        let set = |p: &Path, mode: u32| {
            std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap()
        };
        set(&d, 0o755);
        set(&d.join("sub"), 0o755);
        let f = d.join("sub/carma.yaml");
        std::fs::write(&f, "").unwrap();
        set(&f, 0o644);
        let root = running_as_root();
        if root {
            // /tmp is world-writable but sticky: root's directory below it
            // cannot be replaced, so what is inside is judged on its own.
            assert_eq!(writable_by_others(&f), None);
            assert_eq!(writable_by_others(Path::new("/etc/passwd")), None);
            assert_eq!(writable_by_others(Path::new("/etc/no-such-carma-file")), None, "missing under root-only dirs");
            // A name not yet taken in /tmp itself: a user could take it first.
            let w = writable_by_others(&std::env::temp_dir().join("no-such-carma-file")).unwrap();
            assert!(w.contains("a user could create it first"), "{w}");
            // A group- or world-writable directory without the sticky bit is refused.
            set(&d.join("sub"), 0o777);
            let w = writable_by_others(&f).unwrap();
            assert!(w.contains("writable by every user"), "{w}");
            set(&d.join("sub"), 0o755);
        } else {
            let why = writable_by_others(&f).expect("a file in a user's directory");
            assert!(why.contains("owned by uid"), "{why}");
        }
        // A link from a root-only place to a user-writable file is followed.
        if root {
            let link = PathBuf::from(format!("/run/carma-own-link-{}", std::process::id()));
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&f, &link).unwrap();
            set(&d.join("sub"), 0o777);
            let w = writable_by_others(&link);
            set(&d.join("sub"), 0o755);
            let _ = std::fs::remove_file(&link);
            assert!(w.is_some_and(|w| w.contains("writable by every user")));
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}
