//! The SeaORM lease store and the SQL it sends, one folder per backend.
//!
//! What every backend shares lives here: the store ([`SeaOrmLeaseStore`], `store`), the
//! statements of the common shape (`statements`: PostgreSQL and SQLite run the same
//! `INSERT ... ON CONFLICT DO UPDATE ... WHERE ... RETURNING`), statements rendered once
//! (`prepared`), fenced writes (`fence`), the operator's tools (`admin`) and the sorting of
//! database errors (`errors`). Each backend's folder holds its clock (`Dialect`), its own
//! statements, how the store runs them there, and its error codes:
//! [`postgres`], [`mysql`] (MySQL and MariaDB), [`sqlite`], and `sqlserver` (its own store over
//! TDS, since SeaORM has no SQL Server driver). A store picks its backend once, from its
//! connection, and dispatches on that (`Form`).
//!
//! # What every SeaORM backend does
//!
//! - **An outcome only for a statement that committed.** Every deciding statement is read to its
//!   end: SQLite sends `RETURNING` rows before its commit, which can still fail and roll the
//!   statement back; PostgreSQL reports commit-time errors after the rows; a Galera node sends rows
//!   before certification. A commit that fails is a retryable [`StoreError::Conflict`], never a
//!   grant; a statement that returns several rows (a server-side retry) is a retryable
//!   [`StoreError::Conflict`] too, neither a grant nor a denial.
//! - **A grant only for a statement that ran in autocommit mode.** sqlx 0.9 returns a pooled
//!   connection to the pool *inside* an open transaction when a future is dropped while `begin()`
//!   waits for its `BEGIN` (a timeout, a `select!`, leader work dropped at the end of its term); a
//!   statement on that connection joins the transaction and commits only if and when somebody ends
//!   it. On MariaDB and PostgreSQL the store runs its acquire-or-renew on a connection it takes from
//!   the pool and checks it (MariaDB: `@@in_transaction` in the same `RETURNING`; PostgreSQL: a
//!   second statement on the same connection compares `transaction_timestamp()`); such a
//!   connection is closed (the server rolls the transaction back) and the statement tried again on
//!   another, and so is a connection whose check did not finish (an error, or the call dropped by a
//!   timeout). Every other statement of ours on the pool is checked the same way: releases,
//!   batched renews, membership writes, reads, the CLI's revoke (a check statement first on the
//!   same connection, or, for the store's own transactions, the `BEGIN` and the check in one
//!   message, so a `BEGIN` never joins or commits somebody else's transaction), and a connection
//!   goes back to the pool only after a complete answer. sqlx's SQLite driver does not leak the
//!   transaction. Your own statements on such a connection are affected too: prefer fenced
//!   transactions (`fence` inside `begin()`/`commit()`), whose commit you see.
//! - **Conflicts are retried.** Serialization failures and deadlocks (PostgreSQL `40001`, `40P01`;
//!   SQLite `BUSY`) mean the statement had no effect; the store tries it again, up to 3 times, then
//!   reports the retryable [`StoreError::Conflict`].
//! - **Acquired or renewed, from one row.** `acquired_at = renewed_at` holds exactly for a new term
//!   (a renew sets `renewed_at` to at least one tick after `acquired_at`), which is how one
//!   statement tells `Acquired` from `Renewed`.

mod admin;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod autocommit;
mod durability;
mod errors;
pub mod fence;
mod members;
pub mod mysql;
pub mod postgres;
mod prepared;
pub mod sqlite;
#[cfg(feature = "sqlserver")]
pub mod sqlserver;
mod statements;
mod store;
// Ending a stalled holder's session: only servers with sessions to end.
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod takeover;

pub use durability::Durability;
pub use store::SeaOrmLeaseStore;

/// How long an acquire waits for the lease row before it looks for a lapsed holder's session
/// to end (a fifth of the lease when that is shorter, so a short lease's grant is not spent
/// waiting); on PostgreSQL also the most its statement waits for the row lock on the server.
pub(crate) const WAIT_BEFORE_TAKEOVER: std::time::Duration = std::time::Duration::from_millis(200);

/// The shortest such wait (for leases under 50 ms).
pub(crate) const MIN_WAIT_BEFORE_TAKEOVER: std::time::Duration =
    std::time::Duration::from_millis(10);

use sea_orm::sea_query::{Expr, Func};
use sea_orm::{DatabaseConnection, DatabaseConnectionType, DbBackend, Value};

use crate::StoreError;

/// The per-backend pieces of the lease statements. Every time comes from the database clock.
pub(crate) trait Dialect: Sync {
    /// The database's "now", constant within one statement.
    fn now(&self) -> Expr;
    /// The end of a lease of `millis` milliseconds (bound as a parameter) granted when the row
    /// is written. That can be later than [`now`](Self::now) when the statement waited for a
    /// row lock (a fenced transaction holds one): a lease granted after a wait still lasts its
    /// full duration from the grant. Liveness is still judged at [`now`](Self::now), the
    /// statement's start, which only errs towards "still live".
    fn lease_end(&self, millis: i64) -> Expr;
    /// The bound value that carries a lease of `millis` milliseconds in
    /// [`lease_end`](Self::lease_end).
    fn lease_value(&self, millis: i64) -> Value;
    /// The smallest timestamp step after `ts` (1 µs, or 1 ms on SQLite).
    fn one_tick_after(&self, ts: Expr) -> Expr;
    /// Milliseconds from now until `expires` (negative once past), as a 64-bit integer.
    fn remaining_millis(&self, expires: Expr) -> Expr;
    /// A timestamp read from a lease column, as a bound value that compares equal to the
    /// stored one.
    fn stored_time(&self, t: chrono::DateTime<chrono::Utc>) -> Expr;
    /// Whether the backend locks rows (`FOR SHARE`, `FOR UPDATE`); SQLite locks the database
    /// instead.
    fn locks_rows(&self) -> bool {
        true
    }
    /// The larger of two timestamps.
    fn greatest(&self, a: Expr, b: Expr) -> Expr {
        Func::greatest([a, b]).into()
    }
}

/// The backend a store runs on, chosen once from its connection.
///
/// SQLite needs nothing of its driver beyond what SeaORM runs, so it works in every build;
/// PostgreSQL and MySQL need their driver's own connection type for the check that a grant
/// committed outside any transaction (see `autocommit`), which only their cargo features
/// compile in. Without it they are refused when the store is made (reported by every call,
/// and by [`LeaseStore::validate`](crate::LeaseStore::validate)), rather than run without
/// that check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    #[cfg(feature = "postgres")]
    Postgres,
    #[cfg(feature = "mysql")]
    MySql,
    Sqlite,
}

/// Why a connection has no [`Form`]: the error every call of the store reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    Unsupported {
        backend: &'static str,
        feature: &'static str,
    },
    Disconnected,
}

impl From<Refused> for StoreError {
    fn from(refused: Refused) -> Self {
        match refused {
            Refused::Unsupported { backend, feature } => {
                StoreError::UnsupportedBackend { backend, feature }
            }
            Refused::Disconnected => StoreError::Disconnected,
        }
    }
}

impl Form {
    /// The form of `db`'s backend in this build.
    pub(crate) fn of(db: &DatabaseConnection) -> Result<Form, Refused> {
        // SeaORM panics when asked the backend of a disconnected connection.
        if matches!(db.inner, DatabaseConnectionType::Disconnected) {
            return Err(Refused::Disconnected);
        }
        let unsupported = |backend, feature| Refused::Unsupported { backend, feature };
        match db.get_database_backend() {
            DbBackend::Sqlite => Ok(Form::Sqlite),
            #[cfg(feature = "postgres")]
            DbBackend::Postgres => Ok(Form::Postgres),
            #[cfg(not(feature = "postgres"))]
            DbBackend::Postgres => Err(unsupported("PostgreSQL", "postgres")),
            #[cfg(feature = "mysql")]
            DbBackend::MySql => Ok(Form::MySql),
            #[cfg(not(feature = "mysql"))]
            DbBackend::MySql => Err(unsupported("MySQL", "mysql")),
            #[allow(unreachable_patterns)]
            _ => Err(unsupported("unknown", "the matching backend")),
        }
    }

    /// The backend's clock and value forms.
    pub(crate) fn dialect(self) -> &'static dyn Dialect {
        match self {
            #[cfg(feature = "postgres")]
            Form::Postgres => &postgres::Postgres,
            #[cfg(feature = "mysql")]
            Form::MySql => &mysql::MySql,
            Form::Sqlite => &sqlite::Sqlite,
        }
    }

    /// SeaORM's name for the backend, to render statements with.
    pub(crate) fn backend(self) -> DbBackend {
        match self {
            #[cfg(feature = "postgres")]
            Form::Postgres => DbBackend::Postgres,
            #[cfg(feature = "mysql")]
            Form::MySql => DbBackend::MySql,
            Form::Sqlite => DbBackend::Sqlite,
        }
    }
}
