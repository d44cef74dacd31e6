//! One test double for the store traits: a [`Double`] passes every call on to an inner store
//! (the in-memory one unless said otherwise) except the ones its [`Intercept`] changes, so a
//! test writes only the calls it intercepts:
//!
//! ```ignore
//! #[derive(Clone)]
//! struct Slow(Duration);
//!
//! #[async_trait]
//! impl Intercept for Slow {
//!     async fn acquire_or_renew(
//!         &self,
//!         inner: &InMemoryLeaseStore,
//!         r: &str,
//!         c: &str,
//!         lease: Duration,
//!     ) -> Result<LeaseOutcome, StoreError> {
//!         tokio::time::sleep(self.0).await;
//!         inner.acquire_or_renew(r, c, lease).await
//!     }
//! }
//!
//! let store = Double::new(Slow(Duration::from_millis(15)));
//! ShardSet::builder(store.clone()) // ...
//! store.inner.current("shard-0").await?; // the store itself, past the intercept
//! ```
//!
//! The double dereferences to its intercept, so a test reaches the intercept's switches and
//! logs as `store.log`, `store.hang(..)`.
//!
//! Included on its own by the benchmark (`#[path]`): it uses nothing else of `common`.

use std::ops::Deref;
use std::time::Duration;

use orion_beacon::store::validate_resource;
use orion_beacon::{
    store::async_trait, store::LeaseOutcome, store::ReleaseEvents, store::Renewals, FencingToken,
    Holding, InMemoryLeaseStore, Lease, LeaseRecord, LeaseStore, Member, MembershipStore,
    StoreError,
};

/// The calls of [`LeaseStore`] and [`MembershipStore`], each given the inner store first. Every
/// default passes the call on to `inner` unchanged, with one exception: `current_all` is the
/// trait's own default (one [`current`](Self::current) per resource, through this intercept),
/// so intercepting `current` covers it too, as it does for a hand-written wrapper.
///
/// For a store that pushes no release notifications (followers and nodes then only poll, as
/// behind a wrapper that does not pass them on), override
/// [`release_events`](Self::release_events) to return `None`.
#[async_trait]
pub trait Intercept<S = InMemoryLeaseStore>: Send + Sync
where
    S: LeaseStore + MembershipStore + 'static,
{
    async fn acquire_or_renew(
        &self,
        inner: &S,
        resource: &str,
        candidate: &str,
        lease: Duration,
    ) -> Result<LeaseOutcome, StoreError> {
        inner.acquire_or_renew(resource, candidate, lease).await
    }

    /// An acquire with a payload (one without goes to
    /// [`acquire_or_renew`](Self::acquire_or_renew)).
    async fn acquire_or_renew_with(
        &self,
        inner: &S,
        resource: &str,
        candidate: &str,
        lease: Duration,
        payload: &str,
    ) -> Result<LeaseOutcome, StoreError> {
        inner
            .acquire_or_renew_with(resource, candidate, lease, Some(payload))
            .await
    }

    async fn release(
        &self,
        inner: &S,
        resource: &str,
        candidate: &str,
    ) -> Result<bool, StoreError> {
        inner.release(resource, candidate).await
    }

    async fn release_lease(&self, inner: &S, lease: &Lease) -> Result<bool, StoreError> {
        inner.release_lease(lease).await
    }

    async fn renew_all(
        &self,
        inner: &S,
        held: &[Lease],
        lease: Duration,
    ) -> Result<Renewals, StoreError> {
        inner.renew_all(held, lease).await
    }

    async fn current(&self, inner: &S, resource: &str) -> Result<Option<LeaseRecord>, StoreError> {
        inner.current(resource).await
    }

    async fn offer(
        &self,
        inner: &S,
        lease: &Lease,
        to: &str,
        within: Duration,
    ) -> Result<bool, StoreError> {
        inner.offer(lease, to, within).await
    }

    async fn take_offer(
        &self,
        inner: &S,
        resource: &str,
        candidate: &str,
        token: FencingToken,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        inner.take_offer(resource, candidate, token, lease).await
    }

    /// [`LeaseStore::current_all`]'s default, over this intercept's `current`.
    async fn current_all(
        &self,
        inner: &S,
        resources: &[String],
    ) -> Result<Vec<LeaseRecord>, StoreError> {
        for resource in resources {
            validate_resource(resource)?;
        }
        let mut records = Vec::with_capacity(resources.len());
        for resource in resources {
            records.extend(self.current(inner, resource).await?);
        }
        Ok(records)
    }

    fn release_events(&self, inner: &S) -> Option<ReleaseEvents> {
        inner.release_events()
    }

    fn validate(&self, inner: &S) -> Result<(), StoreError> {
        inner.validate()
    }

    /// Where ranked electors keep their candidacy: the inner store's, unless intercepted.
    fn membership(&self, inner: &S) -> Option<std::sync::Arc<dyn MembershipStore>> {
        inner.membership()
    }

    async fn heartbeat(
        &self,
        inner: &S,
        shard_set: &str,
        member: &str,
        ttl: Duration,
        draining: bool,
    ) -> Result<Vec<Member>, StoreError> {
        inner.heartbeat(shard_set, member, ttl, draining).await
    }

    async fn heartbeat_holding(
        &self,
        inner: &S,
        shard_set: &str,
        member: &str,
        ttl: Duration,
        draining: bool,
        holding: Holding,
    ) -> Result<Vec<Member>, StoreError> {
        // Passed on with the counts: an intercept that overrides `heartbeat` must override
        // this one too (the shard set's rounds call this one).
        inner
            .heartbeat_holding(shard_set, member, ttl, draining, holding)
            .await
    }

    async fn leave(&self, inner: &S, shard_set: &str, member: &str) -> Result<bool, StoreError> {
        inner.leave(shard_set, member).await
    }

    async fn members(&self, inner: &S, shard_set: &str) -> Result<Vec<Member>, StoreError> {
        inner.members(shard_set).await
    }
}

/// A store made of `inner` and the `intercept` its calls go through. Clones share what `inner`
/// and `intercept` share (the in-memory store's clones share its leases).
#[derive(Clone, Default)]
pub struct Double<I, S = InMemoryLeaseStore> {
    /// The store behind the intercept: a test arranges and checks it directly.
    pub inner: S,
    pub intercept: I,
}

impl<I> Double<I> {
    /// `intercept` over a new in-memory store.
    pub fn new(intercept: I) -> Self {
        Self {
            inner: InMemoryLeaseStore::new(),
            intercept,
        }
    }
}

impl<I, S> Double<I, S> {
    /// `intercept` over `inner`.
    pub fn over(inner: S, intercept: I) -> Self {
        Self { inner, intercept }
    }
}

impl<I, S> Deref for Double<I, S> {
    type Target = I;

    fn deref(&self) -> &I {
        &self.intercept
    }
}

#[async_trait]
impl<I, S> LeaseStore for Double<I, S>
where
    I: Intercept<S>,
    S: LeaseStore + MembershipStore + 'static,
{
    async fn acquire_or_renew(
        &self,
        resource: &str,
        candidate: &str,
        lease: Duration,
    ) -> Result<LeaseOutcome, StoreError> {
        self.intercept
            .acquire_or_renew(&self.inner, resource, candidate, lease)
            .await
    }

    async fn acquire_or_renew_with(
        &self,
        resource: &str,
        candidate: &str,
        lease: Duration,
        payload: Option<&str>,
    ) -> Result<LeaseOutcome, StoreError> {
        match payload {
            None => self.acquire_or_renew(resource, candidate, lease).await,
            Some(payload) => {
                self.intercept
                    .acquire_or_renew_with(&self.inner, resource, candidate, lease, payload)
                    .await
            }
        }
    }

    async fn release(&self, resource: &str, candidate: &str) -> Result<bool, StoreError> {
        self.intercept
            .release(&self.inner, resource, candidate)
            .await
    }

    async fn release_lease(&self, lease: &Lease) -> Result<bool, StoreError> {
        self.intercept.release_lease(&self.inner, lease).await
    }

    async fn renew_all(&self, held: &[Lease], lease: Duration) -> Result<Renewals, StoreError> {
        self.intercept.renew_all(&self.inner, held, lease).await
    }

    async fn current(&self, resource: &str) -> Result<Option<LeaseRecord>, StoreError> {
        self.intercept.current(&self.inner, resource).await
    }

    async fn offer(&self, lease: &Lease, to: &str, within: Duration) -> Result<bool, StoreError> {
        self.intercept.offer(&self.inner, lease, to, within).await
    }

    async fn take_offer(
        &self,
        resource: &str,
        candidate: &str,
        token: FencingToken,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.intercept
            .take_offer(&self.inner, resource, candidate, token, lease)
            .await
    }

    async fn current_all(&self, resources: &[String]) -> Result<Vec<LeaseRecord>, StoreError> {
        self.intercept.current_all(&self.inner, resources).await
    }

    fn release_events(&self) -> Option<ReleaseEvents> {
        self.intercept.release_events(&self.inner)
    }

    fn validate(&self) -> Result<(), StoreError> {
        self.intercept.validate(&self.inner)
    }

    fn membership(&self) -> Option<std::sync::Arc<dyn MembershipStore>> {
        self.intercept.membership(&self.inner)
    }
}

#[async_trait]
impl<I, S> MembershipStore for Double<I, S>
where
    I: Intercept<S>,
    S: LeaseStore + MembershipStore + 'static,
{
    async fn heartbeat(
        &self,
        shard_set: &str,
        member: &str,
        ttl: Duration,
        draining: bool,
    ) -> Result<Vec<Member>, StoreError> {
        self.intercept
            .heartbeat(&self.inner, shard_set, member, ttl, draining)
            .await
    }

    async fn heartbeat_holding(
        &self,
        shard_set: &str,
        member: &str,
        ttl: Duration,
        draining: bool,
        holding: Holding,
    ) -> Result<Vec<Member>, StoreError> {
        self.intercept
            .heartbeat_holding(&self.inner, shard_set, member, ttl, draining, holding)
            .await
    }

    async fn leave(&self, shard_set: &str, member: &str) -> Result<bool, StoreError> {
        self.intercept.leave(&self.inner, shard_set, member).await
    }

    async fn members(&self, shard_set: &str) -> Result<Vec<Member>, StoreError> {
        self.intercept.members(&self.inner, shard_set).await
    }
}
