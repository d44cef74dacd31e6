//! Shard sets on the in-memory store with paused time: handovers wait for work, work that does
//! not return is cut off, a hung store ends terms at their deadlines, preferences, drains,
//! fairness, and recovery from a dead node within lease + one round.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use orion_beacon::{
    ConfigError, InMemoryLeaseStore, Lease, LeaseOutcome, LeaseRecord, LeaseStore, LossReason,
    Member, MembershipStore, Renewals, ShardHandle, ShardSet, StoreError,
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
    inner: InMemoryLeaseStore,
    hang: Arc<std::sync::atomic::AtomicBool>,
}

impl Hanging {
    async fn gate(&self) {
        if self.hang.load(std::sync::atomic::Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }
}

#[async_trait]
impl LeaseStore for Hanging {
    async fn acquire_or_renew(
        &self,
        r: &str,
        c: &str,
        l: Duration,
    ) -> Result<LeaseOutcome, StoreError> {
        self.gate().await;
        self.inner.acquire_or_renew(r, c, l).await
    }
    async fn release(&self, r: &str, c: &str) -> Result<bool, StoreError> {
        self.gate().await;
        self.inner.release(r, c).await
    }
    async fn release_lease(&self, l: &Lease) -> Result<bool, StoreError> {
        self.gate().await;
        self.inner.release_lease(l).await
    }
    async fn current(&self, r: &str) -> Result<Option<LeaseRecord>, StoreError> {
        self.gate().await;
        self.inner.current(r).await
    }
    async fn renew_all(&self, h: &[Lease], l: Duration) -> Result<Renewals, StoreError> {
        self.gate().await;
        self.inner.renew_all(h, l).await
    }
}

#[async_trait]
impl MembershipStore for Hanging {
    async fn heartbeat(
        &self,
        s: &str,
        m: &str,
        t: Duration,
        d: bool,
    ) -> Result<Vec<Member>, StoreError> {
        self.gate().await;
        self.inner.heartbeat(s, m, t, d).await
    }
    async fn leave(&self, s: &str, m: &str) -> Result<bool, StoreError> {
        self.gate().await;
        self.inner.leave(s, m).await
    }
    async fn members(&self, s: &str) -> Result<Vec<Member>, StoreError> {
        self.gate().await;
        self.inner.members(s).await
    }
}

/// When the store stops answering, every term ends at its local deadline (before the lease
/// ends in the store) and its work is dropped, whatever the node's loop is waiting on.
#[tokio::test(start_paused = true)]
async fn a_hung_store_ends_every_term_at_its_deadline() {
    let store = Hanging {
        inner: InMemoryLeaseStore::new(),
        hang: Arc::default(),
    };
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
    let store = Hanging {
        inner: InMemoryLeaseStore::new(),
        hang: Arc::default(),
    };
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
        matches!(err, ConfigError::DuplicateResource { .. }),
        "{err}"
    );
    let err = ShardSet::builder(store.clone())
        .name("set")
        .resources(Vec::<String>::new())
        .build()
        .unwrap_err();
    assert!(matches!(err, ConfigError::EmptyResourceSet), "{err}");
    let err = ShardSet::builder(store.clone())
        .name("set")
        .resources(["a"])
        .slack(2)
        .build()
        .unwrap_err();
    assert!(matches!(err, ConfigError::SlackTooLarge { .. }), "{err}");
    let err = ShardSet::builder(store)
        .name("set")
        .resources(["a", "b\n"])
        .build()
        .unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::Invalid(StoreError::InvalidResource { .. })
        ),
        "{err}"
    );
}
