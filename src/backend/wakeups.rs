//! Wake-ups: how a release anywhere reaches this process's waiters sooner than their next
//! poll. A backend that has them hands its engine a [`Wakeups`] when it is chosen (off where
//! they cannot work: a setting, a transaction-pooling proxy, a Galera node); the engine tells
//! them what the store's answers said and waiters subscribe through it. Nothing of this is on
//! the lease trait, and a backend without wake-ups has none to call.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::context::Context;
use crate::lease::{Denial, LeaseOutcome};
use crate::store::ReleaseEvents;

/// A backend's wake-ups, of one of two kinds.
pub(crate) enum Wakeups {
    /// Release events the database sends on its own (PostgreSQL's notifications, SQLite's
    /// file changes).
    #[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
    Events(Arc<dyn ReleaseSource>),
    /// Release events that follow the leases this store holds and waits for (MySQL's named
    /// locks): told every answer, and what each waiter waits for.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    Following(Arc<dyn FollowsLeases>),
}

/// A source of release events for the engine's table.
pub(crate) trait ReleaseSource: Send + Sync {
    /// A receiver of the table's releases, or `None` where none can be had now.
    fn subscribe(&self, cx: &Context) -> Option<ReleaseEvents>;
}

/// Wake-ups that need to know which leases this store holds and which its waiters wait for.
pub(crate) trait FollowsLeases: ReleaseSource {
    /// `candidate` holds `resource` for `remaining` (a grant or renew answered, committed).
    fn holding(&self, cx: &Context, resource: &str, candidate: &str, remaining: Duration);
    /// `candidate` was denied `resource` by `by` (the holder the answer named).
    fn denied(&self, cx: &Context, resource: &str, candidate: &str, by: &Denial);
    /// What the store answered `candidate`'s acquire of `resource`.
    fn answered(&self, cx: &Context, resource: &str, candidate: &str, outcome: &LeaseOutcome) {
        match outcome {
            LeaseOutcome::Acquired(lease) | LeaseOutcome::Renewed(lease) => {
                self.holding(cx, resource, candidate, lease.remaining);
            }
            LeaseOutcome::Denied(by) => self.denied(cx, resource, candidate, by),
        }
    }
    /// `candidate`'s lease of `resource` ended here (released, or found lost).
    fn ended(&self, cx: &Context, resource: &str, candidate: &str);
    /// A waiter waits for a release of `resources` until `until`: watched while the guard
    /// lives.
    fn waiting(
        &self,
        cx: &Context,
        resources: &[Arc<str>],
        until: Instant,
    ) -> Option<Box<dyn Send>>;
}

impl Wakeups {
    /// A receiver of the table's releases.
    pub(crate) fn subscribe(&self, cx: &Context) -> Option<ReleaseEvents> {
        match self {
            Wakeups::Events(source) => source.subscribe(cx),
            Wakeups::Following(follows) => follows.subscribe(cx),
        }
    }

    /// The wake-ups that follow leases, if these do.
    pub(crate) fn following(&self) -> Option<&dyn FollowsLeases> {
        match self {
            Wakeups::Events(_) => None,
            Wakeups::Following(follows) => Some(&**follows),
        }
    }
}
