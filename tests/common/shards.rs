//! Shard sets and their membership, as tests generic over any store with leases and
//! membership. Every such store runs them through `shard_suite!`.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use orion_beacon::{
    store::LeaseOutcome, Assignment, Holding, LeaseRecord, LeaseStore, MembershipStore,
    ShardHandle, ShardSet, StoreError,
};
use tokio::time::Instant;

use super::conformance::{Harness, LONG, PAST_SHORT, SHORT};
use super::double::{Double, Intercept};
use super::unique;

/// Heartbeats make members, judged by the database clock; leave removes them; draining is
/// reported; bad input is refused before any SQL.
pub async fn members_heartbeat_and_leave<H: Harness>(h: &H)
where
    H::Store: MembershipStore,
{
    let store = h.store();
    let set = unique("set");
    let members = store.heartbeat(&set, "node-b", LONG, false).await.unwrap();
    assert_eq!(ids(&members), ["node-b"]);
    let members = store.heartbeat(&set, "node-a", LONG, true).await.unwrap();
    assert_eq!(ids(&members), ["node-a", "node-b"], "ordered by id");
    assert!(members[0].draining && !members[1].draining);
    assert!(members[0].remaining > LONG - Duration::from_secs(5));
    assert!(members[0].remaining <= LONG + Duration::from_secs(1));
    // another set is another membership
    let other = unique("set");
    assert_eq!(
        ids(&store.members(&other).await.unwrap()),
        Vec::<String>::new()
    );
    // a heartbeat moves the flag and the expiry
    let members = store.heartbeat(&set, "node-a", SHORT, false).await.unwrap();
    assert!(!members[0].draining);
    assert!(members[0].remaining <= SHORT);
    tokio::time::sleep(PAST_SHORT).await;
    assert_eq!(
        ids(&store.members(&set).await.unwrap()),
        ["node-b"],
        "a lapsed heartbeat is no member"
    );
    // and comes back as a new membership
    let members = store.heartbeat(&set, "node-a", LONG, false).await.unwrap();
    assert_eq!(ids(&members), ["node-a", "node-b"]);
    assert!(store.leave(&set, "node-a").await.unwrap());
    assert!(!store.leave(&set, "node-a").await.unwrap(), "already gone");
    assert_eq!(ids(&store.members(&set).await.unwrap()), ["node-b"]);
    // bad input
    let err = store.heartbeat("", "a", LONG, false).await.unwrap_err();
    assert!(matches!(err, StoreError::InvalidShardSet { .. }), "{err:?}");
    let err = store.heartbeat(&set, " a", LONG, false).await.unwrap_err();
    assert!(
        matches!(err, StoreError::InvalidCandidate { .. }),
        "{err:?}"
    );
    let err = store
        .heartbeat(&set, "a", Duration::ZERO, false)
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::InvalidLeaseDuration { .. }),
        "{err:?}"
    );
    let err = store.members("a\n").await.unwrap_err();
    assert!(matches!(err, StoreError::InvalidShardSet { .. }), "{err:?}");
    store.leave(&set, "node-b").await.unwrap();
}

fn ids(members: &[orion_beacon::Member]) -> Vec<String> {
    members.iter().map(|m| m.member.clone()).collect()
}

/// `current_all` reads many leases at once (across its statement chunks), live or not.
pub async fn current_all_reads_many_leases<H: Harness>(h: &H) {
    let store = h.store();
    let prefix = unique("ca");
    let names: Vec<String> = (0..2100).map(|i| format!("{prefix}-{i}")).collect();
    for (i, name) in names.iter().enumerate().filter(|(i, _)| i % 700 == 3) {
        let outcome = store.acquire_or_renew(name, "a", LONG).await.unwrap();
        assert!(matches!(outcome, LeaseOutcome::Acquired(_)), "{i}");
    }
    assert!(store.release(&names[703], "a").await.unwrap());
    let mut records = store.current_all(&names).await.unwrap();
    records.sort_by(|a, b| a.resource.cmp(&b.resource));
    let seen: BTreeMap<&str, bool> = records
        .iter()
        .map(|r| (r.resource.as_str(), r.live))
        .collect();
    let expected: BTreeMap<&str, bool> = [3, 703, 1403, 2103]
        .iter()
        .filter_map(|i| names.get(*i))
        .map(|n| (n.as_str(), *n != names[703]))
        .collect();
    assert_eq!(seen, expected);
    let bad = vec![names[0].clone(), String::new()];
    let err = store.current_all(&bad).await.unwrap_err();
    assert!(matches!(err, StoreError::InvalidResource { .. }), "{err:?}");
    assert!(store.current_all(&[]).await.unwrap().is_empty());
}

/// Who leads each resource now, by node, with tokens; panics if two nodes lead one resource
/// with current terms.
fn leaders(nodes: &[(&str, &ShardHandle)]) -> HashMap<String, (String, i64)> {
    let mut led = HashMap::new();
    for (name, node) in nodes {
        for term in node.assignment().current() {
            let previous = led.insert(
                term.resource().to_owned(),
                (name.to_string(), term.token().get()),
            );
            assert!(
                previous.is_none(),
                "{} led by {previous:?} and {name} at once",
                term.resource()
            );
        }
    }
    led
}

/// Waits (real time, polling) until `check` holds for the nodes' assignments, or panics.
async fn eventually(
    what: &str,
    within: Duration,
    nodes: &[(&str, &ShardHandle)],
    check: impl Fn(&HashMap<String, (String, i64)>) -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        let led = leaders(nodes);
        if check(&led) {
            return start.elapsed();
        }
        if start.elapsed() > within {
            let counts = counts(&led);
            panic!("{what}: not within {within:?}; led per node {counts:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn counts(led: &HashMap<String, (String, i64)>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (node, _) in led.values() {
        *counts.entry(node.clone()).or_insert(0) += 1;
    }
    counts
}

/// A node `id` of the shard set `set` over `resources`, without slack, started.
fn start_node<S: orion_beacon::ShardStore + 'static>(
    store: S,
    set: &str,
    resources: &[String],
    id: &str,
    lease: Duration,
    interval: Duration,
) -> ShardHandle {
    ShardSet::builder(store)
        .name(set)
        .resources(resources.to_vec())
        .member_id(id)
        .lease_duration(lease)
        .interval(interval)
        .slack(0)
        .grace_period(Duration::from_millis(500))
        .build()
        .expect("valid shard set")
        .start()
}

/// Three nodes (separate connection pools, as processes have) spread 12 resources: a lone
/// node leads all, joiners get their share by graceful handovers (the new term's token is
/// higher), a killed node's resources are re-led within lease + two rounds, a drained node
/// hands everything over, and shutdown releases every lease.
pub async fn shard_set_spreads_rebalances_and_recovers<H: Harness>(h: &H)
where
    H::Store: MembershipStore,
{
    const N: usize = 12;
    let lease = Duration::from_millis(1500);
    let interval = Duration::from_millis(250);
    let set = unique("shards");
    let resources: Vec<String> = (0..N).map(|i| format!("{set}-{i}")).collect();
    let node = |store: H::Store, id: &str| start_node(store, &set, &resources, id, lease, interval);
    let a = node(h.separate_store().await, "node-a");
    eventually(
        "a lone node leads everything",
        Duration::from_secs(5),
        &[("a", &a)],
        |led| led.len() == N,
    )
    .await;
    let before = leaders(&[("a", &a)]);

    let b = node(h.separate_store().await, "node-b");
    let c = node(h.separate_store().await, "node-c");
    let all = [("a", &a), ("b", &b), ("c", &c)];
    let took = eventually("balanced over three", Duration::from_secs(8), &all, |led| {
        led.len() == N && counts(led).values().all(|n| *n == N / 3)
    })
    .await;
    eprintln!("balanced over three nodes {took:?} after the joins");
    // Handed-over resources start a new term: a higher token.
    for (resource, (node, token)) in leaders(&all) {
        if node != "a" {
            assert!(
                token > before[&resource].1,
                "{resource}: {token} after {:?}",
                before[&resource]
            );
        }
    }

    // c dies: its resources lapse and are led again by a and b.
    let c_led: Vec<String> = c.assignment().led.keys().map(|r| r.to_string()).collect();
    c.abort().await;
    let survivors = [("a", &a), ("b", &b)];
    let gap = eventually(
        "a dead node's resources are led again",
        lease + interval * 8,
        &survivors,
        |led| {
            c_led.iter().all(|r| led.contains_key(r)) && counts(led).values().all(|n| *n == N / 2)
        },
    )
    .await;
    eprintln!("re-led {gap:?} after the kill (lease {lease:?}, interval {interval:?})");

    // b drains: a leads everything, each b term ended for the handover.
    let b_terms: Vec<_> = b.assignment().led.values().cloned().collect();
    tokio::time::timeout(Duration::from_secs(5), b.drain())
        .await
        .expect("drain completes");
    for term in &b_terms {
        assert_eq!(
            term.loss_reason(),
            Some(orion_beacon::LossReason::HandedOver)
        );
    }
    eventually(
        "a leads all after the drain",
        Duration::from_secs(5),
        &[("a", &a)],
        |led| led.len() == N,
    )
    .await;
    b.shutdown().await;

    // Shutdown releases every lease at once (no lapse needed).
    a.shutdown().await;
    let store = h.store();
    for record in store.current_all(&resources).await.unwrap() {
        assert!(
            !record.live,
            "{} still live after shutdown",
            record.resource
        );
    }
    assert!(
        store.members(&set).await.unwrap().is_empty(),
        "everyone left"
    );
}

/// A heartbeat with what the member leads shows it to every member; a plain heartbeat clears
/// it.
pub async fn members_report_what_they_lead<H: Harness>(h: &H)
where
    H::Store: MembershipStore,
{
    let store = h.store();
    let set = unique("set");
    let list = ["x", "y", "z"];
    let holding = Holding::new(2, &list);
    let members = store
        .heartbeat_holding(&set, "node-a", LONG, false, holding)
        .await
        .unwrap();
    assert_eq!(members[0].holding, Some(holding));
    let members = store.heartbeat(&set, "node-b", LONG, false).await.unwrap();
    assert_eq!(
        members.iter().map(|m| m.holding).collect::<Vec<_>>(),
        [Some(holding), None]
    );
    assert_eq!(store.members(&set).await.unwrap()[0].holding, Some(holding));
    // The largest counts and fingerprints come back as they went.
    let big = Holding::new(u64::try_from(i64::MAX).unwrap(), &["\u{10ffff}"]);
    store
        .heartbeat_holding(&set, "node-a", LONG, false, big)
        .await
        .unwrap();
    assert_eq!(store.members(&set).await.unwrap()[0].holding, Some(big));
    store.heartbeat(&set, "node-a", LONG, false).await.unwrap();
    assert_eq!(store.members(&set).await.unwrap()[0].holding, None);
    store.leave(&set, "node-a").await.unwrap();
    store.leave(&set, "node-b").await.unwrap();
}

/// Counts the looks at a shard set's leases (`current_all`) of the nodes over it.
#[derive(Clone, Default)]
pub struct CountLooks(pub Arc<AtomicUsize>);

#[orion_beacon::store::async_trait]
impl<S: LeaseStore + MembershipStore + 'static> Intercept<S> for CountLooks {
    async fn current_all(
        &self,
        inner: &S,
        resources: &[String],
    ) -> Result<Vec<LeaseRecord>, StoreError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        inner.current_all(resources).await
    }
}

/// Once every resource is led and the members' counts show it, the nodes stop reading the
/// set's leases; a node that dies makes them look again, and its resources are led again.
pub async fn a_settled_set_reads_no_leases<H: Harness>(h: &H)
where
    H::Store: MembershipStore,
{
    const N: usize = 8;
    let lease = Duration::from_millis(1500);
    let interval = Duration::from_millis(250);
    let set = unique("settled");
    let resources: Vec<String> = (0..N).map(|i| format!("{set}-{i}")).collect();
    let looks = CountLooks::default();
    let node = |store: H::Store, id: &str| {
        let store = Double::over(store, looks.clone());
        start_node(store, &set, &resources, id, lease, interval)
    };
    let a = node(h.separate_store().await, "node-a");
    let b = node(h.separate_store().await, "node-b");
    let both = [("a", &a), ("b", &b)];
    eventually("balanced over two", Duration::from_secs(8), &both, |led| {
        led.len() == N && counts(led).values().all(|n| *n == N / 2)
    })
    .await;
    // A round for each count to show, then twelve rounds per node.
    tokio::time::sleep(interval * 3).await;
    let before = looks.0.load(Ordering::SeqCst);
    tokio::time::sleep(interval * 12).await;
    let settled = looks.0.load(Ordering::SeqCst) - before;
    // A look every round would be about 24; a stalled heartbeat (a loaded machine) may cost
    // one or two.
    assert!(
        settled <= 4,
        "{settled} looks in 12 settled rounds of two nodes"
    );
    eprintln!("{settled} looks in 12 settled rounds of two nodes");
    // A join: once the others see the joiner they hand resources over, and the joiner looks
    // when told of a release, or sees their lower counts at its next round (a releaser
    // heartbeats its count at once), so it leads its share within about a round.
    let c = node(h.separate_store().await, "node-c");
    let all = [("a", &a), ("b", &b), ("c", &c)];
    let seen = Instant::now();
    while !([&a, &b]
        .iter()
        .all(|n| n.assignment().members.iter().any(|m| m == "node-c")))
    {
        assert!(
            seen.elapsed() < Duration::from_secs(8),
            "the joiner is never seen"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = eventually("balanced over three", Duration::from_secs(8), &all, |led| {
        let counts = counts(led);
        led.len() == N && counts.len() == 3 && counts.values().all(|n| (2..=3).contains(n))
    })
    .await;
    eprintln!("balanced over three {took:?} after both saw the joiner");
    // At most a round (the joiner's next), and statement time: with the joiner skipping the
    // look its release notification asked for, and the releasers' counts left high until
    // their next heartbeat, it took up to two rounds.
    assert!(
        took < interval * 3 / 2,
        "balanced over three only {took:?} after both saw the joiner (interval {interval:?})"
    );
    c.shutdown().await;
    eventually(
        "balanced over two again",
        Duration::from_secs(8),
        &both,
        |led| led.len() == N && counts(led).values().all(|n| *n == N / 2),
    )
    .await;
    let b_led = b.assignment().led.len();
    assert_eq!(b_led, N / 2);
    b.abort().await;
    let gap = eventually(
        "a dead node's resources are led again",
        lease + interval * 8,
        &[("a", &a)],
        |led| led.len() == N,
    )
    .await;
    eprintln!("re-led {gap:?} after the kill (lease {lease:?}, interval {interval:?})");
    a.shutdown().await;
}

/// Two groups of one service (the same set name and resource names, one membership table,
/// different lease tables) never see each other: each group's members are its own, each node's
/// share is half of its group's resources, and each group leads every resource of its own (the
/// members' counts of one group never count as the other's, which would make every node skip
/// its look while resources are free).
pub async fn two_groups_on_one_membership_table_lead_everything<H: Harness>(h: &H)
where
    H::Store: MembershipStore,
{
    const N: usize = 8;
    let lease = Duration::from_millis(1500);
    let interval = Duration::from_millis(250);
    let Some(first) = h.store_on_another_lease_table().await else {
        return;
    };
    let set = unique("groups");
    let resources: Vec<String> = (0..N).map(|i| format!("{set}-{i}")).collect();
    let node = |store: H::Store, id: &str| start_node(store, &set, &resources, id, lease, interval);
    let a_view = h.separate_store().await;
    let g_view = first.clone();
    let a1 = node(h.separate_store().await, "a-1");
    let a2 = node(h.separate_store().await, "a-2");
    let g1 = node(first.clone(), "g-1");
    let g2 = node(first, "g-2");
    // Seeing the other group's members would halve each share and leave the rest to be taken
    // as resources nobody led for a lease: the shares below would fail, and "within" would
    // only hold by that slower path.
    let within = lease * 4;
    eventually(
        "the first group leads everything",
        within,
        &[("a1", &a1), ("a2", &a2)],
        |led| led.len() == N,
    )
    .await;
    eventually(
        "the second group leads everything",
        within,
        &[("g1", &g1), ("g2", &g2)],
        |led| led.len() == N,
    )
    .await;
    // Once both nodes of a group have joined, each sees exactly its group, with half the
    // resources as its share.
    let nodes = [
        ("a1", &a1, ["a-1", "a-2"]),
        ("a2", &a2, ["a-1", "a-2"]),
        ("g1", &g1, ["g-1", "g-2"]),
        ("g2", &g2, ["g-1", "g-2"]),
    ];
    let settled = || {
        nodes.iter().all(|(_, node, group)| {
            let seen = node.assignment();
            seen.members == *group && seen.share == N / 2
        })
    };
    let start = Instant::now();
    while !settled() && start.elapsed() < within {
        tokio::time::sleep(interval / 5).await;
    }
    for (name, node, group) in nodes {
        let seen = node.assignment();
        assert_eq!(seen.members, group, "{name}: {}", describe(&seen));
        assert_eq!(seen.share, N / 2, "{name}: {}", describe(&seen));
    }
    let ids = |members: Vec<orion_beacon::Member>| -> Vec<String> {
        members.into_iter().map(|m| m.member).collect()
    };
    assert_eq!(ids(a_view.members(&set).await.unwrap()), ["a-1", "a-2"]);
    assert_eq!(ids(g_view.members(&set).await.unwrap()), ["g-1", "g-2"]);
    for node in [a1, a2, g1, g2] {
        node.shutdown().await;
    }
}

/// What a node published last, for debugging.
pub fn describe(a: &Assignment) -> String {
    format!(
        "share {} led {} handing {}",
        a.share,
        a.led.len(),
        a.handing_over
    )
}

#[macro_export]
macro_rules! shard_suite {
    ($setup:expr) => {
        $crate::shard_suite!(@cases $setup;
            members_heartbeat_and_leave,
            current_all_reads_many_leases,
            shard_set_spreads_rebalances_and_recovers,
            members_report_what_they_lead,
            a_settled_set_reads_no_leases,
            two_groups_on_one_membership_table_lead_everything,
        );
    };
    (@cases $setup:expr; $($case:ident),* $(,)?) => {
        mod shards {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    #[allow(unused_imports)]
                    use $crate::common::conformance::Harness as _;
                    if let Some(h) = $setup.await {
                        $crate::common::shards::$case(&h).await;
                        h.teardown().await;
                    }
                }
            )*
        }
    };
}
