//! The SeaORM lease store and the SQL it sends, one folder per backend.
//!
//! The core, which knows no backend: the backend trait each backend implements (`driver`), what
//! its code is given (`context`: the connection, the tables, the retry, rows read to the end),
//! the statements of the common shape (`statements`: PostgreSQL and SQLite run the same
//! `INSERT ... ON CONFLICT DO UPDATE ... WHERE ... RETURNING`), statements rendered once
//! (`prepared`), the checked pooled connection and the store's own sessions (`sessions`), the takeover loop (`takeover`) and
//! the error kinds (`errors`). On top of it, the public store ([`SeaOrmLeaseStore`], `store`,
//! the one place the backend is chosen from the connection), its fenced writes (`fence`), its
//! membership table (`members`), its operator's tools (`admin`) and its durability look.
//!
//! Each backend's folder owns its backend: its clock (`Dialect`), its statements, how the store
//! runs them there (the checks of pooled connections, transaction pooling, notifications), its
//! fence and takeover, and its error codes: [`postgres`], [`mysql`] (MySQL and MariaDB),
//! [`sqlite`]. SQL Server has a store of its own over TDS (the `orion-beacon-sqlserver` crate),
//! since SeaORM has no SQL Server driver.
//!
//! # What every SeaORM backend does
//!
//! - **An outcome only for a statement that committed.** Every deciding statement is read to its
//!   end: SQLite sends `RETURNING` rows before its commit, which can still fail and roll the
//!   statement back; PostgreSQL reports commit-time errors after the rows; a Galera node sends rows
//!   before certification. A commit that fails is a retryable [`StoreError::Conflict`](crate::StoreError::Conflict), never a
//!   grant; a statement that returns several rows (a server-side retry) is a retryable
//!   [`StoreError::Conflict`](crate::StoreError::Conflict) too, neither a grant nor a denial.
//! - **A grant only for a statement that ran in autocommit mode.** sqlx 0.9 returns a pooled
//!   connection to the pool *inside* an open transaction when a future is dropped while `begin()`
//!   waits for its `BEGIN` (a timeout, a `select!`, leader work dropped at the end of its term); a
//!   statement on that connection joins the transaction and commits only if and when somebody ends
//!   it. On MySQL/MariaDB and PostgreSQL the store therefore sends its statements on sessions of
//!   its own (`with_lease_connections`, 4 unless set): no other code ever gets them, and one goes back for
//!   the next call only after a complete answer (its own transactions only after `COMMIT`), so it
//!   is never inside a transaction when a statement is sent, and each call is one statement. A
//!   session whose run did not finish (an error, or the call dropped by a timeout) is closed, never
//!   reused. With `with_lease_connections(0)`, or behind a transaction-pooling proxy, the store
//!   takes the application's pooled connections and checks each (MariaDB: `@@in_transaction` in
//!   the same `RETURNING`, or a check statement before a release or read; PostgreSQL: a second
//!   statement on the same connection compares `transaction_timestamp()`, or a one-message check
//!   before; the store's own transactions: the `BEGIN` and the check in one message, so a `BEGIN`
//!   never joins or commits somebody else's transaction); a connection found inside a transaction
//!   is closed (the server rolls it back) and the statement tried again on another. sqlx's SQLite
//!   driver does not leak the transaction. Your own statements on a pooled connection are
//!   affected too: prefer fenced transactions (`fence` inside `begin()`/`commit()`), whose commit
//!   you see.
//! - **Conflicts are retried.** Serialization failures and deadlocks (PostgreSQL `40001`, `40P01`;
//!   SQLite `BUSY`) mean the statement had no effect; the store tries it again, up to 3 times, then
//!   reports the retryable [`StoreError::Conflict`](crate::StoreError::Conflict).
//! - **Acquired or renewed, from one row.** `acquired_at = renewed_at` holds exactly for a new term
//!   (a renew sets `renewed_at` to at least one tick after `acquired_at`), which is how one
//!   statement tells `Acquired` from `Renewed`.

mod acquire;
mod admin;
mod context;
mod dialect;
mod driver;
mod durability;
mod engine;
mod errors;
pub mod fence;
mod gate;
mod members;
pub mod mysql;
pub mod postgres;
mod prepared;
mod rate_limits;
mod row;
#[cfg(checked_pool)]
mod sessions;
pub mod sqlite;
mod statements;
mod store;
mod takeover;
mod term_checks;
mod wakeups;

pub use durability::Durability;
#[cfg(feature = "jobs")]
pub(crate) use store::begin_whole;
pub use store::SeaOrmLeaseStore;

/// Sessions of its own a store opens at most for its lease statements (PostgreSQL,
/// MySQL/MariaDB), unless told otherwise.
pub(crate) const DEFAULT_LEASE_CONNECTIONS: usize = 4;

/// The most a store may be told to open.
pub(crate) const MAX_LEASE_CONNECTIONS: usize = 64;

/// How long an acquire waits for the lease row before it looks for a lapsed holder's session
/// to end (a fifth of the lease when that is shorter, so a short lease's grant is not spent
/// waiting); on PostgreSQL also the most its statement waits for the row lock on the server.
pub(crate) const WAIT_BEFORE_TAKEOVER: std::time::Duration = std::time::Duration::from_millis(200);

/// The shortest such wait (for leases under 50 ms).
pub(crate) const MIN_WAIT_BEFORE_TAKEOVER: std::time::Duration =
    std::time::Duration::from_millis(10);

/// The first wait for a lease of `millis`: a fifth of it, within [`MIN_WAIT_BEFORE_TAKEOVER`]
/// and [`WAIT_BEFORE_TAKEOVER`] (PostgreSQL's `lock_wait` computes the same on the server).
pub(crate) fn first_wait(millis: i64) -> std::time::Duration {
    let fifth = std::time::Duration::from_millis(u64::try_from(millis / 5).unwrap_or(0));
    fifth.clamp(MIN_WAIT_BEFORE_TAKEOVER, WAIT_BEFORE_TAKEOVER)
}
