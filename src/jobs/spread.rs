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

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use sea_orm::ConnectionTrait;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::records;
use super::run::begin_fenced;
use super::runner::attempt::{release, start, Launch};
use super::runner::{database_now, keyed_error, read, Shared};
use super::JobError;
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
    let (scheduled, keyed): (Vec<usize>, Vec<usize>) =
        (0..shared.jobs.len()).partition(|&i| !shared.jobs[i].job.is_keyed());
    let poll = shared.poll.min(RUNNER_POLL);
    let mut set = JoinSet::new();
    // The jobs whose hold or cap was found full: later looks read past them, so one job's
    // waiting starts never hide the others'; forgotten once a look read everything that is
    // claimed, or a run of this node ended.
    let mut blocked = HashSet::new();
    tracing::debug!(per_node, "job runner starts");
    loop {
        let mut ended = false;
        while set.try_join_next().is_some() {
            ended = true;
        }
        if ended {
            // This node's leader, if it leads, may start what waited for these runs.
            shared.wake.notify_one();
            blocked.clear();
        }
        if stop.is_cancelled() {
            break;
        }
        let mut wait = poll;
        if set.len() < per_node {
            let look = take(
                &shared,
                (&scheduled, &keyed),
                (per_node, &stop),
                &mut set,
                &blocked,
            )
            .await;
            if look.read_all {
                blocked.clear();
            }
            blocked.extend(look.blocked);
            match &look.problem {
                Some(problem) => {
                    tracing::warn!(%problem, "taking claimed job runs failed; looking again");
                    wait = AFTER_ERROR;
                }
                None if look.more => wait = Duration::ZERO,
                None => {}
            }
            *lock(&shared.runner_problem) = look.problem;
        }
        tokio::select! {
            biased;
            () = stop.cancelled() => break,
            Some(_) = set.join_next(), if !set.is_empty() => {
                shared.wake.notify_one();
                blocked.clear();
            }
            () = shared.runner_wake.notified() => {}
            () = tokio::time::sleep(wait) => {}
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

/// What one look of a runner found.
#[derive(Default)]
struct Look {
    /// It read a full batch and has room for more: look again at once.
    more: bool,
    /// The jobs whose hold or cap was full (or whose ask failed).
    blocked: HashSet<usize>,
    /// Every read came back below its limit: nothing claimed of the jobs read was left
    /// unread (the jobs skipped are asked again at the next look).
    read_all: bool,
    /// The first thing that failed (the rest of the look went on).
    problem: Option<String>,
}

impl Look {
    fn failed(&mut self, e: &JobError) {
        if self.problem.is_none() {
            self.problem = Some(crate::error::chain(e));
        }
    }
}

/// A claimed attempt as a runner reads it.
struct Claimed {
    job: usize,
    slot: i64,
    attempt: i32,
    claimed_at: Option<chrono::DateTime<chrono::Utc>>,
    key: Option<String>,
}

/// One look: the claimed attempts of this node's jobs (the scheduled jobs' and the keyed
/// jobs' read apart, so that a run table without the key column stops only the keys), but
/// those of the jobs in `skip`, oldest claim first, each taken if its job's run hold (and its
/// cap's permit) is free. A failure with one record is reported and the look goes on.
async fn take(
    shared: &Arc<Shared>,
    (scheduled, keyed): (&[usize], &[usize]),
    (per_node, stop): (usize, &CancellationToken),
    set: &mut JoinSet<()>,
    skip: &HashSet<usize>,
) -> Look {
    let mut look = Look::default();
    let free = per_node.saturating_sub(set.len());
    // More than there is room for: some may wait for their job's hold or cap.
    let limit = READ_LIMIT.min(u64::try_from(free).unwrap_or(u64::MAX).saturating_mul(4));
    let mut found: Vec<Claimed> = Vec::new();
    let mut full = false;
    for (jobs, with_key) in [(scheduled, false), (keyed, true)] {
        let ids: Vec<usize> = jobs.iter().copied().filter(|i| !skip.contains(i)).collect();
        let names: Vec<String> = ids
            .iter()
            .map(|&i| shared.jobs[i].name.to_string())
            .collect();
        if names.is_empty() {
            continue;
        }
        let query = records::claimed(&shared.table, &names, with_key, limit);
        let rows = match read(shared, &query).await {
            Ok(rows) => rows,
            Err(e) => {
                let e = if with_key { keyed_error(shared, e) } else { e };
                look.failed(&e);
                continue;
            }
        };
        full |= rows.len() as u64 >= limit;
        for row in rows {
            match decode(&row, with_key, &names) {
                Ok(Some((i, mut claimed))) => {
                    // Back to the scheduler's index.
                    claimed.job = ids[i];
                    found.push(claimed);
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "a claimed run record could not be read; left alone")
                }
            }
        }
    }
    // Every read came back below its limit: what was skipped is asked again next look.
    look.read_all = !full && look.problem.is_none();
    if found.is_empty() {
        return look;
    }
    found.sort_by_key(|c| (c.claimed_at, c.slot));
    let backend = shared.store.connection().get_database_backend();
    let now_ms = match database_now(shared, backend).await {
        Ok(now) => now,
        Err(e) => {
            look.failed(&e);
            return look;
        }
    };
    let read_at = Instant::now();
    let mut took = 0usize;
    for claimed in found {
        // A shutdown that began during the look: nothing more is taken.
        if set.len() >= per_node || stop.is_cancelled() {
            break;
        }
        let i = claimed.job;
        if look.blocked.contains(&i) {
            continue;
        }
        let reg = &shared.jobs[i];
        let Some(holds) = &reg.run_hold else {
            continue;
        };
        if reg.job.is_keyed() && claimed.key.is_none() {
            tracing::warn!(job = %reg.name, slot = claimed.slot, "a keyed job's record has no key; left alone");
            continue;
        }
        // The cap's permit first: a start without one waits in `claimed`.
        let permit = match &reg.cap {
            Some(cap) => match cap.try_acquire().await {
                Ok(Some(permit)) => Some(permit),
                Ok(None) => {
                    look.blocked.insert(i);
                    continue;
                }
                Err(e) => {
                    look.failed(&JobError::Cap(e));
                    look.blocked.insert(i);
                    continue;
                }
            },
            None => None,
        };
        let hold = match holds.try_acquire().await {
            Ok(Some(hold)) => hold,
            // Every run hold of the job is held (a run of it is still ending, here or on
            // another node): a later look takes it.
            Ok(None) => {
                release(permit).await;
                look.blocked.insert(i);
                continue;
            }
            Err(e) => {
                release(permit).await;
                look.failed(&JobError::RunHold(e));
                look.blocked.insert(i);
                continue;
            }
        };
        let term = hold.term().clone();
        match take_one(shared, &term, &reg.name, &claimed).await {
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
                look.failed(&e);
                continue;
            }
        }
        // A slot's lateness counts from its time; a key's from the leader's claim.
        let since = if reg.job.is_keyed() {
            claimed.claimed_at.map_or(now_ms, |t| t.timestamp_millis())
        } else {
            claimed.slot
        };
        let lateness = Duration::from_millis(now_ms.saturating_sub(since).max(0) as u64)
            .saturating_add(read_at.elapsed());
        start(
            shared,
            &term,
            Launch {
                job: i,
                slot: claimed.slot,
                key: claimed.key.map(Into::into),
                permit,
                hold: Some(hold),
                attempt: claimed.attempt,
                lateness,
            },
            set,
            None,
        );
        took += 1;
    }
    look.more = full && took > 0 && set.len() < per_node;
    look
}

/// A [`records::claimed`] row: the index of its job in `names`, and the attempt.
fn decode(
    row: &sea_orm::QueryResult,
    with_key: bool,
    names: &[String],
) -> Result<Option<(usize, Claimed)>, sea_orm::DbErr> {
    let job: String = row.try_get_by_index(0)?;
    let Some(i) = names.iter().position(|n| *n == job) else {
        return Ok(None);
    };
    Ok(Some((
        i,
        Claimed {
            job: i,
            slot: row.try_get_by_index(1)?,
            attempt: row.try_get_by_index(2)?,
            claimed_at: row.try_get_by_index(3)?,
            key: if with_key {
                row.try_get_by_index(4)?
            } else {
                None
            },
        },
    )))
}

/// Marks `claimed` running under `term` (the run's hold), in a transaction fenced by it:
/// whether the record was still the claimed attempt read.
async fn take_one(
    shared: &Shared,
    term: &crate::hold::LeaderTerm,
    job: &str,
    claimed: &Claimed,
) -> Result<bool, JobError> {
    let Ok(txn) = begin_fenced(&shared.store, term).await? else {
        return Ok(false);
    };
    let stmt = records::take(
        txn.get_database_backend(),
        &shared.table,
        job,
        claimed.slot,
        claimed.attempt,
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
