//! [`ShardHandle`]: a running shard set node, what it leads, and how it stops.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::config::Config;
use super::{Assignment, Control, Running, Work};
use crate::hold::LeaderTerm;

/// A running node of a shard set. Dropping it stops the node gracefully without waiting;
/// [`shutdown`](Self::shutdown) waits.
///
/// What a service asks it: [`assignment`](Self::assignment) and [`term`](Self::term) now,
/// [`watch`](Self::watch) for changes, [`health`](Self::health) for probes,
/// [`run_per_shard`](Self::run_per_shard) for the work, [`drain`](Self::drain) before a deploy
/// (see [`ShardSet`](super::ShardSet) for a whole example).
///
/// ```
/// # use orion_beacon::{InMemoryLeaseStore, ShardSet};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let node = ShardSet::builder(InMemoryLeaseStore::new())
///     .name("orders")
///     .resources(["shard-0", "shard-1"])
///     .build()?
///     .start();
/// // Alone in the set, it comes to lead both.
/// node.watch().wait_for(|a| a.current().count() == 2).await?;
/// let term = node.term("shard-0").expect("led");
/// assert!(term.is_current());
/// node.drain().await; // hands everything over, leads nothing
/// assert_eq!(node.assignment().current().count(), 0);
/// node.shutdown().await;
/// # Ok(()) }
/// ```
pub struct ShardHandle {
    pub(super) config: Arc<Config>,
    pub(super) receiver: watch::Receiver<Assignment>,
    pub(super) control: Control,
    pub(super) work: Arc<Work>,
    pub(super) done: watch::Receiver<bool>,
    pub(super) health: Arc<crate::hold::health::HealthState>,
}

impl ShardHandle {
    /// What this node leads, as it changes. Reads return copies, so a reader never holds up
    /// the node's rounds (see [`Watch`](crate::Watch)).
    pub fn watch(&self) -> crate::watch::Watch<Assignment> {
        crate::watch::Watch::new(self.receiver.clone())
    }

    /// What this node leads now.
    pub fn assignment(&self) -> Assignment {
        self.receiver.borrow().clone()
    }

    /// The current term of `resource`, if this node leads it right now.
    pub fn term(&self, resource: &str) -> Option<LeaderTerm> {
        self.receiver
            .borrow()
            .led
            .get(resource)
            .filter(|t| t.is_current())
            .cloned()
    }

    /// This node's member id.
    pub fn member_id(&self) -> &str {
        &self.config.member
    }

    /// Runs `work` once per term of every resource this node leads, each in its own task; a
    /// later term of the same resource runs it again. The returned task ends when the node
    /// stops.
    ///
    /// As with [`ElectorHandle::run_as_leader`](crate::ElectorHandle::run_as_leader): work never
    /// runs past its lease. A term that is lost (denied, deadline) drops its work at once; a
    /// term that ends for a handover, a drain or a shutdown fires [`lost`](LeaderTerm::lost)
    /// and its work gets up to the grace period to return while the lease is kept renewed; the
    /// lease is released only after the work has stopped.
    pub fn run_per_shard<F, Fut>(&self, work: F) -> JoinHandle<()>
    where
        F: Fn(LeaderTerm) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut receiver = self.receiver.clone();
        let tracker = self.work.clone();
        let work = Arc::new(work);
        tokio::spawn(async move {
            let mut started: BTreeMap<Arc<str>, LeaderTerm> = BTreeMap::new();
            loop {
                let fresh: Vec<LeaderTerm> = {
                    let assignment = receiver.borrow_and_update();
                    started.retain(|r, t| assignment.led.get(r) == Some(t));
                    assignment
                        .led
                        .iter()
                        .filter(|(r, t)| started.get(*r) != Some(*t) && t.is_current())
                        .map(|(_, t)| t.clone())
                        .collect()
                };
                for term in fresh {
                    started.insert(Arc::from(term.resource()), term.clone());
                    // Registered before the term is looked at again: a handover that found no
                    // work running ended the term first, so this check then sees it ended.
                    let running = Running::start(tracker.clone(), term.clone());
                    if !term.is_current() {
                        continue;
                    }
                    let work = work.clone();
                    tokio::spawn(async move {
                        let _running = running; // finished on drop, panics included
                        if !term.is_current() {
                            return;
                        }
                        let fut = work(term.clone());
                        tokio::select! {
                            biased;
                            _ = term.cut_off_signal() => {
                                tracing::warn!(resource = term.resource(), token = %term.token(), reason = ?term.loss_reason(), "shard work dropped: the lease no longer covers it");
                            }
                            _ = fut => {}
                        }
                    });
                }
                if receiver.changed().await.is_err() {
                    return; // the node stopped
                }
            }
        })
    }

    /// [`run_per_shard`](Self::run_per_shard) with a context that each term's work gets its
    /// own clone of, so a `move` closure needs no clone-inside-a-clone:
    ///
    /// ```
    /// # use orion_beacon::{InMemoryLeaseStore, ShardSet};
    /// # #[derive(Clone)] struct Db;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let db = Db;
    /// let node = ShardSet::builder(InMemoryLeaseStore::new())
    ///     .name("orders")
    ///     .resources((0..4).map(|i| format!("shard-{i}")))
    ///     .build()?
    ///     .start();
    /// node.run_per_shard_with(db.clone(), |term, db| async move {
    ///     // `db` is this term's own clone; `term.fence(&txn)` guards its writes.
    ///     let _ = (term.resource(), db);
    /// });
    /// # node.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub fn run_per_shard_with<C, F, Fut>(&self, context: C, work: F) -> JoinHandle<()>
    where
        C: Clone + Send + Sync + 'static,
        F: Fn(LeaderTerm, C) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.run_per_shard(move |term| work(term, context.clone()))
    }

    /// For a readiness or liveness probe: whether the node heard from its store (a heartbeat
    /// or a batched renew answered) within its [health
    /// window](super::ShardSetBuilder::health_window), as [`ElectorHandle::health`](crate::ElectorHandle::health)
    /// says it for an elector; `leader` is whether the node leads any resource now. A node
    /// stopped because the store refused its configuration is never healthy.
    ///
    /// ```
    /// # use orion_beacon::{InMemoryLeaseStore, ShardSet};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let node = ShardSet::builder(InMemoryLeaseStore::new())
    ///     .name("orders")
    ///     .resources(["a", "b"])
    ///     .build()?
    ///     .start();
    /// assert!(node.health().healthy); // within the window of the start
    /// # node.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub fn health(&self) -> crate::hold::health::Health {
        let (failed, leads) = {
            let assignment = self.receiver.borrow();
            let leads = assignment.current().next().is_some();
            (assignment.failed.clone(), leads)
        };
        self.health.health(failed.as_deref(), leads)
    }

    /// Drains this node: it tells the other members (its heartbeat says so), then hands every
    /// resource over (the terms end, work gets the grace period, the leases are released) and
    /// takes none, while it stays a member until shut down. The returned future (which
    /// borrows nothing) resolves once the node leads nothing.
    pub fn drain(&self) -> impl Future<Output = ()> + Send + 'static {
        self.control.draining.send_replace(true);
        let mut receiver = self.receiver.clone();
        async move {
            let _ = receiver
                .wait_for(|a| a.led.is_empty() && a.handing_over == 0 && a.share == 0)
                .await;
        }
    }

    /// Stops the node: every term ends (work gets the grace period, the leases are kept
    /// renewed meanwhile), the leases are released (unless disabled), the node leaves the
    /// membership, and its task ends. The returned future waits for all of it.
    pub fn shutdown(&self) -> impl Future<Output = ()> + Send + 'static {
        self.control.shutdown.cancel();
        self.finished()
    }

    /// Stops the node at once, as if the process had died: terms are marked lost locally,
    /// work is dropped, nothing is released and the membership lapses in the store.
    pub fn abort(&self) -> impl Future<Output = ()> + Send + 'static {
        self.control.abort.cancel();
        self.finished()
    }

    fn finished(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut done = self.done.clone();
        async move {
            let _ = done.wait_for(|finished| *finished).await;
        }
    }
}

impl Drop for ShardHandle {
    fn drop(&mut self) {
        self.control.shutdown.cancel();
    }
}

/// Name, member and what the node leads now.
impl std::fmt::Debug for ShardHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardHandle")
            .field("name", &&*self.config.name)
            .field("member", &&*self.config.member)
            .field("assignment", &*self.receiver.borrow())
            .field("stopped", &*self.done.borrow())
            .finish_non_exhaustive()
    }
}
