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
use crate::hold::timing::later;
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
        // An id the store cannot name in an offer is never handed to.
        .filter(|c| crate::store::validate_offer_target(&c.candidate).is_ok())
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
    /// How long a heartbeat keeps the candidacy live (`candidacy_ttl`): under the lease, so
    /// that a crashed leader's candidacy lapses before its lease does.
    pub ttl: Duration,
    /// How often it heartbeats (the renew interval, leader or follower).
    pub every: Duration,
    /// How long an automatic handover's offer stands (see `offer_window`).
    pub window: Duration,
    /// The least back-off after a refusal (the larger of `prefer_after` and the lease), so
    /// that `prefer_after` zero still backs off.
    back_off: Duration,
    pub view: watch::Sender<Candidacy>,
    state: Mutex<State>,
}

struct State {
    next_beat: Instant,
    /// The candidacy begins afresh at the next heartbeat (its old row is left first): at the
    /// start (a restarted process with the same id is a new candidacy), after a term ended
    /// badly (a successor that takes the lease but cannot keep it waits `prefer_after` again),
    /// and after a stay-out.
    rejoin: bool,
    /// No heartbeats until then (a step-down's stay-out: a candidate staying out must not be
    /// seen live, or the next leader would offer it the lease).
    resting_until: Option<Instant>,
    refusals: HashMap<String, Refusals>,
    /// The automatic handover under way: to whom, and its answer to come.
    pending: Option<(String, oneshot::Receiver<Handover>)>,
}

impl Ranking {
    pub(crate) fn new(
        members: Arc<dyn MembershipStore>,
        rank: i64,
        prefer_after: Duration,
        (lease, ttl, every, window): (Duration, Duration, Duration, Duration),
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
            back_off: prefer_after.max(lease),
            view,
            state: Mutex::new(State {
                next_beat: crate::clock::now(),
                rejoin: true,
                resting_until: None,
                refusals: HashMap::new(),
                pending: None,
            }),
        };
        (ranking, receiver)
    }

    /// Whether a heartbeat is due at `now`. A leader (`leading`) beats within half an interval
    /// of its time, so that one beat per round (a round starts right after a renew) keeps the
    /// cadence; a follower beats on time (its wait wakes for it). Never while resting.
    pub(crate) fn beat_due(&self, now: Instant, leading: bool) -> bool {
        let state = lock(&self.state);
        if state.resting_until.is_some_and(|until| now < until) {
            return false;
        }
        let slack = if leading {
            self.every / 2
        } else {
            Duration::ZERO
        };
        state.next_beat <= later(now, slack)
    }

    /// When a follower's next heartbeat is due (after a rest, if resting).
    pub(crate) fn next_beat(&self) -> Instant {
        let state = lock(&self.state);
        state
            .resting_until
            .map_or(state.next_beat, |until| until.max(state.next_beat))
    }

    /// The candidacy begins afresh at the next heartbeat (see `State::rejoin`).
    pub(crate) fn rejoin(&self) {
        lock(&self.state).rejoin = true;
    }

    /// Whether the next heartbeat leaves the old row first (and clears the flag).
    pub(crate) fn take_rejoin(&self) -> bool {
        std::mem::take(&mut lock(&self.state).rejoin)
    }

    /// A stay-out until `until`: no heartbeats until then, and the candidacy begins afresh.
    pub(crate) fn rest_until(&self, until: Instant) {
        let mut state = lock(&self.state);
        state.resting_until = Some(until);
        state.rejoin = true;
    }

    /// A heartbeat was sent at `sent`: the next is due an interval later.
    pub(crate) fn beaten(&self, sent: Instant) {
        lock(&self.state).next_beat = sent.checked_add(self.every).unwrap_or(sent);
    }

    /// A heartbeat's call ended at `done`: the next waits at least half an interval more (a
    /// slow one is not followed by another at once).
    pub(crate) fn beat_done(&self, done: Instant) {
        let mut state = lock(&self.state);
        state.next_beat = state.next_beat.max(later(done, self.every / 2));
    }

    /// Whether heartbeats are overdue by half an interval at `now`.
    pub(crate) fn overdue(&self, now: Instant) -> bool {
        later(lock(&self.state).next_beat, self.every / 2) <= now
    }

    /// The next heartbeat is due at once (a term began: the new leader looks right away).
    pub(crate) fn beat_now(&self) {
        lock(&self.state).next_beat = crate::clock::now();
    }

    /// Takes in the answer of an automatic handover, if it came: a successor that took it is
    /// forgiven its earlier refusals; any other answer (not taken; or ended: the offer failed
    /// and the lease was released, or the term was lost meanwhile) backs the successor off
    /// for the back-off times 1, 2, 4, ... (at most [`MOST_BACK_OFF_FACTOR`]), so that nothing
    /// that keeps an offer from working can make the leader end its terms in a loop. A request
    /// dropped before the loop took it (a caller's own step-down replaced it) counts for
    /// nothing.
    pub(crate) fn settle(&self, now: Instant) {
        let mut state = lock(&self.state);
        let Some((to, answer)) = state.pending.as_mut() else {
            return;
        };
        let outcome = match answer.try_recv() {
            Ok(outcome) => Some(outcome),
            Err(oneshot::error::TryRecvError::Empty) => return,
            Err(oneshot::error::TryRecvError::Closed) => None,
        };
        let to = std::mem::take(to);
        state.pending = None;
        // Refusals whose back-off ran out and that were not renewed are forgotten, so the map
        // stays as small as the candidates that keep refusing.
        let stale = self.back_off.saturating_mul(MOST_BACK_OFF_FACTOR);
        state
            .refusals
            .retain(|_, r| now.saturating_duration_since(r.until) < stale);
        match outcome {
            None => {}
            Some(Handover::Taken { .. }) => {
                state.refusals.remove(&to);
            }
            Some(_) => {
                let refusals = state.refusals.entry(to).or_insert(Refusals {
                    count: 0,
                    until: now,
                });
                let factor = 1u32
                    .checked_shl(refusals.count)
                    .unwrap_or(MOST_BACK_OFF_FACTOR)
                    .min(MOST_BACK_OFF_FACTOR);
                refusals.count = refusals.count.saturating_add(1);
                refusals.until = later(now, self.back_off.saturating_mul(factor));
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

/// How long a candidacy heartbeat keeps it live: the lease minus the step-down margin. Every
/// candidate beats each renew interval, and twice that fits in it (the options' rule), so one
/// missed beat is survived; and it is under the lease, so a leader that crashed (its last beat
/// right after its last renew) is no candidate any more by the time its lease lapses and the
/// next leader looks.
pub(crate) fn candidacy_ttl(lease: Duration, margin: Duration) -> Duration {
    lease.saturating_sub(margin).max(crate::store::MIN_LEASE)
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
            (
                Duration::from_secs(3),
                Duration::from_secs(2),
                Duration::from_secs(1),
                Duration::from_secs(1),
            ),
        );
        ranking.publish(Ok(vec![c("a", 1, 9000), c("b", 3, 9000)]));
        let now = crate::clock::now();
        assert_eq!(ranking.choose("a", now).as_deref(), Some("b"));
        // The back-off's base is the larger of prefer_after (5 s) and the lease (3 s).
        for (round, factor) in [(0u32, 1u32), (1, 2), (2, 4)] {
            let (tx, rx) = oneshot::channel();
            ranking.asked("b".into(), rx);
            assert!(ranking.handing_over());
            ranking.settle(now);
            assert!(ranking.handing_over(), "no answer yet");
            // Not taken, or ended (the offer failed): both back off.
            let answer = if round == 1 {
                Handover::Ended
            } else {
                Handover::NotTaken
            };
            tx.send(answer).unwrap();
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
        // A request dropped before the loop took it counts for nothing.
        let (tx, rx) = oneshot::channel::<Handover>();
        ranking.asked("b".into(), rx);
        drop(tx);
        ranking.settle(now);
        assert!(!ranking.handing_over());
        assert_eq!(ranking.choose("a", now).as_deref(), Some("b"));
        // A failed heartbeat: no choice from a view that may be stale.
        ranking.publish(Err("outdated".into()));
        assert!(ranking.choose("a", now).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_prefer_after_still_backs_off() {
        let store = Arc::new(crate::InMemoryLeaseStore::new());
        let lease = Duration::from_secs(3);
        let (ranking, _view) = Ranking::new(
            store,
            1,
            Duration::ZERO,
            (lease, lease, Duration::from_secs(1), Duration::from_secs(1)),
        );
        ranking.publish(Ok(vec![c("a", 1, 0), c("b", 3, 0)]));
        let now = crate::clock::now();
        assert_eq!(ranking.choose("a", now).as_deref(), Some("b"));
        let (tx, rx) = oneshot::channel();
        ranking.asked("b".into(), rx);
        tx.send(Handover::NotTaken).unwrap();
        ranking.settle(now);
        assert!(ranking
            .choose("a", now + lease - Duration::from_millis(1))
            .is_none());
        assert!(ranking.choose("a", now + lease).is_some());
    }

    #[test]
    fn ids_that_cannot_be_offered_are_skipped() {
        let long = "x".repeat(crate::store::MAX_OFFER_TARGET_LEN + 1);
        let all = [c("a", 1, 9000), c(&long, 9, 9000), c("b", 3, 9000)];
        assert_eq!(
            preferred("a", 1, &all, AFTER, |_| false).map(|c| &*c.candidate),
            Some("b")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_resting_candidate_does_not_beat_and_rejoins() {
        let store = Arc::new(crate::InMemoryLeaseStore::new());
        let s = Duration::from_secs;
        let (ranking, _view) = Ranking::new(store, 1, AFTER, (s(3), s(2), s(1), s(1)));
        let now = crate::clock::now();
        assert!(ranking.take_rejoin(), "a new candidacy begins afresh");
        assert!(!ranking.take_rejoin());
        assert!(ranking.beat_due(now, false));
        ranking.rest_until(now + s(5));
        assert!(!ranking.beat_due(now + s(4), true));
        assert_eq!(ranking.next_beat(), now + s(5));
        assert!(ranking.beat_due(now + s(5), false));
        assert!(ranking.take_rejoin());
    }

    #[test]
    fn offer_windows() {
        let s = Duration::from_secs;
        assert_eq!(
            candidacy_ttl(s(15), Duration::from_millis(1500)),
            Duration::from_millis(13_500)
        );
        assert_eq!(offer_window(s(2), 0.0, s(15)), s(4));
        assert_eq!(offer_window(s(2), 0.5, s(15)), s(6));
        assert_eq!(offer_window(s(10), 0.1, s(15)), s(15));
    }
}
