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
//! A connection found inside a transaction is rolled back (which also frees the lease row it may
//! have locked) and the statement is tried again on another one; nothing it returned is used.
//! MySQL's transaction form and SQLite need none of this: the first commits explicitly, and
//! sqlx's SQLite driver does not leave a cancelled `BEGIN` open.

use sea_orm::sqlx;
use sea_orm::{DbErr, QueryResult, RuntimeErr, Statement};
use sea_query_sqlx::SqlxValues;

/// What one checked run found.
pub(crate) enum Checked {
    /// The statement ran in autocommit mode and has committed: its rows are the outcome.
    Committed(Vec<QueryResult>),
    /// The connection was inside an abandoned transaction: it was rolled back, and nothing the
    /// statement did or returned counts.
    InAbandonedTransaction,
}

fn query_err(err: sqlx::Error) -> DbErr {
    DbErr::Query(RuntimeErr::SqlxError(err.into()))
}

fn values(stmt: &Statement) -> SqlxValues {
    SqlxValues(stmt.values.clone().unwrap_or(sea_orm::Values(Vec::new())))
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
    let mut conn = pool.acquire().await.map_err(query_err)?;
    let rows = sqlx::query_with(sqlx::AssertSqlSafe(stmt.sql.as_str()), values(stmt))
        .fetch_all(&mut *conn)
        .await
        .map_err(query_err)?;
    let mut inside = false;
    for row in &rows {
        let flag: i64 = row.try_get(in_transaction_column).map_err(query_err)?;
        inside |= flag != 0;
    }
    if inside {
        sqlx::query("ROLLBACK")
            .execute(&mut *conn)
            .await
            .map_err(query_err)?;
        return Ok(Checked::InAbandonedTransaction);
    }
    Ok(Checked::Committed(
        rows.into_iter().map(Into::into).collect(),
    ))
}

/// PostgreSQL: runs `stmt` (whose last returned column is `transaction_timestamp()`) on one
/// pooled connection, read to the end, then compares that with a fresh
/// `transaction_timestamp()` on the same connection.
#[cfg(feature = "postgres")]
pub(crate) async fn postgres(
    pool: &sqlx::PgPool,
    stmt: &Statement,
    transaction_start_column: usize,
) -> Result<Checked, DbErr> {
    use chrono::{DateTime, Utc};
    use sqlx::Row;
    let mut conn = pool.acquire().await.map_err(query_err)?;
    let rows = sqlx::query_with(sqlx::AssertSqlSafe(stmt.sql.as_str()), values(stmt))
        .fetch_all(&mut *conn)
        .await
        .map_err(query_err)?;
    let Some(first) = rows.first() else {
        // No row, no outcome to trust or distrust: a denial without a report.
        return Ok(Checked::Committed(Vec::new()));
    };
    let ours: DateTime<Utc> = first.try_get(transaction_start_column).map_err(query_err)?;
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT transaction_timestamp()")
        .fetch_one(&mut *conn)
        .await
        .map_err(query_err)?;
    if now == ours {
        sqlx::query("ROLLBACK")
            .execute(&mut *conn)
            .await
            .map_err(query_err)?;
        return Ok(Checked::InAbandonedTransaction);
    }
    Ok(Checked::Committed(
        rows.into_iter().map(Into::into).collect(),
    ))
}
