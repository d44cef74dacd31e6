//! A shard set node's state between rounds, and the changes to it that need no store call:
//! terms ending at their deadlines, the renew batch and its reconciliation, handovers, the
//! round's time budget. The loop (`runner`) does the I/O and calls these.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

use super::config::Config;
use super::look::{keeps, FreeSince, Keeps, Presence};
use super::plan::{plan, Plan, View};
use super::Assignment;
use crate::hold::{LeaderTerm, LossReason};
use crate::{error::StoreError, lease::Lease, lease::Renewals, membership::Member};

/// How long cut-off work gets to be dropped; work still running then keeps its lease
/// unreleased, to lapse.
pub(crate) const UNWIND: Duration = Duration::from_millis(100);

/// A resource this node leads: its term and the store's last answer for it.
pub(crate) use crate::hold::Held;

/// A term that ended for a handover or a shutdown (or whose lease outlived it): renewed until
/// its work returned (or the grace period passed), then released.
pub(crate) struct Handover {
    pub(crate) term: LeaderTerm,
    pub(crate) lease: Lease,
    /// When the work is cut off, if it has not returned.
    pub(crate) give_up: Instant,
    /// Whether to release the lease at the end (a shutdown may be told not to).
    pub(crate) release: bool,
    /// Whether to keep renewing it meanwhile (not for a term whose deadline passed: nobody
    /// leads it any more).
    pub(crate) renew: bool,
    /// Set once the work was cut off: the release waits for the drop, at most [`UNWIND`].
    pub(crate) cut_at: Option<Instant>,
}

impl Handover {
    /// When this handover must be looked at again without a round.
    pub(crate) fn next_check(&self) -> Instant {
        match self.cut_at {
            Some(cut) => cut + UNWIND,
            None => self.give_up,
        }
    }
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) held: BTreeMap<Arc<str>, Held>,
    pub(crate) handing: Vec<Handover>,
    /// The live members at the last heartbeat that succeeded, and when it was sent.
    pub(crate) members: Vec<Member>,
    pub(crate) members_at: Option<Instant>,
    /// Since when each free resource has been seen free.
    pub(crate) free_since: FreeSince,
    /// Since when each member has been present.
    pub(crate) presence: Presence,
    /// Resources whose acquire got no answer in time, and when it was sent: the statement may
    /// still commit (say after waiting for a row lock) and grant this node a lease it does not
    /// lead; such a lease is released (that exact write) when a later look finds it.
    pub(crate) uncertain: HashMap<Arc<str>, Instant>,
    /// Resources taken because nobody led them for a lease while this node's own store calls
    /// all succeeded and every other member was present (see `look::keeps`), kept outside the
    /// share for a while when that happens again soon (see `look::Keeps`).
    pub(crate) keeps: Keeps,
    /// When a store call of this node last failed or got no answer in time.
    pub(crate) troubled_at: Option<Instant>,
    pub(crate) share: usize,
    /// Whether the members have been told this node drains (a heartbeat said so).
    pub(crate) drain_announced: bool,
    pub(crate) stopping: bool,
    /// A release of one of the set's resources was announced since the last look: the next
    /// round looks whatever the members' counts say (its releaser counted it at its last
    /// heartbeat).
    pub(crate) look_next: bool,
    pub(crate) failed: Option<Arc<StoreError>>,
}

impl State {
    /// Removes the terms whose local deadline passed by `now` or that the watchdog ended: they
    /// are not renewed any more. Their leases may still be live in the store (a renew that was
    /// in flight when the deadline passed): released like a handover's, once their work is
    /// gone.
    pub(crate) fn expire(&mut self, now: Instant) {
        let ended: Vec<Arc<str>> = self
            .held
            .iter()
            .filter(|(_, h)| h.term.local_deadline() <= now || h.term.is_lost())
            .map(|(r, _)| r.clone())
            .collect();
        for r in ended {
            if let Some(h) = self.held.remove(&r) {
                h.end(LossReason::Deadline);
                self.handing.push(Handover {
                    give_up: now,
                    cut_at: Some(now),
                    term: h.term,
                    lease: h.lease,
                    release: true,
                    renew: false,
                });
            }
        }
    }

    /// The leases one batched renew names: every held lease, and those being handed over that
    /// are still renewed; one lease per resource (a batch naming one twice is refused), the
    /// held term first.
    pub(crate) fn renew_batch(&self) -> Vec<Lease> {
        let mut named: HashSet<&str> = HashSet::with_capacity(self.held.len() + self.handing.len());
        self.held
            .values()
            .map(|h| &h.lease)
            .chain(self.handing.iter().filter(|h| h.renew).map(|h| &h.lease))
            .filter(|lease| named.insert(lease.resource.as_str()))
            .cloned()
            .collect()
    }

    /// What a batched renew answered, at `now`: renewed terms get their new deadline (a held
    /// term that already ended stays ended; a handover only while its deadline has not
    /// passed), lost ones end, and a handover whose lease is gone stops its work now.
    pub(crate) fn apply_renewals(
        &mut self,
        renewals: Renewals,
        now: Instant,
        deadline: impl Fn(&Lease) -> Instant,
    ) {
        for lease in renewals.renewed {
            let deadline = deadline(&lease);
            if let Some(h) = self
                .held
                .get_mut(&*lease.resource)
                .filter(|h| h.names(&lease))
            {
                // A term whose deadline passed stays ended, even though its lease was renewed:
                // expire() releases that lease.
                h.renewed(lease, deadline);
            } else if let Some(h) = self
                .handing
                .iter_mut()
                .find(|h| h.lease.resource == lease.resource && h.term.token() == lease.token)
            {
                if h.term.local_deadline() > now {
                    h.term.extend(deadline);
                }
                h.lease = lease;
            }
        }
        for lost in renewals.lost {
            let same = |term: &LeaderTerm| term.token() == lost.token;
            if let Some(h) = self.held.get(&*lost.resource).filter(|h| h.names(&lost)) {
                warn!(resource = %lost.resource, token = %lost.token, "lease lost (lapsed, revoked or taken): the term ends");
                h.end(LossReason::Denied);
                self.held.remove(&*lost.resource);
            }
            // A handover's lease is gone too: its work must stop now, not at the grace period.
            self.handing.retain(|h| {
                let gone = h.lease.resource == lost.resource && same(&h.term);
                if gone {
                    h.term.cut_off();
                }
                !gone
            });
        }
    }

    /// What this node leads now, as its handle shows it: the held terms not yet lost.
    pub(crate) fn assignment(&self) -> Assignment {
        let led: BTreeMap<Arc<str>, LeaderTerm> = self
            .held
            .iter()
            .filter(|(_, h)| !h.term.is_lost())
            .map(|(r, h)| (r.clone(), h.term.clone()))
            .collect();
        Assignment {
            led,
            handing_over: self.handing.len(),
            share: self.share,
            members: self.members.iter().map(|m| m.member.clone()).collect(),
            failed: self.failed.clone(),
        }
    }

    /// Whether `resource`, free for at least `for_at_least` at `now`, says something about the
    /// other members: every one was present the whole time and this node's own calls all
    /// succeeded meanwhile (see `look::keeps`).
    pub(crate) fn telling(
        &self,
        me: &str,
        resource: &str,
        for_at_least: Duration,
        now: Instant,
    ) -> bool {
        self.free_since.since(resource).is_some_and(|since| {
            now.saturating_duration_since(since) >= for_at_least
                && keeps(&self.presence, &self.members, me, since, self.troubled_at)
        })
    }

    /// The round's plan from what the look at `looked` found free, orphaned and abandoned:
    /// the keeps updated (a resource unled for half a lease while telling), then the share,
    /// what to hand over and what to acquire.
    pub(crate) fn plan_round(
        &mut self,
        config: &Config,
        free: &HashSet<Arc<str>>,
        orphans: &HashSet<Arc<str>>,
        abandoned: &HashSet<Arc<str>>,
        looked: Instant,
        draining: bool,
    ) -> Plan {
        let held: BTreeSet<Arc<str>> = self.held.keys().cloned().collect();
        self.keeps.members(&self.members);
        // A resource nobody has led for half a lease is about to be abandoned: every node
        // sees that (the first to see it free for a whole lease takes it, and the others have
        // looked since at most a round later), so they agree on how often it happens. Only
        // what says something about the others counts (see `look::keeps`).
        let long_free = config.timing.lease / 2;
        let telling: HashSet<Arc<str>> = free
            .iter()
            .filter(|r| self.telling(&config.member, r, long_free, looked))
            .cloned()
            .collect();
        // A handed-over resource is released once its work returned: the grace period, and a
        // round to see it.
        let handover = config.timing.grace_period.saturating_add(config.interval());
        self.keeps
            .look(free, &telling, looked, config.timing.lease, handover);
        let (keep, returning) = self.keeps.sorted(&held, looked);
        // A view of the members older than a lease is no view: they may all have changed.
        let fresh = self
            .members_at
            .is_some_and(|at| looked.saturating_duration_since(at) < config.timing.lease);
        plan(&View {
            me: &config.member,
            members: fresh.then_some(self.members.as_slice()),
            resources: &config.resources,
            held: &held,
            free,
            orphans,
            abandoned,
            keep: &keep,
            returning: &returning,
            prefer: &config.prefer,
            slack: config.slack,
            draining,
        })
    }

    /// Whether, at `now`, there is time before `until` for one more statement that is not a
    /// renew, with `interval` left before every held term's deadline.
    pub(crate) fn budget_left(&self, now: Instant, until: Instant, interval: Duration) -> bool {
        let earliest = self.held.values().map(|h| h.term.local_deadline()).min();
        now < until && earliest.is_none_or(|d| d.saturating_duration_since(now) >= interval)
    }

    /// Ends `h`'s term for `reason` and renews its lease until its work returns or `give_up`
    /// passes; released at the end if `release`.
    pub(crate) fn hand_over(
        &mut self,
        h: Held,
        reason: LossReason,
        release: bool,
        give_up: Instant,
    ) {
        h.term.end(reason);
        self.handing.push(Handover {
            give_up,
            term: h.term,
            lease: h.lease,
            release,
            renew: true,
            cut_at: None,
        });
    }

    /// A permanent store error (the node's configuration): every term ends, nothing more is
    /// tried.
    pub(crate) fn fail(&mut self, err: Arc<StoreError>) {
        for (_, h) in std::mem::take(&mut self.held) {
            h.end(LossReason::Failed);
        }
        for h in std::mem::take(&mut self.handing) {
            h.term.cut_off();
        }
        self.share = 0;
        self.failed = Some(err);
    }

    /// An abort: every term ends and its work is cut off at once, nothing released.
    pub(crate) fn abort(&mut self) {
        for (_, h) in std::mem::take(&mut self.held) {
            h.end(LossReason::Aborted);
        }
        for h in std::mem::take(&mut self.handing) {
            h.term.cut_off();
        }
        self.share = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fencing::FencingToken;

    fn lease(resource: &str, token: i64, remaining_ms: u64) -> Lease {
        Lease {
            resource: resource.to_owned(),
            holder: "me".to_owned(),
            token: FencingToken::new(token),
            remaining: Duration::from_millis(remaining_ms),
            expires_at: None,
            acquired_at: None,
            payload: None,
        }
    }

    fn held(st: &mut State, resource: &str, token: i64, deadline: Instant) -> LeaderTerm {
        let term = LeaderTerm::new(
            FencingToken::new(token),
            Arc::from(resource),
            Arc::from("me"),
            deadline,
            None,
        );
        st.held.insert(
            Arc::from(resource),
            Held {
                term: term.clone(),
                lease: lease(resource, token, 1_000),
            },
        );
        term
    }

    /// Whether `term`'s work was told to stop.
    async fn cut_off(term: &LeaderTerm) -> bool {
        tokio::time::timeout(Duration::ZERO, term.cut_off_signal())
            .await
            .is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn a_renew_extends_the_same_term_and_a_loss_ends_it() {
        let now = Instant::now();
        let mut st = State::default();
        let a = held(&mut st, "a", 1, now + Duration::from_secs(1));
        let b = held(&mut st, "b", 4, now + Duration::from_secs(1));
        // A handover of "c" (token 2), still renewed.
        let c = LeaderTerm::new(
            FencingToken::new(2),
            Arc::from("c"),
            Arc::from("me"),
            now + Duration::from_secs(1),
            None,
        );
        st.hand_over(
            Held {
                term: c.clone(),
                lease: lease("c", 2, 1_000),
            },
            LossReason::HandedOver,
            true,
            now + Duration::from_secs(1),
        );
        let renewals = Renewals {
            // "a" renewed; renews of "b" and "c" with other tokens are other terms': not ours.
            renewed: vec![
                lease("a", 1, 5_000),
                lease("b", 5, 6_000),
                lease("c", 3, 6_000),
            ],
            lost: vec![],
            unanswered: vec![],
        };
        // The deadline comes from the renewed lease itself.
        st.apply_renewals(renewals, now, |l| now + l.remaining);
        assert_eq!(a.local_deadline(), now + Duration::from_secs(5));
        assert_eq!(st.held["a"].lease.remaining, Duration::from_secs(5));
        assert_eq!(b.local_deadline(), now + Duration::from_secs(1));
        assert_eq!(st.held["b"].lease.token, FencingToken::new(4));
        assert_eq!(c.local_deadline(), now + Duration::from_secs(1));
        assert_eq!(st.handing[0].lease.token, FencingToken::new(2));
        // A loss of another term of "a" ends nothing; the loss of "b"'s own term ends it, and
        // the loss of the handover's lease stops its work now.
        let renewals = Renewals {
            renewed: vec![],
            lost: vec![lease("a", 9, 0), lease("b", 4, 0), lease("c", 2, 0)],
            unanswered: vec![],
        };
        st.apply_renewals(renewals, now, |l| now + l.remaining);
        assert!(!a.is_lost() && st.held.contains_key("a"));
        assert!(b.is_lost() && cut_off(&b).await);
        assert!(!st.held.contains_key("b"));
        assert!(st.handing.is_empty() && cut_off(&c).await);
        assert!(!cut_off(&a).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_term_past_its_deadline_is_handed_over_unrenewed_and_stays_ended() {
        let now = Instant::now();
        let mut st = State::default();
        let a = held(&mut st, "a", 1, now + Duration::from_millis(10));
        let b = held(&mut st, "b", 1, now + Duration::from_secs(10));
        st.expire(now + Duration::from_millis(10));
        assert!(a.is_lost() && cut_off(&a).await);
        assert!(!b.is_lost() && st.held.len() == 1);
        assert_eq!(st.handing.len(), 1);
        assert!(!st.handing[0].renew && st.handing[0].release);
        // Not renewed by the next batch, and a late renew answer does not move its deadline.
        assert_eq!(st.renew_batch().len(), 1);
        let renewals = Renewals {
            renewed: vec![lease("a", 1, 5_000)],
            lost: vec![],
            unanswered: vec![],
        };
        st.apply_renewals(renewals, now + Duration::from_millis(20), |_| {
            now + Duration::from_secs(5)
        });
        assert_eq!(a.local_deadline(), now + Duration::from_millis(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_term_that_ended_is_not_extended_by_a_renew() {
        let now = Instant::now();
        let mut st = State::default();
        let a = held(&mut st, "a", 1, now + Duration::from_secs(1));
        // The watchdog ended it; the loop has not expired it yet.
        a.end(LossReason::Deadline);
        let renewals = Renewals {
            renewed: vec![lease("a", 1, 5_000)],
            lost: vec![],
            unanswered: vec![],
        };
        st.apply_renewals(renewals, now, |_| now + Duration::from_secs(5));
        assert_eq!(a.local_deadline(), now + Duration::from_secs(1));
        // Its lease is the renewed one, so the release names the write that is there.
        assert_eq!(st.held["a"].lease.remaining, Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn an_abort_or_a_failure_ends_every_term_at_once() {
        let now = Instant::now();
        for fail in [false, true] {
            let mut st = State {
                share: 3,
                ..State::default()
            };
            let a = held(&mut st, "a", 1, now + Duration::from_secs(1));
            let h = st.held.remove("a").unwrap();
            st.hand_over(
                h,
                LossReason::HandedOver,
                true,
                now + Duration::from_secs(1),
            );
            let b = held(&mut st, "b", 1, now + Duration::from_secs(1));
            if fail {
                st.fail(Arc::new(StoreError::MissingTable {
                    table: "t".into(),
                    source: sea_orm::DbErr::Custom("gone".into()).into(),
                }));
                assert!(st.failed.is_some());
                assert_eq!(b.loss_reason(), Some(LossReason::Failed));
            } else {
                st.abort();
                assert_eq!(b.loss_reason(), Some(LossReason::Aborted));
            }
            assert!(st.held.is_empty() && st.handing.is_empty() && st.share == 0);
            assert!(cut_off(&a).await && cut_off(&b).await);
            assert_eq!(st.assignment().led.len(), 0);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_batch_names_each_resource_once_the_held_term_first() {
        let now = Instant::now();
        let mut st = State::default();
        let a = held(&mut st, "a", 2, now + Duration::from_secs(1));
        let old = LeaderTerm::new(
            FencingToken::new(1),
            Arc::from("a"),
            Arc::from("me"),
            now + Duration::from_secs(1),
            None,
        );
        st.hand_over(
            Held {
                term: old,
                lease: lease("a", 1, 1_000),
            },
            LossReason::HandedOver,
            true,
            now + Duration::from_secs(1),
        );
        let batch = st.renew_batch();
        assert_eq!(batch.len(), 1);
        assert_eq!(batch[0].token, a.token());
    }

    #[tokio::test(start_paused = true)]
    async fn no_budget_near_a_held_deadline() {
        let now = Instant::now();
        let mut st = State::default();
        let interval = Duration::from_millis(100);
        assert!(st.budget_left(now, now + interval, interval));
        assert!(!st.budget_left(now + interval, now + interval, interval));
        held(&mut st, "a", 1, now + Duration::from_millis(50));
        assert!(!st.budget_left(now, now + interval, interval));
    }
}
