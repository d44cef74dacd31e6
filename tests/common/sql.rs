//! The conformance harness for `SeaOrmLeaseStore` on a real database.

use async_trait::async_trait;
use orion_beacon::SeaOrmLeaseStore;
use sea_orm::DatabaseConnection;

use super::conformance::Harness;
use super::{drop_table, migrate, unique, Server};

enum Target {
    #[cfg(feature = "sqlite")]
    Sqlite {
        _dir: tempfile::TempDir,
        path: std::path::PathBuf,
        /// Rollback journal (SQLite's default) instead of the recommended WAL.
        rollback_journal: bool,
    },
    Server(Server),
    /// MySQL/MariaDB with this statement run on every new session (e.g. a `sql_mode`).
    #[cfg(feature = "mysql")]
    MySqlSession(&'static str),
    /// PostgreSQL through a transaction-pooling PgBouncer (the private instance behind it).
    #[cfg(feature = "postgres")]
    Pgbouncer {
        direct: DatabaseConnection,
    },
}

/// This test binary's PgBouncer, in `pool_mode = transaction`, in front of its private
/// PostgreSQL instance.
#[cfg(feature = "postgres")]
pub fn pgbouncer() -> &'static orion_beacon_testkit::Pgbouncer {
    static BOUNCER: std::sync::OnceLock<orion_beacon_testkit::Pgbouncer> =
        std::sync::OnceLock::new();
    BOUNCER.get_or_init(|| {
        orion_beacon_testkit::Pgbouncer::builder(orion_beacon_testkit::Postgres::shared())
            .pool_mode(orion_beacon_testkit::PoolMode::Transaction)
            // As docs/topologies.md tells users of PgBouncer before 1.21: sqlx names its
            // statements even with its cache off (and never closes them then), so a name left
            // on a server connection collides with the next client's unless it is discarded.
            .setting("server_reset_query", "DISCARD ALL")
            .setting("server_reset_query_always", "1")
            .start()
            .unwrap_or_else(|e| panic!("cannot start this test binary's PgBouncer: {e}"))
    })
}

/// A pool through this binary's PgBouncer as an application behind a transaction-pooling
/// proxy configures it: sqlx's statement cache off (PgBouncer before 1.21 keeps no named
/// statements across transactions), so the application's own statements work there too.
#[cfg(feature = "postgres")]
pub async fn connect_pgbouncer(max_connections: u32) -> DatabaseConnection {
    connect_pgbouncer_at(&pgbouncer().url(), max_connections).await
}

/// [`connect_pgbouncer`] at `url` (the bouncer's, or a proxy's in front of it).
#[cfg(feature = "postgres")]
pub async fn connect_pgbouncer_at(url: &str, max_connections: u32) -> DatabaseConnection {
    let mut options = sea_orm::ConnectOptions::new(url);
    options
        .max_connections(max_connections)
        .min_connections(0)
        .acquire_timeout(std::time::Duration::from_secs(10))
        .sqlx_logging(false)
        .map_sqlx_postgres_opts(|o| o.statement_cache_capacity(0));
    sea_orm::Database::connect(options)
        .await
        .unwrap_or_else(|e| panic!("cannot reach this test binary's PgBouncer: {e}"))
}

/// One migrated table of its own on a real database.
pub struct SqlHarness {
    target: Target,
    db: DatabaseConnection,
    table: String,
    mysql_form: Option<orion_beacon::MySqlUpsert>,
    /// `with_lease_connections` for every store, if set.
    lease_connections: Option<usize>,
}

/// Opens a SQLite file in rollback-journal mode (`journal_mode=DELETE`, SQLite's own default)
/// with the given busy timeout.
#[cfg(feature = "sqlite")]
pub async fn connect_sqlite_rollback_journal(
    path: &std::path::Path,
    max_connections: u32,
    busy_timeout: std::time::Duration,
) -> DatabaseConnection {
    use sea_orm::sqlx::sqlite::SqliteJournalMode;
    let mut options = sea_orm::ConnectOptions::new(format!("sqlite://{}", path.display()));
    options
        .max_connections(max_connections)
        .min_connections(0)
        .sqlx_logging(false)
        .map_sqlx_sqlite_opts(move |o| {
            o.journal_mode(SqliteJournalMode::Delete)
                .busy_timeout(busy_timeout)
                .create_if_missing(true)
        });
    sea_orm::Database::connect(options)
        .await
        .expect("open sqlite file")
}

/// Connects to the MySQL/MariaDB test server with `init` run on every new session, the way an
/// application's own session settings (or a server-wide default) would apply.
#[cfg(feature = "mysql")]
pub async fn connect_mysql_with_session(
    max_connections: u32,
    init: &'static str,
) -> DatabaseConnection {
    let db = Server::MySql.connect(1).await; // fails the test with a clear message if down
    db.close().await.ok();
    let mut options = sea_orm::ConnectOptions::new(Server::MySql.url());
    options
        .max_connections(max_connections)
        .min_connections(0)
        .acquire_timeout(std::time::Duration::from_secs(10))
        .sqlx_logging(false)
        .map_sqlx_mysql_pool_opts(move |o| {
            o.after_connect(move |conn, _meta| {
                Box::pin(async move {
                    sea_orm::sqlx::Executor::execute(conn, init).await?;
                    Ok(())
                })
            })
        });
    sea_orm::Database::connect(options)
        .await
        .expect("connect with session settings")
}

impl SqlHarness {
    pub async fn server(server: Server) -> Option<Self> {
        if server.skipped() {
            return None;
        }
        let db = server.connect(8).await;
        Some(Self::migrated(Target::Server(server), db).await)
    }

    #[cfg(feature = "sqlite")]
    pub async fn sqlite() -> Option<Self> {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("leases.db");
        let db = super::connect_sqlite(&path, 8).await;
        let target = Target::Sqlite {
            _dir: dir,
            path,
            rollback_journal: false,
        };
        Some(Self::migrated(target, db).await)
    }

    /// SQLite in rollback-journal mode (SQLite's default, without the recommended WAL), where
    /// a commit needs every reader gone.
    #[cfg(feature = "sqlite")]
    pub async fn sqlite_rollback_journal() -> Option<Self> {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("leases.db");
        let db = connect_sqlite_rollback_journal(&path, 8, std::time::Duration::from_secs(5)).await;
        let target = Target::Sqlite {
            _dir: dir,
            path,
            rollback_journal: true,
        };
        Some(Self::migrated(target, db).await)
    }

    /// The MySQL/MariaDB harness with a fixed upsert form and `init` run on every session.
    #[cfg(feature = "mysql")]
    pub async fn mysql_with_session(
        form: orion_beacon::MySqlUpsert,
        init: &'static str,
    ) -> Option<Self> {
        if Server::MySql.skipped() {
            return None;
        }
        let db = connect_mysql_with_session(8, init).await;
        let mut h = Self::migrated(Target::MySqlSession(init), db).await;
        h.mysql_form = Some(form);
        // The stores on the pool's sessions, where `init` runs (their own sessions take the
        // server's settings, not the pool's `after_connect`).
        h.lease_connections = Some(0);
        Some(h)
    }

    /// PostgreSQL through a transaction-pooling PgBouncer, the store in its
    /// `with_transaction_pooling` mode. The table is made on a direct connection (migrations
    /// are not run through the pooler).
    #[cfg(feature = "postgres")]
    pub async fn pgbouncer() -> Option<Self> {
        if Server::Postgres.skipped() {
            return None;
        }
        let direct = super::connect_url(&Server::Postgres.private_url(), 2).await;
        let table = unique("obt");
        migrate(&direct, &table).await;
        let db = connect_pgbouncer(8).await;
        Some(Self {
            target: Target::Pgbouncer { direct },
            db,
            table,
            mysql_form: None,
            lease_connections: None,
        })
    }

    async fn migrated(target: Target, db: DatabaseConnection) -> Self {
        let table = unique("obt");
        migrate(&db, &table).await;
        Self {
            target,
            db,
            table,
            mysql_form: None,
            lease_connections: None,
        }
    }

    /// The server harness with the stores on the application's pool, every statement checked
    /// (`with_lease_connections(0)`), instead of sessions of their own.
    #[allow(dead_code)]
    pub async fn app_pool(server: Server) -> Option<Self> {
        let mut h = Self::server(server).await?;
        h.lease_connections = Some(0);
        Some(h)
    }

    /// The MySQL/MariaDB server harness with a fixed upsert form.
    pub async fn mysql(form: orion_beacon::MySqlUpsert) -> Option<Self> {
        let mut h = Self::server(Server::MySql).await?;
        h.mysql_form = Some(form);
        Some(h)
    }

    /// A store on this harness's table, with its statement form if one was chosen.
    pub fn configure(&self, store: SeaOrmLeaseStore) -> SeaOrmLeaseStore {
        let mut store = store
            .with_table(&self.table)
            .and_then(|s| s.with_member_table(super::member_table(&self.table)))
            .and_then(|s| s.with_rate_limit_table(super::rate_table(&self.table)))
            .expect("valid table");
        #[cfg(feature = "postgres")]
        if let Target::Pgbouncer { .. } = self.target {
            store = store.with_transaction_pooling(true);
        }
        if let Some(n) = self.lease_connections {
            store = store.with_lease_connections(n).expect("at most 64");
        }
        match self.mysql_form {
            Some(form) => store.with_mysql_upsert(form),
            None => store,
        }
    }

    pub fn db(&self) -> &DatabaseConnection {
        &self.db
    }

    /// A connection to the database itself, not through a proxy: for a test's own tables.
    #[allow(dead_code)]
    pub fn direct(&self) -> &DatabaseConnection {
        match &self.target {
            #[cfg(feature = "postgres")]
            Target::Pgbouncer { direct } => direct,
            _ => &self.db,
        }
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    /// A new connection pool to the same database, as another process would have.
    pub async fn connect_again(&self, max_connections: u32) -> DatabaseConnection {
        match &self.target {
            #[cfg(feature = "sqlite")]
            Target::Sqlite {
                path,
                rollback_journal: false,
                ..
            } => super::connect_sqlite(path, max_connections).await,
            #[cfg(feature = "sqlite")]
            Target::Sqlite {
                path,
                rollback_journal: true,
                ..
            } => {
                connect_sqlite_rollback_journal(
                    path,
                    max_connections,
                    std::time::Duration::from_secs(5),
                )
                .await
            }
            Target::Server(server) => server.connect(max_connections).await,
            #[cfg(feature = "mysql")]
            Target::MySqlSession(init) => connect_mysql_with_session(max_connections, init).await,
            #[cfg(feature = "postgres")]
            Target::Pgbouncer { .. } => connect_pgbouncer(max_connections).await,
        }
    }

    /// As [`connect_again`](Self::connect_again), through a proxy of `partitions` named
    /// `name` (so the test can cut it off). Server and PgBouncer targets only.
    pub async fn connect_through(
        &self,
        partitions: &super::partition::Partitions,
        name: &str,
        max_connections: u32,
    ) -> DatabaseConnection {
        let route = |url: &str| partitions.route(name, url).expect("a proxy");
        match &self.target {
            Target::Server(server) => {
                super::connect_url(&route(&server.url()), max_connections).await
            }
            #[cfg(feature = "postgres")]
            Target::Pgbouncer { .. } => {
                connect_pgbouncer_at(&route(&pgbouncer().url()), max_connections).await
            }
            #[allow(unreachable_patterns)]
            _ => panic!("no proxy for this harness"),
        }
    }
}

#[async_trait]
impl Harness for SqlHarness {
    type Store = SeaOrmLeaseStore;

    fn store(&self) -> SeaOrmLeaseStore {
        self.configure(SeaOrmLeaseStore::new(self.db.clone()))
    }

    async fn separate_store(&self) -> SeaOrmLeaseStore {
        self.configure(SeaOrmLeaseStore::new(self.connect_again(2).await))
    }

    async fn store_on_another_lease_table(&self) -> Option<SeaOrmLeaseStore> {
        let other = format!("{}_g", self.table);
        super::migrate(self.direct(), &other).await;
        let store = self.configure(SeaOrmLeaseStore::new(self.connect_again(2).await));
        Some(store.with_table(&other).expect("valid table"))
    }

    async fn teardown(self) {
        match &self.target {
            #[cfg(feature = "postgres")]
            Target::Pgbouncer { direct } => drop_table(direct, &self.table).await,
            _ => drop_table(&self.db, &self.table).await,
        }
    }

    fn read_delay(&self) -> std::time::Duration {
        match self.mysql_form {
            // The read after the upsert, in the same transaction.
            Some(orion_beacon::MySqlUpsert::Transaction) => std::time::Duration::from_millis(50),
            _ => std::time::Duration::ZERO,
        }
    }
}

/// A rate limit on a table nobody made: the error names that table and its migration; a bad
/// key is refused as bad input, which it could not be had its statement been sent (the
/// missing table would have answered first).
pub async fn a_missing_rate_limit_table_is_named_and_bad_keys_send_nothing(h: &SqlHarness) {
    use orion_beacon::rate_limit::{Quota, RateLimiter};
    use orion_beacon::{ErrorKind, StoreError};
    let table = unique("no_rates");
    let store = h
        .configure(SeaOrmLeaseStore::new(h.db().clone()))
        .with_rate_limit_table(&table)
        .unwrap();
    let quota = Quota::per(std::time::Duration::from_secs(1), 5).unwrap();
    let limiter = RateLimiter::new(store, quota);
    let err = limiter.try_acquire("api").await.unwrap_err();
    assert!(matches!(err, StoreError::MissingTable { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains(&table) && text.contains("CreateRateLimitTable::with_table"),
        "{text}"
    );
    for key in ["", " api", "a\u{7}b"] {
        let err = limiter.try_acquire(key).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{key:?}: {err:?}");
    }
}

pub async fn missing_table_says_run_the_migration(h: &SqlHarness) {
    use orion_beacon::{LeaseStore, StoreError};
    let table = unique("never_migrated");
    let store = SeaOrmLeaseStore::new(h.db().clone())
        .with_table(&table)
        .unwrap();
    for err in [
        store
            .acquire_or_renew("r", "a", super::conformance::LONG)
            .await
            .unwrap_err(),
        store.current("r").await.unwrap_err(),
        store.release("r", "a").await.unwrap_err(),
    ] {
        assert!(matches!(err, StoreError::MissingTable { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("run the migration") && text.contains("never_migrated"),
            "{text}"
        );
        // The app's Migrator first, with the migration that makes this custom table.
        let migrator = text.find("your application's Migrator");
        let command_line = text.find("orion-beacon-migration up");
        assert!(
            migrator.is_some() && migrator < command_line,
            "the Migrator path comes first: {text}"
        );
        assert!(
            text.contains(&format!("CreateLeaseTable::with_table(\"{table}\")")),
            "the custom table's migration: {text}"
        );
        assert!(
            std::error::Error::source(&err).is_some(),
            "the DbErr is kept as source"
        );
    }
}

pub async fn bad_table_names_are_refused(h: &SqlHarness) {
    use orion_beacon::StoreError;
    for bad in ["", "x; DROP TABLE y", "a\"b", "a`b", "1x", &"t".repeat(64)] {
        let err = SeaOrmLeaseStore::new(h.db().clone())
            .with_table(bad)
            .unwrap_err();
        assert!(
            matches!(err, StoreError::InvalidTableName(_)),
            "{bad:?}: {err:?}"
        );
    }
}

/// The default table name works end to end, and the entity crate reads the rows it writes.
pub async fn entity_reads_what_the_store_writes(h: &SqlHarness) {
    use orion_beacon::LeaseStore;
    use orion_beacon_entity::lease;
    use sea_orm::sea_query::{Alias, Expr, ExprTrait, Query};
    use sea_orm::FromQueryResult;
    let store = h.store_for_test();
    let r = unique("entity");
    let out = store
        .acquire_or_renew(&r, "node-a", super::conformance::LONG)
        .await
        .unwrap();
    let lease = out.lease().unwrap().clone();
    // Plain SeaORM: the entity names the default table, so select from ours into its Model.
    let select = Query::select()
        .column(sea_orm::sea_query::Asterisk)
        .from(Alias::new(h.table()))
        .and_where(Expr::col(lease::Column::Resource).eq(r.clone()))
        .to_owned();
    let row = lease::Model::find_by_statement(h.db().get_database_backend().build(&select))
        .one(h.db())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.holder, "node-a");
    assert_eq!(row.fencing_token, lease.token.get());
    assert_eq!(Some(row.expires_at), lease.expires_at);
    assert_eq!(Some(row.acquired_at), lease.acquired_at);
    assert_eq!(row.acquired_at, row.renewed_at);
}

/// A lease table made before the payload columns (`CreateLeaseTable` alone), and the
/// harness's store on it.
async fn table_without_payload(h: &SqlHarness, prefix: &str) -> (String, SeaOrmLeaseStore) {
    use orion_beacon_migration::{CreateLeaseTable, MigrationTrait, SchemaManager};
    let table = unique(prefix);
    CreateLeaseTable::with_table(&table)
        .unwrap()
        .up(&SchemaManager::new(h.db()))
        .await
        .unwrap();
    let store = h
        .configure(SeaOrmLeaseStore::new(h.db().clone()))
        .with_table(&table)
        .unwrap();
    (table, store)
}

/// The rows of `table`, counted with a plain query of the test's own.
async fn rows_in(h: &SqlHarness, table: &str) -> usize {
    use sea_orm::sea_query::{Alias, Expr, Query};
    use sea_orm::ConnectionTrait;
    let select = Query::select()
        .expr(Expr::val(1))
        .from(Alias::new(table))
        .to_owned();
    h.db().query_all(&select).await.unwrap().len()
}

/// Whether `result` is the typed refusal of a table that lacks `migration`'s columns, naming
/// the step in its message.
fn outdated<T: std::fmt::Debug>(
    result: Result<T, orion_beacon::StoreError>,
    table: &str,
    migration: &str,
) {
    use orion_beacon::{ErrorKind, StoreError};
    let err = result.unwrap_err();
    match &err {
        StoreError::OutdatedSchema {
            table: t,
            migration: m,
            ..
        } => assert_eq!((t.as_str(), *m), (table, migration)),
        other => panic!("expected OutdatedSchema: {other:?}"),
    }
    assert_eq!(err.kind(), ErrorKind::MissingTable);
    assert!(!err.is_permanent(), "retried, as a missing table is");
    assert!(
        std::error::Error::source(&err).is_some(),
        "the database's own error is kept: {err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&format!("{migration}::with_table(\"{table}\")")),
        "{text}"
    );
}

/// A lease table made by an earlier version (before the payload columns) is refused with a
/// typed error naming the migration step, before anything is written; once the step has run,
/// the same store works on it; if the step is undone by hand, every statement says so again
/// (nothing is written), and running it again brings the rows back as they were.
pub async fn a_table_from_an_earlier_version_is_refused_until_its_migration_runs(h: &SqlHarness) {
    use super::conformance::LONG;
    use orion_beacon::{store::LeaseOutcome, LeaseStore};
    use orion_beacon_migration::{
        AddLeasePayload, CreateLeaseTable, MigrationTrait, SchemaManager,
    };
    let db = h.db();
    let (table, store) = table_without_payload(h, "pre_payload").await;
    let r = unique("r");
    outdated(
        store.acquire_or_renew(&r, "a", LONG).await,
        &table,
        "AddLeasePayload",
    );
    outdated(store.current(&r).await, &table, "AddLeasePayload");
    outdated(store.release(&r, "a").await, &table, "AddLeasePayload");
    outdated(store.list().await, &table, "AddLeasePayload");
    assert_eq!(rows_in(h, &table).await, 0, "nothing was written");

    // The step runs while the application does: the same store picks it up.
    AddLeasePayload::with_table(&table)
        .unwrap()
        .up(&SchemaManager::new(db))
        .await
        .unwrap();
    let out = store
        .acquire_or_renew_with(&r, "a", LONG, Some("a's address"))
        .await
        .unwrap();
    assert!(matches!(out, LeaseOutcome::Acquired(_)), "{out:?}");
    let first = out.lease().expect("granted").clone();
    assert_eq!(
        (first.token.get(), first.payload.as_deref()),
        (1, Some("a's address"))
    );

    // `down` of that step is refused while a live lease carries a payload...
    let refused = AddLeasePayload::with_table(&table)
        .unwrap()
        .down(&SchemaManager::new(db))
        .await
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("1 live lease(s) carry a payload"),
        "{refused}"
    );
    // ...and removes only the columns once none does.
    let out = store.acquire_or_renew(&r, "a", LONG).await.unwrap();
    assert!(matches!(out, LeaseOutcome::Renewed(_)), "{out:?}");
    AddLeasePayload::with_table(&table)
        .unwrap()
        .down(&SchemaManager::new(db))
        .await
        .unwrap();
    // Every statement is now refused as such, and changes nothing.
    outdated(
        store.acquire_or_renew(&r, "a", LONG).await,
        &table,
        "AddLeasePayload",
    );
    outdated(store.current(&r).await, &table, "AddLeasePayload");
    outdated(
        store.renew_all(std::slice::from_ref(&first), LONG).await,
        &table,
        "AddLeasePayload",
    );
    outdated(
        store.acquire_or_renew(&r, "b", LONG).await,
        &table,
        "AddLeasePayload",
    );
    // Run again: the row and its token as they were.
    AddLeasePayload::with_table(&table)
        .unwrap()
        .up(&SchemaManager::new(db))
        .await
        .unwrap();
    let rec = store.current(&r).await.unwrap().unwrap();
    assert_eq!(
        (rec.holder.as_str(), rec.token, rec.live, rec.payload),
        ("a", first.token, true, None)
    );
    let out = store.acquire_or_renew(&r, "a", LONG).await.unwrap();
    assert!(matches!(out, LeaseOutcome::Renewed(_)), "{out:?}");
    assert!(store.release(&r, "a").await.unwrap());
    let second = store.acquire_or_renew(&r, "b", LONG).await.unwrap();
    assert_eq!(second.token().map(|t| t.get()), Some(2));
    assert!(store.release(&r, "b").await.unwrap());
    let delete = sea_orm::sea_query::Query::delete()
        .from_table(sea_orm::sea_query::Alias::new(&table))
        .to_owned();
    sea_orm::ConnectionTrait::execute(db, &delete)
        .await
        .unwrap();
    AddLeasePayload::with_table(&table)
        .unwrap()
        .down(&SchemaManager::new(db))
        .await
        .unwrap();
    CreateLeaseTable::with_table(&table)
        .unwrap()
        .down(&SchemaManager::new(db))
        .await
        .unwrap();
}

/// A membership table made by an earlier version (before the count columns) is refused with
/// a typed error naming `AddMemberHolding`, writing no member; once the step has run the same
/// store's heartbeats carry their counts; undone by hand, it is refused again.
pub async fn a_membership_table_from_an_earlier_version_is_refused_until_its_migration_runs(
    h: &SqlHarness,
) {
    use orion_beacon::{Holding, MembershipStore};
    use orion_beacon_migration::{
        AddMemberHolding, CreateMemberTable, MigrationTrait, SchemaManager,
    };
    use std::time::Duration;
    let db = h.db();
    let members = unique("pre_counts");
    CreateMemberTable::with_table(&members)
        .unwrap()
        .up(&SchemaManager::new(db))
        .await
        .unwrap();
    let store = h
        .configure(SeaOrmLeaseStore::new(db.clone()))
        .with_member_table(&members)
        .unwrap();
    let holding = Holding::new(2, &["a", "b"]);
    let ttl = Duration::from_secs(30);
    let step = "AddMemberHolding";
    outdated(
        store
            .heartbeat_holding("set", "n1", ttl, false, holding)
            .await,
        &members,
        step,
    );
    outdated(
        store.heartbeat("set", "n1", ttl, false).await,
        &members,
        step,
    );
    outdated(store.members("set").await, &members, step);
    outdated(store.list_members().await, &members, step);
    outdated(store.leave("set", "n1").await, &members, step);
    assert_eq!(rows_in(h, &members).await, 0, "no member was written");

    AddMemberHolding::with_table(&members)
        .unwrap()
        .up(&SchemaManager::new(db))
        .await
        .unwrap();
    let seen = store
        .heartbeat_holding("set", "n1", ttl, false, holding)
        .await
        .unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].holding, Some(holding));
    assert_eq!(
        store.members("set").await.unwrap()[0].holding,
        Some(holding)
    );
    // A heartbeat without counts clears them.
    let seen = store.heartbeat("set", "n1", ttl, false).await.unwrap();
    assert_eq!(seen[0].holding, None);

    assert!(store.leave("set", "n1").await.unwrap());
    AddMemberHolding::with_table(&members)
        .unwrap()
        .down(&SchemaManager::new(db))
        .await
        .unwrap();
    outdated(
        store
            .heartbeat_holding("set", "n1", ttl, false, holding)
            .await,
        &members,
        step,
    );
    outdated(store.members("set").await, &members, step);
    assert_eq!(rows_in(h, &members).await, 0, "no member was written");
    CreateMemberTable::with_table(&members)
        .unwrap()
        .down(&SchemaManager::new(db))
        .await
        .unwrap();
}

/// A membership table without the candidate rank (before `AddMemberRank`): candidate calls are
/// refused with a typed error naming the step, writing nothing, while shard-set members work;
/// a ranked elector on it still leads (as an unranked one would) and shows the error in its
/// candidacy and health; once the step has run, it lists itself.
pub async fn a_membership_table_without_the_rank_refuses_candidates_until_its_migration_runs(
    h: &SqlHarness,
) {
    use orion_beacon::{Elector, MembershipStore};
    use orion_beacon_migration::{
        AddMemberHolding, AddMemberRank, CreateMemberTable, MigrationTrait, SchemaManager,
    };
    use std::time::Duration;
    let db = h.db();
    let members = unique("pre_rank");
    CreateMemberTable::with_table(&members)
        .unwrap()
        .up(&SchemaManager::new(db))
        .await
        .unwrap();
    AddMemberHolding::with_table(&members)
        .unwrap()
        .up(&SchemaManager::new(db))
        .await
        .unwrap();
    let store = h
        .configure(SeaOrmLeaseStore::new(db.clone()))
        .with_table(&h.table)
        .unwrap()
        .with_member_table(&members)
        .unwrap();
    let ttl = Duration::from_secs(30);
    let step = "AddMemberRank";
    let resource = unique("unranked_table");
    outdated(
        store.candidate_heartbeat(&resource, "a", ttl, 1).await,
        &members,
        step,
    );
    outdated(store.candidates(&resource).await, &members, step);
    assert_eq!(rows_in(h, &members).await, 0, "no candidate was written");
    // Shard sets do not need the rank.
    assert_eq!(
        store
            .heartbeat("set", "n1", ttl, false)
            .await
            .unwrap()
            .len(),
        1
    );
    assert!(store.leave("set", "n1").await.unwrap());

    let elector = Elector::builder(store.clone())
        .resource(&resource)
        .candidate_id("a")
        .lease_duration(Duration::from_millis(900))
        .renew_interval(Duration::from_millis(150))
        .retry_interval(Duration::from_millis(100))
        .rank(1)
        .build()
        .unwrap()
        .start();
    tokio::time::timeout(
        Duration::from_secs(10),
        elector.watch().wait_for(|l| l.is_leader()),
    )
    .await
    .expect("a ranked elector on an outdated table still leads")
    .unwrap();
    let seen = elector.health().candidacy.expect("ranked");
    assert!(
        seen.error.as_deref().is_some_and(|e| e.contains(step)),
        "{seen:?}"
    );
    AddMemberRank::with_table(&members)
        .unwrap()
        .up(&SchemaManager::new(db))
        .await
        .unwrap();
    // The refusal was not remembered: the next heartbeats list the candidate.
    let listed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let view = elector.candidacy().unwrap();
            if view.error.is_none() && view.candidates.len() == 1 {
                return view;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the candidacy heartbeats once the step has run");
    assert_eq!(listed.candidates[0].candidate, "a");
    elector.shutdown().await;
    assert!(
        store.candidates(&resource).await.unwrap().is_empty(),
        "left on shutdown"
    );
    AddMemberRank::with_table(&members)
        .unwrap()
        .down(&SchemaManager::new(db))
        .await
        .unwrap();
    AddMemberHolding::with_table(&members)
        .unwrap()
        .down(&SchemaManager::new(db))
        .await
        .unwrap();
    CreateMemberTable::with_table(&members)
        .unwrap()
        .down(&SchemaManager::new(db))
        .await
        .unwrap();
}

/// A term begun by a process that writes no payload (an older version during a rolling
/// upgrade) never shows the payload an earlier term wrote: the payload counts only while its
/// term's token is the row's.
pub async fn a_term_that_wrote_no_payload_shows_none(h: &SqlHarness) {
    use orion_beacon::LeaseStore;
    use orion_beacon_entity::lease;
    use sea_orm::sea_query::{Alias, Expr, ExprTrait, Query};
    use sea_orm::{ConnectionTrait, FromQueryResult};
    let store = h.store_for_test();
    let r = unique("old_writer");
    store
        .acquire_or_renew_with(&r, "a", super::conformance::LONG, Some("a's"))
        .await
        .unwrap();
    // What an older version's upsert leaves: a new term, the payload columns untouched.
    let bump = Query::update()
        .table(Alias::new(h.table()))
        .value(lease::Column::Holder, "old")
        .value(
            lease::Column::FencingToken,
            Expr::col(lease::Column::FencingToken).add(1),
        )
        .and_where(Expr::col(lease::Column::Resource).eq(r.clone()))
        .to_owned();
    h.db().execute(&bump).await.unwrap();
    let rec = store.current(&r).await.unwrap().unwrap();
    assert_eq!((rec.holder.as_str(), rec.token.get()), ("old", 2));
    assert_eq!(
        rec.payload, None,
        "an earlier term's payload is never shown"
    );
    let denied = store
        .acquire_or_renew(&r, "b", super::conformance::LONG)
        .await
        .unwrap();
    assert_eq!(denied.token(), None);
    match denied {
        orion_beacon::store::LeaseOutcome::Denied(d) => assert_eq!(d.payload, None, "{d:?}"),
        other => panic!("expected a denial: {other:?}"),
    }
    // The entity reads the same rule.
    let select = Query::select()
        .column(sea_orm::sea_query::Asterisk)
        .from(Alias::new(h.table()))
        .and_where(Expr::col(lease::Column::Resource).eq(r.clone()))
        .to_owned();
    let row = lease::Model::find_by_statement(h.db().get_database_backend().build(&select))
        .one(h.db())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.payload.as_deref(), Some("a's"));
    assert_eq!(row.payload_token, Some(1));
    assert_eq!(row.current_payload(), None);
}

impl SqlHarness {
    fn store_for_test(&self) -> SeaOrmLeaseStore {
        <Self as Harness>::store(self)
    }
}

/// Tests specific to the SQL store, for a harness setup expression.
#[macro_export]
macro_rules! sql_store_suite {
    ($setup:expr) => {
        $crate::sql_store_suite!(@cases $setup;
            missing_table_says_run_the_migration,
            bad_table_names_are_refused,
            entity_reads_what_the_store_writes,
            a_table_from_an_earlier_version_is_refused_until_its_migration_runs,
            a_membership_table_from_an_earlier_version_is_refused_until_its_migration_runs,
            a_membership_table_without_the_rank_refuses_candidates_until_its_migration_runs,
            a_term_that_wrote_no_payload_shows_none,
            a_missing_rate_limit_table_is_named_and_bad_keys_send_nothing,
        );
    };
    (@cases $setup:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                #[allow(unused_imports)]
                use $crate::common::conformance::Harness as _;
                if let Some(h) = $setup.await {
                    $crate::common::sql::$case(&h).await;
                    h.teardown().await;
                }
            }
        )*
    };
}
