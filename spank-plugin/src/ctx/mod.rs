//! One module per context the plugin runs in.

pub mod job_script;
pub mod remote;
pub mod submit;
mod transparent;
