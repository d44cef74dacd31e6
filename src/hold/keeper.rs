//! Holds kept: a set of held leases (one per resource) renewed through the store's renewer
//! when due, each trusted until its local deadline and ended when that passes without a renew,
//! when the store finds it lost, or when the store refuses renews for good. One task per
//! keeper renews them, from the first hold until the keeper is dropped. What becomes of a hold
//! that ended here (released, left to lapse) is its owner's: the `on_end` it was built with.

use crate::mutex::lock;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{debug, error, warn};

use super::renewer::Renewer;
use super::timing::Timing;
use super::{Held, LeaderTerm, LossReason};
use crate::{lease::Lease, store::LeaseStore};

/// What the owner does with a hold that ended here, and why it ended: `Deadline` (no renew in
/// time; a late renew may have kept its lease live), `Failed` (refused for good), `Denied`
/// (the store found it lost) or `Superseded` (a new hold of the resource replaced it).
pub(crate) type OnEnd = Box<dyn Fn(&Held, LossReason) + Send + Sync>;

/// The holds of one owner (a `Locks`), renewed together (see the module's notes).
pub(crate) struct Keeper {
    store: Arc<dyn LeaseStore>,
    renewer: Renewer,
    timing: Timing,
    held: Mutex<BTreeMap<Arc<str>, Kept>>,
    /// Wakes the task: a new hold, or the keeper gone.
    wake: Arc<Notify>,
    /// Whether the task runs (it clears this when it ends, also when its runtime shuts down),
    /// so the next hold starts one again.
    running: Arc<AtomicBool>,
    on_end: OnEnd,
    /// What the holds are, for the logs.
    what: &'static str,
}

/// A hold and when it is due for its next renew.
struct Kept {
    hold: Held,
    renew_at: Instant,
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.wake.notify_one();
    }
}

impl Keeper {
    pub(crate) fn new(
        store: Arc<dyn LeaseStore>,
        renewer: Renewer,
        timing: Timing,
        what: &'static str,
        on_end: OnEnd,
    ) -> Self {
        Self {
            store,
            renewer,
            timing,
            held: Mutex::default(),
            wake: Arc::new(Notify::new()),
            running: Arc::new(AtomicBool::new(false)),
            on_end,
            what,
        }
    }

    /// How many holds are kept.
    pub(crate) fn count(&self) -> usize {
        lock(&self.held).len()
    }

    /// Keeps `term`, granted as `lease` by a statement sent at `sent`, renewed from now on.
    /// A hold of the same resource kept before ends (`Superseded`): the store gave the
    /// resource to this one, so that one's lease ended there before its deadline was seen.
    pub(crate) fn keep(self: &Arc<Self>, term: LeaderTerm, lease: Lease, sent: Instant) {
        let renew_at = sent
            .checked_add(self.timing.renew_interval)
            .unwrap_or_else(|| term.local_deadline());
        let resource = Arc::from(lease.resource.as_str());
        let kept = Kept {
            hold: Held { term, lease },
            renew_at,
        };
        let replaced = lock(&self.held).insert(resource, kept);
        if let Some(old) = replaced {
            old.hold.end(LossReason::Superseded);
            (self.on_end)(&old.hold, LossReason::Superseded);
        }
        self.start();
        self.wake.notify_one();
    }

    /// Stops keeping `term` (a hold of `resource`): whether it was kept here. Its owner ends
    /// it and lets it go; the task never sees it again.
    pub(crate) fn take(&self, resource: &str, term: &LeaderTerm) -> bool {
        let mut held = lock(&self.held);
        let ours = held.get(resource).is_some_and(|k| k.hold.term == *term);
        if ours {
            held.remove(resource);
        }
        ours
    }

    /// Starts the task on the current runtime unless one runs: after the first hold, and
    /// again whenever an owner looks at a hold, so holds outlive the runtime that took them
    /// (its shutdown ends the task).
    pub(crate) fn start(self: &Arc<Self>) {
        if self.running.load(Ordering::SeqCst) {
            return;
        }
        // The runtime first: a caller outside one must not hold the flag even for a moment
        // (a caller on a runtime would skip starting it meanwhile).
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            debug!(
                what = self.what,
                "no tokio runtime to renew on: holds end at their deadlines"
            );
            return;
        };
        if self.running.swap(true, Ordering::SeqCst) {
            return;
        }
        let (weak, wake, running) = (
            Arc::downgrade(self),
            self.wake.clone(),
            Running(self.running.clone()),
        );
        runtime.spawn(keep_renewing(weak, wake, running));
    }

    /// Ends the holds whose local deadline passed by `now` (no renew came in time) or that
    /// their owner ended. Returns when the next renew or deadline is due, if anything is held.
    fn expire(&self, now: Instant) -> Option<Instant> {
        let (ended, next) = {
            let mut held = lock(&self.held);
            let ended: Vec<Arc<str>> = held
                .iter()
                .filter(|(_, k)| k.hold.term.local_deadline() <= now || k.hold.term.is_lost())
                .map(|(r, _)| r.clone())
                .collect();
            let ended: Vec<Kept> = ended.iter().filter_map(|r| held.remove(r)).collect();
            let next = held
                .values()
                .map(|k| k.renew_at.min(k.hold.term.local_deadline()))
                .min();
            (ended, next)
        };
        // The owner hears of them with nothing locked here.
        for k in ended {
            let (resource, token) = (&k.hold.lease.resource, k.hold.lease.token);
            if k.hold.term.is_lost() {
                debug!(what = self.what, %resource, %token, "an ended hold is let go");
            } else {
                warn!(what = self.what, %resource, %token, "no renew before the hold's deadline: it is lost");
            }
            k.hold.end(LossReason::Deadline);
            (self.on_end)(&k.hold, LossReason::Deadline);
        }
        next
    }

    /// One batched renew of everything held, when anything is due at `now`, given up at the
    /// first deadline.
    async fn renew_round(&self, now: Instant) {
        let (batch, until) = {
            let held = lock(&self.held);
            if !held.values().any(|k| k.renew_at <= now) {
                return;
            }
            let until = held.values().map(|k| k.hold.term.local_deadline()).min();
            // An ended hold is not renewed: `expire` lets it go.
            let batch: Vec<Lease> = held
                .values()
                .filter(|k| !k.hold.term.is_lost())
                .map(|k| k.hold.lease.clone())
                .collect();
            (batch, until)
        };
        let Some(until) = until else { return };
        if batch.is_empty() {
            return;
        }
        let sent = crate::clock::now();
        let renew = self
            .renewer
            .renew_now(&self.store, &batch, self.timing.renew_key(), until);
        let answer = crate::clock::timeout_at(until, renew).await;
        // Holds that ended here: their owner hears of them once nothing is locked here.
        let mut ended: Vec<(Held, LossReason)> = Vec::new();
        self.apply(answer, &batch, sent, &mut ended);
        for (hold, reason) in ended {
            hold.end(reason);
            (self.on_end)(&hold, reason);
        }
    }

    /// What a batched renew of `batch` sent at `sent` answered: renewed holds move their
    /// deadlines, the others are asked again soon; those that ended go to `ended`.
    fn apply(
        &self,
        answer: Result<
            Result<Option<crate::lease::Renewals>, Arc<crate::error::StoreError>>,
            tokio::time::error::Elapsed,
        >,
        batch: &[Lease],
        sent: Instant,
        ended: &mut Vec<(Held, LossReason)>,
    ) {
        let mut held = lock(&self.held);
        let renewals = match answer {
            Ok(Ok(Some(renewals))) => renewals,
            Ok(Err(err)) if err.is_permanent() => {
                error!(what = self.what, leases = batch.len(), error = %err, "the store cannot renew: every hold it was asked for ends");
                // Only the holds in this batch: one kept meanwhile was not asked about.
                for lease in batch {
                    let same = held
                        .get(lease.resource.as_str())
                        .is_some_and(|k| k.hold.names(lease));
                    if let Some(k) = same.then(|| held.remove(lease.resource.as_str())).flatten() {
                        ended.push((k.hold, LossReason::Failed));
                    }
                }
                return;
            }
            Ok(Err(err)) => {
                warn!(what = self.what, leases = batch.len(), error = %err, "renewing the holds failed; trying again");
                self.retry_soon(&mut held, batch, sent);
                return;
            }
            Ok(Ok(None)) | Err(_) => {
                warn!(
                    what = self.what,
                    leases = batch.len(),
                    "renewing the holds did not answer before the first deadline"
                );
                self.retry_soon(&mut held, batch, sent);
                return;
            }
        };
        let mut answered = std::collections::HashSet::new();
        for lease in renewals.renewed {
            answered.insert(lease.resource.clone());
            if let Some(k) = held
                .get_mut(lease.resource.as_str())
                .filter(|k| k.hold.names(&lease))
            {
                // A term whose deadline passed stays ended although its lease was renewed:
                // the next look lets it go.
                let deadline = self.timing.deadline(&lease, sent);
                k.hold.renewed(lease, deadline);
                k.renew_at = sent.checked_add(self.timing.renew_interval).unwrap_or(sent);
            }
        }
        for lost in renewals.lost {
            answered.insert(lost.resource.clone());
            let same = held
                .get(lost.resource.as_str())
                .is_some_and(|k| k.hold.names(&lost));
            if let Some(k) = same.then(|| held.remove(lost.resource.as_str())).flatten() {
                warn!(what = self.what, resource = %lost.resource, token = %lost.token, "hold lost (lapsed, revoked or taken)");
                ended.push((k.hold, LossReason::Denied));
            }
        }
        // A lease the answer did not mention is tried again soon, as after a failure.
        let unanswered: Vec<Lease> = batch
            .iter()
            .filter(|l| !answered.contains(&l.resource))
            .cloned()
            .collect();
        if !unanswered.is_empty() {
            debug!(
                what = self.what,
                leases = unanswered.len(),
                "the batched renew did not answer for every hold"
            );
            self.retry_soon(&mut held, &unanswered, sent);
        }
    }

    /// After a renew that did not answer for `leases`: ask again soon, well before their
    /// deadlines.
    fn retry_soon(&self, held: &mut BTreeMap<Arc<str>, Kept>, leases: &[Lease], sent: Instant) {
        let again = (self.timing.renew_interval / 4).max(Duration::from_millis(10));
        let at = sent.checked_add(again).unwrap_or(sent);
        for lease in leases {
            if let Some(k) = held
                .get_mut(lease.resource.as_str())
                .filter(|k| k.hold.names(lease))
            {
                k.renew_at = at;
            }
        }
    }
}

/// Clears the running flag when the task ends, however it ends.
struct Running(Arc<AtomicBool>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// Renews every hold of one keeper until the keeper is dropped.
async fn keep_renewing(keeper: Weak<Keeper>, wake: Arc<Notify>, _running: Running) {
    loop {
        let next = match keeper.upgrade() {
            Some(k) => {
                // Expired holds first: one past its deadline must not cut the batch's wait.
                k.expire(crate::clock::now());
                k.renew_round(crate::clock::now()).await;
                k.expire(crate::clock::now())
            }
            None => return,
        };
        // No strong reference while waiting: dropping the keeper ends this task.
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
