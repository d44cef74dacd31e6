//! The leader's loop: read the database clock and the run table, plan every job
//! (`plan::plan`), claim what starts in one fenced transaction, run each claimed slot in its
//! own task, and sleep until the next slot, retry or poll.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use sea_orm::{ConnectionTrait, DbBackend, TransactionTrait};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::plan::{self, Action, Open, Policy, State, View};
use super::records::{self, Claimant};
use super::run::{JobRun, RunState};
use super::{Job, JobError};
use crate::{LeaderTerm, SeaOrmLeaseStore};

/// What every term's loop shares.
pub(crate) struct Shared {
    pub store: SeaOrmLeaseStore,
    pub table: Arc<str>,
    pub poll: Duration,
    pub jobs: Vec<Registered>,
}

/// A job as the scheduler keeps it.
pub(crate) struct Registered {
    pub job: Job,
    pub name: Arc<str>,
    pub schedule_text: String,
    pub policy: Policy,
}

impl Registered {
    pub(crate) fn new(job: Job, policy: Policy) -> Self {
        Self {
            name: job.name.as_str().into(),
            schedule_text: job.schedule.describe(),
            job,
            policy,
        }
    }
}

/// After a failed read or claim, the next look.
const AFTER_ERROR: Duration = Duration::from_millis(500);
/// The shortest sleep between two looks when nothing could start (no busy loop).
const MIN_SLEEP: Duration = Duration::from_millis(5);
/// The most claims in one fenced transaction: it holds the lease row (on SQLite the write
/// lock) and the leader's own renews wait for it; the rest wait for the next look.
const MAX_CLAIMS_PER_LOOK: usize = 100;

/// One term's loop. Returns when the term ends (the elector drops it at once when the lease no
/// longer covers it, and with it every run it started).
pub(crate) async fn lead(shared: Arc<Shared>, term: LeaderTerm) {
    let names: Vec<String> = shared.jobs.iter().map(|j| j.name.to_string()).collect();
    let mut running: Vec<BTreeSet<i64>> = vec![BTreeSet::new(); shared.jobs.len()];
    let mut tasks: JoinSet<()> = JoinSet::new();
    // What each task runs, to clear it from `running` however the task ends.
    let mut slots: HashMap<tokio::task::Id, (usize, i64)> = HashMap::new();
    let mut latest: Option<Vec<Option<i64>>> = None;
    tracing::info!(token = %term.token(), jobs = names.len(), "scheduling jobs");
    loop {
        if term.is_lost() {
            break;
        }
        if !term.is_current() {
            // Past its local deadline but not lost: a renew answered late may still extend
            // it. Claim nothing meanwhile; the elector ends the term or renews it.
            tokio::select! {
                _ = term.lost() => break,
                _ = tokio::time::sleep(Duration::from_millis(20)) => continue,
            }
        }
        let looked = tick(
            &shared,
            &term,
            &names,
            &mut latest,
            &mut running,
            &mut tasks,
            &mut slots,
        )
        .await;
        // A refused fence included: the elector, not this loop, decides when the term ends (a
        // loop that returned while the term went on would run nothing until the next term).
        let sleep = match looked {
            Ok(sleep) => sleep,
            Err(e) => {
                // Read the newest slots again: a claim whose commit failed may have committed.
                latest = None;
                tracing::warn!(error = %e, "job scheduling failed; looking again");
                AFTER_ERROR
            }
        };
        let wake = Instant::now() + sleep;
        let lost = tokio::select! {
            _ = term.lost() => true,
            _ = tokio::time::sleep_until(wake) => false,
            Some(done) = tasks.join_next_with_id() => {
                let id = match &done {
                    Ok((id, ())) => *id,
                    Err(e) => e.id(),
                };
                if let Some((job, slot)) = slots.remove(&id) {
                    running[job].remove(&slot);
                }
                false
            }
        };
        if lost {
            break;
        }
    }
    // A shutdown or handover: nothing new is claimed, and the runs under way get the grace
    // period to finish (on every other end of the term this future is dropped at once, and
    // the runs with it).
    if !tasks.is_empty() {
        tracing::info!(
            runs = tasks.len(),
            "term ending: letting the running slots finish"
        );
    }
    while tasks.join_next().await.is_some() {}
}

/// One look: plan, claim, start. Returns how long to sleep.
async fn tick(
    shared: &Arc<Shared>,
    term: &LeaderTerm,
    names: &[String],
    latest: &mut Option<Vec<Option<i64>>>,
    running: &mut [BTreeSet<i64>],
    tasks: &mut JoinSet<()>,
    slots: &mut HashMap<tokio::task::Id, (usize, i64)>,
) -> Result<Duration, JobError> {
    let db = shared.store.connection();
    let backend = db.get_database_backend();
    let table = &*shared.table;
    // The newest recorded slot per job, read once per term: while it leads, this term is the
    // only one that adds records (its claims are fenced; operators only mark existing ones).
    if latest.is_none() {
        let rows = db.query_all(&records::latest_slots(table, names)).await?;
        let mut found = vec![None; names.len()];
        for row in rows {
            let job: String = row.try_get_by_index(0)?;
            let slot: Option<i64> = row.try_get_by_index(1)?;
            if let Some(i) = names.iter().position(|n| *n == job) {
                found[i] = slot;
            }
        }
        *latest = Some(found);
    }
    let mut open: Vec<Vec<Open>> = vec![Vec::new(); names.len()];
    for row in db.query_all(&records::open_runs(table, names)).await? {
        match records::decode_open(&row) {
            Ok(Some((job, record))) => {
                if let Some(i) = names.iter().position(|n| *n == job) {
                    open[i].push(record);
                }
            }
            Ok(None) => {}
            // One unreadable record (edited by hand, say) does not stop every job.
            Err(e) => tracing::warn!(error = %e, "a run record could not be read; left alone"),
        }
    }
    let now_ms = database_now(db, backend).await?;
    let read_at = Instant::now();
    let latest_now = latest
        .as_mut()
        .ok_or_else(|| JobError::Database(sea_orm::DbErr::Custom("no latest slots".to_owned())))?;

    let mut wake_ms: Option<i64> = None;
    let mut per_job: Vec<std::collections::VecDeque<(usize, Action)>> = Vec::new();
    for (i, reg) in shared.jobs.iter().enumerate() {
        let p = plan::plan(
            &View {
                schedule: &reg.job.schedule,
                policy: &reg.policy,
                latest: latest_now[i],
                open: &open[i],
                running: &running[i],
            },
            now_ms,
        );
        wake_ms = plan::earliest(wake_ms, p.wake_ms);
        per_job.push(p.actions.into_iter().map(|a| (i, a)).collect());
    }
    // Round robin over the jobs (each job's own actions stay in order), so that one job's
    // long catch-up cannot take every claim of a look.
    let mut decided: Vec<(usize, Action)> = Vec::new();
    let mut queues: Vec<std::collections::VecDeque<(usize, Action)>> = per_job;
    while queues.iter().any(|q| !q.is_empty()) {
        for q in queues.iter_mut() {
            if let Some(action) = q.pop_front() {
                decided.push(action);
            }
        }
    }

    let more = decided.len() > MAX_CLAIMS_PER_LOOK;
    decided.truncate(MAX_CLAIMS_PER_LOOK);
    if !decided.is_empty() {
        let claimed = claim(shared, term, backend, &decided).await?;
        for (i, action) in claimed {
            match action {
                Action::Start { slot, prior } => {
                    latest_now[i] = Some(latest_now[i].map_or(slot, |l| l.max(slot)));
                    let attempt = prior.map_or(1, |p| p.attempts.saturating_add(1));
                    let lateness_ms = now_ms.saturating_sub(slot).max(0) as u64;
                    let lateness =
                        Duration::from_millis(lateness_ms).saturating_add(read_at.elapsed());
                    running[i].insert(slot);
                    let id = start(shared, term, i, slot, attempt, lateness, tasks);
                    slots.insert(id, (i, slot));
                }
                Action::Skip { slot } => {
                    latest_now[i] = Some(latest_now[i].map_or(slot, |l| l.max(slot)));
                    super::metrics_hook::outcome(&shared.jobs[i].name, "skipped");
                    tracing::info!(job = %shared.jobs[i].name, slot, "slot skipped: the previous one still runs");
                }
                Action::GiveUp { prior } => {
                    super::metrics_hook::outcome(&shared.jobs[i].name, "given_up");
                    tracing::warn!(job = %shared.jobs[i].name, slot = prior.slot, attempts = prior.attempts, "slot given up: its attempts are spent");
                }
            }
        }
    }

    let poll = shared.poll;
    if more {
        return Ok(MIN_SLEEP);
    }
    let sleep = match wake_ms {
        Some(wake) => {
            let ahead = u64::try_from(wake.saturating_sub(now_ms)).unwrap_or(0);
            Duration::from_millis(ahead)
                .saturating_sub(read_at.elapsed())
                .min(poll)
        }
        None => poll,
    };
    Ok(sleep.max(MIN_SLEEP))
}

/// The database clock, in milliseconds since the Unix epoch.
async fn database_now(
    db: &sea_orm::DatabaseConnection,
    backend: DbBackend,
) -> Result<i64, JobError> {
    let row = db
        .query_one(&records::clock(backend))
        .await?
        .ok_or_else(|| JobError::Database(sea_orm::DbErr::RecordNotFound("now".to_owned())))?;
    let now: chrono::DateTime<chrono::Utc> = row.try_get_by_index(0)?;
    Ok(now.timestamp_millis())
}

/// Claims (or skips, or gives up) what the planner decided, in one transaction fenced by the
/// term. A record changed since it was read is left out (its update matched nothing).
async fn claim(
    shared: &Shared,
    term: &LeaderTerm,
    backend: DbBackend,
    decided: &[(usize, Action)],
) -> Result<Vec<(usize, Action)>, JobError> {
    let table = &*shared.table;
    if term.is_lost() {
        // A shutdown began during this look: nothing new starts.
        return Ok(Vec::new());
    }
    let txn = shared.store.connection().begin().await?;
    if let Err(e) = term.fence(&txn).await {
        let _ = txn.rollback().await;
        // Refused: nothing is claimed; the loop looks again, and the elector ends the term.
        return Err(e.into());
    }
    let mut done = Vec::with_capacity(decided.len());
    for (i, action) in decided {
        let reg = &shared.jobs[*i];
        let by = Claimant {
            token: term.token().get(),
            holder: term.candidate(),
            schedule: &reg.schedule_text,
        };
        let result = match action {
            Action::Start { slot, prior: None } => {
                txn.execute(&records::insert(
                    backend,
                    table,
                    &reg.name,
                    *slot,
                    State::Running,
                    &by,
                ))
                .await
            }
            Action::Start {
                prior: Some(prior), ..
            } => {
                txn.execute(&records::reclaim(backend, table, &reg.name, prior, &by))
                    .await
            }
            Action::Skip { slot } => {
                txn.execute(&records::insert(
                    backend,
                    table,
                    &reg.name,
                    *slot,
                    State::Skipped,
                    &by,
                ))
                .await
            }
            Action::GiveUp { prior } => {
                txn.execute(&records::give_up(table, &reg.name, prior))
                    .await
            }
        };
        match result {
            Ok(r) if r.rows_affected() == 1 => done.push((*i, action.clone())),
            Ok(_) => {
                tracing::debug!(job = %reg.name, ?action, "run record changed since it was read")
            }
            Err(e) => {
                let _ = txn.rollback().await;
                return Err(e.into());
            }
        }
    }
    txn.commit().await?;
    Ok(done)
}

/// Runs one claimed attempt in its own task (a panic fails the attempt), then ends it.
fn start(
    shared: &Arc<Shared>,
    term: &LeaderTerm,
    i: usize,
    slot: i64,
    attempt: i32,
    lateness: Duration,
    tasks: &mut JoinSet<()>,
) -> tokio::task::Id {
    let reg = &shared.jobs[i];
    let run = JobRun {
        inner: Arc::new(RunState {
            job: reg.name.clone(),
            slot,
            attempt,
            term: term.clone(),
            store: shared.store.clone(),
            table: shared.table.clone(),
            started: Instant::now(),
            lateness,
            committed: AtomicBool::new(false),
            began: AtomicBool::new(false),
            sealed: AtomicBool::new(false),
        }),
    };
    super::metrics_hook::lateness(&reg.name, lateness);
    tracing::info!(job = %reg.name, slot, attempt, token = %term.token(), lateness_ms = lateness.as_millis() as u64, "job run starts");
    let work = reg.job.work.clone();
    let max_attempts = reg.policy.max_attempts;
    tasks
        .spawn(async move {
            // The work in a task of its own, so that a panic fails only this attempt; aborted when
            // this task is (the term ended).
            let handle = tokio::spawn((work)(run.clone()));
            let guard = AbortOnDrop(handle.abort_handle());
            let result = handle.await;
            drop(guard);
            let error = match result {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e.to_string()),
                Err(e) if e.is_panic() => Some("the job panicked".to_owned()),
                Err(_) => Some("the job was cancelled".to_owned()),
            };
            finish(&run, error, max_attempts).await;
        })
        .id()
}

/// Ends an attempt after its closure returned.
async fn finish(run: &JobRun, error: Option<String>, max_attempts: i32) {
    let job = run.job().to_owned();
    let slot = run.slot_millis();
    let duration = run.inner.started.elapsed();
    // From here on the closure's `begin` is refused.
    let began = run.seal();
    if run.committed() {
        if let Some(e) = &error {
            tracing::warn!(%job, slot, error = %e, "the job failed after its commit: the slot stays finished");
        }
        super::metrics_hook::finished(&job, "finished", duration);
        return;
    }
    // Writes begun in the run's transaction and never committed were rolled back: the slot
    // is not done.
    let error = match error {
        None if began => {
            Some("the job began its fenced transaction but did not commit it".to_owned())
        }
        other => other,
    };
    let (state, outcome) = match &error {
        None => (State::Finished, "finished"),
        Some(_) if run.inner.attempt >= max_attempts => (State::GivenUp, "given_up"),
        Some(_) => (State::Failed, "failed"),
    };
    match run.end(state, error.as_deref()).await {
        Ok(()) => {
            super::metrics_hook::finished(&job, outcome, duration);
            match &error {
                None => {
                    tracing::info!(%job, slot, ms = duration.as_millis() as u64, "job run finished")
                }
                Some(e) => {
                    tracing::warn!(%job, slot, attempt = run.attempt(), error = %e, outcome, "job run failed")
                }
            }
        }
        Err(e) => {
            let outcome = if e.kind() == crate::ErrorKind::Lost {
                "superseded"
            } else {
                "unmarked"
            };
            super::metrics_hook::finished(&job, outcome, duration);
            tracing::warn!(%job, slot, error = %e, "job run could not be marked; the slot is claimed again by the leader of the time");
        }
    }
}

struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
