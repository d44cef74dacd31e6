//! How the store runs its statements on SQLite: the upsert read to the end (SQLite sends
//! `RETURNING` rows before it commits), a plain read to report a denial, and a warning for a
//! file in rollback-journal mode.

use sea_orm::{ConnectionTrait, DbBackend, QueryResult, Statement};

use crate::backend::statements::Row;
use crate::{Denial, LeaseOutcome, SeaOrmLeaseStore, StoreError};

/// Acquire-or-renew: one statement; no row means denied.
pub(crate) async fn acquire_or_renew(
    store: &SeaOrmLeaseStore,
    resource: &str,
    candidate: &str,
    millis: i64,
) -> Result<LeaseOutcome, StoreError> {
    store
        .sqlite_checked
        .get_or_init(|| check_journal(store))
        .await;
    let stmt = store.acquire_prepared()?.bind(resource, candidate, millis);
    let rows = store.read_to_end(stmt).await?;
    let Some(row) = store.single_row(&rows)? else {
        // Denied, the statement changed nothing. Say who holds the lease with a plain read;
        // it is only a report (the holder may change between the two).
        let report = match store.read_row(resource).await? {
            Some(row) => row.denial_for(resource, candidate),
            None => Denial::new(resource),
        };
        return Ok(LeaseOutcome::Denied(report));
    };
    let decoded = Row::decode(row).map_err(|source| store.decode_error(source))?;
    Ok(decoded.outcome(resource, candidate))
}

/// The batch renew: `RETURNING` rows, read to the end (SQLite sends them before it commits).
pub(crate) async fn renew_all(
    store: &SeaOrmLeaseStore,
    json: String,
    millis: i64,
) -> Result<Vec<QueryResult>, StoreError> {
    store
        .sqlite_checked
        .get_or_init(|| check_journal(store))
        .await;
    let form = store.form()?;
    let update = super::statements::renew_all(form.dialect(), &store.table_iden(), json, millis);
    store.read_to_end(form.backend().build(&update)).await
}

/// Warns (once per store) when the file is not in WAL mode. In SQLite's default rollback
/// journal a commit waits for every reader to finish, and a reader that holds the file past
/// the busy timeout makes lease statements fail; with several processes on one file, open it
/// with [`connect_options`](super::connect_options) (WAL, a 5 s busy timeout).
async fn check_journal(store: &SeaOrmLeaseStore) {
    let stmt = Statement::from_string(DbBackend::Sqlite, "PRAGMA journal_mode");
    let mode = match store.connection().query_one_raw(stmt).await {
        Ok(Some(row)) => row.try_get_by_index::<String>(0).unwrap_or_default(),
        _ => return, // the lease statement will report the error
    };
    // `memory`: an in-memory database, one process; `wal`/`wal2`: fine.
    if !mode.eq_ignore_ascii_case("memory") && !mode.to_ascii_lowercase().starts_with("wal") {
        tracing::warn!(
            journal_mode = %mode,
            table = %store.table(),
            "SQLite file in rollback-journal mode: commits wait for every reader, and lease \
             statements fail while a reader holds the file past the busy timeout; open it in \
             WAL mode (orion_beacon::backend::sqlite::connect_options does)"
        );
    }
}
