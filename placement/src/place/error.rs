//! Why a step was not placed.

use crate::policy::NoFit;
use crate::source::SourceError;
use crate::state::StateError;
use std::fmt;
use std::time::Duration;

#[derive(Debug)]
pub enum PlaceError {
    State(StateError),
    Source(SourceError),
    NoFit(NoFit),
    TimedOut {
        waited: Duration,
        last: NoFit,
    },
    /// The job ended (cancelled, timed out) while its step waited.
    Ended {
        waited: Duration,
    },
    /// Another launch's holder of the lock answered with GPUs outside the
    /// job's Slurm GPUs: an older build, during an upgrade, that does not
    /// know `Request::within`. The answer was given back.
    OutsideSlurms {
        gpus: Vec<u32>,
        within: Vec<u32>,
    },
}

impl PlaceError {
    /// No GPU fitted (at once, or by the end of the wait): what another
    /// node may not have to say.
    pub fn is_no_fit(&self) -> bool {
        matches!(self, PlaceError::NoFit(_) | PlaceError::TimedOut { .. })
    }
}

impl fmt::Display for PlaceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlaceError::State(e) => write!(f, "node state: {e}"),
            PlaceError::Source(e) => write!(f, "GPU readings: {e}"),
            PlaceError::NoFit(n) => write!(f, "no GPU fits: {n}"),
            PlaceError::TimedOut { waited, last } => {
                write!(f, "no GPU fit within {:.0}s (timeouts.wait): {last}", waited.as_secs_f64())
            }
            PlaceError::Ended { waited } => {
                write!(f, "the job ended while its step waited {:.1}s for a GPU", waited.as_secs_f64())
            }
            PlaceError::OutsideSlurms { gpus, within } => write!(
                f,
                "an older CARMA build on this node (an upgrade in progress) placed the step on GPU(s) {}, not among the job's Slurm GPU(s) {}; given back (steps started after the node's old steps end are placed as they should be)",
                crate::gpu::index_list(gpus),
                crate::gpu::index_list(within)
            ),
        }
    }
}

impl std::error::Error for PlaceError {}

impl From<StateError> for PlaceError {
    fn from(e: StateError) -> Self {
        PlaceError::State(e)
    }
}

impl From<SourceError> for PlaceError {
    fn from(e: SourceError) -> Self {
        PlaceError::Source(e)
    }
}
