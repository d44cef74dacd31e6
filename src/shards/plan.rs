//! What a node of a shard set should lead next, as a pure function of what it sees: the live
//! members, the resources it holds, the resources nobody holds, the preferences.
//!
//! Every node computes its own plan; nodes that see the same members agree on every target.
//! The plan only says what to *try*: the leases decide, so two plans that disagree (members
//! seen at different moments) cost at most a denied acquire or a resource led a tick late.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use crate::membership::Member;

/// One node's view at one tick.
#[derive(Debug, Clone, Copy)]
pub(crate) struct View<'a> {
    /// This node's member id.
    pub me: &'a str,
    /// The shard set's live members (this node among them, or added if missing); `None` when
    /// the node has no recent view of them (its heartbeats fail): it then takes no share and
    /// hands nothing over, and only takes abandoned resources.
    pub members: Option<&'a [Member]>,
    /// Every resource of the set, in the order configured.
    pub resources: &'a [Arc<str>],
    /// The resources this node leads now.
    pub held: &'a BTreeSet<Arc<str>>,
    /// The resources nobody leads (no live lease, by the database clock).
    pub free: &'a HashSet<Arc<str>>,
    /// The free resources that were free at the previous look too: orphans.
    pub orphans: &'a HashSet<Arc<str>>,
    /// The free resources nobody has led for a whole lease: whoever sees them takes them,
    /// whatever the shares and preferences say (a member that heartbeats but cannot lead, a
    /// preferred member that never takes its resource).
    pub abandoned: &'a HashSet<Arc<str>>,
    /// Held resources this node took because nobody led them for a lease while everyone could
    /// have, again soon after the last time (see `look::Keeps`): kept (not handed over for a
    /// share or a preference) for now, since the member they would go to could not lead them.
    pub keep: &'a HashSet<Arc<str>>,
    /// Held resources this node took because nobody led them for a lease and does not keep:
    /// the first handed over when it is above its share (they are another member's share).
    pub returning: &'a HashSet<Arc<str>>,
    /// Preferred member per resource.
    pub prefer: &'a HashMap<Arc<str>, Arc<str>>,
    /// How far above its share a node may lead before it hands resources over.
    pub slack: usize,
    /// Whether this node is draining (it hands everything over and takes nothing).
    pub draining: bool,
}

/// What to do this tick.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// This node's fair share.
    pub target: usize,
    /// Resources to hand over (end the term, then release).
    pub release: Vec<Arc<str>>,
    /// Free resources to try to acquire, in order.
    pub acquire: Vec<Arc<str>>,
    /// Further free resources, in order, to try instead of one another node took first while
    /// this node is still below its share.
    pub spare: Vec<Arc<str>>,
}

/// The members that take resources (live and not draining), sorted by id, this node included
/// unless it is draining.
fn eligible<'a>(view: &View<'a>) -> Vec<&'a str> {
    let Some(members) = view.members else {
        return Vec::new();
    };
    let mut ids: Vec<&str> = members
        .iter()
        .filter(|m| !m.draining)
        .map(|m| m.member.as_str())
        .collect();
    if !view.draining && !ids.contains(&view.me) {
        ids.push(view.me);
    }
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// This node's share of `n` resources over the eligible members: `n / m`, one more for the
/// first `n % m` members by id, so the shares add up to `n` and none exceeds `ceil(n / m)`.
pub(crate) fn share(n: usize, eligible: &[&str], me: &str) -> usize {
    let Some(index) = eligible.iter().position(|id| *id == me) else {
        return 0; // draining
    };
    let m = eligible.len(); // > 0: `me` is in it
    n / m + usize::from(index < n % m)
}

/// Rendezvous rank of `resource` for `member`: each member prefers the resources it ranks
/// highest, and different members rank differently, so nodes below their share mostly try
/// different free resources. FNV-1a, stable across processes and versions.
pub(crate) fn rank(member: &str, resource: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in member.bytes().chain([0xff]).chain(resource.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The plan for `view`.
pub(crate) fn plan(view: &View<'_>) -> Plan {
    let eligible = eligible(view);
    let known = view.members.is_some();
    let target = if view.draining || !known {
        0
    } else {
        share(view.resources.len(), &eligible, view.me)
    };
    let preferred_by = |r: &Arc<str>| view.prefer.get(r).map(|p| &**p);
    // Preferred by another member that takes resources: that member should lead it.
    let for_other = |r: &Arc<str>| {
        preferred_by(r).is_some_and(|p| p != view.me && eligible.binary_search(&p).is_ok())
    };
    let for_me = |r: &Arc<str>| !view.draining && preferred_by(r) == Some(view.me);
    let by_rank_desc = |list: &mut Vec<Arc<str>>| {
        list.sort_by_key(|r| std::cmp::Reverse((rank(view.me, r), r.clone())));
    };

    let mut release: Vec<Arc<str>> = if view.draining {
        view.held.iter().cloned().collect()
    } else if !known {
        Vec::new() // no view: keep what is held, renewed
    } else {
        view.held
            .iter()
            .filter(|r| for_other(r) && !view.keep.contains(*r))
            .cloned()
            .collect()
    };
    let mut kept: Vec<Arc<str>> = view
        .held
        .iter()
        .filter(|r| !release.contains(r))
        .cloned()
        .collect();
    // Resources kept because nobody else could lead them do not count against the share:
    // otherwise taking them would hand healthy ones over to the member that cannot lead.
    let counted = |kept: &[Arc<str>]| kept.iter().filter(|r| !view.keep.contains(*r)).count();
    if known && counted(&kept) > target.saturating_add(view.slack) {
        // Over the share and the slack: hand over down to the share, the resources this node
        // ranks lowest first, never those that prefer it.
        let excess = counted(&kept) - target;
        let mut movable: Vec<Arc<str>> = kept
            .iter()
            .filter(|r| !for_me(r) && !view.keep.contains(*r))
            .cloned()
            .collect();
        by_rank_desc(&mut movable);
        movable.reverse();
        // Resources taken as abandoned first, and a healthy term moves only if the node is
        // still above its share plus the slack without them.
        let (returning, healthy): (Vec<_>, Vec<_>) = movable
            .into_iter()
            .partition(|r| view.returning.contains(r));
        let mut handed: Vec<Arc<str>> = returning.into_iter().take(excess).collect();
        if counted(&kept) - handed.len() > target.saturating_add(view.slack) {
            handed.extend(healthy.into_iter().take(excess - handed.len()));
        }
        kept.retain(|r| !handed.contains(r));
        release.extend(handed);
    }

    let mut acquire = Vec::new();
    let mut spare = Vec::new();
    if !view.draining && known {
        let mut candidates: Vec<Arc<str>> = view
            .resources
            .iter()
            .filter(|r| view.free.contains(*r) && !view.held.contains(*r) && !for_other(r))
            .cloned()
            .collect();
        by_rank_desc(&mut candidates);
        // Resources that prefer this node: always.
        let (mine, rest): (Vec<_>, Vec<_>) = candidates.into_iter().partition(|r| for_me(r));
        let mut count = counted(&kept) + mine.len();
        acquire.extend(mine);
        // Then free resources up to the share...
        let mut later = Vec::new();
        for r in rest {
            if count < target {
                acquire.push(r);
                count += 1;
            } else {
                later.push(r);
            }
        }
        // ...and orphans (free for a whole interval) up to the share plus the slack: a node
        // that died leaves its resources to whoever sees them first, before the members'
        // shares catch up.
        for r in later {
            if count < target.saturating_add(view.slack) && view.orphans.contains(&r) {
                acquire.push(r);
                count += 1;
            } else {
                spare.push(r);
            }
        }
    }
    if !view.draining {
        // Whatever nobody led for a whole lease, shares and preferences aside (also without a
        // view of the members).
        let mut abandoned: Vec<Arc<str>> = view
            .abandoned
            .iter()
            .filter(|r| !view.held.contains(*r) && !acquire.contains(*r))
            .cloned()
            .collect();
        by_rank_desc(&mut abandoned);
        spare.retain(|r| !abandoned.contains(r));
        acquire.extend(abandoned);
    }
    Plan {
        target,
        release,
        acquire,
        spare,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn members(ids: &[&str]) -> Vec<Member> {
        ids.iter()
            .map(|id| Member::new("set", *id, Duration::from_secs(1)))
            .collect()
    }

    fn names(n: usize) -> Vec<Arc<str>> {
        (0..n).map(|i| Arc::from(format!("shard-{i}"))).collect()
    }

    struct Case {
        members: Vec<Member>,
        resources: Vec<Arc<str>>,
        held: BTreeSet<Arc<str>>,
        free: HashSet<Arc<str>>,
        orphans: HashSet<Arc<str>>,
        abandoned: HashSet<Arc<str>>,
        keep: HashSet<Arc<str>>,
        returning: HashSet<Arc<str>>,
        prefer: HashMap<Arc<str>, Arc<str>>,
        slack: usize,
        draining: bool,
    }

    impl Case {
        fn new(ids: &[&str], n: usize) -> Self {
            let resources = names(n);
            Self {
                members: members(ids),
                free: resources.iter().cloned().collect(),
                resources,
                held: BTreeSet::new(),
                orphans: HashSet::new(),
                abandoned: HashSet::new(),
                keep: HashSet::new(),
                returning: HashSet::new(),
                prefer: HashMap::new(),
                slack: 0,
                draining: false,
            }
        }
        fn plan(&self, me: &str) -> Plan {
            plan(&View {
                me,
                members: Some(&self.members),
                resources: &self.resources,
                held: &self.held,
                free: &self.free,
                orphans: &self.orphans,
                abandoned: &self.abandoned,
                keep: &self.keep,
                returning: &self.returning,
                prefer: &self.prefer,
                slack: self.slack,
                draining: self.draining,
            })
        }
    }

    #[test]
    fn shares_add_up_and_never_exceed_the_ceiling() {
        for n in 0..40 {
            for m in 1..7 {
                let ids: Vec<String> = (0..m).map(|i| format!("n{i}")).collect();
                let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
                let shares: Vec<usize> = refs.iter().map(|me| share(n, &refs, me)).collect();
                assert_eq!(shares.iter().sum::<usize>(), n, "n={n} m={m}");
                assert!(shares.iter().all(|s| *s <= n.div_ceil(m)), "n={n} m={m}");
            }
        }
        assert_eq!(share(5, &["a", "b"], "c"), 0, "not eligible: no share");
    }

    #[test]
    fn a_lone_node_takes_everything_and_two_split() {
        let case = Case::new(&["a"], 8);
        let p = case.plan("a");
        assert_eq!((p.target, p.acquire.len(), p.release.len()), (8, 8, 0));
        let case = Case::new(&["a", "b"], 9);
        assert_eq!(case.plan("a").acquire.len(), 5);
        assert_eq!(
            case.plan("a").spare.len(),
            4,
            "the rest, should some be taken first"
        );
        assert_eq!(case.plan("b").acquire.len(), 4);
        // different nodes try different resources first
        assert_ne!(case.plan("a").acquire[0], case.plan("b").acquire[0]);
    }

    #[test]
    fn a_node_above_share_and_slack_hands_over_down_to_its_share() {
        let mut case = Case::new(&["a", "b", "c"], 12);
        case.held = case.resources.iter().take(8).cloned().collect();
        case.free = case.resources.iter().skip(8).cloned().collect();
        case.slack = 2;
        let p = case.plan("a");
        assert_eq!(p.target, 4);
        assert_eq!(p.release.len(), 4, "8 > 4 + 2: down to 4");
        assert!(p.acquire.is_empty());
        // within the slack: nothing moves
        case.held = case.resources.iter().take(6).cloned().collect();
        let p = case.plan("a");
        assert!(p.release.is_empty() && p.acquire.is_empty(), "{p:?}");
    }

    #[test]
    fn orphans_are_taken_up_to_share_plus_slack() {
        let mut case = Case::new(&["a", "b"], 10);
        case.held = case.resources.iter().take(5).cloned().collect();
        case.free = case.resources.iter().skip(5).cloned().collect();
        case.slack = 1;
        assert!(
            case.plan("a").acquire.is_empty(),
            "at its share, not orphans yet"
        );
        case.orphans = case.free.clone();
        assert_eq!(
            case.plan("a").acquire.len(),
            1,
            "one orphan within the slack"
        );
    }

    #[test]
    fn preferences_go_to_their_member_and_draining_hands_everything_over() {
        let mut case = Case::new(&["a", "b"], 4);
        let r0 = case.resources[0].clone();
        case.prefer.insert(r0.clone(), Arc::from("b"));
        case.held = [r0.clone()].into_iter().collect();
        case.free = case.resources.iter().skip(1).cloned().collect();
        let p = case.plan("a");
        assert_eq!(
            p.release,
            vec![r0.clone()],
            "handed to its preferred member"
        );
        assert!(!p.acquire.contains(&r0));
        // b takes it first when free, whatever its share
        case.held.clear();
        case.free = case.resources.iter().cloned().collect();
        assert_eq!(case.plan("b").acquire[0], r0);
        // a draining preferred member is passed over
        case.members[1].draining = true;
        assert!(case.plan("a").acquire.contains(&r0));
        // a draining node releases everything and takes nothing
        case.members[1].draining = false;
        case.draining = true;
        case.held = case.resources.iter().take(2).cloned().collect();
        let p = case.plan("a");
        assert_eq!((p.target, p.release.len(), p.acquire.len()), (0, 2, 0));
        // and the others' shares grow
        case.draining = false;
        case.members[0].draining = true;
        case.held.clear();
        assert_eq!(case.plan("b").target, 4);
    }

    /// Without a view of the members a node takes no share and hands nothing over; resources
    /// nobody led for a lease are taken by whoever sees them, preferences and shares aside.
    #[test]
    fn no_view_takes_only_abandoned_resources() {
        let mut case = Case::new(&["a", "b"], 6);
        case.held = case.resources.iter().take(4).cloned().collect();
        case.free = case.resources.iter().skip(4).cloned().collect();
        case.orphans = case.free.clone();
        let unknown = |case: &Case| {
            plan(&View {
                me: "a",
                members: None,
                resources: &case.resources,
                held: &case.held,
                free: &case.free,
                orphans: &case.orphans,
                abandoned: &case.abandoned,
                keep: &case.keep,
                returning: &case.returning,
                prefer: &case.prefer,
                slack: 0,
                draining: false,
            })
        };
        let p = unknown(&case);
        assert_eq!(
            (p.target, p.release.len(), p.acquire.len()),
            (0, 0, 0),
            "{p:?}"
        );
        case.abandoned = case.free.clone();
        assert_eq!(unknown(&case).acquire.len(), 2);
        // with a view, at its share plus slack, abandoned resources are taken too
        let r5 = case.resources[5].clone();
        case.prefer.insert(r5.clone(), Arc::from("b"));
        case.held = case.resources.iter().take(3).cloned().collect();
        let p = case.plan("a");
        assert!(
            p.acquire.contains(&r5),
            "abandoned beats a preference: {p:?}"
        );
    }

    /// Over its share, a node hands back what it took as abandoned before any healthy term,
    /// whatever their ranks; what it keeps stays.
    #[test]
    fn resources_taken_as_abandoned_go_back_first() {
        let mut case = Case::new(&["a", "b"], 8);
        case.held = case.resources.iter().cloned().collect();
        case.free.clear();
        let lowest_first = case.plan("a").release;
        assert_eq!(lowest_first.len(), 4);
        // The four a ranks highest were taken as abandoned: they go, not the lowest ranked.
        let mut by_rank = case.resources.clone();
        by_rank.sort_by_key(|r| std::cmp::Reverse(rank("a", r)));
        case.returning = by_rank.iter().take(4).cloned().collect();
        let p = case.plan("a");
        let released: HashSet<Arc<str>> = p.release.iter().cloned().collect();
        assert_eq!(released, case.returning, "{p:?}");
        // Kept ones are not counted, and stay.
        case.keep = by_rank.iter().take(2).cloned().collect();
        case.returning = by_rank.iter().skip(2).take(2).cloned().collect();
        let p = case.plan("a");
        assert_eq!(p.release.len(), 2, "{p:?}");
        assert!(
            p.release.iter().all(|r| case.returning.contains(r)),
            "{p:?}"
        );
    }

    /// Ticks every node's plan against a shared map of leases until nothing moves: every
    /// resource is led, and no node exceeds its ceiling plus the slack.
    #[test]
    fn rounds_converge_to_a_balanced_assignment() {
        for (n, ids, slack) in [
            (256usize, vec!["a", "b", "c", "d", "e"], 1usize),
            (10, vec!["a", "b", "c"], 0),
            (7, vec!["x", "y"], 2),
        ] {
            let resources = names(n);
            let mut owner: HashMap<Arc<str>, &str> = HashMap::new();
            // cold start: the first node alone, then everyone
            for round in 0..20 {
                let live: Vec<&str> = if round == 0 {
                    vec![ids[0]]
                } else {
                    ids.clone()
                };
                for me in &live {
                    let held: BTreeSet<Arc<str>> = owner
                        .iter()
                        .filter(|(_, o)| *o == me)
                        .map(|(r, _)| r.clone())
                        .collect();
                    let free: HashSet<Arc<str>> = resources
                        .iter()
                        .filter(|r| !owner.contains_key(*r))
                        .cloned()
                        .collect();
                    let p = plan(&View {
                        me,
                        members: Some(&members(&live)),
                        resources: &resources,
                        held: &held,
                        free: &free,
                        orphans: &free,
                        abandoned: &HashSet::new(),
                        keep: &HashSet::new(),
                        returning: &HashSet::new(),
                        prefer: &HashMap::new(),
                        slack,
                        draining: false,
                    });
                    for r in p.release {
                        owner.remove(&r);
                    }
                    for r in p.acquire {
                        owner.entry(r).or_insert(me);
                    }
                }
            }
            assert_eq!(owner.len(), n, "every resource led");
            for me in &ids {
                let count = owner.values().filter(|o| *o == me).count();
                assert!(count <= n.div_ceil(ids.len()) + slack, "{me}: {count}");
            }
        }
    }
}
