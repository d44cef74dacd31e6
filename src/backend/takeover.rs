//! Takeover past a stalled holder: a candidate whose acquire waits for the lease row's lock
//! ends the database session of a term that has lapsed by the database clock but still holds
//! the row locked inside a fenced transaction (its process stopped, cut off, or stuck in a long
//! statement).
//!
//! The fence locks the lease row so that no rival can take over while a fenced transaction is
//! open. A holder that stops inside one would hold the lock, and so the resource, for as long as
//! it is stopped (a partition: until the server notices the client is gone, hours with the
//! defaults). So an acquire that has waited [`WAIT_BEFORE_TAKEOVER`] asks the server, on
//! another connection, to end the lapsed term's sessions that block a wait on *this row* (its
//! own, or another candidate's queued on it), and asks again every [`TAKEOVER_EVERY`] while it
//! waits (20 ms after a look that ended one, for the next). A session is ended only when all of
//! these hold: it blocks a wait on exactly this table's row (found from the wait, never from a
//! name or a printed key alone), the row's term has lapsed by the database clock and the
//! session is that term's, and it has been stalled (idle inside its transaction, or in one
//! statement) as long as the acquire has waited, up to the first wait. Ending such a session is
//! safe: its term is over, its transaction rolls back (its commit fails), and nothing it would
//! have written may commit any more. Nothing else is ended: not another table's, schema's or
//! tenant's session, not a live term's.
//!
//! - **PostgreSQL**: `pg_blocking_pids` of the sessions queued on the row's tuple (this table's
//!   OID, this row's `ctid`), which must also hold the fence's marker of the lapsed term (see
//!   `postgres::takeover`); `pg_terminate_backend` ends it, in the same statement. That needs
//!   the same role as the holder, or `pg_signal_backend` and `pg_read_all_stats`.
//! - **MySQL/MariaDB**: `information_schema.INNODB_LOCK_WAITS` names the blocker of a wait on
//!   the row; `SHOW ENGINE INNODB STATUS` confirms it is still in that transaction (the lock
//!   tables may be a stale cache, see `mysql::takeover`); `KILL CONNECTION` ends it within
//!   100 ms of the look. That needs the `PROCESS` privilege, and `CONNECTION ADMIN` (or `SUPER`)
//!   for a holder connected as another user. MySQL 8, which has no `INNODB_LOCK_WAITS`, gets no
//!   takeover.
//!
//! Without the privileges (or when the blocker is not one the store may end) the acquire is
//! denied within its bound, the denial naming the lapsed holder and why
//! ([`Denial::stalled`](crate::store::Denial::stalled)); the refusal is warned about once per store,
//! and the resource is held until the server ends the session itself
//! (`idle_in_transaction_session_timeout`, `wait_timeout`, TCP keepalives).

use std::sync::Arc;
use std::time::Duration;

use super::driver::{Taken, Takeover};
use super::engine::Engine;
use super::errors::db_err_in;
use super::row::Row;
use crate::{error::StoreError, lease::LeaseOutcome};

use super::{MIN_WAIT_BEFORE_TAKEOVER, WAIT_BEFORE_TAKEOVER};

/// Sends the backend's acquire statement once (see [`acquiring`]).
pub(crate) type Ask<'a> = dyn Fn() -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<LeaseOutcome, StoreError>> + Send + 'a>,
    > + Send
    + Sync
    + 'a;

/// Reads the lease row as it stands, with a plain statement that waits for no lock (see
/// [`acquiring`]).
pub(crate) type Read<'a> = dyn Fn() -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Option<Row>, StoreError>> + Send + 'a>,
    > + Send
    + Sync
    + 'a;

/// How often it looks again while it still waits (a fifth of the lease when that is shorter).
pub(crate) const TAKEOVER_EVERY: Duration = Duration::from_millis(250);

/// The two waits for a lease of `lease`: each at most a fifth of it, and at least 10 ms.
fn takeover_waits(lease: Duration) -> (Duration, Duration) {
    let fifth = (lease / 5).max(MIN_WAIT_BEFORE_TAKEOVER);
    (WAIT_BEFORE_TAKEOVER.min(fifth), TAKEOVER_EVERY.min(fifth))
}

/// Says what a takeover did; `true` when the server refused it (no privilege, no lock tables):
/// not worth asking again soon. Any other failure (a timeout, a lost connection) is asked again.
/// A refusal is warned about once per store (and its derived stores).
fn report(
    engine: &Engine,
    resource: &str,
    ended: &Result<Taken, StoreError>,
    refused: bool,
) -> bool {
    let table = engine.cx.table();
    match ended {
        Ok(Taken {
            unseen: Some(privilege),
            ..
        }) => {
            if engine.takeovers.first_refusal() {
                tracing::warn!(
                    table,
                    resource,
                    privilege,
                    "a lapsed holder's session holds the lease row locked, but the server \
                     hides its state from this role, so the store cannot tell it is stalled \
                     and does not end it; acquires of it are denied with the reason until \
                     the server ends that session itself"
                );
            }
            true
        }
        Ok(Taken { ended: 0, .. }) => false,
        Ok(Taken { ended: n, .. }) => {
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
            if engine.takeovers.first_refusal() {
                tracing::warn!(
                    table,
                    resource,
                    %error,
                    "could not look for or end a lapsed holder's session; a holder \
                     stalled inside a fenced transaction then holds the lease until \
                     the server ends its session, and acquires of it are denied with the \
                     reason (PostgreSQL: the same role, or pg_signal_backend and \
                     pg_read_all_stats; MariaDB: the PROCESS privilege, and \
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

/// Ends the lapsed term's sessions that block a wait on `resource`'s row, stalled at least
/// `waited`; what it did.
async fn end_lapsed_holders(
    engine: &Engine,
    resource: &str,
    waited: Duration,
) -> Result<Taken, StoreError> {
    engine
        .backend
        .end_lapsed_holders(&engine.cx, resource, waited)
        .await
}

/// What a takeover did, said; `true` when the server refused it (the refusal is kept, for the
/// denial that names it).
fn told(engine: &Engine, resource: &str, ended: Result<Taken, StoreError>) -> bool {
    let refused = matches!(&ended, Err(e) if refused(engine, e));
    let given_up = report(engine, resource, &ended, refused);
    match (&ended, refused) {
        (Err(error), true) => engine.takeovers.refuse(match db_err_in(error) {
            // The server's own words (which privilege), not only the store's wrapper.
            Some(db) => db.to_string(),
            None => error.to_string(),
        }),
        (
            Ok(Taken {
                unseen: Some(privilege),
                ..
            }),
            _,
        ) => engine.takeovers.unseen(format!(
            "the session's state is hidden; it needs {privilege}"
        )),
        _ => {}
    }
    given_up
}

/// Marks a dropped acquire's takeover finished when its task ends, however it ends (the
/// runtime shutting down drops it unfinished).
struct InFlight {
    engine: Arc<Engine>,
    resource: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.engine.takeovers.finish(&self.resource);
    }
}

/// An acquire dropped by its caller before it was answered (a shard set's round bounds each
/// of its statements by its interval, which can be shorter than the takeover's first wait)
/// leaves its statement waiting on the server for the row lock. A lapsed holder stalled inside
/// a fenced transaction would then hold the resource for as long as it is stalled, whoever
/// asks: so the drop asks the server once, from a task of its own, to end the session that
/// blocks that statement's wait, as the acquire would have had it waited on. One such task per
/// store at a time (see [`Gate`](super::gate::Gate)), each bounded by `limit`.
struct TakeoverOnDrop {
    /// The store and resource, until the acquire was answered.
    armed: Option<(Arc<Engine>, String)>,
    /// When the statement now out was sent.
    sent: tokio::time::Instant,
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
        let (limit, waited) = (self.limit, self.sent.elapsed());
        // Made before the task, so that a task dropped before it first runs (a runtime
        // shutting down) still marks the takeover finished.
        let guard = InFlight { engine, resource };
        runtime.spawn(async move {
            let (engine, resource) = (&*guard.engine, guard.resource.as_str());
            // Boxed: the timeout around it is then one small poll, not a copy of the takeover.
            let ending = Box::pin(end_lapsed_holders(engine, resource, waited));
            match tokio::time::timeout(limit, ending).await {
                Ok(ended) => {
                    told(engine, resource, ended);
                }
                Err(_) => {
                    tracing::debug!(
                        table = %engine.cx.table(),
                        resource,
                        "takeover after a dropped acquire got no answer in time"
                    );
                }
            }
            drop(guard);
        });
    }
}

/// Runs the backend's acquire of `resource` for `candidate` (`ask` sends it; `read` reads the
/// row as it stands) until it is answered. Its
/// statement waits for the row lock at most a bounded time (PostgreSQL: twice the takeover's
/// first wait, see `postgres::statements::bounded_upsert`; MariaDB: a second, its own
/// `innodb_lock_wait_timeout`, whole seconds), and while it waits, after `first` and then
/// every `every`, the backend ends the session that blocks that wait if it is a lapsed term's,
/// stalled (see the backends' `takeover`). When the wait runs out, the row was held locked
/// that long by another transaction:
///
/// - a live holder's fenced one: a denial that names it;
/// - this candidate's own (a renew behind its own fenced transaction): asked again;
/// - a session the takeover ended just as the wait ran out: asked again at once;
/// - a lapsed term's that the store could not end (refused, or not one it may end): a denial
///   that names the lapsed holder and says why ([`Denial::stalled`](crate::store::Denial::stalled)).
///
/// So every call is answered within about two statement waits, whatever the stall, and a
/// caller that stops waiting leaves no statement behind for long that could grant it a lease
/// later; the drop still asks for one takeover ([`TakeoverOnDrop`]).
pub(crate) async fn acquiring(
    engine: &Arc<Engine>,
    resource: &str,
    candidate: &str,
    lease: Duration,
    ask: &Ask<'_>,
    read: &Read<'_>,
) -> Result<LeaseOutcome, StoreError> {
    let (first, every) = takeover_waits(lease);
    let mut on_drop = TakeoverOnDrop {
        armed: Some((Arc::clone(engine), resource.to_owned())),
        sent: tokio::time::Instant::now(),
        limit: (lease / 2).clamp(Duration::from_millis(100), Duration::from_secs(1)),
    };
    let concurrent = engine.backend.takeover() == Takeover::WhileWaiting;
    let out = loop {
        let started = tokio::time::Instant::now();
        on_drop.sent = started;
        let attempt = ask();
        let (answer, ended) = if concurrent {
            tokio::pin!(attempt);
            waiting(engine, resource, first, every, started, &mut attempt).await
        } else {
            (attempt.await, 0)
        };
        match answer {
            Err(err) if lock_wait_timed_out(engine, &err) => {}
            out => break out,
        }
        if ended > 0 {
            continue; // its transaction rolled back: the row is free now
        }
        match read().await {
            Ok(Some(row)) => {
                let record = row.record(resource);
                if record.live && record.holder == candidate {
                    // This candidate's own renew behind its own fenced transaction: asked
                    // again (at least the first wait between two statements; a short lease's
                    // lock wait is short too).
                    tokio::time::sleep_until(started + first).await;
                    continue;
                }
                let stalled = (!record.live).then(|| engine.takeovers.why_not_ended());
                // Never naming the candidate itself (it would then follow itself).
                let holder = (record.holder != candidate).then_some(record.holder);
                break Ok(LeaseOutcome::Denied(crate::lease::Denial {
                    resource: resource.to_owned(),
                    holder,
                    token: Some(record.token),
                    remaining: record.remaining,
                    expires_at: record.expires_at,
                    payload: record.payload,
                    stalled,
                }));
            }
            Ok(None) => tokio::time::sleep_until(started + first).await,
            Err(err) => break Err(err),
        }
    };
    on_drop.armed = None; // answered
    out
}

/// Awaits `acquire`, sent at `sent`; after `first` and then every `every`, ends the session
/// that blocks its wait on `resource`'s row if it is a lapsed term's. The answer, and how many
/// sessions were ended while it waited.
async fn waiting<T, F>(
    engine: &Engine,
    resource: &str,
    first: Duration,
    every: Duration,
    sent: tokio::time::Instant,
    acquire: &mut std::pin::Pin<&mut F>,
) -> (Result<T, StoreError>, u64)
where
    F: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut wait = first;
    let mut ended_here = 0;
    loop {
        tokio::select! {
            biased;
            out = &mut *acquire => return (out, ended_here),
            () = tokio::time::sleep(wait) => {}
        }
        if engine.takeovers.refused() {
            // Refused a moment ago: not again in this call.
            return (acquire.await, ended_here);
        }
        // Stalled at least as long as the acquire has waited, and at least the first wait (a
        // fenced transaction queued behind the one just ended took the row mid-wait).
        let idle = sent.elapsed().min(first);
        let takeover = end_lapsed_holders(engine, resource, idle);
        tokio::pin!(takeover);
        let (ended, answered) = tokio::select! {
            biased;
            out = &mut *acquire => {
                // The wait ran out (or the row came free) while the takeover was out: its
                // answer still counts (a session it ended is why the row is free now), so it
                // gets the time of another look to finish.
                let ended = tokio::time::timeout(every, &mut takeover).await;
                match ended {
                    Ok(ended) => (ended, Some(out)),
                    Err(_) => return (out, ended_here),
                }
            }
            ended = &mut takeover => (ended, None),
        };
        let some = matches!(&ended, Ok(taken) if taken.ended > 0);
        if let Ok(taken) = &ended {
            ended_here += taken.ended;
        }
        let given_up = told(engine, resource, ended);
        if let Some(out) = answered {
            return (out, ended_here);
        }
        if given_up {
            // Not again in this call: a refusal would only repeat.
            return (acquire.await, ended_here);
        }
        // A session ended: the next (another of the lapsed term's fenced transactions that
        // held the row beside it, or queued behind it) is looked for soon, within this wait.
        wait = if some { AFTER_AN_END.min(every) } else { every };
    }
}

/// How soon after a look that ended a session the next look goes out, while the acquire
/// still waits.
const AFTER_AN_END: Duration = Duration::from_millis(20);

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
