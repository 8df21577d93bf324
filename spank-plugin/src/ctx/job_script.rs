//! Prolog/epilog context (a fresh process run by slurmd as root).

use crate::error::Error;
use crate::spank::Spank;

pub fn prolog(_sp: &Spank) -> Result<(), Error> {
    Ok(())
}

pub fn epilog(_sp: &Spank) -> Result<(), Error> {
    Ok(())
}
