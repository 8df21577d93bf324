//! What a transparently collocated step's history is keyed by: the job's
//! name and its batch script (a batch step) or command line (a job started
//! by srun). Whether a step is transparently collocated, and how, is
//! decided with the other rules in `carma_placement::resolve`.

use crate::spank::Spank;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;

/// Slurm's own limit on a batch script (slurm.conf max_script_size default).
const MAX_SCRIPT_BYTES: u64 = 4 << 20;

/// `job:<FNV-1a>` over the job name and the script or command line.
/// `None` when neither is readable: such a job just has no history.
pub fn signature(sp: &Spank, batch: bool) -> Option<String> {
    let name = sp.getenv("SLURM_JOB_NAME").ok().flatten().unwrap_or_default();
    let argv = sp.argv().ok()?;
    let body = if batch { read_script(argv.first()?)? } else { argv.join(&0u8) };
    let h = carma_config::fnv1a([name.as_bytes(), &[0], &body].into_iter().flatten());
    Some(format!("job:{h:016x}"))
}

/// Slurm's copy of the batch script, in slurmd's root-owned spool (Slurm
/// names the path, not the user); no symlink is followed.
fn read_script(path: &[u8]) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(path));
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path).ok()?;
    let mut body = Vec::new();
    f.take(MAX_SCRIPT_BYTES).read_to_end(&mut body).ok()?;
    Some(body)
}
