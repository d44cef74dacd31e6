//! Private database servers for orion-beacon's tests and benchmarks.
//!
//! Every server this crate starts is its own: a fresh data directory in a temporary directory
//! (`/dev/shm` when it has room, else `TMPDIR`; `ORION_TESTKIT_TMPDIR` overrides), copied from a
//! template that is built once per server version (with
//! `initdb` / `mariadb-install-db`) and cached in the cargo target directory, on a free port on
//! 127.0.0.1 outside the kernel's ephemeral range that the test process keeps for itself until
//! it exits (a file lock per port in `TMPDIR`), so a server stopped and started again finds its
//! port free. Nothing here connects to, stops or restarts a server it did not start.
//!
//! ```no_run
//! use orion_beacon_testkit::{MariaDb, Postgres};
//!
//! // The shared instance of this test binary: started on first use, stopped at exit.
//! let url = Postgres::shared().url(); // postgres://postgres@127.0.0.1:PORT/test
//!
//! // An instance with its own configuration (shared by every caller asking for the same one).
//! let strict = MariaDb::builder()
//!     .arg("--sql-mode=STRICT_TRANS_TABLES,SIMULTANEOUS_ASSIGNMENT")
//!     .shared();
//!
//! // An instance of its own, stopped and removed when dropped.
//! let pg = Postgres::builder().setting("log_statement", "all").start().unwrap();
//! pg.restart().unwrap();
//! ```
//!
//! # Lifetime
//!
//! Each instance has a small supervisor process (`sh`), the parent of the server, in a process
//! group of its own. The test process holds the write end of a pipe to it; when the test process
//! ends, however it ends (normal exit, panic, SIGKILL), the pipe closes and the supervisor stops
//! the server (gracefully, SIGKILL after 15 s) and removes the instance's directory. Statics are
//! never dropped in Rust test binaries, so this is also how shared instances end. An instance
//! left behind by a supervisor that was itself killed is found and removed by the next run.
//!
//! When the tests run as root, servers run as the `postgres` / `mysql` OS users (PostgreSQL
//! refuses root); otherwise as the current user.
//!
//! Environment: `ORION_TESTKIT_CACHE` (template cache directory; default
//! `<target>/testkit`), `ORION_TESTKIT_TMPDIR` (where instance directories go), `ORION_TESTKIT_KEEP=1` (keep instance directories after the run, for
//! post-mortems), `ORION_TESTKIT_PG_BINDIR` (PostgreSQL's bin directory).
//!
//! # Topologies
//!
//! [`Postgres::standby`] clones a running instance with `pg_basebackup -R` into a streaming
//! standby (synchronous or asynchronous), [`Postgres::promote`] promotes one, and
//! [`PgCluster`] is a primary with N standbys. [`Pgbouncer`] puts Debian's `pgbouncer` in front
//! of an instance, and [`Galera`] is a MariaDB Galera cluster of N nodes (Debian's `galera-4`).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod galera;
mod mariadb;
mod pgbouncer;
mod postgres;
mod process;

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, OnceLock};

pub use galera::{Galera, GaleraBuilder};
pub use mariadb::{MariaDb, MariaDbBuilder};
pub use pgbouncer::{Pgbouncer, PgbouncerBuilder, PoolMode};
pub use postgres::{PgCluster, Postgres, PostgresBuilder, Replication, StandbyBuilder};

/// Why a server could not be started or controlled. The message says what to do.
#[derive(Debug, Clone)]
pub struct Error {
    message: String,
    /// The server could not bind its port (someone took it between our probe and its bind).
    pub(crate) port_taken: bool,
}

impl Error {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            port_taken: false,
        }
    }

    pub(crate) fn io(what: impl fmt::Display, e: std::io::Error) -> Self {
        Self::new(format!("{what}: {e}"))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// One value per key per process, started on first use; a failed start is remembered, so
/// every later caller gets the same error at once instead of trying again.
pub(crate) fn shared<T, F>(key: String, start: F) -> &'static T
where
    T: Send + Sync + 'static,
    F: FnOnce() -> Result<T, Error>,
{
    type Slot<T> = OnceLock<Result<T, Error>>;
    static SLOTS: OnceLock<Mutex<HashMap<String, &'static (dyn Any + Send + Sync)>>> =
        OnceLock::new();
    let key = format!("{}:{key}", std::any::type_name::<T>());
    let slot: &'static (dyn Any + Send + Sync) = {
        let mut map = SLOTS
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *map.entry(key.clone())
            .or_insert_with(|| Box::leak(Box::new(Slot::<T>::new())))
    };
    let slot = slot
        .downcast_ref::<Slot<T>>()
        .unwrap_or_else(|| panic!("testkit: shared key {key} used for two types"));
    match slot.get_or_init(start) {
        Ok(value) => value,
        Err(e) => panic!("testkit: {e}"),
    }
}

/// Removes what crashed runs left behind in the temporary directory: instance directories
/// whose supervisor is gone (a server still running in one is killed first). Runs by itself
/// before the first instance of a process starts.
pub fn sweep_leftovers() {
    process::sweep();
}

/// Writes one line to the process's standard error directly (not through `eprintln!`, which
/// the test harness captures): startup times are meant to be seen once per test binary.
pub(crate) fn report(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "testkit: {line}");
}
