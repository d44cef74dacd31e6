//! The store contract on SQLite (a file, several connection pools), in WAL mode (what
//! `backend::sqlite::connect_options` sets up) and in rollback-journal mode (SQLite's own
//! default, where a commit waits for every reader).
#![cfg(feature = "sqlite")]

use crate::common;

use common::sql::SqlHarness;

conformance_suite!(SqlHarness::sqlite());

sql_store_suite!(SqlHarness::sqlite());

shard_suite!(SqlHarness::sqlite());

lock_suite!(SqlHarness::sqlite());

rate_suite!(SqlHarness::sqlite());

job_suite!(SqlHarness::sqlite());

mod rollback_journal {
    use super::*;
    conformance_suite!(SqlHarness::sqlite_rollback_journal());
    sql_store_suite!(SqlHarness::sqlite_rollback_journal());
    shard_suite!(SqlHarness::sqlite_rollback_journal());
    lock_suite!(SqlHarness::sqlite_rollback_journal());
    rate_suite!(SqlHarness::sqlite_rollback_journal());
    job_suite!(SqlHarness::sqlite_rollback_journal());
}

/// A file in SQLite's rollback-journal mode gets one warning per store (commits wait for
/// readers there); a file in WAL mode gets none.
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

/// Two processes of one app (two pools on one WAL file) with one candidate id: p1 renews, p2
/// renews straight after, and p1's late `release_lease` of its own earlier write arrives. It
/// must not end p2's renew, and a third candidate must stay denied.
///
/// SQLite stores milliseconds, and `now` and the returned remaining time are exact there, so
/// the test knows each statement's `now` (expiry minus remaining) and whether p2's renew would
/// have ended exactly where p1's did (`now + lease` equal to p1's expiry). Every other
/// iteration p2 asks for the same lease (a collision needs both renews in one millisecond);
/// the others shorten p2's lease by the gap between the two statements seen most often so far
/// (on a loaded machine the gaps spread over many milliseconds, and the last gap alone rarely
/// comes again), which forces one far more often. p2's lease is counted from p1's actual
/// expiry, a millisecond past its `now` plus its lease when p1's write shared a millisecond
/// with the write before it (each write of a term has an expiry of its own): under load most
/// writes do, and counting from `now` plus the lease then found no collision at all. The loop
/// runs until it checked 5 collisions of each kind (or 10 in all after 2,000 iterations), for
/// at least 2,000 iterations and at most 30 s when it found none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_release_never_ends_a_renew_made_in_the_same_millisecond() {
    use std::time::Duration;

    use chrono::{DateTime, TimeDelta, Utc};
    use orion_beacon::{store::LeaseOutcome, Lease, LeaseStore, SeaOrmLeaseStore};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    let (db1, db2) = (
        common::connect_sqlite(&path, 2).await,
        common::connect_sqlite(&path, 2).await,
    );
    common::migrate(&db1, orion_beacon::entity::DEFAULT_TABLE).await;
    let (p1, p2) = (SeaOrmLeaseStore::new(db1), SeaOrmLeaseStore::new(db2));
    let lease = Duration::from_secs(10);
    let grant = |out: LeaseOutcome| match out {
        LeaseOutcome::Acquired(l) | LeaseOutcome::Renewed(l) => l,
        LeaseOutcome::Denied(d) => panic!("the holder was denied: {d:?}"),
    };
    let expiry = |l: &Lease| l.expires_at.expect("SQLite reports the expiry");
    // The statement's `now`: exact on SQLite (milliseconds, remaining from the same `now`).
    let now_of = |l: &Lease| -> DateTime<Utc> {
        expiry(l) - TimeDelta::from_std(l.remaining).expect("a lease fits a TimeDelta")
    };
    let (mut same_lease, mut shorter) = (0, 0);
    // How often each gap (ms) between the two statements' `now`s was seen.
    let mut gaps: std::collections::HashMap<i64, u32> = std::collections::HashMap::new();
    let started = std::time::Instant::now();
    for i in 0.. {
        if i >= 2_000 && (same_lease + shorter > 0 || started.elapsed() > Duration::from_secs(30)) {
            break;
        }
        let w1 = grant(p1.acquire_or_renew("job", "app", lease).await.unwrap());
        let likeliest = gaps
            .iter()
            .max_by_key(|(gap, seen)| (**seen, -**gap))
            .map_or(0, |(gap, _)| *gap);
        let cut = if i % 2 == 0 {
            0
        } else {
            likeliest.clamp(0, 5_000)
        };
        // p1's write ends where its own `now` plus its lease put it, or a millisecond later
        // when it shared a millisecond with the write before it (each write of a term has an
        // expiry of its own): ask for what lands on that expiry after the guessed gap.
        let offset = (expiry(&w1) - now_of(&w1)).num_milliseconds();
        let asked = Duration::from_millis(u64::try_from(offset - cut).unwrap_or(10_000));
        let w2 = if i % 4 < 2 {
            grant(p2.acquire_or_renew("job", "app", asked).await.unwrap())
        } else {
            let out = p2
                .renew_all(std::slice::from_ref(&w1), asked)
                .await
                .unwrap();
            assert_eq!(out.renewed.len(), 1, "{out:?}");
            out.renewed[0].clone()
        };
        assert_eq!(w2.token, w1.token, "one term");
        *gaps
            .entry((now_of(&w2) - now_of(&w1)).num_milliseconds())
            .or_default() += 1;
        // Would `now + lease` of p2's renew have been p1's expiry, which names p1's write?
        if now_of(&w2) + TimeDelta::from_std(asked).unwrap() != expiry(&w1) {
            continue;
        }
        if cut == 0 {
            same_lease += 1;
        } else {
            shorter += 1;
        }
        assert!(
            !p1.release_lease(&w1).await.unwrap(),
            "iteration {i}: p1's late release of its own earlier write ended p2's renew \
             ({cut} ms shorter lease, expiries {:?} and {:?})",
            w1.expires_at,
            w2.expires_at
        );
        assert!(expiry(&w2) > expiry(&w1), "{w1:?} then {w2:?}");
        assert!(
            w2.remaining > asked,
            "the new expiry's remaining time: {w2:?}"
        );
        let row = p2.current("job").await.unwrap().unwrap();
        assert!(row.live && row.expires_at == w2.expires_at, "{row:?}");
        let third = p1.acquire_or_renew("job", "third", lease).await.unwrap();
        assert!(
            matches!(third, LeaseOutcome::Denied(_)),
            "iteration {i}: a third candidate was granted while p2 held the lease: {third:?}"
        );
        if (same_lease >= 5 && shorter >= 5) || (i >= 2_000 && same_lease + shorter >= 10) {
            break;
        }
    }
    eprintln!("collisions checked: {same_lease} in one millisecond, {shorter} by a shorter lease");
    let mut seen: Vec<(i64, u32)> = gaps.into_iter().collect();
    seen.sort_unstable();
    assert!(
        same_lease + shorter > 0,
        "no renew of p2 would have ended at p1's expiry in 30 s of tries: the test proved \
         nothing (gaps in ms, and how often: {seen:?})"
    );
}

/// A release in another process wakes a SQLite follower and a lock waiter at once (the file's
/// change, see `backend::sqlite` "Wake-ups"), long before their next poll; with notifications
/// off they wait for the poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_waiters_in_other_processes() {
    wakes_waiters(false).await;
}

/// The same in rollback-journal mode (a commit writes the file itself, and its journal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_waiters_in_rollback_journal_mode() {
    wakes_waiters(true).await;
}

async fn wakes_waiters(rollback_journal: bool) {
    use std::time::Duration;

    use orion_beacon::{Elector, Leadership, SeaOrmLeaseStore};
    use tokio::time::Instant;

    const RETRY: Duration = Duration::from_secs(10);
    const WELL_UNDER: Duration = Duration::from_secs(2);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let connect = |path: std::path::PathBuf| async move {
        if rollback_journal {
            common::sql::connect_sqlite_rollback_journal(&path, 2, Duration::from_secs(5)).await
        } else {
            common::connect_sqlite(&path, 2).await
        }
    };
    let db = connect(path.clone()).await;
    <orion_beacon_migration::Migrator as orion_beacon_migration::MigratorTrait>::up(&db, None)
        .await
        .unwrap();
    // Two "processes": a pool each.
    let a = SeaOrmLeaseStore::new(db);
    let b = SeaOrmLeaseStore::new(connect(path.clone()).await);
    let elector = |store: &SeaOrmLeaseStore, id: &str| {
        Elector::builder(store.clone())
            .resource("job")
            .candidate_id(id)
            .lease_duration(Duration::from_secs(30))
            .renew_interval(Duration::from_secs(5))
            .retry_interval(RETRY)
            .jitter(0.0)
            .build()
            .unwrap()
            .start()
    };
    let leader = elector(&a, "a");
    leader.watch().wait_for(|s| s.is_leader()).await.unwrap();
    let follower = elector(&b, "b");
    let mut brx = follower.watch();
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
    leader.shutdown().await;
    tokio::time::timeout(WELL_UNDER, brx.wait_for(|s| s.is_leader()))
        .await
        .unwrap_or_else(|_| panic!("no handover within {WELL_UNDER:?} (polls every {RETRY:?})"))
        .unwrap();
    eprintln!("SQLite handover in {:?}", t0.elapsed());
    follower.shutdown().await;

    // A handover to a named successor in another process: the offer wakes it too.
    let c = SeaOrmLeaseStore::new(connect(path.clone()).await);
    let took = common::election::woken_handover(&[a.clone(), b.clone(), c]).await;
    eprintln!("SQLite handover to a named successor in {took:?}");

    // A lock waiter in the other process, polling every 10 s; then with notifications off.
    common::locks::a_release_wakes_a_lock_waiter(&a, &b, "SQLite").await;
}
