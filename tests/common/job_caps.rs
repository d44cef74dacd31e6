//! Cluster-wide caps (`Job::cap`, `Job::cap_group`), as tests generic over every SeaORM store:
//! two schedulers (two leaders at once) whose jobs share a group of two permits never run more
//! than two at once, and do run two; a run whose permit is taken from it commits nothing and
//! runs again once; caps out of bounds are refused at build. Run by `job_suite!` with the
//! slot and key cases.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use orion_beacon::jobs::{Job, JobError, JobRun, Overlap, CAP_GROUP_PREFIX};
use orion_beacon::{ErrorKind, LeaseStore, SeaOrmLeaseStore};
use tokio::sync::{mpsc, oneshot};

use super::conformance::Harness;
use super::jobs::{leader_of, write, Tables};
use super::unique;

const SECOND: Duration = Duration::from_secs(1);

/// Two schedulers of their own resources (both lead at once), each with a keyed job in the cap
/// group `g` of two permits, keys allowed side by side: across both, at most two runs at once,
/// and two at some point; each run holds a permit of the group (its resource and token named
/// by `JobRun::permit`), and every key runs once.
pub async fn a_cap_group_bounds_runs_across_schedulers<H: Harness<Store = SeaOrmLeaseStore>>(
    h: &H,
) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let group = unique("g");
    let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let permits: Arc<Mutex<Vec<(String, i64)>>> = Arc::default();
    let job = |name: &str| {
        let (writes, now, most, permits) =
            (t.writes.clone(), now.clone(), most.clone(), permits.clone());
        Job::keyed(name, move |run: JobRun| {
            let (writes, now, most, permits) =
                (writes.clone(), now.clone(), most.clone(), permits.clone());
            async move {
                let running = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(running, Ordering::SeqCst);
                if let Some(p) = run.permit() {
                    permits
                        .lock()
                        .unwrap()
                        .push((p.resource().to_owned(), p.token().get()));
                }
                // The work outside the fenced transaction (on SQLite that would hold the
                // write lock, and serialize the runs by itself).
                tokio::time::sleep(Duration::from_millis(200)).await;
                now.fetch_sub(1, Ordering::SeqCst);
                let txn = write(&run, &writes).await?;
                run.commit(txn).await?;
                Ok(())
            }
        })
        .overlap(Overlap::Allow)
        .cap_group(&group, 2)
        .retry_backoff(Duration::from_millis(100), Duration::from_millis(400))
    };
    let a = t.start(&h.store(), "a", vec![job("exports-a")]);
    let b = t
        .builder(&h.separate_store().await, "b")
        .resource(unique("jobs"))
        .job(job("exports-b"))
        .build()
        .unwrap()
        .start();
    leader_of(std::slice::from_ref(&a), 3 * SECOND).await;
    leader_of(std::slice::from_ref(&b), 3 * SECOND).await;
    let mut slots = BTreeSet::new();
    for i in 0..5 {
        for (node, job) in [(&a, "exports-a"), (&b, "exports-b")] {
            let key = format!("{job}/k{i}");
            slots.insert(node.submit(job, &key).await.unwrap().record.slot);
        }
    }
    assert_eq!(slots.len(), 10, "a record per key");
    t.wait_for(&db, 20 * SECOND, "every key of both jobs finished", |r| {
        slots
            .iter()
            .all(|s| r.get(s).is_some_and(|r| r.state == "finished"))
    })
    .await;
    assert_eq!(t.assert_exactly_once(&db).await, 10);
    assert_eq!(
        most.load(Ordering::SeqCst),
        2,
        "at most the group's two permits at once across both schedulers, and that many"
    );
    let held = permits.lock().unwrap().clone();
    let prefix = format!("{CAP_GROUP_PREFIX}{group}#");
    for (resource, _) in &held {
        assert!(
            resource == &format!("{prefix}0") || resource == &format!("{prefix}1"),
            "{resource} is one of the group's two permits"
        );
    }
    let terms: BTreeSet<&(String, i64)> = held.iter().collect();
    assert_eq!(
        terms.len(),
        held.len(),
        "each run a permit term of its own: {held:?}"
    );
    a.shutdown().await;
    b.shutdown().await;
    t.drop(&db).await;
}

/// A capped run whose permit is taken from it (an operator's release of its lease row, as a
/// lapse would end it) before its fenced transaction: its `begin` is refused by the permit's
/// fence (or the run is stopped first, once the renewer sees the permit gone), nothing it
/// wrote commits, and the key runs again, once, under a new permit term. (While a fenced
/// transaction is open, the permit's row cannot be released or taken over: the fence holds
/// it, as a term's.)
pub async fn a_run_whose_permit_is_lost_commits_nothing<H: Harness<Store = SeaOrmLeaseStore>>(
    h: &H,
) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    type Held = (String, String, i64, oneshot::Sender<()>);
    let (tx, mut rx) = mpsc::unbounded_channel::<Held>();
    // Each attempt's outcome: (attempt, its commit's answer).
    type Outcome = (u32, Result<(), ErrorKind>);
    let outcomes: Arc<Mutex<Vec<Outcome>>> = Arc::default();
    let job = {
        let (writes, outcomes) = (t.writes.clone(), outcomes.clone());
        Job::keyed("capped", move |run: JobRun| {
            let (writes, tx, outcomes) = (writes.clone(), tx.clone(), outcomes.clone());
            async move {
                if run.attempt() == 1 {
                    let p = run.permit().expect("a capped run holds a permit");
                    let (go, wait) = oneshot::channel();
                    let _ = tx.send((
                        p.resource().to_owned(),
                        p.candidate().to_owned(),
                        p.token().get(),
                        go,
                    ));
                    let _ = wait.await;
                }
                let committed = match write(&run, &writes).await {
                    Ok(txn) => run.commit(txn).await,
                    Err(e) => Err(e),
                };
                outcomes.lock().unwrap().push((
                    run.attempt(),
                    committed.as_ref().map(|_| ()).map_err(JobError::kind),
                ));
                committed?;
                Ok(())
            }
        })
        .cap(1)
        .retry_backoff(Duration::from_millis(100), Duration::from_millis(400))
    };
    let node = t.start(&h.store(), "n", vec![job]);
    leader_of(std::slice::from_ref(&node), 3 * SECOND).await;
    let s = node.submit("capped", "k").await.unwrap();
    let (resource, candidate, first_token, go) = tokio::time::timeout(3 * SECOND, rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(
        resource.ends_with("/cap/capped#0"),
        "the job's own semaphore: {resource}"
    );
    assert!(h.store().release(&resource, &candidate).await.unwrap());
    let _ = go.send(());
    let records = t
        .wait_for(&db, 10 * SECOND, "the key run again", |r| {
            r.get(&s.record.slot).is_some_and(|r| r.state == "finished")
        })
        .await;
    let rec = &records[&s.record.slot];
    assert_eq!(
        rec.attempts, 2,
        "the first attempt committed nothing: {rec:?}"
    );
    let seen = outcomes.lock().unwrap().clone();
    assert!(
        seen.iter()
            .all(|(attempt, outcome)| (*attempt == 1) == outcome.is_err()),
        "the first attempt refused (or stopped), the second committed: {seen:?}"
    );
    assert!(
        seen.iter()
            .all(|(attempt, outcome)| *attempt != 1 || *outcome == Err(ErrorKind::Lost)),
        "refused as superseded: {seen:?}"
    );
    assert_eq!(t.assert_exactly_once(&db).await, 1);
    let next = h.store().current(&resource).await.unwrap();
    assert!(
        next.as_ref().is_none_or(|l| l.token.get() > first_token),
        "a later permit term has a higher token: {next:?}"
    );
    node.shutdown().await;

    // Caps out of bounds, and bad group names, are refused at build.
    for job in [
        Job::keyed("k", |_run| async { Ok(()) }).cap(0),
        Job::keyed("k", |_run| async { Ok(()) }).cap(1025),
        Job::keyed("k", |_run| async { Ok(()) }).cap_group("", 1),
        Job::keyed("k", |_run| async { Ok(()) }).cap_group(" g", 1),
        Job::keyed("k", |_run| async { Ok(()) }).cap_group("g".repeat(201), 1),
        Job::keyed("k".repeat(250), |_run| async { Ok(()) }).cap(1),
    ] {
        let refused = t.builder(&h.store(), "x").job(job).build().err();
        assert!(
            refused.is_some_and(|e| e.kind() == ErrorKind::InvalidInput),
            "refused at build"
        );
    }
    t.drop(&db).await;
}

/// One permit shared by a keyed job whose run lasts 2.5 leases and a scheduled job every
/// second under the default `Overlap::Skip`: the long run commits under its one permit term
/// (the permit was renewed all along) and lets it go as soon as its end is written (not at
/// its lapse); the slots due meanwhile are recorded skipped, and once the permit is free the
/// slots run again.
pub async fn a_full_cap_skips_slots_and_a_long_run_keeps_its_permit<
    H: Harness<Store = SeaOrmLeaseStore>,
>(
    h: &H,
) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let group = unique("g");
    let (tx, mut rx) = mpsc::unbounded_channel::<(String, i64)>();
    let long = {
        let writes = t.writes.clone();
        Job::keyed("long", move |run: JobRun| {
            let (writes, tx) = (writes.clone(), tx.clone());
            async move {
                if let Some(p) = run.permit() {
                    let _ = tx.send((p.resource().to_owned(), p.token().get()));
                }
                tokio::time::sleep(Duration::from_millis(2_500)).await;
                let txn = write(&run, &writes).await?;
                run.commit(txn).await?;
                Ok(())
            }
        })
        .cap_group(&group, 1)
        .retry_backoff(Duration::from_millis(100), Duration::from_millis(400))
    };
    let tick = super::jobs::writer("tick", &t.writes).cap_group(&group, 1);
    let node = t.start(&h.store(), "n", vec![long, tick]);
    leader_of(std::slice::from_ref(&node), 3 * SECOND).await;
    // A slot of the scheduled job first, then the long key.
    t.wait_for(&db, 5 * SECOND, "a slot finished", |r| {
        r.values().any(|r| r.state == "finished")
    })
    .await;
    let s = node.submit("long", "k").await.unwrap();
    let (resource, token) = tokio::time::timeout(3 * SECOND, rx.recv())
        .await
        .unwrap()
        .unwrap();
    let records = t
        .wait_for(&db, 10 * SECOND, "the long key finished", |r| {
            r.get(&s.record.slot).is_some_and(|r| r.state == "finished")
        })
        .await;
    let started = tokio::time::Instant::now();
    loop {
        let held = h.store().current(&resource).await.unwrap();
        // Another term of the permit (the scheduled job's next run) is not the long run's.
        if !held.is_some_and(|l| l.live && l.token.get() == token) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "the permit is let go once the end is written, not at its lapse"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        records[&s.record.slot].attempts, 1,
        "committed under its first permit term, 2.5 leases after it began"
    );
    let skipped = records.values().filter(|r| r.state == "skipped").count();
    assert!(
        skipped >= 1,
        "slots due while the group's one permit was held are skipped: {records:?}"
    );
    let finished_before = records
        .iter()
        .filter(|(slot, r)| **slot != s.record.slot && r.state == "finished")
        .count();
    t.wait_for(&db, 5 * SECOND, "slots run again", |r| {
        r.iter()
            .filter(|(slot, r)| **slot != s.record.slot && r.state == "finished")
            .count()
            > finished_before
    })
    .await;
    node.shutdown().await;
    t.assert_exactly_once(&db).await;
    t.drop(&db).await;
}

/// A capped run whose permit is lost while its closure is still going (it never reaches a
/// fenced transaction): the closure is cancelled and waited for (its future dropped, a drop
/// that takes a second, longer than the back-off and the next claim) before the next attempt
/// starts, under a permit term of its own; the key then runs once.
pub async fn a_lost_permit_stops_the_closure_before_the_next_attempt<
    H: Harness<Store = SeaOrmLeaseStore>,
>(
    h: &H,
) {
    use std::sync::PoisonError;
    use std::time::Instant;
    /// Records when it was dropped, after a drop that takes a while (a closure slow to stop).
    struct SlowDrop(Arc<Mutex<Option<Instant>>>);
    impl Drop for SlowDrop {
        fn drop(&mut self) {
            std::thread::sleep(SECOND);
            *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        }
    }
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let (tx, mut rx) = mpsc::unbounded_channel::<(String, String, i64)>();
    let dropped: Arc<Mutex<Option<Instant>>> = Arc::default();
    // When the next attempt started, and its permit's token.
    let next_started: Arc<Mutex<Option<(Instant, i64)>>> = Arc::default();
    let job = {
        let (dropped, next_started) = (dropped.clone(), next_started.clone());
        Job::keyed("capped", move |run: JobRun| {
            let (tx, dropped, next_started) = (tx.clone(), dropped.clone(), next_started.clone());
            async move {
                if run.attempt() == 1 {
                    let _stops = SlowDrop(dropped);
                    let p = run.permit().expect("a capped run holds a permit");
                    let _ = tx.send((
                        p.resource().to_owned(),
                        p.candidate().to_owned(),
                        p.token().get(),
                    ));
                    std::future::pending::<()>().await;
                }
                let token = run.permit().map_or(0, |p| p.token().get());
                next_started
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get_or_insert_with(|| (Instant::now(), token));
                Ok(())
            }
        })
        .cap(1)
        .retry_backoff(Duration::from_millis(100), Duration::from_millis(400))
    };
    let node = t.start(&h.store(), "n", vec![job]);
    leader_of(std::slice::from_ref(&node), 3 * SECOND).await;
    let s = node.submit("capped", "k").await.unwrap();
    let (resource, candidate, first_token) = tokio::time::timeout(3 * SECOND, rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(h.store().release(&resource, &candidate).await.unwrap());
    let records = t
        .wait_for(&db, 10 * SECOND, "the key run again", |r| {
            r.get(&s.record.slot).is_some_and(|r| r.state == "finished")
        })
        .await;
    node.shutdown().await;
    assert_eq!(records[&s.record.slot].attempts, 2, "{records:?}");
    // Copied out before judged: no assertion panics while a lock is held.
    let dropped = *dropped.lock().unwrap_or_else(PoisonError::into_inner);
    let next_started = *next_started.lock().unwrap_or_else(PoisonError::into_inner);
    let dropped =
        dropped.expect("the first attempt's closure was cancelled when its permit was lost");
    let (next, next_token) = next_started.expect("the second attempt ran");
    assert!(
        next_token != first_token && next_token != 0,
        "the next attempt holds a permit term of its own ({first_token}, then {next_token})"
    );
    assert!(
        next > dropped,
        "the next attempt started only once the cancelled closure was gone ({:?} before)",
        dropped.saturating_duration_since(next)
    );
    t.drop(&db).await;
}

/// A capped start that found every permit held asks again within half a second, not at the
/// scheduler's next poll (10 s here): a key waits while an operator holds the cap's one permit,
/// and starts within 3 s of its release.
pub async fn a_full_cap_is_asked_again_within_half_a_second<
    H: Harness<Store = SeaOrmLeaseStore>,
>(
    h: &H,
) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let (tx, mut rx) = mpsc::unbounded_channel::<tokio::time::Instant>();
    let job = Job::keyed("capped", move |_run: JobRun| {
        let tx = tx.clone();
        async move {
            let _ = tx.send(tokio::time::Instant::now());
            Ok(())
        }
    })
    .cap(1);
    // The job's one permit, held by someone else.
    let permit = format!("{}/cap/capped#0", t.resource);
    let held = h
        .store()
        .acquire_or_renew(&permit, "operator", Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        matches!(held, orion_beacon::store::LeaseOutcome::Acquired(_)),
        "{held:?}"
    );
    let node = t
        .builder(&h.store(), "n")
        .poll_interval(Duration::from_secs(10))
        .job(job)
        .build()
        .unwrap()
        .start();
    leader_of(std::slice::from_ref(&node), 3 * SECOND).await;
    let s = node.submit("capped", "k").await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(
        rx.try_recv().is_err(),
        "no run while the one permit is held"
    );
    let released = tokio::time::Instant::now();
    assert!(h.store().release(&permit, "operator").await.unwrap());
    let started = tokio::time::timeout(15 * SECOND, rx.recv())
        .await
        .expect("the key ran once the permit was free")
        .unwrap();
    let after = started.saturating_duration_since(released);
    assert!(
        after < 3 * SECOND,
        "started {after:?} after the permit was released (asked again within 500 ms, the \
         poll is 10 s)"
    );
    t.wait_for(&db, 5 * SECOND, "the key finished", |r| {
        r.get(&s.record.slot).is_some_and(|r| r.state == "finished")
    })
    .await;
    node.shutdown().await;
    t.drop(&db).await;
}
