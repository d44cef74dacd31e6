//! MySQL/MariaDB wake-ups on a real server (named locks, see `backend::mysql::wakeups`): a
//! release in another process wakes a follower and a lock waiter long before their next poll;
//! a holder whose signal connection dies wakes its waiters early, who are denied until its
//! lease ends and then take over, and its next renew signals again; with notifications off the
//! waiter only polls.
#![cfg(feature = "mysql")]

use crate::common;

use std::time::Duration;

use orion_beacon::{Elector, ElectorHandle, Leadership, LeaseStore, Locks, SeaOrmLeaseStore};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use tokio::time::Instant;

use common::{drop_table, migrate, unique, Server};

/// Waiters poll every 10 s; a wake-up must come well before.
const RETRY: Duration = Duration::from_secs(10);
const WELL_UNDER: Duration = Duration::from_secs(2);

fn elector(store: &SeaOrmLeaseStore, resource: &str, id: &str, lease: Duration) -> ElectorHandle {
    Elector::builder(store.clone())
        .resource(resource)
        .candidate_id(id)
        .lease_duration(lease)
        .renew_interval(lease / 6)
        .retry_interval(RETRY)
        .jitter(0.0)
        .build()
        .unwrap()
        .start()
}

async fn following(handle: &ElectorHandle) {
    handle
        .watch()
        .wait_for(|s| {
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
}

/// The connection id holding `resource`'s named lock, if any.
async fn signal_holder(admin: &DatabaseConnection, table: &str, resource: &str) -> Option<i64> {
    let row = admin
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::MySql,
            "SELECT CAST(IS_USED_LOCK(CONCAT('orionbeacon/', SHA1(CONCAT_WS('/', DATABASE(), ?, ?)))) AS SIGNED)",
            [table.into(), resource.into()],
        ))
        .await
        .unwrap()
        .unwrap();
    row.try_get_by_index::<Option<i64>>(0).unwrap()
}

async fn wait_for_signal(
    admin: &DatabaseConnection,
    table: &str,
    resource: &str,
    not: Option<i64>,
) -> i64 {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(id) = signal_holder(admin, table, resource).await {
            if Some(id) != not {
                return id;
            }
        }
        assert!(Instant::now() < until, "no signal for {resource}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A lease table named after `prefix` on the test server, an admin connection, and `N` stores
/// on it with a pool each (as `N` processes have).
async fn processes<const N: usize>(
    prefix: &str,
) -> (DatabaseConnection, String, [SeaOrmLeaseStore; N]) {
    let admin = Server::MySql.connect(2).await;
    let table = unique(prefix);
    migrate(&admin, &table).await;
    let mut stores = Vec::with_capacity(N);
    for _ in 0..N {
        stores.push(
            SeaOrmLeaseStore::new(Server::MySql.connect(4).await)
                .with_table(&table)
                .unwrap(),
        );
    }
    let Ok(stores) = stores.try_into() else {
        unreachable!("N stores were made");
    };
    (admin, table, stores)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_waiters_in_other_processes() {
    if Server::MySql.skipped() {
        return;
    }
    // Two "processes": a pool each.
    let (admin, table, [a, b]) = processes("wake").await;

    // An elector's handover.
    let resource = unique("job");
    let leader = elector(&a, &resource, "a", Duration::from_secs(30));
    leader.watch().wait_for(|s| s.is_leader()).await.unwrap();
    wait_for_signal(&admin, &table, &resource, None).await;
    let follower = elector(&b, &resource, "b", Duration::from_secs(30));
    following(&follower).await;
    let t0 = Instant::now();
    leader.shutdown().await;
    let mut brx = follower.watch();
    tokio::time::timeout(WELL_UNDER, brx.wait_for(|s| s.is_leader()))
        .await
        .unwrap_or_else(|_| panic!("no handover within {WELL_UNDER:?} (polls every {RETRY:?})"))
        .unwrap();
    eprintln!("MariaDB handover in {:?}", t0.elapsed());
    // The new leader signals now (the waiter let go of the name at once).
    wait_for_signal(&admin, &table, &resource, None).await;
    follower.shutdown().await;
    let until = Instant::now() + Duration::from_secs(1);
    while signal_holder(&admin, &table, &resource).await.is_some() {
        assert!(Instant::now() < until, "a released lease's name is let go");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // A lock waiter in the other process; then with notifications off.
    common::locks::a_release_wakes_a_lock_waiter(&a, &b, "MariaDB").await;
    drop_table(&admin, &table).await;
}

/// The holder's signal connection is killed: the follower is woken early but only ever denied
/// while the lease lasts (a wake-up is never a grant), and takes over at the lease's end, not
/// at its next poll; the holder's next renew signals on a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_signal_wakes_but_never_grants() {
    if Server::MySql.skipped() {
        return;
    }
    let (admin, table, [a, b]) = processes("wake_lost").await;
    let resource = unique("job");
    let lease = Duration::from_secs(3);

    // The signal comes back on a new connection after a kill (the leader's next renew).
    let leader = elector(&a, &resource, "a", lease);
    leader.watch().wait_for(|s| s.is_leader()).await.unwrap();
    let first = wait_for_signal(&admin, &table, &resource, None).await;
    admin
        .execute_raw(Statement::from_string(
            DbBackend::MySql,
            format!("KILL CONNECTION {first}"),
        ))
        .await
        .unwrap();
    let second = wait_for_signal(&admin, &table, &resource, Some(first)).await;
    assert_ne!(first, second);

    // The leader stops renewing without releasing (aborted); its signal connection is killed
    // while the follower waits on it.
    let follower = elector(&b, &resource, "b", lease);
    following(&follower).await;
    let granted_until = Instant::now();
    leader.abort().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let signal = wait_for_signal(&admin, &table, &resource, None).await;
    let killed = Instant::now();
    admin
        .execute_raw(Statement::from_string(
            DbBackend::MySql,
            format!("KILL CONNECTION {signal}"),
        ))
        .await
        .unwrap();
    let mut brx = follower.watch();
    tokio::time::timeout(lease + WELL_UNDER, brx.wait_for(|s| s.is_leader()))
        .await
        .expect("the follower takes over once the lease ends")
        .unwrap();
    let took = killed.elapsed();
    eprintln!("MariaDB takeover {took:?} after the signal's kill ({lease:?} lease)");
    // Not before the lease (granted at least `lease` minus the time since the abort) ends.
    assert!(
        granted_until.elapsed() >= lease.saturating_sub(Duration::from_millis(600)),
        "taken over {:?} after the leader stopped, under its {lease:?} lease",
        granted_until.elapsed()
    );
    // And not at the next poll (10 s).
    assert!(took < lease + WELL_UNDER, "{took:?}");
    follower.shutdown().await;
    let _ = b.release(&resource, "b").await;
    drop_table(&admin, &table).await;
}

/// Three processes: one holds a lock, two wait. Each release wakes the waiters at once: the
/// first waiter is granted right after the holder's release, and the second right after the
/// first's, although its watch may first meet the other waiter's moment on the name (a watcher
/// tells a holder's signal connection from another watcher and waits only behind the former).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_release_wakes_the_next_of_two_waiters() {
    if Server::MySql.skipped() {
        return;
    }
    let (admin, table, stores) = processes::<3>("wake_two").await;
    let locks = |store: &SeaOrmLeaseStore, owner: &str| {
        Locks::builder(store.clone())
            .owner(owner)
            .retry_interval(RETRY)
            .build()
            .unwrap()
    };
    let held = locks(&stores[0], "a")
        .lock("ledger")
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for (i, owner) in [(1, "b"), (2, "c")] {
        let (lock, tx) = (locks(&stores[i], owner), tx.clone());
        tokio::spawn(async move {
            let guard = lock
                .lock("ledger")
                .unwrap()
                .acquire(Duration::from_secs(30))
                .await
                .unwrap();
            tx.send((owner, Instant::now(), guard)).unwrap();
        });
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released = Instant::now();
    assert!(held.release().await.unwrap());
    let (first, at, guard) = rx.recv().await.unwrap();
    let after = at.saturating_duration_since(released);
    eprintln!("MariaDB: {first} granted {after:?} after the release");
    assert!(after < WELL_UNDER, "{after:?}");
    // Let the second waiter's watch settle behind the new holder's signal.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released = Instant::now();
    assert!(guard.release().await.unwrap());
    let (second, at, guard) = rx.recv().await.unwrap();
    assert_ne!(first, second);
    let after = at.saturating_duration_since(released);
    eprintln!("MariaDB: {second} granted {after:?} after the release");
    assert!(after < WELL_UNDER, "{after:?}");
    assert!(guard.release().await.unwrap());
    drop_table(&admin, &table).await;
}

/// A handover to a named successor in another process: the offer wakes it (the old leader's
/// name is let go with the offer), long before its 10 s poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offer_wakes_the_named_successor() {
    if Server::MySql.skipped() {
        return;
    }
    let (admin, table, stores) = processes::<3>("wake_offer").await;
    let took = common::election::woken_handover(&stores).await;
    eprintln!("MariaDB handover to a named successor in {took:?}");
    drop_table(&admin, &table).await;
}

/// A semaphore waiter in another process, all permits held: the release of one wakes it at
/// once (each permit it waits for is watched), long before its 10 s poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_semaphore_waiter() {
    if Server::MySql.skipped() {
        return;
    }
    let (admin, table, [a, b]) = processes("wake_sem").await;
    let semaphore = |store: &SeaOrmLeaseStore, owner: &str| {
        Locks::builder(store.clone())
            .owner(owner)
            .retry_interval(RETRY)
            .build()
            .unwrap()
            .semaphore("exports", 2)
            .unwrap()
    };
    let sa = semaphore(&a, "a");
    let first = sa.try_acquire().await.unwrap().unwrap();
    let second = sa.try_acquire().await.unwrap().unwrap();
    let sb = semaphore(&b, "b");
    let waiter = tokio::spawn(async move {
        let permit = sb.acquire(Duration::from_secs(20)).await.unwrap();
        (Instant::now(), permit)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiter.is_finished(), "both permits are held");
    let released = Instant::now();
    assert!(second.release().await.unwrap());
    let (granted, permit) = waiter.await.unwrap();
    let after = granted.saturating_duration_since(released);
    eprintln!("MariaDB semaphore release to grant in {after:?}");
    assert!(after < WELL_UNDER, "{after:?} after the release");
    assert!(permit.release().await.unwrap());
    assert!(first.release().await.unwrap());
    drop_table(&admin, &table).await;
}

/// A release that comes right after a follower's denial, before its watch first asks who
/// holds the name, still wakes it: the watch finds the name free and wakes the waiter once for
/// the term that denied it. Twenty rounds, each a fresh resource and follower, each released the
/// moment the follower reports the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_right_after_the_denial_is_not_missed() {
    if Server::MySql.skipped() {
        return;
    }
    let (admin, table, [a, b]) = processes("wake_race").await;
    for round in 0..20 {
        let resource = unique("race");
        assert!(a
            .acquire_or_renew(&resource, "a", Duration::from_secs(30))
            .await
            .unwrap()
            .is_held());
        wait_for_signal(&admin, &table, &resource, None).await;
        let follower = elector(&b, &resource, "b", Duration::from_secs(30));
        following(&follower).await;
        let released = Instant::now();
        assert!(a.release(&resource, "a").await.unwrap());
        tokio::time::timeout(WELL_UNDER, follower.watch().wait_for(|s| s.is_leader()))
            .await
            .unwrap_or_else(|_| {
                panic!("round {round}: the release was missed (polls every {RETRY:?})")
            })
            .unwrap();
        eprintln!(
            "round {round}: led {:?} after the release",
            released.elapsed()
        );
        follower.shutdown().await;
    }
    drop_table(&admin, &table).await;
}
