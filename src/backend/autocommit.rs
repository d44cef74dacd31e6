//! Deciding statements that are known to have committed on their own.
//!
//! A statement that decides a grant is sent alone, in autocommit mode: it commits when it ends,
//! and only then is its row a grant. That breaks if the pooled connection it runs on is still
//! inside a transaction somebody abandoned: the statement then joins that transaction, its
//! rows come back, and nothing commits (a later rollback, or a killed connection, undoes the
//! "grant" while another candidate is granted the same token). sqlx 0.9 leaves connections in
//! that state: a future dropped while `begin()` waits for its `BEGIN` returns the connection to
//! the pool inside the transaction the `BEGIN` opened (on MySQL/MariaDB and PostgreSQL), and any
//! application code sharing the pool can drop such a future (a timeout, a `select!`, or leader
//! work dropped when its term ends).
//!
//! So on these backends the store takes one connection from the pool and checks, for every
//! deciding statement, that it ran outside any transaction:
//! - MariaDB: the statement's `RETURNING` list ends in `@@in_transaction` (0 in autocommit);
//! - PostgreSQL: the statement returns `transaction_timestamp()`, and a second statement on the
//!   same connection reads it again: a new (autocommit) transaction has a later start, the same
//!   abandoned transaction the same one.
//!
//! A connection found inside a transaction is closed (the server rolls the transaction back,
//! which also frees the lease row it may have locked) and the statement is tried again on
//! another one; nothing it returned is used. So is a connection whose check did not finish (an
//! error, or the call dropped by a timeout): it never goes back to the pool half-checked.
//! MySQL's transaction form and SQLite need none of this: the first commits explicitly, and
//! sqlx's SQLite driver does not leave a cancelled `BEGIN` open.

use sea_orm::sqlx;
use sea_orm::{DbErr, QueryResult, RuntimeErr, Statement};
use sea_query_sqlx::SqlxValues;

/// What one checked run found.
pub(crate) enum Checked {
    /// The statement ran in autocommit mode and has committed: its rows are the outcome.
    Committed(Vec<QueryResult>),
    /// The connection was inside an abandoned transaction: it was closed (the server rolls
    /// back), and nothing the statement did or returned counts.
    InAbandonedTransaction,
}

fn query_err(err: sqlx::Error) -> DbErr {
    DbErr::Query(RuntimeErr::SqlxError(err.into()))
}

fn values(stmt: &Statement) -> SqlxValues {
    SqlxValues(stmt.values.clone().unwrap_or(sea_orm::Values(Vec::new())))
}

/// A pooled connection that goes back to the pool only if the check finished and found it
/// clean. On every other path (an error, a transaction found, or the caller's future dropped
/// half way, e.g. by a timeout) it is closed instead: the server then rolls back whatever
/// transaction it was in, and frees any lease row lock that transaction held, instead of
/// handing the connection to the next user of the pool.
struct Checkout<DB: sqlx::Database> {
    conn: Option<sqlx::pool::PoolConnection<DB>>,
    clean: bool,
}

impl<DB: sqlx::Database> Checkout<DB> {
    async fn from(pool: &sqlx::Pool<DB>) -> Result<Self, DbErr> {
        let conn = pool.acquire().await.map_err(query_err)?;
        Ok(Self {
            conn: Some(conn),
            clean: false,
        })
    }

    fn conn(&mut self) -> Result<&mut DB::Connection, DbErr> {
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

/// MariaDB: runs `stmt` (whose last returned column is `@@in_transaction`) on one pooled
/// connection, read to the end.
#[cfg(feature = "mysql")]
pub(crate) async fn mysql(
    pool: &sqlx::MySqlPool,
    stmt: &Statement,
    in_transaction_column: usize,
) -> Result<Checked, DbErr> {
    use sqlx::Row;
    let mut checkout = Checkout::from(pool).await?;
    let rows = sqlx::query_with(sqlx::AssertSqlSafe(stmt.sql.as_str()), values(stmt))
        .fetch_all(checkout.conn()?)
        .await
        .map_err(query_err)?;
    let mut inside = false;
    for row in &rows {
        let flag: i64 = row.try_get(in_transaction_column).map_err(query_err)?;
        inside |= flag != 0;
    }
    if inside {
        return Ok(Checked::InAbandonedTransaction);
    }
    checkout.clean = true;
    Ok(Checked::Committed(
        rows.into_iter().map(Into::into).collect(),
    ))
}

/// PostgreSQL: runs `stmt` (whose last returned column is `transaction_timestamp()`) on one
/// pooled connection, read to the end, then compares that with a fresh
/// `transaction_timestamp()` on the same connection. A statement that returned no row is
/// checked with two fresh reads instead (it may still have locked the row).
#[cfg(feature = "postgres")]
pub(crate) async fn postgres(
    pool: &sqlx::PgPool,
    stmt: &Statement,
    transaction_start_column: usize,
) -> Result<Checked, DbErr> {
    use chrono::{DateTime, Utc};
    use sqlx::Row;
    const START: &str = "SELECT transaction_timestamp()";
    let mut checkout = Checkout::from(pool).await?;
    let rows = sqlx::query_with(sqlx::AssertSqlSafe(stmt.sql.as_str()), values(stmt))
        .fetch_all(checkout.conn()?)
        .await
        .map_err(query_err)?;
    let ours: DateTime<Utc> = match rows.first() {
        Some(first) => first.try_get(transaction_start_column).map_err(query_err)?,
        None => sqlx::query_scalar(START)
            .fetch_one(checkout.conn()?)
            .await
            .map_err(query_err)?,
    };
    let next: DateTime<Utc> = sqlx::query_scalar(START)
        .fetch_one(checkout.conn()?)
        .await
        .map_err(query_err)?;
    if next == ours {
        return Ok(Checked::InAbandonedTransaction);
    }
    checkout.clean = true;
    Ok(Checked::Committed(
        rows.into_iter().map(Into::into).collect(),
    ))
}

/// PostgreSQL behind a transaction-pooling proxy: `stmt` as an *unnamed* statement between
/// `BEGIN` and `COMMIT` (simple-query messages), read to the end. The proxy keeps one server
/// connection for the whole transaction, so the statement's parse and its execution (two
/// protocol round trips in sqlx) reach the same server, and nothing outlives the transaction
/// there. The rows count only once `COMMIT` succeeded; on any other path the client connection
/// is closed rather than given back mid-transaction.
#[cfg(feature = "postgres")]
pub(crate) async fn postgres_in_transaction(
    pool: &sqlx::PgPool,
    stmt: &Statement,
) -> Result<Vec<QueryResult>, DbErr> {
    let mut checkout = Checkout::from(pool).await?;
    sqlx::raw_sql("BEGIN")
        .execute(checkout.conn()?)
        .await
        .map_err(query_err)?;
    let rows = sqlx::query_with(sqlx::AssertSqlSafe(stmt.sql.as_str()), values(stmt))
        .persistent(false)
        .fetch_all(checkout.conn()?)
        .await
        .map_err(query_err)?;
    sqlx::raw_sql("COMMIT")
        .execute(checkout.conn()?)
        .await
        .map_err(query_err)?;
    checkout.clean = true;
    Ok(rows.into_iter().map(Into::into).collect())
}

impl crate::SeaOrmLeaseStore {
    /// Runs a checked statement, again on another connection when the one it got was inside
    /// an abandoned transaction, at most `ATTEMPTS` times in all.
    pub(super) async fn autocommitted<F, Fut>(
        &self,
        mut run: F,
    ) -> Result<Vec<QueryResult>, crate::StoreError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Checked, DbErr>>,
    {
        for attempt in 1..=super::store::ATTEMPTS {
            match self.with_retry(&mut run).await? {
                Checked::Committed(rows) => return Ok(rows),
                Checked::InAbandonedTransaction => tracing::warn!(
                    table = %self.table(),
                    attempt,
                    "a pooled connection was inside a transaction (one nobody finished, e.g. a \
                     future dropped during `begin()`, or a session with autocommit off); closed \
                     it, its lease statement does not count"
                ),
            }
        }
        Err(crate::StoreError::Conflict {
            source: DbErr::Custom(
                "every pooled connection tried was inside an abandoned transaction".to_owned(),
            )
            .into(),
        })
    }
}
