//! Spread runs ([`JobsBuilder::spread_runs`](super::JobsBuilder::spread_runs)): every node's
//! runner, which takes the attempts the leader claimed and runs them, each under a hold of its
//! own.
//!
//! The leader plans and claims as ever, but records a start as `claimed` instead of running
//! it. A node's runner reads the claimed attempts of its jobs, takes a permit of the job's run
//! semaphore (one permit per run the job may have at once: a hold on the core, renewed by the
//! store's one renewer, with a fencing token of its own), and in a transaction fenced by that
//! hold marks the record `running` under the hold's token and holder. The run's writes and its
//! end are fenced by the hold, and its end matches only while the record names that token. A
//! runner that dies, pauses or is cut off loses its hold (an expired lease is never renewed
//! under its old token); the leader sees that the hold the record names is not live and claims
//! the slot again, and the next runner's hold on that permit has a higher token.

use std::sync::Arc;
use std::time::Duration;

use sea_orm::ConnectionTrait;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::records;
use super::run::begin_fenced;
use super::runner::attempt::{start, Launch};
use super::runner::{database_now, keyed_error, read, Shared};
use super::JobError;
use crate::locks::LockGuard;
use crate::mutex::lock;

/// The longest wait between two looks of a runner for claimed attempts (the scheduler's poll
/// interval when that is shorter). The leader's own runner is woken by its claims at once.
pub(crate) const RUNNER_POLL: Duration = Duration::from_secs(1);
/// After a failed look, the next.
const AFTER_ERROR: Duration = Duration::from_millis(500);
/// The most claimed attempts one look reads.
const READ_LIMIT: u64 = 100;

/// A node's runner: until `stop`, takes claimed attempts while fewer than `per_node` of its
/// runs are under way; then lets those finish (the caller bounds that by the grace period).
pub(crate) async fn run(shared: Arc<Shared>, per_node: usize, stop: CancellationToken) {
    let names: Vec<String> = shared.jobs.iter().map(|j| j.name.to_string()).collect();
    let with_key = shared.jobs.iter().any(|j| j.job.is_keyed());
    let poll = shared.poll.min(RUNNER_POLL);
    let mut set = JoinSet::new();
    tracing::debug!(per_node, "job runner starts");
    loop {
        while set.try_join_next().is_some() {}
        let mut wait = poll;
        if set.len() < per_node {
            match take(&shared, (&names, with_key), per_node, &mut set).await {
                Ok(more) => {
                    *lock(&shared.runner_problem) = None;
                    if more {
                        wait = Duration::ZERO;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "taking claimed job runs failed; looking again");
                    *lock(&shared.runner_problem) = Some(crate::error::chain(&e));
                    wait = AFTER_ERROR;
                }
            }
        }
        tokio::select! {
            () = stop.cancelled() => break,
            () = shared.runner_wake.notified() => {}
            () = tokio::time::sleep(wait) => {}
            Some(_) = set.join_next(), if !set.is_empty() => {}
        }
    }
    *lock(&shared.runner_problem) = None;
    if !set.is_empty() {
        tracing::info!(
            runs = set.len(),
            "job runner stopping: letting its runs finish"
        );
    }
    while set.join_next().await.is_some() {}
}

/// One look: the claimed attempts of this node's jobs, oldest claim first, each taken if its
/// job's run hold (and its cap's permit) is free. Whether the look read a full batch and could
/// take more (look again at once).
async fn take(
    shared: &Arc<Shared>,
    (names, with_key): (&[String], bool),
    per_node: usize,
    set: &mut JoinSet<()>,
) -> Result<bool, JobError> {
    let free = per_node.saturating_sub(set.len());
    // More than there is room for: some may wait for their job's hold or cap.
    let limit = READ_LIMIT.min(u64::try_from(free).unwrap_or(u64::MAX).saturating_mul(4));
    let query = records::claimed(&shared.table, names, with_key, limit);
    let rows = read(shared, &query)
        .await
        .map_err(|e| keyed_error(shared, e))?;
    if rows.is_empty() {
        return Ok(false);
    }
    let backend = shared.store.connection().get_database_backend();
    let now_ms = database_now(shared, backend).await?;
    let read_at = Instant::now();
    let full = rows.len() as u64 >= limit;
    let mut took = 0usize;
    for row in rows {
        if set.len() >= per_node {
            break;
        }
        let decoded = (|| {
            let key: Option<String> = if with_key {
                row.try_get_by_index(4)?
            } else {
                None
            };
            Ok::<_, sea_orm::DbErr>((
                row.try_get_by_index::<String>(0)?,
                row.try_get_by_index::<i64>(1)?,
                row.try_get_by_index::<i32>(2)?,
                row.try_get_by_index::<Option<chrono::DateTime<chrono::Utc>>>(3)?,
                key,
            ))
        })();
        let (job, slot, attempt, claimed_at, key) = match decoded {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(error = %e, "a claimed run record could not be read; left alone");
                continue;
            }
        };
        let Some(i) = names.iter().position(|n| *n == job) else {
            continue;
        };
        let reg = &shared.jobs[i];
        let Some(holds) = &reg.run_hold else {
            continue;
        };
        if reg.job.is_keyed() && key.is_none() {
            tracing::warn!(%job, slot, "a keyed job's record has no key; left alone");
            continue;
        }
        // The cap's permit first: a start without one waits in `claimed`.
        let permit = match &reg.cap {
            Some(cap) => match cap.try_acquire().await.map_err(JobError::Cap)? {
                Some(permit) => Some(permit),
                None => continue,
            },
            None => None,
        };
        let hold = match holds.try_acquire().await {
            Ok(Some(hold)) => hold,
            // Every run hold of the job is held (a run of it is still ending, here or on
            // another node): a later look takes it.
            Ok(None) => {
                release(permit).await;
                continue;
            }
            Err(e) => {
                release(permit).await;
                return Err(JobError::RunHold(e));
            }
        };
        let term = hold.term().clone();
        let taken = async {
            let txn = match begin_fenced(&shared.store, &term).await? {
                Ok(txn) => txn,
                Err(_) => return Ok::<_, JobError>(false),
            };
            let stmt = records::take(
                backend,
                &shared.table,
                &job,
                slot,
                attempt,
                (term.token().get(), term.candidate()),
            );
            match txn.execute(&stmt).await {
                Ok(done) if done.rows_affected() == 1 => {
                    txn.commit().await?;
                    Ok(true)
                }
                Ok(_) => {
                    let _ = txn.rollback().await;
                    Ok(false)
                }
                Err(e) => {
                    let _ = txn.rollback().await;
                    Err(e.into())
                }
            }
        }
        .await;
        match taken {
            Ok(true) => {}
            // Another runner took it, an operator marked it, or the hold was lost meanwhile.
            Ok(false) => {
                release(Some(hold)).await;
                release(permit).await;
                continue;
            }
            Err(e) => {
                release(Some(hold)).await;
                release(permit).await;
                return Err(e);
            }
        }
        // A slot's lateness counts from its time; a key's from the leader's claim.
        let since = if reg.job.is_keyed() {
            claimed_at.map_or(now_ms, |t| t.timestamp_millis())
        } else {
            slot
        };
        let lateness = Duration::from_millis(now_ms.saturating_sub(since).max(0) as u64)
            .saturating_add(read_at.elapsed());
        start(
            shared,
            &term,
            Launch {
                job: i,
                slot,
                key: key.map(Into::into),
                permit,
                hold: Some(hold),
                attempt,
                lateness,
            },
            set,
            None,
        );
        took += 1;
    }
    Ok(full && took > 0 && set.len() < per_node)
}

/// Gives back a permit or hold taken for a run that did not start.
async fn release(guard: Option<LockGuard>) {
    if let Some(guard) = guard {
        if let Err(e) = guard.release().await {
            tracing::debug!(error = %e, "releasing a run's hold failed; it lapses");
        }
    }
}
