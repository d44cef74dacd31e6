//! Spread runs (`JobsBuilder::spread_runs`), as tests generic over every SeaORM store: runs
//! of one job go to several node processes, never more than a node's limit on one; a runner
//! killed mid-run on a node that does not lead has its slot run once more, by a hold with a
//! higher token, and its late writes refused; keys spread over the nodes run once each, never
//! more than their cap at once. Run by `job_suite!` with the slot, key and cap cases.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use orion_beacon::jobs::{Job, JobError, JobRun, JobsHandle, Overlap, Schedule};
use orion_beacon::{ErrorKind, SeaOrmLeaseStore};
use sea_orm::sea_query::{Alias, Query};
use sea_orm::{ConnectionTrait, TransactionTrait};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::conformance::Harness;
use super::jobs::{leader_of, write, Tables};

const SECOND: Duration = Duration::from_secs(1);

/// Runs under way per node, and the most seen at once on each.
#[derive(Default)]
struct PerNode {
    now: Mutex<BTreeMap<String, usize>>,
    most: Mutex<BTreeMap<String, usize>>,
    ran: Mutex<Vec<(String, i64)>>,
}

impl PerNode {
    fn started(&self, node: &str, slot: i64) {
        let mut now = self.now.lock().unwrap();
        let n = now.entry(node.to_owned()).or_default();
        *n += 1;
        let n = *n;
        drop(now);
        let mut most = self.most.lock().unwrap();
        let m = most.entry(node.to_owned()).or_default();
        *m = (*m).max(n);
        drop(most);
        self.ran.lock().unwrap().push((node.to_owned(), slot));
    }

    fn ended(&self, node: &str) {
        if let Some(n) = self.now.lock().unwrap().get_mut(node) {
            *n -= 1;
        }
    }
}

/// The job `tick`, every second, runs side by side (at most `at_once`): each run is counted
/// in `seen` as node `node`'s, does `work` outside the database, then its fenced write and
/// commit.
fn timed(t: &Tables, seen: &Arc<PerNode>, node: &str, work: Duration, at_once: usize) -> Job {
    let (writes, seen, node) = (t.writes.clone(), seen.clone(), node.to_owned());
    Job::new(
        "tick",
        Schedule::every(SECOND).unwrap(),
        move |run: JobRun| {
            let (writes, seen, node) = (writes.clone(), seen.clone(), node.clone());
            async move {
                seen.started(&node, run.slot_millis());
                tokio::time::sleep(work).await;
                seen.ended(&node);
                let txn = write(&run, &writes).await?;
                run.commit(txn).await?;
                Ok(())
            }
        },
    )
    .overlap(Overlap::Allow)
    .max_running(at_once)
    .retry_backoff(Duration::from_millis(100), Duration::from_millis(400))
}

/// A leader that runs nothing itself (`spread_runs(0)`) and two runner processes that run at
/// most one run each: a job whose slots (every second) each take 2.5 s, side by side, runs on
/// both runners, never two at once on either (a third start waits, claimed), each finished
/// slot written once, by the hold that finished it.
pub async fn spread_runs_use_several_nodes_within_their_limit<
    H: Harness<Store = SeaOrmLeaseStore>,
>(
    h: &H,
) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let seen = Arc::new(PerNode::default());
    // The work outside the fenced transaction (on SQLite that would hold the write lock, and
    // serialize the runs by itself).
    let job = |node: &str| timed(&t, &seen, node, Duration::from_millis(2_500), 6);
    let mut nodes: Vec<JobsHandle> = vec![t
        .builder(&h.store(), "lead")
        .spread_runs(0)
        .job(job("lead"))
        .build()
        .unwrap()
        .start()];
    leader_of(&nodes, 3 * SECOND).await;
    for id in ["r1", "r2"] {
        let store = h.separate_store().await;
        nodes.push(
            t.builder(&store, id)
                .spread_runs(1)
                .job(job(id))
                .build()
                .unwrap()
                .start(),
        );
    }
    tokio::time::sleep(Duration::from_millis(7_000)).await;
    assert!(nodes[0].elector().is_leader(), "the leader did not change");
    for n in &nodes {
        n.shutdown().await;
    }
    let finished = t.assert_exactly_once(&db).await;
    let most = seen.most.lock().unwrap().clone();
    let ran = seen.ran.lock().unwrap().clone();
    assert!(finished >= 3, "slots finished: {finished}; ran {ran:?}");
    assert_eq!(
        most.keys().map(String::as_str).collect::<Vec<_>>(),
        ["r1", "r2"],
        "runs on both runners, none on the leader that runs none: {ran:?}"
    );
    assert!(
        most.values().all(|m| *m == 1),
        "at most one run at once on a runner: {most:?} ({ran:?})"
    );
    // Each slot started once (no attempt failed here).
    let slots: BTreeSet<i64> = ran.iter().map(|(_, s)| *s).collect();
    assert_eq!(slots.len(), ran.len(), "a slot started twice: {ran:?}");
    t.drop(&db).await;
}

/// A leader that runs nothing itself (`spread_runs(0)`) and two runner processes: the runner
/// that got the first run is killed inside it. The slot runs once more on the other runner
/// (attempt 2, a token above the dead run's on the job's one run hold), is written once, and
/// the dead run's late begin and commit are refused.
pub async fn a_runner_killed_mid_run_runs_once_more_and_its_late_writes_are_refused<
    H: Harness<Store = SeaOrmLeaseStore>,
>(
    h: &H,
) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let (tx, mut rx) = mpsc::unbounded_channel::<(String, JobRun)>();
    let once = Arc::new(AtomicBool::new(false));
    let job = |node: &str| {
        let (writes, once, tx, node) =
            (t.writes.clone(), once.clone(), tx.clone(), node.to_owned());
        Job::new(
            "tick",
            Schedule::every(SECOND).unwrap(),
            move |run: JobRun| {
                let (writes, once, tx, node) =
                    (writes.clone(), once.clone(), tx.clone(), node.clone());
                async move {
                    if !once.swap(true, Ordering::SeqCst) {
                        let _ = tx.send((node, run.clone()));
                        std::future::pending::<()>().await;
                    }
                    let txn = write(&run, &writes).await?;
                    run.commit(txn).await?;
                    Ok(())
                }
            },
        )
        .retry_backoff(Duration::from_millis(100), Duration::from_millis(400))
    };
    let lead = t
        .builder(&h.store(), "lead")
        .spread_runs(0)
        .job(job("lead"))
        .build()
        .unwrap()
        .start();
    leader_of(std::slice::from_ref(&lead), 3 * SECOND).await;
    let mut runners = BTreeMap::new();
    for id in ["r1", "r2"] {
        let store = h.separate_store().await;
        runners.insert(
            id.to_owned(),
            t.builder(&store, id)
                .spread_runs(1)
                .job(job(id))
                .build()
                .unwrap()
                .start(),
        );
    }
    let (node, stalled) = tokio::time::timeout(5 * SECOND, rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_ne!(node, "lead", "a leader with spread_runs(0) runs nothing");
    assert!(
        lead.elector().is_leader(),
        "the run is not on the leader's node"
    );
    let slot = stalled.slot_millis();
    let stalled_token = stalled.token().get();
    assert_eq!(
        stalled.term().resource(),
        format!("{}/run/tick#0", t.resource),
        "the run's term is the job's run hold"
    );
    // The runner's process dies (its renews stop with it).
    runners[&node].abort().await;
    let records = t
        .wait_for(&db, 10 * SECOND, "the slot run again", |r| {
            r.get(&slot).is_some_and(|r| r.state == "finished")
        })
        .await;
    let rec = &records[&slot];
    assert_eq!(rec.attempts, 2, "{rec:?}");
    assert!(
        rec.finished_token.unwrap() > stalled_token,
        "the next run's hold has a higher token: {rec:?} after {stalled_token}"
    );
    // The dead run wakes up and tries to finish.
    let err = stalled.begin().await.unwrap_err();
    assert!(matches!(err, JobError::Superseded { .. }), "{err:?}");
    assert_eq!(err.kind(), ErrorKind::Lost);
    let txn = db.begin().await.unwrap();
    txn.execute(
        &Query::insert()
            .into_table(Alias::new(&t.writes))
            .columns(["slot", "token"].map(Alias::new))
            .values_panic([slot.into(), stalled_token.into()])
            .to_owned(),
    )
    .await
    .unwrap();
    let err = stalled.commit(txn).await.unwrap_err();
    assert!(matches!(err, JobError::Superseded { .. }), "{err:?}");
    lead.shutdown().await;
    for r in runners.values() {
        r.shutdown().await;
    }
    t.assert_exactly_once(&db).await;
    t.drop(&db).await;
}

/// Three node processes that spread runs (one each), a keyed job whose keys may run side by
/// side under a cap of two permits: twelve keys submitted from every node each run once, on
/// more than one node, never more than two at once across the cluster, and two at some point.
pub async fn keys_spread_over_nodes_run_once_within_their_cap<
    H: Harness<Store = SeaOrmLeaseStore>,
>(
    h: &H,
) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let seen = Arc::new(PerNode::default());
    let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let job = |node: &str| {
        let (writes, seen, node, now, most) = (
            t.writes.clone(),
            seen.clone(),
            node.to_owned(),
            now.clone(),
            most.clone(),
        );
        Job::keyed("backfill", move |run: JobRun| {
            let (writes, seen, node, now, most) = (
                writes.clone(),
                seen.clone(),
                node.clone(),
                now.clone(),
                most.clone(),
            );
            async move {
                let running = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(running, Ordering::SeqCst);
                seen.started(&node, run.slot_millis());
                tokio::time::sleep(Duration::from_millis(300)).await;
                seen.ended(&node);
                now.fetch_sub(1, Ordering::SeqCst);
                let txn = write(&run, &writes).await?;
                run.commit(txn).await?;
                Ok(())
            }
        })
        .overlap(Overlap::Allow)
        .cap(2)
        .retry_backoff(Duration::from_millis(100), Duration::from_millis(400))
    };
    let mut nodes: Vec<JobsHandle> = Vec::new();
    for i in 0..3 {
        let store = if i == 0 {
            h.store()
        } else {
            h.separate_store().await
        };
        let id = format!("n{i}");
        nodes.push(
            t.builder(&store, &id)
                .spread_runs(1)
                .job(job(&id))
                .build()
                .unwrap()
                .start(),
        );
    }
    leader_of(&nodes, 3 * SECOND).await;
    let mut slots = BTreeSet::new();
    for i in 0..12 {
        let node = &nodes[i % nodes.len()];
        let key = format!("tenant-{i}");
        slots.insert(node.submit("backfill", &key).await.unwrap().record.slot);
    }
    assert_eq!(slots.len(), 12, "a record per key");
    t.wait_for(&db, 30 * SECOND, "every key finished", |r| {
        slots
            .iter()
            .all(|s| r.get(s).is_some_and(|r| r.state == "finished"))
    })
    .await;
    for n in &nodes {
        n.shutdown().await;
    }
    assert_eq!(t.assert_exactly_once(&db).await, 12);
    let ran = seen.ran.lock().unwrap().clone();
    assert_eq!(ran.len(), 12, "each key ran once: {ran:?}");
    assert_eq!(
        most.load(Ordering::SeqCst),
        2,
        "at most the cap's two permits at once across the nodes, and that many"
    );
    let nodes_used: BTreeSet<&String> = ran.iter().map(|(n, _)| n).collect();
    assert!(nodes_used.len() >= 2, "keys ran on several nodes: {ran:?}");
    t.drop(&db).await;
}

/// A rolling deploy that turns spreading off: a leader that spreads (and runs nothing itself)
/// hands over, mid-run, to one that does not. The new leader judges the running slot by the
/// hold its record names and never starts it beside the runner that still runs it: the slot
/// starts once, finishes as attempt 1 on the runner, and the new leader runs the later slots.
pub async fn a_leader_that_does_not_spread_never_starts_a_spread_run_twice<
    H: Harness<Store = SeaOrmLeaseStore>,
>(
    h: &H,
) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let seen = Arc::new(PerNode::default());
    let (tx, mut rx) = mpsc::unbounded_channel::<i64>();
    let once = Arc::new(AtomicBool::new(false));
    let job = |node: &str| {
        let (writes, seen, node, once, tx) = (
            t.writes.clone(),
            seen.clone(),
            node.to_owned(),
            once.clone(),
            tx.clone(),
        );
        Job::new(
            "tick",
            Schedule::every(SECOND).unwrap(),
            move |run: JobRun| {
                let (writes, seen, node, once, tx) = (
                    writes.clone(),
                    seen.clone(),
                    node.clone(),
                    once.clone(),
                    tx.clone(),
                );
                async move {
                    seen.started(&node, run.slot_millis());
                    if !once.swap(true, Ordering::SeqCst) {
                        let _ = tx.send(run.slot_millis());
                        // Long enough for the new leader's back-off and several of its looks.
                        tokio::time::sleep(Duration::from_millis(3_000)).await;
                    }
                    seen.ended(&node);
                    let txn = write(&run, &writes).await?;
                    run.commit(txn).await?;
                    Ok(())
                }
            },
        )
        .retry_backoff(Duration::from_millis(100), Duration::from_millis(400))
    };
    let a = t
        .builder(&h.store(), "a")
        .spread_runs(0)
        .job(job("a"))
        .build()
        .unwrap()
        .start();
    leader_of(std::slice::from_ref(&a), 3 * SECOND).await;
    let runner = t
        .builder(&h.separate_store().await, "r")
        .spread_runs(1)
        .job(job("r"))
        .build()
        .unwrap()
        .start();
    let b = t.start(&h.separate_store().await, "b", vec![job("b")]);
    let slot = tokio::time::timeout(5 * SECOND, rx.recv())
        .await
        .unwrap()
        .unwrap();
    // Handed to b by name (the runner is a candidate too).
    let handed = a.elector().hand_over_to("b", SECOND).await.unwrap();
    assert!(
        matches!(handed, orion_beacon::Handover::Taken { .. }),
        "{handed:?}"
    );
    leader_of(std::slice::from_ref(&b), 3 * SECOND).await;
    let records = t
        .wait_for(
            &db,
            10 * SECOND,
            "the long run finished and a later slot by b",
            |r| {
                r.get(&slot).is_some_and(|r| r.state == "finished")
                    && r.iter().any(|(s, r)| *s > slot && r.state == "finished")
            },
        )
        .await;
    assert_eq!(records[&slot].attempts, 1, "{:?}", records[&slot]);
    let ran = seen.ran.lock().unwrap().clone();
    let starts = ran.iter().filter(|(_, s)| *s == slot).count();
    assert_eq!(starts, 1, "the spread run started once: {ran:?}");
    assert!(b.elector().is_leader(), "b led throughout");
    b.shutdown().await;
    a.shutdown().await;
    runner.shutdown().await;
    t.assert_exactly_once(&db).await;
    t.drop(&db).await;
}

/// A runner whose job may run four at once (four run holds) under a leader whose own setting
/// allows one (one permit of its own): the runs land on any of the four permits, and the
/// leader, reading past its own permits, finds each one live and never starts it twice.
pub async fn a_leader_reads_every_permit_a_runner_may_hold<H: Harness<Store = SeaOrmLeaseStore>>(
    h: &H,
) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let seen = Arc::new(PerNode::default());
    // Past the leader's back-off and several of its looks.
    let job =
        |node: &str, at_once: usize| timed(&t, &seen, node, Duration::from_millis(1_200), at_once);
    let lead = t
        .builder(&h.store(), "lead")
        .spread_runs(0)
        .job(job("lead", 1))
        .build()
        .unwrap()
        .start();
    leader_of(std::slice::from_ref(&lead), 3 * SECOND).await;
    let runner = t
        .builder(&h.separate_store().await, "r")
        .spread_runs(4)
        .job(job("r", 4))
        .build()
        .unwrap()
        .start();
    tokio::time::sleep(Duration::from_millis(7_000)).await;
    lead.shutdown().await;
    runner.shutdown().await;
    let ran = seen.ran.lock().unwrap().clone();
    assert!(ran.len() >= 4, "runs: {ran:?}");
    let slots: BTreeSet<i64> = ran.iter().map(|(_, s)| *s).collect();
    assert_eq!(slots.len(), ran.len(), "a slot started twice: {ran:?}");
    t.assert_exactly_once(&db).await;
    t.drop(&db).await;
}

/// A start claimed by a leader that spreads, and that no node took (it runs none itself, and
/// there is no runner), is run by the next leader, which does not spread, as the attempt it
/// is: a job of one attempt finishes it rather than giving it up.
pub async fn a_claimed_start_runs_under_a_leader_that_does_not_spread<
    H: Harness<Store = SeaOrmLeaseStore>,
>(
    h: &H,
) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let job = || {
        super::jobs::writer("tick", &t.writes)
            .max_attempts(1)
            .overlap(Overlap::Skip)
    };
    let a = t
        .builder(&h.store(), "a")
        .spread_runs(0)
        .job(job())
        .build()
        .unwrap()
        .start();
    leader_of(std::slice::from_ref(&a), 3 * SECOND).await;
    let b = t.start(&h.separate_store().await, "b", vec![job()]);
    let claimed = t
        .wait_for(&db, 5 * SECOND, "a claimed start", |r| {
            r.values().any(|r| r.state == "claimed")
        })
        .await;
    let slot = *claimed
        .iter()
        .find(|(_, r)| r.state == "claimed")
        .unwrap()
        .0;
    let handed = a.elector().hand_over_to("b", SECOND).await.unwrap();
    assert!(
        matches!(handed, orion_beacon::Handover::Taken { .. }),
        "{handed:?}"
    );
    let records = t
        .wait_for(&db, 10 * SECOND, "the claimed start run by b", |r| {
            r.get(&slot)
                .is_some_and(|r| r.state != "claimed" && r.state != "running")
        })
        .await;
    let rec = &records[&slot];
    assert_eq!(
        (rec.state.as_str(), rec.attempts),
        ("finished", 1),
        "{rec:?}"
    );
    b.shutdown().await;
    a.shutdown().await;
    t.assert_exactly_once(&db).await;
    t.drop(&db).await;
}

/// A start claimed for the runners that no runner takes (the only node at `spread_runs(0)`):
/// the leader's health says so once it has waited ten polls (at least 5 s), not before, and
/// leaves `healthy` as it is; once a runner comes and takes it, it says so no more.
pub async fn a_start_no_runner_takes_is_reported_waiting<H: Harness<Store = SeaOrmLeaseStore>>(
    h: &H,
) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let job = || super::jobs::writer_every("tick", &t.writes, SECOND);
    let lead = t
        .builder(&h.store(), "lead")
        .spread_runs(0)
        .job(job())
        .build()
        .unwrap()
        .start();
    leader_of(std::slice::from_ref(&lead), 3 * SECOND).await;
    let since = Instant::now();
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let early = lead.health();
    assert!(early.waiting.is_none(), "before 5 s: {early}");
    let waiting = loop {
        let health = lead.health();
        if let Some(w) = &health.waiting {
            break (w.clone(), health);
        }
        assert!(since.elapsed() < 12 * SECOND, "never said: {health}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (w, health) = waiting;
    // One start at a time (the others are skipped while it is under way).
    assert_eq!(w.count, 1, "{health}");
    assert!(
        w.oldest > w.limit && w.limit == Duration::from_secs(5),
        "{health}"
    );
    assert!(
        health.healthy,
        "a backlog leaves healthy as it is: {health}"
    );
    assert!(
        health.to_string().contains("WAITING 1 claimed start"),
        "{health}"
    );
    // A runner comes: it takes the start, and the leader says so no more.
    let runner = t
        .builder(&h.separate_store().await, "r1")
        .spread_runs(1)
        .job(job())
        .build()
        .unwrap()
        .start();
    let deadline = Instant::now() + 10 * SECOND;
    while lead.health().waiting.is_some() {
        assert!(
            Instant::now() < deadline,
            "still waiting: {}",
            lead.health()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    runner.shutdown().await;
    lead.shutdown().await;
    assert!(t.assert_exactly_once(&db).await >= 1);
    t.drop(&db).await;
}
