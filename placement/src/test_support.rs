//! What the crate's unit tests share.

use crate::state::{Holding, Reservation};
use carma_config::Policy;

/// A shared (magm) CARMA reservation of `job` on `gpus`, held by `holder`.
pub fn carma(job: u32, gpus: Vec<u32>, reserved_mib: u64, holder: u32) -> Reservation {
    Reservation {
        job,
        gpus,
        reserved_mib,
        estimate_source: "declared".into(),
        exclusive: false,
        holding: Holding::Carma,
        policy: Some(Policy::Magm),
        since: 0,
        holders: vec![holder],
        signature: None,
        observed_mib: 0,
        mps_uid: None,
        model_mib: None,
        uid: None,
        profile: None,
        profile_key: None,
        alone_since: None,
    }
}

/// A fresh mode-0755 directory removed on drop.
pub struct TempDir(pub std::path::PathBuf);
impl TempDir {
    pub fn new() -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "carma-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        TempDir(p)
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
