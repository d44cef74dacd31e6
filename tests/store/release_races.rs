//! A release is never undone by a renew of the same holder that was already in flight.
//!
//! Liveness is judged at a statement's start. A renew that started before the release but
//! reached the row lock after it must not see the released lease as live and extend the term:
//! at most it starts a new term, with a higher token.

use crate::common;

use std::time::Duration;

use orion_beacon::{store::LeaseOutcome, LeaseStore, SeaOrmLeaseStore};
use sea_orm::sea_query::{Alias, Expr, ExprTrait, LockType, Query};
use sea_orm::{ConnectionTrait, DatabaseConnection, TransactionTrait};

use common::{drop_table, migrate, unique, Server};

/// Holds the lease row locked in a transaction, lets a renew start and block on that lock,
/// then releases inside the same transaction and commits: the renew runs after the release.
async fn renew_in_flight_does_not_undo_a_release(server: Server) {
    if server.skipped() {
        return;
    }
    let db: DatabaseConnection = server.connect(4).await;
    let table = unique("relrace");
    migrate(&db, &table).await;
    let store = SeaOrmLeaseStore::new(db.clone())
        .with_table(&table)
        .unwrap()
        .with_release_notifications(false);
    let lease = Duration::from_secs(30);
    let first = store.acquire_or_renew("job", "a", lease).await.unwrap();
    assert!(matches!(first, LeaseOutcome::Acquired(ref l) if l.token.get() == 1));

    let txn = db.begin().await.unwrap();
    let lock = Query::select()
        .column(Alias::new("resource"))
        .from(Alias::new(&table))
        .and_where(Expr::col(Alias::new("resource")).eq("job"))
        .lock(LockType::Update)
        .to_owned();
    txn.query_all(&lock).await.unwrap();

    // The renew starts now and waits for the row.
    let renewing = {
        let store = store.clone();
        tokio::spawn(async move { store.acquire_or_renew("job", "a", lease).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!renewing.is_finished(), "the renew waits for the row lock");

    // The release, later than the renew's start, gets in first.
    let release = store.release_statement("job", "a").unwrap();
    txn.execute_raw(release).await.unwrap();
    txn.commit().await.unwrap();

    let renewed = renewing.await.unwrap().unwrap();
    match &renewed {
        LeaseOutcome::Renewed(l) => panic!(
            "a renew that started before the release extended the released term (token {})",
            l.token
        ),
        LeaseOutcome::Acquired(l) => assert_eq!(l.token.get(), 2, "a new term: {l:?}"),
        LeaseOutcome::Denied(_) => {}
    }
    drop_table(&db, &table).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres() {
    renew_in_flight_does_not_undo_a_release(Server::Postgres).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb() {
    renew_in_flight_does_not_undo_a_release(Server::MySql).await;
}
