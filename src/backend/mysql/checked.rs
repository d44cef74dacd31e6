//! MySQL and MariaDB: statements known to have run outside any abandoned transaction (see
//! `sessions`). MariaDB's `RETURNING` list ends in `@@in_transaction` (checked wherever the
//! statement runs, at no cost); on the application's pool every other statement runs after a
//! one-round-trip check, while on the store's own sessions (`sessions`), where nothing else
//! ever runs, it is sent alone. The store's own transactions begin with `SET TRANSACTION`,
//! which the server refuses inside a transaction.

use sea_orm::sqlx::{self, Row};
use sea_orm::{DbErr, QueryResult, Statement};

use super::errors::{
    lock_wait_ran_out, sqlx_error_number, CANT_CHANGE_TX_CHARACTERISTICS, UNKNOWN_SYSTEM_VARIABLE,
};
use crate::backend::sessions::{query_err, values, Begin, Checked, Checkout, Source};

/// Runs `stmt` (whose last returned column is `@@in_transaction`) on one pooled connection,
/// read to the end.
pub(crate) async fn deciding(
    source: Source<'_, sqlx::MySql>,
    stmt: &Statement,
    in_transaction_column: usize,
) -> Result<Checked, DbErr> {
    let mut checkout = Checkout::from(source).await?;
    let rows = match sqlx::query_with(sqlx::AssertSqlSafe(stmt.sql.as_str()), values(stmt))
        .fetch_all(checkout.conn()?)
        .await
    {
        Ok(rows) => rows,
        // The upsert's own lock wait ran out (1205; it rolled back alone, the caller asks
        // again): the connection goes back to the pool once a check shows it outside any
        // transaction and in autocommit.
        Err(err) if lock_wait_ran_out(&err) => {
            let check: Result<(i64, i64), _> =
                sqlx::query_as(OUTSIDE).fetch_one(checkout.conn()?).await;
            if matches!(check, Ok((0, 1))) {
                checkout.clean = true;
            }
            return Err(query_err(err));
        }
        Err(err) => return Err(query_err(err)),
    };
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

/// The check of the connection before a statement: outside any transaction, and in
/// autocommit mode (so the statement commits when it ends).
const OUTSIDE: &str = "SELECT CAST(@@in_transaction AS SIGNED), CAST(@@autocommit AS SIGNED)";

/// The characteristics of a transaction of ours and its start, in one message. The `SET
/// TRANSACTION` is the check: refused inside a transaction (error 1568), and then the `START
/// TRANSACTION` (which would commit the older transaction) is not run.
fn begin_sql(begin: Begin) -> &'static str {
    match begin {
        Begin::ReadWrite => "SET TRANSACTION READ WRITE; START TRANSACTION",
        Begin::RepeatableRead => {
            "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; START TRANSACTION"
        }
    }
}

/// One connection, known (one of the store's own) or checked to be outside any transaction
/// and in autocommit mode; `None` if it was not (it is closed).
async fn checked_out(
    source: Source<'_, sqlx::MySql>,
) -> Result<Option<Checkout<sqlx::MySql>>, DbErr> {
    let mut checkout = Checkout::from(source).await?;
    if checkout.own {
        return Ok(Some(checkout));
    }
    match sqlx::query_as::<_, (i64, i64)>(OUTSIDE)
        .fetch_one(checkout.conn()?)
        .await
    {
        Ok((inside, autocommit)) => Ok((inside == 0 && autocommit != 0).then_some(checkout)),
        // MySQL has no `@@in_transaction`: there `SET TRANSACTION` (for the next transaction
        // only; READ WRITE is the default) is the check, refused inside a transaction.
        Err(err) if sqlx_error_number(&err) == Some(UNKNOWN_SYSTEM_VARIABLE) => {
            match sqlx::raw_sql("SET TRANSACTION READ WRITE")
                .execute(checkout.conn()?)
                .await
            {
                Ok(_) => {}
                Err(err) if sqlx_error_number(&err) == Some(CANT_CHANGE_TX_CHARACTERISTICS) => {
                    return Ok(None)
                }
                Err(err) => return Err(query_err(err)),
            }
            let autocommit: i64 = sqlx::query_scalar("SELECT CAST(@@autocommit AS SIGNED)")
                .fetch_one(checkout.conn()?)
                .await
                .map_err(query_err)?;
            Ok((autocommit != 0).then_some(checkout))
        }
        Err(err) => Err(query_err(err)),
    }
}

/// One statement, read to the end, on a connection checked to be outside any transaction.
pub(crate) async fn rows(
    source: Source<'_, sqlx::MySql>,
    stmt: &Statement,
) -> Result<Checked, DbErr> {
    let Some(mut checkout) = checked_out(source).await? else {
        return Ok(Checked::InAbandonedTransaction);
    };
    let rows = sqlx::query_with(sqlx::AssertSqlSafe(stmt.sql.as_str()), values(stmt))
        .fetch_all(checkout.conn()?)
        .await
        .map_err(query_err)?;
    checkout.clean = true;
    Ok(Checked::Committed(
        rows.into_iter().map(Into::into).collect(),
    ))
}

/// A statement sent as text (the simple protocol) on a connection checked to be outside any
/// transaction: column `column` of its first row, as text.
pub(crate) async fn text_column(
    source: Source<'_, sqlx::MySql>,
    sql: &str,
    column: usize,
) -> Result<Checked<Option<String>>, DbErr> {
    let Some(mut checkout) = checked_out(source).await? else {
        return Ok(Checked::InAbandonedTransaction);
    };
    let rows = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .fetch_all(checkout.conn()?)
        .await
        .map_err(query_err)?;
    let text = match rows.first() {
        Some(row) => {
            let bytes: Vec<u8> = row.try_get_unchecked(column).map_err(query_err)?;
            Some(String::from_utf8_lossy(&bytes).into_owned())
        }
        None => None,
    };
    checkout.clean = true;
    Ok(Checked::Committed(text))
}

/// One statement that changes rows: how many it changed (as [`rows`]).
pub(crate) async fn count(
    source: Source<'_, sqlx::MySql>,
    stmt: &Statement,
) -> Result<Checked<u64>, DbErr> {
    let Some(mut checkout) = checked_out(source).await? else {
        return Ok(Checked::InAbandonedTransaction);
    };
    let done = sqlx::query_with(sqlx::AssertSqlSafe(stmt.sql.as_str()), values(stmt))
        .execute(checkout.conn()?)
        .await
        .map_err(query_err)?;
    checkout.clean = true;
    Ok(Checked::Committed(done.rows_affected()))
}

/// A transaction of the store's own on one connection of the pool, begun on a connection
/// checked to be outside any transaction. It goes back to the pool only once `COMMIT`
/// succeeded; dropped anywhere before (an error, the caller's future dropped), the connection
/// is closed and the server rolls the transaction back.
pub(crate) struct Transaction(Checkout<sqlx::MySql>);

impl Transaction {
    /// The transaction, or `None` when the connection it got was inside one already (it is
    /// closed: try again).
    pub(crate) async fn begin(
        source: Source<'_, sqlx::MySql>,
        begin: Begin,
    ) -> Result<Option<Self>, DbErr> {
        let mut checkout = Checkout::from(source).await?;
        match sqlx::raw_sql(begin_sql(begin))
            .execute(checkout.conn()?)
            .await
        {
            Ok(_) => Ok(Some(Transaction(checkout))),
            Err(err) if sqlx_error_number(&err) == Some(CANT_CHANGE_TX_CHARACTERISTICS) => Ok(None),
            Err(err) => Err(query_err(err)),
        }
    }

    /// A statement of the transaction, read to the end.
    pub(crate) async fn rows(&mut self, stmt: &Statement) -> Result<Vec<QueryResult>, DbErr> {
        Ok(
            sqlx::query_with(sqlx::AssertSqlSafe(stmt.sql.as_str()), values(stmt))
                .fetch_all(self.0.conn()?)
                .await
                .map_err(query_err)?
                .into_iter()
                .map(Into::into)
                .collect(),
        )
    }

    /// A statement of the transaction that changes rows: how many it changed.
    pub(crate) async fn execute(&mut self, stmt: &Statement) -> Result<u64, DbErr> {
        Ok(
            sqlx::query_with(sqlx::AssertSqlSafe(stmt.sql.as_str()), values(stmt))
                .execute(self.0.conn()?)
                .await
                .map_err(query_err)?
                .rows_affected(),
        )
    }

    /// Commits, then reads `stmt` on the same connection, now outside any transaction: what
    /// the commit left, as the server answers once it has returned. The connection goes back
    /// to the pool only after both (dropped in between, it is closed).
    pub(crate) async fn commit_then_rows(
        mut self,
        stmt: &Statement,
    ) -> Result<Vec<QueryResult>, DbErr> {
        self.send_commit().await?;
        let rows = self.rows(stmt).await?;
        self.0.clean = true;
        Ok(rows)
    }

    /// Rolls back (after a statement the server refused, such as a lock it would not wait
    /// for); the connection goes back to the pool once the server said so.
    pub(crate) async fn rollback(mut self) -> Result<(), DbErr> {
        sqlx::raw_sql("ROLLBACK AND NO CHAIN NO RELEASE")
            .execute(self.0.conn()?)
            .await
            .map_err(query_err)?;
        self.0.clean = true;
        Ok(())
    }

    /// Commits; only then does the connection go back to the pool.
    pub(crate) async fn commit(mut self) -> Result<(), DbErr> {
        self.send_commit().await?;
        self.0.clean = true;
        Ok(())
    }

    // Whatever `completion_type` says: a chained COMMIT would hand the connection back inside
    // the next transaction, a releasing one disconnected.
    async fn send_commit(&mut self) -> Result<(), DbErr> {
        sqlx::raw_sql("COMMIT AND NO CHAIN NO RELEASE")
            .execute(self.0.conn()?)
            .await
            .map_err(query_err)?;
        Ok(())
    }
}
