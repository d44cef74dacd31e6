//! [`SeaOrmLeaseStore`]: leases in a table of the application's own database.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use orion_beacon_entity::{validate_table_name, DEFAULT_TABLE};
use sea_orm::sea_query::Alias;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, QueryResult};

use super::errors::{classify, kind, Kind};
use super::mysql::MySqlUpsert;
use super::prepared::Prepared;
use super::statements::{self, Row};
use super::Dialect;
use crate::store::{validate_candidate, validate_request, validate_resource};
use crate::{Denial, Lease, LeaseOutcome, LeaseRecord, LeaseStore, StoreError};

/// How often a statement is tried when the database reports a conflict with a concurrent
/// transaction (serialization failure, deadlock, busy SQLite file). Such a failure means the
/// statement had no effect, so trying again is safe.
const ATTEMPTS: u32 = 3;

/// MySQL/MariaDB `ER_UNKNOWN_SYSTEM_VARIABLE`.
const UNKNOWN_SYSTEM_VARIABLE: u16 = 1193;

/// A [`LeaseStore`] in a table of the application's database, through SeaORM.
///
/// It shares the application's [`DatabaseConnection`] (and so its pool): every operation takes
/// one pooled connection for one statement and gives it back. Acquire-or-renew is one atomic
/// statement per backend; liveness is judged by the database clock.
///
/// The table must exist: create it with the migration (see the `orion-beacon-migration`
/// crate). A missing table is reported as [`StoreError::MissingTable`].
#[derive(Debug, Clone)]
pub struct SeaOrmLeaseStore {
    db: DatabaseConnection,
    table: Arc<str>,
    /// MySQL/MariaDB only: which upsert form the server takes, detected once.
    mysql_upsert: Arc<tokio::sync::OnceCell<MySqlUpsert>>,
    /// MySQL/MariaDB only: whether the server is a Galera cluster node, detected once.
    galera: Arc<tokio::sync::OnceCell<bool>>,
    /// SQLite only: whether the journal mode was looked at (once per store).
    sqlite_checked: Arc<tokio::sync::OnceCell<()>>,
    /// The statements, rendered once for this backend and table.
    prepared: Arc<PreparedCache>,
    /// PostgreSQL only: the release listener, started on first subscription.
    #[cfg(feature = "postgres")]
    releases: super::notify::HubCell,
    /// Whether [`LeaseStore::release_events`] may listen for release notifications.
    notifications: bool,
    /// PostgreSQL only: the connection goes through a transaction-pooling proxy.
    transaction_pooling: bool,
}

impl SeaOrmLeaseStore {
    /// A store on the default table, `orionbeacon_leases`.
    pub fn new(db: DatabaseConnection) -> Self {
        Self {
            db,
            table: Arc::from(DEFAULT_TABLE),
            mysql_upsert: Arc::default(),
            galera: Arc::default(),
            sqlite_checked: Arc::default(),
            prepared: Arc::default(),
            #[cfg(feature = "postgres")]
            releases: Arc::default(),
            notifications: true,
            transaction_pooling: false,
        }
    }

    /// PostgreSQL only: the application's connection goes through a proxy that pools
    /// *transactions* (PgBouncer with `pool_mode = transaction`, or any pooler that may hand
    /// consecutive statements of one client to different server connections). Off by default.
    ///
    /// The store then sends each lease statement as an unnamed statement inside a transaction
    /// of its own (`BEGIN`, the statement, `COMMIT`), so the proxy keeps one server connection
    /// for all of it: no named prepared statement is left on a server connection another
    /// client gets next (sqlx prepares named statements, which a transaction-pooling proxy
    /// without prepared-statement support rejects or, worse, mixes up between clients), and
    /// an outcome is reported only once its `COMMIT` succeeded. Release notifications are off
    /// (`LISTEN` needs a session of its own); followers take over at their next retry. It
    /// costs two more round trips per lease statement.
    ///
    /// Fenced writes run in the application's own transactions, which go through the same
    /// proxy: see the topology notes in the documentation for what the proxy must support.
    pub fn with_transaction_pooling(mut self, enabled: bool) -> Self {
        self.transaction_pooling = enabled;
        self
    }

    /// PostgreSQL only: whether followers are woken by release notifications (on by default).
    ///
    /// A release sends `pg_notify` in the same statement, and the store `LISTEN`s for them on
    /// one connection of its own (made with the application pool's connect options, not taken
    /// from the pool) while any clone of the store lives: one extra server connection per store
    /// and lease table. With notifications off, followers notice a release at their next retry
    /// (`retry_interval`) instead of at once; releases still send `pg_notify` for the others.
    /// Turn them off where server connections are scarce. Behind a transaction-pooling proxy
    /// they are always off (see [`with_transaction_pooling`](Self::with_transaction_pooling)).
    pub fn with_release_notifications(mut self, enabled: bool) -> Self {
        self.notifications = enabled;
        self
    }

    /// The same store on another table (validated: ASCII letters, digits and `_`, at most 63
    /// characters). Create that table with `CreateLeaseTable::with_table` of the migration crate.
    pub fn with_table(mut self, table: impl AsRef<str>) -> Result<Self, StoreError> {
        let table = table.as_ref();
        validate_table_name(table)?;
        self.table = Arc::from(table);
        self.prepared = Arc::default(); // rendered for the old table
        #[cfg(feature = "postgres")]
        {
            self.releases = Arc::default(); // a listener filters by table name
        }
        Ok(self)
    }

    /// MySQL/MariaDB only: use this upsert form instead of the one detected from the server's
    /// version (MariaDB 10.5+ takes [`MySqlUpsert::Returning`], MySQL needs
    /// [`MySqlUpsert::Transaction`]). Both are atomic; detection is right for real servers, so
    /// this is for proxies that hide the version, and for tests.
    pub fn with_mysql_upsert(mut self, form: MySqlUpsert) -> Self {
        self.mysql_upsert = Arc::new(tokio::sync::OnceCell::new_with(Some(form)));
        self
    }

    /// The lease table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The connection this store uses.
    pub fn connection(&self) -> &DatabaseConnection {
        &self.db
    }

    pub(crate) fn table_iden(&self) -> Alias {
        Alias::new(&*self.table)
    }

    /// The backend comes from the connection. SQLite needs nothing of its driver beyond what
    /// SeaORM runs, so it works in every build; PostgreSQL and MySQL need their driver's own
    /// connection type for the check that a grant committed outside any transaction (see
    /// `autocommit`), which only their cargo features compile in. Without it they are refused
    /// here, before any statement, rather than run without that check.
    pub(crate) fn dialect(&self) -> Result<&'static dyn Dialect, StoreError> {
        match self.db.get_database_backend() {
            DbBackend::Sqlite => Ok(&super::sqlite::Sqlite),
            #[cfg(feature = "postgres")]
            DbBackend::Postgres => Ok(&super::postgres::Postgres),
            #[cfg(not(feature = "postgres"))]
            DbBackend::Postgres => Err(unsupported("PostgreSQL", "postgres")),
            #[cfg(feature = "mysql")]
            DbBackend::MySql => Ok(&super::mysql::MySql),
            #[cfg(not(feature = "mysql"))]
            DbBackend::MySql => Err(unsupported("MySQL", "mysql")),
            #[allow(unreachable_patterns)]
            _ => Err(unsupported("unknown", "the matching backend")),
        }
    }

    /// SQLite: warns (once per store) when the file is not in WAL mode. In SQLite's default
    /// rollback journal a commit waits for every reader to finish, and a reader that holds
    /// the file past the busy timeout makes lease statements fail; with several processes on
    /// one file, open it with `backend::sqlite::connect_options` (WAL, a 5 s busy timeout).
    async fn check_sqlite_journal(&self) {
        let stmt = sea_orm::Statement::from_string(DbBackend::Sqlite, "PRAGMA journal_mode");
        let mode = match self.db.query_one_raw(stmt).await {
            Ok(Some(row)) => row.try_get_by_index::<String>(0).unwrap_or_default(),
            _ => return, // the lease statement will report the error
        };
        // `memory`: an in-memory database, one process; `wal`/`wal2`: fine.
        if !mode.eq_ignore_ascii_case("memory") && !mode.to_ascii_lowercase().starts_with("wal") {
            tracing::warn!(
                journal_mode = %mode,
                table = %self.table,
                "SQLite file in rollback-journal mode: commits wait for every reader, and lease \
                 statements fail while a reader holds the file past the busy timeout; open it in \
                 WAL mode (orion_beacon::backend::sqlite::connect_options does)"
            );
        }
    }

    /// Runs `op` again while the database reports a conflict, at most [`ATTEMPTS`] times.
    pub(crate) async fn with_retry<T, F, Fut>(&self, mut op: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, DbErr>>,
    {
        let mut attempt = 1;
        loop {
            match op().await {
                Ok(value) => return Ok(value),
                Err(err) if attempt < ATTEMPTS && kind(&err) == Kind::Conflict => {
                    tracing::debug!(table = %self.table, attempt, error = %err, "lease statement conflicted; retrying");
                    tokio::time::sleep(Duration::from_millis(5 * u64::from(attempt))).await;
                    attempt += 1;
                }
                Err(err) => return Err(classify(err, &self.table)),
            }
        }
    }

    async fn mysql_form(&self) -> Result<MySqlUpsert, StoreError> {
        let form = self
            .mysql_upsert
            .get_or_try_init(|| async {
                let version = self
                    .with_retry(|| {
                        self.db.query_one_raw(sea_orm::Statement::from_string(
                            DbBackend::MySql,
                            "SELECT VERSION()",
                        ))
                    })
                    .await?
                    .map(|row| row.try_get_by_index::<String>(0))
                    .transpose()
                    .map_err(StoreError::Database)?
                    .unwrap_or_default();
                let form = MySqlUpsert::for_version(&version);
                tracing::debug!(%version, ?form, "MySQL upsert form chosen");
                Ok::<_, StoreError>(form)
            })
            .await?;
        Ok(*form)
    }

    /// MySQL/MariaDB: whether the server replicates with Galera (`@@GLOBAL.wsrep_on`), where
    /// row locks stay on their node and the fence must write instead. Servers without the
    /// variable (MySQL) are not. Asked on `conn` (the caller's transaction: no second pooled
    /// connection is needed, and a proxy cannot send the question elsewhere), once per store.
    pub(crate) async fn is_galera<C: ConnectionTrait>(&self, conn: &C) -> Result<bool, StoreError> {
        let galera = self
            .galera
            .get_or_try_init(|| async {
                let stmt = sea_orm::Statement::from_string(
                    DbBackend::MySql,
                    "SELECT CAST(@@GLOBAL.wsrep_on AS SIGNED)",
                );
                let on = match conn.query_one_raw(stmt).await {
                    Ok(row) => {
                        row.map(|r| r.try_get_by_index::<i64>(0))
                            .transpose()
                            .map_err(StoreError::Database)?
                            .unwrap_or(0)
                            != 0
                    }
                    // MySQL, or a MariaDB built without wsrep: no such variable. Any other
                    // error is not an answer (and is not cached): try again next time.
                    Err(e)
                        if super::errors::mysql_error_number(&e)
                            == Some(UNKNOWN_SYSTEM_VARIABLE) =>
                    {
                        false
                    }
                    Err(e) => return Err(classify(e, &self.table)),
                };
                tracing::debug!(galera = on, "MySQL replication detected");
                Ok::<_, StoreError>(on)
            })
            .await?;
        Ok(*galera)
    }

    /// MySQL/MariaDB acquire-or-renew: the rows after the statement, read to the end.
    async fn mysql_upsert(
        &self,
        resource: &str,
        candidate: &str,
        millis: i64,
    ) -> Result<Vec<QueryResult>, StoreError> {
        use sea_orm::TransactionTrait;
        let table = self.table_iden();
        match self.mysql_form().await? {
            MySqlUpsert::Returning => {
                let stmt = self.acquire_prepared()?.bind(resource, candidate, millis);
                self.deciding(stmt).await
            }
            MySqlUpsert::Transaction => {
                let upsert = super::mysql::upsert(&table, resource, candidate, millis)
                    .map_err(StoreError::Database)?;
                let read = statements::current(&super::mysql::MySql, &table, resource);
                self.with_retry(|| async {
                    let txn = self.db.begin().await?;
                    txn.execute(&upsert).await?;
                    // The upsert holds the row's lock until commit: this reads what it left.
                    let rows = txn.query_all(&read).await?;
                    // Nothing is reported before the commit is known.
                    txn.commit().await?;
                    Ok(rows)
                })
                .await
            }
        }
    }

    /// Runs a statement that decides an outcome and reads every row it sends, to the end.
    ///
    /// A driver that stops after the first row never sees what the statement did afterwards:
    /// SQLite sends `RETURNING` rows before it commits (and a commit that cannot get its lock
    /// rolls the statement back), PostgreSQL reports commit-time errors after the rows, and a
    /// Galera node sends rows before certification. Only a statement read to its end, without
    /// an error, has committed; on MariaDB and PostgreSQL it is also checked to have run
    /// outside any transaction (see `autocommit`).
    async fn deciding(&self, stmt: sea_orm::Statement) -> Result<Vec<QueryResult>, StoreError> {
        #[cfg(any(feature = "postgres", feature = "mysql"))]
        use sea_orm::DatabaseConnectionType as Conn;
        match &self.db.inner {
            #[cfg(feature = "postgres")]
            Conn::SqlxPostgresPoolConnection(_) if self.transaction_pooling => {
                self.pooled(&stmt).await
            }
            #[cfg(feature = "postgres")]
            Conn::SqlxPostgresPoolConnection(_) => {
                let pool = self.db.get_postgres_connection_pool();
                self.autocommitted(|| {
                    super::autocommit::postgres(pool, &stmt, statements::TRANSACTION_START_COLUMN)
                })
                .await
            }
            #[cfg(feature = "mysql")]
            Conn::SqlxMySqlPoolConnection(_) => {
                let pool = self.db.get_mysql_connection_pool();
                self.autocommitted(|| {
                    super::autocommit::mysql(pool, &stmt, super::mysql::IN_TRANSACTION_COLUMN)
                })
                .await
            }
            _ => {
                self.with_retry(|| self.db.query_all_raw(stmt.clone()))
                    .await
            }
        }
    }

    /// PostgreSQL behind a transaction-pooling proxy: `stmt` as an unnamed statement in a
    /// transaction of its own, read to the end; its rows once `COMMIT` succeeded.
    #[cfg(feature = "postgres")]
    async fn pooled(&self, stmt: &sea_orm::Statement) -> Result<Vec<QueryResult>, StoreError> {
        let pool = self.db.get_postgres_connection_pool();
        self.with_retry(|| super::autocommit::postgres_in_transaction(pool, stmt))
            .await
    }

    /// Runs a statement that reads or releases (not one that grants): through the pooled path
    /// behind a transaction-pooling proxy, else as SeaORM runs any statement.
    pub(crate) async fn plain(
        &self,
        stmt: sea_orm::Statement,
    ) -> Result<Vec<QueryResult>, StoreError> {
        #[cfg(feature = "postgres")]
        if let sea_orm::DatabaseConnectionType::SqlxPostgresPoolConnection(_) = &self.db.inner {
            if self.transaction_pooling {
                return self.pooled(&stmt).await;
            }
        }
        self.with_retry(|| self.db.query_all_raw(stmt.clone()))
            .await
    }

    /// Runs a checked statement (see `autocommit`), again on another connection when the one
    /// it got was inside an abandoned transaction, at most [`ATTEMPTS`] times in all.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    async fn autocommitted<F, Fut>(&self, mut run: F) -> Result<Vec<QueryResult>, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<super::autocommit::Checked, DbErr>>,
    {
        use super::autocommit::Checked;
        for attempt in 1..=ATTEMPTS {
            match self.with_retry(&mut run).await? {
                Checked::Committed(rows) => return Ok(rows),
                Checked::InAbandonedTransaction => tracing::warn!(
                    table = %self.table,
                    attempt,
                    "a pooled connection was inside a transaction (one nobody finished, e.g. a \
                     future dropped during `begin()`, or a session with autocommit off); closed \
                     it, its lease statement does not count"
                ),
            }
        }
        Err(StoreError::Conflict {
            source: DbErr::Custom(
                "every pooled connection tried was inside an abandoned transaction".to_owned(),
            ),
        })
    }

    /// A row of the lease table that could not be read back.
    pub(crate) fn decode_error(&self, source: DbErr) -> StoreError {
        StoreError::Decode {
            table: self.table.to_string(),
            source,
        }
    }

    /// The exact statement [`acquire_or_renew`](LeaseStore::acquire_or_renew) sends for these
    /// arguments on this connection's backend (PostgreSQL, SQLite, MariaDB; the MySQL
    /// transaction form sends this upsert and then a read): for `EXPLAIN`, audits and
    /// benchmarks. The values are bound parameters.
    pub fn acquire_statement(
        &self,
        resource: &str,
        candidate: &str,
        lease: Duration,
    ) -> Result<sea_orm::Statement, StoreError> {
        let millis = validate_request(resource, candidate, lease)?;
        Ok(self.acquire_prepared()?.bind(resource, candidate, millis))
    }

    /// The exact statement [`release`](LeaseStore::release) sends for these arguments on this
    /// connection's backend (on PostgreSQL it also notifies followers): for `EXPLAIN`, audits
    /// and tests. The values are bound parameters.
    pub fn release_statement(
        &self,
        resource: &str,
        candidate: &str,
    ) -> Result<sea_orm::Statement, StoreError> {
        validate_resource(resource)?;
        validate_candidate(candidate)?;
        let d = self.dialect()?;
        let backend = self.db.get_database_backend();
        let table = self.table_iden();
        let prepared = cached(&self.prepared.release, |r, c, _| {
            Ok(match backend {
                // The release and the wake-up of the followers (`pg_notify`), in one statement.
                DbBackend::Postgres => {
                    backend.build(&statements::release_notifying(d, &table, &self.table, r, c))
                }
                _ => backend.build(&statements::release(d, &table, r, c)),
            })
        })?;
        Ok(prepared.bind(resource, candidate, 0))
    }

    /// The exact statement [`release_lease`](LeaseStore::release_lease) sends for `lease` on
    /// this connection's backend (on PostgreSQL it also notifies followers), or `None` when
    /// `lease` carries no expiry and so names no write (it then releases nothing). The values
    /// are bound parameters.
    pub fn release_lease_statement(
        &self,
        lease: &Lease,
    ) -> Result<Option<sea_orm::Statement>, StoreError> {
        validate_resource(&lease.resource)?;
        validate_candidate(&lease.holder)?;
        let d = self.dialect()?;
        let backend = self.db.get_database_backend();
        let Some(update) = statements::release_write(d, &self.table_iden(), lease) else {
            return Ok(None);
        };
        Ok(Some(match backend {
            DbBackend::Postgres => backend.build(&statements::notifying(update, &self.table)),
            _ => backend.build(&update),
        }))
    }

    /// Runs a release statement: whether it released a lease.
    async fn run_release(&self, stmt: sea_orm::Statement) -> Result<bool, StoreError> {
        if self.db.get_database_backend() == DbBackend::Postgres {
            // The notifying form returns one row per released lease.
            return Ok(!self.plain(stmt).await?.is_empty());
        }
        let result = self
            .with_retry(|| self.db.execute_raw(stmt.clone()))
            .await?;
        Ok(result.rows_affected() > 0)
    }

    /// The acquire-or-renew statement of this backend (for MySQL/MariaDB, the `RETURNING`
    /// form), rendered once.
    fn acquire_prepared(&self) -> Result<&Prepared, StoreError> {
        let d = self.dialect()?;
        let backend = self.db.get_database_backend();
        let table = self.table_iden();
        cached(&self.prepared.acquire, |r, c, m| match backend {
            DbBackend::Postgres => {
                statements::upsert_reporting(d, &table, r, c, m).map(|q| backend.build(&q))
            }
            DbBackend::MySql => super::mysql::upsert_returning(&table, r, c, m),
            _ => statements::upsert(d, &table, r, c, m).map(|q| backend.build(&q)),
        })
    }

    async fn read_row(&self, d: &dyn Dialect, resource: &str) -> Result<Option<Row>, StoreError> {
        let backend = self.db.get_database_backend();
        let table = self.table_iden();
        let stmt = cached(&self.prepared.current, |r, _, _| {
            Ok(backend.build(&statements::current(d, &table, r)))
        })?
        .bind(resource, "", 0);
        let row = self.plain(stmt).await?.into_iter().next();
        row.map(|r| Row::decode(&r))
            .transpose()
            .map_err(|source| self.decode_error(source))
    }
}

/// The store's statements, each rendered on first use.
#[derive(Debug, Default)]
struct PreparedCache {
    acquire: OnceLock<Prepared>,
    release: OnceLock<Prepared>,
    current: OnceLock<Prepared>,
}

/// The cached statement in `cell`, rendering it with `build` the first time.
fn cached(
    cell: &OnceLock<Prepared>,
    build: impl Fn(&str, &str, i64) -> Result<sea_orm::Statement, DbErr>,
) -> Result<&Prepared, StoreError> {
    if let Some(prepared) = cell.get() {
        return Ok(prepared);
    }
    let prepared = Prepared::new(build).map_err(StoreError::Database)?;
    Ok(cell.get_or_init(|| prepared))
}

fn unsupported(backend: &'static str, feature: &'static str) -> StoreError {
    StoreError::UnsupportedBackend { backend, feature }
}

#[async_trait]
impl LeaseStore for SeaOrmLeaseStore {
    async fn acquire_or_renew(
        &self,
        resource: &str,
        candidate: &str,
        lease: Duration,
    ) -> Result<LeaseOutcome, StoreError> {
        let millis = validate_request(resource, candidate, lease)?;
        let d = self.dialect()?;
        let backend = self.db.get_database_backend();
        let unknown = || Denial::new(resource);
        if backend == DbBackend::Sqlite {
            self.sqlite_checked
                .get_or_init(|| self.check_sqlite_journal())
                .await;
        }
        let rows = if backend == DbBackend::MySql {
            self.mysql_upsert(resource, candidate, millis).await?
        } else {
            let stmt = self.acquire_prepared()?.bind(resource, candidate, millis);
            self.deciding(stmt).await?
        };
        let row = match rows.as_slice() {
            [] if backend == DbBackend::MySql => {
                return Err(
                    self.decode_error(DbErr::RecordNotFound("the upserted lease row".to_owned()))
                );
            }
            // PostgreSQL: a first insert raced ours and is not in our snapshot.
            [] if backend == DbBackend::Postgres => return Ok(LeaseOutcome::Denied(unknown())),
            // SQLite: denied, the statement changed nothing. Say who holds the lease with a
            // plain read; it is only a report (the holder may change between the two).
            [] => {
                let report = match self.read_row(d, resource).await? {
                    Some(row) => row.denial_for(resource, candidate),
                    None => unknown(),
                };
                return Ok(LeaseOutcome::Denied(report));
            }
            [row] => row,
            // One statement, several rows: a Galera node re-ran the upsert after a failed
            // certification and sent the rows of both attempts. Trust none of them: it is no
            // grant, and not a denial either (a leader keeps its term to its deadline and asks
            // again); if the re-run did grant us the lease, the next attempt renews it.
            [..] => {
                tracing::warn!(
                    table = %self.table,
                    rows = rows.len(),
                    "the lease statement returned several rows (a server-side retry?); not a grant"
                );
                return Err(StoreError::Conflict {
                    source: DbErr::Custom(format!(
                        "the lease statement returned {} rows (a server-side retry after a \
                         certification conflict); none of them is trusted",
                        rows.len()
                    )),
                });
            }
        };
        if backend == DbBackend::Postgres {
            // One round trip whatever the outcome: the upsert, or the row that denied it.
            let granted: bool = row
                .try_get_by_index(6)
                .map_err(|source| self.decode_error(source))?;
            let decoded = Row::decode(row).map_err(|source| self.decode_error(source))?;
            return Ok(if granted {
                decoded.outcome(resource, candidate)
            } else {
                // The report comes from the statement's snapshot: it can even name us.
                LeaseOutcome::Denied(decoded.denial_for(resource, candidate))
            });
        }
        let decoded = Row::decode(row).map_err(|source| self.decode_error(source))?;
        Ok(decoded.outcome(resource, candidate))
    }

    async fn release(&self, resource: &str, candidate: &str) -> Result<bool, StoreError> {
        let stmt = self.release_statement(resource, candidate)?;
        self.run_release(stmt).await
    }

    async fn release_lease(&self, lease: &Lease) -> Result<bool, StoreError> {
        match self.release_lease_statement(lease)? {
            Some(stmt) => self.run_release(stmt).await,
            None => Ok(false),
        }
    }

    /// On PostgreSQL, `LISTEN`s on one connection of its own (opened on first use, kept while
    /// any clone of this store lives) for the notifications that releases send; see
    /// [`with_release_notifications`](SeaOrmLeaseStore::with_release_notifications).
    fn release_events(&self) -> Option<crate::store::ReleaseEvents> {
        if !self.notifications || self.transaction_pooling {
            return None;
        }
        #[cfg(feature = "postgres")]
        {
            super::notify::subscribe(&self.releases, &self.db, &self.table)
        }
        #[cfg(not(feature = "postgres"))]
        {
            None
        }
    }

    /// `Err(StoreError::UnsupportedBackend)` for a connection whose backend this build cannot
    /// serve safely (see [`SeaOrmLeaseStore`]'s feature notes).
    fn validate(&self) -> Result<(), StoreError> {
        self.dialect().map(|_| ())
    }

    async fn current(&self, resource: &str) -> Result<Option<LeaseRecord>, StoreError> {
        validate_resource(resource)?;
        let d = self.dialect()?;
        Ok(self
            .read_row(d, resource)
            .await?
            .map(|row| row.record(resource)))
    }
}

#[cfg(all(test, any(feature = "postgres", feature = "sqlite", feature = "mysql")))]
mod tests {
    use std::borrow::Cow;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use sea_orm::sqlx::error::{DatabaseError, ErrorKind};
    use sea_orm::{DatabaseConnection, DbErr, RuntimeErr};

    use super::{SeaOrmLeaseStore, ATTEMPTS};
    use crate::StoreError;

    /// A database error with a SQLSTATE of our choosing.
    #[derive(Debug)]
    struct Coded(&'static str);
    impl std::fmt::Display for Coded {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "error {}", self.0)
        }
    }
    impl std::error::Error for Coded {}
    impl DatabaseError for Coded {
        fn message(&self) -> &str {
            "injected"
        }
        fn code(&self) -> Option<Cow<'_, str>> {
            Some(Cow::Borrowed(self.0))
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> ErrorKind {
            ErrorKind::Other
        }
    }

    fn err(code: &'static str) -> DbErr {
        DbErr::Exec(RuntimeErr::SqlxError(Arc::new(
            sea_orm::sqlx::Error::Database(Box::new(Coded(code))),
        )))
    }

    /// `code` for the first `failures` calls, then success; returns the result and the calls.
    async fn run(code: &'static str, failures: u32) -> (Result<u32, StoreError>, u32) {
        let store = SeaOrmLeaseStore::new(DatabaseConnection::default());
        let calls = AtomicU32::new(0);
        let result = store
            .with_retry(|| {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                async move {
                    if n <= failures {
                        Err(err(code))
                    } else {
                        Ok(n)
                    }
                }
            })
            .await;
        (result, calls.load(Ordering::SeqCst))
    }

    #[tokio::test(start_paused = true)]
    async fn conflicts_are_retried_up_to_the_limit_and_nothing_else_is() {
        assert_eq!(ATTEMPTS, 3);
        // Serialization failures: tried again, at most three times in all.
        let (result, calls) = run("40001", 2).await;
        assert_eq!((result.ok(), calls), (Some(3), 3));
        let (result, calls) = run("40001", 3).await;
        assert!(
            matches!(result, Err(StoreError::Conflict { .. })),
            "{result:?}"
        );
        assert_eq!(calls, 3);
        // SQLite busy: the same.
        let (result, calls) = run("5", 1).await;
        assert_eq!((result.ok(), calls), (Some(2), 2));
        // Any other error: reported at once.
        let (result, calls) = run("23505", 1).await;
        assert!(matches!(result, Err(StoreError::Database(_))), "{result:?}");
        assert_eq!(calls, 1);
    }
}
