//! A shard set node's loop: rounds of heartbeat, batched renew, look, plan, hand over, acquire.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{sleep_until, Instant};
use tracing::{debug, info, warn, Instrument};

use super::config::Config;
use super::plan::{plan, View};
use super::{Assignment, Control, ShardStore, Work};
use crate::elector::{LeaderTerm, LossReason};
use crate::{Lease, LeaseOutcome, Member};

/// How long after a release notification a node waits for more before its round: one round for
/// a burst of releases (a drain, a shutdown).
const RELEASE_SETTLE: Duration = Duration::from_millis(20);
/// How long cut-off work gets to be dropped before its lease is released anyway.
const UNWIND: Duration = Duration::from_millis(100);

/// Why a bounded store call failed.
#[derive(Debug)]
enum Bounded {
    Store(crate::StoreError),
    Timeout(Duration),
}

impl std::fmt::Display for Bounded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bounded::Store(err) => err.fmt(f),
            Bounded::Timeout(after) => write!(f, "no answer within {after:?}"),
        }
    }
}

pub(crate) struct Runner {
    pub store: Arc<dyn ShardStore>,
    pub config: Arc<Config>,
    pub state: watch::Sender<Assignment>,
    pub control: Control,
    pub work: Arc<Work>,
    pub fence: Option<crate::SeaOrmLeaseStore>,
}

/// A resource this node leads: its term and the store's last answer for it.
struct Held {
    term: LeaderTerm,
    lease: Lease,
}

/// A term that ended for a handover or a shutdown: renewed until its work returned (or the
/// grace period passed), then released.
struct Handover {
    term: LeaderTerm,
    lease: Lease,
    /// When the work is cut off, if it has not returned.
    give_up: Instant,
    /// Whether to release the lease at the end (a shutdown may be told not to).
    release: bool,
    /// Set once the work was cut off: the release waits for the drop, at most [`UNWIND`].
    cut_at: Option<Instant>,
}

#[derive(Default)]
struct State {
    held: BTreeMap<Arc<str>, Held>,
    handing: Vec<Handover>,
    members: Vec<Member>,
    /// Free at the previous look.
    last_free: HashSet<Arc<str>>,
    share: usize,
    /// Whether the members have been told this node drains (a heartbeat said so).
    drain_announced: bool,
    stopping: bool,
}

impl Runner {
    pub(crate) async fn run(self) {
        let span = tracing::info_span!(
            "shard_set",
            name = %self.config.name,
            member = %self.config.member,
        );
        self.run_inner().instrument(span).await
    }

    async fn run_inner(self) {
        #[cfg(feature = "metrics")]
        {
            use crate::elector::metrics::{SHARDS_LED, SHARD_SHARE};
            metrics::describe_gauge!(SHARDS_LED, "Resources this shard set node leads now");
            metrics::describe_gauge!(SHARD_SHARE, "This shard set node's share at its last round");
        }
        let mut st = State::default();
        let mut releases = self.store.release_events();
        let mut draining = self.control.draining.subscribe();
        let mut next_round = Instant::now();
        loop {
            tokio::select! {
                biased;
                _ = self.control.abort.cancelled() => {
                    self.abort(&mut st);
                    return;
                }
                _ = self.control.shutdown.cancelled(), if !st.stopping => {
                    self.begin_stop(&mut st);
                    next_round = Instant::now();
                    continue;
                }
                _ = self.work.changed.notified(), if !st.handing.is_empty() => {
                    self.finish_handovers(&mut st).await;
                }
                _ = draining.changed() => {
                    next_round = Instant::now();
                    continue;
                }
                event = recv(&mut releases) => {
                    if let Some(resource) = event {
                        let ours = self.config.resources.iter().any(|r| **r == *resource);
                        let room = st.held.len() < st.share.saturating_add(self.config.slack);
                        if ours && room && !st.stopping {
                            next_round = next_round.min(Instant::now() + RELEASE_SETTLE);
                        }
                    } else {
                        releases = None; // closed: poll only
                    }
                    continue;
                }
                _ = sleep_until(next_round) => {
                    next_round = Instant::now() + self.config.interval;
                    let draining = *draining.borrow();
                    self.round(&mut st, draining).await;
                }
            }
            self.publish(&st);
            if st.stopping && st.handing.is_empty() {
                self.leave().await;
                self.publish(&st);
                return;
            }
        }
    }

    /// One round.
    async fn round(&self, st: &mut State, draining: bool) {
        self.expire(st);
        let draining = draining || st.stopping;
        let heartbeat = self.store.heartbeat(
            &self.config.name,
            &self.config.member,
            self.config.lease,
            draining,
        );
        match self.bounded(heartbeat).await {
            Ok(members) => {
                st.members = members;
                // Told now: the members hand-over starts at the next round, once they had
                // a round to see it.
                if draining && !st.drain_announced {
                    st.drain_announced = true;
                    self.renew(st).await;
                    self.finish_handovers(st).await;
                    return;
                }
            }
            Err(err) => {
                warn!(error = %err, "shard set heartbeat failed; keeping the last view of the members")
            }
        }
        self.renew(st).await;
        if !st.stopping {
            self.rebalance(st, draining && st.drain_announced).await;
        }
        self.finish_handovers(st).await;
    }

    /// Ends the terms whose local deadline passed (their renews failed): their work stops at
    /// once, and they are no longer renewed (a later acquire may lead them again).
    fn expire(&self, st: &mut State) {
        let now = Instant::now();
        let expired: Vec<Arc<str>> = st
            .held
            .iter()
            .filter(|(_, h)| h.term.deadline() <= now || h.term.is_lost())
            .map(|(r, _)| r.clone())
            .collect();
        for r in expired {
            if let Some(h) = st.held.remove(&r) {
                warn!(resource = %r, token = %h.term.token(), "no renew in time: the term ends");
                h.term.end(LossReason::Deadline);
                h.term.cut_off();
            }
        }
        st.handing.retain(|h| {
            if h.term.deadline() <= now {
                h.term.cut_off();
                false
            } else {
                true
            }
        });
    }

    /// Renews every held lease (and those being handed over) with one batch.
    async fn renew(&self, st: &mut State) {
        let leases: Vec<Lease> = st
            .held
            .values()
            .map(|h| h.lease.clone())
            .chain(st.handing.iter().map(|h| h.lease.clone()))
            .collect();
        if leases.is_empty() {
            return;
        }
        let sent = Instant::now();
        let renewals = match self
            .bounded(self.store.renew_all(&leases, self.config.lease))
            .await
        {
            Ok(renewals) => renewals,
            Err(err) => {
                warn!(error = %err, leases = leases.len(), "batched renew failed; terms hold to their deadlines");
                return;
            }
        };
        for lease in renewals.renewed {
            let deadline = self.deadline(&lease, sent);
            if let Some(h) = st.held.get_mut(&*lease.resource) {
                h.term.extend(deadline);
                h.lease = lease;
            } else if let Some(h) = st
                .handing
                .iter_mut()
                .find(|h| h.lease.resource == lease.resource)
            {
                h.term.extend(deadline);
                h.lease = lease;
            }
        }
        for lost in renewals.lost {
            if let Some(h) = st.held.remove(&*lost.resource) {
                warn!(resource = %lost.resource, token = %lost.token, "lease lost (lapsed, revoked or taken): the term ends");
                h.term.end(LossReason::Denied);
                h.term.cut_off();
            }
            st.handing.retain(|h| h.lease.resource != lost.resource);
        }
    }

    /// Looks at which resources are free, plans, hands over, acquires.
    async fn rebalance(&self, st: &mut State, draining: bool) {
        let resources: Vec<String> = self
            .config
            .resources
            .iter()
            .map(|r| r.to_string())
            .collect();
        let records = match self.bounded(self.store.current_all(&resources)).await {
            Ok(records) => records,
            Err(err) => {
                warn!(error = %err, "could not read the shard set's leases; no rebalancing this round");
                return;
            }
        };
        let live: HashSet<&str> = records
            .iter()
            .filter(|r| r.live)
            .map(|r| r.resource.as_str())
            .collect();
        let free: HashSet<Arc<str>> = self
            .config
            .resources
            .iter()
            .filter(|r| !live.contains(&***r))
            .cloned()
            .collect();
        let orphans: HashSet<Arc<str>> = free.intersection(&st.last_free).cloned().collect();
        let held: BTreeSet<Arc<str>> = st.held.keys().cloned().collect();
        let p = plan(&View {
            me: &self.config.member,
            members: &st.members,
            resources: &self.config.resources,
            held: &held,
            free: &free,
            orphans: &orphans,
            prefer: &self.config.prefer,
            slack: self.config.slack,
            draining,
        });
        st.last_free = free;
        st.share = p.target;
        for r in &p.release {
            if let Some(h) = st.held.remove(r) {
                info!(resource = %r, token = %h.term.token(), share = p.target, "handing over");
                self.hand_over(st, h, LossReason::HandedOver, true);
            }
        }
        for r in p.acquire {
            if self.control.shutdown.is_cancelled() || self.control.abort.is_cancelled() {
                return;
            }
            let sent = Instant::now();
            let acquire = self
                .store
                .acquire_or_renew(&r, &self.config.member, self.config.lease);
            match self.bounded(acquire).await {
                Ok(LeaseOutcome::Acquired(lease) | LeaseOutcome::Renewed(lease)) => {
                    let deadline = self.deadline(&lease, sent);
                    if deadline <= Instant::now() {
                        continue; // too little of it left to lead on
                    }
                    info!(resource = %r, token = %lease.token, "leading");
                    let term = LeaderTerm::new(
                        lease.token,
                        r.clone(),
                        self.config.member.clone(),
                        deadline,
                        self.fence.clone(),
                    );
                    tokio::spawn(watchdog(term.clone()));
                    st.held.insert(r, Held { term, lease });
                }
                Ok(LeaseOutcome::Denied(d)) => {
                    debug!(resource = %r, holder = ?d.holder, "taken by another member first");
                }
                Err(err) => {
                    warn!(resource = %r, error = %err, "acquire failed; trying again next round");
                    return;
                }
            }
        }
    }

    fn hand_over(&self, st: &mut State, h: Held, reason: LossReason, release: bool) {
        h.term.end(reason);
        st.handing.push(Handover {
            give_up: Instant::now() + self.config.grace_period,
            term: h.term,
            lease: h.lease,
            release,
            cut_at: None,
        });
    }

    /// Releases the leases whose work has returned (or was cut off after the grace period).
    async fn finish_handovers(&self, st: &mut State) {
        let now = Instant::now();
        let mut done = Vec::new();
        let mut i = 0;
        while i < st.handing.len() {
            let h = &mut st.handing[i];
            let ready = if self.work.idle(&h.term) {
                true
            } else if let Some(cut) = h.cut_at {
                now >= cut + UNWIND
            } else if now >= h.give_up {
                warn!(
                    resource = h.term.resource(),
                    "work did not return within the grace period; dropping it"
                );
                h.term.cut_off();
                h.cut_at = Some(now);
                false
            } else {
                false
            };
            if ready {
                done.push(st.handing.swap_remove(i));
            } else {
                i += 1;
            }
        }
        for h in done {
            h.term.cut_off();
            if !h.release {
                continue;
            }
            match self.bounded(self.store.release_lease(&h.lease)).await {
                Ok(released) => debug!(resource = %h.lease.resource, released, "released"),
                Err(err) => {
                    warn!(resource = %h.lease.resource, error = %err, "release failed; the lease lapses instead")
                }
            }
        }
    }

    fn begin_stop(&self, st: &mut State) {
        st.stopping = true;
        st.share = 0;
        let held = std::mem::take(&mut st.held);
        for (_, h) in held {
            self.hand_over(st, h, LossReason::Shutdown, self.config.release_on_shutdown);
        }
    }

    fn abort(&self, st: &mut State) {
        for (_, h) in std::mem::take(&mut st.held) {
            h.term.end(LossReason::Aborted);
            h.term.cut_off();
        }
        for h in std::mem::take(&mut st.handing) {
            h.term.cut_off();
        }
        st.share = 0;
        self.publish(st);
    }

    async fn leave(&self) {
        let leave = self.store.leave(&self.config.name, &self.config.member);
        if let Err(err) = self.bounded(leave).await {
            warn!(error = %err, "could not leave the shard set; the membership lapses instead");
        }
    }

    /// A store call, given at most one interval: a round never hangs on the database (terms
    /// end at their deadlines meanwhile, see [`watchdog`]).
    async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, crate::StoreError>>,
    ) -> Result<T, Bounded> {
        match tokio::time::timeout(self.config.interval, call).await {
            Ok(result) => result.map_err(Bounded::Store),
            Err(_) => Err(Bounded::Timeout(self.config.interval)),
        }
    }

    /// The local deadline of a lease granted or renewed by a statement sent at `sent`.
    fn deadline(&self, lease: &Lease, sent: Instant) -> Instant {
        let granted = lease.remaining.min(self.config.lease);
        let trusted = granted.saturating_sub(self.config.step_down_margin);
        sent.checked_add(trusted).unwrap_or(sent)
    }

    fn publish(&self, st: &State) {
        #[cfg(feature = "metrics")]
        {
            let labels = [
                ("shard_set", self.config.name.to_string()),
                ("member", self.config.member.to_string()),
            ];
            metrics::gauge!(crate::elector::metrics::SHARDS_LED, &labels).set(st.held.len() as f64);
            metrics::gauge!(crate::elector::metrics::SHARD_SHARE, &labels).set(st.share as f64);
        }
        let assignment = Assignment {
            led: st
                .held
                .iter()
                .map(|(r, h)| (r.clone(), h.term.clone()))
                .collect(),
            handing_over: st.handing.len(),
            share: st.share,
            members: st.members.iter().map(|m| m.member.clone()).collect(),
        };
        self.state.send_if_modified(|old| {
            let changed = old.led != assignment.led
                || old.handing_over != assignment.handing_over
                || old.share != assignment.share
                || old.members != assignment.members;
            *old = assignment;
            changed
        });
    }
}

/// Ends `term` when its local deadline passes without a renew moving it, whatever the loop is
/// doing (a round can wait on a slow database): work never runs past the lease.
async fn watchdog(term: LeaderTerm) {
    loop {
        let deadline = term.deadline();
        tokio::select! {
            _ = term.cut_off_signal() => return,
            _ = sleep_until(deadline) => {}
        }
        if term.deadline() <= Instant::now() {
            warn!(resource = term.resource(), token = %term.token(), "no renew in time: the term ends");
            term.end(LossReason::Deadline);
            term.cut_off();
            return;
        }
    }
}

/// The next release notification, or `None` once the channel is closed; pending forever
/// without one.
async fn recv(events: &mut Option<crate::ReleaseEvents>) -> Option<Arc<str>> {
    let Some(rx) = events.as_mut() else {
        return std::future::pending().await;
    };
    loop {
        match rx.recv().await {
            Ok(resource) => return Some(resource),
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
        }
    }
}
