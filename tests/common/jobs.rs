//! Scheduled jobs, as tests generic over every SeaORM store: one run per slot across three
//! processes, a leader killed before and after its fenced commit, a paused leader's late
//! finish refused, failed attempts retried then given up (and an operator's rerun), overlap
//! skipped, bad input refused before anything runs. Every SeaORM store runs them through
//! `job_suite!`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use orion_beacon::jobs::{self, Job, JobError, JobRun, Jobs, JobsHandle, Mark, Overlap, Schedule};
use orion_beacon::{ErrorKind, SeaOrmLeaseStore};
use orion_beacon_migration::{
    AddJobRunKey, CreateJobAttemptTable, CreateJobRunTable, MigrationTrait, SchemaManager,
};
use sea_orm::sea_query::{Alias, ColumnDef, Expr, ExprTrait, Query, Table};
use sea_orm::{ConnectionTrait, DatabaseConnection, TransactionTrait};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::conformance::Harness;
#[allow(unused_imports)] // the job suite names the cap cases here too
pub use super::job_caps::*;
#[allow(unused_imports)] // the job suite names the keyed cases here too
pub use super::job_keys::*;
#[allow(unused_imports)] // the job suite names the spread cases here too
pub use super::job_spread::*;
use super::unique;

const LEASE: Duration = Duration::from_millis(1_000);
const RENEW: Duration = Duration::from_millis(200);
const RETRY: Duration = Duration::from_millis(100);
const SECOND: Duration = Duration::from_secs(1);

/// One test's tables: the run records and the job's own fenced writes (no key: a slot written
/// twice shows as two rows).
pub struct Tables {
    pub runs: String,
    pub writes: String,
    pub resource: String,
}

impl Tables {
    /// The tables, the run table with every migration step (its key column, its attempt
    /// history).
    pub async fn create(db: &DatabaseConnection) -> Self {
        let t = Self::create_without_key(db).await;
        AddJobRunKey::with_table(&t.runs)
            .unwrap()
            .up(&SchemaManager::new(db))
            .await
            .unwrap();
        CreateJobAttemptTable::with_table(&t.runs)
            .unwrap()
            .up(&SchemaManager::new(db))
            .await
            .unwrap();
        t
    }

    /// The attempt-history table of the run table.
    pub fn attempts(&self) -> String {
        orion_beacon_migration::job_attempt_table(&self.runs)
    }

    /// The kept earlier attempts: (slot, attempt) -> (state, claimed token, error).
    pub async fn kept_attempts(
        &self,
        db: &impl ConnectionTrait,
    ) -> BTreeMap<(i64, i32), (String, Option<i64>, Option<String>)> {
        let rows = db
            .query_all(
                &Query::select()
                    .columns(["slot", "attempt", "state", "claimed_token", "error"].map(Alias::new))
                    .from(Alias::new(self.attempts()))
                    .to_owned(),
            )
            .await
            .unwrap();
        rows.iter()
            .map(|r| {
                (
                    (
                        r.try_get_by_index::<i64>(0).unwrap(),
                        r.try_get_by_index::<i32>(1).unwrap(),
                    ),
                    (
                        r.try_get_by_index(2).unwrap(),
                        r.try_get_by_index(3).unwrap(),
                        r.try_get_by_index(4).unwrap(),
                    ),
                )
            })
            .collect()
    }

    /// The tables, the run table as `CreateJobRunTable` made it (before `AddJobRunKey`).
    pub async fn create_without_key(db: &DatabaseConnection) -> Self {
        let runs = unique("runs");
        CreateJobRunTable::with_table(&runs)
            .unwrap()
            .up(&SchemaManager::new(db))
            .await
            .unwrap();
        let writes = unique("writes");
        db.execute(
            &Table::create()
                .table(Alias::new(&writes))
                .col(ColumnDef::new(Alias::new("slot")).big_integer().not_null())
                .col(ColumnDef::new(Alias::new("token")).big_integer().not_null())
                .to_owned(),
        )
        .await
        .unwrap();
        Self {
            runs,
            writes,
            resource: unique("jobs"),
        }
    }

    pub async fn drop(&self, db: &DatabaseConnection) {
        for t in [&self.runs, &self.writes, &self.attempts()] {
            let _ = db
                .execute(&Table::drop().table(Alias::new(t)).if_exists().to_owned())
                .await;
        }
    }

    /// A scheduler's builder on `store` as candidate `id`, with the suite's timing and tables.
    pub fn builder(&self, store: &SeaOrmLeaseStore, id: &str) -> jobs::JobsBuilder {
        Jobs::builder(store.clone())
            .candidate_id(id)
            .resource(&self.resource)
            .lease_duration(LEASE)
            .renew_interval(RENEW)
            .retry_interval(RETRY)
            .poll_interval(Duration::from_millis(100))
            .runs_table(&self.runs)
    }

    /// A scheduler of `jobs` on `store` as candidate `id`.
    pub fn start(&self, store: &SeaOrmLeaseStore, id: &str, jobs: Vec<Job>) -> JobsHandle {
        let mut b = self.builder(store, id);
        for job in jobs {
            b = b.job(job);
        }
        b.build().unwrap().start()
    }

    /// The run records: slot -> (state, attempts, claimed token, finished token, error).
    pub async fn records(&self, db: &impl ConnectionTrait) -> BTreeMap<i64, Record> {
        let rows = db
            .query_all(
                &Query::select()
                    .columns(
                        [
                            "slot",
                            "state",
                            "attempts",
                            "claimed_token",
                            "finished_token",
                            "error",
                        ]
                        .map(Alias::new),
                    )
                    .from(Alias::new(&self.runs))
                    .to_owned(),
            )
            .await
            .unwrap();
        rows.iter()
            .map(|r| {
                (
                    r.try_get_by_index::<i64>(0).unwrap(),
                    Record {
                        state: r.try_get_by_index(1).unwrap(),
                        attempts: r.try_get_by_index(2).unwrap(),
                        claimed_token: r.try_get_by_index(3).unwrap(),
                        finished_token: r.try_get_by_index(4).unwrap(),
                        error: r.try_get_by_index(5).unwrap(),
                    },
                )
            })
            .collect()
    }

    /// The fenced writes: slot -> the tokens that wrote it.
    pub async fn writes(&self, db: &impl ConnectionTrait) -> BTreeMap<i64, Vec<i64>> {
        let rows = db
            .query_all(
                &Query::select()
                    .columns(["slot", "token"].map(Alias::new))
                    .from(Alias::new(&self.writes))
                    .to_owned(),
            )
            .await
            .unwrap();
        let mut out: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
        for r in rows {
            out.entry(r.try_get_by_index(0).unwrap())
                .or_default()
                .push(r.try_get_by_index(1).unwrap());
        }
        out
    }

    /// Exactly once per slot: every finished slot has exactly one write, by the term that
    /// finished it; no other slot has any. Returns the finished slots.
    pub async fn assert_exactly_once(&self, db: &DatabaseConnection) -> usize {
        // One snapshot for both reads: a run whose write and mark commit between two reads
        // would look half done (seen on Galera). SQLite's read transaction is one snapshot.
        let isolation = (db.get_database_backend() != sea_orm::DbBackend::Sqlite)
            .then_some(sea_orm::IsolationLevel::RepeatableRead);
        let txn = db.begin_with_config(isolation, None).await.unwrap();
        let records = self.records(&txn).await;
        let writes = self.writes(&txn).await;
        txn.commit().await.unwrap();
        let mut finished = 0;
        for (slot, rec) in &records {
            let w = writes.get(slot).cloned().unwrap_or_default();
            if rec.state == "finished" {
                finished += 1;
                assert_eq!(
                    w,
                    vec![rec.finished_token.unwrap()],
                    "slot {slot}: one write, by the finishing term ({rec:?})"
                );
            } else {
                assert!(w.is_empty(), "slot {slot} is {rec:?} but has writes {w:?}");
            }
        }
        for slot in writes.keys() {
            assert!(
                records.contains_key(slot),
                "slot {slot} written without a record"
            );
        }
        finished
    }

    /// Waits (up to `within`) until `check` holds on the records.
    pub async fn wait_for(
        &self,
        db: &DatabaseConnection,
        within: Duration,
        what: &str,
        check: impl Fn(&BTreeMap<i64, Record>) -> bool,
    ) -> BTreeMap<i64, Record> {
        let deadline = Instant::now() + within;
        loop {
            let records = self.records(db).await;
            if check(&records) {
                return records;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within {within:?}: {records:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub state: String,
    pub attempts: i32,
    pub claimed_token: Option<i64>,
    pub finished_token: Option<i64>,
    pub error: Option<String>,
}

/// The job's fenced write: one row for the slot, in the run's transaction.
pub async fn write(run: &JobRun, writes: &str) -> Result<sea_orm::DatabaseTransaction, JobError> {
    let txn = run.begin().await?;
    txn.execute(
        &Query::insert()
            .into_table(Alias::new(writes))
            .columns(["slot", "token"].map(Alias::new))
            .values_panic([run.slot_millis().into(), run.token().get().into()])
            .to_owned(),
    )
    .await?;
    Ok(txn)
}

/// A job that writes one row per slot and commits.
pub fn writer(name: &str, writes: &str) -> Job {
    writer_every(name, writes, SECOND)
}

/// [`writer`] with a slot every `every`.
pub fn writer_every(name: &str, writes: &str, every: Duration) -> Job {
    let writes = writes.to_owned();
    Job::new(name, Schedule::every(every).unwrap(), move |run| {
        let writes = writes.clone();
        async move {
            let txn = write(&run, &writes).await?;
            run.commit(txn).await?;
            Ok(())
        }
    })
    .retry_backoff(Duration::from_millis(100), Duration::from_millis(400))
}

pub async fn leader_of(nodes: &[JobsHandle], within: Duration) -> &JobsHandle {
    let deadline = Instant::now() + within;
    loop {
        if let Some(h) = nodes.iter().find(|h| h.elector().is_leader()) {
            return h;
        }
        assert!(Instant::now() < deadline, "no leader within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Three processes (pools of their own), one job every second: each slot runs once, across a
/// graceful handover and a crash of the leader.
pub async fn one_run_per_slot_across_three_processes<H: Harness<Store = SeaOrmLeaseStore>>(h: &H) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let mut stores = vec![h.store()];
    for _ in 0..2 {
        stores.push(h.separate_store().await);
    }
    let nodes: Vec<JobsHandle> = stores
        .iter()
        .enumerate()
        .map(|(i, s)| t.start(s, &format!("n{i}"), vec![writer("tick", &t.writes)]))
        .collect();
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    leader_of(&nodes, SECOND).await.shutdown().await;
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    leader_of(&nodes, 3 * SECOND).await.abort().await;
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    for n in &nodes {
        n.shutdown().await;
    }
    let finished = t.assert_exactly_once(&db).await;
    let records = t.records(&db).await;
    let tokens: std::collections::BTreeSet<_> =
        records.values().filter_map(|r| r.finished_token).collect();
    assert!(finished >= 5, "slots finished: {finished} of {records:?}");
    assert!(
        tokens.len() >= 2,
        "slots finished by several terms: {tokens:?}"
    );
    t.drop(&db).await;
}

/// Node `a` (on the harness's pool) leading with `job_a`, and node `b` (a pool of its own)
/// following with `job_b`.
async fn leader_and_follower<H: Harness<Store = SeaOrmLeaseStore>>(
    h: &H,
    t: &Tables,
    job_a: Job,
    job_b: Job,
) -> (JobsHandle, JobsHandle) {
    let a = t.start(&h.store(), "a", vec![job_a]);
    leader_of(std::slice::from_ref(&a), 3 * SECOND).await;
    let b_store = h.separate_store().await;
    (a, t.start(&b_store, "b", vec![job_b]))
}

/// A job whose first run ever does `first` (then hangs until aborted) and whose later runs
/// write and commit as usual.
/// `once` is shared by the test's processes: the first run of all of them.
fn first_run_hangs<F, Fut>(name: &str, writes: &str, once: &Arc<AtomicBool>, first: F) -> Job
where
    F: Fn(JobRun, String) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let writes = writes.to_owned();
    let once = once.clone();
    let first = Arc::new(first);
    Job::new(name, Schedule::every(SECOND).unwrap(), move |run| {
        let (writes, once, first) = (writes.clone(), once.clone(), first.clone());
        async move {
            if !once.swap(true, Ordering::SeqCst) {
                first(run.clone(), writes.clone()).await;
                std::future::pending::<()>().await;
            }
            let txn = write(&run, &writes).await?;
            run.commit(txn).await?;
            Ok(())
        }
    })
    .retry_backoff(Duration::from_millis(100), Duration::from_millis(400))
}

/// The leader dies inside the first run's fenced transaction, its row written but not
/// committed: the next leader runs the slot again (attempt 2) and it is written exactly once,
/// by the new term.
pub async fn a_leader_killed_before_its_commit_is_run_again_once<
    H: Harness<Store = SeaOrmLeaseStore>,
>(
    h: &H,
) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let (tx, mut rx) = mpsc::unbounded_channel::<(i64, i64)>();
    let once = Arc::new(AtomicBool::new(false));
    let job = |tx: mpsc::UnboundedSender<(i64, i64)>| {
        first_run_hangs("tick", &t.writes, &once, move |run, writes| {
            let tx = tx.clone();
            async move {
                let txn = write(&run, &writes).await.unwrap();
                let _ = tx.send((run.slot_millis(), run.token().get()));
                // Dies with the transaction open.
                std::future::pending::<()>().await;
                drop(txn);
            }
        })
    };
    let (a, b) = leader_and_follower(h, &t, job(tx.clone()), job(tx)).await;
    let (slot, a_token) = tokio::time::timeout(3 * SECOND, rx.recv())
        .await
        .unwrap()
        .unwrap();
    a.abort().await;
    let records = t
        .wait_for(&db, 10 * SECOND, "the slot run again", |r| {
            r.get(&slot).is_some_and(|r| r.state == "finished")
        })
        .await;
    let rec = &records[&slot];
    assert_eq!(rec.attempts, 2, "{rec:?}");
    assert!(rec.finished_token.unwrap() > a_token, "{rec:?}");
    // The lost attempt is kept as it was left: running under the dead term, no error.
    let kept = t.kept_attempts(&db).await;
    assert_eq!(
        kept.get(&(slot, 1)),
        Some(&("running".to_owned(), Some(a_token), None)),
        "{kept:?}"
    );
    assert!(kept.keys().all(|(s, _)| *s == slot), "{kept:?}");
    t.assert_exactly_once(&db).await;
    b.shutdown().await;
    t.assert_exactly_once(&db).await;
    t.drop(&db).await;
}

/// The leader dies right after its fenced commit: the slot is finished and never run again;
/// the next leader goes on with the later slots.
pub async fn a_leader_killed_after_its_commit_does_not_run_again<
    H: Harness<Store = SeaOrmLeaseStore>,
>(
    h: &H,
) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let (tx, mut rx) = mpsc::unbounded_channel::<(i64, i64)>();
    let once = Arc::new(AtomicBool::new(false));
    let job = |tx: mpsc::UnboundedSender<(i64, i64)>| {
        first_run_hangs("tick", &t.writes, &once, move |run, writes| {
            let tx = tx.clone();
            async move {
                let txn = write(&run, &writes).await.unwrap();
                run.commit(txn).await.unwrap();
                let _ = tx.send((run.slot_millis(), run.token().get()));
            }
        })
    };
    let (a, b) = leader_and_follower(h, &t, job(tx.clone()), job(tx)).await;
    let (slot, a_token) = tokio::time::timeout(3 * SECOND, rx.recv())
        .await
        .unwrap()
        .unwrap();
    a.abort().await;
    let records = t
        .wait_for(&db, 10 * SECOND, "a later slot by the next leader", |r| {
            r.iter().any(|(s, r)| {
                *s > slot && r.state == "finished" && r.finished_token > Some(a_token)
            })
        })
        .await;
    let rec = &records[&slot];
    assert_eq!(
        (rec.state.as_str(), rec.attempts, rec.finished_token),
        ("finished", 1, Some(a_token)),
        "{rec:?}"
    );
    b.shutdown().await;
    t.assert_exactly_once(&db).await;
    t.drop(&db).await;
}

/// A leader that stalls in a run past its lease: the next leader runs the slot again, and the
/// stalled run's late begin and commit are refused, writing nothing.
pub async fn a_paused_leaders_late_finish_is_refused<H: Harness<Store = SeaOrmLeaseStore>>(h: &H) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let (tx, mut rx) = mpsc::unbounded_channel::<JobRun>();
    let once = Arc::new(AtomicBool::new(false));
    let job = |tx: mpsc::UnboundedSender<JobRun>| {
        first_run_hangs("tick", &t.writes, &once, move |run, _| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(run);
            }
        })
    };
    let (a, b) = leader_and_follower(h, &t, job(tx.clone()), job(tx)).await;
    let stalled = tokio::time::timeout(3 * SECOND, rx.recv())
        .await
        .unwrap()
        .unwrap();
    let slot = stalled.slot_millis();
    // The stall: A stops renewing and running (as a paused process would), keeping the run.
    a.abort().await;
    t.wait_for(&db, 10 * SECOND, "the slot run again", |r| {
        r.get(&slot).is_some_and(|r| r.state == "finished")
    })
    .await;
    // A wakes up and tries to finish.
    let err = stalled.begin().await.unwrap_err();
    assert!(matches!(err, JobError::Superseded { .. }), "{err:?}");
    assert_eq!(err.kind(), ErrorKind::Lost);
    let txn = db.begin().await.unwrap();
    txn.execute(
        &Query::insert()
            .into_table(Alias::new(&t.writes))
            .columns(["slot", "token"].map(Alias::new))
            .values_panic([slot.into(), stalled.token().get().into()])
            .to_owned(),
    )
    .await
    .unwrap();
    let err = stalled.commit(txn).await.unwrap_err();
    assert!(matches!(err, JobError::Superseded { .. }), "{err:?}");
    b.shutdown().await;
    t.assert_exactly_once(&db).await;
    t.drop(&db).await;
}

/// A job that fails is retried with back-off up to its attempts, then given up with its error;
/// an operator's rerun runs it once more.
pub async fn failed_attempts_are_retried_then_given_up<H: Harness<Store = SeaOrmLeaseStore>>(
    h: &H,
) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let fail = Arc::new(AtomicBool::new(true));
    let calls = Arc::new(AtomicUsize::new(0));
    let (f, c, writes) = (fail.clone(), calls.clone(), t.writes.clone());
    // A slot once a day: the test sees only the one it starts with (marked by hand).
    let job = Job::new("flaky", Schedule::every(SECOND).unwrap(), move |run| {
        let (f, c, writes) = (f.clone(), c.clone(), writes.clone());
        async move {
            c.fetch_add(1, Ordering::SeqCst);
            let txn = write(&run, &writes).await?;
            if f.load(Ordering::SeqCst) {
                drop(txn); // rolled back: nothing of the failed attempt stays
                return Err("boom".into());
            }
            run.commit(txn).await?;
            Ok(())
        }
    })
    .max_attempts(3)
    .overlap(Overlap::Skip)
    .retry_backoff(Duration::from_millis(100), Duration::from_millis(200));
    let node = t.start(&h.store(), "a", vec![job]);
    let records = t
        .wait_for(&db, 10 * SECOND, "a slot given up", |r| {
            r.values().any(|r| r.state == "given_up")
        })
        .await;
    let (slot, rec) = records
        .iter()
        .find(|(_, r)| r.state == "given_up")
        .map(|(s, r)| (*s, r.clone()))
        .unwrap();
    assert_eq!(rec.attempts, 3, "{rec:?}");
    assert!(
        rec.error.as_deref().unwrap_or("").contains("boom"),
        "{rec:?}"
    );
    t.assert_exactly_once(&db).await;
    // The operator: run it once more, now that it works.
    fail.store(false, Ordering::SeqCst);
    assert!(jobs::mark(&db, &t.runs, "flaky", slot, Mark::Rerun)
        .await
        .unwrap());
    let records = t
        .wait_for(&db, 5 * SECOND, "the rerun finished", |r| {
            r.get(&slot).is_some_and(|r| r.state == "finished")
        })
        .await;
    assert_eq!(records[&slot].attempts, 4);
    // Every attempt before the latest is kept: two failed, and the one given up that the
    // operator marked, each with its error and the token it ran under.
    let kept = t.kept_attempts(&db).await;
    let of_slot: Vec<_> = kept
        .iter()
        .filter(|((s, _), _)| *s == slot)
        .map(|((_, n), (state, token, error))| {
            let boom = error.as_deref().is_some_and(|e| e.contains("boom"));
            (*n, state.as_str(), token.is_some(), boom)
        })
        .collect();
    assert_eq!(
        of_slot,
        vec![
            (1, "failed", true, true),
            (2, "failed", true, true),
            (3, "rerun", true, true),
        ],
        "{kept:?}"
    );
    // A finished slot cannot be given up; an unknown one is not there to mark.
    assert!(!jobs::mark(&db, &t.runs, "flaky", slot, Mark::GiveUp)
        .await
        .unwrap());
    assert!(!jobs::mark(&db, &t.runs, "nope", slot, Mark::Rerun)
        .await
        .unwrap());
    node.shutdown().await;
    t.assert_exactly_once(&db).await;
    t.drop(&db).await;
}

/// A run table whose attempt history refuses every copy (a table of its name made by hand,
/// with a row check): the scheduler keeps each slot's latest attempt as before, retries
/// included; the next term after the migration keeps the earlier attempts.
pub async fn a_run_table_without_its_attempt_history_goes_on<
    H: Harness<Store = SeaOrmLeaseStore>,
>(
    h: &H,
) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let history = CreateJobAttemptTable::with_table(&t.runs).unwrap();
    history.down(&SchemaManager::new(&db)).await.unwrap();
    // A table of that name, made by hand, whose row check refuses every copy (the probe, a
    // copy of no row, passes): the claim whose copy fails is refused, the next look claims
    // without the history, and the claims go on.
    let col = |name: &str| ColumnDef::new(Alias::new(name)).to_owned();
    db.execute(
        &Table::create()
            .table(Alias::new(t.attempts()))
            .col(col("job").string_len(255).not_null())
            .col(col("slot").big_integer().not_null())
            .col(col("attempt").integer().not_null())
            .col(col("state").string_len(16).not_null())
            .col(col("claimed_token").big_integer().null())
            .col(col("claimed_by").string_len(255).null())
            .col(col("claimed_at").timestamp_with_time_zone().null())
            .col(col("finished_token").big_integer().null())
            .col(col("finished_at").timestamp_with_time_zone().null())
            .col(col("duration_ms").big_integer().null())
            .col(col("error").string_len(1024).null())
            .col(col("recorded_at").timestamp_with_time_zone().not_null())
            .primary_key(
                sea_orm::sea_query::Index::create()
                    .col(Alias::new("job"))
                    .col(Alias::new("slot"))
                    .col(Alias::new("attempt")),
            )
            .check(Expr::col(Alias::new("attempt")).lt(0))
            .to_owned(),
    )
    .await
    .unwrap();
    // Each slot's first attempt fails, its second finishes.
    let failed_once = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let job = || {
        let (failed_once, writes) = (failed_once.clone(), t.writes.clone());
        Job::new("flaky", Schedule::every(SECOND).unwrap(), move |run| {
            let (failed_once, writes) = (failed_once.clone(), writes.clone());
            async move {
                if failed_once.lock().unwrap().insert(run.slot_millis()) {
                    return Err("first attempt".into());
                }
                let txn = write(&run, &writes).await?;
                run.commit(txn).await?;
                Ok(())
            }
        })
        .max_attempts(2)
        .overlap(Overlap::Skip)
        .retry_backoff(Duration::from_millis(100), Duration::from_millis(200))
    };
    let retried = |r: &BTreeMap<i64, Record>| {
        r.iter()
            .filter(|(_, r)| r.state == "finished" && r.attempts == 2)
            .map(|(s, _)| *s)
            .max()
    };
    let a = t.start(&h.store(), "a", vec![job()]);
    let records = t
        .wait_for(
            &db,
            10 * SECOND,
            "a slot finished at its second attempt",
            |r| retried(r).is_some(),
        )
        .await;
    let health = a.health();
    assert!(health.scheduling.is_none(), "{health}");
    a.shutdown().await;
    // Read once `a` has stopped: a slot it retried while stopping kept no history either.
    let before = retried(&t.records(&db).await).unwrap();
    assert!(before >= retried(&records).unwrap());
    db.execute(&Table::drop().table(Alias::new(t.attempts())).to_owned())
        .await
        .unwrap();
    history.up(&SchemaManager::new(&db)).await.unwrap();
    let b = t.start(&h.store(), "b", vec![job()]);
    let records = t
        .wait_for(
            &db,
            10 * SECOND,
            "a later slot finished at its second attempt",
            |r| retried(r).is_some_and(|s| s > before),
        )
        .await;
    b.shutdown().await;
    let later = retried(&records).unwrap();
    let kept = t.kept_attempts(&db).await;
    assert_eq!(
        kept.get(&(later, 1)).map(|(state, _, _)| state.as_str()),
        Some("failed"),
        "{kept:?}"
    );
    t.assert_exactly_once(&db).await;
    t.drop(&db).await;
}

/// A run that outlasts its interval: the slots that come due meanwhile are skipped (recorded),
/// never run beside it.
pub async fn slots_due_while_one_runs_are_skipped<H: Harness<Store = SeaOrmLeaseStore>>(h: &H) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let writes = t.writes.clone();
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (r, m) = (running.clone(), most.clone());
    let job = Job::new("slow", Schedule::every(SECOND).unwrap(), move |run| {
        let (writes, r, m) = (writes.clone(), r.clone(), m.clone());
        async move {
            let now = r.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(1_600)).await;
            r.fetch_sub(1, Ordering::SeqCst);
            let txn = write(&run, &writes).await?;
            run.commit(txn).await?;
            Ok(())
        }
    });
    let node = t.start(&h.store(), "a", vec![job]);
    let records = t
        .wait_for(&db, 10 * SECOND, "two runs and a skipped slot", |r| {
            r.values().filter(|r| r.state == "finished").count() >= 2
                && r.values().any(|r| r.state == "skipped")
        })
        .await;
    node.shutdown().await;
    assert_eq!(
        most.load(Ordering::SeqCst),
        1,
        "never two at once: {records:?}"
    );
    t.assert_exactly_once(&db).await;
    t.drop(&db).await;
}

/// Slots of many jobs that come due together are claimed in one statement (a look's claims hold
/// the lease row, and the leader's own renew waits for them): every record of such a slot
/// carries one claim time, the database's time of that statement. Sixty jobs every second;
/// one insert per claim would give each record a time of its own.
pub async fn slots_due_together_are_claimed_in_one_statement<
    H: Harness<Store = SeaOrmLeaseStore>,
>(
    h: &H,
) {
    const JOBS: usize = 60;
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let jobs = (0..JOBS)
        .map(|i| {
            Job::new(
                format!("j{i:02}"),
                Schedule::every(SECOND).unwrap(),
                |_| async { Ok(()) },
            )
        })
        .collect();
    let node = t.start(&h.store(), "a", jobs);
    leader_of(std::slice::from_ref(&node), 3 * SECOND).await;
    let token = node.elector().token();
    tokio::time::sleep(Duration::from_millis(3_200)).await;
    assert_eq!(node.elector().token(), token, "the leader kept its term");
    node.shutdown().await;
    let rows = db
        .query_all(
            &Query::select()
                .columns(["slot", "claimed_at"].map(Alias::new))
                .from(Alias::new(&t.runs))
                .to_owned(),
        )
        .await
        .unwrap();
    let mut by_slot: BTreeMap<i64, Vec<chrono::DateTime<chrono::Utc>>> = BTreeMap::new();
    for r in &rows {
        by_slot
            .entry(r.try_get_by_index(0).unwrap())
            .or_default()
            .push(r.try_get_by_index(1).unwrap());
    }
    let full: Vec<_> = by_slot.iter().filter(|(_, at)| at.len() == JOBS).collect();
    assert!(full.len() >= 2, "slots of every job: {by_slot:?}");
    for (slot, at) in full {
        let distinct: std::collections::BTreeSet<_> = at.iter().collect();
        assert_eq!(distinct.len(), 1, "slot {slot}: claim times {distinct:?}");
    }
    t.drop(&db).await;
}

/// "Nothing ran": a job with no finished slot for longer than its `stale_after` is listed in
/// the leader's health (and in no follower's), with its age and limit; a job that finishes
/// every second is not; once the failing job finishes a slot it is fresh again.
pub async fn a_job_with_nothing_finished_is_reported_stale<H: Harness<Store = SeaOrmLeaseStore>>(
    h: &H,
) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let limit = Duration::from_millis(2_000);
    let fail = Arc::new(AtomicBool::new(true));
    // "failing" fails while `fail` is set (each slot given up at once), then finishes.
    let failing_job = || {
        let f = fail.clone();
        Job::new("failing", Schedule::every(SECOND).unwrap(), move |_| {
            let f = f.clone();
            async move {
                if f.load(Ordering::SeqCst) {
                    return Err("planned".into());
                }
                Ok(())
            }
        })
        .max_attempts(1)
        .stale_after(limit)
    };
    let failing = failing_job();
    let ok =
        Job::new("ok", Schedule::every(SECOND).unwrap(), |_| async { Ok(()) }).stale_after(limit);
    // Before the leader's first look: the job can be stale no sooner than a limit after it.
    let started = Instant::now();
    let a = t.start(&h.store(), "a", vec![failing, ok]);
    leader_of(std::slice::from_ref(&a), 3 * SECOND).await;
    let b_store = h.separate_store().await;
    let b = t.start(
        &b_store,
        "b",
        vec![Job::new(
            "failing",
            Schedule::every(SECOND).unwrap(),
            |_| async { Ok(()) },
        )],
    );
    let stale = loop {
        let health = a.health();
        if let Some(s) = health.stale.iter().find(|s| s.job == "failing") {
            break s.clone();
        }
        assert!(
            started.elapsed() < limit * 3,
            "never reported stale: {health}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        started.elapsed() + super::SUSPEND_SLACK >= limit,
        "reported after {:?}",
        started.elapsed()
    );
    assert_eq!(
        (stale.last_finished, stale.limit),
        (None, limit),
        "{stale:?}"
    );
    assert!(stale.age > limit, "{stale:?}");
    let health = a.health();
    assert!(
        health.stale.iter().all(|s| s.job != "ok"),
        "a job that finishes every second is fresh: {health}"
    );
    assert!(health.to_string().contains("STALE failing"), "{health}");
    assert!(b.health().stale.is_empty(), "a follower reports nothing");
    // It finishes a slot: fresh again.
    fail.store(false, Ordering::SeqCst);
    let fresh_by = Instant::now() + 3 * SECOND;
    while a.health().stale.iter().any(|s| s.job == "failing") {
        assert!(Instant::now() < fresh_by, "still stale: {}", a.health());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    fail.store(true, Ordering::SeqCst);
    let finished_at = Instant::now();
    b.shutdown().await;
    a.shutdown().await;
    assert!(
        a.health().stale.is_empty(),
        "a node that led no longer reports"
    );
    // A later leader reads that finish from the run table: the job is stale a limit after it,
    // not a limit after the new leader's first look.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let failing = failing_job();
    let c = t.start(&h.store(), "c", vec![failing]);
    leader_of(std::slice::from_ref(&c), 3 * SECOND).await;
    let stale = loop {
        if let Some(s) = c.health().stale.first() {
            break s.clone();
        }
        assert!(
            finished_at.elapsed() < limit * 3,
            "never reported stale: {}",
            c.health()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // It knows the finish it read (a leader that read nothing counts from its first look).
    assert!(stale.last_finished.is_some(), "{stale:?}");
    assert!(
        finished_at.elapsed() < limit + 2 * SECOND,
        "reported {:?} after its last finish (limit {limit:?}): {stale:?}",
        finished_at.elapsed()
    );
    c.shutdown().await;
    t.drop(&db).await;
}

/// Ended records older than `keep_finished_for` are pruned by the leader, never a job's newest:
/// a job every 2 s kept 1 s, its newest record older than that when the leader hands over to a
/// node that reads the table afresh: no slot runs twice, the older records are gone, the
/// newest stays.
pub async fn ended_records_are_pruned_and_no_slot_runs_again<
    H: Harness<Store = SeaOrmLeaseStore>,
>(
    h: &H,
) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    // Days old, by hand: an earlier name of the job ("sparse": its newest record is skipped,
    // its newest finished one older) and another service's job on the same table.
    let day = 86_400_000i64;
    let today = chrono::Utc::now().timestamp_millis() / day * day;
    for (job, days_ago, state) in [
        ("sparse", 3, "finished"),
        ("sparse", 2, "finished"),
        ("sparse", 1, "skipped"),
        ("other", 5, "finished"),
        ("other", 4, "finished"),
    ] {
        let at = chrono::Utc::now();
        db.execute(
            &Query::insert()
                .into_table(Alias::new(&t.runs))
                .columns(
                    [
                        "job",
                        "slot",
                        "state",
                        "attempts",
                        "schedule",
                        "claimed_token",
                        "claimed_by",
                        "claimed_at",
                        "finished_at",
                    ]
                    .map(Alias::new),
                )
                .values_panic([
                    job.into(),
                    (today - days_ago * day).into(),
                    state.into(),
                    2.into(),
                    "every 86400000ms".into(),
                    1i64.into(),
                    "x".into(),
                    at.into(),
                    at.into(),
                ])
                .to_owned(),
        )
        .await
        .unwrap();
    }
    // An earlier attempt of one slot of each (their records are at attempt 2): the history
    // goes with its record, and only with it; and a row its record has not got past (left
    // by an earlier record of the slot) goes too.
    for (job, days_ago, attempt) in [
        ("sparse", 3, 1),
        ("sparse", 2, 1),
        ("sparse", 2, 2),
        ("other", 5, 1),
    ] {
        db.execute(
            &Query::insert()
                .into_table(Alias::new(t.attempts()))
                .columns(["job", "slot", "attempt", "state", "recorded_at"].map(Alias::new))
                .values_panic([
                    job.into(),
                    (today - days_ago * day).into(),
                    attempt.into(),
                    "failed".into(),
                    chrono::Utc::now().into(),
                ])
                .to_owned(),
        )
        .await
        .unwrap();
    }
    let start = |store: &SeaOrmLeaseStore, id: &str| {
        let job = writer_every("tick", &t.writes, 2 * SECOND).renamed_from("sparse");
        t.builder(store, id)
            .keep_finished_for(SECOND)
            .job(job)
            .build()
            .unwrap()
            .start()
    };
    let a = start(&h.store(), "a");
    leader_of(std::slice::from_ref(&a), 3 * SECOND).await;
    let deadline = Instant::now() + 12 * SECOND;
    loop {
        let writes = t.writes(&db).await;
        if writes.len() >= 3 {
            break;
        }
        assert!(Instant::now() < deadline, "three slots written: {writes:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The newest slot is older than the 1 s kept when the next leader reads the table.
    let newest = *t.writes(&db).await.keys().max().unwrap();
    let now_ms = chrono::Utc::now().timestamp_millis();
    let ahead = (newest + 1_600 - now_ms).clamp(0, 2_000);
    tokio::time::sleep(Duration::from_millis(ahead as u64)).await;
    a.shutdown().await;
    let b = start(&h.separate_store().await, "b");
    leader_of(std::slice::from_ref(&b), 3 * SECOND).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.shutdown().await;
    let writes = t.writes(&db).await;
    let records = t.records(&db).await;
    for (slot, tokens) in &writes {
        assert_eq!(
            tokens.len(),
            1,
            "slot {slot} written once: {writes:?} {records:?}"
        );
    }
    let newest = *writes.keys().max().unwrap();
    assert!(
        records.contains_key(&newest),
        "the newest slot's record stays: {records:?}"
    );
    assert!(
        !records.contains_key(writes.keys().next().unwrap()),
        "older records pruned: {records:?} of {writes:?}"
    );
    // The earlier name keeps its newest record and its newest finished one; the other
    // service's records are not this scheduler's to prune.
    for (slot, kept) in [
        (today - 3 * day, false),
        (today - 2 * day, true),
        (today - day, true),
    ] {
        assert_eq!(
            records.contains_key(&slot),
            kept,
            "slot {slot}: {records:?}"
        );
    }
    let other = db
        .query_all(
            &Query::select()
                .column(Alias::new("slot"))
                .from(Alias::new(&t.runs))
                .and_where(Expr::col(Alias::new("job")).eq("other"))
                .to_owned(),
        )
        .await
        .unwrap();
    assert_eq!(other.len(), 2, "another service's records stay");
    let kept: Vec<(i64, i32)> = t.kept_attempts(&db).await.keys().copied().collect();
    assert_eq!(
        kept,
        vec![(today - 5 * day, 1), (today - 2 * day, 1)],
        "the pruned record's earlier attempt went with it, and the row its record had not got past"
    );
    t.drop(&db).await;
}

/// A graceful shutdown stops claiming but lets the running slot finish within the grace
/// period: it is finished once, by that term, not run again by the next leader.
pub async fn a_shutdown_lets_the_running_slot_finish<H: Harness<Store = SeaOrmLeaseStore>>(h: &H) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let writes = t.writes.clone();
    let job = Job::new("slow", Schedule::every(SECOND).unwrap(), move |run| {
        let writes = writes.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(700)).await;
            let txn = write(&run, &writes).await?;
            run.commit(txn).await?;
            Ok(())
        }
    });
    let node = t.start(&h.store(), "a", vec![job]);
    let records = t
        .wait_for(&db, 5 * SECOND, "a slot running", |r| {
            r.values().any(|r| r.state == "running")
        })
        .await;
    let slot = *records
        .iter()
        .find(|(_, r)| r.state == "running")
        .unwrap()
        .0;
    node.shutdown().await;
    let records = t.records(&db).await;
    assert_eq!(
        (records[&slot].state.as_str(), records[&slot].attempts),
        ("finished", 1),
        "{records:?}"
    );
    assert!(
        records.values().all(|r| r.state != "running"),
        "nothing left running: {records:?}"
    );
    t.assert_exactly_once(&db).await;
    t.drop(&db).await;
}

/// A run kept past its closure's return cannot open a transaction any more: the slot was
/// marked finished when the closure returned, and a late write would be lost.
pub async fn a_begin_after_the_closure_returned_is_refused<H: Harness<Store = SeaOrmLeaseStore>>(
    h: &H,
) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let (tx, mut rx) = mpsc::unbounded_channel::<JobRun>();
    let job = Job::new("kept", Schedule::every(SECOND).unwrap(), move |run| {
        let tx = tx.clone();
        async move {
            let _ = tx.send(run);
            Ok(())
        }
    });
    let node = t.start(&h.store(), "a", vec![job]);
    let kept = tokio::time::timeout(3 * SECOND, rx.recv())
        .await
        .unwrap()
        .unwrap();
    let slot = kept.slot_millis();
    t.wait_for(&db, 3 * SECOND, "the slot marked", |r| {
        r.get(&slot).is_some_and(|r| r.state == "finished")
    })
    .await;
    let err = kept.begin().await.unwrap_err();
    assert!(matches!(err, JobError::NotClaimed { .. }), "{err:?}");
    node.shutdown().await;
    assert!(t.writes(&db).await.is_empty(), "the job writes nothing");
    t.drop(&db).await;
}

/// Bad schedules and options are typed errors before anything runs: no elector starts, no
/// record is written.
pub async fn bad_input_is_refused_before_anything_runs<H: Harness<Store = SeaOrmLeaseStore>>(
    h: &H,
) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let noop = |name: &str| {
        Job::new(name, Schedule::every(SECOND).unwrap(), |_run| async {
            Ok(())
        })
    };
    for (err, what) in [
        (Schedule::cron("0 2 * *", "UTC").unwrap_err(), "four fields"),
        (Schedule::cron("0 25 * * *", "UTC").unwrap_err(), "hour 25"),
        (Schedule::cron("not cron", "UTC").unwrap_err(), "words"),
        (
            Schedule::cron("0 2 * * *", "Europe/Atlantis").unwrap_err(),
            "zone",
        ),
        (
            Schedule::every(Duration::ZERO).unwrap_err(),
            "zero interval",
        ),
        (
            Schedule::every(Duration::from_millis(1)).unwrap_err(),
            "1 ms",
        ),
    ] {
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{what}: {err:?}");
    }
    let builder = || {
        Jobs::builder(h.store())
            .resource(&t.resource)
            .runs_table(&t.runs)
    };
    let refused = [
        builder().job(noop("a")).job(noop("a")).build().err(),
        builder().job(noop("")).build().err(),
        builder().job(noop(" padded")).build().err(),
        builder().job(noop("a").max_attempts(0)).build().err(),
        builder().job(noop("a").max_catch_up(0)).build().err(),
        builder()
            .job(noop("a").retry_backoff(SECOND, Duration::from_millis(1)))
            .build()
            .err(),
        builder()
            .job(noop("a").starting_deadline(Duration::from_secs(400 * 24 * 3600)))
            .build()
            .err(),
        builder()
            .job(noop("a").starting_deadline(Duration::ZERO))
            .build()
            .err(),
        builder()
            .job(noop("a").starting_deadline(Duration::from_millis(999)))
            .build()
            .err(),
        builder()
            .job(noop("a").renamed_from("b"))
            .job(noop("b"))
            .build()
            .err(),
        builder().job(noop("a").renamed_from(" old")).build().err(),
        builder()
            .runs_table("runs; DROP TABLE x")
            .job(noop("a"))
            .build()
            .err(),
        builder()
            .poll_interval(Duration::ZERO)
            .job(noop("a"))
            .build()
            .err(),
    ];
    for (i, err) in refused.into_iter().enumerate() {
        let err = err.unwrap_or_else(|| panic!("case {i} was accepted"));
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "case {i}: {err:?}");
    }
    assert!(t.records(&db).await.is_empty());
    let lease_row = db
        .query_all(
            &Query::select()
                .expr(Expr::val(1))
                .from(Alias::new(h.store().table()))
                .and_where(Expr::col(Alias::new("resource")).eq(t.resource.as_str()))
                .to_owned(),
        )
        .await
        .unwrap();
    assert!(lease_row.is_empty(), "no elector ran");
    t.drop(&db).await;
}

/// `read`'s answer once `done` holds of it, or its last answer after `within` (the caller
/// asserts on it), asked every `every`.
pub async fn poll<T, Fut: std::future::Future<Output = T>>(
    within: Duration,
    every: Duration,
    mut read: impl FnMut() -> Fut,
    done: impl Fn(&T) -> bool,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        let value = read().await;
        if done(&value) || Instant::now() > deadline {
            return value;
        }
        tokio::time::sleep(every).await;
    }
}

/// The run records of every job: (job, slot) -> state.
pub async fn states(t: &Tables, db: &DatabaseConnection) -> BTreeMap<(String, i64), String> {
    let rows = db
        .query_all(
            &Query::select()
                .columns(["job", "slot", "state"].map(Alias::new))
                .from(Alias::new(&t.runs))
                .to_owned(),
        )
        .await
        .unwrap();
    rows.iter()
        .map(|r| {
            (
                (
                    r.try_get_by_index::<String>(0).unwrap(),
                    r.try_get_by_index::<i64>(1).unwrap(),
                ),
                r.try_get_by_index::<String>(2).unwrap(),
            )
        })
        .collect()
}

/// Each record's claim and end times (database clock).
#[allow(clippy::type_complexity)]
async fn times(
    t: &Tables,
    db: &DatabaseConnection,
) -> BTreeMap<
    (String, i64),
    (
        Option<chrono::DateTime<chrono::Utc>>,
        Option<chrono::DateTime<chrono::Utc>>,
    ),
> {
    let rows = db
        .query_all(
            &Query::select()
                .columns(["job", "slot", "claimed_at", "finished_at"].map(Alias::new))
                .from(Alias::new(&t.runs))
                .to_owned(),
        )
        .await
        .unwrap();
    rows.iter()
        .map(|r| {
            (
                (
                    r.try_get_by_index::<String>(0).unwrap(),
                    r.try_get_by_index::<i64>(1).unwrap(),
                ),
                (
                    r.try_get_by_index(2).unwrap(),
                    r.try_get_by_index(3).unwrap(),
                ),
            )
        })
        .collect()
}

/// Many jobs whose runs return well before their next slot (`Overlap::Skip`, the default):
/// no slot is recorded skipped after the run of the slot before had returned, however many
/// runs end at once. (A slot may be skipped when the scheduler fell a whole slot behind on a
/// busy machine: the slot before then started late and still ran when this one came due.)
pub async fn a_run_that_returned_never_makes_its_next_slot_skipped<
    H: Harness<Store = SeaOrmLeaseStore>,
>(
    h: &H,
) {
    const JOBS: usize = 100;
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let jobs: Vec<Job> = (0..JOBS)
        .map(|i| {
            Job::new(
                format!("j{i}"),
                Schedule::every(SECOND).unwrap(),
                |run| async move {
                    // Returns 400 ms before the next slot (by the slot's own time).
                    tokio::time::sleep(Duration::from_millis(600).saturating_sub(run.lateness()))
                        .await;
                    Ok(())
                },
            )
        })
        .collect();
    let node = t.start(&h.store(), "a", jobs);
    let states = poll(
        20 * SECOND,
        Duration::from_millis(100),
        || states(&t, &db),
        |states| states.values().filter(|s| *s == "finished").count() >= 3 * JOBS,
    )
    .await;
    node.shutdown().await;
    // Each skip against the run of the slot before, which returns 600 ms after its slot or
    // at once if it started later: a skip recorded 100 ms past that had seen it return (its
    // end record, written after it returned, would excuse too much).
    let times = times(&t, &db).await;
    let ms = |t: Option<chrono::DateTime<chrono::Utc>>| t.map(|t| t.timestamp_millis());
    let skipped: Vec<_> = states
        .iter()
        .filter(|(_, s)| *s == "skipped")
        .filter(|((job, slot), _)| {
            let skip_at = times.get(&(job.clone(), *slot)).and_then(|t| ms(t.0));
            let before = slot - 1_000;
            let started = times.get(&(job.clone(), before)).and_then(|t| ms(t.0));
            match (skip_at, started) {
                (Some(skip), Some(started)) => skip > Ord::max(started, before + 600) + 100,
                // No record of the slot before (the scheduler was a slot behind and ran only
                // the latest): nothing to judge the skip against.
                _ => false,
            }
        })
        .collect();
    assert!(
        skipped.is_empty(),
        "{} slots skipped though their previous run had returned: {:?}",
        skipped.len(),
        skipped.iter().take(5).collect::<Vec<_>>()
    );
    let finished = states.values().filter(|s| *s == "finished").count();
    assert!(finished >= 3 * JOBS, "only {finished} runs finished");
    t.drop(&db).await;
}

/// A new job with the shortest starting deadline the builder takes runs every slot from its
/// deploy on, under each missed-slot policy.
pub async fn a_new_job_with_the_shortest_deadline_runs_every_slot<
    H: Harness<Store = SeaOrmLeaseStore>,
>(
    h: &H,
) {
    use orion_beacon::jobs::{MissedSlots, MIN_STARTING_DEADLINE};
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let policies = [
        ("latest", MissedSlots::RunLatest),
        ("all", MissedSlots::RunAll),
        ("skip", MissedSlots::Skip),
    ];
    let jobs = policies
        .iter()
        .map(|(name, missed)| {
            Job::new(*name, Schedule::every(SECOND).unwrap(), |_run| async {
                Ok(())
            })
            .missed_slots(*missed)
            .starting_deadline(MIN_STARTING_DEADLINE)
        })
        .collect();
    let node = t.start(&h.store(), "a", jobs);
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    node.shutdown().await;
    let states = states(&t, &db).await;
    for (name, _) in policies {
        let ran: Vec<_> = states
            .iter()
            .filter(|((job, _), s)| job == name && *s == "finished")
            .collect();
        assert!(
            ran.len() >= 3,
            "{name}: {} runs in 4.5 s: {states:?}",
            ran.len()
        );
        assert!(
            states
                .iter()
                .all(|((job, _), s)| job != name || s == "finished"),
            "{name}: every slot ran: {states:?}"
        );
    }
    t.drop(&db).await;
}

/// A closure that panics before it returns its future fails the attempt with the panic's
/// message, as a panic inside the future does; neither is left `running`.
pub async fn a_panicking_job_fails_with_its_message<H: Harness<Store = SeaOrmLeaseStore>>(h: &H) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    #[allow(unreachable_code)]
    let early = Job::new("early", Schedule::every(SECOND).unwrap(), |_run| {
        panic!("boom before the future");
        async { Ok(()) }
    })
    .retry_backoff(Duration::from_secs(60), Duration::from_secs(60));
    let inside = Job::new("inside", Schedule::every(SECOND).unwrap(), |_run| async {
        if true {
            panic!("boom inside the future");
        }
        Ok(())
    })
    .retry_backoff(Duration::from_secs(60), Duration::from_secs(60));
    let node = t.start(&h.store(), "a", vec![early, inside]);
    let read = || async {
        let rows = db
            .query_all(
                &Query::select()
                    .columns(["job", "state", "attempts", "error"].map(Alias::new))
                    .from(Alias::new(&t.runs))
                    // Each job's first slot first (its next may be running by now).
                    .order_by(Alias::new("slot"), sea_orm::sea_query::Order::Asc)
                    .to_owned(),
            )
            .await
            .unwrap();
        rows.iter()
            .map(|r| {
                (
                    r.try_get_by_index(0).unwrap(),
                    r.try_get_by_index(1).unwrap(),
                    r.try_get_by_index(2).unwrap(),
                    r.try_get_by_index(3).unwrap(),
                )
            })
            .collect::<Vec<(String, String, i32, Option<String>)>>()
    };
    let rows = poll(5 * SECOND, Duration::from_millis(50), read, |rows| {
        ["early", "inside"].iter().all(|j| {
            rows.iter()
                .any(|(job, state, ..)| job == j && state == "failed")
        })
    })
    .await;
    node.abort().await;
    for (job, text) in [
        ("early", "boom before the future"),
        ("inside", "boom inside the future"),
    ] {
        let rec = rows.iter().find(|(j, ..)| j == job);
        let Some((_, state, attempts, error)) = rec else {
            panic!("{job}: no record: {rows:?}");
        };
        assert_eq!(
            (state.as_str(), *attempts),
            ("failed", 1),
            "{job}: {rows:?}"
        );
        let error = error.as_deref().unwrap_or("");
        assert!(
            error.contains("panicked") && error.contains(text),
            "{job}: the panic's message is recorded: {error:?}"
        );
    }
    t.drop(&db).await;
}

/// A job renamed between two deploys goes on from its old name's history: the slot the old
/// name finished never runs again under the new one.
pub async fn a_renamed_job_never_runs_a_finished_slot_again<
    H: Harness<Store = SeaOrmLeaseStore>,
>(
    h: &H,
) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    // A slot a minute: the deploys fall between two slots.
    let minute = Duration::from_secs(60);
    let job = |name: &str| {
        let writes = t.writes.clone();
        Job::new(name, Schedule::every(minute).unwrap(), move |run| {
            let writes = writes.clone();
            async move {
                let txn = write(&run, &writes).await?;
                run.commit(txn).await?;
                Ok(())
            }
        })
    };
    let old = t.start(&h.store(), "a", vec![job("daily-report")]);
    let records = t
        .wait_for(&db, 5 * SECOND, "the old name's slot finished", |r| {
            r.values().any(|r| r.state == "finished")
        })
        .await;
    let slot = *records.keys().next().unwrap();
    old.shutdown().await;
    let new = t.start(
        &h.store(),
        "b",
        vec![job("report-daily").renamed_from("daily-report")],
    );
    tokio::time::sleep(2 * SECOND).await;
    new.shutdown().await;
    let states = states(&t, &db).await;
    assert!(
        !states.contains_key(&("report-daily".to_owned(), slot)),
        "the finished slot ran again under the new name: {states:?}"
    );
    let writes = t.writes(&db).await;
    assert_eq!(writes[&slot].len(), 1, "the slot's writes once: {writes:?}");
    t.drop(&db).await;
}

/// A scheduler whose run table was never made says so, naming the migration, in its health
/// (and its log), rather than failing each look in silence.
pub async fn a_missing_run_table_names_its_migration<H: Harness<Store = SeaOrmLeaseStore>>(h: &H) {
    let db = h.store().connection().clone();
    let resource = super::unique("jobs");
    let runs = super::unique("no_runs");
    let node = Jobs::builder(h.store())
        .candidate_id("a")
        .resource(&resource)
        .lease_duration(LEASE)
        .renew_interval(RENEW)
        .retry_interval(RETRY)
        .runs_table(&runs)
        .job(Job::new(
            "j",
            Schedule::every(SECOND).unwrap(),
            |_run| async { Ok(()) },
        ))
        .build()
        .unwrap()
        .start();
    let health = poll(
        5 * SECOND,
        Duration::from_millis(50),
        || async { node.health() },
        |health| health.scheduling.is_some(),
    )
    .await;
    // A node that no longer leads has no failing look to report (the aborted loop ends at
    // its task's next poll).
    node.abort().await;
    let after = poll(
        2 * SECOND,
        Duration::from_millis(20),
        || async { node.health() },
        |health| health.scheduling.is_none(),
    )
    .await;
    assert_eq!(after.scheduling, None, "{after}");
    assert!(!health.healthy, "{health}");
    let problem = health.scheduling.unwrap_or_default();
    assert!(
        problem.contains("CreateJobRunTable") && problem.contains(&runs),
        "names the migration and the table: {problem}"
    );
    drop(db);
}

/// Two services (different job sets) on one resource: the node whose jobs the leader lacks
/// says so (health, and a warning), and a node with the leader's own set does not.
pub async fn a_follower_with_another_job_set_says_so<H: Harness<Store = SeaOrmLeaseStore>>(h: &H) {
    let db = h.store().connection().clone();
    let t = Tables::create(&db).await;
    let noop = |name: &str| {
        Job::new(name, Schedule::every(SECOND).unwrap(), |_run| async {
            Ok(())
        })
    };
    let leader = t.start(&h.store(), "a", vec![noop("nightly-cleanup")]);
    leader_of(std::slice::from_ref(&leader), 5 * SECOND).await;
    let same = t.start(&h.store(), "b", vec![noop("nightly-cleanup")]);
    let other = t.start(&h.store(), "c", vec![noop("nightly-report")]);
    let health = poll(
        5 * SECOND,
        Duration::from_millis(50),
        || async { other.health() },
        |health| health.other_job_set.is_some(),
    )
    .await;
    let seen = health.other_job_set.clone().unwrap_or_default();
    assert!(
        seen.contains("nightly-cleanup") && seen.contains("nightly-report") && seen.contains('a'),
        "the other set's node says who leads with what: {health}"
    );
    assert!(
        health.to_string().contains("another job set leads"),
        "{health}"
    );
    assert_eq!(
        same.health().other_job_set,
        None,
        "the same set: {}",
        same.health()
    );
    assert_eq!(leader.health().other_job_set, None);
    for node in [&other, &same, &leader] {
        node.shutdown().await;
    }
    t.drop(&db).await;
}

#[macro_export]
macro_rules! job_suite {
    (#[ignore = $why:literal] $setup:expr) => {
        $crate::job_suite!(@all [ignore = $why] $setup);
    };
    ($setup:expr) => {
        $crate::job_suite!(@all [cfg(all())] $setup);
    };
    (@all $attr:tt $setup:expr) => {
        $crate::job_suite!(@cases $attr $setup;
            one_run_per_slot_across_three_processes,
            a_leader_killed_before_its_commit_is_run_again_once,
            a_leader_killed_after_its_commit_does_not_run_again,
            a_paused_leaders_late_finish_is_refused,
            failed_attempts_are_retried_then_given_up,
            a_run_table_without_its_attempt_history_goes_on,
            slots_due_while_one_runs_are_skipped,
            a_shutdown_lets_the_running_slot_finish,
            a_begin_after_the_closure_returned_is_refused,
            bad_input_is_refused_before_anything_runs,
            a_run_that_returned_never_makes_its_next_slot_skipped,
            a_new_job_with_the_shortest_deadline_runs_every_slot,
            a_panicking_job_fails_with_its_message,
            a_renamed_job_never_runs_a_finished_slot_again,
            a_missing_run_table_names_its_migration,
            a_follower_with_another_job_set_says_so,
            slots_due_together_are_claimed_in_one_statement,
            a_job_with_nothing_finished_is_reported_stale,
            ended_records_are_pruned_and_no_slot_runs_again,
            a_key_submitted_from_three_processes_at_once_runs_once,
            a_key_whose_leader_dies_mid_run_runs_again_once,
            keyed_runs_are_retried_given_up_and_capped,
            a_run_table_without_the_key_refuses_keys_until_its_migration_runs,
            ended_keys_are_pruned_by_when_they_ended,
            a_cap_group_bounds_runs_across_schedulers,
            a_run_whose_permit_is_lost_commits_nothing,
            a_full_cap_skips_slots_and_a_long_run_keeps_its_permit,
            a_lost_permit_stops_the_closure_before_the_next_attempt,
            a_full_cap_is_asked_again_within_half_a_second,
            spread_runs_use_several_nodes_within_their_limit,
            a_runner_killed_mid_run_runs_once_more_and_its_late_writes_are_refused,
            keys_spread_over_nodes_run_once_within_their_cap,
            a_leader_that_does_not_spread_never_starts_a_spread_run_twice,
            a_leader_reads_every_permit_a_runner_may_hold,
            a_claimed_start_runs_under_a_leader_that_does_not_spread,
            a_start_no_runner_takes_is_reported_waiting,
        );
    };
    (@cases $attr:tt $setup:expr; $($case:ident),* $(,)?) => {
        mod jobs {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #$attr
                async fn $case() {
                    #[allow(unused_imports)]
                    use $crate::common::conformance::Harness as _;
                    if let Some(h) = $setup.await {
                        $crate::common::jobs::$case(&h).await;
                        h.teardown().await;
                    }
                }
            )*
        }
    };
}
