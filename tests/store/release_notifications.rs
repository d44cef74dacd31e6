//! PostgreSQL release notifications on a real server: a release wakes a follower long before
//! its next poll, a listener whose connection was killed listens again, and so does one a
//! partition left half-open.
#![cfg(feature = "postgres")]

use crate::common;

use std::time::Duration;

use orion_beacon::{Elector, ElectorHandle, Leadership, SeaOrmLeaseStore};
use sea_orm::{ConnectionTrait, DatabaseConnection};
use tokio::time::Instant;

use common::partition::Partitions;
use common::{drop_table, migrate, unique, Server};

/// A follower polls every 10 s; a handover by release must take well under that.
const RETRY: Duration = Duration::from_secs(10);
const WELL_UNDER: Duration = Duration::from_secs(2);

/// A pool whose connections (the listener's own included) carry `app` as application name.
async fn connect_as(app: &str) -> DatabaseConnection {
    connect_to(&Server::Postgres.url(), app).await
}

async fn connect_to(url: &str, app: &str) -> DatabaseConnection {
    let mut options = sea_orm::ConnectOptions::new(url);
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
    brx.wait_for(|s| {
        matches!(
            s,
            Leadership::Follower {
                leader: Some(_),
                ..
            }
        )
    })
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

/// The listener's session ends at the server during a partition whose FIN never reaches the
/// client (the connection is left half-open: the client reads on, nothing ever arrives). After
/// the heal the listener finds out by its own probe and listens again: releases reach the
/// store's followers within the probe's idle time, not never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_a_partition_left_half_open_listens_again() {
    if Server::Postgres.skipped() {
        return;
    }
    let admin = Server::Postgres.connect(2).await;
    let table = unique("notify_half_open");
    migrate(&admin, &table).await;
    let app = unique("ob-half-open");
    let partitions = Partitions::default();
    let url = partitions.route("b", &Server::Postgres.url()).unwrap();
    let store_a = SeaOrmLeaseStore::new(connect_as(&format!("{app}-a")).await)
        .with_table(&table)
        .unwrap();
    let store_b = SeaOrmLeaseStore::new(connect_to(&url, &app).await)
        .with_table(&table)
        .unwrap();
    let mut events = orion_beacon::LeaseStore::release_events(&store_b).unwrap();
    let listener = wait_for_listener(&admin, &app, &[]).await;

    // A release from `a` reaches `b`'s followers: released and heard within `WELL_UNDER`.
    async fn heard(
        store_a: &SeaOrmLeaseStore,
        events: &mut orion_beacon::store::ReleaseEvents,
        within: Duration,
    ) -> bool {
        use orion_beacon::LeaseStore;
        let resource = unique("job");
        store_a
            .acquire_or_renew(&resource, "a", Duration::from_secs(30))
            .await
            .unwrap();
        assert!(store_a.release(&resource, "a").await.unwrap());
        let until = Instant::now() + within;
        loop {
            match tokio::time::timeout_at(until, events.recv()).await {
                Ok(Ok(r)) if *r == *resource => return true,
                Ok(Ok(_)) | Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => {}
                Ok(Err(_)) | Err(_) => return false,
            }
        }
    }
    assert!(
        heard(&store_a, &mut events, WELL_UNDER).await,
        "no notification before the cut"
    );

    // Cut `b` off, end its listener's session at the server, heal with the FIN lost.
    partitions.set_with("b", true, true);
    admin
        .execute_raw(sea_orm::Statement::from_sql_and_values(
            sea_orm::DbBackend::Postgres,
            "SELECT pg_terminate_backend($1)",
            [listener.into()],
        ))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    partitions.set("b", false);
    let healed = Instant::now();

    // Within the probe's idle time (10 s) and its timeout (5 s), plus a margin, a release is
    // heard again.
    let until = healed + Duration::from_secs(20);
    loop {
        if heard(&store_a, &mut events, Duration::from_millis(500)).await {
            break;
        }
        assert!(
            Instant::now() < until,
            "the half-open listener never listened again ({:?} after the heal)",
            healed.elapsed()
        );
    }
    eprintln!("listening again {:?} after the heal", healed.elapsed());
    assert!(
        healed.elapsed() >= Duration::from_secs(5),
        "heard before the probe could have run: the partition did not leave the listener half-open"
    );
    drop_table(&admin, &table).await;
}

/// A handover to a named successor in another process: the offer's `pg_notify` wakes it, long
/// before its 10 s poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offer_wakes_the_named_successor() {
    if Server::Postgres.skipped() {
        return;
    }
    let admin = Server::Postgres.connect(2).await;
    let table = unique("notify_offer");
    migrate(&admin, &table).await;
    let apps: Vec<String> = (0..3).map(|i| unique(&format!("ob-offer-{i}"))).collect();
    let mut stores = Vec::new();
    for app in &apps {
        stores.push(
            SeaOrmLeaseStore::new(connect_as(app).await)
                .with_table(&table)
                .unwrap(),
        );
    }
    let stores: [SeaOrmLeaseStore; 3] = stores.try_into().unwrap();
    // Each store's listener LISTENs before the electors start: a notification sent before
    // that is lost (and costs a poll, as documented), which is not what this test is about.
    let mut subscribed = Vec::new();
    for (store, app) in stores.iter().zip(&apps) {
        subscribed
            .push(orion_beacon::LeaseStore::release_events(store).expect("release notifications"));
        wait_for_listener(&admin, app, &[]).await;
    }
    let took = common::election::woken_handover(&stores).await;
    drop(subscribed);
    eprintln!("PostgreSQL handover to a named successor in {took:?}");
    drop_table(&admin, &table).await;
}
