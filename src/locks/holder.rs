//! What one [`Locks`](super::Locks) holds: the lock policy on the hold core. Its guards and
//! permits are kept by a `hold::keeper::Keeper` (renewed through the store's renewer, trusted
//! until the local deadline every hold has, ended when that passes without a renew); here are
//! the candidate ids, the acquire attempts and the releases.
//!
//! Every hold has a candidate id of its own (`owner/<random>-<n>`, never used for anything
//! else), so it is released by that id: whatever write of the hold the store has last (a renew
//! whose answer never came included) is the one released, and no other holder's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::hold::keeper::{Keeper, OnEnd};
use crate::hold::{LeaderTerm, LossReason};
use crate::mutex::lock;
use crate::{error::StoreError, lease::Denial, lease::LeaseOutcome, store::LeaseStore};

/// The options of one [`Locks`](super::Locks), validated.
#[derive(Debug, Clone)]
pub(super) struct Config {
    pub owner: Arc<str>,
    /// The lease, the renew interval and the step-down margin of every hold.
    pub timing: crate::hold::timing::Timing,
    pub retry_interval: Duration,
    /// Written into every hold's lease by its grant.
    pub payload: Option<Arc<str>>,
}

/// What one acquire attempt came to. `Denied(None)`: not granted, and whatever the attempt
/// may have been granted is being released under its candidate id, which the caller must not
/// use again.
pub(super) enum Attempt {
    Granted(LeaderTerm),
    Denied(Option<Denial>),
}

pub(super) struct Holder {
    pub store: Arc<dyn LeaseStore>,
    pub fence: Option<crate::backend::SeaOrmLeaseStore>,
    pub config: Config,
    /// Every guard's and permit's lease, renewed through the store's renewer; one that ends
    /// there (its deadline passed, or the store refused it for good) is released by its
    /// candidate id.
    keeper: Arc<Keeper>,
    /// Locks (and semaphores) by name that this process let go of after waiting for them, and
    /// until when its own next acquire of them stays out of the way (see [`Self::yielded`]).
    yields: Mutex<std::collections::HashMap<Arc<str>, Instant>>,
    /// This `Locks`'s random part of every candidate id, and the count after it.
    instance: u64,
    next_candidate: AtomicU64,
}

impl Holder {
    pub(super) fn new(
        store: Arc<dyn LeaseStore>,
        renewer: crate::hold::renewer::Renewer,
        fence: Option<crate::backend::SeaOrmLeaseStore>,
        config: Config,
    ) -> Self {
        let on_end: OnEnd = {
            let (store, lease) = (store.clone(), config.timing.lease);
            Box::new(move |hold: &crate::hold::Held, reason: LossReason| {
                // Past its deadline a late renew may have kept it live; refused for good, it
                // may still be. Lost or replaced, it is another hold's now.
                if matches!(reason, LossReason::Deadline | LossReason::Failed) {
                    release_in_background(
                        &store,
                        &hold.lease.resource,
                        hold.term.candidate(),
                        lease,
                    );
                }
            })
        };
        let keeper = Arc::new(Keeper::new(
            store.clone(),
            renewer,
            config.timing,
            "lock",
            on_end,
        ));
        Self {
            store,
            fence,
            config,
            keeper,
            yields: Mutex::default(),
            // Two `Locks` with one owner (or a restarted process) never share a candidate id.
            instance: crate::random::random_u64(),
            next_candidate: AtomicU64::new(1),
        }
    }

    /// A candidate id no other acquire uses: each hold is its own holder, so a second acquire
    /// of a lock this process holds waits like anyone else's (no re-entrancy).
    pub(super) fn candidate(&self) -> Arc<str> {
        let n = self.next_candidate.fetch_add(1, Ordering::Relaxed);
        Arc::from(format!("{}/{:016x}-{n}", self.config.owner, self.instance))
    }
}

/// Whether `holder` has the form of a hold's holder (`<owner>/<instance>-<n>`, see
/// `Holder::candidate`): a lease holder that is not cannot be one of the locks' holds.
#[cfg(feature = "jobs")]
pub(crate) fn is_hold_holder(holder: &str) -> bool {
    holder
        .rsplit_once('/')
        .and_then(|(_, tail)| tail.split_once('-'))
        .is_some_and(|(instance, n)| {
            instance.len() == 16
                && instance.bytes().all(|b| b.is_ascii_hexdigit())
                && !n.is_empty()
                && n.bytes().all(|b| b.is_ascii_digit())
        })
}

impl Holder {
    /// A hold of `name` that had to wait for it is let go: this process's next acquire of
    /// `name` waits one retry interval before it asks. Without a queue, a holder that asks
    /// again at once beats every waiter that polls at the retry interval, and under steady
    /// contention the same few would hold it; a waiter now asks (or is woken) within that
    /// interval and takes it first.
    pub(super) fn yielded(&self, name: &Arc<str>) {
        let now = crate::clock::now();
        let until = now.checked_add(self.config.retry_interval).unwrap_or(now);
        let mut yields = lock(&self.yields);
        yields.retain(|_, at| *at > now);
        yields.insert(name.clone(), until);
    }

    /// Whether `holder` (a lease row's holder) is one of this `Locks`'s own holds.
    pub(super) fn is_ours(&self, holder: &str) -> bool {
        holder
            .strip_prefix(&*self.config.owner)
            .and_then(|rest| rest.strip_prefix('/'))
            .and_then(|rest| rest.strip_prefix(&format!("{:016x}-", self.instance)))
            .is_some()
    }

    /// Until when an acquire of `name` stays out of the way, if it does now.
    pub(super) fn yielding(&self, name: &str) -> Option<Instant> {
        let now = crate::clock::now();
        lock(&self.yields).get(name).copied().filter(|at| *at > now)
    }

    /// How many leases this process holds through these locks.
    pub(super) fn held_count(&self) -> usize {
        self.keeper.count()
    }

    /// One acquire of `resource` for `candidate`. A grant is recorded (and renewed from then
    /// on) before it is returned; a grant whose answer came too late to be trusted is released
    /// and reported as a denial. The statement runs on a task of its own: dropped before its
    /// answer, this future leaves the task to release whatever it was granted.
    pub(super) async fn attempt(
        self: &Arc<Self>,
        resource: &Arc<str>,
        candidate: &Arc<str>,
        once: bool,
    ) -> Result<Attempt, StoreError> {
        let mut sent = crate::clock::now();
        // When the store let the acquire through (after waiting for one of its attempt slots,
        // if it did): the statement went out after that, so the grant counts from there.
        let let_through: Arc<Mutex<Option<Instant>>> = Arc::default();
        let answer = match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let (mut tx, rx) = oneshot::channel();
                let (store, r, c, lease, payload, through) = (
                    self.store.clone(),
                    resource.clone(),
                    candidate.clone(),
                    self.config.timing.lease,
                    self.config.payload.clone(),
                    let_through.clone(),
                );
                runtime.spawn(async move {
                    // The store learns when the caller is gone (an acquire still queued for
                    // one of its attempt slots then sends nothing), and says so.
                    let (gone_tx, gone) = tokio::sync::watch::channel(());
                    let sent = Arc::new(std::sync::atomic::AtomicU32::new(0));
                    let gave_up = Arc::new(std::sync::atomic::AtomicBool::new(false));
                    let for_caller = crate::store::ForCaller {
                        gone,
                        sent: sent.clone(),
                        gave_up: gave_up.clone(),
                        once,
                        let_through: through,
                    };
                    let call = crate::store::FOR_CALLER.scope(
                        for_caller,
                        store.acquire_or_renew_with(&r, &c, lease, payload.as_deref()),
                    );
                    tokio::pin!(call);
                    let answer = tokio::select! {
                        answer = &mut call => answer,
                        () = tx.closed() => {
                            drop(gone_tx);
                            call.await
                        }
                    };
                    if let Err(answer) = tx.send(answer) {
                        // Nobody waits for it any more: let go of what it may have granted
                        // (nothing, when the store sent nothing).
                        let nothing = crate::store::ForCaller::sent_nothing(&sent, &gave_up);
                        if may_hold(&answer) && !nothing {
                            release_by_candidate(&*store, &r, &c, lease).await;
                        }
                    }
                });
                let mut waiting = Waiting {
                    rx: Some(rx),
                    store: &self.store,
                    resource,
                    candidate,
                    lease: self.config.timing.lease,
                };
                let answer = match waiting.rx.as_mut() {
                    Some(rx) => rx.await,
                    None => return Ok(Attempt::Denied(None)),
                };
                waiting.rx = None;
                match answer {
                    Ok(answer) => answer,
                    // The task was dropped (its runtime shutting down).
                    Err(_) => return Ok(Attempt::Denied(None)),
                }
            }
            Err(_) => {
                self.store
                    .acquire_or_renew_with(
                        resource,
                        candidate,
                        self.config.timing.lease,
                        self.config.payload.as_deref(),
                    )
                    .await
            }
        };
        let lease = match answer {
            Ok(LeaseOutcome::Acquired(lease)) => lease,
            // A fresh candidate id is never renewed, unless an earlier attempt of the same id
            // was granted unseen (or another process shares the id): no hold begins on it.
            Ok(LeaseOutcome::Renewed(_)) => {
                warn!(resource = %resource, candidate = %candidate, "a new hold's id already held the lease; releasing it and asking under another id");
                self.release_quietly(resource, candidate);
                return Ok(Attempt::Denied(None));
            }
            Ok(LeaseOutcome::Denied(denial)) => return Ok(Attempt::Denied(Some(denial))),
            Err(err) => {
                // The answer may hide a grant: release under this id (never used again).
                self.release_quietly(resource, candidate);
                return Err(err);
            }
        };
        if let Some(through) = *lock(&let_through) {
            sent = sent.max(through);
        }
        let deadline = self.config.timing.deadline(&lease, sent);
        if deadline <= crate::clock::now() {
            debug!(resource = %resource, "a grant answered too late to be trusted; releasing it");
            self.release_quietly(resource, candidate);
            return Ok(Attempt::Denied(None));
        }
        let term = LeaderTerm::new(
            lease.token,
            resource.clone(),
            candidate.clone(),
            deadline,
            self.fence.clone(),
        );
        self.keeper.keep(term.clone(), lease, sent);
        Ok(Attempt::Granted(term))
    }

    /// Ends `term` (a hold of `resource`) and releases it in the store: `true` when the store
    /// released it, `false` when it was already gone (lost, lapsed, taken). The call is bounded
    /// by the lease: after that the lease has lapsed anyway.
    pub(super) async fn release(
        &self,
        resource: &str,
        term: &LeaderTerm,
    ) -> Result<bool, StoreError> {
        if !self.take(resource, term) {
            return Ok(false);
        }
        self.release_taken(resource, term).await
    }

    /// Stops renewing `term` (a hold of `resource`) and ends it: whether it was still held
    /// here. Taken out of the map first, so the renewer never sees it ended and releases it
    /// itself.
    pub(super) fn take(&self, resource: &str, term: &LeaderTerm) -> bool {
        let ours = self.keeper.take(resource, term);
        term.end(LossReason::Released);
        term.cut_off();
        ours
    }

    /// The store release of a hold [`take`](Self::take) took, bounded by the lease.
    pub(super) async fn release_taken(
        &self,
        resource: &str,
        term: &LeaderTerm,
    ) -> Result<bool, StoreError> {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return self.store.release(resource, term.candidate()).await;
        };
        // On a task of its own: a caller that stops waiting (a timeout around `release()`)
        // must not cancel the release with it, or the lock would stay held until it lapses.
        let (store, r, c, lease) = (
            self.store.clone(),
            resource.to_owned(),
            term.candidate().to_owned(),
            self.config.timing.lease,
        );
        let call = runtime.spawn(async move {
            let answer = tokio::time::timeout(lease, store.release(&r, &c)).await;
            if answer.is_err() {
                warn!(
                    resource = r,
                    "the release did not answer within the lease; it lapses"
                );
            }
            answer
        });
        match call.await {
            Ok(Ok(answer)) => answer,
            // Not answered within the lease (it lapsed since), or the runtime shutting down.
            Ok(Err(_)) | Err(_) => Ok(false),
        }
    }

    /// Releases `candidate`'s lease of `resource` in the background, where a runtime runs;
    /// otherwise it lapses.
    fn release_quietly(&self, resource: &str, candidate: &str) {
        release_in_background(&self.store, resource, candidate, self.config.timing.lease);
    }

    /// Starts the keeper's renewing on the current runtime unless it runs (see
    /// [`Keeper::start`]).
    pub(super) fn start_renewer(&self) {
        self.keeper.start();
    }
}

/// Releases `candidate`'s lease of `resource` in the background, where a runtime runs;
/// otherwise it lapses.
fn release_in_background(
    store: &Arc<dyn LeaseStore>,
    resource: &str,
    candidate: &str,
    lease: Duration,
) {
    let (store, r, c) = (store.clone(), resource.to_owned(), candidate.to_owned());
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move { release_by_candidate(&*store, &r, &c, lease).await });
    }
}

/// Releases `candidate`'s lease of `resource`, bounded by the lease (after which it lapsed).
async fn release_by_candidate(
    store: &dyn LeaseStore,
    resource: &str,
    candidate: &str,
    lease: Duration,
) {
    match tokio::time::timeout(lease, store.release(resource, candidate)).await {
        Ok(Ok(_)) => {}
        Ok(Err(err)) => debug!(resource, error = %err, "release failed; the lease lapses"),
        Err(_) => debug!(resource, "release did not answer; the lease lapses"),
    }
}

/// An acquire waiting for its statement's task. Dropped before the answer arrived, it lets
/// the task release what it was granted (the task's send fails); dropped after the answer was
/// sent but before it was read, it releases that grant itself.
struct Waiting<'a> {
    rx: Option<oneshot::Receiver<Result<LeaseOutcome, StoreError>>>,
    store: &'a Arc<dyn LeaseStore>,
    resource: &'a str,
    candidate: &'a str,
    lease: Duration,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else { return };
        // Closed first: from here on the task's send fails and it releases itself, and an
        // answer sent before is read here. Without it, one sent between the two would be lost.
        rx.close();
        if let Ok(answer) = rx.try_recv() {
            if may_hold(&answer) {
                let (store, r, c, lease) = (
                    self.store.clone(),
                    self.resource.to_owned(),
                    self.candidate.to_owned(),
                    self.lease,
                );
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime
                        .spawn(async move { release_by_candidate(&*store, &r, &c, lease).await });
                }
            }
        }
    }
}

/// Whether an answer may stand for a lease the store holds for the candidate: a grant, a
/// renew, or an error (the write may have committed before the answer was lost).
fn may_hold(answer: &Result<LeaseOutcome, StoreError>) -> bool {
    !matches!(answer, Ok(LeaseOutcome::Denied(_)))
}
