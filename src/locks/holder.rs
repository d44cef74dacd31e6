//! What one [`Locks`](super::Locks) holds, and the one background task that renews all of it:
//! every guard and permit of a `Locks` is renewed by one `renew_all` per round, trusted until
//! the same local deadline an elector's term is (`lease::local_deadline`), and ended when that
//! deadline passes without a renew.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::elector::{LeaderTerm, LossReason};
use crate::lease::local_deadline;
use crate::{Denial, Lease, LeaseOutcome, LeaseStore, StoreError};

/// The options of one [`Locks`](super::Locks), validated.
#[derive(Debug, Clone)]
pub(super) struct Config {
    pub owner: Arc<str>,
    pub lease: Duration,
    pub renew_interval: Duration,
    pub retry_interval: Duration,
    pub step_down_margin: Duration,
}

/// A lease this process holds for a guard or a permit.
struct Held {
    term: LeaderTerm,
    lease: Lease,
    /// When this lease is due for its next renew.
    renew_at: Instant,
}

/// What one acquire attempt came to.
pub(super) enum Attempt {
    Granted(LeaderTerm),
    Denied(Option<Denial>),
}

pub(super) struct Holder {
    pub store: Arc<dyn LeaseStore>,
    pub fence: Option<crate::SeaOrmLeaseStore>,
    pub config: Config,
    held: Mutex<BTreeMap<Arc<str>, Held>>,
    /// Held across a batched renew and its reconciliation, and across a release: a release
    /// always names the lease's latest write (a renew in flight would otherwise move the
    /// expiry past the one the release names, and the lease would stay until it lapsed).
    round: tokio::sync::Mutex<()>,
    /// Wakes the renewer: a new lease, or the last handle gone.
    wake: Arc<Notify>,
    renewer: std::sync::Once,
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
        fence: Option<crate::SeaOrmLeaseStore>,
        config: Config,
    ) -> Self {
        Self {
            store,
            fence,
            config,
            held: Mutex::default(),
            round: tokio::sync::Mutex::new(()),
            wake: Arc::new(Notify::new()),
            renewer: std::sync::Once::new(),
            next_candidate: AtomicU64::new(1),
        }
    }

    /// A candidate id no other acquire of this process uses: each guard is its own holder, so
    /// a second acquire of a lock this process holds waits like anyone else's (no re-entrancy).
    pub(super) fn candidate(&self) -> Arc<str> {
        let n = self.next_candidate.fetch_add(1, Ordering::Relaxed);
        Arc::from(format!("{}/{n}", self.config.owner))
    }

    /// How many leases this process holds through these locks.
    pub(super) fn held_count(&self) -> usize {
        lock(&self.held).len()
    }

    /// One acquire of `resource` for `candidate`. A grant is recorded (and renewed from then
    /// on) before it is returned; a grant whose answer came too late to be trusted is released
    /// and reported as a denial.
    pub(super) async fn attempt(
        self: &Arc<Self>,
        resource: &Arc<str>,
        candidate: &Arc<str>,
    ) -> Result<Attempt, StoreError> {
        // Dropped before the answer (the caller's timeout, a `select!`), the attempt may still
        // have been granted: that candidate id is never used again, so its lease is released.
        let mut pending = Pending {
            holder: Some(self),
            resource,
            candidate,
        };
        let sent = crate::clock::now();
        let answer = self
            .store
            .acquire_or_renew(resource, candidate, self.config.lease)
            .await?;
        // An error leaves `pending` armed: the attempt may have been granted unseen.
        pending.holder = None;
        let lease = match answer {
            // `Renewed`: an earlier attempt of this same acquire was granted and its answer
            // lost; the candidate id is this acquire's alone, so the term is new to it.
            LeaseOutcome::Acquired(lease) | LeaseOutcome::Renewed(lease) => lease,
            LeaseOutcome::Denied(denial) => return Ok(Attempt::Denied(Some(denial))),
        };
        let deadline = local_deadline(
            &lease,
            sent,
            self.config.lease,
            self.config.step_down_margin,
        );
        if deadline <= crate::clock::now() {
            debug!(resource = %resource, "a grant answered too late to be trusted; releasing it");
            self.release_quietly(lease);
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
            .checked_add(self.config.renew_interval)
            .unwrap_or(deadline);
        lock(&self.held).insert(
            resource.clone(),
            Held {
                term: term.clone(),
                lease,
                renew_at,
            },
        );
        self.start_renewer();
        self.wake.notify_one();
        Ok(Attempt::Granted(term))
    }

    /// Ends the term of `token` on `resource` and releases its lease's latest write. `true`
    /// when the store released it; `false` when the lease was already gone (lapsed, lost,
    /// taken).
    pub(super) async fn release(
        &self,
        resource: &str,
        term: &LeaderTerm,
    ) -> Result<bool, StoreError> {
        term.end(LossReason::Released);
        term.cut_off();
        let _round = self.round.lock().await;
        let held = {
            let mut held = lock(&self.held);
            match held.get(resource) {
                Some(h) if h.term == *term => held.remove(resource),
                _ => None,
            }
        };
        match held {
            Some(h) => self.store.release_lease(&h.lease).await,
            None => Ok(false),
        }
    }

    /// Ends the term and stops renewing it without a store call: its lease lapses.
    pub(super) fn forget(&self, resource: &str, term: &LeaderTerm) {
        term.end(LossReason::Released);
        term.cut_off();
        let mut held = lock(&self.held);
        if held.get(resource).is_some_and(|h| h.term == *term) {
            held.remove(resource);
        }
    }

    /// Releases `lease` in the background, where a runtime runs; otherwise it lapses.
    fn release_quietly(&self, lease: Lease) {
        let store = self.store.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(err) = store.release_lease(&lease).await {
                    debug!(resource = %lease.resource, error = %err, "release failed; the lease lapses");
                }
            });
        }
    }

    fn start_renewer(self: &Arc<Self>) {
        self.renewer.call_once(|| {
            let weak = Arc::downgrade(self);
            let wake = self.wake.clone();
            tokio::spawn(renew_loop(weak, wake));
        });
    }

    /// Ends the terms whose local deadline passed by `now` (no renew came in time) and lets
    /// their leases go. Returns when the next renew or deadline is due, if anything is held.
    fn expire(&self, now: Instant) -> Option<Instant> {
        let mut held = lock(&self.held);
        let ended: Vec<Arc<str>> = held
            .iter()
            .filter(|(_, h)| h.term.local_deadline() <= now || h.term.is_lost())
            .map(|(r, _)| r.clone())
            .collect();
        for resource in ended {
            if let Some(h) = held.remove(&resource) {
                if !h.term.is_lost() {
                    warn!(resource = %resource, token = %h.lease.token, "no renew before the lock's deadline: the lock is lost");
                }
                h.term.end(LossReason::Deadline);
                h.term.cut_off();
                // A renew that answered late may have kept it live in the store.
                self.release_quietly(h.lease);
            }
        }
        held.values()
            .map(|h| h.renew_at.min(h.term.local_deadline()))
            .min()
    }

    /// One batched renew of everything held, when anything is due at `now`.
    async fn renew_round(&self, now: Instant) {
        let _round = self.round.lock().await;
        let (batch, until) = {
            let held = lock(&self.held);
            if !held.values().any(|h| h.renew_at <= now) {
                return;
            }
            let until = held.values().map(|h| h.term.local_deadline()).min();
            let batch: Vec<Lease> = held.values().map(|h| h.lease.clone()).collect();
            (batch, until)
        };
        let Some(until) = until else { return };
        let sent = crate::clock::now();
        let answer =
            crate::clock::timeout_at(until, self.store.renew_all(&batch, self.config.lease)).await;
        let mut held = lock(&self.held);
        let renewals = match answer {
            Ok(Ok(renewals)) => renewals,
            Ok(Err(err)) => {
                warn!(leases = batch.len(), error = %err, "renewing the held locks failed; trying again");
                self.retry_soon(&mut held, sent);
                return;
            }
            Err(_) => {
                warn!(
                    leases = batch.len(),
                    "renewing the held locks did not answer before the first deadline"
                );
                self.retry_soon(&mut held, sent);
                return;
            }
        };
        for lease in renewals.renewed {
            if let Some(h) = held
                .get_mut(lease.resource.as_str())
                .filter(|h| h.term.token() == lease.token)
            {
                // A term whose deadline passed stays ended although its lease was renewed:
                // the next look releases it.
                if h.term.is_current() {
                    h.term.extend(local_deadline(
                        &lease,
                        sent,
                        self.config.lease,
                        self.config.step_down_margin,
                    ));
                }
                h.renew_at = sent.checked_add(self.config.renew_interval).unwrap_or(sent);
                h.lease = lease;
            }
        }
        for lost in renewals.lost {
            let same = held
                .get(lost.resource.as_str())
                .is_some_and(|h| h.term.token() == lost.token);
            if same {
                if let Some(h) = held.remove(lost.resource.as_str()) {
                    warn!(resource = %lost.resource, token = %lost.token, "lock lost (lapsed, revoked or taken)");
                    h.term.end(LossReason::Denied);
                    h.term.cut_off();
                }
            }
        }
    }

    /// After a failed renew: ask again soon, well before the first deadline.
    fn retry_soon(&self, held: &mut BTreeMap<Arc<str>, Held>, sent: Instant) {
        let again = (self.config.renew_interval / 4).max(Duration::from_millis(10));
        let at = sent.checked_add(again).unwrap_or(sent);
        for h in held.values_mut() {
            h.renew_at = h.renew_at.min(at);
        }
    }
}

/// Renews every lease of one `Locks` until its last handle and guard are gone.
async fn renew_loop(holder: Weak<Holder>, wake: Arc<Notify>) {
    loop {
        let next = match holder.upgrade() {
            Some(h) => {
                let now = crate::clock::now();
                h.renew_round(now).await;
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

/// An acquire attempt in flight: dropped before its answer (or on an error, which may hide a
/// grant), it releases whatever the attempt may have been granted. The caller never uses that
/// candidate id again.
struct Pending<'a> {
    holder: Option<&'a Arc<Holder>>,
    resource: &'a str,
    candidate: &'a str,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        let Some(holder) = self.holder else { return };
        let store = holder.store.clone();
        let (resource, candidate) = (self.resource.to_owned(), self.candidate.to_owned());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = store.release(&resource, &candidate).await;
            });
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
