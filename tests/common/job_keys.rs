//! Keyed jobs (`Job::keyed`, `JobsHandle::submit`), as tests generic over every SeaORM store:
//! a key submitted from three processes at once runs once; a leader that dies inside a key's
//! fenced transaction has the key run again once, by the next term; failing keys retried and
//! given up; keys side by side at most `max_running` at once; a run table without the key
//! column refused with its migration named. Run by `job_suite!` with the slot cases.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use orion_beacon::jobs::{Job, JobError, JobRun, JobsHandle, Overlap};
use orion_beacon::{ErrorKind, SeaOrmLeaseStore};
use orion_beacon_migration::{AddJobRunKey, MigrationTrait, SchemaManager};
use sea_orm::sea_query::{Alias, Query};
use sea_orm::{ConnectionTrait, DatabaseConnection};
use tokio::sync::mpsc;

use super::conformance::Harness;
use super::jobs::{leader_of, write, Tables};

const SECOND: Duration = Duration::from_secs(1);

/// A keyed job that writes one row per key (its slot) in the run's fenced transaction.
fn keyed_writer(name: &str, writes: &str) -> Job {
    let writes = writes.to_owned();
    Job::keyed(name, move |run| {
        let writes = writes.clone();
        async move {
            let txn = write(&run, &writes).await?;
            run.commit(txn).await?;
            Ok(())
        }
    })
    .retry_backoff(Duration::from_millis(100), Duration::from_millis(400))
}

/// The suite's wait for a leader among `nodes`.
async fn leader(nodes: &[JobsHandle]) -> &JobsHandle {
    leader_of(nodes, 3 * SECOND).await
}

/// Every key submitted from three processes (pools of their own) at once: exactly one submit
/// of each records it, every submit is answered with that record, each key runs once (one
/// fenced write, by the term that finished it); submitted again once finished, it is answered
/// with its finished record and never runs again.
pub async fn a_key_submitted_from_three_processes_at_once_runs_once<
    H: Harness<Store = SeaOrmLeaseStore>,
>(
    h: &H,
) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let mut stores = vec![h.store()];
    for _ in 0..2 {
        stores.push(h.separate_store().await);
    }
    let nodes: Vec<JobsHandle> = stores
        .iter()
        .enumerate()
        .map(|(i, s)| {
            t.start(
                s,
                &format!("n{i}"),
                vec![keyed_writer("backfill", &t.writes)],
            )
        })
        .collect();
    leader(&nodes).await;
    let keys: Vec<String> = (0..6).map(|i| format!("tenant-{i}/2026-12")).collect();
    let mut submits = Vec::new();
    for key in &keys {
        for node in &nodes {
            submits.push(async move { (key.clone(), node.submit("backfill", key).await) });
        }
    }
    let answers = futures::future::join_all(submits).await;
    let mut created: BTreeMap<String, usize> = BTreeMap::new();
    let mut slots: BTreeMap<String, BTreeSet<i64>> = BTreeMap::new();
    for (key, answer) in answers {
        let s = answer.unwrap_or_else(|e| panic!("submit {key}: {e:?}"));
        assert_eq!(s.record.run_key.as_deref(), Some(key.as_str()));
        assert_eq!(s.record.job, "backfill");
        *created.entry(key.clone()).or_default() += usize::from(s.created);
        slots.entry(key).or_default().insert(s.record.slot);
    }
    for key in &keys {
        assert_eq!(created.get(key), Some(&1), "one submit of {key} records it");
        assert_eq!(slots[key].len(), 1, "one record for {key}");
    }
    let all: BTreeSet<i64> = slots.values().flatten().copied().collect();
    assert_eq!(all.len(), keys.len(), "a record per key");
    let records = t
        .wait_for(&db, 10 * SECOND, "every key finished", |r| {
            all.iter()
                .all(|s| r.get(s).is_some_and(|r| r.state == "finished"))
        })
        .await;
    assert_eq!(t.assert_exactly_once(&db).await, keys.len(), "{records:?}");
    for key in &keys {
        let again = nodes[2].submit("backfill", key).await.unwrap();
        assert!(!again.created, "{key}: {again:?}");
        assert_eq!(again.record.state, "finished");
        assert_eq!(again.record.attempts, 1);
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(t.records(&db).await, records, "nothing ran again");
    t.assert_exactly_once(&db).await;
    for n in &nodes {
        n.shutdown().await;
    }
    t.drop(&db).await;
}

/// The leader dies inside a key's fenced transaction (its row written, not committed): the
/// next leader runs the key again as attempt 2, written exactly once, by the new term. The key
/// is submitted on the follower, which never runs it itself while it follows.
pub async fn a_key_whose_leader_dies_mid_run_runs_again_once<
    H: Harness<Store = SeaOrmLeaseStore>,
>(
    h: &H,
) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let (tx, mut rx) = mpsc::unbounded_channel::<(i64, i64)>();
    let once = Arc::new(AtomicBool::new(false));
    let job = |tx: mpsc::UnboundedSender<(i64, i64)>| {
        let (writes, once) = (t.writes.clone(), once.clone());
        Job::keyed("webhook", move |run: JobRun| {
            let (writes, once, tx) = (writes.clone(), once.clone(), tx.clone());
            async move {
                let txn = write(&run, &writes).await?;
                if !once.swap(true, Ordering::SeqCst) {
                    let _ = tx.send((run.slot_millis(), run.token().get()));
                    // Dies with the transaction open.
                    std::future::pending::<()>().await;
                }
                run.commit(txn).await?;
                Ok(())
            }
        })
        .retry_backoff(Duration::from_millis(100), Duration::from_millis(400))
    };
    let a = t.start(&h.store(), "a", vec![job(tx.clone())]);
    leader(std::slice::from_ref(&a)).await;
    let b = t.start(&h.separate_store().await, "b", vec![job(tx)]);
    let submitted = b.submit("webhook", "evt_0001").await.unwrap();
    assert!(submitted.created);
    let (slot, a_token) = tokio::time::timeout(3 * SECOND, rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(slot, submitted.record.slot);
    a.abort().await;
    let records = t
        .wait_for(&db, 10 * SECOND, "the key run again", |r| {
            r.get(&slot).is_some_and(|r| r.state == "finished")
        })
        .await;
    let rec = &records[&slot];
    assert_eq!(rec.attempts, 2, "{rec:?}");
    assert!(rec.finished_token.unwrap() > a_token, "{rec:?}");
    assert_eq!(t.assert_exactly_once(&db).await, 1);
    let again = b.submit("webhook", "evt_0001").await.unwrap();
    assert!(
        !again.created && again.record.state == "finished",
        "{again:?}"
    );
    b.shutdown().await;
    t.assert_exactly_once(&db).await;
    t.drop(&db).await;
}

/// A key whose run fails is retried with back-off and given up after its attempts, with its
/// error; keys allowed side by side run at most `max_running` at once, every one of them once;
/// bad keys and jobs are refused before any SQL runs.
pub async fn keyed_runs_are_retried_given_up_and_capped<H: Harness<Store = SeaOrmLeaseStore>>(
    h: &H,
) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let failing = Job::keyed("failing", |_run| async move {
        Err::<(), _>("the tenant's API said no".into())
    })
    .max_attempts(2)
    // Long enough for the test's row of its first attempt to go in before the retry's copy.
    .retry_backoff(Duration::from_millis(500), Duration::from_millis(500));
    let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let capped = {
        let (writes, now, most) = (t.writes.clone(), now.clone(), most.clone());
        Job::keyed("capped", move |run| {
            let (writes, now, most) = (writes.clone(), now.clone(), most.clone());
            async move {
                let running = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(running, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(150)).await;
                now.fetch_sub(1, Ordering::SeqCst);
                let txn = write(&run, &writes).await?;
                run.commit(txn).await?;
                Ok(())
            }
        })
        .overlap(Overlap::Allow)
        .max_running(2)
    };
    let scheduled = super::jobs::writer_every("scheduled", &t.writes, Duration::from_secs(3600));
    let node = t.start(&h.store(), "n", vec![failing, capped, scheduled]);
    leader(std::slice::from_ref(&node)).await;

    // Refused before any SQL: no such keyed job, a scheduled job, bad keys.
    for (job, key) in [
        ("nope", "k"),
        ("scheduled", "k"),
        ("capped", ""),
        ("capped", "a\nb"),
    ] {
        let e = node.submit(job, key).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{job} {key:?}: {e:?}");
    }
    let long = "k".repeat(256);
    assert!(matches!(
        node.submit("capped", &long).await,
        Err(JobError::InvalidKey { .. })
    ));
    assert!(node.submit("capped", &"k".repeat(255)).await.is_ok());
    // A key whose record slot holds another key (as two keys sharing a digest would): refused,
    // never answered with the other key's record.
    let first = node.submit("failing", "collides").await.unwrap();
    let edit = format!(
        "UPDATE {} SET run_key = 'another key', state = 'given_up' WHERE slot = {}",
        t.runs, first.record.slot
    );
    // The scheduler may be claiming the key meanwhile (MySQL can pick this edit as a
    // deadlock's victim): tried again.
    for tries in 1.. {
        match db.execute_unprepared(&edit).await {
            Ok(_) => break,
            Err(e) if tries < 10 => {
                eprintln!("editing the record: {e}; again");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    match node.submit("failing", "collides").await {
        Err(e @ JobError::KeyCollision { .. }) => {
            assert_eq!(e.kind(), ErrorKind::Conflict, "{e:?}")
        }
        other => panic!("{other:?}"),
    }

    let bad = node.submit("failing", "tenant-9").await.unwrap();
    // A row of its first attempt left from before (an earlier record of this key pruned before
    // its history was): the attempt's copy overwrites it.
    db.execute(
        &Query::insert()
            .into_table(Alias::new(t.attempts()))
            .columns(["job", "slot", "attempt", "state", "error", "recorded_at"].map(Alias::new))
            .values_panic([
                "failing".into(),
                bad.record.slot.into(),
                1.into(),
                "failed".into(),
                "an earlier submit's".into(),
                chrono::Utc::now().into(),
            ])
            .to_owned(),
    )
    .await
    .unwrap();
    let mut capped_slots = BTreeSet::new();
    for i in 0..6 {
        let s = node.submit("capped", &format!("item-{i}")).await.unwrap();
        capped_slots.insert(s.record.slot);
    }
    let records = t
        .wait_for(&db, 10 * SECOND, "keys ended", |r| {
            r.get(&bad.record.slot)
                .is_some_and(|r| r.state == "given_up")
                && capped_slots
                    .iter()
                    .all(|s| r.get(s).is_some_and(|r| r.state == "finished"))
        })
        .await;
    let given_up = &records[&bad.record.slot];
    assert_eq!(given_up.attempts, 2, "{given_up:?}");
    assert!(
        given_up
            .error
            .as_deref()
            .is_some_and(|e| e.contains("the tenant's API said no")),
        "{given_up:?}"
    );
    // Its first attempt is kept as it ended, whatever row was there before.
    let kept = t.kept_attempts(&db).await;
    let first = kept.get(&(bad.record.slot, 1));
    assert!(
        first.is_some_and(|(state, token, error)| state == "failed"
            && token.is_some()
            && error
                .as_deref()
                .is_some_and(|e| e.contains("the tenant's API said no"))),
        "{kept:?}"
    );
    assert_eq!(
        most.load(Ordering::SeqCst),
        2,
        "at most max_running at once, and that many"
    );
    t.assert_exactly_once(&db).await;
    node.shutdown().await;

    // Options refused at build: an earlier name, a cap out of bounds.
    for job in [
        Job::keyed("k", |_run| async { Ok(()) }).renamed_from("old"),
        Job::keyed("k", |_run| async { Ok(()) }).max_running(0),
    ] {
        let refused = t.builder(&h.store(), "x").job(job).build().err();
        assert!(
            refused.is_some_and(|e| e.kind() == ErrorKind::InvalidInput),
            "refused at build"
        );
    }
    t.drop(&db).await;
}

/// A run table made before the key column: a submit is refused with the missing migration
/// named, and a scheduler with a keyed job says so in its health while its scheduled job goes
/// on running its slots; once `AddJobRunKey` runs, the same scheduler runs the key.
pub async fn a_run_table_without_the_key_refuses_keys_until_its_migration_runs<
    H: Harness<Store = SeaOrmLeaseStore>,
>(
    h: &H,
) {
    let db: DatabaseConnection = h.store().connection().clone();
    let t = Tables::create_without_key(&db).await;
    let node = t.start(
        &h.store(),
        "n",
        vec![
            keyed_writer("backfill", &t.writes),
            super::jobs::writer("tick", &t.writes),
        ],
    );
    leader(std::slice::from_ref(&node)).await;
    let e = node.submit("backfill", "k1").await.unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("AddJobRunKey") && text.contains(&t.runs),
        "{text}"
    );
    let mut said = None;
    for _ in 0..100 {
        said = node.health().scheduling;
        if said.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let said = said.expect("the leader's looks fail");
    assert!(said.contains("AddJobRunKey"), "{said}");
    // The slots go on meanwhile.
    t.wait_for(
        &db,
        5 * SECOND,
        "a slot finished without the key column",
        |r| r.values().any(|r| r.state == "finished"),
    )
    .await;
    AddJobRunKey::with_table(&t.runs)
        .unwrap()
        .up(&SchemaManager::new(&db))
        .await
        .unwrap();
    let s = node.submit("backfill", "k1").await.unwrap();
    t.wait_for(&db, 10 * SECOND, "the key finished", |r| {
        r.get(&s.record.slot).is_some_and(|r| r.state == "finished")
    })
    .await;
    assert!(node.health().scheduling.is_none());
    node.shutdown().await;
    t.assert_exactly_once(&db).await;
    t.drop(&db).await;
}

/// Ended keys' records are pruned by when they ended (`keep_finished_for`), the newest
/// finished one kept; a pruned key is recorded (and runs) again when it is submitted again
/// (its record is what kept it from running twice).
pub async fn ended_keys_are_pruned_by_when_they_ended<H: Harness<Store = SeaOrmLeaseStore>>(h: &H) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let node = t
        .builder(&h.store(), "n")
        .job(keyed_writer("backfill", &t.writes))
        .keep_finished_for(SECOND)
        .build()
        .unwrap()
        .start();
    leader(std::slice::from_ref(&node)).await;
    let mut slots = Vec::new();
    for i in 0..3 {
        slots.push(
            node.submit("backfill", &format!("k{i}"))
                .await
                .unwrap()
                .record
                .slot,
        );
        // Each ends apart from the others: the last is the newest finished.
        t.wait_for(&db, 5 * SECOND, "the key finished", |r| {
            r.get(slots.last().unwrap())
                .is_some_and(|r| r.state == "finished")
        })
        .await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let last = *slots.last().unwrap();
    let records = t
        .wait_for(&db, 8 * SECOND, "the older keys pruned", |r| {
            r.len() == 1 && r.contains_key(&last)
        })
        .await;
    assert_eq!(records[&last].state, "finished");
    let again = node.submit("backfill", "k0").await.unwrap();
    assert!(again.created, "a pruned key is recorded again: {again:?}");
    node.shutdown().await;
    t.drop(&db).await;
}
