//! Statements that are known to have run outside any abandoned transaction: what every backend
//! with sessions shares (the checked connection, what a run found); each backend's own checks
//! are in its folder (`checked.rs`).
//!
//! A statement sent alone runs in autocommit mode: it commits when it ends, and only then is
//! its effect real. That breaks if the pooled connection it runs on is still inside a
//! transaction somebody abandoned: the statement then joins that transaction, its rows come
//! back, and nothing commits (a later rollback, or a killed connection, undoes a "grant" while
//! another candidate is granted the same token; a "release" keeps the lease row locked, so a
//! rival's acquire waits and the release never happens; a read answers from the abandoned
//! transaction's snapshot). sqlx 0.9 leaves connections in that state: a future dropped while
//! `begin()` waits for its `BEGIN` returns the connection to the pool inside the transaction
//! the `BEGIN` opened (on MySQL/MariaDB and PostgreSQL), and any application code sharing the
//! pool can drop such a future (a timeout, a `select!`, or leader work dropped when its term
//! ends). A transaction begun on such a connection is no better: PostgreSQL's `BEGIN` only
//! warns and the statements join the old transaction (whose work the `COMMIT` then commits),
//! MySQL's `BEGIN` commits the old transaction first.
//!
//! So on these backends every statement the store sends on the application's pool runs on one
//! connection the store takes from the pool and checks:
//! - Grants (acquire-or-renew; PostgreSQL's batched renew), in the same round trip or right
//!   after: MariaDB's `RETURNING` list ends in `@@in_transaction` (0 in autocommit); PostgreSQL's
//!   statement returns `transaction_timestamp()`, and a second statement on the same connection
//!   reads it again: a new (autocommit) transaction has a later start, the same abandoned
//!   transaction the same one.
//! - Every other single statement (releases, membership writes, reads), before it is sent, in
//!   one round trip of its own: MariaDB `@@in_transaction = 0 AND @@autocommit = 1`;
//!   PostgreSQL `transaction_timestamp() = statement_timestamp()` as a simple-protocol query
//!   (one message: a transaction begun by it starts at that message's statement time, an older
//!   one earlier). Nothing but the store uses the connection between the check and the
//!   statement, which then runs in a transaction of its own that commits when it ends.
//! - The store's own transactions (MariaDB's batched renew, the MySQL upsert form, the revoke,
//!   and every statement behind a transaction-pooling proxy), in the round trip that begins
//!   them: MariaDB `SET TRANSACTION ...; START TRANSACTION` (`SET TRANSACTION` is refused with
//!   error 1568 inside a transaction, and the `START` is then not run); PostgreSQL `BEGIN;
//!   SELECT transaction_timestamp() = statement_timestamp()`. The rows count once `COMMIT`
//!   succeeded.
//!
//! A connection found inside a transaction (or an aborted one, PostgreSQL `25P02`) is closed
//! (the server rolls the transaction back, which also frees the rows it locked) and the call is
//! tried again on another one; nothing it returned is used. So is a connection whose run did not
//! finish (an error, or the call dropped by a timeout): it never goes back to the pool
//! half-checked or inside a transaction of ours. SQLite needs none of this: sqlx's SQLite driver
//! rolls back a cancelled `BEGIN`, and SeaORM's transactions roll back when dropped.

use sea_orm::sqlx;
use sea_orm::{DbErr, QueryResult, RuntimeErr, Statement};
use sea_query_sqlx::SqlxValues;

/// What one checked run found.
pub(crate) enum Checked<T = Vec<QueryResult>> {
    /// The statement ran outside any abandoned transaction and has committed: this is its
    /// outcome.
    Committed(T),
    /// The connection was inside an abandoned transaction: it was closed (the server rolls
    /// back), and nothing the statement did or returned counts.
    InAbandonedTransaction,
}

pub(crate) fn query_err(err: sqlx::Error) -> DbErr {
    DbErr::Query(RuntimeErr::SqlxError(err.into()))
}

pub(crate) fn values(stmt: &Statement) -> SqlxValues {
    SqlxValues(stmt.values.clone().unwrap_or(sea_orm::Values(Vec::new())))
}

/// A pooled connection that goes back to the pool only if the check finished and found it
/// clean. On every other path (an error, a transaction found, or the caller's future dropped
/// half way, e.g. by a timeout) it is closed instead: the server then rolls back whatever
/// transaction it was in, and frees any lease row lock that transaction held, instead of
/// handing the connection to the next user of the pool.
pub(crate) struct Checkout<DB: sqlx::Database> {
    conn: Option<sqlx::pool::PoolConnection<DB>>,
    /// Set once the run finished and found the connection outside any transaction.
    pub(crate) clean: bool,
}

impl<DB: sqlx::Database> Checkout<DB> {
    pub(crate) async fn from(pool: &sqlx::Pool<DB>) -> Result<Self, DbErr> {
        let conn = pool.acquire().await.map_err(query_err)?;
        Ok(Self {
            conn: Some(conn),
            clean: false,
        })
    }

    pub(crate) fn conn(&mut self) -> Result<&mut DB::Connection, DbErr> {
        match self.conn.as_mut() {
            Some(conn) => Ok(&mut **conn),
            None => Err(DbErr::Custom("connection already given back".to_owned())),
        }
    }
}

impl<DB: sqlx::Database> Drop for Checkout<DB> {
    fn drop(&mut self) {
        if let Some(mut conn) = self.conn.take() {
            if !self.clean {
                conn.close_on_drop();
            }
        }
    }
}

/// How a transaction of the store's begins.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Begin {
    /// The session's isolation level (a transaction that writes).
    ReadWrite,
    /// REPEATABLE READ whatever the session's level.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    RepeatableRead,
}
