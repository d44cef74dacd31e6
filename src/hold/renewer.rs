//! The one renewer of a store: every hold of the process on it (electors' terms that renew
//! together, locks' guards and permits, shard sets' terms) is renewed by a
//! [`renew_all`](crate::LeaseStore::renew_all) that takes every hold waiting with the same
//! lease duration and renew interval, one statement per round (per [`MAX_PER_STATEMENT`]).
//! A [`SeaOrmLeaseStore`](crate::SeaOrmLeaseStore) has one renewer, shared by its clones and by
//! every primitive built on it; a primitive on another store has one of its own.
//!
//! Right after each renew, a holder enters its next one: its lease, when it is due (its renew
//! time, or its deadline if that is sooner) and its deadline. A batch leaves when its first
//! entry is due and takes every entry waiting then, so a leader may renew early, never late;
//! after one round the leaders of a process renew in step, one statement per round (per
//! [`MAX_PER_STATEMENT`] leases). Each leader's answer counts from the instant its statement
//! was sent (taken before it went out), as its own renew's would, so its deadline rule is the
//! same. A lease the batch reports lost, a lease given twice, and every lease of a batch that
//! failed or did not answer are asked about by their elector on its own, at once: that answer
//! says who holds the lease now, exactly as a renew of its own would have. A leader that stops
//! before its batch leaves withdraws its entry; once the batch left, it waits for the answer
//! (a renew sent is never left unread, so a release that follows finds the last write).

use crate::mutex::lock;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

use crate::hold::timing::later;
use crate::{error::StoreError, lease::Lease, lease::Renewals, store::LeaseStore};

mod send;
use send::{send_batches, Running};

/// The most leases one statement renews; a larger batch sends one statement per this many.
pub(crate) const MAX_PER_STATEMENT: usize = 1_000;

/// How long past its due time a holder waits for its batch to leave before it renews alone.
pub(crate) const DEPARTURE_SLACK: Duration = Duration::from_millis(100);

/// The renewer of one store (see the module's notes). Cheap to clone; clones share the batches.
#[derive(Debug, Clone, Default)]
pub(crate) struct Renewer {
    batches: Arc<Batches>,
}

/// The batches of one store, by lease duration and renew interval (a holder that renews often
/// would otherwise pull the others along).
#[derive(Debug, Default)]
struct Batches {
    batches: Mutex<HashMap<(Duration, Duration), Arc<Batch>>>,
    /// Set when the store cannot renew in batches (it refused one for a reason retrying does
    /// not mend): every leader renews on its own from then on.
    off: AtomicBool,
    /// After a failed batch, leaders renew on their own until then (a server too old for the
    /// batch statement, say, is not asked twice each round); doubling per failure in a row.
    paused: Mutex<Paused>,
}

#[derive(Debug, Default)]
struct Paused {
    until: Option<Instant>,
    failures: u32,
    /// The send instant of the batch whose failure counted last: one failure per batch, however
    /// many of its statements failed.
    counted: Option<Instant>,
}

/// The first pause after a failed batch, and the longest.
const FIRST_PAUSE: Duration = Duration::from_secs(1);
const LONGEST_PAUSE: Duration = Duration::from_secs(300);

/// The entries waiting for one lease duration.
#[derive(Debug)]
struct Batch {
    lease: Duration,
    pending: Mutex<Pending>,
    /// A new entry came (perhaps due sooner than the batch meant to leave).
    entered: Notify,
}

#[derive(Debug, Default)]
struct Pending {
    entries: Vec<Entry>,
    next_id: u64,
    /// Whether a task sends this batch (it ends when no entry waits).
    running: bool,
    /// When the task means to leave next: a new entry due sooner wakes it.
    leaves_at: Option<Instant>,
}

#[derive(Debug)]
struct Entry {
    id: u64,
    lease: Lease,
    due: Instant,
    deadline: Instant,
    /// A leader, whose own renew is one statement: it renews on its own when nothing else of
    /// the store goes with it (see `send`).
    leader: bool,
    departed: oneshot::Sender<Departure>,
}

/// A batch left with an entry: when its statement was sent, and the answer to come.
#[derive(Debug)]
pub(crate) struct Departure {
    /// Taken before the statement went out.
    pub(crate) sent: Instant,
    answer: oneshot::Receiver<Reply>,
}

/// What a batch said about one lease.
#[derive(Debug)]
pub(crate) enum Reply {
    /// Renewed: the lease as the statement left it.
    Renewed(Lease),
    /// The statement committed without renewing it: no longer this term's (revoked, taken
    /// over, expired).
    Lost,
    /// The statement failed with an error that trying again may mend (described here).
    Failed(String),
    /// The statement committed without an answer for it: its row was held locked by another
    /// transaction (its own fenced transaction, say) for longer than its renew waited. No news:
    /// its term goes on to its deadline.
    Busy,
    /// The store refused the statement for good (see
    /// [`StoreError::is_permanent`](crate::StoreError::is_permanent)): an elector asks on its
    /// own (its own call says the same), other holds end.
    Refused(Arc<StoreError>),
    /// Left out (given twice, past its deadline), or the batch went away: the holder asks on
    /// its own.
    Alone,
}

impl Departure {
    /// What the batch said about this entry's lease.
    pub(crate) async fn reply(self) -> Reply {
        self.answer.await.unwrap_or(Reply::Alone)
    }
}

/// A leader's place in the next batch; dropped before the batch left, it withdraws.
#[derive(Debug)]
pub(crate) struct Ticket {
    batch: Arc<Batch>,
    id: u64,
    departed: oneshot::Receiver<Departure>,
}

impl Ticket {
    /// Waits until the batch leaves with this entry; `None` if it left without it (the elector
    /// then asks on its own).
    pub(crate) async fn departed(&mut self) -> Option<Departure> {
        (&mut self.departed).await.ok()
    }

    /// Takes the entry back if the batch has not left with it yet: whether it did.
    pub(crate) fn withdraw(&self) -> bool {
        let mut pending = lock(&self.batch.pending);
        let before = pending.entries.len();
        pending.entries.retain(|e| e.id != self.id);
        pending.entries.len() < before
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.withdraw();
    }
}

impl Renewer {
    /// The renewer `store` shares with every primitive built on it, when it is a
    /// [`SeaOrmLeaseStore`](crate::SeaOrmLeaseStore) itself (not a wrapper, whose renews must
    /// all go through it); a renewer of its own otherwise.
    pub(crate) fn of(store: &dyn std::any::Any) -> Self {
        sea_orm_store(store)
            .and_then(crate::backend::SeaOrmLeaseStore::renewer)
            .unwrap_or_default()
    }

    /// The shared renewer of `store` (see [`Renewer::of`]) where electors renew together: a
    /// backend whose batch is one statement.
    pub(crate) fn for_electors(store: &dyn std::any::Any) -> Option<Self> {
        sea_orm_store(store)
            .filter(|s| s.batches_renewals())
            .and_then(crate::backend::SeaOrmLeaseStore::renewer)
    }

    /// Enters `lease` (held for `duration` per renew) in the next batch, sent on `store`, due
    /// at `due`, answered no later than `deadline`. `None` when the store renews lease by lease
    /// for now (a batch failed) or there is no tokio runtime. A `leader` (an elector's term,
    /// whose own renew is one statement) is answered [`Reply::Alone`] when the batch would
    /// leave with it alone, and renews with its own statement (a batch of one whose row a
    /// fenced transaction holds costs three).
    pub(crate) fn enter(
        &self,
        store: &Arc<dyn LeaseStore>,
        lease: Lease,
        (duration, interval): (Duration, Duration),
        due: Instant,
        deadline: Instant,
        leader: bool,
    ) -> Option<Ticket> {
        let batches = &self.batches;
        if batches.off.load(Ordering::Relaxed)
            || lock(&batches.paused)
                .until
                .is_some_and(|until| crate::clock::now() < until)
        {
            return None;
        }
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let batch = Arc::clone(
            lock(&batches.batches)
                .entry((duration, interval))
                .or_insert_with(|| {
                    Arc::new(Batch {
                        lease: duration,
                        pending: Mutex::default(),
                        entered: Notify::new(),
                    })
                }),
        );
        let (tx, rx) = oneshot::channel();
        let (id, start) = {
            let mut pending = lock(&batch.pending);
            let id = pending.next_id;
            pending.next_id = pending.next_id.wrapping_add(1);
            pending.entries.push(Entry {
                id,
                lease,
                due,
                deadline,
                leader,
                departed: tx,
            });
            let start = !pending.running;
            pending.running = true;
            let sooner = pending.leaves_at.is_none_or(|at| due < at);
            (
                id,
                if start {
                    Some(true)
                } else {
                    sooner.then_some(false)
                },
            )
        };
        match start {
            // The guard goes with the task, so a task its runtime never runs still clears the
            // flag (it is dropped with the task).
            Some(true) => {
                let running = Running {
                    batch: Arc::clone(&batch),
                    ended: false,
                };
                runtime.spawn(send_batches(running, self.clone(), store.clone()));
            }
            Some(false) => batch.entered.notify_one(),
            None => {}
        }
        Some(Ticket {
            batch,
            id,
            departed: rx,
        })
    }

    /// Renews `leases` (each held for `duration` per renew, renewed every `interval`) now, in
    /// one batch with whatever else of this store waits with the same timing; given up at
    /// `deadline`. A lease the batch left out (given twice, say) or that could not go out in a
    /// batch is renewed with the others of that kind by one `renew_all` of its own. An error
    /// when the store refused the batch for good, or nothing was answered and the batch
    /// failed; `None` when nothing was answered by `deadline`.
    pub(crate) async fn renew_now(
        &self,
        store: &Arc<dyn LeaseStore>,
        leases: &[Lease],
        timing: (Duration, Duration),
        deadline: Instant,
    ) -> Result<Option<Renewals>, Arc<StoreError>> {
        let now = crate::clock::now();
        let mut out = Renewals::default();
        let mut alone = Vec::new();
        let mut tickets = Vec::with_capacity(leases.len());
        for lease in leases {
            match self.enter(store, lease.clone(), timing, now, deadline, false) {
                Some(ticket) => tickets.push((lease, ticket)),
                None => alone.push(lease.clone()),
            }
        }
        // The batch leaves at once (its entries are due now); one held up (its task on a
        // runtime that is not driven, say) is waited for a moment, then these leases renew
        // alone and batches pause, as after a failed batch.
        let patience = later(now, DEPARTURE_SLACK).min(deadline);
        let mut failed = None;
        let mut refused = None;
        let mut waiting = tickets.into_iter();
        let answered = crate::clock::timeout_at(deadline, async {
            for (lease, mut ticket) in waiting.by_ref() {
                let departed = match crate::clock::timeout_at(patience, ticket.departed()).await {
                    Ok(departed) => departed,
                    Err(_) if ticket.withdraw() => {
                        self.batches.held_up(now);
                        None
                    }
                    // It left meanwhile.
                    Err(_) => ticket.departed().await,
                };
                let reply = match departed {
                    Some(departure) => departure.reply().await,
                    None => Reply::Alone,
                };
                match reply {
                    Reply::Renewed(renewed) => out.renewed.push(renewed),
                    Reply::Lost => out.lost.push(lease.clone()),
                    Reply::Busy => out.unanswered.push(lease.clone()),
                    Reply::Failed(what) => {
                        failed = Some(what);
                        out.unanswered.push(lease.clone());
                    }
                    Reply::Refused(err) => refused = Some(err),
                    Reply::Alone => alone.push(lease.clone()),
                }
            }
        })
        .await;
        if answered.is_err() {
            // Not answered by the deadline: the rest are no news.
            out.unanswered
                .extend(waiting.map(|(lease, _)| lease.clone()));
        }
        if let Some(err) = refused {
            return Err(err);
        }
        // What tells that the store answered: a lease it renewed or found lost. (A lease left
        // unanswered may stand for an error a store put there.)
        let heard = |out: &Renewals| !out.renewed.is_empty() || !out.lost.is_empty();
        if let Some(what) = failed {
            if !heard(&out) && alone.is_empty() {
                return Err(Arc::new(StoreError::Database(
                    sea_orm::DbErr::Custom(what).into(),
                )));
            }
        }
        // Past the deadline nothing is sent: a renew nobody reads would keep a lease live that
        // nobody holds.
        if !alone.is_empty() && crate::clock::now() < deadline {
            let renew = crate::store::renew_by(deadline, store.renew_all(&alone, timing.0));
            match renew.await {
                Ok(Ok(renewals)) => {
                    out.renewed.extend(renewals.renewed);
                    out.lost.extend(renewals.lost);
                    out.unanswered.extend(renewals.unanswered);
                }
                Ok(Err(err)) => {
                    if !heard(&out) || err.is_permanent() {
                        return Err(Arc::new(err));
                    }
                    out.unanswered.extend(alone);
                }
                Err(_) => out.unanswered.extend(alone),
            }
        } else {
            out.unanswered.extend(alone);
        }
        Ok(heard(&out).then_some(out))
    }
}

impl Batches {
    /// A batch entered at `entered` did not leave in time: holders renew on their own for a
    /// while, as after a failed batch.
    fn held_up(&self, entered: Instant) {
        self.failed(
            &StoreError::Database(
                sea_orm::DbErr::Custom("a batch did not leave in time".into()).into(),
            ),
            entered,
        );
    }

    /// A batch failed with `error`: leaders renew on their own for a while, or for good if
    /// retrying cannot help (see [`StoreError::is_permanent`](crate::StoreError::is_permanent)).
    fn failed(&self, error: &StoreError, sent: Instant) {
        if error.is_permanent() {
            if !self.off.swap(true, Ordering::Relaxed) {
                tracing::info!(%error, "leaders renew lease by lease from now on: the store refused a batch");
            }
            return;
        }
        let mut paused = lock(&self.paused);
        if paused.counted == Some(sent) {
            return;
        }
        paused.counted = Some(sent);
        let pause = FIRST_PAUSE
            .saturating_mul(1 << paused.failures.min(16))
            .min(LONGEST_PAUSE);
        paused.failures = paused.failures.saturating_add(1);
        paused.until = crate::clock::now().checked_add(pause);
        tracing::debug!(%error, ?pause, "a batched renew failed; leaders renew on their own meanwhile");
    }

    /// A batch was answered: the pauses start over.
    fn answered(&self) {
        let mut paused = lock(&self.paused);
        if paused.failures > 0
            && paused
                .until
                .is_none_or(|until| crate::clock::now() >= until)
        {
            *paused = Paused::default();
        }
    }
}

/// `store` as a `SeaOrmLeaseStore`, when it is one (or an `Arc` of one).
fn sea_orm_store(store: &dyn std::any::Any) -> Option<&crate::backend::SeaOrmLeaseStore> {
    store
        .downcast_ref::<crate::backend::SeaOrmLeaseStore>()
        .or_else(|| {
            store
                .downcast_ref::<Arc<crate::backend::SeaOrmLeaseStore>>()
                .map(|s| &**s)
        })
}

#[cfg(test)]
mod tests;
