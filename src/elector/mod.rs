//! The elector: keeps one candidate elected per resource on any [`LeaseStore`].

pub(crate) mod config;
mod decision;
mod handover;
mod health;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
mod preference;
mod runner;

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{watch, RwLock};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use crate::hold::health::{Health, HEALTH_WINDOW_FACTOR};
pub use crate::hold::timing::{
    min_step_down_margin, ConfigError, DEFAULT_GRACE_PERIOD, DEFAULT_JITTER,
    DEFAULT_LEASE_DURATION, DEFAULT_RENEW_INTERVAL, DEFAULT_RETRY_INTERVAL,
    MAX_CLOCK_RATE_DIFFERENCE, MAX_INTERVAL, MIN_STEP_DOWN_MARGIN,
};
pub use crate::hold::{LeaderTerm, Leadership, LossReason};
pub use handover::Handover;
pub use preference::Candidacy;

use crate::hold::timing::timing_setter;
use crate::{fencing::FencingToken, memory::InMemoryLeaseStore, store::LeaseStore};
use config::{Config, Options};
use runner::{Runner, StepDown, Stop};

mod builder;
pub use builder::ElectorBuilder;

/// A configured elector, ready to [`start`](Self::start): keeps one candidate of all the
/// processes that elect for a resource its leader, with a fencing token per term.
///
/// ```
/// use std::time::Duration;
///
/// use orion_beacon::Elector;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // `Elector::builder(SeaOrmLeaseStore::new(db))` on a database; in memory for one process.
/// let elector = Elector::builder_in_memory()
///     .resource("nightly-report")
///     .lease_duration(Duration::from_secs(15))
///     .build()?;
/// let handle = elector.start();
/// handle.run_as_leader(|term| async move {
///     // The leader's work; pass term.token() downstream, fence writes with term.fence(&txn).
///     term.lost().await;
/// });
/// handle.watch().wait_for(|state| state.is_leader()).await?;
/// handle.shutdown().await;
/// # Ok(()) }
/// ```
pub struct Elector {
    store: Arc<dyn LeaseStore>,
    fence: Option<crate::backend::SeaOrmLeaseStore>,
    renewer: Option<crate::hold::renewer::Renewer>,
    config: Arc<Config>,
    health_window: Duration,
    /// Where a ranked candidate heartbeats (`ElectorBuilder::rank`).
    members: Option<Arc<dyn crate::MembershipStore>>,
}

fn process_store() -> InMemoryLeaseStore {
    static STORE: OnceLock<InMemoryLeaseStore> = OnceLock::new();
    STORE.get_or_init(InMemoryLeaseStore::new).clone()
}

impl Elector {
    /// A builder over `store`, the place every candidate of the resource shares.
    pub fn builder(store: impl LeaseStore + 'static) -> ElectorBuilder {
        let fence = store.sea_orm_store().cloned();
        // Renews go out in batches only on a `SeaOrmLeaseStore` itself: a wrapper sees every
        // call it forwards.
        let renewer = crate::hold::renewer::Renewer::for_electors(&store);
        ElectorBuilder {
            store: Arc::new(store),
            fence,
            renewer,
            options: Options::default(),
            health_window: None,
        }
    }

    /// A builder over the process-wide in-memory store: electors in this process contend with
    /// each other, not with other processes.
    pub fn builder_in_memory() -> ElectorBuilder {
        Self::builder(process_store())
    }

    /// This elector's candidate id.
    pub fn candidate_id(&self) -> &str {
        &self.config.candidate
    }

    /// The resource.
    pub fn resource(&self) -> &str {
        &self.config.resource
    }

    /// How often the leader renews its lease.
    #[cfg(feature = "jobs")]
    pub(crate) fn renew_interval(&self) -> std::time::Duration {
        self.config.timing.renew_interval
    }

    /// The lease, renew interval and step-down margin the elector holds its term by.
    #[cfg(feature = "jobs")]
    pub(crate) fn timing(&self) -> crate::hold::timing::Timing {
        self.config.timing
    }

    /// Starts contending, on the current tokio runtime (like `tokio::spawn`, this must be
    /// called from within one).
    pub fn start(self) -> ElectorHandle {
        let (state, receiver) = watch::channel(Leadership::Starting);
        let stop = Stop {
            shutdown: CancellationToken::new(),
            abort: CancellationToken::new(),
            step_down: Arc::default(),
        };
        let work_gate = Arc::new(RwLock::new(()));
        let probe = health::Probe::new(&self.config, self.health_window);
        let (ranking, candidacy) = match (self.members, self.config.rank) {
            (Some(members), Some(rank)) => {
                let timing = &self.config.timing;
                let (ranking, view) = preference::Ranking::new(
                    members,
                    rank,
                    self.config.prefer_after,
                    (
                        timing.lease,
                        preference::candidacy_ttl(timing.lease, timing.step_down_margin),
                        timing.renew_interval,
                        preference::offer_window(
                            self.config.retry_interval,
                            self.config.jitter,
                            timing.lease,
                        ),
                    ),
                );
                (Some(Arc::new(ranking)), Some(view))
            }
            _ => (None, None),
        };
        let runner = Runner {
            store: self.store,
            config: self.config.clone(),
            state,
            stop: stop.clone(),
            work_gate: work_gate.clone(),
            probe: probe.clone(),
            fence: self.fence,
            renewer: self.renewer,
            ranking,
        };
        let (finished, done) = watch::channel(false);
        let supervised = probe.clone().supervise(runner.run());
        tokio::spawn(async move {
            supervised.await;
            finished.send_replace(true);
        });
        ElectorHandle {
            config: self.config,
            receiver,
            stop,
            work_gate,
            done,
            probe,
            candidacy,
        }
    }
}

/// A running elector. Dropping it stops the elector (gracefully: work ends, the lease is
/// released) without waiting; [`shutdown`](Self::shutdown) waits.
///
/// What a service asks it: [`is_leader`](Self::is_leader) and [`token`](Self::token) now,
/// [`watch`](Self::watch) for changes, [`health`](Self::health) for probes, and
/// [`run_as_leader`](Self::run_as_leader) for the work (see [`Elector`] for a whole example).
///
/// ```
/// # use orion_beacon::Elector;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let handle = Elector::builder_in_memory().resource("nightly-report").build()?.start();
/// let leading = handle.watch().wait_for(|l| l.is_leader()).await?;
/// assert!(handle.is_leader());
/// assert_eq!(handle.token(), leading.term().map(|t| t.token()));
/// handle.shutdown().await; // the work ends, the lease is released
/// assert!(!handle.is_leader());
/// # Ok(()) }
/// ```
pub struct ElectorHandle {
    config: Arc<Config>,
    receiver: watch::Receiver<Leadership>,
    stop: Stop,
    work_gate: Arc<RwLock<()>>,
    /// Turns `true` when the elector's task has ended.
    done: watch::Receiver<bool>,
    probe: health::Probe,
    /// A ranked candidate's view of its election.
    candidacy: Option<watch::Receiver<Candidacy>>,
}

impl ElectorHandle {
    /// The leadership state as it changes. Reads return copies, so a reader never holds up
    /// the elector (see [`Watch`](crate::Watch)).
    pub fn watch(&self) -> crate::watch::Watch<Leadership> {
        crate::watch::Watch::new(self.receiver.clone())
    }

    /// The state now.
    pub fn leadership(&self) -> Leadership {
        self.receiver.borrow().clone()
    }

    /// Whether this candidate leads *right now*: a leader state whose term is not lost and
    /// whose local deadline has not passed.
    pub fn is_leader(&self) -> bool {
        self.receiver.borrow().is_leader()
    }

    /// The current term's fencing token, while [`is_leader`](Self::is_leader).
    pub fn token(&self) -> Option<FencingToken> {
        match &*self.receiver.borrow() {
            Leadership::Leader(term) if term.is_current() => Some(term.token()),
            _ => None,
        }
    }

    /// Health for a readiness or liveness probe: unhealthy when the elector has not completed a
    /// store round trip within the health window, whether or not it leads.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let handle = orion_beacon::Elector::builder_in_memory()
    ///     .resource("health-doc")
    ///     .build()?
    ///     .start();
    /// let health = handle.health();
    /// assert!(health.healthy); // within the window of the start
    /// # Ok(()) }
    /// ```
    pub fn health(&self) -> Health {
        let failure = match &*self.receiver.borrow() {
            Leadership::Failed(err) => Some(err.clone()),
            _ => None,
        };
        let mut health = self.probe.health(failure.as_deref(), self.is_leader());
        health.candidacy = self.candidacy();
        health
    }

    /// A ranked candidate's view of its election ([`ElectorBuilder::rank`]): its rank and the
    /// live candidates with theirs as its last candidacy heartbeat found them (every renew
    /// interval), or why that heartbeat failed. `None` for an unranked elector.
    pub fn candidacy(&self) -> Option<Candidacy> {
        self.candidacy.as_ref().map(|view| view.borrow().clone())
    }

    /// This candidate's id.
    pub fn candidate_id(&self) -> &str {
        &self.config.candidate
    }

    /// The resource.
    pub fn resource(&self) -> &str {
        &self.config.resource
    }

    /// Runs `work` once per term while this candidate leads; a later term runs `work` again.
    /// The returned task ends when the elector stops.
    ///
    /// Work never runs past the lease. When a term is lost (denied, deadline, superseded,
    /// aborted), the lease no longer covers it, so the future is dropped at once. On
    /// [`shutdown`](Self::shutdown), the term's [`lost`](LeaderTerm::lost) fires and the work
    /// gets up to the grace period to return while the elector keeps renewing the lease; it is
    /// released only after the work has stopped. Work is only started on a term that is
    /// [current](LeaderTerm::is_current).
    ///
    /// Code after `term.lost().await` therefore runs only on a shutdown: cleanup that must run
    /// however the term ends belongs in a value's `Drop`, made first thing in the work (see
    /// "Cleanup when a term ends" in the elector guide).
    pub fn run_as_leader<F, Fut>(&self, work: F) -> JoinHandle<()>
    where
        F: Fn(LeaderTerm) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut receiver = self.receiver.clone();
        let gate = self.work_gate.clone();
        tokio::spawn(async move {
            // Terms are told apart by identity. Each also has a token above every earlier term's:
            // a lease the store renews after a local step-down (a renew held up past the
            // deadline, say) is released, never taken up as a new term on the old token.
            let mut last: Option<LeaderTerm> = None;
            loop {
                let term = {
                    let Ok(state) = receiver
                        .wait_for(|s| matches!(s, Leadership::Leader(t) if last.as_ref() != Some(t) && !t.is_lost()))
                        .await
                    else {
                        return; // the elector stopped
                    };
                    match &*state {
                        Leadership::Leader(term) => term.clone(),
                        _ => continue,
                    }
                };
                last = Some(term.clone());
                let _running = gate.read().await;
                if !term.is_current() {
                    continue; // ended, or past its deadline, before the work could start
                }
                let fut = work(term.clone());
                tokio::pin!(fut);
                tokio::select! {
                    biased;
                    _ = term.cut_off_signal() => {
                        tracing::warn!(token = %term.token(), reason = ?term.loss_reason(), "leader work dropped: the lease no longer covers it");
                    }
                    _ = &mut fut => {}
                }
            }
        })
    }

    /// [`run_as_leader`](Self::run_as_leader) with a context that each term's work gets its
    /// own clone of, so a `move` closure needs no clone-inside-a-clone:
    ///
    /// ```
    /// # use orion_beacon::Elector;
    /// # #[derive(Clone)] struct Db;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let db = Db;
    /// let handle = Elector::builder_in_memory().resource("nightly").build()?.start();
    /// handle.run_as_leader_with(db.clone(), |term, db| async move {
    ///     // `db` is this term's own clone; `term.fence(&txn)` guards its writes.
    ///     let _ = (term.token(), db);
    /// });
    /// # handle.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub fn run_as_leader_with<C, F, Fut>(&self, context: C, work: F) -> JoinHandle<()>
    where
        C: Clone + Send + Sync + 'static,
        F: Fn(LeaderTerm, C) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.run_as_leader(move |term| work(term, context.clone()))
    }

    /// Stops the elector: the term ends (`is_leader()` turns false and the term's
    /// [`lost`](LeaderTerm::lost) fires), its work gets up to the grace period to return while
    /// the lease is kept renewed, then the lease is released (unless disabled) so another
    /// candidate takes over at once, and the elector stops.
    ///
    /// The stop is requested when this is called; the returned future (which borrows nothing,
    /// so it can be spawned, and the handle can sit behind an `Arc`) waits until it is done.
    pub fn shutdown(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.stop.shutdown.cancel();
        self.finished()
    }

    /// Steps down for a planned handover: if this candidate leads, its term ends as on a
    /// [`shutdown`](Self::shutdown) (`is_leader()` turns false, the term's
    /// [`lost`](LeaderTerm::lost) fires with [`LossReason::HandedOver`], its work gets up to
    /// the grace period while the lease is kept renewed), then the lease is released, so
    /// another candidate takes over in one handover (woken by the release notification where
    /// the store has them, otherwise at its next retry), not after a lease. Leader or not, this
    /// candidate then stays out of the contest for `stay_out` (no attempt, whatever it hears)
    /// and contends again after it, for a new term with a higher token.
    ///
    /// The step-down is asked for at the call; the future resolves to whether it ended a term
    /// (`false` for a follower, or once the elector has stopped). A `stay_out` longer than
    /// [`MAX_INTERVAL`] is refused before anything happens.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use orion_beacon::Elector;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let handle = Elector::builder_in_memory().resource("planned").build()?.start();
    /// handle.watch().wait_for(|l| l.is_leader()).await?;
    /// // Before a deploy of this instance: let another candidate lead now.
    /// assert!(handle.step_down(Duration::from_secs(30)).await?);
    /// assert!(!handle.is_leader());
    /// # handle.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub fn step_down(
        &self,
        stay_out: Duration,
    ) -> impl std::future::Future<Output = Result<bool, ConfigError>> + Send + 'static {
        let asked = self.ask_step_down(stay_out, None);
        async move {
            // The elector gone before it answered: nothing was ended by this call.
            let answer = asked?.await.unwrap_or(Handover::NotLeader);
            Ok(answer != Handover::NotLeader)
        }
    }

    /// Hands the lease over to the candidate `to`, a follower of this resource: if this
    /// candidate leads, its term ends as on a [`step_down`](Self::step_down) (the term's
    /// [`lost`](LeaderTerm::lost) fires with [`LossReason::HandedOver`], its work gets up to the
    /// grace period), then the lease is offered to `to` for `within` (see
    /// [`LeaseStore::offer`]): a new term with a higher token that only `to` can take, woken by
    /// the offer where the store has release notifications, otherwise at its next retry. Every
    /// other candidate, this one included, stays out until `to` took it or the offer lapsed.
    ///
    /// The future resolves to [`Handover::Taken`] with the successor's token once it took the
    /// offer (it leads on its renew right after, with that token; should that renew fail, it
    /// contends again and leads with a higher one),
    /// [`Handover::NotTaken`] when it did not take the offer within `within` (it is not a live
    /// follower: the lease then lapses to the ordinary contest, so a dead successor costs
    /// `within` without a leader, not a lease), [`Handover::Ended`] when the term ended but no
    /// offer was made, or [`Handover::NotLeader`]. Give `within` a little more than the
    /// successor's `retry_interval` where the store wakes no followers.
    ///
    /// `to` must be a valid candidate id of at most [`MAX_OFFER_TARGET_LEN`](crate::store::MAX_OFFER_TARGET_LEN)
    /// characters other than this one's, and `within` between 1 ms and the lease duration:
    /// refused before anything happens. If the store cannot make the offer (it failed, or a
    /// wrapper store does not forward [`LeaseStore::offer`]), the lease is released as by a
    /// step-down and the answer is [`Handover::Ended`].
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use orion_beacon::{Elector, Handover, InMemoryLeaseStore};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = InMemoryLeaseStore::new();
    /// let elector = |id: &str| {
    ///     Elector::builder(store.clone()).resource("planned").candidate_id(id).build()
    /// };
    /// let old = elector("old")?.start();
    /// old.watch().wait_for(|l| l.is_leader()).await?;
    /// let new = elector("new")?.start();
    /// // Before the old instance goes: the new one leads now, with a higher token.
    /// let handover = old.hand_over_to("new", Duration::from_secs(5)).await?;
    /// assert!(matches!(handover, Handover::Taken { .. }));
    /// new.watch().wait_for(|l| l.is_leader()).await?;
    /// # old.shutdown().await;
    /// # new.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub fn hand_over_to(
        &self,
        to: &str,
        within: Duration,
    ) -> impl std::future::Future<Output = Result<Handover, ConfigError>> + Send + 'static {
        let checked = crate::store::validate_offer_target(to)
            .map_err(ConfigError::from)
            .and_then(|()| {
                if *to == *self.config.candidate {
                    return Err(ConfigError::Invalid(
                        crate::error::StoreError::InvalidCandidate {
                            name: to.to_owned(),
                            reason: "a handover names another candidate than this one",
                        },
                    ));
                }
                if within.is_zero() {
                    return Err(ConfigError::Zero { option: "within" });
                }
                // A dead successor costs `within` without a leader: never more than a lease.
                if within > self.config.timing.lease {
                    return Err(ConfigError::TooLong {
                        option: "within",
                        value: within,
                        max: self.config.timing.lease,
                    });
                }
                crate::store::lease_millis(within)?;
                Ok(())
            });
        let asked = checked.and_then(|()| self.ask_step_down(within, Some(Arc::from(to))));
        async move { Ok(asked?.await.unwrap_or(Handover::NotLeader)) }
    }

    /// Asks the loop for a step-down (a handover to `to`, if named) with `stay_out`.
    fn ask_step_down(
        &self,
        stay_out: Duration,
        to: Option<Arc<str>>,
    ) -> Result<tokio::sync::oneshot::Receiver<Handover>, ConfigError> {
        let option = if to.is_some() { "within" } else { "stay_out" };
        if stay_out > MAX_INTERVAL {
            return Err(ConfigError::TooLong {
                option,
                value: stay_out,
                max: MAX_INTERVAL,
            });
        }
        let (done, answer) = tokio::sync::oneshot::channel();
        self.stop.step_down.ask(StepDown { stay_out, to, done });
        Ok(answer)
    }

    /// Stops the elector at once, as if the process had died: the term is marked lost locally,
    /// but work is not waited for and the lease is not released; it lapses in the store.
    ///
    /// Like [`shutdown`](Self::shutdown), the stop is requested at the call.
    pub fn abort(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.stop.abort.cancel();
        self.finished()
    }

    /// Resolves once the elector's task has ended (also if it panicked).
    fn finished(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut done = self.done.clone();
        async move {
            // An error means the task is gone without saying so (a panic): it has ended too.
            let _ = done.wait_for(|finished| *finished).await;
        }
    }
}

impl Drop for ElectorHandle {
    fn drop(&mut self) {
        self.stop.shutdown.cancel();
    }
}

/// The options and the store's backend; never the store's connection.
impl std::fmt::Debug for ElectorBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElectorBuilder")
            .field("options", &self.options)
            .field("backend", &self.fence.as_ref().map(|s| s.backend_name()))
            .finish_non_exhaustive()
    }
}

/// The settings and the store's backend; never the store's connection.
impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("config", &self.config)
            .field("backend", &self.fence.as_ref().map(|s| s.backend_name()))
            .finish_non_exhaustive()
    }
}

/// Resource, candidate and the leadership now.
impl std::fmt::Debug for ElectorHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElectorHandle")
            .field("resource", &&*self.config.resource)
            .field("candidate", &&*self.config.candidate)
            .field("leadership", &*self.receiver.borrow())
            .field("stopped", &*self.done.borrow())
            .finish_non_exhaustive()
    }
}
