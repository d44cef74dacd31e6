//! An elector on a connection pool of ONE connection becomes leader and keeps its lease: the
//! store never keeps a pooled connection for itself (PostgreSQL's release listener has a
//! connection of its own).

use crate::common;

use std::time::Duration;

use orion_beacon::{Elector, SeaOrmLeaseStore};
use sea_orm::DatabaseConnection;
use tokio::time::Instant;

use common::unique;

const LEASE: Duration = Duration::from_millis(600);

/// Elected within a few retries, then leader without a break for ten leases.
async fn leads_for_ten_leases(db: DatabaseConnection, table: &str) {
    leads_for(db, table, LEASE, 10).await;
}

/// Elected within a few retries, then leader without a break for `leases` leases of `lease`.
async fn leads_for(db: DatabaseConnection, table: &str, lease: Duration, leases: u32) {
    let store = SeaOrmLeaseStore::new(db).with_table(table).unwrap();
    let handle = Elector::builder(store)
        .resource(unique("small-pool"))
        .candidate_id("only")
        .lease_duration(lease)
        .renew_interval(lease / 4)
        .retry_interval(lease / 6)
        .build()
        .unwrap()
        .start();
    let mut rx = handle.watch();
    let term = tokio::time::timeout(Duration::from_secs(5), rx.wait_for(|s| s.is_leader()))
        .await
        .expect("elected on a pool of one connection")
        .unwrap()
        .term()
        .unwrap()
        .clone();
    let until = Instant::now() + lease * leases;
    while Instant::now() < until {
        assert!(
            term.is_current(),
            "the term lasted only until {:?} of {leases} leases ({:?})",
            until - Instant::now(),
            term.loss_reason()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(handle.is_leader());
    handle.shutdown().await;
}

/// The same on a server of the test's own: migrated with a separate pool, led on a pool of one.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn server_pool_of_one(server: common::Server) {
    use common::{drop_table, migrate};
    if server.skipped() {
        return;
    }
    let setup = server.connect(2).await;
    let table = unique("pool1");
    migrate(&setup, &table).await;
    leads_for_ten_leases(server.connect(1).await, &table).await;
    drop_table(&setup, &table).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_pool_of_one() {
    server_pool_of_one(common::Server::Postgres).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_pool_of_one() {
    server_pool_of_one(common::Server::MySql).await;
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_pool_of_one() {
    let dir = tempfile::tempdir().unwrap();
    let db = common::connect_sqlite(&dir.path().join("leases.db"), 1).await;
    let table = unique("pool1");
    common::migrate(&db, &table).await;
    // Each SQLite commit syncs the file: while the other tests of this binary start their
    // servers (two cores), one took more than the 450 ms a 600 ms lease leaves a renew.
    leads_for(db, &table, Duration::from_secs(2), 4).await;
}
