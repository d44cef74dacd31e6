//! Shard sets on the in-memory store with paused time: handovers wait for work, work that does
//! not return is cut off, a hung store ends terms at their deadlines, preferences, drains,
//! fairness, and recovery from a dead node within lease + one round.

use crate::common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::double::{Double, Intercept};
use orion_beacon::{
    store::LeaseOutcome, store::ReleaseEvents, store::Renewals, ConfigError, InMemoryLeaseStore,
    Lease, LeaseRecord, LeaseStore, LossReason, Member, MembershipStore, ShardConfigError,
    ShardHandle, ShardSet, StoreError,
};
use tokio::time::{sleep, Instant};

const LEASE: Duration = Duration::from_secs(10);
const INTERVAL: Duration = Duration::from_secs(1);
const GRACE: Duration = Duration::from_secs(3);

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("shard-{i}")).collect()
}

fn node<S: orion_beacon::ShardStore + 'static>(
    store: S,
    id: &str,
    n: usize,
    slack: usize,
) -> orion_beacon::ShardSetBuilder {
    ShardSet::builder(store)
        .name("set")
        .resources(names(n))
        .member_id(id)
        .lease_duration(LEASE)
        .interval(INTERVAL)
        .grace_period(GRACE)
        .slack(slack)
}

fn counts(nodes: &[&ShardHandle]) -> Vec<usize> {
    nodes
        .iter()
        .map(|n| n.assignment().current().count())
        .collect()
}

/// Every resource led by at most one node with a current term.
fn assert_disjoint(nodes: &[&ShardHandle]) {
    let mut seen = BTreeMap::new();
    for n in nodes {
        for t in n.assignment().current() {
            if let Some(other) = seen.insert(t.resource().to_owned(), n.member_id().to_owned()) {
                panic!("{} led by {other} and {}", t.resource(), n.member_id());
            }
        }
    }
}

async fn settle(rounds: u32, nodes: &[&ShardHandle]) {
    for _ in 0..rounds * 10 {
        sleep(INTERVAL / 10).await;
        assert_disjoint(nodes);
    }
}

#[tokio::test(start_paused = true)]
async fn five_nodes_share_64_resources_within_ceiling_plus_slack() {
    let store = InMemoryLeaseStore::new();
    let ids = ["n1", "n2", "n3", "n4", "n5"];
    let nodes: Vec<ShardHandle> = ids
        .iter()
        .map(|id| node(store.clone(), id, 64, 1).build().unwrap().start())
        .collect();
    let refs: Vec<&ShardHandle> = nodes.iter().collect();
    settle(6, &refs).await;
    let c = counts(&refs);
    assert_eq!(c.iter().sum::<usize>(), 64, "{c:?}");
    assert!(c.iter().all(|n| *n <= 64usize.div_ceil(5) + 1), "{c:?}");
    // shares: 13, 13, 13, 13, 12 by id
    let shares: Vec<usize> = refs.iter().map(|n| n.assignment().share).collect();
    assert_eq!(shares, [13, 13, 13, 13, 12]);
    for n in &nodes {
        assert_eq!(n.assignment().members, ids);
    }
}

#[tokio::test(start_paused = true)]
async fn a_dead_nodes_resources_are_led_again_within_lease_plus_a_round() {
    let store = InMemoryLeaseStore::new();
    let a = node(store.clone(), "a", 12, 0).build().unwrap().start();
    let b = node(store.clone(), "b", 12, 0).build().unwrap().start();
    let c = node(store.clone(), "c", 12, 0).build().unwrap().start();
    settle(5, &[&a, &b, &c]).await;
    assert_eq!(counts(&[&a, &b, &c]), [4, 4, 4]);
    let orphans: Vec<String> = c.assignment().led.keys().map(|r| r.to_string()).collect();
    let killed = Instant::now();
    c.abort().await;
    loop {
        let led: Vec<String> = [&a, &b]
            .iter()
            .flat_map(|n| {
                n.assignment()
                    .led
                    .keys()
                    .map(|r| r.to_string())
                    .collect::<Vec<_>>()
            })
            .collect();
        if orphans.iter().all(|r| led.contains(r)) {
            break;
        }
        assert!(
            killed.elapsed() <= LEASE + INTERVAL,
            "orphans not led within lease + one round: {:?}",
            killed.elapsed()
        );
        sleep(Duration::from_millis(10)).await;
        assert_disjoint(&[&a, &b]);
    }
    settle(3, &[&a, &b]).await;
    assert_eq!(counts(&[&a, &b]), [6, 6]);
}

/// Who, which resource, which token, start or end, when.
type Event = (String, String, i64, &'static str, Instant);

/// A handover ends the term, waits for its work to return, and only then releases: the next
/// leader's work starts after the old work ended, with a higher token.
#[tokio::test(start_paused = true)]
async fn a_handover_waits_for_the_work_then_the_next_term_is_higher() {
    let store = InMemoryLeaseStore::new();
    let log: Arc<Mutex<Vec<Event>>> = Arc::default();
    let run = |handle: &ShardHandle| {
        let log = log.clone();
        let me = handle.member_id().to_owned();
        handle.run_per_shard(move |term| {
            let (log, me) = (log.clone(), me.clone());
            async move {
                let entry = |what| {
                    (
                        me.clone(),
                        term.resource().to_owned(),
                        term.token().get(),
                        what,
                        Instant::now(),
                    )
                };
                log.lock().unwrap().push(entry("start"));
                term.lost().await;
                sleep(Duration::from_secs(1)).await; // finishing up
                log.lock().unwrap().push(entry("end"));
            }
        });
    };
    let a = node(store.clone(), "a", 4, 0).build().unwrap().start();
    run(&a);
    settle(2, &[&a]).await;
    assert_eq!(counts(&[&a]), [4]);
    let b = node(store.clone(), "b", 4, 0).build().unwrap().start();
    run(&b);
    settle(6, &[&a, &b]).await;
    assert_eq!(counts(&[&a, &b]), [2, 2]);
    let log = log.lock().unwrap().clone();
    let moved: Vec<&String> = log
        .iter()
        .filter(|(who, _, _, what, _)| who == "b" && *what == "start")
        .map(|(_, r, _, _, _)| r)
        .collect();
    assert_eq!(moved.len(), 2);
    for r in moved {
        let a_end = log
            .iter()
            .find(|(who, res, _, what, _)| who == "a" && res == r && *what == "end")
            .expect("a's work ended");
        let b_start = log
            .iter()
            .find(|(who, res, _, what, _)| who == "b" && res == r && *what == "start")
            .unwrap();
        assert!(a_end.4 <= b_start.4, "{r}: b started before a's work ended");
        assert!(
            b_start.2 > a_end.2,
            "{r}: token {} after {}",
            b_start.2,
            a_end.2
        );
        // the lease was released (not left to lapse): b led it within a few rounds
        assert!(
            b_start.4 - a_end.4 <= INTERVAL * 2,
            "{r}: {:?}",
            b_start.4 - a_end.4
        );
    }
    for n in [&a, &b] {
        n.shutdown().await;
    }
}

/// Work that ignores the end of its term is dropped after the grace period, and the lease is
/// released then.
#[tokio::test(start_paused = true)]
async fn work_that_does_not_return_is_dropped_after_the_grace_period() {
    struct Flag(Arc<Mutex<Option<Instant>>>);
    impl Drop for Flag {
        fn drop(&mut self) {
            *self.0.lock().unwrap() = Some(Instant::now());
        }
    }
    let store = InMemoryLeaseStore::new();
    let dropped: Arc<Mutex<Option<Instant>>> = Arc::default();
    let a = node(store.clone(), "a", 1, 0).build().unwrap().start();
    let flag = dropped.clone();
    a.run_per_shard(move |_term| {
        let flag = Flag(flag.clone());
        async move {
            let _flag = flag;
            std::future::pending::<()>().await
        }
    });
    settle(2, &[&a]).await;
    let asked = Instant::now();
    a.drain().await;
    let at = dropped.lock().unwrap().expect("the work was dropped");
    // told at the drain's first round, handed over one round later, dropped after the grace
    assert!(at - asked >= GRACE, "{:?}", at - asked);
    assert!(at - asked <= GRACE + INTERVAL * 3, "{:?}", at - asked);
    let record = store.current("shard-0").await.unwrap().unwrap();
    assert!(!record.live, "released after the work was dropped");
}

/// A store whose calls hang after `hang` is set (a database that stopped answering).
#[derive(Clone)]
struct Hanging {
    hang: Arc<std::sync::atomic::AtomicBool>,
}

impl Hanging {
    async fn gate(&self) {
        if self.hang.load(std::sync::atomic::Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }
}

/// Every call goes through the gate (`current_all` too: it asks `current` per resource).
#[async_trait]
impl Intercept for Hanging {
    async fn acquire_or_renew(
        &self,
        inner: &InMemoryLeaseStore,
        r: &str,
        c: &str,
        l: Duration,
    ) -> Result<LeaseOutcome, StoreError> {
        self.gate().await;
        inner.acquire_or_renew(r, c, l).await
    }
    async fn release(
        &self,
        inner: &InMemoryLeaseStore,
        r: &str,
        c: &str,
    ) -> Result<bool, StoreError> {
        self.gate().await;
        inner.release(r, c).await
    }
    async fn release_lease(
        &self,
        inner: &InMemoryLeaseStore,
        l: &Lease,
    ) -> Result<bool, StoreError> {
        self.gate().await;
        inner.release_lease(l).await
    }
    async fn current(
        &self,
        inner: &InMemoryLeaseStore,
        r: &str,
    ) -> Result<Option<LeaseRecord>, StoreError> {
        self.gate().await;
        inner.current(r).await
    }
    async fn renew_all(
        &self,
        inner: &InMemoryLeaseStore,
        h: &[Lease],
        l: Duration,
    ) -> Result<Renewals, StoreError> {
        self.gate().await;
        inner.renew_all(h, l).await
    }
    /// No release notifications: nodes poll.
    fn release_events(&self, _inner: &InMemoryLeaseStore) -> Option<ReleaseEvents> {
        None
    }
    async fn heartbeat(
        &self,
        inner: &InMemoryLeaseStore,
        s: &str,
        m: &str,
        t: Duration,
        d: bool,
    ) -> Result<Vec<Member>, StoreError> {
        self.gate().await;
        inner.heartbeat(s, m, t, d).await
    }
    async fn heartbeat_holding(
        &self,
        inner: &InMemoryLeaseStore,
        s: &str,
        m: &str,
        t: Duration,
        d: bool,
        h: orion_beacon::Holding,
    ) -> Result<Vec<Member>, StoreError> {
        self.gate().await;
        inner.heartbeat_holding(s, m, t, d, h).await
    }
    async fn leave(
        &self,
        inner: &InMemoryLeaseStore,
        s: &str,
        m: &str,
    ) -> Result<bool, StoreError> {
        self.gate().await;
        inner.leave(s, m).await
    }
    async fn members(
        &self,
        inner: &InMemoryLeaseStore,
        s: &str,
    ) -> Result<Vec<Member>, StoreError> {
        self.gate().await;
        inner.members(s).await
    }
}

/// When the store stops answering, every term ends at its local deadline (before the lease
/// ends in the store) and its work is dropped, whatever the node's loop is waiting on.
#[tokio::test(start_paused = true)]
async fn a_hung_store_ends_every_term_at_its_deadline() {
    let store = Double::new(Hanging {
        hang: Arc::default(),
    });
    let a = node(store.clone(), "a", 3, 0).build().unwrap().start();
    settle(2, &[&a]).await;
    let terms: Vec<_> = a.assignment().led.values().cloned().collect();
    assert_eq!(terms.len(), 3);
    let last_renew_sent = Instant::now();
    store.hang.store(true, std::sync::atomic::Ordering::SeqCst);
    let deadline = terms.iter().map(|t| t.deadline()).max().unwrap();
    assert!(
        deadline <= last_renew_sent + LEASE,
        "belief never outlasts the lease"
    );
    // Just past the deadline: ended, whatever the loop waits on.
    tokio::time::sleep_until(deadline + Duration::from_millis(1)).await;
    for t in &terms {
        assert!(
            t.is_lost(),
            "{} still believed past its deadline",
            t.resource()
        );
        assert_eq!(t.loss_reason(), Some(LossReason::Deadline));
        let record = store.inner.current(t.resource()).await.unwrap().unwrap();
        assert!(
            record.live,
            "the store's lease outlives the local belief: {record:?}"
        );
    }
    assert_eq!(a.assignment().current().count(), 0);
    a.abort().await;
}

/// `health()` for probes: healthy while the store answers, unhealthy one window (three rounds
/// by default) after it stopped, healthy again once it answers; `leader` follows what it leads.
#[tokio::test(start_paused = true)]
async fn health_follows_the_store_answers() {
    let store = Double::new(Hanging {
        hang: Arc::default(),
    });
    let a = node(store.clone(), "a", 3, 0).build().unwrap().start();
    settle(2, &[&a]).await;
    let h = a.health();
    assert!(h.healthy && h.leader, "{h}");
    assert_eq!(
        h.window,
        INTERVAL * orion_beacon::elector::HEALTH_WINDOW_FACTOR
    );
    store.hang.store(true, std::sync::atomic::Ordering::SeqCst);
    let hung = Instant::now();
    let unhealthy = loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if !a.health().healthy {
            break Instant::now();
        }
    };
    // One window after the last answer, which came at most a round before the hang.
    assert!(unhealthy - hung <= INTERVAL * 3 + Duration::from_millis(100));
    assert!(unhealthy - hung >= INTERVAL * 2);
    tokio::time::sleep(LEASE).await;
    assert!(!a.health().leader, "its terms ended at their deadlines");
    store.hang.store(false, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(INTERVAL * 3).await;
    assert!(a.health().healthy, "{}", a.health());
    a.abort().await;
}

#[tokio::test(start_paused = true)]
async fn preferences_move_resources_to_their_member_and_a_drain_moves_them_back() {
    let store = InMemoryLeaseStore::new();
    let build = |id: &str| {
        node(store.clone(), id, 4, 1)
            .prefer("shard-0", "b")
            .build()
            .unwrap()
            .start()
    };
    let a = build("a");
    settle(2, &[&a]).await;
    assert!(a.term("shard-0").is_some(), "b is not live: a leads it");
    let b = build("b");
    settle(5, &[&a, &b]).await;
    assert!(
        b.term("shard-0").is_some(),
        "handed to its preferred member"
    );
    assert!(a.term("shard-0").is_none());
    b.drain().await;
    settle(3, &[&a, &b]).await;
    assert!(
        a.term("shard-0").is_some(),
        "a draining member is passed over"
    );
    assert_eq!(counts(&[&a, &b]), [4, 0]);
}

#[tokio::test(start_paused = true)]
async fn shutdown_releases_everything_and_leaves() {
    let store = InMemoryLeaseStore::new();
    let a = node(store.clone(), "a", 5, 0).build().unwrap().start();
    let terms = {
        settle(2, &[&a]).await;
        a.assignment().led.values().cloned().collect::<Vec<_>>()
    };
    a.shutdown().await;
    for t in terms {
        assert_eq!(t.loss_reason(), Some(LossReason::Shutdown));
        assert!(!store.current(t.resource()).await.unwrap().unwrap().live);
    }
    assert!(store.members("set").await.unwrap().is_empty());
}

#[test]
fn bad_sets_are_refused_at_build() {
    let store = InMemoryLeaseStore::new();
    let err = ShardSet::builder(store.clone())
        .name("set")
        .resources(["a", "b", "a"])
        .build()
        .unwrap_err();
    assert!(
        matches!(err, ShardConfigError::DuplicateResource { .. }),
        "{err}"
    );
    let err = ShardSet::builder(store.clone())
        .name("set")
        .resources(Vec::<String>::new())
        .build()
        .unwrap_err();
    assert!(matches!(err, ShardConfigError::EmptyResourceSet), "{err}");
    let err = ShardSet::builder(store.clone())
        .name("set")
        .resources(["a"])
        .slack(2)
        .build()
        .unwrap_err();
    assert!(
        matches!(err, ShardConfigError::SlackTooLarge { .. }),
        "{err}"
    );
    let err = ShardSet::builder(store)
        .name("set")
        .resources(["a", "b\n"])
        .build()
        .unwrap_err();
    assert!(
        matches!(
            err,
            ShardConfigError::Options(ConfigError::Invalid(StoreError::InvalidResource { .. }))
        ),
        "{err}"
    );
}

/// How a shard's term ended, for the cleanup test below.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ShardEnd {
    /// A second node joined: the excess is handed over.
    HandedOver,
    /// `drain()`.
    Drained,
    /// `shutdown()`.
    Shutdown,
    /// Another member took the lease: the batched renew reports it lost.
    Denied,
    /// The store stopped answering: the term ends at its deadline.
    Deadline,
    /// `abort()`.
    Aborted,
}

/// Cleanup written the way the docs show (a `Drop` guard made first thing in the work, the
/// README's loop that looks at `lost()` between units of work) runs on every kind of end of a
/// shard's term, and a graceful end (handover, drain, shutdown) does not wait out the grace
/// period for that loop. `run_per_shard_with` hands each term its own clone of the context.
#[tokio::test(start_paused = true)]
async fn a_shards_cleanup_runs_on_every_kind_of_term_end() {
    type Cleaned = Arc<Mutex<Vec<(String, Option<LossReason>, Instant)>>>;
    struct Cleanup(orion_beacon::LeaderTerm, Cleaned);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            self.1.lock().unwrap().push((
                self.0.resource().to_owned(),
                self.0.loss_reason(),
                Instant::now(),
            ));
        }
    }
    for end in [
        ShardEnd::HandedOver,
        ShardEnd::Drained,
        ShardEnd::Shutdown,
        ShardEnd::Denied,
        ShardEnd::Deadline,
        ShardEnd::Aborted,
    ] {
        let hang = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let store = Double::new(Hanging { hang: hang.clone() });
        let a = node(store.clone(), "a", 2, 0).build().unwrap().start();
        let cleaned: Cleaned = Arc::default();
        let contexts = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        a.run_per_shard_with(
            (cleaned.clone(), contexts.clone()),
            |term, (cleaned, contexts)| async move {
                let _cleanup = Cleanup(term.clone(), cleaned);
                contexts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                while term.is_current() {
                    tokio::select! {
                        _ = term.lost() => break,
                        _ = sleep(Duration::from_millis(300)) => {}
                    }
                }
            },
        );
        while a.assignment().current().count() < 2 {
            sleep(INTERVAL).await;
        }
        sleep(INTERVAL).await;
        assert_eq!(contexts.load(std::sync::atomic::Ordering::SeqCst), 2);
        let asked = Instant::now();
        let mut b = None;
        match end {
            ShardEnd::HandedOver => {
                b = Some(node(store.clone(), "b", 2, 0).build().unwrap().start());
            }
            ShardEnd::Drained => a.drain().await,
            ShardEnd::Shutdown => a.shutdown().await,
            ShardEnd::Denied => {
                store.inner.release("shard-0", "a").await.unwrap();
                store
                    .inner
                    .acquire_or_renew("shard-0", "intruder", LEASE)
                    .await
                    .unwrap();
            }
            ShardEnd::Deadline => hang.store(true, std::sync::atomic::Ordering::SeqCst),
            ShardEnd::Aborted => a.abort().await,
        }
        // Long enough for a deadline (a lease), a handover or a drain (a few rounds).
        let until = asked + LEASE + INTERVAL * 3;
        while cleaned.lock().unwrap().is_empty() && Instant::now() < until {
            sleep(Duration::from_millis(50)).await;
        }
        let ran = cleaned.lock().unwrap().clone();
        let expected = match end {
            ShardEnd::HandedOver | ShardEnd::Drained => LossReason::HandedOver,
            ShardEnd::Shutdown => LossReason::Shutdown,
            ShardEnd::Denied => LossReason::Denied,
            ShardEnd::Deadline => LossReason::Deadline,
            ShardEnd::Aborted => LossReason::Aborted,
        };
        assert!(
            ran.iter().any(|(_, reason, _)| *reason == Some(expected)),
            "{end:?}: no cleanup ran for a term that ended {expected:?} ({ran:?})"
        );
        if matches!(
            end,
            ShardEnd::HandedOver | ShardEnd::Drained | ShardEnd::Shutdown
        ) {
            // The loop returned when lost() fired: no waiting out the grace period.
            let took = ran[0].2 - asked;
            assert!(
                took < GRACE,
                "{end:?}: the README's loop took {took:?} to return (grace {GRACE:?})"
            );
        }
        eprintln!("{end:?}: cleanups {ran:?}");
        hang.store(false, std::sync::atomic::Ordering::SeqCst);
        if let Some(b) = b {
            b.abort().await;
        }
        a.abort().await;
    }
}

/// A store whose lease calls (acquire, release, renew) fail while `down` is set; heartbeats
/// and looks go on (what a node sees when the lease table is locked or unreachable while the
/// membership table answers).
#[derive(Clone)]
struct LeasesDown {
    down: Arc<std::sync::atomic::AtomicBool>,
}

impl LeasesDown {
    fn check(&self) -> Result<(), StoreError> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(StoreError::Database(
                sea_orm::DbErr::Custom("connection reset by peer".into()).into(),
            ));
        }
        Ok(())
    }
}

#[async_trait]
impl Intercept for LeasesDown {
    async fn acquire_or_renew(
        &self,
        inner: &InMemoryLeaseStore,
        r: &str,
        c: &str,
        l: Duration,
    ) -> Result<LeaseOutcome, StoreError> {
        self.check()?;
        inner.acquire_or_renew(r, c, l).await
    }
    async fn release_lease(
        &self,
        inner: &InMemoryLeaseStore,
        l: &Lease,
    ) -> Result<bool, StoreError> {
        self.check()?;
        inner.release_lease(l).await
    }
    async fn renew_all(
        &self,
        inner: &InMemoryLeaseStore,
        h: &[Lease],
        l: Duration,
    ) -> Result<Renewals, StoreError> {
        self.check()?;
        inner.renew_all(h, l).await
    }
    /// No release notifications: nodes poll.
    fn release_events(&self, _inner: &InMemoryLeaseStore) -> Option<ReleaseEvents> {
        None
    }
}

/// Every node loses the lease calls for longer than a lease while the members stay: every
/// lease lapses, and after the outage the first node to look takes every resource nobody led
/// for a lease. It must not keep them outside its share (its own calls failed too, so their
/// staying free said nothing about the others): the shares are back within a few rounds.
/// (Keeping them until the members change, as before, left one node leading all 12.)
#[tokio::test(start_paused = true)]
async fn after_an_outage_of_every_node_the_shares_come_back() {
    let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let store = Double::new(LeasesDown { down: down.clone() });
    let nodes: Vec<ShardHandle> = ["a", "b", "c"]
        .iter()
        .map(|id| node(store.clone(), id, 12, 1).build().unwrap().start())
        .collect();
    let refs: Vec<&ShardHandle> = nodes.iter().collect();
    let balanced =
        |counts: &[usize]| counts.iter().all(|c| *c <= 5) && counts.iter().sum::<usize>() == 12;
    let t0 = Instant::now();
    while !balanced(&counts(&refs)) {
        assert!(
            t0.elapsed() < LEASE * 3,
            "never balanced: {:?}",
            counts(&refs)
        );
        sleep(INTERVAL).await;
    }
    down.store(true, std::sync::atomic::Ordering::SeqCst);
    sleep(LEASE * 5 / 2).await;
    assert_eq!(
        counts(&refs),
        vec![0, 0, 0],
        "every term ended in the outage"
    );
    down.store(false, std::sync::atomic::Ordering::SeqCst);
    let healed = Instant::now();
    // Led again at once, then back to the shares (at most ceil(12 / 3) + 1 each).
    let mut seen = Vec::new();
    while healed.elapsed() < LEASE * 2 {
        sleep(INTERVAL).await;
        assert_disjoint(&refs);
        seen.push(counts(&refs));
    }
    let last = counts(&refs);
    eprintln!("after the outage, per round: {seen:?}");
    assert!(
        balanced(&last),
        "two leases after the outage the nodes lead {last:?} of 12 (at most 5 each)"
    );
    for n in nodes {
        n.abort().await;
    }
}
