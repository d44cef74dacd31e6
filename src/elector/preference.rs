//! Ranked candidates: each heartbeats its rank into its election's candidate list (the
//! membership table), and a leader that sees a live candidate ranking higher hands over to it
//! through the named handover, once that candidate has been live for `prefer_after`.
//!
//! Why it never loops: a leader only ever hands over to a candidate of a strictly higher rank,
//! so every automatic handover moves leadership up the ranks; a successor that did not take
//! the offer is not offered the lease again for a back-off that doubles each time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::handover::Handover;
use crate::membership::{Candidate, MembershipStore};
use crate::mutex::lock;

/// The longest back-off after offers a successor did not take: `prefer_after` times this.
const MOST_BACK_OFF_FACTOR: u32 = 64;

/// A ranked elector's view of its election, as [`Health`](crate::Health) and
/// [`ElectorHandle::candidacy`](crate::ElectorHandle::candidacy) give it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Candidacy {
    /// This candidate's rank.
    pub rank: i64,
    /// The live candidates at its last candidacy heartbeat, ordered by id (this one included
    /// once its first heartbeat is in).
    pub candidates: Vec<Candidate>,
    /// Why the last candidacy heartbeat failed, if it did (e.g. a membership table without the
    /// `AddMemberRank` migration's column): the elector goes on as a candidate, but no leader
    /// hands over to it or by it until a heartbeat succeeds.
    pub error: Option<String>,
}

/// The highest-ranked candidate a leader of rank `rank` (id `me`) should hand over to, if any:
/// of the live candidates ranking strictly higher that are not `backing_off`, the highest
/// (the smallest id among equals), provided it has been live for `prefer_after`. If that
/// candidate is not live long enough yet, nobody: leadership waits for it rather than moving
/// twice.
pub(crate) fn preferred<'a>(
    me: &str,
    rank: i64,
    candidates: &'a [Candidate],
    prefer_after: Duration,
    backing_off: impl Fn(&str) -> bool,
) -> Option<&'a Candidate> {
    let best = candidates
        .iter()
        .filter(|c| c.candidate != me && c.rank > rank && !backing_off(&c.candidate))
        // Highest rank; among equal ranks the smallest id (every leader picks the same one).
        .min_by(|a, b| {
            b.rank
                .cmp(&a.rank)
                .then_with(|| a.candidate.cmp(&b.candidate))
        })?;
    (best.live_for >= prefer_after).then_some(best)
}

/// A successor that did not take an offer: how many in a row, and until when it is not offered
/// the lease again.
#[derive(Debug, Clone, Copy)]
struct Refusals {
    count: u32,
    until: Instant,
}

/// The ranked elector's candidacy: its store, rank and timing, and what it learned.
pub(crate) struct Ranking {
    pub members: Arc<dyn MembershipStore>,
    pub rank: i64,
    pub prefer_after: Duration,
    /// How long a heartbeat keeps the candidacy live (the lease duration plus the retry
    /// interval: a follower beats at its attempts).
    pub ttl: Duration,
    /// How often it heartbeats (the renew interval).
    pub every: Duration,
    /// How long an automatic handover's offer stands (see `offer_window`).
    pub window: Duration,
    pub view: watch::Sender<Candidacy>,
    state: Mutex<State>,
}

struct State {
    next_beat: Instant,
    refusals: HashMap<String, Refusals>,
    /// The automatic handover under way: to whom, and its answer to come.
    pending: Option<(String, oneshot::Receiver<Handover>)>,
}

impl Ranking {
    pub(crate) fn new(
        members: Arc<dyn MembershipStore>,
        rank: i64,
        prefer_after: Duration,
        ttl: Duration,
        every: Duration,
        window: Duration,
    ) -> (Self, watch::Receiver<Candidacy>) {
        let (view, receiver) = watch::channel(Candidacy {
            rank,
            candidates: Vec::new(),
            error: None,
        });
        let ranking = Self {
            members,
            rank,
            prefer_after,
            ttl,
            every,
            window,
            view,
            state: Mutex::new(State {
                next_beat: crate::clock::now(),
                refusals: HashMap::new(),
                pending: None,
            }),
        };
        (ranking, receiver)
    }

    /// Whether a heartbeat is due at `now`: within half an interval of its time, so that one
    /// beat per leader round (a round starts right after a renew) keeps the cadence.
    pub(crate) fn beat_due(&self, now: Instant) -> bool {
        let slack = self.every / 2;
        lock(&self.state).next_beat <= now.checked_add(slack).unwrap_or(now)
    }

    /// A heartbeat was sent at `sent`: the next is due an interval later.
    pub(crate) fn beaten(&self, sent: Instant) {
        lock(&self.state).next_beat = sent.checked_add(self.every).unwrap_or(sent);
    }

    /// The next heartbeat is due at once (a term began: the new leader looks right away).
    pub(crate) fn beat_now(&self) {
        lock(&self.state).next_beat = crate::clock::now();
    }

    /// Takes in the answer of an automatic handover, if it came: a successor that took it is
    /// forgiven its earlier refusals; one that did not is backed off for `prefer_after` times
    /// 1, 2, 4, ... (at most [`MOST_BACK_OFF_FACTOR`]).
    pub(crate) fn settle(&self, now: Instant) {
        let mut state = lock(&self.state);
        let Some((to, answer)) = state.pending.as_mut() else {
            return;
        };
        let outcome = match answer.try_recv() {
            Ok(outcome) => Some(outcome),
            Err(oneshot::error::TryRecvError::Empty) => return,
            // The loop ended the request without an answer.
            Err(oneshot::error::TryRecvError::Closed) => None,
        };
        let to = std::mem::take(to);
        state.pending = None;
        match outcome {
            Some(Handover::Taken { .. }) => {
                state.refusals.remove(&to);
            }
            // Ended (the lease lapsed on its own, or was released) and NotLeader come from
            // this leader's side, not the successor's: no back-off.
            Some(Handover::Ended | Handover::NotLeader) => {}
            Some(Handover::NotTaken) | None => {
                let refusals = state.refusals.entry(to).or_insert(Refusals {
                    count: 0,
                    until: now,
                });
                let factor = 1u32
                    .checked_shl(refusals.count)
                    .unwrap_or(MOST_BACK_OFF_FACTOR)
                    .min(MOST_BACK_OFF_FACTOR);
                refusals.count = refusals.count.saturating_add(1);
                let back_off = self.prefer_after.saturating_mul(factor);
                refusals.until = now.checked_add(back_off).unwrap_or(now);
            }
        }
    }

    /// Whether an automatic handover's answer is still to come.
    pub(crate) fn handing_over(&self) -> bool {
        lock(&self.state).pending.is_some()
    }

    /// The candidate a leader (`me`) hands over to now, from its last view, if any.
    pub(crate) fn choose(&self, me: &str, now: Instant) -> Option<String> {
        let view = self.view.borrow();
        if view.error.is_some() {
            return None;
        }
        let state = lock(&self.state);
        let backing_off = |id: &str| state.refusals.get(id).is_some_and(|r| now < r.until);
        preferred(
            me,
            self.rank,
            &view.candidates,
            self.prefer_after,
            backing_off,
        )
        .map(|c| c.candidate.clone())
    }

    /// An automatic handover to `to` was asked: its answer comes on `answer`.
    pub(crate) fn asked(&self, to: String, answer: oneshot::Receiver<Handover>) {
        lock(&self.state).pending = Some((to, answer));
    }

    /// What the last heartbeat answered.
    pub(crate) fn publish(&self, answer: Result<Vec<Candidate>, String>) {
        self.view.send_modify(|view| match answer {
            Ok(candidates) => {
                view.candidates = candidates;
                view.error = None;
            }
            Err(error) => view.error = Some(error),
        });
    }
}

/// How long an automatic handover's offer stands: two follower attempts with their jitter
/// (the successor takes it at its next attempt, sooner when a release notification wakes it),
/// at most a lease.
pub(crate) fn offer_window(retry: Duration, jitter: f64, lease: Duration) -> Duration {
    retry
        .mul_f64(2.0 * (1.0 + jitter))
        .max(Duration::from_millis(1))
        .min(lease)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(id: &str, rank: i64, live_ms: u64) -> Candidate {
        Candidate::new(
            id,
            rank,
            Duration::from_millis(live_ms),
            Duration::from_secs(10),
        )
    }

    const AFTER: Duration = Duration::from_secs(5);

    #[test]
    fn the_highest_live_long_enough_is_preferred() {
        let all = [c("a", 1, 9000), c("b", 3, 9000), c("c", 2, 9000)];
        let pick =
            |me: &str, rank| preferred(me, rank, &all, AFTER, |_| false).map(|c| &*c.candidate);
        assert_eq!(pick("a", 1), Some("b"));
        assert_eq!(pick("c", 2), Some("b"));
        // Never to an equal or lower rank: the top one keeps it.
        assert_eq!(pick("b", 3), None);
    }

    #[test]
    fn a_top_candidate_not_live_long_enough_is_waited_for() {
        let all = [c("a", 1, 9000), c("b", 3, 4999), c("c", 2, 9000)];
        assert!(preferred("a", 1, &all, AFTER, |_| false).is_none());
        let all = [c("a", 1, 9000), c("b", 3, 5000)];
        assert_eq!(
            preferred("a", 1, &all, AFTER, |_| false).map(|c| &*c.candidate),
            Some("b")
        );
    }

    #[test]
    fn equal_ranks_pick_the_smallest_id_and_back_off_skips() {
        let all = [c("a", 1, 9000), c("z", 3, 9000), c("m", 3, 9000)];
        let pick =
            |off: &str| preferred("a", 1, &all, AFTER, |id| id == off).map(|c| c.candidate.clone());
        assert_eq!(pick("").as_deref(), Some("m"));
        assert_eq!(pick("m").as_deref(), Some("z"));
        // The other top candidate: equal ranks never hand over to each other.
        assert!(preferred("z", 3, &all, AFTER, |_| false).is_none());
    }

    #[test]
    fn ranks_only_ever_rise() {
        // Following the choices from any leader ends at the top rank, each step strictly up.
        let all = [
            c("a", 0, 9000),
            c("b", 5, 9000),
            c("c", 5, 9000),
            c("d", -2, 9000),
        ];
        for start in &all {
            let (mut me, mut rank, mut steps) = (start.candidate.clone(), start.rank, 0);
            while let Some(next) = preferred(&me, rank, &all, AFTER, |_| false) {
                assert!(next.rank > rank);
                (me, rank) = (next.candidate.clone(), next.rank);
                steps += 1;
            }
            assert_eq!(rank, 5);
            assert!(steps <= 1);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_back_off_doubling_and_a_take_forgives() {
        let store = Arc::new(crate::InMemoryLeaseStore::new());
        let (ranking, _view) = Ranking::new(
            store,
            1,
            AFTER,
            Duration::from_secs(20),
            Duration::from_secs(5),
            Duration::from_secs(4),
        );
        ranking.publish(Ok(vec![c("a", 1, 9000), c("b", 3, 9000)]));
        let now = crate::clock::now();
        assert_eq!(ranking.choose("a", now).as_deref(), Some("b"));
        for (round, factor) in [(0u32, 1u32), (1, 2), (2, 4)] {
            let (tx, rx) = oneshot::channel();
            ranking.asked("b".into(), rx);
            assert!(ranking.handing_over());
            ranking.settle(now);
            assert!(ranking.handing_over(), "no answer yet");
            tx.send(Handover::NotTaken).unwrap();
            ranking.settle(now);
            assert!(!ranking.handing_over());
            let back = AFTER * factor;
            assert!(
                ranking
                    .choose("a", now + back - Duration::from_millis(1))
                    .is_none(),
                "{round}"
            );
            assert_eq!(ranking.choose("a", now + back).as_deref(), Some("b"));
        }
        let (tx, rx) = oneshot::channel();
        ranking.asked("b".into(), rx);
        tx.send(Handover::Taken {
            token: crate::FencingToken::new(7),
        })
        .unwrap();
        ranking.settle(now);
        assert_eq!(ranking.choose("a", now).as_deref(), Some("b"));
        // A failed heartbeat: no choice from a view that may be stale.
        ranking.publish(Err("outdated".into()));
        assert!(ranking.choose("a", now).is_none());
    }

    #[test]
    fn offer_windows() {
        let s = Duration::from_secs;
        assert_eq!(offer_window(s(2), 0.0, s(15)), s(4));
        assert_eq!(offer_window(s(2), 0.5, s(15)), s(6));
        assert_eq!(offer_window(s(10), 0.1, s(15)), s(15));
    }
}
