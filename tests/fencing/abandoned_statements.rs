//! Every statement the store sends on the application's pool (grants, releases, renews, batched
//! renews, membership writes, reads, the operator's revoke) runs on a connection known to be
//! outside any transaction, and no call of the store leaves a transaction open on a pooled
//! connection, even when it is cut off by a timeout.
//!
//! An abandoned transaction is made the way sqlx 0.9 leaves one after a future dropped during
//! `begin()`: on a pool of one connection, a `BEGIN` (and a write of its own, which must never
//! be committed by the store) is run on the pool's only connection, which then goes back to the
//! pool inside that transaction. Each test then runs one store call on that pool and checks, from
//! another connection, that what it reported is committed and that it left no lock behind.
//!
//! `cut_off_calls_leave_no_transaction_open_*` cut store calls off at random points with
//! `tokio::time::timeout` (seeded: the seed is printed, `ORION_BEACON_SEED` replays it), and
//! after each looks at the pool's only connection: not inside a transaction, and the pool not
//! wedged.

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod support {
    use std::time::Duration;

    use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseConnectionType};

    /// Whether the pool's connection (a pool of one: its only connection) is inside a
    /// transaction, asked without the technique the store uses: MariaDB's `@@in_transaction`;
    /// PostgreSQL's `transaction_timestamp()` read by two statements (the same value means one
    /// transaction); SQLite refuses a `BEGIN` inside one.
    /// `None` when no connection could be had within `wait` (a wedged pool).
    pub async fn in_transaction(db: &DatabaseConnection, wait: Duration) -> Option<bool> {
        match tokio::time::timeout(wait, ask(db)).await {
            Err(_) | Ok(Err(sea_orm::sqlx::Error::PoolTimedOut)) => None,
            Ok(Err(e)) => panic!("cannot ask the connection: {e}"),
            Ok(Ok(inside)) => Some(inside),
        }
    }

    async fn ask(db: &DatabaseConnection) -> Result<bool, sea_orm::sqlx::Error> {
        use sea_orm::sqlx;
        match &db.inner {
            #[cfg(feature = "mysql")]
            DatabaseConnectionType::SqlxMySqlPoolConnection(_) => {
                let mut conn = db.get_mysql_connection_pool().acquire().await?;
                let flag: i64 = sqlx::query_scalar("SELECT CAST(@@in_transaction AS SIGNED)")
                    .fetch_one(&mut *conn)
                    .await?;
                Ok(flag != 0)
            }
            #[cfg(feature = "postgres")]
            DatabaseConnectionType::SqlxPostgresPoolConnection(_) => {
                let mut conn = db.get_postgres_connection_pool().acquire().await?;
                let mut starts = Vec::new();
                for _ in 0..2 {
                    // Simple-protocol messages: a transaction-pooling PgBouncer may send the
                    // parse and the execution of an extended-protocol query to two servers.
                    let row = sqlx::raw_sql("SELECT transaction_timestamp()::text")
                        .fetch_one(&mut *conn)
                        .await?;
                    let start: String = sqlx::Row::try_get(&row, 0)?;
                    starts.push(start);
                }
                Ok(starts[0] == starts[1])
            }
            #[cfg(feature = "sqlite")]
            DatabaseConnectionType::SqlxSqlitePoolConnection(_) => {
                let mut conn = db.get_sqlite_connection_pool().acquire().await?;
                match sqlx::raw_sql("BEGIN").execute(&mut *conn).await {
                    Ok(_) => {
                        sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await?;
                        Ok(false)
                    }
                    Err(e) if e.to_string().contains("within a transaction") => Ok(true),
                    Err(e) => Err(e),
                }
            }
            _ => panic!("not a pool this test knows"),
        }
    }

    /// Ends the transaction the pool's connection is in (so that a randomized run can go on
    /// counting after a failure).
    pub async fn roll_back(db: &DatabaseConnection) {
        db.execute_unprepared("ROLLBACK").await.ok();
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
mod abandoned {
    use std::time::Duration;

    use orion_beacon::{
        store::LeaseOutcome, Lease, LeaseStore, MembershipStore, MySqlUpsert, SeaOrmLeaseStore,
    };
    use sea_orm::{ConnectionTrait, DatabaseConnection};

    use super::support::in_transaction;
    use crate::common::{connect_url, drop_table, member_table, migrate, unique, Server};

    const LEASE: Duration = Duration::from_secs(30);
    /// How long a rival may take to answer (it answers in milliseconds unless blocked).
    const ANSWER: Duration = Duration::from_secs(3);
    const R: &str = "job";
    const SET: &str = "workers";

    #[derive(Clone, Copy, Debug)]
    pub enum Target {
        #[cfg(feature = "postgres")]
        Postgres,
        /// PostgreSQL through a transaction-pooling PgBouncer, the store in its
        /// `with_transaction_pooling` mode.
        #[cfg(feature = "postgres")]
        Pgbouncer,
        #[cfg(feature = "mysql")]
        MariaDb(MySqlUpsert),
    }

    impl Target {
        fn server(self) -> Server {
            match self {
                #[cfg(feature = "postgres")]
                Target::Postgres | Target::Pgbouncer => Server::Postgres,
                #[cfg(feature = "mysql")]
                Target::MariaDb(_) => Server::MySql,
            }
        }
    }

    /// A pool of one (`db`, the store's) and a rival on a pool of its own, on one table.
    pub struct Setup {
        target: Target,
        pub admin: DatabaseConnection,
        pub db: DatabaseConnection,
        pub table: String,
        leak: String,
        pub store: SeaOrmLeaseStore,
        pub rival: SeaOrmLeaseStore,
    }

    impl Setup {
        pub async fn new(target: Target, prefix: &str) -> Option<Self> {
            if target.server().skipped() {
                return None;
            }
            let (admin, db) = match target {
                #[cfg(feature = "postgres")]
                Target::Pgbouncer => (
                    connect_url(&Server::Postgres.private_url(), 2).await,
                    connect_url(&crate::common::sql::pgbouncer().url(), 1).await,
                ),
                _ => (
                    target.server().connect(2).await,
                    target.server().connect(1).await,
                ),
            };
            let table = unique(prefix);
            migrate(&admin, &table).await;
            let leak = format!("{table}_leak");
            admin
                .execute_unprepared(&format!("CREATE TABLE {leak} (x INTEGER)"))
                .await
                .unwrap();
            let configure = |s: SeaOrmLeaseStore| {
                let s = s
                    .with_table(&table)
                    .and_then(|s| s.with_member_table(member_table(&table)))
                    .unwrap()
                    .with_release_notifications(false);
                match target {
                    #[cfg(feature = "mysql")]
                    Target::MariaDb(form) => s.with_mysql_upsert(form),
                    _ => s,
                }
            };
            // On the application's pool (not sessions of its own): the connection the
            // abandoned transaction is left on.
            let mut store = configure(SeaOrmLeaseStore::new(db.clone()))
                .with_lease_connections(0)
                .unwrap();
            #[cfg(feature = "postgres")]
            if let Target::Pgbouncer = target {
                store = store.with_transaction_pooling(true);
            }
            let rival = configure(SeaOrmLeaseStore::new(admin.clone()));
            Some(Self {
                target,
                admin,
                db,
                table,
                leak,
                store,
                rival,
            })
        }

        /// Leaves the pool's only connection inside a transaction that wrote a row of its own.
        /// With `snapshot`, the transaction has also read the lease table (its snapshot is
        /// fixed, as in a REPEATABLE READ transaction that read before it was abandoned).
        pub async fn abandon(&self, snapshot: bool) {
            let begin = match (self.target, snapshot) {
                #[cfg(feature = "postgres")]
                (Target::Postgres | Target::Pgbouncer, true) => {
                    "BEGIN ISOLATION LEVEL REPEATABLE READ"
                }
                #[cfg(feature = "mysql")]
                (Target::MariaDb(_), true) => "START TRANSACTION WITH CONSISTENT SNAPSHOT",
                _ => "BEGIN",
            };
            self.db.execute_unprepared(begin).await.unwrap();
            if snapshot {
                self.db
                    .execute_unprepared(&format!("SELECT COUNT(*) FROM {}", self.table))
                    .await
                    .unwrap();
            }
            self.db
                .execute_unprepared(&format!("INSERT INTO {} (x) VALUES (1)", self.leak))
                .await
                .unwrap();
            assert_eq!(
                in_transaction(&self.db, ANSWER).await,
                Some(true),
                "the test's own setup: the connection is inside a transaction"
            );
        }

        /// The pool's connection is back outside any transaction after `what`.
        pub async fn assert_clean(&self, what: &str) {
            assert_eq!(
                in_transaction(&self.db, Duration::from_secs(15)).await,
                Some(false),
                "{what}: the pool's connection is still inside the abandoned transaction (or the \
                 pool is wedged: None)"
            );
        }

        /// The rival's acquire of `R`, which must answer within [`ANSWER`] (not blocked by a
        /// row lock of the abandoned transaction).
        pub async fn rival_acquire(&self, candidate: &str, what: &str) -> LeaseOutcome {
            tokio::time::timeout(ANSWER, self.rival.acquire_or_renew(R, candidate, LEASE))
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "{what}: the rival's acquire got no answer in {ANSWER:?}: the lease row \
                         is locked by the abandoned transaction the store's statement joined"
                    )
                })
                .unwrap()
        }

        pub async fn rival_members(&self) -> Vec<String> {
            tokio::time::timeout(ANSWER, self.rival.members(SET))
                .await
                .expect("the rival's read answers")
                .unwrap()
                .into_iter()
                .map(|m| m.member)
                .collect()
        }

        /// Nobody committed the abandoned transaction's own write; drops the tables.
        pub async fn finish(self) {
            let leaked = self
                .admin
                .query_one_raw(sea_orm::Statement::from_string(
                    self.admin.get_database_backend(),
                    format!("SELECT COUNT(*) FROM {}", self.leak),
                ))
                .await
                .unwrap()
                .unwrap()
                .try_get_by_index::<i64>(0)
                .unwrap();
            assert_eq!(
                leaked, 0,
                "the store committed someone else's abandoned transaction"
            );
            // The pool of one is closed first: a transaction still open on it would hold
            // locks that the drops below wait for.
            self.db.close().await.ok();
            self.admin
                .execute_unprepared(&format!("DROP TABLE {}", self.leak))
                .await
                .unwrap();
            drop_table(&self.admin, &self.table).await;
        }

        pub async fn acquire_a(&self) -> Lease {
            match self.store.acquire_or_renew(R, "a", LEASE).await.unwrap() {
                LeaseOutcome::Acquired(l) => l,
                other => panic!("a's first acquire: {other:?}"),
            }
        }
    }

    fn token(out: &LeaseOutcome) -> Option<i64> {
        out.token().map(|t| t.get())
    }

    /// A grant on the abandoned connection (the MariaDB transaction form and PgBouncer's
    /// transaction included) commits on its own, and commits nothing else.
    pub async fn acquire(target: Target) {
        let Some(s) = Setup::new(target, "ab_acq").await else {
            return;
        };
        s.abandon(false).await;
        let a = s.store.acquire_or_renew(R, "a", LEASE).await.unwrap();
        assert_eq!(
            (matches!(a, LeaseOutcome::Acquired(_)), token(&a)),
            (true, Some(1)),
            "{a:?}"
        );
        let b = s.rival_acquire("b", "acquire").await;
        assert!(matches!(b, LeaseOutcome::Denied(_)), "{b:?}");
        s.assert_clean("acquire").await;
        s.finish().await;
    }

    async fn released(target: Target, by_lease: bool) {
        let what = if by_lease { "release_lease" } else { "release" };
        let Some(s) = Setup::new(target, "ab_rel").await else {
            return;
        };
        let lease = s.acquire_a().await;
        s.abandon(false).await;
        let released = if by_lease {
            s.store.release_lease(&lease).await.unwrap()
        } else {
            s.store.release(R, "a").await.unwrap()
        };
        assert!(released, "{what}: a held the lease");
        let b = s.rival_acquire("b", what).await;
        assert_eq!(
            (matches!(b, LeaseOutcome::Acquired(_)), token(&b)),
            (true, Some(2)),
            "{what} reported true, so the rival takes over with the next token: {b:?}"
        );
        s.assert_clean(what).await;
        let a = s.store.acquire_or_renew(R, "a", LEASE).await.unwrap();
        assert!(
            matches!(a, LeaseOutcome::Denied(_)),
            "{what}: after its release and b's acquire, a is denied: {a:?}"
        );
        s.finish().await;
    }

    pub async fn release(target: Target) {
        released(target, false).await;
    }

    pub async fn release_lease(target: Target) {
        released(target, true).await;
    }

    pub async fn renew_all(target: Target) {
        let Some(s) = Setup::new(target, "ab_ren").await else {
            return;
        };
        let lease = s.acquire_a().await;
        s.abandon(false).await;
        let renewals = s
            .store
            .renew_all(std::slice::from_ref(&lease), LEASE)
            .await
            .unwrap_or_else(|e| panic!("renew_all on the abandoned connection: {e:?}"));
        assert_eq!(
            (renewals.renewed.len(), renewals.lost.len()),
            (1, 0),
            "{renewals:?}"
        );
        let b = s.rival_acquire("b", "renew_all").await;
        assert!(matches!(b, LeaseOutcome::Denied(_)), "{b:?}");
        s.assert_clean("renew_all").await;
        // The renew committed: the row's expiry moved (the rival's read sees it).
        let row = s.rival.current(R).await.unwrap().unwrap();
        assert_eq!(row.expires_at, renewals.renewed[0].expires_at);
        s.finish().await;
    }

    pub async fn heartbeat(target: Target) {
        let Some(s) = Setup::new(target, "ab_hb").await else {
            return;
        };
        s.abandon(false).await;
        let members = s.store.heartbeat(SET, "m1", LEASE, false).await.unwrap();
        assert!(members.iter().any(|m| m.member == "m1"), "{members:?}");
        let seen = s.rival_members().await;
        assert_eq!(
            seen,
            ["m1"],
            "the heartbeat reported m1 as a member: it must be committed"
        );
        s.assert_clean("heartbeat").await;
        s.finish().await;
    }

    pub async fn leave(target: Target) {
        let Some(s) = Setup::new(target, "ab_leave").await else {
            return;
        };
        s.store.heartbeat(SET, "m1", LEASE, false).await.unwrap();
        s.abandon(false).await;
        assert!(s.store.leave(SET, "m1").await.unwrap(), "m1 was a member");
        assert!(
            s.rival_members().await.is_empty(),
            "leave reported true: m1 is gone"
        );
        s.assert_clean("leave").await;
        s.finish().await;
    }

    /// The operator's revoke (the CLI's `revoke` calls it) commits its tombstone and nothing of
    /// the abandoned transaction.
    pub async fn revoke(target: Target) {
        let Some(s) = Setup::new(target, "ab_rev").await else {
            return;
        };
        s.acquire_a().await;
        s.abandon(false).await;
        let before = s.store.revoke(R).await.unwrap().expect("a row");
        assert!(before.live && before.holder == "a", "{before:?}");
        let b = s.rival_acquire("b", "revoke").await;
        assert_eq!(
            (matches!(b, LeaseOutcome::Acquired(_)), token(&b)),
            (true, Some(2)),
            "{b:?}"
        );
        s.assert_clean("revoke").await;
        s.finish().await;
    }

    /// Reads on a connection inside an abandoned transaction whose snapshot predates a change:
    /// each read answers from the database as it is now, and leaves the connection clean.
    pub async fn reads(target: Target) {
        let Some(s) = Setup::new(target, "ab_read").await else {
            return;
        };
        s.acquire_a().await;
        s.store.heartbeat(SET, "m1", LEASE, false).await.unwrap();
        s.abandon(true).await;
        // Changed after the abandoned transaction's snapshot: the lease revoked, m1 gone.
        s.rival.revoke(R).await.unwrap();
        assert!(s.rival.leave(SET, "m1").await.unwrap());

        let current = s.store.current(R).await.unwrap().unwrap();
        assert!(
            !current.live,
            "current: read from a stale snapshot: {current:?}"
        );
        s.assert_clean("current").await;

        s.abandon(true).await;
        let all = s.store.current_all(&[R.to_owned()]).await.unwrap();
        assert!(
            all.len() == 1 && !all[0].live,
            "current_all: read from a stale snapshot: {all:?}"
        );
        s.assert_clean("current_all").await;

        s.abandon(true).await;
        let members = s.store.members(SET).await.unwrap();
        assert!(members.is_empty(), "members: stale: {members:?}");
        s.assert_clean("members").await;

        s.abandon(true).await;
        let list = s.store.list().await.unwrap();
        assert!(list.len() == 1 && !list[0].live, "list: stale: {list:?}");
        s.assert_clean("list").await;

        s.abandon(true).await;
        let listed = s.store.list_members().await.unwrap();
        assert!(listed.is_empty(), "list_members: stale: {listed:?}");
        s.assert_clean("list_members").await;
        s.finish().await;
    }

    /// PostgreSQL: the abandoned transaction has already failed (every statement in it is
    /// refused with `25P02`): the release is not refused, it runs on another connection.
    #[cfg(feature = "postgres")]
    pub async fn release_in_failed_transaction(target: Target) {
        let Some(s) = Setup::new(target, "ab_failed").await else {
            return;
        };
        s.acquire_a().await;
        s.abandon(false).await;
        assert!(s.db.execute_unprepared("SELECT 1/0").await.is_err());
        assert!(s.store.release(R, "a").await.unwrap(), "a held the lease");
        let b = s.rival_acquire("b", "release").await;
        assert_eq!(token(&b), Some(2), "{b:?}");
        s.assert_clean("release").await;
        s.finish().await;
    }

    /// PostgreSQL: a grant (acquire, and the batched renew) on a connection inside a failed
    /// abandoned transaction is tried on another connection, not reported as an error.
    #[cfg(feature = "postgres")]
    pub async fn grant_in_failed_transaction(target: Target) {
        let Some(s) = Setup::new(target, "ab_failed_grant").await else {
            return;
        };
        let a = s.acquire_a().await;
        s.abandon(false).await;
        assert!(s.db.execute_unprepared("SELECT 1/0").await.is_err());
        let renewed = s.store.acquire_or_renew(R, "a", LEASE).await;
        assert!(
            matches!(&renewed, Ok(LeaseOutcome::Renewed(l)) if l.token == a.token),
            "{renewed:?}"
        );
        s.assert_clean("acquire").await;
        s.abandon(false).await;
        assert!(s.db.execute_unprepared("SELECT 1/0").await.is_err());
        let all = s.store.renew_all(std::slice::from_ref(&a), LEASE).await;
        assert!(matches!(&all, Ok(r) if r.renewed.len() == 1), "{all:?}");
        s.assert_clean("renew_all").await;
        s.finish().await;
    }

    #[cfg(feature = "postgres")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn grant_in_failed_transaction_postgres() {
        grant_in_failed_transaction(Target::Postgres).await;
    }

    /// MariaDB with `completion_type = CHAIN`: the store's own transactions (the batched renew,
    /// the transaction form's upsert, revoke) end with a COMMIT that opens no next
    /// transaction, so the pooled connection goes back in autocommit and the application's next
    /// write commits.
    #[cfg(feature = "mysql")]
    pub async fn chained_commit(form: MySqlUpsert) {
        let Some(s) = Setup::new(Target::MariaDb(form), "ab_chain").await else {
            return;
        };
        let a = s.acquire_a().await;
        s.db.execute_unprepared("SET SESSION completion_type = 'CHAIN'")
            .await
            .unwrap();
        let all = s.store.renew_all(std::slice::from_ref(&a), LEASE).await;
        assert!(matches!(&all, Ok(r) if r.renewed.len() == 1), "{all:?}");
        assert_eq!(
            in_transaction(&s.db, ANSWER).await,
            Some(false),
            "renew_all handed the connection back inside a chained transaction"
        );
        let again = s.store.acquire_or_renew(R, "a", LEASE).await;
        assert!(matches!(&again, Ok(LeaseOutcome::Renewed(_))), "{again:?}");
        assert_eq!(
            in_transaction(&s.db, ANSWER).await,
            Some(false),
            "the upsert handed the connection back inside a chained transaction"
        );
        s.db.execute_unprepared("SET SESSION completion_type = 'NO_CHAIN'")
            .await
            .unwrap();
        s.finish().await;
    }

    #[cfg(feature = "mysql")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn chained_commit_mariadb_returning() {
        chained_commit(MySqlUpsert::Returning).await;
    }

    #[cfg(feature = "mysql")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn chained_commit_mariadb_transaction() {
        chained_commit(MySqlUpsert::Transaction).await;
    }

    #[cfg(feature = "postgres")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn release_in_failed_transaction_postgres() {
        release_in_failed_transaction(Target::Postgres).await;
    }

    #[cfg(feature = "postgres")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn release_in_failed_transaction_pgbouncer() {
        release_in_failed_transaction(Target::Pgbouncer).await;
    }

    macro_rules! on_target {
        ($module:ident, $target:expr, $cfg:meta) => {
            #[$cfg]
            mod $module {
                #[allow(unused_imports)]
                use orion_beacon::MySqlUpsert;

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn acquire() {
                    super::acquire($target).await;
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn release() {
                    super::release($target).await;
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn release_lease() {
                    super::release_lease($target).await;
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn renew_all() {
                    super::renew_all($target).await;
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn heartbeat() {
                    super::heartbeat($target).await;
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn leave() {
                    super::leave($target).await;
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn revoke() {
                    super::revoke($target).await;
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn reads() {
                    super::reads($target).await;
                }
            }
        };
    }

    on_target!(postgres, super::Target::Postgres, cfg(feature = "postgres"));
    on_target!(
        pgbouncer,
        super::Target::Pgbouncer,
        cfg(feature = "postgres")
    );
    on_target!(
        mariadb_returning,
        super::Target::MariaDb(MySqlUpsert::Returning),
        cfg(feature = "mysql")
    );
    on_target!(
        mariadb_transaction,
        super::Target::MariaDb(MySqlUpsert::Transaction),
        cfg(feature = "mysql")
    );
}

/// Store calls cut off at random points: afterwards the pool's only connection is outside any
/// transaction and the pool answers.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod cut_off {
    use std::time::Duration;

    use orion_beacon::{Lease, LeaseStore, MembershipStore, SeaOrmLeaseStore};
    use sea_orm::DatabaseConnection;

    use super::support::{in_transaction, roll_back};
    use crate::common::{member_table, migrate, Rng};

    const LEASE: Duration = Duration::from_secs(30);
    const CASES: usize = 600;
    const OPS: [&str; 11] = [
        "acquire",
        "release",
        "release_lease",
        "renew_all",
        "heartbeat",
        "leave",
        "current",
        "current_all",
        "members",
        "revoke",
        "list",
    ];

    /// `call`, dropped at the first poll after `deadline` if it has not finished by then.
    async fn cut_at<T>(
        deadline: std::time::Instant,
        call: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        let mut call = std::pin::pin!(call);
        std::future::poll_fn(|cx| {
            if let std::task::Poll::Ready(out) = call.as_mut().poll(cx) {
                return std::task::Poll::Ready(Some(out));
            }
            if std::time::Instant::now() >= deadline {
                return std::task::Poll::Ready(None);
            }
            // Polled again at once (after the runtime's other work): a busy wait.
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        })
        .await
    }

    fn seed() -> u64 {
        std::env::var("ORION_BEACON_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(Rng::seed_from_time)
    }

    /// `CASES` store calls on `db` (a pool of one), each cut off after a random time; after
    /// each the connection must be outside any transaction and the pool must answer.
    ///
    /// With `own`, the store runs on one session of its own instead (`with_lease_connections(1)`),
    /// which the test cannot ask directly: after each case the store grants a new resource on
    /// it, and another store must see that grant committed at once (a session handed back
    /// inside a transaction, or mid-answer, would hold it uncommitted or fail).
    pub async fn run(
        name: &str,
        db: DatabaseConnection,
        migrate_on: &DatabaseConnection,
        own: bool,
    ) {
        let seed = seed();
        eprintln!("{name}: seed {seed}");
        let mut rng = Rng::new(seed);
        let table = crate::common::unique("cut");
        migrate(migrate_on, &table).await;
        let store = SeaOrmLeaseStore::new(db.clone())
            .with_table(&table)
            .and_then(|s| s.with_member_table(member_table(&table)))
            .unwrap()
            .with_release_notifications(false)
            .with_lease_connections(usize::from(own))
            .unwrap();
        let store = configure(name, store);
        let probe_reader = SeaOrmLeaseStore::new(migrate_on.clone())
            .with_table(&table)
            .and_then(|s| s.with_member_table(member_table(&table)))
            .unwrap()
            .with_release_notifications(false);
        let resources: Vec<String> = (0..3).map(|i| format!("r{i}")).collect();
        let mut held: Vec<Lease> = Vec::new();
        let (mut cut, mut left_open, mut wedged) = (0, Vec::new(), Vec::new());
        let mut longest_seen = [Duration::from_millis(3); OPS.len()];
        for case in 0..CASES {
            let op_index = rng.below(OPS.len() as u64) as usize;
            let op = OPS[op_index];
            let r = resources[rng.below(resources.len() as u64) as usize].clone();
            // Within the call's own time (the longest seen for this operation so far, a bit
            // more), where its round trips are; now and then much later.
            let longest = longest_seen[op_index].max(Duration::from_micros(200));
            let after = if rng.below(8) == 0 {
                Duration::from_micros(rng.below(20_000))
            } else {
                Duration::from_micros(rng.below(longest.as_micros() as u64 * 3 / 2 + 1))
            };
            // tokio's timer fires on whole milliseconds; half the cut-offs use it, half a
            // deadline checked at every poll (to the microsecond).
            let precise = rng.below(2) == 0;
            let call = async {
                match op {
                    "acquire" => match store.acquire_or_renew(&r, "a", LEASE).await {
                        Ok(out) => out.lease().cloned(),
                        Err(_) => None,
                    },
                    "release" => store.release(&r, "a").await.map(|_| None).unwrap_or(None),
                    "release_lease" => match held.iter().find(|l| l.resource == r) {
                        Some(l) => store.release_lease(l).await.map(|_| None).unwrap_or(None),
                        None => None,
                    },
                    "renew_all" => store
                        .renew_all(&held, LEASE)
                        .await
                        .map(|_| None)
                        .unwrap_or(None),
                    "heartbeat" => store
                        .heartbeat("set", "a", LEASE, false)
                        .await
                        .map(|_| None)
                        .unwrap_or(None),
                    "leave" => store.leave("set", "a").await.map(|_| None).unwrap_or(None),
                    "current" => store.current(&r).await.map(|_| None).unwrap_or(None),
                    "current_all" => store
                        .current_all(&resources)
                        .await
                        .map(|_| None)
                        .unwrap_or(None),
                    "members" => store.members("set").await.map(|_| None).unwrap_or(None),
                    "revoke" => store.revoke(&r).await.map(|_| None).unwrap_or(None),
                    _ => store.list().await.map(|_| None).unwrap_or(None),
                }
            };
            let started = std::time::Instant::now();
            let outcome = if precise {
                cut_at(started + after, call).await
            } else {
                tokio::time::timeout(after, call).await.ok()
            };
            if outcome.is_some() {
                longest_seen[op_index] = longest_seen[op_index].max(started.elapsed());
            }
            match outcome {
                Some(Some(lease)) => {
                    held.retain(|l| l.resource != lease.resource);
                    held.push(lease);
                }
                Some(None) => {}
                None => cut += 1,
            }
            if own {
                let probe = format!("probe{case}");
                let wait = Duration::from_secs(15);
                let granted =
                    tokio::time::timeout(wait, store.acquire_or_renew(&probe, "a", LEASE))
                        .await
                        .map(|out| out.map(|o| o.lease().is_some()));
                let seen = tokio::time::timeout(wait, probe_reader.current(&probe))
                    .await
                    .map(|row| row.map(|r| r.is_some_and(|r| r.live && r.holder == "a")));
                // A membership write too: on MariaDB the grant's own `@@in_transaction`
                // column would catch a session handed back inside a transaction (and retry on
                // another); a heartbeat is sent with no check at all.
                let member = format!("p{case}");
                let beat =
                    tokio::time::timeout(wait, store.heartbeat("probe", &member, LEASE, false))
                        .await
                        .map(|out| out.map(|_| true));
                let listed = tokio::time::timeout(wait, probe_reader.members("probe"))
                    .await
                    .map(|m| m.map(|m| m.iter().any(|m| m.member == member)));
                match (granted, seen, beat, listed) {
                    (Ok(Ok(true)), Ok(Ok(true)), Ok(Ok(true)), Ok(Ok(true))) => {}
                    (Err(_), _, _, _)
                    | (_, Err(_), _, _)
                    | (_, _, Err(_), _)
                    | (_, _, _, Err(_)) => {
                        wedged.push(format!(
                            "case {case}: {op} cut off after {after:?}; the probe got no answer in 15 s"
                        ));
                        break;
                    }
                    other => left_open.push(format!(
                        "case {case}: {op} cut off after {after:?}; probe granted, seen, beat \
                         and listed: {other:?}"
                    )),
                }
                continue;
            }
            match in_transaction(&db, Duration::from_secs(15)).await {
                Some(false) => {}
                Some(true) => {
                    left_open.push(format!("case {case}: {op} cut off after {after:?}"));
                    roll_back(&db).await;
                }
                None => {
                    // Nothing later can be told apart from this: stop here.
                    wedged.push(format!(
                        "case {case}: {op} cut off after {after:?}; no connection within 15 s"
                    ));
                    break;
                }
            }
        }
        eprintln!(
            "{name}: {CASES} calls, {cut} cut off; {} left a transaction open, {} wedged the pool",
            left_open.len(),
            wedged.len()
        );
        assert!(
            left_open.is_empty() && wedged.is_empty(),
            "{name} (seed {seed}): {} of {CASES} calls ({cut} cut off) left the pooled connection \
             inside a transaction: {left_open:#?}\nand {} wedged the pool of one: {wedged:#?}",
            left_open.len(),
            wedged.len()
        );
        crate::common::drop_table(migrate_on, &table).await;
    }

    /// A job's fenced transaction (`JobRun::begin`) cut off at random points, inside a run on
    /// `db` (a pool of one, which the scheduler's own transactions also use): after each, the
    /// pooled connection is outside any transaction.
    #[cfg(feature = "jobs")]
    pub async fn job_begins(name: &str, db: DatabaseConnection, migrate_on: &DatabaseConnection) {
        use orion_beacon::jobs::{Job, Jobs, Schedule};
        use orion_beacon_migration::{CreateJobRunTable, MigrationTrait, SchemaManager};
        const BEGINS: usize = 300;
        let seed = seed();
        eprintln!("{name}: seed {seed}");
        let table = crate::common::unique("cutjob");
        migrate(migrate_on, &table).await;
        let runs = crate::common::unique("cutruns");
        CreateJobRunTable::with_table(&runs)
            .unwrap()
            .up(&SchemaManager::new(migrate_on))
            .await
            .unwrap();
        let store = SeaOrmLeaseStore::new(db.clone())
            .with_table(&table)
            .unwrap()
            .with_release_notifications(false);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let probe = db.clone();
        let job = Job::new(
            "cut",
            Schedule::every(Duration::from_secs(3600)).unwrap(),
            move |run| {
                let (tx, db) = (tx.clone(), probe.clone());
                async move {
                    let mut rng = Rng::new(seed);
                    let (mut cut, mut left_open) = (0, Vec::new());
                    let mut longest = Duration::from_micros(500);
                    for case in 0..BEGINS {
                        let after = Duration::from_micros(
                            rng.below(longest.as_micros() as u64 * 3 / 2 + 1),
                        );
                        let started = std::time::Instant::now();
                        match cut_at(started + after, run.begin()).await {
                            Some(txn) => {
                                longest = longest.max(started.elapsed());
                                drop(txn);
                            }
                            None => cut += 1,
                        }
                        match in_transaction(&db, Duration::from_secs(15)).await {
                            Some(false) => {}
                            Some(true) => {
                                left_open.push(format!("case {case}: cut off after {after:?}"));
                                roll_back(&db).await;
                            }
                            None => {
                                left_open.push(format!("case {case}: the pool is wedged"));
                                break;
                            }
                        }
                    }
                    let _ = tx.send((cut, left_open));
                    Ok(())
                }
            },
        )
        // The hour's slot runs at once, however far into the hour.
        .starting_deadline(Duration::from_secs(7200));
        let node = Jobs::builder(store)
            .candidate_id("a")
            .resource(crate::common::unique("cutjobs"))
            .runs_table(&runs)
            .job(job)
            .build()
            .unwrap()
            .start();
        let (cut, left_open) = tokio::time::timeout(Duration::from_secs(120), rx.recv())
            .await
            .expect("the run reports within 120 s")
            .expect("the run reports");
        node.abort().await;
        eprintln!(
            "{name}: {BEGINS} begins, {cut} cut off; {} left a transaction open",
            left_open.len()
        );
        assert!(cut > 0, "{name}: nothing was cut off");
        assert!(
            left_open.is_empty(),
            "{name} (seed {seed}): {} of {BEGINS} job begins ({cut} cut off) left the pooled \
             connection inside a transaction: {left_open:#?}",
            left_open.len()
        );
        crate::common::drop_table(migrate_on, &table).await;
    }

    #[cfg(all(feature = "postgres", feature = "jobs"))]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cut_off_job_begins_leave_no_transaction_open_postgres() {
        use crate::common::Server;
        if Server::Postgres.skipped() {
            return;
        }
        let db = Server::Postgres.connect(1).await;
        let admin = Server::Postgres.connect(2).await;
        job_begins("postgres", db, &admin).await;
    }

    #[cfg(all(feature = "mysql", feature = "jobs"))]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cut_off_job_begins_leave_no_transaction_open_mariadb() {
        use crate::common::Server;
        if Server::MySql.skipped() {
            return;
        }
        let db = Server::MySql.connect(1).await;
        let admin = Server::MySql.connect(2).await;
        job_begins("mariadb", db, &admin).await;
    }

    #[cfg(all(feature = "sqlite", feature = "jobs"))]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cut_off_job_begins_leave_no_transaction_open_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.db");
        let db = crate::common::connect_sqlite(&path, 1).await;
        job_begins("sqlite", db.clone(), &db).await;
    }

    #[cfg(all(feature = "sqlite", feature = "jobs"))]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cut_off_job_begins_leave_no_transaction_open_sqlite_rollback_journal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.db");
        let db =
            crate::common::sql::connect_sqlite_rollback_journal(&path, 1, Duration::from_secs(5))
                .await;
        job_begins("sqlite_rollback_journal", db.clone(), &db).await;
    }

    fn configure(name: &str, store: SeaOrmLeaseStore) -> SeaOrmLeaseStore {
        #[cfg(feature = "postgres")]
        if name == "pgbouncer" {
            return store.with_transaction_pooling(true);
        }
        #[cfg(feature = "mysql")]
        if name == "mariadb_transaction" {
            return store.with_mysql_upsert(orion_beacon::MySqlUpsert::Transaction);
        }
        #[cfg(feature = "mysql")]
        if name == "mariadb_returning" {
            return store.with_mysql_upsert(orion_beacon::MySqlUpsert::Returning);
        }
        let _ = name;
        store
    }

    #[cfg(feature = "postgres")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cut_off_calls_leave_no_transaction_open_postgres() {
        use crate::common::Server;
        if Server::Postgres.skipped() {
            return;
        }
        let db = Server::Postgres.connect(1).await;
        let admin = Server::Postgres.connect(2).await;
        run("postgres", db, &admin, false).await;
    }

    #[cfg(feature = "postgres")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cut_off_calls_leave_no_transaction_open_pgbouncer() {
        use crate::common::{connect_url, Server};
        if Server::Postgres.skipped() {
            return;
        }
        let admin = connect_url(&Server::Postgres.private_url(), 2).await;
        let db = connect_url(&crate::common::sql::pgbouncer().url(), 1).await;
        run("pgbouncer", db, &admin, false).await;
    }

    #[cfg(feature = "mysql")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cut_off_calls_leave_no_transaction_open_mariadb_returning() {
        use crate::common::Server;
        if Server::MySql.skipped() {
            return;
        }
        let db = Server::MySql.connect(1).await;
        let admin = Server::MySql.connect(2).await;
        run("mariadb_returning", db, &admin, false).await;
    }

    #[cfg(feature = "mysql")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cut_off_calls_leave_no_transaction_open_mariadb_transaction() {
        use crate::common::Server;
        if Server::MySql.skipped() {
            return;
        }
        let db = Server::MySql.connect(1).await;
        let admin = Server::MySql.connect(2).await;
        run("mariadb_transaction", db, &admin, false).await;
    }

    /// The store's own session (one): a call cut off anywhere never hands it back inside a
    /// transaction or mid-answer.
    #[cfg(feature = "postgres")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cut_off_calls_leave_no_transaction_open_postgres_own_session() {
        use crate::common::Server;
        if Server::Postgres.skipped() {
            return;
        }
        let db = Server::Postgres.connect(1).await;
        let admin = Server::Postgres.connect(2).await;
        run("postgres", db, &admin, true).await;
    }

    #[cfg(feature = "mysql")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cut_off_calls_leave_no_transaction_open_mariadb_own_session() {
        use crate::common::Server;
        if Server::MySql.skipped() {
            return;
        }
        let db = Server::MySql.connect(1).await;
        let admin = Server::MySql.connect(2).await;
        run("mariadb_transaction", db, &admin, true).await;
    }

    /// SQLite needs no check of its own (sqlx's SQLite driver rolls back a cancelled `BEGIN`,
    /// and the store opens no transaction but the revoke's): this shows it.
    #[cfg(feature = "sqlite")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cut_off_calls_leave_no_transaction_open_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.db");
        let db = crate::common::connect_sqlite(&path, 1).await;
        run("sqlite", db.clone(), &db, false).await;
    }
}
