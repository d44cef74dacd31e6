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
//! So on these backends the store sends its statements on sessions of its own (`own_pool`),
//! which no other code gets and which go back only clean: there a statement is sent alone. Where
//! it uses the application's pool (`with_lease_connections(0)`, or a transaction-pooling proxy),
//! every statement runs on one connection the store takes from the pool and checks:
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

use deadpool::managed::Object;
use sea_orm::sqlx;
use sea_orm::{DbErr, QueryResult, RuntimeErr, Statement};
use sea_query_sqlx::SqlxValues;

use super::own_pool::{Manager, OwnPool};

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

/// Where a run takes its connection.
pub(crate) enum Source<'a, DB: sqlx::Database> {
    /// The application's pool: checked before (or with) every statement.
    Shared(&'a sqlx::Pool<DB>),
    /// The store's own sessions: no other code ever ran on them.
    Own(&'a OwnPool<DB>),
    /// An idle session of the store's own if one is free at once, else the application's
    /// pool (checked): for a statement that must not queue behind the store's other calls.
    IdleOwnOrShared(&'a OwnPool<DB>, &'a sqlx::Pool<DB>),
}

impl<DB: sqlx::Database> Clone for Source<'_, DB> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<DB: sqlx::Database> Copy for Source<'_, DB> {}

/// The connection a run holds.
enum Held<DB: sqlx::Database> {
    Shared(sqlx::pool::PoolConnection<DB>),
    Own(Object<Manager<DB>>),
}

/// A connection that goes back to its pool only if the run finished and found it clean. On
/// every other path (an error, a transaction found, or the caller's future dropped half way,
/// e.g. by a timeout) it is closed instead: the server then rolls back whatever transaction it
/// was in, and frees any lease row lock that transaction held, instead of handing the
/// connection to the next user of the pool.
pub(crate) struct Checkout<DB: sqlx::Database> {
    conn: Option<Held<DB>>,
    /// Set once the run finished and found the connection outside any transaction.
    pub(crate) clean: bool,
    /// One of the store's own sessions: outside any transaction whenever it is handed out
    /// (it comes back only clean), so it needs no check.
    pub(crate) own: bool,
}

impl<DB: sqlx::Database> Checkout<DB> {
    /// A connection already taken from the application's pool.
    pub(crate) fn shared(conn: sqlx::pool::PoolConnection<DB>) -> Self {
        Self {
            conn: Some(Held::Shared(conn)),
            clean: false,
            own: false,
        }
    }

    pub(crate) async fn from(source: Source<'_, DB>) -> Result<Self, DbErr> {
        let (conn, own) = match source {
            Source::Shared(pool) => (
                Held::Shared(pool.acquire().await.map_err(query_err)?),
                false,
            ),
            Source::Own(pool) => (Held::Own(pool.get().await?), true),
            Source::IdleOwnOrShared(own, shared) => match own.get_idle().await {
                Some(object) => (Held::Own(object), true),
                None => (
                    Held::Shared(shared.acquire().await.map_err(query_err)?),
                    false,
                ),
            },
        };
        Ok(Self {
            conn: Some(conn),
            clean: false,
            own,
        })
    }

    pub(crate) fn conn(&mut self) -> Result<&mut DB::Connection, DbErr> {
        match self.conn.as_mut() {
            Some(Held::Shared(conn)) => Ok(&mut **conn),
            Some(Held::Own(object)) => Ok(&mut object.conn),
            None => Err(DbErr::Custom("connection already given back".to_owned())),
        }
    }
}

impl<DB: sqlx::Database> Drop for Checkout<DB> {
    fn drop(&mut self) {
        match self.conn.take() {
            Some(Held::Shared(mut conn)) if !self.clean => conn.close_on_drop(),
            // Out of the pool for good: dropping the session closes its socket. The others
            // are pinged before their next use (this may have been a restart).
            Some(Held::Own(object)) if !self.clean => {
                if let Some(pool) = Object::pool(&object) {
                    pool.manager().closed_unclean();
                }
                drop(Object::take(object));
            }
            _ => {} // clean: back to its pool
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
