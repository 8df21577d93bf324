//! Reading small files that someone else may have tampered with: no symlink
//! is followed, a FIFO or device is refused without blocking, and the size
//! is bounded.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The file's bytes, `None` if it does not exist, or why it cannot be read.
pub fn read_bounded(path: &Path, max: u64) -> Result<Option<Vec<u8>>, String> {
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot open ({e})")),
    };
    let meta = file.metadata().map_err(|e| format!("cannot stat ({e})"))?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    // Sized from the metadata, so a whole file comes in one read (plus the
    // one that finds its end).
    let mut buf = Vec::with_capacity(meta.len().min(max) as usize + 1);
    file.take(max + 1).read_to_end(&mut buf).map_err(|e| format!("cannot read ({e})"))?;
    if buf.len() as u64 > max {
        return Err(format!("larger than {max} bytes"));
    }
    Ok(Some(buf))
}

/// The mode of every file CARMA's root parts create in the state directory:
/// its owner's only. A user who can open a file there can hold its flock
/// (flock needs only a read descriptor) and stall every placement and
/// release on the node (issue 58); nothing running as a user reads them.
pub const PRIVATE_FILE_MODE: u32 = 0o600;

/// Opens a file of the state directory for reading and writing, creating
/// it with mode 0600 ([`PRIVATE_FILE_MODE`]), never through a symlink.
/// `truncate`: start empty.
pub fn open_for_write(path: &Path, truncate: bool) -> std::io::Result<File> {
    OpenOptions::new()
        .create(true)
        .truncate(truncate)
        .read(true)
        .write(true)
        .mode(PRIVATE_FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Replaces `path` with `bytes` (mode 0644: for files other users read,
/// such as the scopes file slurmctld's SlurmUser reads); see
/// [`write_atomic_mode`].
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic_mode(path, bytes, 0o644)
}

/// [`write_atomic`] for a file of the state directory: mode 0600.
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic_mode(path, bytes, PRIVATE_FILE_MODE)
}

/// Replaces `path` with `bytes` (created with `mode`), atomically: a new
/// temp file beside it (exclusive create, so never through a symlink or
/// into a FIFO someone planted), fsync, rename over `path`, fsync of the
/// directory. Every file CARMA's root parts write whole goes through here.
pub fn write_atomic_mode(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    let name = path.file_name().ok_or_else(|| std::io::Error::other(format!("{}: no file name", path.display())))?;
    let mut tmp_name = name.to_os_string();
    tmp_name.push(format!(".tmp.{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let create = || {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&tmp)
    };
    // A temp file of ours left by a killed process of the same pid (or
    // anything planted under its name) is removed, never opened.
    let mut f = match create() {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(&tmp)?;
            create()?
        }
        r => r?,
    };
    let done = f.write_all(bytes).and_then(|_| f.sync_all()).and_then(|_| std::fs::rename(&tmp, path));
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    File::open(dir)?.sync_all()
}

/// Opens `path` to append a line, creating it with mode 0644: never
/// through a symlink, and a FIFO or device planted there is refused
/// without blocking (O_NONBLOCK: opening a FIFO would wait for a reader).
pub fn open_append(path: &Path) -> std::io::Result<File> {
    let f = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other(format!("{}: not a regular file", path.display())));
    }
    Ok(f)
}

/// Opens an existing file of the state directory for reading and writing,
/// never through a symlink.
pub fn open_existing_rw(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().read(true).write(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(path)
}

/// True at most once per `every` across processes: the first caller after
/// that long (by the stamp file's time) touches `stamp` and gets true.
/// Used to rate-limit work and log lines per node, not for exclusion.
pub fn stamp_due(stamp: &Path, every: std::time::Duration) -> bool {
    let recent =
        std::fs::metadata(stamp).and_then(|m| m.modified()).is_ok_and(|t| t.elapsed().is_ok_and(|e| e < every));
    // Stamps live in the state directory: private, and never through a
    // link or into a FIFO.
    let touch = || {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(PRIVATE_FILE_MODE)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(stamp)
    };
    !recent && touch().is_ok()
}
