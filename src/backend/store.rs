//! [`SeaOrmLeaseStore`]: leases in a table of the application's own database. The one place
//! the backend is chosen, from the connection ([`choose`]); everything after that calls the
//! chosen backend (`driver::LeaseBackend`) without asking which it is.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use orion_beacon_entity::{
    validate_table_name, DEFAULT_MEMBER_TABLE, DEFAULT_RATE_LIMIT_TABLE, DEFAULT_TABLE,
};
use sea_orm::{DatabaseConnection, DatabaseConnectionType, DbBackend};

use super::context::Context;
use super::driver::{Derived, LeaseBackend};
use super::engine::Engine;
use super::mysql::MySqlUpsert;
use super::statements;
use super::{DEFAULT_LEASE_CONNECTIONS, MAX_LEASE_CONNECTIONS};
use crate::store::{
    offer_holder, validate_batch, validate_candidate, validate_offer, validate_payload,
    validate_request, validate_resource, validate_take,
};
use crate::{
    error::StoreError, fencing::FencingToken, lease::Lease, lease::LeaseOutcome,
    lease::LeaseRecord, lease::Renewals, store::LeaseStore,
};

mod batch;

mod choose;
use choose::{assemble, choose, engine};

mod statements_of;

/// How long a batch renew of leases of `millis` spends, in all, on the leases it left out:
/// the read of them, and their renews one by one, of which one may wait its whole bound for
/// its row (`solo_wait`: the first wait, a fifth of the lease and at most 200 ms; MariaDB's
/// 1 s for leases of 5 s or more), with one more first wait to spare; cut shorter where the
/// caller says when it gives up (`ANSWER_BY`: locks, shard sets and electors do), so that the
/// batch's own renewals reach it.
fn solo_budget(solo_wait: Duration, millis: i64) -> Duration {
    solo_wait.saturating_add(super::first_wait(millis))
}

/// A [`LeaseStore`] in a table of the application's database, through SeaORM.
///
/// It is built on the application's [`DatabaseConnection`]. On SQLite every operation takes
/// one of its pooled connections. On PostgreSQL and MySQL/MariaDB the lease statements run on
/// a few sessions of the store's own, opened on demand with the pool's connect options and
/// never handed to other code (see [`with_lease_connections`](Self::with_lease_connections)),
/// so each call is one statement and one round trip; fenced writes run in the application's
/// own transactions. With `with_lease_connections(0)` (and behind a transaction-pooling proxy)
/// the store takes the application's pooled connections instead and checks each to be outside
/// any transaction somebody abandoned on it (sqlx 0.9 leaves one behind when a future is
/// dropped during `begin()`); one found inside is closed, which rolls that transaction back,
/// and the statement runs on another. Either way a connection goes back only after a complete
/// answer, and is closed on every other path (an error, or the call dropped by a timeout).
/// Acquire-or-renew is one atomic statement per backend; liveness is judged by the database
/// clock.
///
/// The table must exist: create it with the migration (see the `orion-beacon-migration`
/// crate). A missing table is reported as [`StoreError::MissingTable`].
#[derive(Clone)]
pub struct SeaOrmLeaseStore {
    settings: Settings,
    /// The backend, chosen once from the connection (or why there is none), shared by clones.
    engine: Result<Arc<Engine>, Refused>,
}

/// What the store was built with.
#[derive(Clone)]
struct Settings {
    db: DatabaseConnection,
    table: Arc<str>,
    member_table: Arc<str>,
    rate_table: Arc<str>,
    /// PostgreSQL only: the connection goes through a transaction-pooling proxy.
    transaction_pooling: bool,
    /// Whether [`LeaseStore::release_events`] may listen for release notifications.
    notifications: bool,
    /// MySQL/MariaDB only: the upsert form, instead of the one detected.
    mysql_upsert: Option<MySqlUpsert>,
    /// PostgreSQL, MySQL/MariaDB: sessions of its own for lease statements (0: none).
    lease_connections: usize,
}

/// Why a connection has no backend: the error every call of the store reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
    Unsupported {
        backend: &'static str,
        feature: &'static str,
    },
    Disconnected,
}

impl From<Refused> for StoreError {
    fn from(refused: Refused) -> Self {
        match refused {
            Refused::Unsupported { backend, feature } => {
                StoreError::UnsupportedBackend { backend, feature }
            }
            Refused::Disconnected => StoreError::Disconnected,
        }
    }
}

/// The backend and the tables; never the connection pool (its options can hold a password) or
/// the prepared statements.
impl std::fmt::Debug for SeaOrmLeaseStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeaOrmLeaseStore")
            .field("backend", &self.backend_name())
            .field("table", &&*self.settings.table)
            .field("member_table", &&*self.settings.member_table)
            .field("rate_limit_table", &&*self.settings.rate_table)
            .field("transaction_pooling", &self.settings.transaction_pooling)
            .field("release_notifications", &self.settings.notifications)
            .field("lease_connections", &self.settings.lease_connections)
            .finish_non_exhaustive()
    }
}

impl SeaOrmLeaseStore {
    /// The backend's name (`"PostgreSQL"`, `"MySQL"`, `"SQLite"`), or why there is none.
    pub(crate) fn backend_name(&self) -> &'static str {
        match &self.engine {
            Ok(engine) => engine.backend.name(),
            Err(Refused::Unsupported { backend, .. }) => backend,
            Err(Refused::Disconnected) => "disconnected",
        }
    }

    /// A store on the default table, `orionbeacon_leases`.
    pub fn new(db: DatabaseConnection) -> Self {
        let settings = Settings {
            db,
            table: Arc::from(DEFAULT_TABLE),
            member_table: Arc::from(DEFAULT_MEMBER_TABLE),
            rate_table: Arc::from(DEFAULT_RATE_LIMIT_TABLE),
            transaction_pooling: false,
            notifications: true,
            mysql_upsert: None,
            lease_connections: DEFAULT_LEASE_CONNECTIONS,
        };
        Self {
            engine: engine(&settings),
            settings,
        }
    }

    /// The store with its new settings: the backend derived from the old one, sharing what it
    /// detected (and, unless `table_changed`, its release listener) with the store it came from
    /// and that store's clones; statements rendered for the table are made again.
    fn rebuilt(mut self, table_changed: bool) -> Self {
        self.engine = match &self.engine {
            Ok(old) => {
                let backend = old.backend.derived(Derived {
                    transaction_pooling: self.settings.transaction_pooling,
                    notifications: self.settings.notifications,
                    table_changed,
                    lease_connections: self.settings.lease_connections,
                });
                Ok(assemble(&self.settings, backend, Some(old)))
            }
            Err(_) => engine(&self.settings),
        };
        self
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
        self.settings.transaction_pooling = enabled;
        self.rebuilt(false)
    }

    /// Whether followers and lock waiters are woken by release notifications (on by default).
    ///
    /// On PostgreSQL a release sends `pg_notify` in the same statement, and the store `LISTEN`s
    /// for them on one connection of its own (made with the application pool's connect options,
    /// not taken from the pool) while any clone of the store lives: one extra server connection
    /// per store and lease table. Releases still send `pg_notify` for the others when this is
    /// off. Behind a transaction-pooling proxy they are always off (see
    /// [`with_transaction_pooling`](Self::with_transaction_pooling)).
    ///
    /// On SQLite the store watches the database file's directory and, after each burst of
    /// writes, reads which leases stopped being live on a connection of its own (a file
    /// handle), whichever process released them (see [`backend::sqlite`](crate::backend::sqlite)).
    /// An in-memory database has none.
    ///
    /// On MySQL/MariaDB a holder keeps a named lock (`GET_LOCK`) per lease on a connection of
    /// its own, and denied waiters wait on it on a few more (see
    /// [`backend::mysql`](crate::backend::mysql)); off on Galera and behind proxies that spread
    /// a client's sessions. Off here, this store also takes no names, so its releases reach other
    /// processes' waiters at their next poll.
    ///
    /// With notifications off, waiters notice a release at their next retry (`retry_interval`)
    /// instead of at once. Turn them off where connections are scarce.
    pub fn with_release_notifications(mut self, enabled: bool) -> Self {
        self.settings.notifications = enabled;
        self.rebuilt(false)
    }

    /// PostgreSQL and MySQL/MariaDB: how many sessions of its own the store may open for its
    /// lease statements (acquire-or-renew, releases, batched renews, membership, reads), at
    /// most 64; 4 unless set. They are opened on demand with the application pool's connect
    /// options, shared by the store's clones and the stores derived from it (a store made by
    /// `new` or `with_mysql_upsert` has sessions of its own), and never handed to other code,
    /// so a lease statement there is sent alone, with no check that the connection is outside
    /// an abandoned transaction (nothing else ran on it) and no ping when it goes back: an
    /// acquire, renew, release, heartbeat or read is one statement and one round trip
    /// (PostgreSQL's batched renew too; MariaDB's batched renew, the MySQL upsert form and the
    /// revoke are transactions of a few statements). A session is closed (never reused) after
    /// a call that did not finish cleanly (an error, or the call dropped by a timeout), and the
    /// others are then pinged before their next use (one round trip more each), as is one
    /// unused for 30 s; one unused for 5 minutes is not reused.
    ///
    /// New sessions copy the settings of one of the application's sessions that bear on the
    /// store's statements (PostgreSQL `search_path`; MySQL/MariaDB `sql_mode`, the isolation
    /// level, `innodb_lock_wait_timeout`, `wsrep_sync_wait`), read once (the first session
    /// briefly takes one of the application's connections for it), so what a pool's
    /// `after_connect` hook (or SeaORM's `set_schema_search_path`) set holds there too; other
    /// session settings do not carry over, and a `search_path` changed per request or per
    /// transaction is not followed (qualify the lease table's schema in the connection's
    /// settings instead). On MySQL/MariaDB each is set to `autocommit = 1`. MySQL/MariaDB's
    /// takeover of a stalled holder uses an idle session of the store's, or else the
    /// application's pool, so it never queues behind the acquire it serves.
    ///
    /// `0` takes every lease statement's connection from the application's pool instead, for
    /// deployments that cannot spare the sessions: each statement is then checked on the
    /// same connection (PostgreSQL: a second statement; MariaDB: a column of the same
    /// statement, and a check before releases and reads). Behind a transaction-pooling proxy
    /// (see [`with_transaction_pooling`](Self::with_transaction_pooling)) the store always
    /// uses the application's pool. Fenced writes always run in the application's own
    /// transactions. SQLite ignores this.
    pub fn with_lease_connections(mut self, max: usize) -> Result<Self, StoreError> {
        if max > MAX_LEASE_CONNECTIONS {
            return Err(StoreError::InvalidSetting {
                setting: "lease_connections",
                reason: format!("at most {MAX_LEASE_CONNECTIONS}, not {max}"),
            });
        }
        self.settings.lease_connections = max;
        Ok(self.rebuilt(false))
    }

    /// The same store on another table (validated: ASCII letters, digits and `_`, at most 63
    /// characters). Create that table with `CreateLeaseTable::with_table` of the migration crate.
    pub fn with_table(mut self, table: impl AsRef<str>) -> Result<Self, StoreError> {
        let table = table.as_ref();
        validate_table_name(table)?;
        self.settings.table = Arc::from(table);
        // Statements rendered for the old table, and a listener filtering by its name, go.
        Ok(self.rebuilt(true))
    }

    /// MySQL/MariaDB only: use this upsert form instead of the one detected from the server's
    /// version (MariaDB 10.5+ takes [`MySqlUpsert::Returning`], MySQL needs
    /// [`MySqlUpsert::Transaction`]). Both are atomic; detection is right for real servers, so
    /// this is for proxies that hide the version, and for tests.
    pub fn with_mysql_upsert(mut self, form: MySqlUpsert) -> Self {
        self.settings.mysql_upsert = Some(form);
        // A backend made afresh with the form set (only MySQL's has one to set).
        self.engine = match &self.engine {
            Ok(old) => choose(&self.settings).map(|b| assemble(&self.settings, b, Some(old))),
            Err(_) => engine(&self.settings),
        };
        self
    }

    /// The same store with shard sets' members in another table (validated like lease table
    /// names). Create it with `CreateMemberTable::with_table` of the migration crate.
    pub fn with_member_table(mut self, table: impl AsRef<str>) -> Result<Self, StoreError> {
        let table = table.as_ref();
        validate_table_name(table)?;
        self.settings.member_table = Arc::from(table);
        Ok(self.rebuilt(false))
    }

    /// The same store with rate-limit keys in another table (validated like lease table
    /// names). Create it with `CreateRateLimitTable::with_table` of the migration crate.
    pub fn with_rate_limit_table(mut self, table: impl AsRef<str>) -> Result<Self, StoreError> {
        let table = table.as_ref();
        validate_table_name(table)?;
        self.settings.rate_table = Arc::from(table);
        Ok(self.rebuilt(false))
    }

    /// The rate-limit table's name (`orionbeacon_rate_limits` unless configured).
    pub fn rate_limit_table(&self) -> &str {
        &self.settings.rate_table
    }

    /// The membership table's name (`orionbeacon_members` unless configured).
    pub fn member_table(&self) -> &str {
        &self.settings.member_table
    }

    /// The lease table's name.
    pub fn table(&self) -> &str {
        &self.settings.table
    }

    /// The connection this store uses.
    pub fn connection(&self) -> &DatabaseConnection {
        &self.settings.db
    }

    /// The renewer of every hold on this store (see `hold::renewer`); `None` when the store
    /// has no backend.
    pub(crate) fn renewer(&self) -> Option<crate::hold::renewer::Renewer> {
        self.engine.as_ref().ok().map(|e| e.renewer.clone())
    }

    /// Whether electors may renew together here: where a batch is one statement.
    pub(crate) fn batches_renewals(&self) -> bool {
        self.engine
            .as_ref()
            .is_ok_and(|e| e.backend.batches_renewals())
    }

    /// A transaction on the application's pool whose `BEGIN` is never cut off half way. sqlx
    /// 0.9 gives a connection back to its pool inside the transaction its `BEGIN` opened when
    /// the future waiting for that `BEGIN` is dropped (see `sessions`); so the `BEGIN` runs in
    /// a task of its own that finishes it whatever becomes of the caller, and a transaction
    /// nobody waits for any more is dropped there. From then on a dropped transaction rolls
    /// back: SeaORM queues the `ROLLBACK` and sqlx sends it before the connection is used
    /// again. For the transactions the store begins for its users' work (a job's run).
    #[cfg(feature = "jobs")]
    pub(crate) async fn begin_whole(&self) -> Result<sea_orm::DatabaseTransaction, sea_orm::DbErr> {
        begin_whole(self.connection()).await
    }

    /// A waiter of this process waits for a release of `resources` until `until`: where the
    /// backend's wake-ups need to know (MySQL's named locks), they are watched while the guard
    /// lives.
    pub(crate) fn waiting(
        &self,
        resources: &[Arc<str>],
        until: tokio::time::Instant,
    ) -> Option<Box<dyn Send>> {
        let engine = self.engine().ok()?;
        engine.waiting(resources, until)
    }

    /// The store's backend and what its code is given, or the error every call reports when
    /// it has none (see [`choose`]).
    pub(crate) fn engine(&self) -> Result<&Arc<Engine>, StoreError> {
        self.engine
            .as_ref()
            .map_err(|refused| StoreError::from(*refused))
    }
}

#[async_trait]
impl LeaseStore for SeaOrmLeaseStore {
    async fn acquire_or_renew(
        &self,
        resource: &str,
        candidate: &str,
        lease: Duration,
    ) -> Result<LeaseOutcome, StoreError> {
        self.acquire_or_renew_with(resource, candidate, lease, None)
            .await
    }

    /// The payload is written by the same statement as the grant.
    async fn acquire_or_renew_with(
        &self,
        resource: &str,
        candidate: &str,
        lease: Duration,
        payload: Option<&str>,
    ) -> Result<LeaseOutcome, StoreError> {
        let millis = validate_request(resource, candidate, lease)?;
        if let Some(payload) = payload {
            validate_payload(payload)?;
        }
        let engine = self.engine()?;
        self.warn_once_if_not_durable().await;
        super::acquire::acquire_or_renew(engine, resource, candidate, lease, millis, payload).await
    }

    async fn release(&self, resource: &str, candidate: &str) -> Result<bool, StoreError> {
        let stmt = self.release_statement(resource, candidate)?;
        let engine = self.engine()?;
        let released = engine.run_release(stmt).await;
        // After the answer (an error too, which may hide a release): a waiter woken now finds
        // the lease free.
        engine.ended(resource, candidate);
        released
    }

    async fn release_lease(&self, lease: &Lease) -> Result<bool, StoreError> {
        let Some(stmt) = self.release_lease_statement(lease)? else {
            return Ok(false);
        };
        let engine = self.engine()?;
        let released = engine.run_release(stmt).await;
        engine.ended(&lease.resource, &lease.holder);
        released
    }

    /// One `UPDATE` (on PostgreSQL it also notifies followers, as a release does).
    async fn offer(&self, lease: &Lease, to: &str, within: Duration) -> Result<bool, StoreError> {
        let millis = validate_offer(lease, to, within)?;
        let engine = self.engine()?;
        let cx = &engine.cx;
        let update = statements::offer(
            cx.dialect,
            &cx.table_iden(),
            lease,
            &offer_holder(to),
            millis,
        );
        let stmt = engine.backend.release_lease_statement(cx, update);
        let offered = engine.run_release(stmt).await?;
        if offered {
            engine.ended(&lease.resource, &lease.holder);
        }
        Ok(offered)
    }

    /// One `UPDATE`, on a connection checked as a release's is.
    async fn take_offer(
        &self,
        resource: &str,
        candidate: &str,
        token: FencingToken,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let millis = validate_take(resource, candidate, lease)?;
        let engine = self.engine()?;
        let cx = &engine.cx;
        let update = statements::take_offer(
            cx.dialect,
            &cx.table_iden(),
            resource,
            &offer_holder(candidate),
            candidate,
            token.get(),
            millis,
        );
        let taken = engine.lease_count(cx.build(&update)).await? > 0;
        if taken {
            engine.holding(resource, candidate, lease);
        }
        Ok(taken)
    }

    /// One batch statement per call on every backend (MySQL/MariaDB: a locking read, the
    /// `UPDATE` and a read of what it renewed, in one transaction), with the
    /// leases bound as one JSON document; MariaDB needs 10.6 or later (`JSON_TABLE`,
    /// `SKIP LOCKED`). The batch never waits for a row lock and locks no row but the batch's
    /// (PostgreSQL, MySQL/MariaDB): a row another transaction holds (the holder's own fenced
    /// transaction, say) is left out. The leases it did not renew are then read once (lost
    /// where the read shows them lapsed or taken), and those still live as given renewed one
    /// by one, each waiting for its row at most as a single renew does (a fifth of the lease,
    /// at most 200 ms: PostgreSQL's `lock_timeout`, MySQL's `NOWAIT` asked again every 20 ms;
    /// MariaDB, for leases of 5 s or more, 1 s in the server's lock queue), within that wait
    /// plus one more first wait in all. What is still not known is
    /// [`unanswered`](Renewals::unanswered). SQLite has no row locks: a fenced transaction
    /// there holds the database's write lock, which the batch waits for as every write does.
    async fn renew_all(&self, held: &[Lease], lease: Duration) -> Result<Renewals, StoreError> {
        self.renew_all_skipping(held, lease).await
    }

    /// On PostgreSQL, `LISTEN`s on one connection of its own (opened on first use, kept while
    /// any clone of this store lives) for the notifications that releases send; on SQLite,
    /// watches the database file's changes; see
    /// [`with_release_notifications`](SeaOrmLeaseStore::with_release_notifications).
    fn release_events(&self) -> Option<crate::store::ReleaseEvents> {
        let engine = self.engine().ok()?;
        engine.release_events()
    }

    /// `Err(StoreError::UnsupportedBackend)` for a connection whose backend this build cannot
    /// serve safely (see [`SeaOrmLeaseStore`]'s feature notes), and
    /// `Err(StoreError::Disconnected)` for a disconnected one.
    fn validate(&self) -> Result<(), StoreError> {
        self.engine().map(|_| ())
    }

    fn sea_orm_store(&self) -> Option<&SeaOrmLeaseStore> {
        Some(self)
    }

    fn membership(&self) -> Option<std::sync::Arc<dyn crate::MembershipStore>> {
        Some(std::sync::Arc::new(self.clone()))
    }

    /// One statement per 1,000 resources.
    async fn current_all(&self, resources: &[String]) -> Result<Vec<LeaseRecord>, StoreError> {
        resources.iter().try_for_each(|r| validate_resource(r))?;
        self.read_leases(resources).await
    }

    async fn current(&self, resource: &str) -> Result<Option<LeaseRecord>, StoreError> {
        validate_resource(resource)?;
        Ok(self
            .engine()?
            .read_row(resource)
            .await?
            .map(|row| row.record(resource)))
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests;

/// [`SeaOrmLeaseStore::begin_whole`] on `db`.
#[cfg(feature = "jobs")]
pub(crate) async fn begin_whole(
    db: &DatabaseConnection,
) -> Result<sea_orm::DatabaseTransaction, sea_orm::DbErr> {
    use sea_orm::TransactionTrait;
    let db = db.clone();
    tokio::spawn(async move { db.begin().await })
        .await
        .map_err(|e| {
            sea_orm::DbErr::Custom(format!("the transaction's BEGIN did not finish: {e}"))
        })?
}
