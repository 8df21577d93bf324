//! GPU memory estimation for training jobs: model descriptions read into
//! one neutral layer list, then a continuous per-sample model (CNN/MLP),
//! the paper's GPUMemNet classifier (feature `gpumemnet`, off by default), or an analytic transformer model.
//! docs/estimator.md has the rule and the measured validation.
#![forbid(unsafe_code)]

pub mod estimate;
pub mod features;
#[cfg(feature = "gpumemnet")]
pub mod gpumemnet;
pub mod hf_config;
pub mod input;
pub mod kept;
pub mod layers_model;
pub mod listing;
#[cfg(feature = "onnx")]
pub mod onnx;
#[cfg(feature = "onnx")]
mod onnx_shapes;
pub mod torchinfo;
pub mod torchsummary;
pub mod transformer;

pub use estimate::{Estimate, Method, Settings, estimate};
pub use input::{Layer, Network, ParseError, read_bounded, read_bounded_bytes};
