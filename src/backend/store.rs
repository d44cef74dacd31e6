//! [`SeaOrmLeaseStore`]: leases in a table of the application's own database.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use orion_beacon_entity::{validate_table_name, DEFAULT_MEMBER_TABLE, DEFAULT_TABLE};
use sea_orm::sea_query::Alias;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, QueryResult};

use super::errors::{classify, kind, Kind};
use super::mysql::MySqlUpsert;
use super::prepared::Prepared;
use super::statements::{self, Row};
use super::{Dialect, Form, Refused};
use crate::store::{validate_batch, validate_candidate, validate_request, validate_resource};
use crate::{Lease, LeaseOutcome, LeaseRecord, LeaseStore, Renewals, StoreError};

/// How often a statement is tried when the database reports a conflict with a concurrent
/// transaction (serialization failure, deadlock, busy SQLite file). Such a failure means the
/// statement had no effect, so trying again is safe.
pub(super) const ATTEMPTS: u32 = 3;

/// A [`LeaseStore`] in a table of the application's database, through SeaORM.
///
/// It shares the application's [`DatabaseConnection`] (and so its pool): every operation takes
/// one pooled connection for one statement (or one transaction of its own) and gives it back.
/// On PostgreSQL and MySQL/MariaDB that connection is first checked to be outside any
/// transaction somebody abandoned on it (sqlx 0.9 leaves one behind when a future is dropped
/// during `begin()`); one found inside is closed, which rolls that transaction back, and the
/// statement runs on another. It goes back to the pool only after a complete answer, and is
/// closed on every other path (an error, or the call dropped by a timeout). Acquire-or-renew is
/// one atomic statement per backend; liveness is judged by the database clock.
///
/// The table must exist: create it with the migration (see the `orion-beacon-migration`
/// crate). A missing table is reported as [`StoreError::MissingTable`].
#[derive(Clone)]
pub struct SeaOrmLeaseStore {
    pub(super) db: DatabaseConnection,
    /// The backend, chosen once from the connection (or why there is none).
    form: Result<Form, Refused>,
    table: Arc<str>,
    /// The membership table of shard sets.
    pub(super) member_table: Arc<str>,
    /// MySQL/MariaDB only: which upsert form the server takes, detected once.
    pub(super) mysql_upsert: Arc<tokio::sync::OnceCell<MySqlUpsert>>,
    /// MySQL/MariaDB only: whether the server is a Galera cluster node, detected once.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(super) galera: Arc<tokio::sync::OnceCell<bool>>,
    /// SQLite only: whether the journal mode was looked at (once per store).
    pub(super) sqlite_checked: Arc<tokio::sync::OnceCell<()>>,
    /// Whether the server's durability settings were looked at (once per store).
    pub(super) durability_checked: Arc<tokio::sync::OnceCell<()>>,
    /// The statements, rendered once for this backend and table.
    prepared: Arc<PreparedCache>,
    /// PostgreSQL only: the release listener, started on first subscription.
    #[cfg(feature = "postgres")]
    releases: super::postgres::notify::HubCell,
    /// Whether [`LeaseStore::release_events`] may listen for release notifications.
    notifications: bool,
    /// PostgreSQL only: the connection goes through a transaction-pooling proxy.
    pub(super) transaction_pooling: bool,
    /// The takeovers asked for by dropped acquires (see `takeover::TakeoverOnDrop`), shared by
    /// clones: one at a time per store.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(super) takeovers: Arc<super::takeover::Gate>,
}

/// The backend and the tables; never the connection pool (its options can hold a password) or
/// the prepared statements.
impl std::fmt::Debug for SeaOrmLeaseStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeaOrmLeaseStore")
            .field("backend", &self.backend_name())
            .field("table", &&*self.table)
            .field("member_table", &&*self.member_table)
            .field("transaction_pooling", &self.transaction_pooling)
            .field("release_notifications", &self.notifications)
            .finish_non_exhaustive()
    }
}

impl SeaOrmLeaseStore {
    /// The backend's name (`"PostgreSQL"`, `"MySQL"`, `"SQLite"`), or why there is none.
    pub(crate) fn backend_name(&self) -> &'static str {
        match self.form {
            #[cfg(feature = "postgres")]
            Ok(Form::Postgres) => "PostgreSQL",
            #[cfg(feature = "mysql")]
            Ok(Form::MySql) => "MySQL",
            Ok(Form::Sqlite) => "SQLite",
            Err(super::Refused::Unsupported { backend, .. }) => backend,
            Err(super::Refused::Disconnected) => "disconnected",
        }
    }

    /// A store on the default table, `orionbeacon_leases`.
    pub fn new(db: DatabaseConnection) -> Self {
        Self {
            form: Form::of(&db),
            db,
            table: Arc::from(DEFAULT_TABLE),
            member_table: Arc::from(DEFAULT_MEMBER_TABLE),
            mysql_upsert: Arc::default(),
            galera: Arc::default(),
            sqlite_checked: Arc::default(),
            durability_checked: Arc::default(),
            prepared: Arc::default(),
            #[cfg(feature = "postgres")]
            releases: Arc::default(),
            notifications: true,
            transaction_pooling: false,
            #[cfg(any(feature = "postgres", feature = "mysql"))]
            takeovers: Arc::default(),
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

    /// The store's backend, or the error every call reports when it has none (see [`Form`]).
    pub(crate) fn form(&self) -> Result<Form, StoreError> {
        self.form.map_err(StoreError::from)
    }

    /// The store's backend's clock and value forms.
    pub(crate) fn dialect(&self) -> Result<&'static dyn Dialect, StoreError> {
        self.form().map(Form::dialect)
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

    /// Runs a statement that decides an outcome on a backend without further checks (SQLite,
    /// and connections SeaORM fakes), read to the end: see [`postgres::store`](super::postgres)
    /// and [`mysql::store`](super::mysql) for the checked forms.
    ///
    /// A driver that stops after the first row never sees what the statement did afterwards:
    /// SQLite sends `RETURNING` rows before it commits (and a commit that cannot get its lock
    /// rolls the statement back), PostgreSQL reports commit-time errors after the rows, and a
    /// Galera node sends rows before certification. Only a statement read to its end, without
    /// an error, has committed.
    pub(super) async fn read_to_end(
        &self,
        stmt: sea_orm::Statement,
    ) -> Result<Vec<QueryResult>, StoreError> {
        self.with_retry(|| self.db.query_all_raw(stmt.clone()))
            .await
    }

    /// Runs a statement that reads or releases (not one that grants), read to the end: on
    /// PostgreSQL and MariaDB on a connection of the pool checked to be outside any transaction
    /// (behind a transaction-pooling proxy, in a transaction of its own; see `autocommit`), else
    /// as SeaORM runs any statement.
    pub(crate) async fn plain(
        &self,
        stmt: sea_orm::Statement,
    ) -> Result<Vec<QueryResult>, StoreError> {
        #[cfg(any(feature = "postgres", feature = "mysql"))]
        if let Some(checked) = self.checked_rows(&stmt).await {
            return checked;
        }
        self.read_to_end(stmt).await
    }

    /// Runs a statement that changes rows (not one that grants): how many it changed, checked
    /// as in [`plain`](Self::plain).
    pub(crate) async fn counted(&self, stmt: sea_orm::Statement) -> Result<u64, StoreError> {
        #[cfg(any(feature = "postgres", feature = "mysql"))]
        if let Some(checked) = self.checked_count(&stmt).await {
            return checked;
        }
        self.with_retry(|| self.db.execute_raw(stmt.clone()))
            .await
            .map(|r| r.rows_affected())
    }

    /// A row of the lease table that could not be read back.
    pub(crate) fn decode_error(&self, source: DbErr) -> StoreError {
        StoreError::Decode {
            table: self.table.to_string(),
            source,
        }
    }

    /// The one row a deciding statement returned, or `None`. Several rows for one statement
    /// mean a Galera node re-ran the upsert after a failed certification and sent the rows of
    /// both attempts. Trust none of them: it is no grant, and not a denial either (a leader
    /// keeps its term to its deadline and asks again); if the re-run did grant us the lease,
    /// the next attempt renews it.
    pub(super) fn single_row<'r>(
        &self,
        rows: &'r [QueryResult],
    ) -> Result<Option<&'r QueryResult>, StoreError> {
        match rows {
            [] => Ok(None),
            [row] => Ok(Some(row)),
            [..] => {
                tracing::warn!(
                    table = %self.table,
                    rows = rows.len(),
                    "the lease statement returned several rows (a server-side retry?); not a grant"
                );
                Err(StoreError::Conflict {
                    source: DbErr::Custom(format!(
                        "the lease statement returned {} rows (a server-side retry after a \
                         certification conflict); none of them is trusted",
                        rows.len()
                    ))
                    .into(),
                })
            }
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
        let form = self.form()?;
        let (d, backend, table) = (form.dialect(), form.backend(), self.table_iden());
        let prepared = cached(&self.prepared.release, form, |r, c, _| {
            Ok(match form {
                // The release and the wake-up of the followers (`pg_notify`), in one statement.
                #[cfg(feature = "postgres")]
                Form::Postgres => backend.build(&super::postgres::statements::release_notifying(
                    d,
                    &table,
                    &self.table,
                    r,
                    c,
                )),
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
        let form = self.form()?;
        let backend = form.backend();
        let Some(update) = statements::release_write(form.dialect(), &self.table_iden(), lease)
        else {
            return Ok(None);
        };
        Ok(Some(match form {
            #[cfg(feature = "postgres")]
            Form::Postgres => {
                backend.build(&super::postgres::statements::notifying(update, &self.table))
            }
            _ => backend.build(&update),
        }))
    }

    /// Runs a release statement: whether it released a lease.
    async fn run_release(&self, stmt: sea_orm::Statement) -> Result<bool, StoreError> {
        match self.form()? {
            // The notifying form returns one row per released lease.
            #[cfg(feature = "postgres")]
            Form::Postgres => Ok(!self.plain(stmt).await?.is_empty()),
            _ => Ok(self.counted(stmt).await? > 0),
        }
    }

    /// The acquire-or-renew statement of this backend (for MySQL/MariaDB, the `RETURNING`
    /// form), rendered once.
    pub(super) fn acquire_prepared(&self) -> Result<&Prepared, StoreError> {
        let form = self.form()?;
        let table = self.table_iden();
        cached(&self.prepared.acquire, form, |r, c, m| match form {
            #[cfg(feature = "postgres")]
            Form::Postgres => {
                super::postgres::statements::upsert_reporting(form.dialect(), &table, r, c, m)
                    .map(|q| form.backend().build(&q))
            }
            #[cfg(feature = "mysql")]
            Form::MySql => super::mysql::statements::upsert_returning(&table, r, c, m),
            Form::Sqlite => statements::upsert(form.dialect(), &table, r, c, m)
                .map(|q| form.backend().build(&q)),
        })
    }

    /// The stored row of `resource`, read with a plain statement.
    pub(super) async fn read_row(&self, resource: &str) -> Result<Option<Row>, StoreError> {
        let form = self.form()?;
        let table = self.table_iden();
        let stmt = cached(&self.prepared.current, form, |r, _, _| {
            Ok(form
                .backend()
                .build(&statements::current(form.dialect(), &table, r)))
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
    form: Form,
    build: impl Fn(&str, &str, i64) -> Result<sea_orm::Statement, DbErr>,
) -> Result<&Prepared, StoreError> {
    if let Some(prepared) = cell.get() {
        return Ok(prepared);
    }
    let prepared =
        Prepared::new(form.dialect(), build).map_err(|e| StoreError::Database(e.into()))?;
    Ok(cell.get_or_init(|| prepared))
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
        let form = self.form()?;
        self.warn_once_if_not_durable().await;
        match form {
            #[cfg(feature = "postgres")]
            Form::Postgres => {
                self.acquiring(resource, candidate, lease, || {
                    super::postgres::store::acquire_or_renew(self, resource, candidate, millis)
                })
                .await
            }
            #[cfg(feature = "mysql")]
            Form::MySql => {
                self.acquiring(resource, candidate, lease, || {
                    super::mysql::store::acquire_or_renew(self, resource, candidate, millis)
                })
                .await
            }
            Form::Sqlite => {
                super::sqlite::store::acquire_or_renew(self, resource, candidate, millis).await
            }
        }
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

    /// One statement per call on every backend (MySQL/MariaDB: the `UPDATE` and a read of what
    /// it renewed, in one transaction), with the leases bound as one JSON document; MariaDB
    /// needs 10.6 or later (`JSON_TABLE`).
    async fn renew_all(&self, held: &[Lease], lease: Duration) -> Result<Renewals, StoreError> {
        let millis = validate_batch(held, lease)?;
        let form = self.form()?;
        if held.is_empty() {
            return Ok(Renewals::default());
        }
        let json = statements::held_json(held);
        let rows = match form {
            #[cfg(feature = "postgres")]
            Form::Postgres => super::postgres::store::renew_all(self, json, millis).await?,
            #[cfg(feature = "mysql")]
            Form::MySql => super::mysql::store::renew_all(self, json, millis).await?,
            Form::Sqlite => super::sqlite::store::renew_all(self, json, millis).await?,
        };
        let fresh = statements::renewed_leases(&rows).map_err(|e| self.decode_error(e))?;
        Ok(Renewals::sort(held, fresh))
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
            super::postgres::notify::subscribe(&self.releases, &self.db, &self.table)
        }
        #[cfg(not(feature = "postgres"))]
        {
            None
        }
    }

    /// `Err(StoreError::UnsupportedBackend)` for a connection whose backend this build cannot
    /// serve safely (see [`SeaOrmLeaseStore`]'s feature notes), and
    /// `Err(StoreError::Disconnected)` for a disconnected one.
    fn validate(&self) -> Result<(), StoreError> {
        self.form().map(|_| ())
    }

    /// One statement per 1,000 resources.
    async fn current_all(&self, resources: &[String]) -> Result<Vec<LeaseRecord>, StoreError> {
        super::members::validate_resources(resources)?;
        self.read_leases(resources).await
    }

    async fn current(&self, resource: &str) -> Result<Option<LeaseRecord>, StoreError> {
        validate_resource(resource)?;
        Ok(self
            .read_row(resource)
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
