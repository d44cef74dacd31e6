//! How the store runs its statements on MySQL and MariaDB: the upsert form detected once per
//! store (`RETURNING` on MariaDB 10.5+, a transaction on MySQL), every statement checked to run
//! outside any abandoned transaction (`autocommit`), and Galera detected for the fence.

use sea_orm::{ConnectionTrait, DatabaseConnectionType, DbBackend, DbErr, QueryResult, Statement};

use crate::backend::autocommit::{self, Begin, Checked};
use crate::backend::errors::classify;
use crate::backend::statements::{self, Row};
use crate::{LeaseOutcome, SeaOrmLeaseStore, StoreError};

use super::errors::{error_number, UNKNOWN_SYSTEM_VARIABLE};
use super::statements::IN_TRANSACTION_COLUMN;
use super::{MySql, MySqlUpsert};

/// Acquire-or-renew: the row after the upsert is the outcome, whoever holds the lease.
pub(crate) async fn acquire_or_renew(
    store: &SeaOrmLeaseStore,
    resource: &str,
    candidate: &str,
    millis: i64,
) -> Result<LeaseOutcome, StoreError> {
    let rows = upsert(store, resource, candidate, millis).await?;
    // Galera is known from the first grant on, whatever the upsert form (also one set with
    // `with_mysql_upsert`): the statement-level fence refuses to run there, and `fenced_by`
    // cannot ask the server. A failed look is not cached and does not fail the grant; the
    // next grant looks again.
    if store.galera.get().is_none() {
        if let Err(error) = galera_on_pool(store).await {
            tracing::debug!(%error, "Galera detection deferred to the next grant");
        }
    }
    let Some(row) = store.single_row(&rows)? else {
        // The upsert always leaves a row, and a transaction reads its own writes: no row, the
        // same after the COMMIT (see `committed_as_read`), means the transaction was rolled
        // back under the statements (seen on Galera, the Transaction form). Not a grant, and
        // retryable.
        tracing::warn!(
            table = store.table(),
            resource,
            "the upserted lease row was not there to read in its own transaction (rolled back \
             under it); not a grant"
        );
        return Err(StoreError::Conflict {
            source: DbErr::RecordNotFound(
                "the upserted lease row, in its own transaction: the transaction was rolled \
                 back under it (a Galera brute-force abort?)"
                    .to_owned(),
            )
            .into(),
        });
    };
    let decoded = Row::decode(row).map_err(|source| store.decode_error(source))?;
    Ok(decoded.outcome(resource, candidate))
}

/// The batch renew and the read of what it renewed, in one transaction; the rows once it has
/// committed.
pub(crate) async fn renew_all(
    store: &SeaOrmLeaseStore,
    json: String,
    millis: i64,
) -> Result<Vec<QueryResult>, StoreError> {
    use sea_orm::TransactionTrait;
    let table = store.table_iden();
    let update = super::statements::renew_all(&table, json.clone(), millis)
        .map_err(|e| StoreError::Database(e.into()))?;
    let read = super::statements::renewed(&table, json);
    // REPEATABLE READ whatever the session's level: the update then keeps the locks of the rows
    // it found lapsed, so no other renew can write one of them before the read, which would
    // report it as renewed by this call.
    if let Some(pool) = autocommit::Pool::of(store) {
        let read = DbBackend::MySql.build(&read);
        return in_transaction(store, pool, Begin::RepeatableRead, &update, &read).await;
    }
    let (rows, after) = store
        .with_retry(|| async {
            // REPEATABLE READ whatever the session's level: the update then keeps the locks of
            // the rows it found lapsed, so no other renew can write one of them before the
            // read below, which would report it as renewed by this call.
            let txn = store
                .db
                .begin_with_config(Some(sea_orm::IsolationLevel::RepeatableRead), None)
                .await?;
            txn.execute_raw(update.clone()).await?;
            // The update holds the renewed rows' locks until commit: this reads what it left.
            let rows = txn.query_all(&read).await?;
            txn.commit().await?;
            let after = store.db.query_all(&read).await?;
            Ok((rows, after))
        })
        .await?;
    committed_as_read(store, rows, &after)
}

/// The rows after the upsert, read to the end, in the server's form.
async fn upsert(
    store: &SeaOrmLeaseStore,
    resource: &str,
    candidate: &str,
    millis: i64,
) -> Result<Vec<QueryResult>, StoreError> {
    use sea_orm::TransactionTrait;
    let table = store.table_iden();
    match form(store).await? {
        MySqlUpsert::Returning => {
            let stmt = store.acquire_prepared()?.bind(resource, candidate, millis);
            deciding(store, stmt).await
        }
        MySqlUpsert::Transaction => {
            let upsert = super::statements::upsert(&table, resource, candidate, millis)
                .map_err(|e| StoreError::Database(e.into()))?;
            let read = statements::current(&MySql, &table, resource);
            if let Some(pool) = autocommit::Pool::of(store) {
                let (upsert, read) = (
                    DbBackend::MySql.build(&upsert),
                    DbBackend::MySql.build(&read),
                );
                return in_transaction(store, pool, Begin::ReadWrite, &upsert, &read).await;
            }
            let (rows, after) = store
                .with_retry(|| async {
                    let txn = store.db.begin().await?;
                    txn.execute(&upsert).await?;
                    // The upsert holds the row's lock until commit: this reads what it left.
                    let rows = txn.query_all(&read).await?;
                    // Nothing is reported before the commit is known.
                    txn.commit().await?;
                    let after = store.db.query_all(&read).await?;
                    Ok((rows, after))
                })
                .await?;
            committed_as_read(store, rows, &after)
        }
    }
}

/// `write` then `read` in a transaction of the store's own, on a pooled connection checked to
/// be outside any transaction (see `autocommit`): the rows of `read` once `COMMIT` succeeded. A
/// call dropped anywhere before closes the connection (the server rolls back) instead of
/// handing it back to the pool mid-transaction, which SeaORM's `begin()` cannot promise.
async fn in_transaction(
    store: &SeaOrmLeaseStore,
    pool: autocommit::Pool<'_>,
    begin: Begin,
    write: &Statement,
    read: &Statement,
) -> Result<Vec<QueryResult>, StoreError> {
    let (rows, after) = store
        .autocommitted(|| async {
            let Some(mut txn) = autocommit::Transaction::begin(pool, begin).await? else {
                return Ok(Checked::InAbandonedTransaction);
            };
            txn.execute(write).await?;
            // The write holds the rows' locks until commit: this reads what it left.
            let rows = txn.rows(read).await?;
            // Nothing is reported before the commit is known, and what it left is read again.
            let after = txn.commit_then_rows(read).await?;
            Ok(Checked::Committed((rows, after)))
        })
        .await?;
    committed_as_read(store, rows, &after)
}

/// `rows`, read inside the transaction, once `after` (the same read once the `COMMIT` returned)
/// shows the same writes; otherwise a retryable conflict, neither a grant nor a renew.
///
/// A `COMMIT` that answers OK is not proof on Galera: a brute-force abort by a replicated
/// write-set can roll a transaction back between its statements without the statements or
/// the `COMMIT` after it reporting an error (seen on MariaDB 10.11: the read inside found no
/// row after the upsert, and the `COMMIT` succeeded). The read inside would then report a
/// write that never committed, such as a new term with the token a rival now holds. The same
/// holder, token and expiry after the commit mean the rows reported are committed ones: either
/// this transaction's writes, or (when it was rolled back before its read, which then ran on
/// its own) the rows as they were, whose expiry and time left are then reported truly, so a
/// caller's deadline still comes from the committed expiry.
fn committed_as_read(
    store: &SeaOrmLeaseStore,
    rows: Vec<QueryResult>,
    after: &[QueryResult],
) -> Result<Vec<QueryResult>, StoreError> {
    let inside = writes(&rows).map_err(|e| store.decode_error(e))?;
    let committed = writes(after).map_err(|e| store.decode_error(e))?;
    if inside == committed {
        return Ok(rows);
    }
    tracing::warn!(
        table = store.table(),
        read_inside = inside.len(),
        read_after = committed.len(),
        "the rows after COMMIT differ from the rows read inside the transaction (rolled back \
         under it, e.g. a Galera brute-force abort); not a grant"
    );
    Err(StoreError::Conflict {
        source: DbErr::Custom(
            "the lease rows after COMMIT differ from those read inside the transaction: it was \
             rolled back under it (a Galera brute-force abort?)"
                .to_owned(),
        )
        .into(),
    })
}

/// The writes rows of `returned_row` (and `renewed_row`, with the resource last) name: holder,
/// token, expiry and resource, sorted; the time left is left out, it moves.
fn writes(rows: &[QueryResult]) -> Result<Vec<Write>, DbErr> {
    let mut out = rows
        .iter()
        .map(|row| {
            Ok((
                row.try_get_by_index(0)?,
                row.try_get_by_index(1)?,
                row.try_get_by_index(2)?,
                row.try_get_by_index::<String>(6).ok(),
            ))
        })
        .collect::<Result<Vec<Write>, DbErr>>()?;
    out.sort();
    Ok(out)
}

type Write = (String, i64, chrono::DateTime<chrono::Utc>, Option<String>);

/// Runs the MariaDB form, read to the end, known to have committed on its own.
async fn deciding(
    store: &SeaOrmLeaseStore,
    stmt: Statement,
) -> Result<Vec<QueryResult>, StoreError> {
    match &store.db.inner {
        DatabaseConnectionType::SqlxMySqlPoolConnection(_) => {
            let pool = store.db.get_mysql_connection_pool();
            store
                .autocommitted(|| autocommit::mysql(pool, &stmt, IN_TRANSACTION_COLUMN))
                .await
        }
        _ => store.read_to_end(stmt).await,
    }
}

/// The upsert form of the server, from `SELECT VERSION()`, once per store (unless set with
/// `with_mysql_upsert`).
async fn form(store: &SeaOrmLeaseStore) -> Result<MySqlUpsert, StoreError> {
    let form = store
        .mysql_upsert
        .get_or_try_init(|| async {
            let version = store
                .plain(Statement::from_string(DbBackend::MySql, "SELECT VERSION()"))
                .await?
                .into_iter()
                .next()
                .map(|row| row.try_get_by_index::<String>(0))
                .transpose()
                .map_err(|e| StoreError::Database(e.into()))?
                .unwrap_or_default();
            let form = MySqlUpsert::for_version(&version);
            tracing::debug!(%version, ?form, "MySQL upsert form chosen");
            Ok::<_, StoreError>(form)
        })
        .await?;
    Ok(*form)
}

/// [`is_galera`], asked on a checked pooled connection (the store's own look, at its first
/// grant).
async fn galera_on_pool(store: &SeaOrmLeaseStore) -> Result<bool, StoreError> {
    let galera = store
        .galera
        .get_or_try_init(|| async {
            let stmt = Statement::from_string(DbBackend::MySql, GALERA_QUESTION);
            let on = match store.plain(stmt).await {
                Ok(rows) => {
                    rows.first()
                        .map(|r| r.try_get_by_index::<i64>(0))
                        .transpose()
                        .map_err(|e| StoreError::Database(e.into()))?
                        .unwrap_or(0)
                        != 0
                }
                Err(StoreError::Database(crate::BackendError::SeaOrm(e)))
                    if error_number(&e) == Some(UNKNOWN_SYSTEM_VARIABLE) =>
                {
                    false
                }
                Err(e) => return Err(e),
            };
            tracing::debug!(galera = on, "MySQL replication detected");
            Ok::<_, StoreError>(on)
        })
        .await?;
    Ok(*galera)
}

const GALERA_QUESTION: &str = "SELECT CAST(@@GLOBAL.wsrep_on AS SIGNED)";

/// Whether the server replicates with Galera (`@@GLOBAL.wsrep_on`), where row locks stay on
/// their node and the fence must write instead. Servers without the variable (MySQL) are not.
/// Asked on `conn` (the caller's transaction: no second pooled connection is needed, and a
/// proxy cannot send the question elsewhere), once per store.
pub(crate) async fn is_galera<C: ConnectionTrait>(
    store: &SeaOrmLeaseStore,
    conn: &C,
) -> Result<bool, StoreError> {
    let galera = store
        .galera
        .get_or_try_init(|| async {
            let stmt = Statement::from_string(DbBackend::MySql, GALERA_QUESTION);
            let on = match conn.query_one_raw(stmt).await {
                Ok(row) => {
                    row.map(|r| r.try_get_by_index::<i64>(0))
                        .transpose()
                        .map_err(|e| StoreError::Database(e.into()))?
                        .unwrap_or(0)
                        != 0
                }
                // MySQL, or a MariaDB built without wsrep: no such variable. Any other
                // error is not an answer (and is not cached): try again next time.
                Err(e) if error_number(&e) == Some(UNKNOWN_SYSTEM_VARIABLE) => false,
                Err(e) => return Err(classify(e, store.table())),
            };
            tracing::debug!(galera = on, "MySQL replication detected");
            Ok::<_, StoreError>(on)
        })
        .await?;
    Ok(*galera)
}
