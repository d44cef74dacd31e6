//! What a node makes of its looks at the leases and the members, as values: which resources are
//! free, orphaned or abandoned, since when each member has been present, and whether a resource
//! taken as abandoned is kept (see [`super::plan::View::keep`]).
//!
//! Pure: the runner feeds it the store's answers and the local times they were read at.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

use crate::membership::Member;

/// The free resources at one look, by how long they have been free.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Free {
    /// Nobody leads them (no live lease by the database clock).
    pub free: HashSet<Arc<str>>,
    /// Free for a whole round: a node that died left them.
    pub orphans: HashSet<Arc<str>>,
    /// Free for a whole lease: whoever sees them takes them.
    pub abandoned: HashSet<Arc<str>>,
}

/// Whether the members' counts, as this round's heartbeat answered them, say that no resource
/// of the set can be free, so this round's look at the set's leases can be skipped: every live
/// member (`me` among them) reports what it leads for the same list of resources (`set_hash`),
/// none is late with its heartbeat (more than two intervals since its last, judged by its
/// remaining time against this node's `lease`: a member that stops heartbeating is about to
/// leave its leases to lapse), and together they lead at least every resource.
///
/// Each member counts only the terms it leads at its heartbeat (never those it is handing
/// over, nor those it acquires after it), and two members never lead one resource at once, so
/// the sum overstates what is led only for a term that ended between its member's heartbeat
/// and this one's: a round late at most. Any doubt means a look.
pub(crate) fn nothing_free(
    members: &[Member],
    me: &str,
    set_hash: u64,
    resources: usize,
    lease: Duration,
    interval: Duration,
) -> bool {
    if !members.iter().any(|m| m.member == me) {
        return false;
    }
    let late = interval.saturating_mul(2);
    let mut led: u64 = 0;
    for m in members {
        let Some(holding) = m.holding else {
            return false;
        };
        if holding.set_hash != set_hash || lease.saturating_sub(m.remaining) > late {
            return false;
        }
        led = led.saturating_add(holding.leases);
    }
    led >= u64::try_from(resources).unwrap_or(u64::MAX)
}

/// Since when each resource has been seen free, across looks.
#[derive(Debug, Default)]
pub(crate) struct FreeSince(HashMap<Arc<str>, Instant>);

impl FreeSince {
    /// Takes a look that found `free` at `looked`.
    pub fn look(
        &mut self,
        free: HashSet<Arc<str>>,
        looked: Instant,
        interval: Duration,
        lease: Duration,
    ) -> Free {
        self.0.retain(|r, _| free.contains(r));
        for r in &free {
            self.0.entry(r.clone()).or_insert(looked);
        }
        let free_for = |at_least: Duration| -> HashSet<Arc<str>> {
            self.0
                .iter()
                .filter(|(_, since)| looked.saturating_duration_since(**since) >= at_least)
                .map(|(r, _)| r.clone())
                .collect()
        };
        // Orphans: free for a whole round, not merely at two looks (a release notification
        // makes rounds come quickly, and a resource just handed over to a joining node is not
        // an orphan).
        let orphans = free_for(interval);
        let abandoned = free_for(lease);
        Free {
            free,
            orphans,
            abandoned,
        }
    }

    /// A look failed: nothing becomes "abandoned" by a gap between looks.
    pub fn forget(&mut self) {
        self.0.clear();
    }

    /// Since when `resource` has been seen free.
    pub fn since(&self, resource: &str) -> Option<Instant> {
        self.0.get(resource).copied()
    }
}

/// Since when this node has seen each member present in its current membership: from the
/// heartbeat that first showed it, or showed it with a later `joined_at` (a member that lapsed
/// and came back between two of this node's heartbeats).
#[derive(Debug, Default)]
pub(crate) struct Presence(HashMap<String, (Option<DateTime<Utc>>, Instant)>);

impl Presence {
    /// A heartbeat sent at `sent` answered `members`.
    pub fn seen(&mut self, members: &[Member], sent: Instant) {
        self.0
            .retain(|id, _| members.iter().any(|m| m.member == *id));
        for m in members {
            match self.0.get_mut(&m.member) {
                Some((joined, _)) if *joined == m.joined_at => {}
                Some(entry) => *entry = (m.joined_at, sent),
                None => {
                    self.0.insert(m.member.clone(), (m.joined_at, sent));
                }
            }
        }
    }

    /// Whether every member other than `me` that takes resources (`members` not draining) has
    /// been present since `since` or earlier.
    pub fn all_present_since(&self, members: &[Member], me: &str, since: Instant) -> bool {
        members
            .iter()
            .filter(|m| !m.draining && m.member != me)
            .all(|m| self.0.get(&m.member).is_some_and(|(_, at)| *at <= since))
    }
}

/// Whether a node that takes a resource free since `since` (nobody led it for a whole lease)
/// keeps it outside its share until the members change. Only when its staying free says
/// something about the other members: every one of them was present the whole time, so had it
/// to take the resource (a member that heartbeats but cannot lead, a preferred member that never
/// takes its resource), and this node's own store calls all succeeded meanwhile (`troubled_at`:
/// its last failed or unanswered call), so the database answered. Otherwise (a member was away
/// or came back: stopped, cut off, restarted; or every node was cut off from the database
/// together, this one too) the resource counts against the taker's share like any other, and
/// goes back once the shares say so.
pub(crate) fn keeps(
    presence: &Presence,
    members: &[Member],
    me: &str,
    since: Instant,
    troubled_at: Option<Instant>,
) -> bool {
    troubled_at.is_none_or(|at| at < since) && presence.all_present_since(members, me, since)
}

/// The members a node's kept resources were taken under: a change (a join, a leave, a drain, a
/// member that lapsed and came back) clears them, since every share may be led now.
pub(crate) fn keep_key(members: &[Member]) -> Vec<(String, bool, Option<DateTime<Utc>>)> {
    members
        .iter()
        .map(|m| (m.member.clone(), m.draining, m.joined_at))
        .collect()
}

/// The longest keep: 2^6 = 64 leases.
const MAX_KEEP_LEVEL: u32 = 6;

/// The resources nobody led for a lease, as this node saw them (every node looks at every
/// lease, so the nodes agree), and those this node took so, outside its share for a while.
///
/// A resource abandoned for the first time (or long after the last time) is at level 0: its
/// taker counts it against its share like any other, and hands it back first. Abandoned again
/// soon after (within the last keep, a handover and two leases of when the last time began),
/// while every other member was present and the node's own calls succeeded, its level rises: the taker keeps it outside its share for 2 leases, then 4, 8, up to
/// 64. A member that could not lead for a moment (the database restarted, its connections
/// broke) gets its share back at the next rounds; one that heartbeats but never leads costs its
/// resource a lease without a leader ever more rarely, whichever member takes it each time. A
/// change of the members forgets the levels and ends every keep.
#[derive(Debug, Default)]
pub(crate) struct Keeps {
    members: Vec<(String, bool, Option<DateTime<Utc>>)>,
    /// Per resource seen abandoned: its level, when its latest time of being abandoned began,
    /// and whether that time is still on (no look has found it led since).
    abandoned: HashMap<Arc<str>, (u32, Instant, bool)>,
    /// Held resources this node took as abandoned, and until when each is kept (`None` or a
    /// past instant: not kept, it goes back first).
    taken: HashMap<Arc<str>, Option<Instant>>,
}

impl Keeps {
    /// The members a heartbeat answered: a change forgets the levels and ends every keep.
    pub fn members(&mut self, members: &[Member]) {
        let key = keep_key(members);
        if key != self.members {
            self.abandoned.clear();
            self.taken.values_mut().for_each(|until| *until = None);
            self.members = key;
        }
    }

    /// A look at `looked` found `free` unled, and `abandoned` unled for long (half a lease,
    /// which every node sees before anyone takes it) while that said something about the
    /// other members (see [`keeps`]: every other member was present the whole time, this
    /// node's own calls all succeeded): only those count.
    /// `handover`: how long a handed-over resource may take to be released (its work's grace
    /// period, and a round).
    pub fn look(
        &mut self,
        free: &HashSet<Arc<str>>,
        abandoned: &HashSet<Arc<str>>,
        looked: Instant,
        lease: Duration,
        handover: Duration,
    ) {
        for r in abandoned {
            match self.abandoned.get_mut(r) {
                Some((_, _, true)) => {} // the same time, still on
                Some((level, began, on)) if soon(*level, *began, looked, lease, handover) => {
                    *level = (*level + 1).min(MAX_KEEP_LEVEL);
                    *began = looked;
                    *on = true;
                }
                _ => {
                    self.abandoned.insert(r.clone(), (0, looked, true));
                }
            }
        }
        for (r, (_, _, on)) in self.abandoned.iter_mut() {
            if !free.contains(r) {
                *on = false; // led again
            }
        }
        self.abandoned
            .retain(|_, (level, began, on)| *on || soon(*level, *began, looked, lease, handover));
    }

    /// This node took `resource` at `now` as abandoned; `may_keep`: while everyone could have
    /// led it (see [`keeps`]), so its level says how long it is kept.
    pub fn taken(&mut self, resource: Arc<str>, now: Instant, lease: Duration, may_keep: bool) {
        let level = match self.abandoned.get(&resource) {
            Some((level, _, _)) if may_keep => *level,
            _ => 0,
        };
        let until = (level > 0)
            .then(|| now.checked_add(lease.saturating_mul(1 << level)))
            .flatten();
        self.taken.insert(resource, until);
    }

    /// The resources of `held` kept at `now`, and those taken as abandoned and not (or no
    /// longer) kept, which go back first when the node is over its share (they are another
    /// member's share; a healthy term stays where it is).
    pub fn sorted(
        &mut self,
        held: &std::collections::BTreeSet<Arc<str>>,
        now: Instant,
    ) -> (HashSet<Arc<str>>, HashSet<Arc<str>>) {
        self.taken.retain(|r, _| held.contains(r));
        let mut kept = HashSet::new();
        let mut returning = HashSet::new();
        for (r, until) in &self.taken {
            if until.is_some_and(|until| now < until) {
                kept.insert(r.clone());
            } else {
                returning.insert(r.clone());
            }
        }
        (kept, returning)
    }
}

/// Whether a resource abandoned at `looked` counts as abandoned again soon after the time that
/// began at `began` (at `level`): within its keep, its handover, and two leases.
fn soon(level: u32, began: Instant, looked: Instant, lease: Duration, handover: Duration) -> bool {
    let keep = if level == 0 {
        Duration::ZERO
    } else {
        lease.saturating_mul(1 << level)
    };
    let window = keep
        .saturating_add(handover)
        .saturating_add(lease.saturating_mul(2));
    looked.saturating_duration_since(began) <= window
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> HashSet<Arc<str>> {
        names.iter().map(|n| Arc::from(*n)).collect()
    }

    fn member(id: &str, joined: Option<i64>) -> Member {
        let mut m = Member::new("set", id, Duration::from_secs(1));
        m.joined_at = joined.and_then(|s| DateTime::from_timestamp(s, 0));
        m
    }

    #[test]
    fn resources_age_from_free_to_orphaned_to_abandoned() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let (interval, lease) = (ms(150), ms(500));
        let mut since = FreeSince::default();
        let f = since.look(set(&["a", "b"]), t0, interval, lease);
        assert_eq!((f.orphans.len(), f.abandoned.len()), (0, 0));
        let f = since.look(set(&["a", "b"]), t0 + ms(150), interval, lease);
        assert_eq!((f.orphans, f.abandoned.len()), (set(&["a", "b"]), 0));
        // b was led in between: its age starts again.
        let f = since.look(set(&["a"]), t0 + ms(300), interval, lease);
        assert_eq!(f.free, set(&["a"]));
        let f = since.look(set(&["a", "b"]), t0 + ms(500), interval, lease);
        assert_eq!((f.orphans, f.abandoned), (set(&["a"]), set(&["a"])));
        assert_eq!(since.since("b"), Some(t0 + ms(500)));
        since.forget();
        let f = since.look(set(&["a"]), t0 + ms(600), interval, lease);
        assert!(f.orphans.is_empty() && f.abandoned.is_empty());
    }

    #[test]
    fn a_resource_is_kept_only_if_everyone_had_the_time_and_the_database_answered() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut p = Presence::default();
        let all = [
            member("a", Some(1)),
            member("b", Some(1)),
            member("c", Some(1)),
        ];
        p.seen(&all, t0);
        assert!(keeps(&p, &all, "a", t0, None));
        // Free since before they were seen: they had not the whole time.
        assert!(!keeps(&p, &all, "a", t0 - s(1), None));
        // This node's own calls failed while it was free: the database did not answer everyone.
        assert!(!keeps(&p, &all, "a", t0, Some(t0 + s(1))));
        assert!(keeps(&p, &all, "a", t0 + s(2), Some(t0 + s(1))));
        // c lapsed and came back between two of a's heartbeats: a later joined_at.
        let back = [
            member("a", Some(1)),
            member("b", Some(1)),
            member("c", Some(5)),
        ];
        p.seen(&back, t0 + s(5));
        assert!(!keeps(&p, &back, "a", t0 + s(2), None));
        assert!(keeps(&p, &back, "a", t0 + s(5), None));
        // b left and came back (no database times: the in-memory store).
        p.seen(&[member("a", None), member("c", None)], t0 + s(6));
        let again = [member("a", None), member("b", None)];
        p.seen(&again, t0 + s(7));
        assert!(!keeps(&p, &again, "a", t0 + s(6), None));
        // A draining member takes nothing: it is not asked about.
        let mut draining = member("d", None);
        draining.draining = true;
        assert!(keeps(
            &p,
            &[member("a", None), draining],
            "a",
            t0 + s(9),
            None
        ));
    }

    #[test]
    fn a_keep_starts_at_nothing_and_doubles_while_the_resource_is_abandoned_again_soon() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // A handover of three rounds: the same windows as two leases and three intervals.
        let (lease, interval) = (ms(500), ms(450));
        let r: Arc<str> = Arc::from("r");
        let one = set(&["r"]);
        let none = HashSet::new();
        let held: std::collections::BTreeSet<Arc<str>> = [r.clone()].into();
        let mut k = Keeps::default();
        k.members(&[member("a", Some(1)), member("b", Some(1))]);
        // Abandoned for the first time: taken, counted like any other, the first to go back.
        k.look(&one, &one, t0, lease, interval);
        k.look(&one, &one, t0 + ms(150), lease, interval); // the same time, still on
        k.taken(r.clone(), t0 + ms(150), lease, true);
        let (kept, returning) = k.sorted(&held, t0 + ms(150));
        assert!(kept.is_empty() && returning.contains(&r));
        // Led (by whoever), handed back, abandoned again soon: kept for 2 leases.
        k.look(&none, &none, t0 + ms(300), lease, interval);
        let t1 = t0 + ms(1100);
        k.look(&one, &one, t1, lease, interval);
        k.taken(r.clone(), t1, lease, true);
        assert!(k.sorted(&held, t1 + ms(999)).0.contains(&r));
        let (kept, returning) = k.sorted(&held, t1 + ms(1000));
        assert!(kept.is_empty() && returning.contains(&r));
        // Led through its keep, handed back, abandoned again: 4 leases, whoever takes it.
        for step in 1..=12 {
            k.look(&none, &none, t1 + ms(150 * step), lease, interval);
        }
        let t2 = t1 + ms(2000);
        k.look(&one, &one, t2, lease, interval);
        k.taken(r.clone(), t2, lease, true);
        assert!(k.sorted(&held, t2 + ms(1999)).0.contains(&r));
        assert!(k.sorted(&held, t2 + ms(2000)).0.is_empty());
        // Taken while this node's own calls failed (or someone was away): never kept.
        k.taken(r.clone(), t2, lease, false);
        assert!(k.sorted(&held, t2).0.is_empty());
        // Up to 64 leases.
        let mut t = t2;
        for _ in 0..10 {
            k.look(&none, &none, t + ms(10), lease, interval);
            t += ms(20);
            k.look(&one, &one, t, lease, interval);
        }
        k.taken(r.clone(), t, lease, true);
        assert!(k.sorted(&held, t + ms(500 * 64 - 1)).0.contains(&r));
        assert!(k.sorted(&held, t + ms(500 * 64)).0.is_empty());
        // Not held: not kept.
        assert!(k.sorted(&Default::default(), t).0.is_empty());
        // Long after the last time: back to level 0.
        let late = t + ms(500 * 64) + ms(1000 + 450 + 1);
        k.look(&none, &none, late - ms(1), lease, interval);
        k.look(&one, &one, late, lease, interval);
        k.taken(r.clone(), late, lease, true);
        assert!(k.sorted(&held, late).0.is_empty());
        // A change of the members ends the keeps; what was taken still goes back first.
        k.look(&none, &none, late + ms(10), lease, interval);
        k.look(&one, &one, late + ms(20), lease, interval);
        k.taken(r.clone(), late + ms(20), lease, true);
        assert!(k.sorted(&held, late + ms(20)).0.contains(&r));
        k.members(&[member("a", Some(1)), member("b", Some(2))]);
        let (kept, returning) = k.sorted(&held, late + ms(20));
        assert!(kept.is_empty() && returning.contains(&r));
        k.look(&none, &none, late + ms(30), lease, interval);
        k.look(&one, &one, late + ms(40), lease, interval);
        k.taken(r.clone(), late + ms(40), lease, true);
        assert!(k.sorted(&held, late + ms(40)).0.is_empty());
    }

    #[test]
    fn the_keep_key_sees_a_member_come_back() {
        assert_ne!(
            keep_key(&[member("a", Some(1))]),
            keep_key(&[member("a", Some(2))])
        );
        assert_eq!(
            keep_key(&[member("a", None)]),
            keep_key(&[member("a", None)])
        );
    }

    #[test]
    fn a_look_is_skipped_only_when_every_member_counts_every_resource_led() {
        let list = ["r0", "r1", "r2", "r3", "r4"];
        let hash = crate::membership::Holding::fingerprint(&list);
        let (lease, interval) = (Duration::from_secs(10), Duration::from_secs(2));
        let counted = |id: &str, leases: u64, remaining: Duration| {
            let mut m = Member::new("set", id, remaining);
            m.holding = Some(crate::membership::Holding::new(leases, &list));
            m
        };
        let fresh = lease - Duration::from_millis(100);
        let skip =
            |members: &[Member]| nothing_free(members, "a", hash, list.len(), lease, interval);
        assert!(skip(&[counted("a", 3, fresh), counted("b", 2, fresh)]));
        // Every resource led is enough; more (a term that just ended) still is.
        assert!(skip(&[counted("a", 3, fresh), counted("b", 3, fresh)]));
        // One resource not counted: look.
        assert!(!skip(&[counted("a", 3, fresh), counted("b", 1, fresh)]));
        // A member that does not report (an older node, a store without the columns).
        let mut silent = counted("b", 2, fresh);
        silent.holding = None;
        assert!(!skip(&[counted("a", 3, fresh), silent]));
        // A member with another list: its count says nothing about this one.
        let mut other = counted("b", 2, fresh);
        other.holding = Some(crate::membership::Holding::new(2, &["r0", "r1"]));
        assert!(!skip(&[counted("a", 3, fresh), other]));
        // A member more than two intervals past its heartbeat: it may be dying.
        let late = lease - interval * 2 - Duration::from_millis(1);
        assert!(!skip(&[counted("a", 3, fresh), counted("b", 2, late)]));
        assert!(skip(&[
            counted("a", 3, fresh),
            counted("b", 2, lease - interval * 2)
        ]));
        // This node's own row missing from the answer: look.
        assert!(!skip(&[counted("b", 5, fresh)]));
        // A draining member's count counts as any other's.
        let mut draining = counted("b", 2, fresh);
        draining.draining = true;
        assert!(skip(&[counted("a", 3, fresh), draining]));
    }
}
