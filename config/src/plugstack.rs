//! Arguments on the plugstack.conf line, e.g.
//! `required /usr/lib/slurm/carma_spank.so config=/etc/slurm/carma.yaml`.

use std::fmt;
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PluginArgs {
    /// `config=PATH`: the carma.yaml to read.
    pub config: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginArgsError(pub String);

impl fmt::Display for PluginArgsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "plugstack.conf: {}", self.0)
    }
}

impl std::error::Error for PluginArgsError {}

impl PluginArgs {
    pub const KNOWN: &'static str = "config";

    pub fn parse<S: AsRef<str>>(args: &[S]) -> Result<PluginArgs, PluginArgsError> {
        let mut out = PluginArgs::default();
        for arg in args {
            let arg = arg.as_ref();
            let (key, value) = arg.split_once('=').ok_or_else(|| {
                PluginArgsError(format!("argument '{arg}' is not key=value; known keys: {}", Self::KNOWN))
            })?;
            match key {
                "config" => {
                    let p = PathBuf::from(value);
                    if !p.is_absolute() {
                        return Err(PluginArgsError(format!("config={value} is not an absolute path")));
                    }
                    out.config = Some(p);
                }
                _ => {
                    return Err(PluginArgsError(format!("unknown argument '{key}'; known keys: {}", Self::KNOWN)));
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        assert_eq!(PluginArgs::parse::<&str>(&[]).unwrap(), PluginArgs::default());
        let a = PluginArgs::parse(&["config=/etc/carma.yaml"]).unwrap();
        assert_eq!(a.config, Some(PathBuf::from("/etc/carma.yaml")));
        assert!(PluginArgs::parse(&["conf=/x"]).unwrap_err().to_string().contains("unknown argument 'conf'"));
        assert!(PluginArgs::parse(&["config"]).is_err());
        assert!(PluginArgs::parse(&["config=rel.yaml"]).is_err());
    }
}
