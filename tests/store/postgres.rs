//! The store contract on PostgreSQL (this test binary's private instance, or the server
//! `ORION_BEACON_PG_URL` names).
#![cfg(feature = "postgres")]

use crate::common;

use common::sql::SqlHarness;
use common::Server;

conformance_suite!(SqlHarness::server(Server::Postgres));

sql_store_suite!(SqlHarness::server(Server::Postgres));

shard_suite!(SqlHarness::server(Server::Postgres));

lock_suite!(SqlHarness::server(Server::Postgres));

rate_suite!(SqlHarness::server(Server::Postgres));

job_suite!(SqlHarness::server(Server::Postgres));

/// The same contract with the stores on the application's pool, every statement checked
/// (`with_lease_connections(0)`).
mod on_the_application_pool {
    use crate::common::sql::SqlHarness;
    use crate::common::Server;
    conformance_suite!(SqlHarness::app_pool(Server::Postgres));
    shard_suite!(SqlHarness::app_pool(Server::Postgres));
    rate_suite!(SqlHarness::app_pool(Server::Postgres));
}

/// The same contract through a transaction-pooling PgBouncer (consecutive statements of one
/// client may reach different server connections), with the store's
/// `with_transaction_pooling` mode.
mod through_pgbouncer {
    use crate::common::sql::SqlHarness;
    conformance_suite!(SqlHarness::pgbouncer());
    shard_suite!(SqlHarness::pgbouncer());
    lock_suite!(SqlHarness::pgbouncer());
    rate_suite!(SqlHarness::pgbouncer());
}

/// Release notifications: a store LISTENs unless told not to, and never behind a
/// transaction-pooling proxy (LISTEN needs a session of its own), whatever the other option.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_notifications_only_on_a_direct_session() {
    use orion_beacon::{LeaseStore, SeaOrmLeaseStore};
    if Server::Postgres.skipped() {
        return;
    }
    let db = Server::Postgres.connect(2).await;
    let store = SeaOrmLeaseStore::new(db);
    assert!(store.clone().release_events().is_some());
    for (notify, pooling) in [(false, false), (false, true), (true, true)] {
        let s = store
            .clone()
            .with_release_notifications(notify)
            .with_transaction_pooling(pooling);
        assert!(
            s.release_events().is_none(),
            "notifications {notify}, transaction pooling {pooling}"
        );
    }
}

/// The store's own sessions take the application's `search_path` (SeaORM's
/// `set_schema_search_path` sets it in an `after_connect` hook, which they do not run): the
/// lease table found through it is the one the store writes, not a missing one or another
/// schema's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_sessions_use_the_applications_search_path() {
    use orion_beacon::{store::LeaseOutcome, LeaseStore, SeaOrmLeaseStore};
    use sea_orm::ConnectionTrait;
    if Server::Postgres.skipped() {
        return;
    }
    let admin = Server::Postgres.connect(2).await;
    let schema = common::unique("sp");
    admin
        .execute_unprepared(&format!("CREATE SCHEMA {schema}"))
        .await
        .unwrap();
    let mut options = sea_orm::ConnectOptions::new(Server::Postgres.url());
    options
        .max_connections(2)
        .min_connections(0)
        .sqlx_logging(false)
        .set_schema_search_path(schema.clone());
    let db = sea_orm::Database::connect(options).await.unwrap();
    let table = common::unique("obsp");
    common::migrate(&db, &table).await;
    let store = SeaOrmLeaseStore::new(db.clone())
        .with_table(&table)
        .unwrap()
        .with_release_notifications(false);
    let out = store
        .acquire_or_renew("job", "a", std::time::Duration::from_secs(30))
        .await
        .unwrap();
    assert!(matches!(out, LeaseOutcome::Acquired(_)), "{out:?}");
    let row = admin
        .query_one_raw(sea_orm::Statement::from_string(
            admin.get_database_backend(),
            format!("SELECT holder FROM {schema}.{table} WHERE resource = 'job'"),
        ))
        .await
        .unwrap()
        .expect("the grant is in the schema's table");
    assert_eq!(row.try_get_by_index::<String>(0).unwrap(), "a");
    db.close().await.ok();
    admin
        .execute_unprepared(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}

/// A scheduler's leader keeps its term while it claims many slots at once, even when every
/// statement on the run table is slow (a statement trigger sleeping 25 ms): a look's new
/// records go in one statement, and its updates (the retries and give-ups of failing jobs)
/// stop once the lease row has been held half a renew interval, the next look starting with
/// the first job left out. One statement per claim held the row for 60 × 25 ms, past the 1 s
/// lease, and the leader lost its term to its own claims; without the next look starting
/// where the budget stopped, the failing jobs late in the order never got their turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_run_table_statements_do_not_cost_the_leader_its_term() {
    use common::conformance::Harness as _;
    use orion_beacon::jobs::{Job, Schedule};
    use sea_orm::ConnectionTrait;
    use std::collections::BTreeMap;
    use std::time::Duration;
    let Some(h) = SqlHarness::server(Server::Postgres).await else {
        return;
    };
    let db = h.store().connection().clone();
    let t = common::jobs::Tables::create(&db).await;
    let slow = common::unique("slow");
    db.execute_unprepared(&format!(
        "CREATE FUNCTION {slow}() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN PERFORM pg_sleep(0.025); RETURN NULL; END $$; \
         CREATE TRIGGER {slow} AFTER INSERT OR UPDATE ON \"{}\" \
         FOR EACH STATEMENT EXECUTE FUNCTION {slow}()",
        t.runs
    ))
    .await
    .unwrap();
    let every = Schedule::every(Duration::from_secs(1)).unwrap();
    let mut jobs: Vec<Job> = (0..60)
        .map(|i| Job::new(format!("ok{i:02}"), every.clone(), |_| async { Ok(()) }))
        .collect();
    // Failing jobs: their retries and give-ups are updates in the claim transaction.
    jobs.extend((0..30).map(|i| {
        Job::new(format!("failing{i:02}"), every.clone(), |_| async {
            Err("planned".into())
        })
        .retry_backoff(Duration::from_millis(10), Duration::from_millis(20))
        .max_attempts(3)
    }));
    let node = t.start(&h.store(), "a", jobs);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while !node.elector().is_leader() {
        assert!(tokio::time::Instant::now() < deadline, "no leader");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let token = node.elector().token();
    // Per job: how many slots ended finished or given up.
    let read_ended = || async {
        let mut ended: BTreeMap<String, usize> = BTreeMap::new();
        for ((job, _), state) in common::jobs::states(&t, &db).await {
            let done = state
                == if job.starts_with("ok") {
                    "finished"
                } else {
                    "given_up"
                };
            *ended.entry(job).or_default() += usize::from(done);
        }
        ended
    };
    let least = |job: &str| if job.starts_with("ok") { 3 } else { 1 };
    // At least 4 s of claims, then until every job has its due, up to 15 s in all (a loaded
    // host is slower; a job left out of every look never gets there).
    tokio::time::sleep(Duration::from_secs(4)).await;
    let ended = common::jobs::poll(
        Duration::from_secs(11),
        Duration::from_millis(500),
        read_ended,
        |ended: &BTreeMap<String, usize>| {
            ended.len() == 90 && ended.iter().all(|(job, n)| *n >= least(job))
        },
    )
    .await;
    let kept = node.elector().token();
    node.shutdown().await;
    t.drop(&db).await;
    let _ = db
        .execute_unprepared(&format!("DROP FUNCTION IF EXISTS {slow}()"))
        .await;
    assert_eq!(kept, token, "the leader kept its term");
    assert_eq!(ended.len(), 90, "every job has records: {ended:?}");
    // The failing jobs ask for more updates than the budget lets through (three a second
    // each, 25 ms apiece): each gets its turn, none is starved by those before it.
    for (job, n) in &ended {
        let least = least(job);
        assert!(
            *n >= least,
            "{job}: {n} slots ended (finished or given up): {ended:?}"
        );
    }
}
