//! How collocated jobs share a GPU: the node's `sharing` mode in carma.yaml
//! (and the simulator's assumption of it).

/// carma.yaml `sharing:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    /// Plain processes: the GPU time-slices, kernels of different jobs never overlap.
    Timeslice,
    /// NVIDIA MPS: kernels of different jobs run at once, up to the SMs'
    /// capacity, and each job's memory is fenced
    /// (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`).
    Mps,
}

/// How many times slower than a plain process a job runs alone as an MPS
/// client (resnet50 on the H100: 22.3 against 25.8 it/s; the slowdown
/// model's MPS `base`, fitted with its other parameters).
pub const MPS_SOLO_SLOWDOWN: f64 = 1.14;

impl Sharing {
    pub fn name(self) -> &'static str {
        match self {
            Sharing::Timeslice => "timeslice",
            Sharing::Mps => "mps",
        }
    }

    pub fn parse(s: &str) -> Result<Sharing, String> {
        match s {
            "timeslice" => Ok(Sharing::Timeslice),
            "mps" => Ok(Sharing::Mps),
            _ => Err(format!("'{s}' is not a sharing mode; use timeslice or mps")),
        }
    }
}
