//! How the store runs its statements on PostgreSQL: every deciding statement checked to have
//! committed on its own (`autocommit`), or, behind a transaction-pooling proxy, sent unnamed
//! in a transaction of its own.

use sea_orm::{DatabaseConnectionType, QueryResult, Statement};

use crate::backend::autocommit;
use crate::backend::statements::Row;
use crate::{Denial, LeaseOutcome, SeaOrmLeaseStore, StoreError};

use super::statements::{RENEW_TRANSACTION_START_COLUMN, TRANSACTION_START_COLUMN};

/// Acquire-or-renew in one round trip whatever the outcome: the upsert, or the row that denied
/// it (see `upsert_reporting`).
pub(crate) async fn acquire_or_renew(
    store: &SeaOrmLeaseStore,
    resource: &str,
    candidate: &str,
    millis: i64,
) -> Result<LeaseOutcome, StoreError> {
    let stmt = store.acquire_prepared()?.bind(resource, candidate, millis);
    let rows = deciding(store, stmt, TRANSACTION_START_COLUMN).await?;
    // No row: a first insert raced ours and is not in our snapshot.
    let Some(row) = store.single_row(&rows)? else {
        return Ok(LeaseOutcome::Denied(Denial::new(resource)));
    };
    let granted: bool = row
        .try_get_by_index(6)
        .map_err(|source| store.decode_error(source))?;
    let decoded = Row::decode(row).map_err(|source| store.decode_error(source))?;
    Ok(if granted {
        decoded.outcome(resource, candidate)
    } else {
        // The report comes from the statement's snapshot: it can even name us.
        LeaseOutcome::Denied(decoded.denial_for(resource, candidate))
    })
}

/// The batch renew: the rows it renewed, once known to have committed.
pub(crate) async fn renew_all(
    store: &SeaOrmLeaseStore,
    json: String,
    millis: i64,
) -> Result<Vec<QueryResult>, StoreError> {
    let form = store.form()?;
    let update = super::statements::renew_all(form.dialect(), &store.table_iden(), json, millis);
    let stmt = form.backend().build(&update);
    deciding(store, stmt, RENEW_TRANSACTION_START_COLUMN).await
}

/// Runs a deciding statement, read to the end, known to have committed on its own (its rows
/// carry `transaction_timestamp()` at `start_column`).
async fn deciding(
    store: &SeaOrmLeaseStore,
    stmt: Statement,
    start_column: usize,
) -> Result<Vec<QueryResult>, StoreError> {
    if let Some(pooled) = pooled(store, &stmt).await {
        return pooled;
    }
    match &store.db.inner {
        DatabaseConnectionType::SqlxPostgresPoolConnection(_) => {
            let pool = store.db.get_postgres_connection_pool();
            store
                .autocommitted(|| autocommit::postgres(pool, &stmt, start_column))
                .await
        }
        _ => store.read_to_end(stmt).await,
    }
}

/// Behind a transaction-pooling proxy: `stmt` as an unnamed statement in a transaction of its
/// own, begun on a client connection checked to be outside any transaction, read to the end;
/// its rows once `COMMIT` succeeded. `None` when the store is not configured for such a proxy.
pub(crate) async fn pooled(
    store: &SeaOrmLeaseStore,
    stmt: &Statement,
) -> Option<Result<Vec<QueryResult>, StoreError>> {
    if !store.transaction_pooling {
        return None;
    }
    let DatabaseConnectionType::SqlxPostgresPoolConnection(_) = &store.db.inner else {
        return None;
    };
    let pool = store.db.get_postgres_connection_pool();
    Some(
        store
            .autocommitted(|| autocommit::postgres_in_transaction(pool, stmt))
            .await,
    )
}
