//! A character device as a device cgroup names it: what `devices` grants
//! and `bpf` encodes, below both (so neither needs the other for it).

/// A character device as the device cgroup names it (`c MAJOR:MINOR`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Device {
    pub major: u32,
    pub minor: u32,
}

impl Device {
    /// The cgroup v1 rule granting or denying read, write and mknod.
    pub fn rule(&self) -> String {
        format!("c {}:{} rwm", self.major, self.minor)
    }
}
