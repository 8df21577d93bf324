//! Who chooses a CARMA job's GPU on a node: carma.yaml `gpu_owner`
//! (docs/architecture.md, "Who owns a GPU").

/// carma.yaml `gpu_owner:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuOwner {
    /// slurmctld: a CARMA job runs on the GPUs Slurm allocated to it (its
    /// shards' GPU, its gres/gpu); CARMA checks the preconditions there.
    /// Slurm never hands a GPU whose shards are allocated whole to another
    /// job, so no job shares a GPU it did not ask to share.
    Slurm,
    /// CARMA: a CARMA job may run on any GPU of the node that its policy
    /// picks. Only for nodes where every GPU job is CARMA's (every partition
    /// of the node a transparent scope): slurmctld still counts the GPU
    /// CARMA picked as free and may hand it whole to a plain job.
    Carma,
}

impl GpuOwner {
    pub fn name(self) -> &'static str {
        match self {
            GpuOwner::Slurm => "slurm",
            GpuOwner::Carma => "carma",
        }
    }

    pub fn parse(s: &str) -> Result<GpuOwner, String> {
        match s {
            "slurm" => Ok(GpuOwner::Slurm),
            "carma" => Ok(GpuOwner::Carma),
            _ => Err(format!("'{s}' is not a GPU owner; use slurm (the default) or carma")),
        }
    }
}
