//! One error type for the plugin: a chain of context strings joined into a
//! single log line ("user_init: placement: state lock: timed out after 5s").

use std::fmt;

#[derive(Debug)]
pub struct Error(String);

impl Error {
    pub fn msg(m: impl Into<String>) -> Error {
        Error(m.into())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Adds a leading context to an error, keeping it on one line.
pub trait Context<T> {
    fn context(self, what: &str) -> Result<T, Error>;
}

impl<T, E: fmt::Display> Context<T> for Result<T, E> {
    fn context(self, what: &str) -> Result<T, Error> {
        self.map_err(|e| Error(format!("{what}: {}", one_line(&e.to_string()))))
    }
}

macro_rules! from_display {
    ($($t:ty),*) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Error { Error(one_line(&e.to_string())) }
        }
    )*};
}
from_display!(
    carma_config::ConfigError,
    carma_config::OptionError,
    carma_config::PluginArgsError,
    carma_placement::PlaceError,
    std::io::Error
);

pub fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}
