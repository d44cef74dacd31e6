//! A batch renew beside the holders' own fenced transactions (PostgreSQL, MariaDB in both
//! statement forms; the batch sets its own isolation level, and the fences under READ
//! COMMITTED have their own suite in `fences`): it never
//! waits for a row such a transaction holds, never locks a row that is not the batch's, and
//! never joins a deadlock with a transaction that fences with several of its leases. SQLite
//! has no row locks (a fenced transaction holds the database's write lock), so none of this
//! applies there.

use crate::common;

use std::time::Duration;

use orion_beacon::{store::LeaseOutcome, Lease, LeaseStore, SeaOrmLeaseStore, Term};
use sea_orm::TransactionTrait;
use tokio::time::Instant;

use common::conformance::Harness;
use common::sql::SqlHarness;
use common::unique;

/// Long enough that nothing lapses during a test.
const LEASE: Duration = Duration::from_secs(10);

async fn acquired(store: &SeaOrmLeaseStore, resource: &str, holder: &str) -> Lease {
    match store
        .acquire_or_renew(resource, holder, LEASE)
        .await
        .unwrap()
    {
        LeaseOutcome::Acquired(lease) => lease,
        other => panic!("a fresh lease is acquired: {other:?}"),
    }
}

fn term(lease: &Lease) -> Term<'_> {
    Term {
        resource: &lease.resource,
        holder: &lease.holder,
        token: lease.token,
    }
}

fn names(leases: &[Lease]) -> Vec<&str> {
    leases.iter().map(|l| l.resource.as_str()).collect()
}

/// A small table (three rows): `q` runs a healthy fenced transaction of 2 s. A batch of other
/// leases is renewed at once (MariaDB scanned the small table whole and waited for `q`'s row);
/// a batch with `q` in it renews the others at once and answers `q` as neither renewed nor
/// lost; once the transaction is over, `q` renews again.
pub async fn a_batch_renew_never_waits_for_a_fenced_row(h: &SqlHarness) {
    let store = h.store();
    let r = unique("busy");
    let q = acquired(&store, &format!("{r}-q"), "q").await;
    let p1 = acquired(&store, &format!("{r}-p1"), "p").await;
    let p2 = acquired(&store, &format!("{r}-p2"), "p").await;
    let txn = h.db().begin().await.unwrap();
    store.fence(&txn, term(&q)).await.unwrap();
    let busy = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        txn.commit().await.unwrap();
    });

    let started = Instant::now();
    let renewals = store
        .renew_all(&[p1.clone(), p2.clone()], LEASE)
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(
        names(&renewals.renewed),
        [p1.resource.as_str(), &p2.resource]
    );
    assert!(
        took < Duration::from_millis(700),
        "a batch of other leases waited {took:?} for a row it does not renew"
    );

    let started = Instant::now();
    let renewals = store
        .renew_all(&[q.clone(), p1.clone()], LEASE)
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(
        names(&renewals.renewed),
        [p1.resource.as_str()],
        "{renewals:?}"
    );
    assert_eq!(
        names(&renewals.unanswered),
        [q.resource.as_str()],
        "{renewals:?}"
    );
    assert!(renewals.lost.is_empty(), "{renewals:?}");
    assert!(
        took < Duration::from_millis(1_200),
        "a batch with a fenced row in it answered after {took:?}"
    );

    busy.await.unwrap();
    let renewals = store
        .renew_all(std::slice::from_ref(&q), LEASE)
        .await
        .unwrap();
    assert_eq!(
        names(&renewals.renewed),
        [q.resource.as_str()],
        "{renewals:?}"
    );
}

/// One holder leads `a` and `b`; the application's transactions fence with both, one after
/// the other (in turn in both orders), while the store renews both in batches every 10 ms. No transaction fails (a
/// MariaDB deadlock with the batch failed 58-61 of 100) or stalls (PostgreSQL's deadlock
/// detection stalled each for 1 s), and no lease is lost.
pub async fn a_fence_with_two_leases_never_deadlocks_with_the_batch(h: &SqlHarness) {
    const ROUNDS: usize = 40;
    let store = h.store();
    let r = unique("pair");
    let a = acquired(&store, &format!("{r}-a"), "me").await;
    let b = acquired(&store, &format!("{r}-b"), "me").await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let renewer = {
        let (store, mut held, stop) = (
            h.separate_store().await,
            vec![a.clone(), b.clone()],
            stop.clone(),
        );
        tokio::spawn(async move {
            let (mut renews, mut lost) = (0usize, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Both orders: the batch's own order must not matter.
                held.reverse();
                let renewals = store.renew_all(&held, LEASE).await.unwrap();
                lost.extend(renewals.lost);
                renews += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            (renews, lost)
        })
    };
    let mut slowest = Duration::ZERO;
    for round in 0..ROUNDS {
        let started = Instant::now();
        let txn = h.db().begin().await.unwrap();
        // Both orders: whichever order the batch locks in, one of them is the other.
        let (first, second) = if round % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let fenced = async {
            store.fence(&txn, term(first)).await?;
            tokio::time::sleep(Duration::from_millis(15)).await;
            store.fence(&txn, term(second)).await?;
            tokio::time::sleep(Duration::from_millis(15)).await;
            Ok::<_, orion_beacon::FenceError>(())
        }
        .await;
        if let Err(err) = fenced {
            panic!("round {round}: a fence failed beside the batch renew: {err:?}");
        }
        txn.commit().await.unwrap();
        slowest = slowest.max(started.elapsed());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (renews, lost) = renewer.await.unwrap();
    eprintln!("{ROUNDS} fenced transactions beside {renews} batch renews, slowest {slowest:?}");
    assert!(lost.is_empty(), "leases lost: {lost:?}");
    assert!(
        slowest < Duration::from_millis(500),
        "a fenced transaction of 30 ms took {slowest:?} beside the batch renew"
    );
    // Side by side: a busy lease is renewed alone, waiting up to 200 ms for its row, so the
    // renewer's rounds are fewer than the transactions, but it ran throughout.
    assert!(
        renews >= ROUNDS / 8,
        "the batch renewed only {renews} times"
    );
}

/// The statements of a batch renew lock no row that is not the batch's, on a small table (a
/// few rows, which the planner would rather scan whole): MariaDB's locking read and update
/// look each row up by its primary key (`eq_ref`, never `ALL`); PostgreSQL's update locks its
/// rows in a `LockRows` step, above the filter that picks the batch's rows.
pub async fn a_batch_renew_looks_its_rows_up_by_key(h: &SqlHarness) {
    use sea_orm::{ConnectionTrait, DbBackend, Statement};
    let store = h.store();
    let r = unique("plan");
    let mut held = Vec::new();
    for i in 0..3 {
        held.push(acquired(&store, &format!("{r}-{i}"), "me").await);
    }
    let table = store.table().to_owned();
    let statements = store.renew_all_statements(&held[..2], LEASE).unwrap();
    let explain = |stmt: &Statement| {
        Statement::from_sql_and_values(
            stmt.db_backend,
            format!("EXPLAIN {}", stmt.sql),
            stmt.values.clone().unwrap_or(sea_orm::Values(Vec::new())),
        )
    };
    match h.db().get_database_backend() {
        DbBackend::MySql => {
            // The locking read and the update; the last read locks nothing.
            assert_eq!(statements.len(), 3);
            for stmt in &statements[..2] {
                let rows = h.db().query_all_raw(explain(stmt)).await.unwrap();
                let mut seen = Vec::new();
                for row in &rows {
                    let name: String = row.try_get("", "table").unwrap();
                    let access: String = row.try_get("", "type").unwrap();
                    let key: Option<String> = row.try_get("", "key").unwrap();
                    if name == table {
                        seen.push((access, key));
                    }
                }
                assert_eq!(
                    seen,
                    [("eq_ref".to_owned(), Some("PRIMARY".to_owned()))],
                    "{}",
                    stmt.sql
                );
            }
        }
        DbBackend::Postgres => {
            assert_eq!(statements.len(), 1);
            let rows = h.db().query_all_raw(explain(&statements[0])).await.unwrap();
            let plan: Vec<String> = rows
                .iter()
                .map(|row| row.try_get_by_index::<String>(0).unwrap())
                .collect();
            let plan = plan.join("\n");
            assert!(plan.contains("LockRows"), "{plan}");
            assert!(
                statements[0].sql.contains("SKIP LOCKED"),
                "{}",
                statements[0].sql
            );
        }
        other => panic!("no plan to check on {other:?}"),
    }
}

/// Lease 1 s: the work under `b-stuck` is stuck in a long statement inside its fenced
/// transaction, and the same `Locks` holds a healthy `a-free`. `a-free` is kept (it was lost
/// at 0.79 s while the batch waited for `b-stuck`'s row) and a rival's `try_acquire` of it
/// answers at once; `b-stuck` alone is lost.
pub async fn a_stuck_statement_costs_only_its_own_lock(h: &SqlHarness) {
    use orion_beacon::locks::Locks;
    use sea_orm::{ConnectionTrait, DbBackend};
    const STUCK_SECS: u64 = 3;
    let locks = Locks::builder(h.store())
        .lease_duration(Duration::from_secs(1))
        .renew_interval(Duration::from_millis(250))
        .build()
        .unwrap();
    let r = unique("stuck");
    let free = locks.lock(format!("{r}-a-free")).unwrap();
    let free_guard = free.try_acquire().await.unwrap().unwrap();
    let stuck_guard = locks
        .lock(format!("{r}-b-stuck"))
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    let txn = h.db().begin().await.unwrap();
    stuck_guard.fence(&txn).await.unwrap();
    let sleep = match h.db().get_database_backend() {
        DbBackend::Postgres => format!("SELECT pg_sleep({STUCK_SECS})"),
        _ => format!("SELECT SLEEP({STUCK_SECS})"),
    };
    let stuck = tokio::spawn(async move {
        // Whatever becomes of it (nobody takes `b-stuck` over here): it only has to be stuck.
        let _ = txn.execute_unprepared(&sleep).await;
        let _ = txn.rollback().await;
    });
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    assert!(
        free_guard.is_held(),
        "a healthy lock was lost beside a stuck one"
    );
    assert!(
        !stuck_guard.is_held(),
        "a lock that could not be renewed for 2 leases is held"
    );
    let rival = Locks::new(h.separate_store().await).unwrap();
    let started = Instant::now();
    let answer = rival
        .lock(free.name())
        .unwrap()
        .try_acquire()
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(answer.is_none(), "a held lock was granted to a rival");
    assert!(
        took < Duration::from_millis(500),
        "a rival's try_acquire of a held lock answered after {took:?}"
    );
    stuck.await.unwrap();
    assert!(free_guard.is_held());
    free_guard.release().await.unwrap();
}

/// Lease 3 s: 64 tasks of one `Locks` wait for a busy lock whose holder (another process)
/// fences 1.2 s transactions back to back, and the same `Locks` holds an uncontended lock. The
/// uncontended lock is kept: its renews never queue behind the waiters' attempts for the
/// store's sessions (it was lost after 2.7-3.5 s while the attempts filled them); and a free
/// lock's `try_acquire` answers at once.
pub async fn waiters_never_hold_up_the_renews(h: &SqlHarness) {
    use orion_beacon::locks::Locks;
    const WAITERS: usize = 64;
    let lease = Duration::from_secs(3);
    let locks = Locks::builder(h.store())
        .lease_duration(lease)
        .renew_interval(Duration::from_secs(1))
        .retry_interval(Duration::from_millis(50))
        .build()
        .unwrap();
    let r = unique("queue");
    let busy_name = format!("{r}-busy");
    let holder = Locks::builder(h.separate_store().await)
        .lease_duration(Duration::from_secs(30))
        .build()
        .unwrap();
    let busy = holder
        .lock(&busy_name)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    let free = locks
        .lock(format!("{r}-free"))
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let fencer = {
        let (db, stop) = (h.db().clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let txn = db.begin().await.unwrap();
                busy.fence(&txn).await.unwrap();
                tokio::time::sleep(Duration::from_millis(1_200)).await;
                txn.commit().await.unwrap();
            }
            busy
        })
    };
    let waiters: Vec<_> = (0..WAITERS)
        .map(|_| {
            let lock = locks.lock(&busy_name).unwrap();
            tokio::spawn(async move { lock.acquire(Duration::from_secs(4)).await.is_ok() })
        })
        .collect();
    // An unrelated lock of the same process is answered at once, not behind the waiters'
    // attempts on the busy one (one attempt at a time per lock takes a session).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let asked = Instant::now();
    let other = locks
        .lock(format!("{r}-other"))
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .expect("a free lock");
    let took = asked.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "a free lock's try_acquire waited {took:?} behind {WAITERS} waiters of another"
    );
    other.release().await.unwrap();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(4) {
        assert!(
            free.is_held(),
            "the uncontended lock was lost after {:?} beside {WAITERS} waiters",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for waiter in waiters {
        assert!(
            !waiter.await.unwrap(),
            "a waiter got a lock that stayed held"
        );
    }
    fencer.await.unwrap().release().await.unwrap();
    assert!(free.is_held());
    free.release().await.unwrap();
    let left: Vec<_> = h
        .store()
        .current_all(&[busy_name.clone(), format!("{r}-free")])
        .await
        .unwrap()
        .into_iter()
        .filter(|l| l.live)
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// Every attempt slot of a `Locks`'s store is taken by acquires that wait on rows other
/// processes' fenced transactions hold; an acquire of a free lock queued behind them, whose
/// caller stops waiting (a timeout around `try_acquire`), is never sent: once the slots come
/// free, the free lock's row was never written (sent, it would have been granted to a hold
/// nobody has, then released: a row with a token).
pub async fn a_queued_acquire_whose_caller_left_is_never_sent(h: &SqlHarness) {
    use orion_beacon::locks::Locks;
    // More busy locks than the store has sessions: every slot waits on a busy row.
    const BUSY: usize = 6;
    let locks = Locks::builder(h.store()).build().unwrap();
    let holder = Locks::builder(h.separate_store().await).build().unwrap();
    let r = unique("queued");
    let mut held = Vec::new();
    for i in 0..BUSY {
        let guard = holder
            .lock(format!("{r}-busy-{i}"))
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .unwrap();
        held.push(guard);
    }
    // Each busy lock's holder fences a transaction that holds its row for 3 s.
    let mut fences = Vec::new();
    for guard in &held {
        let txn = h.db().begin().await.unwrap();
        guard.fence(&txn).await.unwrap();
        fences.push(txn);
    }
    let waiters: Vec<_> = (0..BUSY)
        .map(|i| {
            let lock = locks.lock(format!("{r}-busy-{i}")).unwrap();
            tokio::spawn(async move { lock.acquire(Duration::from_secs(5)).await.ok() })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let free = format!("{r}-free");
    let gave_up = tokio::time::timeout(
        Duration::from_millis(200),
        locks.lock(&free).unwrap().try_acquire(),
    )
    .await;
    assert!(
        gave_up.is_err(),
        "the free lock's acquire waited behind the busy ones: {gave_up:?}"
    );
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    for txn in fences {
        txn.commit().await.unwrap();
    }
    for guard in held {
        guard.release().await.unwrap();
    }
    for waiter in waiters {
        if let Some(guard) = waiter.await.unwrap() {
            guard.release().await.unwrap();
        }
    }
    // Time for an attempt that was sent after all to be granted and released.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let row = h.store().current(&free).await.unwrap();
    assert!(
        row.is_none(),
        "the acquire given up while queued was sent: {row:?}"
    );
}

/// Tasks of one `Locks` wait for a lock whose holder (another process) runs a 3 s fenced
/// transaction; a `try_acquire` of that lock from the same `Locks` answers at once (`None`:
/// another acquire of this process is asking for it), not after the waiters' attempts ahead of
/// it (each of which waits for the row). It took the whole transaction before.
pub async fn a_try_beside_waiters_of_the_same_lock_answers_at_once(h: &SqlHarness) {
    use orion_beacon::locks::Locks;
    let locks = Locks::builder(h.store())
        .retry_interval(Duration::from_millis(50))
        .build()
        .unwrap();
    let holder = Locks::builder(h.separate_store().await).build().unwrap();
    let name = unique("tried");
    let busy = holder
        .lock(&name)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    let txn = h.db().begin().await.unwrap();
    busy.fence(&txn).await.unwrap();
    let waiters: Vec<_> = (0..8)
        .map(|_| {
            let lock = locks.lock(&name).unwrap();
            tokio::spawn(async move { lock.acquire(Duration::from_secs(6)).await.ok() })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let asked = Instant::now();
    let tried = locks.lock(&name).unwrap().try_acquire().await.unwrap();
    let took = asked.elapsed();
    assert!(tried.is_none(), "the lock is held");
    assert!(
        took < Duration::from_secs(1),
        "a try beside 8 waiters of the same lock took {took:?}"
    );
    tokio::time::sleep(Duration::from_millis(2_700).saturating_sub(asked.elapsed())).await;
    txn.commit().await.unwrap();
    busy.release().await.unwrap();
    let mut got = 0;
    for waiter in waiters {
        if let Some(guard) = waiter.await.unwrap() {
            got += 1;
            guard.release().await.unwrap();
        }
    }
    assert!(got >= 1, "a waiter took the lock once it came free");
}

/// MariaDB, lease 1 s: every attempt slot of a `Locks`'s store is taken for 2.5 s by acquires that wait
/// on rows other processes' fenced transactions hold; an acquire of a free lock waits that
/// long for a slot, then is granted. The grant is kept, token 1: its deadline counts from when
/// its statement went out, not from before the wait (which had used up the lease: the grant
/// was released as too late and asked for again, token 2).
pub async fn a_grant_after_a_long_wait_for_a_slot_is_kept(h: &SqlHarness) {
    use orion_beacon::locks::Locks;
    const BUSY: usize = 6;
    let locks = Locks::builder(h.store())
        .lease_duration(Duration::from_secs(1))
        .renew_interval(Duration::from_millis(300))
        .build()
        .unwrap();
    let holder = Locks::builder(h.separate_store().await).build().unwrap();
    let r = unique("slow");
    let mut held = Vec::new();
    let mut fences = Vec::new();
    for i in 0..BUSY {
        let guard = holder
            .lock(format!("{r}-busy-{i}"))
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .unwrap();
        let txn = h.db().begin().await.unwrap();
        guard.fence(&txn).await.unwrap();
        fences.push(txn);
        held.push(guard);
    }
    let waiters: Vec<_> = (0..BUSY)
        .map(|i| {
            let lock = locks.lock(format!("{r}-busy-{i}")).unwrap();
            tokio::spawn(async move { lock.try_acquire().await.ok().flatten() })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let free = locks.lock(format!("{r}-free")).unwrap();
    let acquire = tokio::spawn(async move { free.acquire(Duration::from_secs(8)).await });
    tokio::time::sleep(Duration::from_millis(2_300)).await;
    for txn in fences {
        txn.commit().await.unwrap();
    }
    let guard = acquire.await.unwrap().unwrap();
    assert_eq!(
        guard.token().get(),
        1,
        "the first grant was kept, not released as too late and asked for again"
    );
    assert!(guard.is_held());
    guard.release().await.unwrap();
    for waiter in waiters {
        assert!(waiter.await.unwrap().is_none(), "the busy locks are held");
    }
    for guard in held {
        guard.release().await.unwrap();
    }
}

/// A's lease lapsed and B took the resource; B's fenced transaction holds the row. A's batch
/// renew reports A's lease lost at once, not as busy (MySQL/MariaDB lock a row before they
/// check its term, so A's own renew of it would find the row busy, not gone).
pub async fn a_lease_another_term_holds_fenced_is_lost_not_busy(h: &SqlHarness) {
    let store = h.store();
    let r = unique("taken");
    let a = match store
        .acquire_or_renew(&r, "a", Duration::from_millis(200))
        .await
        .unwrap()
    {
        LeaseOutcome::Acquired(lease) => lease,
        other => panic!("{other:?}"),
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    let b = acquired(&store, &r, "b").await;
    assert!(b.token > a.token);
    let txn = h.db().begin().await.unwrap();
    store.fence(&txn, term(&b)).await.unwrap();
    let started = Instant::now();
    let renewals = store
        .renew_all(std::slice::from_ref(&a), LEASE)
        .await
        .unwrap();
    let took = started.elapsed();
    txn.commit().await.unwrap();
    assert_eq!(renewals.lost, [a], "{renewals:?}");
    assert!(
        took < Duration::from_secs(1),
        "a lost lease took {took:?} to be reported"
    );
}

macro_rules! busy_rows_suite {
    ($setup:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_batch_renew_never_waits_for_a_fenced_row() {
            if let Some(h) = $setup.await {
                crate::busy_rows::a_batch_renew_never_waits_for_a_fenced_row(&h).await;
                h.teardown().await;
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_batch_renew_looks_its_rows_up_by_key() {
            if let Some(h) = $setup.await {
                crate::busy_rows::a_batch_renew_looks_its_rows_up_by_key(&h).await;
                h.teardown().await;
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_stuck_statement_costs_only_its_own_lock() {
            if let Some(h) = $setup.await {
                crate::busy_rows::a_stuck_statement_costs_only_its_own_lock(&h).await;
                h.teardown().await;
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_lease_another_term_holds_fenced_is_lost_not_busy() {
            if let Some(h) = $setup.await {
                crate::busy_rows::a_lease_another_term_holds_fenced_is_lost_not_busy(&h).await;
                h.teardown().await;
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_queued_acquire_whose_caller_left_is_never_sent() {
            if let Some(h) = $setup.await {
                crate::busy_rows::a_queued_acquire_whose_caller_left_is_never_sent(&h).await;
                h.teardown().await;
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_try_beside_waiters_of_the_same_lock_answers_at_once() {
            if let Some(h) = $setup.await {
                crate::busy_rows::a_try_beside_waiters_of_the_same_lock_answers_at_once(&h).await;
                h.teardown().await;
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn waiters_never_hold_up_the_renews() {
            if let Some(h) = $setup.await {
                crate::busy_rows::waiters_never_hold_up_the_renews(&h).await;
                h.teardown().await;
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_fence_with_two_leases_never_deadlocks_with_the_batch() {
            if let Some(h) = $setup.await {
                crate::busy_rows::a_fence_with_two_leases_never_deadlocks_with_the_batch(&h).await;
                h.teardown().await;
            }
        }
    };
}

/// The grant after a long wait for a slot (MariaDB: there an acquire waits for a busy row
/// until its transaction ends, so the slots stay taken; PostgreSQL answers such an acquire
/// within its bound, and the queue never grows past a lease).
macro_rules! slow_slot_suite {
    ($setup:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_grant_after_a_long_wait_for_a_slot_is_kept() {
            if let Some(h) = $setup.await {
                crate::busy_rows::a_grant_after_a_long_wait_for_a_slot_is_kept(&h).await;
                h.teardown().await;
            }
        }
    };
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use crate::common::Server;
    busy_rows_suite!(SqlHarness::server(Server::Postgres));
}

#[cfg(feature = "mysql")]
mod mariadb {
    use super::*;
    busy_rows_suite!(SqlHarness::mysql(orion_beacon::MySqlUpsert::Returning));
    slow_slot_suite!(SqlHarness::mysql(orion_beacon::MySqlUpsert::Returning));
}

#[cfg(feature = "mysql")]
mod mariadb_transaction_form {
    use super::*;
    busy_rows_suite!(SqlHarness::mysql(orion_beacon::MySqlUpsert::Transaction));
    slow_slot_suite!(SqlHarness::mysql(orion_beacon::MySqlUpsert::Transaction));
}
