//! A shard set node's loop: rounds of batched renew, heartbeat, look, plan, hand over, acquire.
//!
//! Safety does not depend on the loop keeping time: each term has a watchdog that ends it at its
//! local deadline (the time its last renew was sent, plus the lease the database granted, minus
//! the step-down margin), and work is dropped when a term is lost. A handover releases its
//! lease only once the term's work has returned; work that does not return even when cut off
//! keeps its lease unreleased (and unrenewed) until it lapses.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::clock::sleep_until;
use tracing::{debug, error, info, warn, Instrument};

use super::config::Config;
use super::look::{nothing_free, Free};
use super::state::{Handover, Held, State, UNWIND};
use super::watchdog::{recv, watchdog, Released};
use super::{Assignment, Control, ShardStore, Work};
use crate::hold::{LeaderTerm, LossReason};
use crate::{error::StoreError, lease::Lease, lease::LeaseOutcome};

mod rebalance;

/// How long after a release notification a node waits for more before its round: one round for
/// a burst of releases (a drain, a shutdown).
const RELEASE_SETTLE: Duration = Duration::from_millis(20);

/// Why a bounded store call failed.
#[derive(Debug)]
enum Bounded {
    Store(Arc<StoreError>),
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
    /// The store's renewer: the batched renews go out through it.
    pub renewer: crate::hold::renewer::Renewer,
    pub config: Arc<Config>,
    pub state: watch::Sender<Assignment>,
    pub control: Control,
    pub work: Arc<Work>,
    pub fence: Option<crate::backend::SeaOrmLeaseStore>,
    /// When the store last answered a heartbeat or a batched renew, for `health()`.
    pub health: Arc<crate::hold::health::HealthState>,
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
            use super::metrics::{SHARDS_LED, SHARD_SHARE};
            metrics::describe_gauge!(SHARDS_LED, "Resources this shard set node leads now");
            metrics::describe_gauge!(SHARD_SHARE, "This shard set node's share at its last round");
        }
        let mut st = State::default();
        let mut releases = self.store.release_events();
        let mut draining = self.control.draining.subscribe();
        let lost = Arc::new(Notify::new());
        let mut next_round = crate::clock::now();
        loop {
            let next_handover = st.handing.iter().map(Handover::next_check).min();
            tokio::select! {
                biased;
                _ = self.control.abort.cancelled() => {
                    self.abort(&mut st);
                    return;
                }
                _ = self.control.shutdown.cancelled(), if !st.stopping => {
                    self.begin_stop(&mut st);
                    self.publish(&st); // the ended terms leave the assignment at once
                    next_round = crate::clock::now();
                    continue;
                }
                // A round that is due goes before handover passes: nothing delays a renew.
                _ = sleep_until(next_round) => {
                    let started = crate::clock::now();
                    next_round = started + super::jittered_interval(self.config.interval());
                    let draining = *draining.borrow();
                    if self.aborted(self.round(&mut st, draining, started, &lost)).await {
                        self.abort(&mut st);
                        return;
                    }
                }
                _ = lost.notified() => {
                    self.expire(&mut st);
                }
                _ = self.work.changed.notified(), if !st.handing.is_empty() => {
                    if self.aborted(self.finish_handovers(&mut st, next_round)).await {
                        self.abort(&mut st);
                        return;
                    }
                }
                _ = sleep_until(next_handover.unwrap_or(next_round)), if next_handover.is_some() => {
                    if self.aborted(self.finish_handovers(&mut st, next_round)).await {
                        self.abort(&mut st);
                        return;
                    }
                }
                _ = draining.changed() => {
                    next_round = crate::clock::now();
                    continue;
                }
                event = recv(&mut releases) => {
                    let ours = match event {
                        Released::One(resource) => {
                            self.config.resources.iter().any(|r| **r == *resource)
                        }
                        // Dropped notifications may have named ours.
                        Released::Missed => true,
                        Released::Closed => {
                            releases = None; // poll only
                            false
                        }
                    };
                    st.look_next |= ours;
                    let room = st.held.len() < st.share.saturating_add(self.config.slack);
                    if ours && room && !st.stopping {
                        next_round = next_round.min(crate::clock::now() + RELEASE_SETTLE);
                    }
                    continue;
                }
            }
            self.publish(&st);
            if st.failed.is_some() {
                return;
            }
            if st.stopping && st.handing.is_empty() {
                self.leave().await;
                self.publish(&st);
                return;
            }
        }
    }

    /// One round: renew first (nothing else may delay it), then membership, then the rest.
    async fn round(&self, st: &mut State, draining: bool, started: Instant, lost: &Arc<Notify>) {
        self.expire(st);
        self.renew(st).await;
        if st.failed.is_some() {
            return;
        }
        let draining = draining || st.stopping;
        let heartbeat = self.heartbeat(st, draining);
        let sent = crate::clock::now();
        let mut answered = false;
        match self.bounded(heartbeat).await {
            Ok(members) => {
                answered = true;
                self.health.answered_now();
                st.presence.seen(&members, sent);
                st.members = members;
                st.members_at = Some(sent);
                // Told now: the members hand over starting next round, once they had a round
                // to see it.
                if draining && !st.drain_announced {
                    st.drain_announced = true;
                    self.finish_handovers(st, started + self.config.interval())
                        .await;
                    return;
                }
            }
            Err(err) => {
                let Some(err) = self.transient(st, err) else {
                    return;
                };
                error!(error = %err, "shard set heartbeat failed; keeping the last view of the members");
            }
        }
        if !st.stopping {
            self.rebalance(st, draining && st.drain_announced, answered, started, lost)
                .await;
        }
        self.finish_handovers(st, started + self.config.interval())
            .await;
    }

    /// This node's heartbeat, with what it reports leading: the terms led now (those being
    /// handed over are about to go, and counting them could make another member skip the look
    /// that finds them free), none while draining (it hands them all over).
    fn heartbeat(
        &self,
        st: &State,
        draining: bool,
    ) -> impl std::future::Future<Output = Result<Vec<crate::membership::Member>, StoreError>> + '_
    {
        let leases = if draining { 0 } else { st.held.len() };
        let holding = crate::membership::Holding {
            leases: u64::try_from(leases).unwrap_or(u64::MAX),
            set_hash: self.config.set_hash,
        };
        self.store.heartbeat_holding(
            &self.config.name,
            &self.config.member,
            self.config.timing.lease,
            draining,
            holding,
        )
    }

    /// Removes the terms whose local deadline passed or that the watchdog ended (see
    /// [`State::expire`]), and says so.
    fn expire(&self, st: &mut State) {
        st.expire(crate::clock::now());
        self.publish(st);
    }

    /// Renews every held lease, and those being handed over, with one batch.
    async fn renew(&self, st: &mut State) {
        let leases = st.renew_batch();
        if leases.is_empty() {
            return;
        }
        let sent = crate::clock::now();
        let answer_by = sent.checked_add(self.config.interval()).unwrap_or(sent);
        let store: Arc<dyn crate::store::LeaseStore> = self.store.clone();
        let timing = self.config.timing.renew_key();
        let renew = self.renewer.renew_now(&store, &leases, timing, answer_by);
        let answer = match self.bounded(renew).await {
            Ok(None) => Err(Bounded::Timeout(self.config.interval())),
            Ok(Some(renewals)) => Ok(renewals),
            Err(err) => Err(err),
        };
        let renewals = match answer {
            Ok(renewals) => {
                self.health.answered_now();
                renewals
            }
            Err(err) => {
                let Some(err) = self.transient(st, err) else {
                    return;
                };
                warn!(error = %err, leases = leases.len(), "batched renew failed; terms hold to their deadlines");
                return;
            }
        };
        let deadline = |lease: &Lease| self.deadline(lease, sent);
        st.apply_renewals(renewals, crate::clock::now(), deadline);
    }

    /// Releases the leases that acquires which got no answer in time were granted after all:
    /// live, held by this member id, not led by this node. Each release names the exact write
    /// it saw, so it can never end a term that began after the look.
    async fn release_strays(
        &self,
        st: &mut State,
        records: &[crate::lease::LeaseRecord],
        looked: Instant,
    ) {
        if st.uncertain.is_empty() {
            return;
        }
        // An unanswered acquire that waited this long for a lock is given up on.
        let horizon = self.config.timing.lease.saturating_mul(2);
        st.uncertain
            .retain(|_, sent| looked.saturating_duration_since(*sent) < horizon);
        for record in records {
            let stray = record.live
                && record.holder == *self.config.member
                && !st.held.contains_key(record.resource.as_str())
                && !st
                    .handing
                    .iter()
                    .any(|h| h.lease.resource == record.resource)
                && st.uncertain.contains_key(record.resource.as_str());
            if !stray {
                continue;
            }
            st.uncertain.remove(record.resource.as_str());
            let mut lease = Lease::new(
                record.resource.clone(),
                record.holder.clone(),
                record.token,
                record.remaining,
            );
            lease.expires_at = record.expires_at;
            warn!(resource = %record.resource, token = %record.token,
                "an acquire that got no answer in time was granted after all; releasing that lease");
            if let Err(err) = self.bounded(self.store.release_lease(&lease)).await {
                warn!(resource = %record.resource, error = %err, "release failed; the lease lapses instead");
            }
        }
    }

    /// Whether the round has used its time: it must not delay the next renew (one interval
    /// after the round began) nor come close to a held term's deadline.
    fn over_budget(&self, st: &State, started: Instant) -> bool {
        !self.budget_left(st, started + self.config.interval())
    }

    /// Whether there is time before `until` for one more statement that is not a renew.
    fn budget_left(&self, st: &State, until: Instant) -> bool {
        st.budget_left(crate::clock::now(), until, self.config.interval())
    }

    fn hand_over(&self, st: &mut State, h: Held, reason: LossReason, release: bool) {
        st.hand_over(
            h,
            reason,
            release,
            crate::clock::now() + self.config.timing.grace_period,
        );
    }

    /// Releases the leases whose work has returned; cuts off work past the grace period; gives
    /// up (unreleased, to lapse) on work that did not stop when cut off. Releases stop at
    /// `until` (the round's end, or the next round) or near a held term's deadline; the rest
    /// stay renewed until a later pass.
    async fn finish_handovers(&self, st: &mut State, until: Instant) {
        let now = crate::clock::now();
        let mut ready = Vec::new();
        let mut i = 0;
        while i < st.handing.len() {
            let h = &mut st.handing[i];
            let idle = self.work.idle(&h.term);
            let next = if idle {
                Some(true)
            } else if let Some(cut) = h.cut_at {
                (now >= cut + UNWIND).then_some(false)
            } else if now >= h.give_up {
                warn!(
                    resource = h.term.resource(),
                    "work did not return within the grace period; dropping it"
                );
                h.term.cut_off();
                h.cut_at = Some(now);
                None
            } else {
                None
            };
            match next {
                Some(release) => {
                    let h = st.handing.swap_remove(i);
                    if !release {
                        error!(resource = h.term.resource(), token = %h.term.token(),
                            "work did not stop when cut off: its lease is left to lapse, not released");
                    }
                    ready.push((h, release));
                }
                None => i += 1,
            }
        }
        let mut releases = Vec::new();
        for (h, release) in ready {
            h.term.cut_off();
            if release && h.release {
                releases.push(h);
            }
        }
        let mut releases = releases.into_iter();
        let mut recount = false;
        for h in releases.by_ref() {
            if !self.budget_left(st, until) {
                // Back in the list (still renewed), released at the next pass.
                st.handing.push(Handover {
                    give_up: until,
                    cut_at: None,
                    ..h
                });
                break;
            }
            match self.bounded(self.store.release_lease(&h.lease)).await {
                Ok(released) => {
                    debug!(resource = %h.lease.resource, released, "released");
                    recount |= released;
                }
                Err(err) => {
                    warn!(resource = %h.lease.resource, error = %err, "release failed; the lease lapses instead")
                }
            }
        }
        for h in releases {
            st.handing.push(Handover {
                give_up: until,
                cut_at: None,
                ..h
            });
        }
        let now = crate::clock::now();
        let room = until.saturating_duration_since(now) >= self.config.interval() / 2;
        if recount && !st.stopping && room && self.budget_left(st, until) {
            // Tell the members at once that this node leads less: without a release
            // notification, their next round would otherwise count these leases as led until
            // this node's next heartbeat, and skip the look that finds them free.
            let heartbeat = self.heartbeat(st, *self.control.draining.borrow());
            match self.bounded(heartbeat).await {
                Ok(_) => self.health.answered_now(),
                Err(err) => {
                    st.troubled_at = Some(crate::clock::now());
                    debug!(error = %err, "heartbeat after releases failed; the next round's tells");
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

    /// `err` back if a later call may succeed; `None` after stopping the node for an error of
    /// its configuration (every later call would fail the same way).
    fn transient(&self, st: &mut State, err: Bounded) -> Option<Bounded> {
        st.troubled_at = Some(crate::clock::now());
        match err {
            Bounded::Store(err) if err.is_permanent() => {
                self.fail(st, err);
                None
            }
            other => Some(other),
        }
    }

    /// A permanent store error (the node's configuration): every term ends, nothing more is
    /// tried.
    fn fail(&self, st: &mut State, err: Arc<StoreError>) {
        error!(error = %err, "the store refused this shard set node's configuration; it stops");
        st.fail(err);
    }

    /// Runs `work` unless an abort comes first: an abort stops a round or a handover at once,
    /// as if the process died. Whether it did.
    async fn aborted(&self, work: impl std::future::Future<Output = ()>) -> bool {
        tokio::select! {
            biased;
            _ = self.control.abort.cancelled() => true,
            _ = work => false,
        }
    }

    fn abort(&self, st: &mut State) {
        st.abort();
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
    async fn bounded<T, E: Into<Arc<StoreError>>>(
        &self,
        call: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, Bounded> {
        match tokio::time::timeout(self.config.interval(), call).await {
            Ok(result) => result.map_err(|err| Bounded::Store(err.into())),
            Err(_) => Err(Bounded::Timeout(self.config.interval())),
        }
    }

    /// The local deadline of a lease granted or renewed by a statement sent at `sent`.
    fn deadline(&self, lease: &Lease, sent: Instant) -> Instant {
        self.config.timing.deadline(lease, sent)
    }

    fn publish(&self, st: &State) {
        let assignment = st.assignment();
        #[cfg(feature = "metrics")]
        {
            let labels = [
                ("shard_set", self.config.name.to_string()),
                ("member", self.config.member.to_string()),
            ];
            metrics::gauge!(super::metrics::SHARDS_LED, &labels).set(assignment.led.len() as f64);
            metrics::gauge!(super::metrics::SHARD_SHARE, &labels).set(st.share as f64);
        }
        self.state.send_if_modified(|old| {
            let changed = old.led != assignment.led
                || old.handing_over != assignment.handing_over
                || old.share != assignment.share
                || old.members != assignment.members
                || old.failed.is_some() != assignment.failed.is_some();
            *old = assignment;
            changed
        });
    }
}
