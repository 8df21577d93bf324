//! GPU memory estimation for training jobs. So far: reading model
//! descriptions into one neutral layer list (the estimator issue has the
//! plan; docs/estimator-findings.md the measured basis).

pub mod input;
pub mod listing;
pub mod torchsummary;

pub use input::{Layer, Network, ParseError, read_bounded};
