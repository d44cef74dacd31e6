//! No outcome is reported for a statement whose effect did not commit, and the MariaDB upsert
//! gives the same row under any `sql_mode`: the configurations where a store once reported
//! grants that were not there.

#[cfg(feature = "sqlite")]
mod sqlite_rollback_journal {
    use std::time::Duration;

    use orion_beacon::{store::LeaseOutcome, LeaseStore, SeaOrmLeaseStore, StoreError};
    use sea_orm::{ConnectionTrait, TransactionTrait};
    use tokio::sync::oneshot;

    use crate::common::sql::connect_sqlite_rollback_journal;
    use crate::common::{migrate, unique};

    const LEASE: Duration = Duration::from_secs(1);
    const BUSY: Duration = Duration::from_millis(300);
    /// Longer than every attempt of the store together (3 x the busy timeout, plus back-off).
    const HOLD: Duration = Duration::from_millis(1500);

    /// Holds a read transaction (SQLite's SHARED lock) on `db` for `HOLD`; returns once the
    /// lock is held, and the task that ends it.
    async fn hold_read_lock(
        db: &sea_orm::DatabaseConnection,
        table: &str,
    ) -> tokio::task::JoinHandle<()> {
        let db = db.clone();
        let select = format!("SELECT COUNT(*) FROM \"{table}\"");
        let (held_tx, held_rx) = oneshot::channel();
        let task = tokio::spawn(async move {
            let txn = db.begin().await.unwrap();
            txn.query_all_raw(sea_orm::Statement::from_string(
                txn.get_database_backend(),
                select,
            ))
            .await
            .unwrap();
            held_tx.send(()).unwrap();
            tokio::time::sleep(HOLD).await;
            txn.commit().await.unwrap();
        });
        held_rx.await.unwrap();
        task
    }

    fn assert_retryable(result: Result<LeaseOutcome, StoreError>, what: &str) {
        match result {
            Err(err) => assert!(
                err.is_retryable(),
                "{what}: a busy commit is a retryable conflict, got {err:?}"
            ),
            Ok(out) => panic!(
                "{what}: the statement could not commit while a reader held the file, yet the \
                 store answered {out:?}"
            ),
        }
    }

    /// A renew, and then an acquire, whose commit cannot get the write lock past the busy
    /// timeout: the statement is rolled back, so neither may be reported as granted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn busy_commit_is_never_a_grant() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.db");
        let db = connect_sqlite_rollback_journal(&path, 4, BUSY).await;
        let table = unique("phantom");
        migrate(&db, &table).await;
        let reader = connect_sqlite_rollback_journal(&path, 1, BUSY).await;
        let store = SeaOrmLeaseStore::new(db.clone())
            .with_table(&table)
            .unwrap();
        let r = "job";

        let first = store.acquire_or_renew(r, "a", LEASE).await.unwrap();
        assert!(matches!(first, LeaseOutcome::Acquired(ref l) if l.token.get() == 1));
        let before = store.current(r).await.unwrap().unwrap();

        // A renew across a long reader: rolled back, so not `Renewed`.
        let held = hold_read_lock(&reader, &table).await;
        assert_retryable(store.acquire_or_renew(r, "a", LEASE).await, "renew");
        held.await.unwrap();
        let after = store.current(r).await.unwrap().unwrap();
        assert_eq!(
            after.expires_at, before.expires_at,
            "the failed renew moved nothing"
        );

        // The lease has run out; an acquire across a long reader: not `Acquired`.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!store.current(r).await.unwrap().unwrap().live);
        let held = hold_read_lock(&reader, &table).await;
        assert_retryable(store.acquire_or_renew(r, "b", LEASE).await, "acquire");
        held.await.unwrap();
        let row = store.current(r).await.unwrap().unwrap();
        assert_eq!((row.holder.as_str(), row.token.get()), ("a", 1));

        // Without the reader: one new term, token 2, and nobody else gets it.
        let b = store.acquire_or_renew(r, "b", LEASE).await.unwrap();
        assert!(
            matches!(b, LeaseOutcome::Acquired(ref l) if l.token.get() == 2),
            "{b:?}"
        );
        let c = store.acquire_or_renew(r, "c", LEASE).await.unwrap();
        assert!(matches!(c, LeaseOutcome::Denied(_)), "{c:?}");
    }
}

#[cfg(feature = "mysql")]
mod mariadb_sql_mode {
    use std::time::Duration;

    use orion_beacon::{store::LeaseOutcome, LeaseStore, MySqlUpsert, SeaOrmLeaseStore};

    use crate::common::sql::connect_mysql_with_session;
    use crate::common::{drop_table, migrate, unique, Server};

    const SIMULTANEOUS_ASSIGNMENT: &str =
        "SET SESSION sql_mode = CONCAT(@@sql_mode, ',SIMULTANEOUS_ASSIGNMENT')";

    /// With `SIMULTANEOUS_ASSIGNMENT` every assignment reads the old row; a takeover must
    /// still write the new expiry, or the next candidate takes the "new" lease at once.
    async fn takeover_writes_a_live_lease(form: MySqlUpsert) {
        if Server::MySql.skipped() {
            return;
        }
        let db = connect_mysql_with_session(4, SIMULTANEOUS_ASSIGNMENT).await;
        let table = unique("sqlmode");
        migrate(&db, &table).await;
        // On the application's sessions, where the mode is set (the store's own sessions take
        // the server's global `sql_mode`, not the pool's `after_connect`).
        let store = SeaOrmLeaseStore::new(db.clone())
            .with_table(&table)
            .unwrap()
            .with_mysql_upsert(form)
            .with_lease_connections(0)
            .unwrap();
        let lease = Duration::from_millis(500);

        let a = store.acquire_or_renew("job", "a", lease).await.unwrap();
        assert!(matches!(a, LeaseOutcome::Acquired(ref l) if l.token.get() == 1));
        // A renew extends (the assignments agree in both evaluation orders). The transaction
        // form reads the row in a second statement, a moment later: allow for that.
        let full = lease - Duration::from_millis(100);
        let a = store.acquire_or_renew("job", "a", lease).await.unwrap();
        assert!(
            matches!(a, LeaseOutcome::Renewed(ref l) if l.token.get() == 1 && l.remaining >= full),
            "{a:?}"
        );
        tokio::time::sleep(Duration::from_millis(600)).await;
        let b = store.acquire_or_renew("job", "b", lease).await.unwrap();
        match &b {
            LeaseOutcome::Acquired(l) => {
                assert_eq!(l.token.get(), 2);
                assert!(l.remaining >= full, "a full lease: {l:?}");
            }
            other => panic!("b takes over the expired lease: {other:?}"),
        }
        let row = store.current("job").await.unwrap().unwrap();
        assert!(
            row.live && row.holder == "b",
            "the stored lease is b's and live: {row:?}"
        );
        let c = store.acquire_or_renew("job", "c", lease).await.unwrap();
        assert!(
            matches!(c, LeaseOutcome::Denied(ref d) if d.holder.as_deref() == Some("b")),
            "c must be denied while b's lease is live: {c:?}"
        );
        drop_table(&db, &table).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn simultaneous_assignment_returning_form() {
        takeover_writes_a_live_lease(MySqlUpsert::Returning).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn simultaneous_assignment_transaction_form() {
        takeover_writes_a_live_lease(MySqlUpsert::Transaction).await;
    }
}

/// A pooled connection left inside a transaction nobody finished (sqlx 0.9 does that when a
/// future is dropped during `begin()`; a raw `BEGIN` does the same): the store's statement must
/// not join that transaction and report a grant that never commits.
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod abandoned_transaction {
    use std::time::Duration;

    use orion_beacon::{store::LeaseOutcome, LeaseStore, SeaOrmLeaseStore};
    use sea_orm::ConnectionTrait;

    use crate::common::{drop_table, migrate, unique, Server};

    /// `lease_connections`: the store's own sessions (the default, 4), where the abandoned
    /// connection is never used, or 0, where the store takes the application's connection and
    /// must find the transaction on it.
    async fn grant_is_committed(server: Server, lease_connections: usize) {
        if server.skipped() {
            return;
        }
        let admin = server.connect(2).await;
        let table = unique("abandoned");
        migrate(&admin, &table).await;
        // One connection, left inside an open transaction that wrote something of its own.
        let leak = format!("{table}_leak");
        admin
            .execute_unprepared(&format!("CREATE TABLE {leak} (x INTEGER)"))
            .await
            .unwrap();
        let db = server.connect(1).await;
        db.execute_unprepared("BEGIN").await.unwrap();
        db.execute_unprepared(&format!("INSERT INTO {leak} (x) VALUES (1)"))
            .await
            .unwrap();
        let store = SeaOrmLeaseStore::new(db.clone())
            .with_table(&table)
            .unwrap()
            .with_release_notifications(false)
            .with_lease_connections(lease_connections)
            .unwrap();
        let out = store
            .acquire_or_renew("job", "a", Duration::from_secs(30))
            .await
            .unwrap();
        assert!(
            matches!(out, LeaseOutcome::Acquired(ref l) if l.token.get() == 1),
            "{out:?}"
        );
        // Committed: another connection sees it, without waiting for anybody's lock.
        let other = SeaOrmLeaseStore::new(admin.clone())
            .with_table(&table)
            .unwrap();
        let row = tokio::time::timeout(Duration::from_secs(5), other.current("job"))
            .await
            .expect("the lease row is not locked by an abandoned transaction")
            .unwrap();
        assert!(
            matches!(row, Some(ref r) if r.live && r.holder == "a"),
            "the reported grant is not in the table: {row:?}"
        );
        let b = tokio::time::timeout(
            Duration::from_secs(5),
            other.acquire_or_renew("job", "b", Duration::from_secs(30)),
        )
        .await
        .expect("not blocked")
        .unwrap();
        assert!(matches!(b, LeaseOutcome::Denied(_)), "{b:?}");
        // The abandoned transaction's own write was never committed by the store's statement.
        let leaked = admin
            .query_one_raw(sea_orm::Statement::from_string(
                admin.get_database_backend(),
                format!("SELECT COUNT(*) FROM {leak}"),
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
        // The pool of one is closed first: on its own sessions the store never touched the
        // abandoned transaction, whose lock on the leak table the drop would wait for.
        db.close().await.ok();
        admin
            .execute_unprepared(&format!("DROP TABLE {leak}"))
            .await
            .unwrap();
        drop_table(&admin, &table).await;
    }

    #[cfg(feature = "postgres")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        grant_is_committed(Server::Postgres, 0).await;
    }

    #[cfg(feature = "postgres")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_own_sessions() {
        grant_is_committed(Server::Postgres, 4).await;
    }

    /// An abandoned transaction that is already aborted (every statement fails with 25P02):
    /// the connection is closed, not handed on, and the call is tried on another (it grants);
    /// the application's own queries work again too.
    #[cfg(feature = "postgres")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_aborted_transaction_is_not_handed_on() {
        if Server::Postgres.skipped() {
            return;
        }
        let admin = Server::Postgres.connect(2).await;
        let table = unique("aborted");
        migrate(&admin, &table).await;
        let db = Server::Postgres.connect(1).await;
        db.execute_unprepared("BEGIN").await.unwrap();
        assert!(db.execute_unprepared("SELECT 1/0").await.is_err());
        let store = SeaOrmLeaseStore::new(db.clone())
            .with_table(&table)
            .unwrap()
            .with_release_notifications(false)
            .with_lease_connections(0)
            .unwrap();
        let lease = Duration::from_secs(30);
        let first = store.acquire_or_renew("job", "a", lease).await.unwrap();
        assert!(
            matches!(first, LeaseOutcome::Acquired(ref l) if l.token.get() == 1),
            "inside an aborted transaction: {first:?}"
        );
        let second = store.acquire_or_renew("job", "a", lease).await.unwrap();
        assert!(
            matches!(second, LeaseOutcome::Renewed(ref l) if l.token.get() == 1),
            "{second:?}"
        );
        db.execute_unprepared("SELECT 1")
            .await
            .expect("the pool's connection is usable again");
        drop_table(&admin, &table).await;
    }

    #[cfg(feature = "mysql")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mariadb() {
        grant_is_committed(Server::MySql, 0).await;
    }

    #[cfg(feature = "mysql")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mariadb_own_sessions() {
        grant_is_committed(Server::MySql, 4).await;
    }
}
