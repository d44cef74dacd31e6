//! What one [`Locks`](super::Locks) holds, and the one background task that renews all of it:
//! every guard and permit of a `Locks` is renewed by one `renew_all` per round, trusted until
//! the same local deadline an elector's term is (`hold::timing::Timing::deadline`), and ended when that
//! deadline passes without a renew.
//!
//! Every hold has a candidate id of its own (`owner/<random>-<n>`, never used for anything
//! else), so it is released by that id: whatever write of the hold the store has last (a renew
//! whose answer never came included) is the one released, and no other holder's.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;
use tracing::{debug, error, warn};

use crate::hold::{LeaderTerm, LossReason};
use crate::{Denial, Lease, LeaseOutcome, LeaseStore, StoreError};

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

/// A lease this process holds for a guard or a permit.
struct Held {
    hold: crate::hold::Held,
    /// When this lease is due for its next renew.
    renew_at: Instant,
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
    /// The store's renewer: every hold's renew goes out through it.
    renewer: crate::hold::renewer::Renewer,
    pub fence: Option<crate::SeaOrmLeaseStore>,
    pub config: Config,
    held: Mutex<BTreeMap<Arc<str>, Held>>,
    /// Wakes the renewer: a new lease, or the last handle gone.
    wake: Arc<Notify>,
    /// Whether a renewer task runs (it clears this when it ends, also when its runtime shuts
    /// down), so the next acquire starts one again.
    renewing: Arc<AtomicBool>,
    /// Locks (and semaphores) by name that this process let go of after waiting for them, and
    /// until when its own next acquire of them stays out of the way (see [`Self::yielded`]).
    yields: Mutex<std::collections::HashMap<Arc<str>, Instant>>,
    /// This `Locks`'s random part of every candidate id, and the count after it.
    instance: u64,
    next_candidate: AtomicU64,
}

impl Drop for Holder {
    fn drop(&mut self) {
        self.wake.notify_one();
    }
}

impl Holder {
    pub(super) fn new(
        store: Arc<dyn LeaseStore>,
        renewer: crate::hold::renewer::Renewer,
        fence: Option<crate::SeaOrmLeaseStore>,
        config: Config,
    ) -> Self {
        Self {
            store,
            renewer,
            fence,
            config,
            held: Mutex::default(),
            yields: Mutex::default(),
            wake: Arc::new(Notify::new()),
            renewing: Arc::new(AtomicBool::new(false)),
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
        lock(&self.held).len()
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
        let sent = crate::clock::now();
        let answer = match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let (mut tx, rx) = oneshot::channel();
                let (store, r, c, lease, payload) = (
                    self.store.clone(),
                    resource.clone(),
                    candidate.clone(),
                    self.config.timing.lease,
                    self.config.payload.clone(),
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
        let renew_at = sent
            .checked_add(self.config.timing.renew_interval)
            .unwrap_or(deadline);
        let replaced = lock(&self.held).insert(
            resource.clone(),
            Held {
                hold: crate::hold::Held {
                    term: term.clone(),
                    lease,
                },
                renew_at,
            },
        );
        if let Some(old) = replaced {
            // The store gave the lock to this new hold, so the old one is over (its lease
            // ended there before the renewer saw its deadline).
            old.hold.end(LossReason::Superseded);
        }
        self.start_renewer();
        self.wake.notify_one();
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
        let ours = {
            let mut held = lock(&self.held);
            let ours = held.get(resource).is_some_and(|h| h.hold.term == *term);
            if ours {
                held.remove(resource);
            }
            ours
        };
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
        let (store, r, c, lease) = (
            self.store.clone(),
            resource.to_owned(),
            candidate.to_owned(),
            self.config.timing.lease,
        );
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { release_by_candidate(&*store, &r, &c, lease).await });
        }
    }

    /// Starts the renewer on the current runtime unless one runs: after the first grant, and
    /// again whenever a guard is looked at, so holds outlive the runtime that took them (its
    /// shutdown ends the renewer task).
    pub(super) fn start_renewer(self: &Arc<Self>) {
        if self.renewing.load(Ordering::SeqCst) {
            return;
        }
        // The runtime first: a caller outside one must not hold the flag even for a moment
        // (a caller on a runtime would skip starting it meanwhile).
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            debug!("no tokio runtime to renew the locks on: they end at their deadlines");
            return;
        };
        if self.renewing.swap(true, Ordering::SeqCst) {
            return;
        }
        let (weak, wake, running) = (
            Arc::downgrade(self),
            self.wake.clone(),
            Running(self.renewing.clone()),
        );
        runtime.spawn(renew_loop(weak, wake, running));
    }

    /// Ends the holds whose local deadline passed by `now` (no renew came in time) and lets
    /// their leases go. Returns when the next renew or deadline is due, if anything is held.
    fn expire(&self, now: Instant) -> Option<Instant> {
        let mut held = lock(&self.held);
        let ended: Vec<Arc<str>> = held
            .iter()
            .filter(|(_, h)| h.hold.term.local_deadline() <= now || h.hold.term.is_lost())
            .map(|(r, _)| r.clone())
            .collect();
        for resource in ended {
            if let Some(h) = held.remove(&resource) {
                if h.hold.term.is_lost() {
                    // Ended already (its `lost()` saw the deadline first): let go of it now.
                    debug!(resource = %resource, token = %h.hold.lease.token, "an ended hold is released");
                } else {
                    warn!(resource = %resource, token = %h.hold.lease.token, "no renew before the lock's deadline: the lock is lost");
                }
                h.hold.end(LossReason::Deadline);
                // A renew that answered late may have kept it live in the store.
                self.release_quietly(&resource, h.hold.term.candidate());
            }
        }
        held.values()
            .map(|h| h.renew_at.min(h.hold.term.local_deadline()))
            .min()
    }

    /// One batched renew of everything held, when anything is due at `now`.
    async fn renew_round(&self, now: Instant) {
        let (batch, until) = {
            let held = lock(&self.held);
            if !held.values().any(|h| h.renew_at <= now) {
                return;
            }
            let until = held.values().map(|h| h.hold.term.local_deadline()).min();
            // An ended hold is not renewed: `expire` releases it.
            let batch: Vec<Lease> = held
                .values()
                .filter(|h| !h.hold.term.is_lost())
                .map(|h| h.hold.lease.clone())
                .collect();
            (batch, until)
        };
        let Some(until) = until else { return };
        if batch.is_empty() {
            return;
        }
        let sent = crate::clock::now();
        let timing = self.config.timing.renew_key();
        let answer = crate::clock::timeout_at(
            until,
            self.renewer.renew_now(&self.store, &batch, timing, until),
        )
        .await;
        let mut held = lock(&self.held);
        let renewals = match answer {
            Ok(Ok(Some(renewals))) => renewals,
            Ok(Ok(None)) => {
                warn!(
                    leases = batch.len(),
                    "renewing the held locks did not answer before the first deadline"
                );
                self.retry_soon(&mut held, &batch, sent);
                return;
            }
            Ok(Err(err)) if err.is_permanent() => {
                error!(leases = batch.len(), error = %err, "the store cannot renew locks: every hold it was asked for ends");
                // Only the holds in this batch: one granted meanwhile was not asked about.
                for lease in &batch {
                    let same = held
                        .get(lease.resource.as_str())
                        .is_some_and(|h| h.hold.names(lease));
                    if !same {
                        continue; // released and taken again meanwhile: another hold
                    }
                    if let Some(h) = held.remove(lease.resource.as_str()) {
                        h.hold.end(LossReason::Failed);
                        self.release_quietly(&lease.resource, h.hold.term.candidate());
                    }
                }
                return;
            }
            Ok(Err(err)) => {
                warn!(leases = batch.len(), error = %err, "renewing the held locks failed; trying again");
                self.retry_soon(&mut held, &batch, sent);
                return;
            }
            Err(_) => {
                warn!(
                    leases = batch.len(),
                    "renewing the held locks did not answer before the first deadline"
                );
                self.retry_soon(&mut held, &batch, sent);
                return;
            }
        };
        let mut answered = std::collections::HashSet::new();
        for lease in renewals.renewed {
            answered.insert(lease.resource.clone());
            if let Some(h) = held
                .get_mut(lease.resource.as_str())
                .filter(|h| h.hold.names(&lease))
            {
                // A term whose deadline passed stays ended although its lease was renewed:
                // the next look releases it.
                let deadline = self.config.timing.deadline(&lease, sent);
                h.hold.renewed(lease, deadline);
                h.renew_at = sent
                    .checked_add(self.config.timing.renew_interval)
                    .unwrap_or(sent);
            }
        }
        for lost in renewals.lost {
            answered.insert(lost.resource.clone());
            let same = held
                .get(lost.resource.as_str())
                .is_some_and(|h| h.hold.names(&lost));
            if same {
                if let Some(h) = held.remove(lost.resource.as_str()) {
                    warn!(resource = %lost.resource, token = %lost.token, "lock lost (lapsed, revoked or taken)");
                    h.hold.end(LossReason::Denied);
                }
            }
        }
        // A lease the answer did not mention is tried again soon, as after a failure.
        let unanswered: Vec<Lease> = batch
            .into_iter()
            .filter(|l| !answered.contains(&l.resource))
            .collect();
        if !unanswered.is_empty() {
            warn!(
                leases = unanswered.len(),
                "the batched renew did not answer for every lease"
            );
            self.retry_soon(&mut held, &unanswered, sent);
        }
    }

    /// After a renew that did not answer for `leases`: ask again soon, well before their
    /// deadlines.
    fn retry_soon(&self, held: &mut BTreeMap<Arc<str>, Held>, leases: &[Lease], sent: Instant) {
        let again = (self.config.timing.renew_interval / 4).max(Duration::from_millis(10));
        let at = sent.checked_add(again).unwrap_or(sent);
        for lease in leases {
            if let Some(h) = held
                .get_mut(lease.resource.as_str())
                .filter(|h| h.hold.names(lease))
            {
                h.renew_at = at;
            }
        }
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

/// Clears the renewer flag when the renewer ends, however it ends.
struct Running(Arc<AtomicBool>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// Renews every lease of one `Locks` until its last handle and guard are gone.
async fn renew_loop(holder: Weak<Holder>, wake: Arc<Notify>, _running: Running) {
    loop {
        let next = match holder.upgrade() {
            Some(h) => {
                // Expired holds first: one past its deadline must not cut the batch's wait.
                h.expire(crate::clock::now());
                h.renew_round(crate::clock::now()).await;
                h.expire(crate::clock::now())
            }
            None => return,
        };
        // No strong reference while waiting: dropping the last handle ends this task.
        match next {
            Some(at) => {
                tokio::select! {
                    () = crate::clock::sleep_until(at) => {}
                    () = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
