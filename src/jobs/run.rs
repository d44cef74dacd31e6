//! One attempt of one slot, as the job's closure sees it: the slot, the term to fence with,
//! and the fenced transaction in which the job's writes and the "finished" mark commit together.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DatabaseTransaction};
use tokio::time::Instant;

use super::plan::State;
use super::records::{self, Ending};
use super::JobError;
use crate::{backend::SeaOrmLeaseStore, fencing::FencingToken, hold::LeaderTerm};

/// One attempt at one slot of a job, handed to the job's closure.
///
/// Write through [`begin`](Self::begin) and [`commit`](Self::commit): the transaction is
/// fenced by the run's [`term`](Self::term), and `commit` writes the slot's "finished" mark in
/// it, so the job's writes and the mark commit together or not at all. A slot whose writes
/// committed is never run again; an attempt that fails or crashes before its commit leaves
/// nothing, and the slot is run again (see [`Job::max_attempts`](super::Job::max_attempts)).
///
/// A closure that returns `Ok` without calling `begin` has its slot marked finished by the
/// scheduler afterwards (at least once, for work outside the lease database); one that called
/// `begin` and returned without committing fails the attempt (its writes rolled back).
#[derive(Clone)]
pub struct JobRun {
    pub(crate) inner: Arc<RunState>,
}

pub(crate) struct RunState {
    pub job: Arc<str>,
    pub slot: i64,
    /// A keyed job's key.
    pub key: Option<Arc<str>>,
    pub attempt: i32,
    pub term: LeaderTerm,
    /// A capped job's permit ([`Job::cap`](super::Job::cap)): every fenced transaction of the
    /// run is fenced by it too.
    pub permit: Option<LeaderTerm>,
    pub store: SeaOrmLeaseStore,
    pub table: Arc<str>,
    pub started: Instant,
    pub lateness: Duration,
    pub committed: AtomicBool,
    /// Whether the closure called `begin`.
    pub began: AtomicBool,
    /// Set when the closure has returned: `begin` is refused from then on.
    pub sealed: AtomicBool,
}

impl std::fmt::Debug for JobRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobRun")
            .field("job", &&*self.inner.job)
            .field("slot", &self.inner.slot)
            .field("key", &self.key())
            .field("attempt", &self.inner.attempt)
            .field("token", &self.inner.term.token().get())
            .finish()
    }
}

impl JobRun {
    /// The job's name.
    pub fn job(&self) -> &str {
        &self.inner.job
    }

    /// A keyed job's key ([`Job::keyed`](super::Job::keyed)); `None` for a scheduled slot.
    pub fn key(&self) -> Option<&str> {
        self.inner.key.as_deref()
    }

    /// The slot: the time this run was scheduled for (UTC, from the database clock). A keyed
    /// job's run has no time: its slot is the key's digest (see [`key`](Self::key)).
    pub fn slot(&self) -> DateTime<Utc> {
        super::schedule::millis_to_utc(self.inner.slot).unwrap_or_default()
    }

    /// The slot in milliseconds since the Unix epoch (the run table's key); a keyed job's run:
    /// the key's digest, the `slot` its record is kept under.
    pub fn slot_millis(&self) -> i64 {
        self.inner.slot
    }

    /// Which attempt at this slot this is (1 for the first).
    pub fn attempt(&self) -> u32 {
        u32::try_from(self.inner.attempt).unwrap_or(0)
    }

    /// How late the run started against its slot, by the database clock.
    pub fn lateness(&self) -> Duration {
        self.inner.lateness
    }

    /// The term that fences this run: the leadership term that claimed the slot or, with
    /// [spread runs](super::JobsBuilder::spread_runs), the run's own hold (a permit of the
    /// job's run semaphore). Fence writes outside the lease database with its token, and stop
    /// when it is lost.
    pub fn term(&self) -> &LeaderTerm {
        &self.inner.term
    }

    /// The fencing token of the run's [`term`](Self::term).
    pub fn token(&self) -> FencingToken {
        self.inner.term.token()
    }

    /// A capped job's permit ([`Job::cap`](super::Job::cap)) as a hold: its lease row
    /// ([`resource`](LeaderTerm::resource), `<semaphore>#<n>`) and its own
    /// [`token`](LeaderTerm::token), strictly above every earlier holder's of that permit. The
    /// run's fenced transactions are fenced by it as well as by the term; fence writes outside
    /// the lease database with both tokens. `None` for a job without a cap.
    pub fn permit(&self) -> Option<&LeaderTerm> {
        self.inner.permit.as_ref()
    }

    /// A transaction on the lease database, fenced by the run's term (its first statement is
    /// the fence). Write the job's rows in it, then [`commit`](Self::commit) it.
    pub async fn begin(&self) -> Result<DatabaseTransaction, JobError> {
        // Marked before the seal is looked at; the scheduler seals before it looks at this:
        // whichever comes second sees the other (a `begin` after the closure returned is
        // refused, or the attempt fails instead of being marked finished without its writes).
        self.inner.began.store(true, Ordering::SeqCst);
        if self.inner.sealed.load(Ordering::SeqCst) {
            return Err(JobError::NotClaimed {
                job: self.inner.job.to_string(),
                slot: self.inner.slot,
            });
        }
        self.fenced_transaction().await
    }

    /// A transaction fenced by the run's term. The fence decides, by the database: after a
    /// shutdown began, the term's `lost` has fired but its lease is still renewed for the
    /// grace period, and writes may commit.
    async fn fenced_transaction(&self) -> Result<DatabaseTransaction, JobError> {
        let txn = begin_fenced(&self.inner.store, &self.inner.term)
            .await?
            .map_err(|e| self.fenced(e))?;
        self.fence_permit(txn).await
    }

    /// Fences `txn` with the run's permit too, if it holds one (rolled back if refused).
    async fn fence_permit(
        &self,
        txn: DatabaseTransaction,
    ) -> Result<DatabaseTransaction, JobError> {
        if let Some(permit) = &self.inner.permit {
            if let Err(e) = permit.fence(&txn).await {
                let _ = txn.rollback().await;
                return Err(self.fenced(e));
            }
        }
        Ok(txn)
    }

    /// Marks the slot finished inside `txn` and commits it: the job's writes and the mark
    /// commit together. Refused, with `txn` rolled back, when the term (or a capped run's
    /// permit) is no longer current ([`JobError::Superseded`]) or the record no longer says this attempt runs
    /// ([`JobError::NotClaimed`]).
    pub async fn commit(&self, txn: DatabaseTransaction) -> Result<(), JobError> {
        let inner = &self.inner;
        if inner.committed.load(Ordering::SeqCst) {
            let _ = txn.rollback().await;
            return Err(JobError::AlreadyCommitted {
                job: inner.job.to_string(),
                slot: inner.slot,
            });
        }
        // Fenced again in this transaction: a transaction not made by `begin` is checked too.
        if let Err(e) = inner.term.fence(&txn).await {
            let _ = txn.rollback().await;
            return Err(self.fenced(e));
        }
        let txn = self.fence_permit(txn).await?;
        self.end_in(txn, State::Finished, None).await?;
        inner.committed.store(true, Ordering::SeqCst);
        Ok(())
    }

    fn superseded(&self) -> JobError {
        JobError::Superseded {
            job: self.inner.job.to_string(),
            slot: self.inner.slot,
        }
    }

    fn fenced(&self, e: crate::error::FenceError) -> JobError {
        if e.is_fenced() {
            self.superseded()
        } else {
            e.into()
        }
    }

    /// The scheduler's own end of the attempt (the closure returned without committing, or
    /// failed): one fenced transaction.
    pub(crate) async fn end(&self, state: State, error: Option<&str>) -> Result<(), JobError> {
        let txn = self.fenced_transaction().await?;
        self.end_in(txn, state, error).await
    }

    /// Writes this attempt's end into `txn` (only if the record still says this attempt of
    /// this term runs: else rolled back, [`JobError::NotClaimed`]) and commits it. The one
    /// place both the closure's commit and the scheduler's own end go through.
    async fn end_in(
        &self,
        txn: DatabaseTransaction,
        state: State,
        error: Option<&str>,
    ) -> Result<(), JobError> {
        let inner = &self.inner;
        let ending = Ending {
            state,
            token: inner.term.token().get(),
            duration_ms: millis(inner.started.elapsed()),
            error,
        };
        let stmt = records::end(
            txn.get_database_backend(),
            &inner.table,
            &inner.job,
            inner.slot,
            inner.attempt,
            inner.term.token().get(),
            &ending,
        );
        let rows = match txn.execute(&stmt).await {
            Ok(done) => done.rows_affected(),
            Err(e) => {
                let _ = txn.rollback().await;
                return Err(e.into());
            }
        };
        if rows != 1 {
            let _ = txn.rollback().await;
            return Err(JobError::NotClaimed {
                job: inner.job.to_string(),
                slot: inner.slot,
            });
        }
        txn.commit().await?;
        Ok(())
    }

    /// Ends the closure's use of the run (a later `begin` is refused) and tells whether it
    /// ever called `begin`.
    pub(crate) fn seal(&self) -> bool {
        self.inner.sealed.store(true, Ordering::SeqCst);
        self.inner.began.load(Ordering::SeqCst)
    }

    pub(crate) fn committed(&self) -> bool {
        self.inner.committed.load(Ordering::SeqCst)
    }
}

/// A transaction on the lease database whose first statement is `term`'s fence: the
/// scheduler's claims, a run's writes and its end. Begun whole: a caller dropped half way (its
/// term ended) never leaves the application's pool a connection inside a transaction.
/// `Ok(Err(_))` when the fence refused (the transaction rolled back).
pub(crate) async fn begin_fenced(
    store: &SeaOrmLeaseStore,
    term: &LeaderTerm,
) -> Result<Result<DatabaseTransaction, crate::error::FenceError>, sea_orm::DbErr> {
    let txn = store.begin_whole().await?;
    Ok(match term.fence(&txn).await {
        Ok(()) => Ok(txn),
        Err(e) => {
            let _ = txn.rollback().await;
            Err(e)
        }
    })
}

pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
