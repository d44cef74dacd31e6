//! A held lock or permit.

use std::fmt;
use std::sync::Arc;

use std::future::Future;

use super::holder::Holder;
use super::LockError;
use crate::fencing::FencingToken;
use crate::hold::LeaderTerm;

/// A lock or a semaphore permit this process holds, renewed in the background until it is
/// released, dropped or lost.
///
/// It holds the lock by the same rule an elector holds a term: [`is_held`](Self::is_held) is
/// false from the local deadline on (the lease as the database granted it, less the step-down
/// margin, on a monotonic clock that counts suspend), whether or not a renew has answered.
/// Fence every write the lock protects with [`fence`](Self::fence) (in a SeaORM transaction)
/// or pass [`token`](Self::token) downstream.
///
/// Dropping the guard releases the lock at once in the background (never blocking the drop);
/// without a tokio runtime to do that on, the lease lapses. [`release`](Self::release) says
/// whether the release reached the store.
#[must_use = "the lock is released when the guard is dropped"]
pub struct LockGuard {
    term: LeaderTerm,
    name: Arc<str>,
    permit: Option<u32>,
    holder: Arc<Holder>,
    released: bool,
    /// Its acquire had to wait for another process's hold: on release, this process yields
    /// to the waiters under this key (see `Holder::yielded`).
    contended: Option<Arc<str>>,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("LockGuard");
        d.field("name", &&*self.name);
        if let Some(permit) = self.permit {
            d.field("permit", &permit);
        }
        d.field("term", &self.term).finish()
    }
}

impl LockGuard {
    pub(super) fn new(
        term: LeaderTerm,
        name: Arc<str>,
        permit: Option<u32>,
        holder: Arc<Holder>,
    ) -> Self {
        Self {
            term,
            name,
            permit,
            holder,
            released: false,
            contended: None,
        }
    }

    pub(super) fn contended(mut self, key: Option<Arc<str>>) -> Self {
        self.contended = key;
        self
    }

    /// This hold's fencing token: strictly greater than every earlier holder's of the same
    /// lock (of the same permit, for a semaphore).
    pub fn token(&self) -> FencingToken {
        self.term.token()
    }

    /// The lock's (or semaphore's) name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The lease row held: the lock's name, or a semaphore permit's (`name#3`).
    pub fn resource(&self) -> &str {
        self.term.resource()
    }

    /// Which permit of a semaphore (or read slot of a reader-writer lock) this is (`None` for
    /// a lock).
    pub fn permit(&self) -> Option<u32> {
        self.permit
    }

    /// Whether the lock is still held right now: not lost, and its local deadline not passed
    /// (checked against the monotonic clock on every call).
    pub fn is_held(&self) -> bool {
        let held = self.term.is_current();
        if held {
            // The renewer ends with the runtime it ran on: a hold looked at from another
            // runtime gets one there.
            self.holder.start_renewer();
        }
        held
    }

    /// Completes when the lock is lost (a renew denied, taken away, or its local deadline
    /// passed) or released. It completes at the deadline by itself, whether or not the
    /// renewer has seen it yet (one whose runtime shut down never would).
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        if !self.term.is_lost() {
            // The renewer ends the hold in the store's view too (and renews it meanwhile).
            self.holder.start_renewer();
        }
        let term = self.term.clone();
        async move {
            loop {
                let deadline = term.local_deadline();
                tokio::select! {
                    biased;
                    () = term.lost() => return,
                    () = crate::clock::sleep_until(deadline) => {
                        // Renewed meanwhile: the deadline moved on.
                        if term.local_deadline() <= crate::clock::now() {
                            term.end(crate::hold::LossReason::Deadline);
                            term.cut_off();
                            return;
                        }
                    }
                }
            }
        }
    }

    /// The hold as a term: what [`SeaOrmLeaseStore::fence`](crate::SeaOrmLeaseStore::fence),
    /// [`fenced_by`](crate::SeaOrmLeaseStore::fenced_by) and
    /// [`execute_fenced`](crate::SeaOrmLeaseStore::execute_fenced) take (`(&guard.term()).into()`
    /// is a [`Term`](crate::Term)), and what a scoped closure gets.
    pub fn term(&self) -> &LeaderTerm {
        &self.term
    }

    /// Fences `txn` with this hold, through the locks' own store: call it first in the
    /// transaction; on [`FenceError::Fenced`](crate::FenceError::Fenced), roll back.
    /// [`FenceError::Unsupported`](crate::FenceError::Unsupported) when the store is not a
    /// [`SeaOrmLeaseStore`](crate::SeaOrmLeaseStore).
    pub async fn fence<C: sea_orm::ConnectionTrait>(
        &self,
        txn: &C,
    ) -> Result<(), crate::error::FenceError> {
        self.term.fence(txn).await
    }

    /// Releases the lock now: `true` when the store released it, `false` when it was already
    /// gone (lost, lapsed or revoked). The lock counts as released from this call on, whatever
    /// the store answers (an error leaves the lease to lapse).
    pub async fn release(mut self) -> Result<bool, LockError> {
        self.released = true;
        if let Some(key) = &self.contended {
            self.holder.yielded(key);
        }
        let resource: Arc<str> = Arc::from(self.term.resource());
        Ok(self.holder.release(&resource, &self.term).await?)
    }
}

impl LockGuard {
    /// Lets the hold lapse as a crashed process's would: it ends here at once and is no longer
    /// renewed, but the store is not told (its lease runs out by itself).
    #[cfg(feature = "jobs")]
    pub(crate) fn abandon(mut self) {
        self.released = true;
        let _ = self.holder.take(self.term.resource(), &self.term);
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        if let Some(key) = &self.contended {
            self.holder.yielded(key);
        }
        // The hold ends now; the release follows on the runtime (without one, it lapses).
        if !self.holder.take(self.term.resource(), &self.term) {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (holder, term) = (self.holder.clone(), self.term.clone());
            runtime.spawn(async move {
                let resource = term.resource().to_owned();
                if let Err(err) = holder.release_taken(&resource, &term).await {
                    tracing::debug!(resource, error = %err, "releasing a dropped lock failed; it lapses");
                }
            });
        }
    }
}
