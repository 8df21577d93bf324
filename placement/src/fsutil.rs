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
    if !file.metadata().map_err(|e| format!("cannot stat ({e})"))?.is_file() {
        return Err("not a regular file".into());
    }
    let mut buf = Vec::new();
    file.take(max + 1).read_to_end(&mut buf).map_err(|e| format!("cannot read ({e})"))?;
    if buf.len() as u64 > max {
        return Err(format!("larger than {max} bytes"));
    }
    Ok(Some(buf))
}

/// Opens a file of the state directory for reading and writing, creating
/// it with mode 0644 (readable by users, writable by its root owner only),
/// never through a symlink. `truncate`: start empty.
pub fn open_for_write(path: &Path, truncate: bool) -> std::io::Result<File> {
    OpenOptions::new()
        .create(true)
        .truncate(truncate)
        .read(true)
        .write(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}
