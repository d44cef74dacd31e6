//! What every kind of server shares: directories, ports, the OS user, the template cache and
//! the supervisor process that owns the server.

use std::time::Duration;

/// Instance directories are `<tmp>/orion-testkit-<kind>-<pid>-<n>-<nanos>`.
pub(crate) const DIR_PREFIX: &str = "orion-testkit-";

/// How long a server may take to become ready.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(60);

mod dirs;
mod os;
mod supervisor;
mod sweep;
mod template;

pub(crate) use dirs::*;
pub(crate) use os::*;
pub(crate) use supervisor::*;
pub(crate) use sweep::*;
pub(crate) use template::*;

/// `Some(seconds)` formatted for reports.
pub(crate) fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}
