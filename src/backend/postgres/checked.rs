//! PostgreSQL: statements known to have run outside any abandoned transaction (see
//! `sessions`). On the store's own sessions (`sessions`) every statement is sent alone: nothing
//! else ever runs there. On the application's pool a deciding statement compares
//! `transaction_timestamp()` with a fresh read on the same connection, and every other
//! statement runs after a one-message check. The store's own transactions begin and check in
//! one message on either. Behind a transaction-pooling proxy every statement runs unnamed in a
//! transaction of its own, on the application's pool.

use chrono::{DateTime, Utc};
use sea_orm::sqlx::{self, Row};
use sea_orm::{DbErr, QueryResult, Statement};

use super::errors::{in_failed_transaction, lock_wait_ran_out};
use crate::backend::sessions::OwnPool;
use crate::backend::sessions::{query_err, values, Begin, Checked, Checkout, Source};

/// Runs `stmt` (whose last returned column is `transaction_timestamp()`) on one connection,
/// read to the end. On the application's pool it then compares that with a fresh
/// `transaction_timestamp()` on the same connection (a statement that returned no row is
/// checked with two fresh reads instead: it may still have locked the row); on one of the
/// store's own sessions the statement ran in autocommit and that is all.
pub(crate) async fn deciding(
    source: Source<'_, sqlx::Postgres>,
    stmt: &Statement,
    transaction_start_column: usize,
) -> Result<Checked, DbErr> {
    const START: &str = "SELECT transaction_timestamp()";
    let mut checkout = Checkout::from(source).await?;
    let rows = match sqlx::query_with(sqlx::AssertSqlSafe(stmt.sql.as_str()), values(stmt))
        .fetch_all(checkout.conn()?)
        .await
    {
        Ok(rows) => rows,
        // Inside an abandoned transaction that already failed: closed, tried on another.
        Err(err) if in_failed_transaction(&err) => return Ok(Checked::InAbandonedTransaction),
        // The upsert's own lock wait ran out (the row is held by another transaction): an
        // answer like any other, asked again by the caller. The connection goes back to the
        // pool, not closed, once a check on it shows it outside any transaction (the statement
        // rolled back on its own).
        Err(err) if lock_wait_ran_out(&err) => {
            let check = sqlx::raw_sql(OUTSIDE).fetch_all(checkout.conn()?).await;
            // A check that fails leaves the connection to be closed; the answer is the same.
            if matches!(outside(check), Ok(true)) {
                checkout.clean = true;
            }
            return Err(query_err(err));
        }
        Err(err) => return Err(query_err(err)),
    };
    if checkout.own {
        checkout.clean = true;
        return Ok(Checked::Committed(
            rows.into_iter().map(Into::into).collect(),
        ));
    }
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

/// The check of the connection before a statement, as one simple-protocol query. In
/// autocommit the query begins a transaction of its own, whose start is the query's statement
/// time; inside an older transaction the start is earlier.
const OUTSIDE: &str = "SELECT transaction_timestamp() = statement_timestamp()";

/// `BEGIN` and the same check in one simple-protocol message. `BEGIN` inside a transaction
/// only warns; the check then sees the older start.
///
/// The transaction also gets an idle limit of 250 ms: the store sends its
/// statements back to back, so a client silent that long inside one of its own transactions
/// has stalled (a pause, a partition), and the server ends its session rather than let the
/// rows it locked (a renew queued behind a stalled fence, say) hold up the next term: the
/// takeover only ends fenced transactions.
fn begin_sql(begin: Begin) -> &'static str {
    match begin {
        Begin::ReadWrite => {
            "BEGIN; SET LOCAL idle_in_transaction_session_timeout = 250; \
             SELECT transaction_timestamp() = statement_timestamp()"
        }
        Begin::RepeatableRead => {
            "BEGIN ISOLATION LEVEL REPEATABLE READ; \
             SET LOCAL idle_in_transaction_session_timeout = 250; \
             SELECT transaction_timestamp() = statement_timestamp()"
        }
    }
}

/// Whether the rows of a check say "outside any transaction" (a failed transaction is inside
/// one too).
fn outside(rows: Result<Vec<sqlx::postgres::PgRow>, sqlx::Error>) -> Result<bool, DbErr> {
    match rows {
        Ok(rows) => match rows.last() {
            Some(row) => row.try_get::<bool, _>(0).map_err(query_err),
            None => Err(DbErr::Custom(
                "the transaction check returned no row".to_owned(),
            )),
        },
        Err(err) if in_failed_transaction(&err) => Ok(false),
        Err(err) => Err(query_err(err)),
    }
}

/// One connection, known or checked to be outside any transaction; `None` if it was not (it
/// is closed).
async fn checked_out(
    source: Source<'_, sqlx::Postgres>,
) -> Result<Option<Checkout<sqlx::Postgres>>, DbErr> {
    let mut checkout = Checkout::from(source).await?;
    if checkout.own {
        return Ok(Some(checkout));
    }
    let check = sqlx::raw_sql(OUTSIDE).fetch_all(checkout.conn()?).await;
    Ok(outside(check)?.then_some(checkout))
}

/// The connections the store reaches.
#[derive(Clone, Copy)]
pub(crate) struct Pool<'a> {
    /// The application's pool.
    pub(crate) pool: &'a sqlx::PgPool,
    /// The store's own sessions, if it has any.
    pub(crate) own: Option<&'a OwnPool<sqlx::Postgres>>,
    /// Behind a transaction-pooling proxy: every statement in a transaction of its own,
    /// unnamed, on the application's pool.
    pub(crate) transaction_pooling: bool,
}

impl<'a> Pool<'a> {
    /// Where a statement takes its connection: the store's own sessions unless there are
    /// none or the application goes through a transaction-pooling proxy.
    pub(crate) fn source(self) -> Source<'a, sqlx::Postgres> {
        match self.own {
            Some(own) if !self.transaction_pooling => Source::Own(own),
            _ => Source::Shared(self.pool),
        }
    }

    /// One statement, read to the end, on a connection checked to be outside any
    /// transaction (behind a transaction-pooling proxy: in a transaction of its own).
    pub(crate) async fn checked_rows(self, stmt: &Statement) -> Result<Checked, DbErr> {
        if self.transaction_pooling {
            return in_transaction(self.pool, stmt).await;
        }
        rows_on(self.source(), stmt).await
    }

    /// One statement, read to the end, as [`checked_rows`](Self::checked_rows) but on an idle session of the
    /// store's own only if one is free at once, else on the application's pool (checked): for
    /// a statement that must not queue behind the store's other calls.
    pub(crate) async fn rows_beside(self, stmt: &Statement) -> Result<Checked, DbErr> {
        let source = match self.own {
            Some(own) if !self.transaction_pooling => Source::IdleOwnOrShared(own, self.pool),
            _ => return self.checked_rows(stmt).await,
        };
        rows_on(source, stmt).await
    }

    /// One statement that changes rows: how many it changed (as
    /// [`checked_rows`](Self::checked_rows)).
    pub(crate) async fn checked_count(self, stmt: &Statement) -> Result<Checked<u64>, DbErr> {
        if self.transaction_pooling {
            let Some(mut txn) = Transaction::begin(self, Begin::ReadWrite).await? else {
                return Ok(Checked::InAbandonedTransaction);
            };
            let count = txn.execute(stmt).await?;
            txn.commit().await?;
            return Ok(Checked::Committed(count));
        }
        let Some(mut checkout) = checked_out(self.source()).await? else {
            return Ok(Checked::InAbandonedTransaction);
        };
        let done = sqlx::query_with(sqlx::AssertSqlSafe(stmt.sql.as_str()), values(stmt))
            .execute(checkout.conn()?)
            .await
            .map_err(query_err)?;
        checkout.clean = true;
        Ok(Checked::Committed(done.rows_affected()))
    }
}

/// One statement, read to the end, on a connection of `source` checked to be outside any
/// transaction; back to its pool only after the whole answer.
async fn rows_on(source: Source<'_, sqlx::Postgres>, stmt: &Statement) -> Result<Checked, DbErr> {
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

/// A transaction of the store's own on one connection of the pool, begun on a connection
/// checked to be outside any transaction. It goes back to the pool only once `COMMIT`
/// succeeded; dropped anywhere before (an error, the caller's future dropped), the connection
/// is closed and the server rolls the transaction back.
pub(crate) struct Transaction {
    checkout: Checkout<sqlx::Postgres>,
    /// Named (prepared and cached) statements; unnamed behind a transaction-pooling proxy.
    persistent: bool,
}

impl Transaction {
    /// The transaction, or `None` when the connection it got was inside one already (it is
    /// closed: try again).
    pub(crate) async fn begin(pool: Pool<'_>, begin: Begin) -> Result<Option<Self>, DbErr> {
        let mut checkout = Checkout::from(pool.source()).await?;
        let check = sqlx::raw_sql(begin_sql(begin))
            .fetch_all(checkout.conn()?)
            .await;
        if !outside(check)? {
            return Ok(None);
        }
        Ok(Some(Transaction {
            checkout,
            persistent: !pool.transaction_pooling,
        }))
    }

    /// A statement of the transaction, read to the end.
    pub(crate) async fn read_all(&mut self, stmt: &Statement) -> Result<Vec<QueryResult>, DbErr> {
        Ok(
            sqlx::query_with(sqlx::AssertSqlSafe(stmt.sql.as_str()), values(stmt))
                .persistent(self.persistent)
                .fetch_all(self.checkout.conn()?)
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
                .persistent(self.persistent)
                .execute(self.checkout.conn()?)
                .await
                .map_err(query_err)?
                .rows_affected(),
        )
    }

    /// Commits; only then does the connection go back to the pool.
    pub(crate) async fn commit(mut self) -> Result<(), DbErr> {
        sqlx::raw_sql("COMMIT")
            .execute(self.checkout.conn()?)
            .await
            .map_err(query_err)?;
        self.checkout.clean = true;
        Ok(())
    }
}

/// Behind a transaction-pooling proxy: `stmt` as an *unnamed* statement in a transaction of
/// its own (begun and checked in one simple-query message, see [`begin_sql`]), read to the end.
/// The proxy keeps one server connection for the whole transaction, so the statement's parse
/// and its execution (two protocol round trips in sqlx) reach the same server, and nothing
/// outlives the transaction there. The rows count only once `COMMIT` succeeded; on any other
/// path the client connection is closed rather than given back mid-transaction. A client
/// connection the proxy holds inside an older transaction is closed without a statement sent
/// (its `BEGIN` would have joined, and its `COMMIT` committed, that transaction).
pub(crate) async fn in_transaction(
    pool: &sqlx::PgPool,
    stmt: &Statement,
) -> Result<Checked, DbErr> {
    let pool = Pool {
        pool,
        own: None,
        transaction_pooling: true,
    };
    let Some(mut txn) = Transaction::begin(pool, Begin::ReadWrite).await? else {
        return Ok(Checked::InAbandonedTransaction);
    };
    let rows = txn.read_all(stmt).await?;
    txn.commit().await?;
    Ok(Checked::Committed(rows))
}
