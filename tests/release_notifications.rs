//! PostgreSQL release notifications on a real server: a release wakes a follower long before
//! its next poll, and a listener whose connection was killed listens again.
#![cfg(feature = "postgres")]

mod common;

use std::time::Duration;

use orion_beacon::{Elector, ElectorHandle, Leadership, SeaOrmLeaseStore};
use sea_orm::{ConnectionTrait, DatabaseConnection};
use tokio::time::Instant;

use common::{drop_table, migrate, unique, Server};

/// A follower polls every 10 s; a handover by release must take well under that.
const RETRY: Duration = Duration::from_secs(10);
const WELL_UNDER: Duration = Duration::from_secs(2);

/// A pool whose connections (the listener's own included) carry `app` as application name.
async fn connect_as(app: &str) -> DatabaseConnection {
    let mut options = sea_orm::ConnectOptions::new(Server::Postgres.url());
    let app = app.to_owned();
    options
        .max_connections(4)
        .min_connections(0)
        .sqlx_logging(false)
        .map_sqlx_postgres_opts(move |o| o.application_name(&app));
    sea_orm::Database::connect(options)
        .await
        .expect("connect to the PostgreSQL test server")
}

fn start(store: &SeaOrmLeaseStore, resource: &str, id: &str) -> ElectorHandle {
    Elector::builder(store.clone())
        .resource(resource)
        .candidate_id(id)
        .lease_duration(Duration::from_secs(30))
        .renew_interval(Duration::from_secs(5))
        .retry_interval(RETRY)
        .jitter(0.0)
        .build()
        .unwrap()
        .start()
}

/// The backend pids of `app`'s connections that are listening.
async fn listeners(admin: &DatabaseConnection, app: &str) -> Vec<i32> {
    let rows = admin
        .query_all_raw(sea_orm::Statement::from_sql_and_values(
            sea_orm::DbBackend::Postgres,
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN%'",
            [app.into()],
        ))
        .await
        .unwrap();
    rows.iter()
        .map(|r| r.try_get_by_index(0).unwrap())
        .collect()
}

async fn wait_for_listener(admin: &DatabaseConnection, app: &str, not: &[i32]) -> i32 {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(pid) = listeners(admin, app)
            .await
            .into_iter()
            .find(|p| !not.contains(p))
        {
            return pid;
        }
        assert!(Instant::now() < until, "no LISTEN connection for {app}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `a` leads, `b` follows (denied once); `a` shuts down and releases: `b` leads within
/// `WELL_UNDER`, not at its next poll.
async fn handover_by_notification(a: ElectorHandle, b: &ElectorHandle) {
    let mut brx = b.watch();
    brx.wait_for(|s| matches!(s, Leadership::Follower { leader: Some(_) }))
        .await
        .unwrap();
    let t0 = Instant::now();
    a.shutdown().await;
    tokio::time::timeout(WELL_UNDER, brx.wait_for(|s| s.is_leader()))
        .await
        .unwrap_or_else(|_| panic!("no handover within {WELL_UNDER:?} (polls every {RETRY:?})"))
        .unwrap();
    eprintln!("handover in {:?}", Instant::now() - t0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_wakes_the_follower_and_a_killed_listener_listens_again() {
    if Server::Postgres.skipped() {
        return;
    }
    let admin = Server::Postgres.connect(2).await;
    let table = unique("notify");
    migrate(&admin, &table).await;
    let app = unique("ob-notify");
    let store_a = SeaOrmLeaseStore::new(connect_as(&format!("{app}-a")).await)
        .with_table(&table)
        .unwrap();
    // One store, so one listener, for both followers below.
    let store_b = SeaOrmLeaseStore::new(connect_as(&app).await)
        .with_table(&table)
        .unwrap();
    let resource = unique("job");

    // 1. A release wakes the follower at once.
    let a = start(&store_a, &resource, "a");
    a.watch().wait_for(|s| s.is_leader()).await.unwrap();
    let b = start(&store_b, &resource, "b");
    let first = wait_for_listener(&admin, &app, &[]).await;
    handover_by_notification(a, &b).await;

    // 2. The listener's connection is killed; it listens again, and the next release still
    // wakes a follower of the same store at once.
    let resource2 = unique("job2");
    let a = start(&store_a, &resource2, "a");
    a.watch().wait_for(|s| s.is_leader()).await.unwrap();
    let c = start(&store_b, &resource2, "c");
    admin
        .execute_raw(sea_orm::Statement::from_sql_and_values(
            sea_orm::DbBackend::Postgres,
            "SELECT pg_terminate_backend($1)",
            [first.into()],
        ))
        .await
        .unwrap();
    let second = wait_for_listener(&admin, &app, &[first]).await;
    assert_ne!(first, second);
    assert_eq!(
        listeners(&admin, &app).await,
        vec![second],
        "one listener per store"
    );
    handover_by_notification(a, &c).await;

    b.shutdown().await;
    c.shutdown().await;
    drop_table(&admin, &table).await;
}
