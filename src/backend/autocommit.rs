//! Statements that are known to have run outside any abandoned transaction.
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
pub(crate) struct Checkout<DB: sqlx::Database> {
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
    let rows = match sqlx::query_with(sqlx::AssertSqlSafe(stmt.sql.as_str()), values(stmt))
        .fetch_all(checkout.conn()?)
        .await
    {
        Ok(rows) => rows,
        // The upsert's own lock wait ran out (1205; it rolled back alone, the caller asks
        // again): the connection goes back to the pool once a check shows it outside any
        // transaction and in autocommit.
        Err(err) if lock_wait_ran_out(&err) => {
            let check: Result<(i64, i64), _> = sqlx::query_as(MYSQL_OUTSIDE)
                .fetch_one(checkout.conn()?)
                .await;
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
    let rows = match sqlx::query_with(sqlx::AssertSqlSafe(stmt.sql.as_str()), values(stmt))
        .fetch_all(checkout.conn()?)
        .await
    {
        Ok(rows) => rows,
        // Inside an abandoned transaction that already failed: closed, tried on another.
        Err(err) if pg_in_failed_transaction(&err) => return Ok(Checked::InAbandonedTransaction),
        // The upsert's own lock wait ran out (the row is held by another transaction): an
        // answer like any other, asked again by the caller. The connection goes back to the
        // pool, not closed, once a check on it shows it outside any transaction (the statement
        // rolled back on its own).
        Err(err) if lock_wait_ran_out(&err) => {
            let check = sqlx::raw_sql(PG_OUTSIDE).fetch_all(checkout.conn()?).await;
            // A check that fails leaves the connection to be closed; the answer is the same.
            if matches!(pg_outside(check), Ok(true)) {
                checkout.clean = true;
            }
            return Err(query_err(err));
        }
        Err(err) => return Err(query_err(err)),
    };
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

/// PostgreSQL: the check of the connection before a statement, as one simple-protocol query.
/// In autocommit the query begins a transaction of its own, whose start is the query's statement
/// time; inside an older transaction the start is earlier.
#[cfg(feature = "postgres")]
const PG_OUTSIDE: &str = "SELECT transaction_timestamp() = statement_timestamp()";

/// PostgreSQL: `BEGIN` and the same check in one simple-protocol message. `BEGIN` inside a
/// transaction only warns; the check then sees the older start.
///
/// The transaction also gets an idle limit of 250 ms: the store sends its
/// statements back to back, so a client silent that long inside one of its own transactions
/// has stalled (a pause, a partition), and the server ends its session rather than let the
/// rows it locked (a renew queued behind a stalled fence, say) hold up the next term: the
/// takeover only ends fenced transactions.
#[cfg(feature = "postgres")]
fn pg_begin(begin: Begin) -> &'static str {
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

/// PostgreSQL `25P02`: the connection is inside a transaction that already failed.
#[cfg(feature = "postgres")]
fn pg_in_failed_transaction(err: &sqlx::Error) -> bool {
    err.as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == "25P02")
}

/// Whether a statement gave up waiting for a lock: PostgreSQL's `lock_not_available` (what the
/// bounded upsert's own `lock_timeout` raises), MariaDB's `ER_LOCK_WAIT_TIMEOUT` (1205, its
/// `innodb_lock_wait_timeout`).
pub(crate) fn lock_wait_ran_out(err: &sqlx::Error) -> bool {
    let Some(db) = err.as_database_error() else {
        return false;
    };
    #[cfg(feature = "mysql")]
    if let Some(m) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return m.number() == 1205;
    }
    db.code().is_some_and(|code| code == "55P03")
}

/// PostgreSQL: whether the rows of a check say "outside any transaction" (a failed transaction
/// is inside one too).
#[cfg(feature = "postgres")]
fn pg_outside(rows: Result<Vec<sqlx::postgres::PgRow>, sqlx::Error>) -> Result<bool, DbErr> {
    use sqlx::Row;
    match rows {
        Ok(rows) => match rows.last() {
            Some(row) => row.try_get::<bool, _>(0).map_err(query_err),
            None => Err(DbErr::Custom(
                "the transaction check returned no row".to_owned(),
            )),
        },
        Err(err) if pg_in_failed_transaction(&err) => Ok(false),
        Err(err) => Err(query_err(err)),
    }
}

/// MariaDB: the check of the connection before a statement: outside any transaction, and in
/// autocommit mode (so the statement commits when it ends).
#[cfg(feature = "mysql")]
const MYSQL_OUTSIDE: &str = "SELECT CAST(@@in_transaction AS SIGNED), CAST(@@autocommit AS SIGNED)";

/// `ER_CANT_CHANGE_TX_CHARACTERISTICS`: `SET TRANSACTION` inside a transaction.
#[cfg(feature = "mysql")]
const CANT_CHANGE_TX_CHARACTERISTICS: u16 = 1568;

/// MariaDB: the characteristics of a transaction of ours and its start, in one message. The
/// `SET TRANSACTION` is the check: refused inside a transaction (error 1568), and then the
/// `START TRANSACTION` (which would commit the older transaction) is not run.
#[cfg(feature = "mysql")]
fn mysql_begin(begin: Begin) -> &'static str {
    match begin {
        Begin::ReadWrite => "SET TRANSACTION READ WRITE; START TRANSACTION",
        Begin::RepeatableRead => {
            "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; START TRANSACTION"
        }
    }
}

#[cfg(feature = "mysql")]
fn mysql_error_number(err: &sqlx::Error) -> Option<u16> {
    err.as_database_error()?
        .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        .map(|e| e.number())
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

/// The application's pool as the store reaches it: sqlx's own pool, where the store can take
/// one connection and check it. `None` for connections it cannot (SeaORM's mock and proxy
/// connections, SQLite, which needs no check).
#[derive(Clone, Copy)]
pub(crate) enum Pool<'a> {
    #[cfg(feature = "postgres")]
    Postgres {
        pool: &'a sqlx::PgPool,
        /// Behind a transaction-pooling proxy: every statement in a transaction of its own,
        /// unnamed.
        transaction_pooling: bool,
    },
    #[cfg(feature = "mysql")]
    MySql(&'a sqlx::MySqlPool),
}

impl<'a> Pool<'a> {
    pub(crate) fn of(store: &'a crate::SeaOrmLeaseStore) -> Option<Self> {
        use sea_orm::DatabaseConnectionType;
        match &store.db.inner {
            #[cfg(feature = "postgres")]
            DatabaseConnectionType::SqlxPostgresPoolConnection(_) => Some(Pool::Postgres {
                pool: store.db.get_postgres_connection_pool(),
                transaction_pooling: store.transaction_pooling,
            }),
            #[cfg(feature = "mysql")]
            DatabaseConnectionType::SqlxMySqlPoolConnection(_) => {
                Some(Pool::MySql(store.db.get_mysql_connection_pool()))
            }
            _ => None,
        }
    }

    /// One statement, read to the end, on a connection checked to be outside any
    /// transaction (behind a transaction-pooling proxy: in a transaction of its own).
    pub(crate) async fn rows(self, stmt: &Statement) -> Result<Checked, DbErr> {
        match self {
            #[cfg(feature = "postgres")]
            Pool::Postgres {
                pool,
                transaction_pooling: true,
            } => postgres_in_transaction(pool, stmt).await,
            #[cfg(feature = "postgres")]
            Pool::Postgres { pool, .. } => {
                let Some(mut checkout) = postgres_outside(pool).await? else {
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
            #[cfg(feature = "mysql")]
            Pool::MySql(pool) => {
                let Some(mut checkout) = mysql_outside(pool).await? else {
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
        }
    }

    /// One statement that changes rows: how many it changed (as [`rows`](Self::rows)).
    pub(crate) async fn count(self, stmt: &Statement) -> Result<Checked<u64>, DbErr> {
        match self {
            #[cfg(feature = "postgres")]
            Pool::Postgres {
                transaction_pooling: true,
                ..
            } => {
                let Some(mut txn) = Transaction::begin(self, Begin::ReadWrite).await? else {
                    return Ok(Checked::InAbandonedTransaction);
                };
                let count = txn.execute(stmt).await?;
                txn.commit().await?;
                Ok(Checked::Committed(count))
            }
            #[cfg(feature = "postgres")]
            Pool::Postgres { pool, .. } => {
                let Some(mut checkout) = postgres_outside(pool).await? else {
                    return Ok(Checked::InAbandonedTransaction);
                };
                let done = sqlx::query_with(sqlx::AssertSqlSafe(stmt.sql.as_str()), values(stmt))
                    .execute(checkout.conn()?)
                    .await
                    .map_err(query_err)?;
                checkout.clean = true;
                Ok(Checked::Committed(done.rows_affected()))
            }
            #[cfg(feature = "mysql")]
            Pool::MySql(pool) => {
                let Some(mut checkout) = mysql_outside(pool).await? else {
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
    }
}

/// PostgreSQL: one connection of `pool`, checked to be outside any transaction; `None` if it
/// was not (it is closed).
#[cfg(feature = "postgres")]
async fn postgres_outside(pool: &sqlx::PgPool) -> Result<Option<Checkout<sqlx::Postgres>>, DbErr> {
    let mut checkout = Checkout::from(pool).await?;
    let check = sqlx::raw_sql(PG_OUTSIDE).fetch_all(checkout.conn()?).await;
    Ok(pg_outside(check)?.then_some(checkout))
}

/// MariaDB: one connection of `pool`, checked to be outside any transaction and in autocommit
/// mode; `None` if it was not (it is closed).
#[cfg(feature = "mysql")]
async fn mysql_outside(pool: &sqlx::MySqlPool) -> Result<Option<Checkout<sqlx::MySql>>, DbErr> {
    let mut checkout = Checkout::from(pool).await?;
    match sqlx::query_as::<_, (i64, i64)>(MYSQL_OUTSIDE)
        .fetch_one(checkout.conn()?)
        .await
    {
        Ok((inside, autocommit)) => Ok((inside == 0 && autocommit != 0).then_some(checkout)),
        // MySQL has no `@@in_transaction`: there `SET TRANSACTION` (for the next transaction
        // only; READ WRITE is the default) is the check, refused inside a transaction.
        Err(err)
            if mysql_error_number(&err) == Some(super::mysql::errors::UNKNOWN_SYSTEM_VARIABLE) =>
        {
            match sqlx::raw_sql("SET TRANSACTION READ WRITE")
                .execute(checkout.conn()?)
                .await
            {
                Ok(_) => {}
                Err(err) if mysql_error_number(&err) == Some(CANT_CHANGE_TX_CHARACTERISTICS) => {
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

/// A transaction of the store's own on one connection of the pool, begun on a connection
/// checked to be outside any transaction. It goes back to the pool only once `COMMIT`
/// succeeded; dropped anywhere before (an error, the caller's future dropped), the connection
/// is closed and the server rolls the transaction back.
pub(crate) enum Transaction {
    #[cfg(feature = "postgres")]
    Postgres {
        checkout: Checkout<sqlx::Postgres>,
        /// Named (prepared and cached) statements; unnamed behind a transaction-pooling proxy.
        persistent: bool,
    },
    #[cfg(feature = "mysql")]
    MySql(Checkout<sqlx::MySql>),
}

impl Transaction {
    /// The transaction, or `None` when the connection it got was inside one already (it is
    /// closed: try again).
    pub(crate) async fn begin(pool: Pool<'_>, begin: Begin) -> Result<Option<Self>, DbErr> {
        match pool {
            #[cfg(feature = "postgres")]
            Pool::Postgres {
                pool,
                transaction_pooling,
            } => {
                let mut checkout = Checkout::from(pool).await?;
                let check = sqlx::raw_sql(pg_begin(begin))
                    .fetch_all(checkout.conn()?)
                    .await;
                if !pg_outside(check)? {
                    return Ok(None);
                }
                Ok(Some(Transaction::Postgres {
                    checkout,
                    persistent: !transaction_pooling,
                }))
            }
            #[cfg(feature = "mysql")]
            Pool::MySql(pool) => {
                let mut checkout = Checkout::from(pool).await?;
                match sqlx::raw_sql(mysql_begin(begin))
                    .execute(checkout.conn()?)
                    .await
                {
                    Ok(_) => Ok(Some(Transaction::MySql(checkout))),
                    Err(err)
                        if mysql_error_number(&err) == Some(CANT_CHANGE_TX_CHARACTERISTICS) =>
                    {
                        Ok(None)
                    }
                    Err(err) => Err(query_err(err)),
                }
            }
        }
    }

    /// A statement of the transaction, read to the end.
    pub(crate) async fn rows(&mut self, stmt: &Statement) -> Result<Vec<QueryResult>, DbErr> {
        let sql = sqlx::AssertSqlSafe(stmt.sql.as_str());
        match self {
            #[cfg(feature = "postgres")]
            Transaction::Postgres {
                checkout,
                persistent,
            } => Ok(sqlx::query_with(sql, values(stmt))
                .persistent(*persistent)
                .fetch_all(checkout.conn()?)
                .await
                .map_err(query_err)?
                .into_iter()
                .map(Into::into)
                .collect()),
            #[cfg(feature = "mysql")]
            Transaction::MySql(checkout) => Ok(sqlx::query_with(sql, values(stmt))
                .fetch_all(checkout.conn()?)
                .await
                .map_err(query_err)?
                .into_iter()
                .map(Into::into)
                .collect()),
        }
    }

    /// A statement of the transaction that changes rows: how many it changed.
    pub(crate) async fn execute(&mut self, stmt: &Statement) -> Result<u64, DbErr> {
        let sql = sqlx::AssertSqlSafe(stmt.sql.as_str());
        match self {
            #[cfg(feature = "postgres")]
            Transaction::Postgres {
                checkout,
                persistent,
            } => Ok(sqlx::query_with(sql, values(stmt))
                .persistent(*persistent)
                .execute(checkout.conn()?)
                .await
                .map_err(query_err)?
                .rows_affected()),
            #[cfg(feature = "mysql")]
            Transaction::MySql(checkout) => Ok(sqlx::query_with(sql, values(stmt))
                .execute(checkout.conn()?)
                .await
                .map_err(query_err)?
                .rows_affected()),
        }
    }

    /// Commits, then reads `stmt` on the same connection, now outside any transaction: what
    /// the commit left, as the server answers once it has returned. The connection goes back
    /// to the pool only after both (dropped in between, it is closed).
    #[cfg(feature = "mysql")]
    pub(crate) async fn commit_then_rows(
        mut self,
        stmt: &Statement,
    ) -> Result<Vec<QueryResult>, DbErr> {
        self.send_commit().await?;
        let rows = self.rows(stmt).await?;
        self.give_back();
        Ok(rows)
    }

    /// Commits; only then does the connection go back to the pool.
    pub(crate) async fn commit(mut self) -> Result<(), DbErr> {
        self.send_commit().await?;
        self.give_back();
        Ok(())
    }

    async fn send_commit(&mut self) -> Result<(), DbErr> {
        match self {
            #[cfg(feature = "postgres")]
            Transaction::Postgres { checkout, .. } => {
                sqlx::raw_sql("COMMIT")
                    .execute(checkout.conn()?)
                    .await
                    .map_err(query_err)?;
            }
            // Whatever `completion_type` says: a chained COMMIT would hand the connection back
            // inside the next transaction, a releasing one disconnected.
            #[cfg(feature = "mysql")]
            Transaction::MySql(checkout) => {
                sqlx::raw_sql("COMMIT AND NO CHAIN NO RELEASE")
                    .execute(checkout.conn()?)
                    .await
                    .map_err(query_err)?;
            }
        }
        Ok(())
    }

    /// The connection is outside any transaction again: it may go back to the pool.
    fn give_back(&mut self) {
        match self {
            #[cfg(feature = "postgres")]
            Transaction::Postgres { checkout, .. } => checkout.clean = true,
            #[cfg(feature = "mysql")]
            Transaction::MySql(checkout) => checkout.clean = true,
        }
    }
}

/// PostgreSQL behind a transaction-pooling proxy: `stmt` as an *unnamed* statement in a
/// transaction of its own (begun and checked in one simple-query message, see [`pg_begin`]),
/// read to the end. The proxy keeps one server connection for the whole transaction, so the
/// statement's parse and its execution (two protocol round trips in sqlx) reach the same
/// server, and nothing outlives the transaction there. The rows count only once `COMMIT`
/// succeeded; on any other path the client connection is closed rather than given back
/// mid-transaction. A client connection the proxy holds inside an older transaction is closed
/// without a statement sent (its `BEGIN` would have joined, and its `COMMIT` committed, that
/// transaction).
#[cfg(feature = "postgres")]
pub(crate) async fn postgres_in_transaction(
    pool: &sqlx::PgPool,
    stmt: &Statement,
) -> Result<Checked, DbErr> {
    let pool = Pool::Postgres {
        pool,
        transaction_pooling: true,
    };
    let Some(mut txn) = Transaction::begin(pool, Begin::ReadWrite).await? else {
        return Ok(Checked::InAbandonedTransaction);
    };
    let rows = txn.rows(stmt).await?;
    txn.commit().await?;
    Ok(Checked::Committed(rows))
}

impl crate::SeaOrmLeaseStore {
    /// One statement on a checked connection of the application's pool, read to the end, tried
    /// again on another connection when the one it got was inside a transaction; `None` when
    /// the store's connection is no pool it can check (then SeaORM runs the statement).
    pub(crate) async fn checked_rows(
        &self,
        stmt: &Statement,
    ) -> Option<Result<Vec<QueryResult>, crate::StoreError>> {
        let pool = Pool::of(self)?;
        Some(self.autocommitted(|| pool.rows(stmt)).await)
    }

    /// As [`checked_rows`](Self::checked_rows), for a statement that changes rows: how many.
    pub(crate) async fn checked_count(
        &self,
        stmt: &Statement,
    ) -> Option<Result<u64, crate::StoreError>> {
        let pool = Pool::of(self)?;
        Some(self.autocommitted(|| pool.count(stmt)).await)
    }

    /// Runs a checked statement, again on another connection when the one it got was inside
    /// an abandoned transaction, at most `ATTEMPTS` times in all.
    pub(crate) async fn autocommitted<T, F, Fut>(&self, mut run: F) -> Result<T, crate::StoreError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Checked<T>, DbErr>>,
    {
        for attempt in 1..=super::store::ATTEMPTS {
            match self.with_retry(&mut run).await? {
                Checked::Committed(rows) => return Ok(rows),
                Checked::InAbandonedTransaction => tracing::warn!(
                    table = %self.table(),
                    attempt,
                    "a pooled connection was inside a transaction (one nobody finished, e.g. a \
                     future dropped during `begin()`, or a session with autocommit off); closed \
                     it (the server rolls that transaction back), nothing the store sent on it \
                     counts, trying another"
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
