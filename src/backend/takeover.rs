//! Takeover past a stalled holder: a candidate whose acquire waits for the lease row's lock
//! ends the database session of a term that has lapsed by the database clock but still holds
//! the row locked inside a fenced transaction (its process stopped, cut off, or stuck in a long
//! statement).
//!
//! The fence locks the lease row so that no rival can take over while a fenced transaction is
//! open. A holder that stops inside one would hold the lock, and so the resource, for as long as
//! it is stopped (a partition: until the server notices the client is gone, hours with the
//! defaults). So an acquire that has waited [`WAIT_BEFORE_TAKEOVER`] asks the server, on
//! another connection of the pool, to end every session that holds the row for a term whose
//! lease has lapsed, and asks again every [`TAKEOVER_EVERY`] while it waits. Ending such a
//! session is always safe: its term is over by the database clock, its transaction rolls back
//! (its commit fails), and nothing it would have written may commit any more. PostgreSQL
//! targets only sessions marked by a fence of exactly the lapsed term; MariaDB, the
//! transaction that holds the lapsed row against a waiting statement, unless it is running a
//! lease statement or a commit.
//!
//! - **PostgreSQL**: the fence also takes a shared transaction-level advisory lock keyed by a
//!   64-bit hash of (table, resource, token), which `pg_locks` shows with its session;
//!   `pg_terminate_backend` ends the sessions that hold the key of the lapsed row's term. That
//!   needs the same role as the holder, or membership of `pg_signal_backend`.
//! - **MySQL/MariaDB**: the fence locks the row `FOR UPDATE`, so its transaction has an id;
//!   `information_schema.INNODB_LOCK_WAITS` names the transaction that blocks a wait on the
//!   lapsed row, and `KILL CONNECTION` ends it. That needs the `PROCESS` privilege, and
//!   `CONNECTION ADMIN` (or `SUPER`) for a holder connected as another user. MySQL 8, which
//!   has no `INNODB_LOCK_WAITS`, gets no takeover (a warning says so).
//!
//! Without the privileges a warning says what is missing, and the takeover waits for the
//! server to end the session itself (`idle_in_transaction_session_timeout`, `wait_timeout`,
//! TCP keepalives).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::driver::Takeover;
use super::engine::Engine;
use super::errors::db_err_in;
use super::statements::Write;
use crate::{LeaseOutcome, StoreError};

use super::{MIN_WAIT_BEFORE_TAKEOVER, WAIT_BEFORE_TAKEOVER};

/// How often it looks again while it still waits (a fifth of the lease when that is shorter).
pub(crate) const TAKEOVER_EVERY: Duration = Duration::from_millis(250);

/// The two waits for a lease of `lease`: each at most a fifth of it, and at least 10 ms.
fn takeover_waits(lease: Duration) -> (Duration, Duration) {
    let fifth = (lease / 5).max(MIN_WAIT_BEFORE_TAKEOVER);
    (WAIT_BEFORE_TAKEOVER.min(fifth), TAKEOVER_EVERY.min(fifth))
}

/// Warns once per process that takeover cannot end a stalled holder's session.
static REFUSED: AtomicBool = AtomicBool::new(false);

/// Says what a takeover did; `true` when the server refused it (no privilege, no lock tables):
/// not worth asking again soon. Any other failure (a timeout, a lost connection) is asked again.
fn report(table: &str, resource: &str, ended: Result<u64, StoreError>, refused: bool) -> bool {
    match ended {
        Ok(0) => false,
        Ok(n) => {
            tracing::warn!(
                table,
                resource,
                sessions = n,
                "ended the database session of a lapsed term that held the lease row \
                 locked (a holder stopped, cut off or stuck inside a fenced transaction); \
                 its transaction rolls back"
            );
            false
        }
        Err(error) if refused => {
            if !REFUSED.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    table,
                    resource,
                    %error,
                    "could not look for or end a lapsed holder's session; a holder \
                     stalled inside a fenced transaction then holds the lease until \
                     the server ends its session (PostgreSQL: the same role or \
                     pg_signal_backend; MariaDB: the PROCESS privilege, and \
                     CONNECTION ADMIN for other users' sessions)"
                );
            } else {
                tracing::debug!(table, resource, %error, "takeover refused");
            }
            true
        }
        Err(error) => {
            tracing::debug!(table, resource, %error, "takeover failed; asking again later");
            false
        }
    }
}

/// Whether a takeover failed because the server will not do it for this role (as opposed to
/// a timeout or a lost connection).
fn refused(engine: &Engine, err: &StoreError) -> bool {
    db_err_in(err).is_some_and(|e| engine.backend.takeover_refused(e))
}

/// Whether the statement behind `err` gave up waiting for a lock.
fn lock_wait_timed_out(engine: &Engine, err: &StoreError) -> bool {
    db_err_in(err).is_some_and(|e| engine.backend.lock_wait_ran_out(e))
}

/// Ends the sessions that hold `resource`'s row for a lapsed term; how many.
async fn end_lapsed_holders(engine: &Engine, resource: &str) -> Result<u64, StoreError> {
    engine
        .backend
        .end_lapsed_holders(&engine.cx, resource)
        .await
}

/// What a takeover did, said; `true` when the server refused it.
fn told(engine: &Engine, resource: &str, ended: Result<u64, StoreError>) -> bool {
    let refused = matches!(&ended, Err(e) if refused(engine, e));
    report(engine.cx.table(), resource, ended, refused)
}

/// Marks a dropped acquire's takeover finished when its task ends, however it ends (the
/// runtime shutting down drops it unfinished).
struct InFlight {
    engine: Arc<Engine>,
    resource: String,
    failed: bool,
}

impl InFlight {
    /// Whether the server refused it (read when the marker goes).
    fn failed(&mut self, failed: bool) {
        self.failed = failed;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.engine.takeovers.finish(&self.resource, self.failed);
    }
}

/// An acquire dropped by its caller before it was answered (a shard set's round bounds each
/// of its statements by its interval, which can be shorter than the takeover's first wait)
/// leaves its statement waiting on the server for the row lock. A lapsed holder stalled inside
/// a fenced transaction would then hold the resource for as long as it is stalled, whoever
/// asks: so the drop asks the server once, from a task of its own, to end such a holder's
/// session, as the acquire would have had it waited on. One such task per store at a time
/// (see [`Gate`](super::gate::Gate)), each bounded by `limit`.
struct TakeoverOnDrop {
    /// The store and resource, until the acquire was answered.
    armed: Option<(Arc<Engine>, String)>,
    /// How long the task may take.
    limit: Duration,
}

impl Drop for TakeoverOnDrop {
    fn drop(&mut self) {
        let Some((engine, resource)) = self.armed.take() else {
            return;
        };
        // Outside a runtime there is nobody to ask with (a runtime shutting down drops the
        // task unstarted).
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if !engine.takeovers.start(&resource) {
            return; // one is in flight, or they fail for now
        }
        let limit = self.limit;
        // Made before the task, so that a task dropped before it first runs (a runtime
        // shutting down) still marks the takeover finished.
        let mut guard = InFlight {
            engine,
            resource,
            failed: false,
        };
        runtime.spawn(async move {
            let (engine, resource) = (&*guard.engine, guard.resource.as_str());
            let failed =
                match tokio::time::timeout(limit, end_lapsed_holders(engine, resource)).await {
                    Ok(ended) => told(engine, resource, ended),
                    Err(_) => {
                        tracing::debug!(
                            table = %engine.cx.table(),
                            resource,
                            "takeover after a dropped acquire got no answer in time"
                        );
                        false
                    }
                };
            guard.failed(failed);
        });
    }
}

/// Runs the backend's acquire of `resource` for `candidate` until it is answered. On
/// PostgreSQL its statement (the bounded upsert, see `postgres::statements::bounded_upsert`)
/// waits for each lock at most the takeover's first wait, then fails; the row was then held
/// locked that long by another transaction: a lapsed term's stalled one (its session is ended
/// and the acquire asked again at once), a live holder's fenced one (a denial that names it),
/// or this candidate's own (asked again at once). A statement waits on the server at most two
/// such waits, whatever the stall, so a caller that stops waiting leaves no statement behind
/// for long that could grant it a lease later; the drop still asks for one takeover
/// ([`TakeoverOnDrop`]).
///
/// On MariaDB the upsert waits at most a second (its own `innodb_lock_wait_timeout`, whole
/// seconds; not MySQL 8's transaction form, which waits the server's), and the takeover runs
/// while it waits (after `first`, then every `every`); then the same.
pub(crate) async fn acquiring(
    engine: &Arc<Engine>,
    resource: &str,
    candidate: &str,
    lease: Duration,
    millis: i64,
    write: Write<'_>,
) -> Result<LeaseOutcome, StoreError> {
    let (first, every) = takeover_waits(lease);
    let mut on_drop = TakeoverOnDrop {
        armed: Some((Arc::clone(engine), resource.to_owned())),
        limit: (lease / 2).clamp(Duration::from_millis(100), Duration::from_secs(1)),
    };
    // MariaDB finds a blocker only while a statement waits on it: the takeover runs then.
    let concurrent = engine.backend.takeover() == Takeover::WhileWaiting;
    let out = loop {
        let started = tokio::time::Instant::now();
        let attempt = engine
            .backend
            .acquire_or_renew(&engine.cx, resource, candidate, millis, write);
        let answer = if concurrent {
            tokio::pin!(attempt);
            waiting(engine, resource, first, every, &mut attempt).await
        } else {
            attempt.await
        };
        match answer {
            Err(err) if lock_wait_timed_out(engine, &err) => {}
            out => break out,
        }
        if !concurrent && !engine.takeovers.refused() {
            let ended = end_lapsed_holders(engine, resource).await;
            let some = matches!(ended, Ok(n) if n > 0);
            if told(engine, resource, ended) {
                engine.takeovers.refuse();
            }
            if some {
                continue; // its transaction rolled back: the row is free now
            }
        }
        // Nobody lapsed to end: a live holder's transaction, or this candidate's own (a
        // renew behind its own fenced transaction), or a lock no takeover ends. Asked again
        // at once: the statement's own lock wait paces the loop, and a renew is queued for
        // the row nearly all the time, as it would be if it waited on.
        match engine.read_row(resource).await {
            Ok(Some(row)) => {
                let record = row.record(resource);
                if record.live && record.holder != candidate {
                    break Ok(LeaseOutcome::Denied(crate::Denial {
                        resource: resource.to_owned(),
                        holder: Some(record.holder),
                        token: Some(record.token),
                        remaining: record.remaining,
                        expires_at: record.expires_at,
                        payload: record.payload,
                    }));
                }
                // At least the first wait between two statements (a short lease's lock wait
                // is short too).
                tokio::time::sleep_until(started + first).await;
            }
            Ok(None) => tokio::time::sleep_until(started + first).await,
            Err(err) => break Err(err),
        }
    };
    on_drop.armed = None; // answered
    out
}

/// Awaits `acquire`; after `first` and then every `every`, ends the sessions of lapsed terms
/// that hold `resource`'s row.
async fn waiting<T, F>(
    engine: &Engine,
    resource: &str,
    first: Duration,
    every: Duration,
    acquire: &mut std::pin::Pin<&mut F>,
) -> Result<T, StoreError>
where
    F: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut wait = first;
    loop {
        tokio::select! {
            biased;
            out = &mut *acquire => return out,
            () = tokio::time::sleep(wait) => {}
        }
        if engine.takeovers.refused() {
            return acquire.await; // refused a moment ago: not again in this call
        }
        let takeover = end_lapsed_holders(engine, resource);
        tokio::pin!(takeover);
        let given_up = tokio::select! {
            biased;
            out = &mut *acquire => return out,
            ended = &mut takeover => told(engine, resource, ended),
        };
        if given_up {
            engine.takeovers.refuse();
            // Not again in this call: a refusal would only repeat.
            return acquire.await;
        }
        wait = every;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_leases_wait_a_fifth_of_the_lease() {
        let ms = Duration::from_millis;
        assert_eq!(takeover_waits(Duration::from_secs(15)), (ms(200), ms(250)));
        assert_eq!(takeover_waits(ms(1_000)), (ms(200), ms(200)));
        assert_eq!(takeover_waits(ms(500)), (ms(100), ms(100)));
        assert_eq!(takeover_waits(ms(20)), (ms(10), ms(10)));
    }

    #[test]
    fn a_database_error_is_found_through_every_error_wrapper() {
        // The takeover's refusal and lock-wait checks look at the database error inside.
        let custom = || sea_orm::DbErr::Custom("permission denied".into());
        for err in [
            StoreError::Database(custom().into()),
            StoreError::MissingTable {
                table: "t".into(),
                source: custom().into(),
            },
            StoreError::Conflict {
                source: custom().into(),
            },
        ] {
            assert!(
                matches!(db_err_in(&err), Some(sea_orm::DbErr::Custom(_))),
                "{err}"
            );
        }
    }
}
