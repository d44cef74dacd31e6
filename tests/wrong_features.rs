//! An application that enables SeaORM's drivers but none of this crate's backend features
//! (`sea-orm/sqlx-postgres` in its own `Cargo.toml`, `orion-beacon` with
//! `default-features = false`): SQLite still elects a leader and fences writes (it needs
//! nothing of its driver beyond what SeaORM runs); PostgreSQL and MySQL are refused when the
//! elector is built, with a typed error naming the missing feature, and no statement is sent.
//!
//! The lease migration runs here too, with sea-orm-migration built without driver features
//! (the migration crate's light defaults): it needs only the application's sea-orm drivers.
//!
//! This file only compiles in that build; the test command runs it as
//! `cargo test --no-default-features --features sea-orm/sqlx-sqlite,sea-orm/sqlx-postgres,sea-orm/sqlx-mysql,sea-orm/runtime-tokio-rustls --test wrong_features`.
#![cfg(not(any(feature = "sqlite", feature = "postgres", feature = "mysql")))]

use std::time::Duration;

use orion_beacon::{ConfigError, Elector, LeaseStore, SeaOrmLeaseStore, StoreError};
use orion_beacon_migration::Migrator;
use orion_beacon_migration::MigratorTrait;
use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseConnection, TransactionTrait};

/// A connection that never connects: port 1 refuses, and a lazy pool only dials on first use.
async fn lazy(url: &str) -> DatabaseConnection {
    let mut options = ConnectOptions::new(url);
    options
        .connect_lazy(true)
        .acquire_timeout(Duration::from_secs(1));
    Database::connect(options).await.expect("a lazy pool")
}

fn refused(store: SeaOrmLeaseStore, backend: &str, feature: &str) {
    match store.validate() {
        Err(StoreError::UnsupportedBackend {
            backend: b,
            feature: f,
        }) => assert_eq!((b, f), (backend, feature)),
        other => panic!("validate: expected UnsupportedBackend for {backend}, got {other:?}"),
    }
    let built = Elector::builder(store).resource("nightly").build();
    match built {
        Err(ConfigError::Invalid(StoreError::UnsupportedBackend { feature: f, .. })) => {
            assert_eq!(f, feature)
        }
        other => panic!("build: expected the unsupported backend error, got {other:?}"),
    }
}

#[tokio::test]
async fn postgres_without_its_feature_is_refused_at_build() {
    let db = lazy("postgres://nobody@127.0.0.1:1/none").await;
    let store = SeaOrmLeaseStore::new(db);
    // Calls fail the same way, before any SQL (the lazy pool would report a connect error).
    let err = store
        .acquire_or_renew("nightly", "a", Duration::from_secs(5))
        .await
        .expect_err("no PostgreSQL code in this build");
    assert!(
        matches!(err, StoreError::UnsupportedBackend { .. }),
        "{err:?}"
    );
    refused(store, "PostgreSQL", "postgres");
}

#[tokio::test]
async fn mysql_without_its_feature_is_refused_at_build() {
    let db = lazy("mysql://nobody@127.0.0.1:1/none").await;
    refused(SeaOrmLeaseStore::new(db), "MySQL", "mysql");
}

#[tokio::test]
async fn sqlite_without_its_feature_leads_and_fences() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite:{}?mode=rwc", dir.path().join("app.db").display());
    let db = Database::connect(&url).await.expect("sqlite");
    // Error kinds come from SQLite's (untranslated) messages in this build.
    let err = SeaOrmLeaseStore::new(db.clone())
        .acquire_or_renew("nightly", "a", Duration::from_secs(5))
        .await
        .expect_err("no table yet");
    assert!(matches!(err, StoreError::MissingTable { .. }), "{err:?}");
    Migrator::up(&db, None).await.expect("migration");
    let store = SeaOrmLeaseStore::new(db.clone());
    store.validate().expect("SQLite needs no feature of ours");
    let handle = Elector::builder(store.clone())
        .resource("nightly")
        .build()
        .expect("build")
        .start();
    let mut rx = handle.watch();
    let term = tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|s| s.is_leader()))
        .await
        .expect("a leader within 10 s")
        .expect("elector running")
        .term()
        .cloned()
        .expect("a term");
    db.execute_unprepared("CREATE TABLE job_runs (token INTEGER NOT NULL)")
        .await
        .expect("app table");
    let txn = db.begin().await.expect("begin");
    store.fence(&txn, &term).await.expect("the term is current");
    txn.execute_unprepared("INSERT INTO job_runs (token) VALUES (1)")
        .await
        .expect("insert");
    txn.commit().await.expect("commit");
    handle.shutdown().await;
}
