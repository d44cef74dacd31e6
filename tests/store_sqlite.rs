//! The store contract on SQLite (a file, several connection pools), in WAL mode (what
//! `backend::sqlite::connect_options` sets up) and in rollback-journal mode (SQLite's own
//! default, where a commit waits for every reader).
#![cfg(feature = "sqlite")]

mod common;

use common::sql::SqlHarness;

conformance_suite!(SqlHarness::sqlite());

sql_store_suite!(SqlHarness::sqlite());

shard_suite!(SqlHarness::sqlite());

mod rollback_journal {
    use super::*;
    conformance_suite!(SqlHarness::sqlite_rollback_journal());
    sql_store_suite!(SqlHarness::sqlite_rollback_journal());
    shard_suite!(SqlHarness::sqlite_rollback_journal());
}

/// A file in SQLite's rollback-journal mode gets one warning per store (commits wait for
/// readers there); a file in WAL mode gets none.
#[cfg(feature = "cli")] // tracing-subscriber, to read the warnings
#[tokio::test(flavor = "current_thread")]
async fn rollback_journal_is_warned_about_once() {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use orion_beacon::{LeaseStore, SeaOrmLeaseStore};

    #[derive(Clone, Default)]
    struct Logs(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Logs {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let warned = || {
        String::from_utf8_lossy(&logs.0.lock().unwrap())
            .matches("rollback-journal mode")
            .count()
    };

    let dir = tempfile::tempdir().unwrap();
    let rollback = common::sql::connect_sqlite_rollback_journal(
        &dir.path().join("rollback.db"),
        2,
        Duration::from_secs(1),
    )
    .await;
    common::migrate(&rollback, orion_beacon::entity::DEFAULT_TABLE).await;
    let store = SeaOrmLeaseStore::new(rollback);
    for _ in 0..3 {
        store
            .acquire_or_renew("r", "a", Duration::from_secs(5))
            .await
            .unwrap();
    }
    assert_eq!(warned(), 1, "one warning per store");

    let wal = common::connect_sqlite(&dir.path().join("wal.db"), 2).await;
    common::migrate(&wal, orion_beacon::entity::DEFAULT_TABLE).await;
    SeaOrmLeaseStore::new(wal)
        .acquire_or_renew("r", "a", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(warned(), 1, "no warning for WAL");
}

/// The store names its table and hands out the connection it was built on.
#[tokio::test]
async fn accessors_report_the_table_and_connection() {
    use orion_beacon::SeaOrmLeaseStore;
    use sea_orm::DbBackend;
    let dir = tempfile::tempdir().unwrap();
    let db = common::connect_sqlite(&dir.path().join("a.db"), 1).await;
    let store = SeaOrmLeaseStore::new(db);
    assert_eq!(store.table(), "orionbeacon_leases");
    let store = store.with_table("shard_leases").unwrap();
    assert_eq!(store.table(), "shard_leases");
    assert_eq!(store.connection().get_database_backend(), DbBackend::Sqlite);
    assert!(store.connection().ping().await.is_ok());
}
