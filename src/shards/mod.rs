//! Shard sets: many resources spread fairly over the live nodes, one term per resource.
//!
//! A [`ShardSet`] is one node's part in leading a set of resources (`shard-0`..`shard-255`,
//! tenants, queue partitions) together with the other nodes that run a shard set of the same
//! name. Each round (every [`interval`](ShardSetBuilder::interval), 2 s by default) a node:
//!
//! 1. renews **every** lease it holds with one statement
//!    ([`LeaseStore::renew_all`]); a lease that was lost ends only that resource's term;
//! 2. heartbeats into the membership table, with how many of the set's leases it leads
//!    ([`MembershipStore::heartbeat_holding`]), and
//!    reads the live members (database clock);
//! 3. reads which resources nobody leads (one statement per 1,000 resources), unless the
//!    members' counts say none can be (a settled set then reads no lease rows; the counts need
//!    the `AddMemberHolding` migration);
//! 4. hands over what is above its share (plus the slack), or preferred by another member,
//!    and tries to acquire free resources up to its share.
//!
//! With `M` live members that are not draining, a node's share of `N` resources is `N / M`,
//! one more for the first `N % M` members by id: the shares add up to `N`, and no node leads
//! more than `ceil(N / M)` plus the slack (except resources that prefer it, and resources
//! nobody led for a whole lease, which anyone takes). A node that joins gets its share from nodes above
//! theirs, which hand resources over gracefully: the term ends, its work
//! ([`run_per_shard`](ShardHandle::run_per_shard)) gets up to the grace period to return, then
//! the lease is released, so the new node takes it at once (at its next round, or at once on
//! PostgreSQL with release notifications) with a higher token. The resources of a node that
//! died are free when their leases lapse, and are taken within the lease plus one round.
//!
//! Every resource keeps its own term and fencing token exactly as with an [`Elector`](crate::Elector):
//! each led resource is a [`LeaderTerm`] (`token()`, `lost()`, `fence(&txn)`). Membership only
//! steers who *tries* to lead what: the leases decide, so a stale view of the members can delay
//! or unbalance an assignment, never grant a resource twice. Member ids must be unique per
//! process (the default is); the rest of the rules, with figures, are in `docs/shard-sets.md`.
//!
//! ```
//! use std::time::Duration;
//! use orion_beacon::{InMemoryLeaseStore, ShardSet};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = InMemoryLeaseStore::new(); // or a SeaOrmLeaseStore on your connection
//! let node = ShardSet::builder(store)
//!     .name("orders")
//!     .resources((0..16).map(|i| format!("shard-{i}")))
//!     .member_id("node-a")
//!     .build()?
//!     .start();
//! node.run_per_shard(|term| async move {
//!     // One task per led resource; it is told to stop when the term ends (`term.lost()`).
//!     term.lost().await;
//! });
//! let mut led = node.watch();
//! led.wait_for(|a| a.led.len() == 16).await?; // alone, it leads all 16
//! node.shutdown().await; // work stops, every lease is released, the node leaves
//! # Ok(()) }
//! ```

mod config;
mod handle;
mod look;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
mod plan;
mod runner;
mod state;
mod watchdog;

use crate::mutex::lock;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

pub use config::{ShardConfigError, DEFAULT_SHARD_INTERVAL, DEFAULT_SLACK};
pub use handle::ShardHandle;

use crate::hold::timing::timing_setter;
use crate::hold::LeaderTerm;
use crate::{membership::MembershipStore, store::LeaseStore};
use config::{Config, Options};

/// A store a shard set can run on: leases and membership (both database stores and the
/// in-memory store are).
pub trait ShardStore: LeaseStore + MembershipStore {}
impl<S: LeaseStore + MembershipStore + ?Sized> ShardStore for S {}

/// What a node of a shard set leads now, published on [`ShardHandle::watch`]. Terms leave
/// `led` as soon as they end.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Assignment {
    /// The resources this node leads, each with its own term.
    pub led: BTreeMap<Arc<str>, LeaderTerm>,
    /// Resources whose handover is under way: their terms ended, their work is returning,
    /// their leases are not released yet.
    pub handing_over: usize,
    /// This node's share at the last round (0 while draining or stopping).
    pub share: usize,
    /// The live members at the last round, this node included, by id.
    pub members: Vec<String>,
    /// Set when the node stopped because the store refused its configuration (a permanent
    /// [`StoreError`](crate::StoreError), e.g. a backend this build does not support): it leads
    /// nothing and tries nothing more.
    pub failed: Option<Arc<crate::error::StoreError>>,
}

impl Assignment {
    /// The resources led whose term is still [current](LeaderTerm::is_current).
    pub fn current(&self) -> impl Iterator<Item = &LeaderTerm> {
        self.led.values().filter(|t| t.is_current())
    }
}

/// Builds a [`ShardSet`]: `ShardSet::builder(store).name("orders").resources(...).build()?`.
#[must_use]
pub struct ShardSetBuilder {
    store: Arc<dyn ShardStore>,
    renewer: crate::hold::renewer::Renewer,
    fence: Option<crate::backend::SeaOrmLeaseStore>,
    options: Options,
}

impl ShardSetBuilder {
    /// The shard set's name (required): nodes with the same name share its resources.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.options.name = Some(name.into());
        self
    }

    /// The resources to spread (required, at least one, each once; every node of the set
    /// should give the same list).
    pub fn resources<I, R>(mut self, resources: I) -> Self
    where
        I: IntoIterator<Item = R>,
        R: Into<String>,
    {
        self.options.resources = resources.into_iter().map(Into::into).collect();
        self
    }

    /// This node's member id, the holder of its leases. Default: host name, process id and a
    /// random suffix. Two nodes with the same id are the *same* member to the store.
    pub fn member_id(mut self, id: impl Into<String>) -> Self {
        self.options.member = Some(id.into());
        self
    }

    timing_setter!(
        /// How long a lease (and a membership heartbeat) lasts without a renew. Default 15 s.
        lease_duration(lease) => options.timing.lease
    );

    timing_setter!(
        /// How often a node runs its round (heartbeat, batched renew, rebalancing). Default 2 s;
        /// twice it must fit in the lease minus the step-down margin.
        interval(interval) => options.timing.renew_interval
    );

    timing_setter!(
        /// How long before a lease would run out (counted from when its renew was sent) a
        /// resource's term ends if it could not be renewed. Default: a tenth of the lease (see
        /// [`ElectorBuilder::step_down_margin`](crate::ElectorBuilder::step_down_margin)).
        step_down_margin(margin) => options.timing.step_down_margin
    );

    timing_setter!(
        /// How long a resource's work may take to return once its term ended for a handover or a
        /// shutdown (the lease is kept renewed meanwhile, then released). Default 5 s.
        grace_period(grace) => options.timing.grace_period
    );

    /// How many resources above its share a node may lead before it hands some over: against
    /// flapping while members come and go. Default 1; at most the number of resources.
    pub fn slack(mut self, slack: usize) -> Self {
        self.options.slack = Some(slack);
        self
    }

    /// Prefers `member` for `resource`: while that member is live and not draining, other
    /// nodes hand the resource over to it, and it takes the resource whatever its share.
    pub fn prefer(mut self, resource: impl Into<String>, member: impl Into<String>) -> Self {
        self.options.prefer.push((resource.into(), member.into()));
        self
    }

    /// Whether shutdown releases the leases (default true), so other nodes take them at once.
    pub fn release_on_shutdown(mut self, release: bool) -> Self {
        self.options.release_on_shutdown = Some(release);
        self
    }

    /// How long the node may go without a store answer (its heartbeat or its batched renew)
    /// before [`ShardHandle::health`] reports it unhealthy. Default: three rounds
    /// ([`interval`](Self::interval) × [`HEALTH_WINDOW_FACTOR`](crate::hold::health::HEALTH_WINDOW_FACTOR)).
    pub fn health_window(mut self, window: Duration) -> Self {
        self.options.health_window = Some(window);
        self
    }

    /// Validates the options (typed errors for an empty set, a resource given twice, a bad
    /// name, more slack than resources, a preference for a resource not in the set) and asks
    /// the store whether it can work at all.
    pub fn build(self) -> Result<ShardSet, ShardConfigError> {
        let config = self.options.validate()?;
        self.store.validate()?;
        Ok(ShardSet {
            store: self.store,
            renewer: self.renewer,
            fence: self.fence,
            config: Arc::new(config),
        })
    }
}

/// One node's part in a shard set, configured and ready to [`start`](Self::start): the
/// resources of the set spread fairly over the live nodes, each with its own term and token,
/// renewed with one statement per round.
///
/// ```
/// use orion_beacon::{InMemoryLeaseStore, ShardSet};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // `ShardSet::builder(SeaOrmLeaseStore::new(db))` on a database, shared by every node.
/// let node = ShardSet::builder(InMemoryLeaseStore::new())
///     .name("orders")
///     .resources((0..16).map(|i| format!("shard-{i}")))
///     .build()?
///     .start();
/// node.run_per_shard(|term| async move {
///     // Work for term.resource(), fenced with term.fence(&txn), until the term ends.
///     term.lost().await;
/// });
/// node.watch().wait_for(|a| a.current().count() == 16).await?; // the only node leads all
/// node.shutdown().await;
/// # Ok(()) }
/// ```
pub struct ShardSet {
    store: Arc<dyn ShardStore>,
    renewer: crate::hold::renewer::Renewer,
    fence: Option<crate::backend::SeaOrmLeaseStore>,
    config: Arc<Config>,
}

/// Per-resource work in flight, so a handover releases a lease only once its work returned.
#[derive(Debug, Default)]
pub(crate) struct Work {
    running: Mutex<BTreeMap<(Arc<str>, i64), usize>>,
    changed: Notify,
}

impl Work {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(Arc<str>, i64), usize>> {
        lock(&self.running)
    }

    fn key(term: &LeaderTerm) -> (Arc<str>, i64) {
        (Arc::from(term.resource()), term.token().get())
    }

    fn start(&self, term: &LeaderTerm) {
        *self.lock().entry(Self::key(term)).or_default() += 1;
    }

    fn finish(&self, term: &LeaderTerm) {
        let mut running = self.lock();
        let key = Self::key(term);
        if let Some(n) = running.get_mut(&key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                running.remove(&key);
            }
        }
        drop(running);
        self.changed.notify_one();
    }

    pub(crate) fn idle(&self, term: &LeaderTerm) -> bool {
        !self.lock().contains_key(&Self::key(term))
    }
}

/// One piece of work in flight, counted in [`Work`] until dropped.
struct Running {
    work: Arc<Work>,
    term: LeaderTerm,
}

impl Running {
    fn start(work: Arc<Work>, term: LeaderTerm) -> Self {
        work.start(&term);
        Self { work, term }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.work.finish(&self.term);
    }
}

/// The round interval, spread a little below `interval` so nodes started together do not run
/// their rounds in lockstep (never above it: the timing rules are checked for `interval`).
pub(crate) fn jittered_interval(interval: Duration) -> Duration {
    crate::random::jittered(interval.mul_f64(0.95), 0.05)
}

/// How the node was asked to stop, and whether it drains.
#[derive(Debug, Clone)]
pub(crate) struct Control {
    pub shutdown: CancellationToken,
    pub abort: CancellationToken,
    pub draining: watch::Sender<bool>,
}

impl ShardSet {
    /// A builder over `store`, shared by every node of the set.
    pub fn builder(store: impl ShardStore + 'static) -> ShardSetBuilder {
        let fence = store.sea_orm_store().cloned();
        ShardSetBuilder {
            renewer: crate::hold::renewer::Renewer::of(&store),
            store: Arc::new(store),
            fence,
            options: Options::default(),
        }
    }

    /// This node's member id.
    pub fn member_id(&self) -> &str {
        &self.config.member
    }

    /// Starts taking part, on the current tokio runtime.
    pub fn start(self) -> ShardHandle {
        let (state, receiver) = watch::channel(Assignment::default());
        let control = Control {
            shutdown: CancellationToken::new(),
            abort: CancellationToken::new(),
            draining: watch::channel(false).0,
        };
        let work = Arc::new(Work::default());
        let health = Arc::new(crate::hold::health::HealthState::new(
            self.config.health_window,
        ));
        let runner = runner::Runner {
            health: health.clone(),
            store: self.store,
            renewer: self.renewer,
            config: self.config.clone(),
            state,
            control: control.clone(),
            work: work.clone(),
            fence: self.fence,
        };
        let (finished, done) = watch::channel(false);
        tokio::spawn(async move {
            runner.run().await;
            finished.send_replace(true);
        });
        ShardHandle {
            config: self.config,
            receiver,
            control,
            work,
            done,
            health,
        }
    }
}

/// The options and the store's backend; never the store's connection.
impl std::fmt::Debug for ShardSetBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardSetBuilder")
            .field("options", &self.options)
            .field("backend", &self.fence.as_ref().map(|s| s.backend_name()))
            .finish_non_exhaustive()
    }
}

/// The settings and the store's backend; never the store's connection.
impl std::fmt::Debug for ShardSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardSet")
            .field("name", &&*self.config.name)
            .field("member", &&*self.config.member)
            .field("resources", &self.config.resources.len())
            .field("lease", &self.config.timing.lease)
            .field("interval", &self.config.timing.renew_interval)
            .field("backend", &self.fence.as_ref().map(|s| s.backend_name()))
            .finish_non_exhaustive()
    }
}
