//! The elector over a real database: five electors with their own pools, crashes and graceful
//! handovers, checked from their watch channels.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use orion_beacon::{Elector, ElectorHandle, LeaderTerm, Leadership, LeaseStore, SeaOrmLeaseStore};
use tokio::time::Instant;

use super::sql::SqlHarness;
use super::unique;

pub const LEASE: Duration = Duration::from_millis(600);
pub const RENEW: Duration = Duration::from_millis(150);
pub const RETRY: Duration = Duration::from_millis(100);
/// Slack for a loaded 2-core machine on top of the protocol's own bound.
pub const SLACK: Duration = Duration::from_millis(500);

/// One believed leadership interval, as seen on a watch channel.
#[derive(Debug, Clone)]
struct Interval {
    candidate: usize,
    token: i64,
    start: Instant,
    end: Option<Instant>,
    term: LeaderTerm,
}

#[derive(Default)]
struct Recorder {
    intervals: Mutex<Vec<Interval>>,
}

impl Recorder {
    fn watch(self: &Arc<Self>, idx: usize, handle: &ElectorHandle) {
        let mut rx = handle.watch();
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                let state = rx.borrow_and_update().clone();
                let now = Instant::now();
                {
                    let mut all = me.intervals.lock().unwrap();
                    let open = all
                        .iter_mut()
                        .find(|i| i.candidate == idx && i.end.is_none());
                    // The elector's own instants (when it began the term, and when it was no
                    // longer current), not when this task got to run: a watcher scheduled late
                    // must not make two terms look as if they overlapped.
                    let ended = |open: &Interval| open.term.ended_at().unwrap_or(now);
                    match (&state, open) {
                        (Leadership::Leader(term), Some(open)) if open.term == *term => {}
                        (Leadership::Leader(term), open) => {
                            if let Some(open) = open {
                                open.end = Some(ended(open));
                            }
                            all.push(Interval {
                                candidate: idx,
                                token: term.token().get(),
                                start: term.began_at(),
                                end: None,
                                term: term.clone(),
                            });
                        }
                        (_, Some(open)) => open.end = Some(ended(open)),
                        (_, None) => {}
                    }
                }
                if rx.changed().await.is_err() {
                    let mut all = me.intervals.lock().unwrap();
                    if let Some(open) = all
                        .iter_mut()
                        .find(|i| i.candidate == idx && i.end.is_none())
                    {
                        open.end = Some(open.term.ended_at().unwrap_or_else(Instant::now));
                    }
                    return;
                }
            }
        });
    }

    fn leader_after(&self, t: Instant) -> Option<(usize, Instant, i64)> {
        self.intervals
            .lock()
            .unwrap()
            .iter()
            .filter(|i| i.start > t)
            .map(|i| (i.candidate, i.start, i.token))
            .min_by_key(|x| x.1)
    }

    /// Checks that believed leadership never overlapped and tokens increased term by term.
    /// A term runs from when its elector began it to when its elector ended it (when its
    /// channel left the leader state, for a term ended without a decision), or to its local
    /// deadline if that came first (after the deadline `is_leader()` is already false).
    fn check(&self) -> Vec<i64> {
        let mut all = self.intervals.lock().unwrap().clone();
        all.sort_by_key(|i| i.start);
        for pair in all.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            let a_end = a.end.unwrap_or_else(Instant::now).min(a.term.deadline());
            assert!(
                a_end <= b.start,
                "two leaders at once: candidate {} (token {}) until {:?} after candidate {} (token {}) started",
                a.candidate,
                a.token,
                a_end - b.start.min(a_end),
                b.candidate,
                b.token
            );
            assert!(
                b.token > a.token,
                "tokens must increase: {} then {}",
                a.token,
                b.token
            );
        }
        all.iter().map(|i| i.token).collect()
    }
}

async fn wait_until<F: Fn() -> bool>(what: &str, limit: Duration, f: F) -> Duration {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    start.elapsed()
}

/// Five electors, each with its own connection pool, on the harness's table: crash the
/// leader twice (abort: no release) and hand over gracefully twice, then check the history.
pub async fn crash_and_graceful_handover(h: &SqlHarness) {
    let resource = unique("elect");
    let recorder = Arc::new(Recorder::default());
    let mut handles: Vec<Option<ElectorHandle>> = Vec::new();
    for idx in 0..5 {
        let db = h.connect_again(2).await;
        let store = h.configure(SeaOrmLeaseStore::new(db));
        let handle = Elector::builder(store)
            .resource(&resource)
            .candidate_id(format!("node-{idx}"))
            .lease_duration(LEASE)
            .renew_interval(RENEW)
            .retry_interval(RETRY)
            .build()
            .unwrap()
            .start();
        recorder.watch(idx, &handle);
        handles.push(Some(handle));
    }
    let leader_idx = |handles: &Vec<Option<ElectorHandle>>| {
        handles
            .iter()
            .position(|h| h.as_ref().is_some_and(|h| h.is_leader()))
    };
    wait_until("a first leader", Duration::from_secs(5), || {
        leader_idx(&handles).is_some()
    })
    .await;

    let mut failovers = Vec::new();
    let mut handovers = Vec::new();
    for round in 0..4 {
        tokio::time::sleep(Duration::from_millis(800)).await; // a few renews
        let idx = leader_idx(&handles).expect("a leader");
        let handle = handles[idx].take().unwrap();
        let t = Instant::now();
        if round % 2 == 0 {
            handle.abort().await; // a crash: no release, the lease must lapse
        } else {
            handle.shutdown().await; // graceful: release, next attempt wins
        }
        let limit = if round % 2 == 0 {
            LEASE + RETRY + SLACK
        } else {
            RETRY.mul_f64(1.1) + SLACK
        };
        let took = wait_until("the next leader", limit, || {
            recorder.leader_after(t).is_some()
        })
        .await;
        if round % 2 == 0 {
            failovers.push(took);
        } else {
            handovers.push(took);
        }
        // Bring a fresh candidate back so there are always contenders.
        let db = h.connect_again(2).await;
        let store = h.configure(SeaOrmLeaseStore::new(db));
        let fresh = Elector::builder(store)
            .resource(&resource)
            .candidate_id(format!("node-{}", 5 + round))
            .lease_duration(LEASE)
            .renew_interval(RENEW)
            .retry_interval(RETRY)
            .build()
            .unwrap()
            .start();
        recorder.watch(5 + round, &fresh);
        handles.push(Some(fresh));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for handle in handles.into_iter().flatten() {
        handle.shutdown().await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let tokens = recorder.check();
    eprintln!("failovers after a crash: {failovers:?} (lease {LEASE:?}); graceful handovers: {handovers:?}; tokens: {tokens:?}");
    assert!(
        tokens.len() >= 5,
        "at least the first term and four transitions: {tokens:?}"
    );
}

/// A planned handover: the leader steps down, its work gets to finish, the other candidate
/// leads within one handover (not a lease), and the stepped-down one stays out of the contest
/// for the time it asked, even with the resource free, then leads again with a higher token.
pub async fn a_step_down_hands_over_and_stays_out(h: &SqlHarness) {
    let resource = unique("step");
    let recorder = Arc::new(Recorder::default());
    let mut handles = Vec::new();
    for idx in 0..2 {
        let db = h.connect_again(2).await;
        let store = h.configure(SeaOrmLeaseStore::new(db));
        let handle = Elector::builder(store)
            .resource(&resource)
            .candidate_id(format!("node-{idx}"))
            .lease_duration(Duration::from_secs(5))
            .renew_interval(Duration::from_millis(500))
            .retry_interval(RETRY)
            .build()
            .unwrap()
            .start();
        recorder.watch(idx, &handle);
        handles.push(handle);
    }
    wait_until("a first leader", Duration::from_secs(5), || {
        handles.iter().any(|h| h.is_leader())
    })
    .await;
    let first = handles.iter().position(|h| h.is_leader()).unwrap();
    let (a, b) = (&handles[first], &handles[1 - first]);
    // The leader's work winds down for 200 ms after it is told.
    let wound_down: Arc<Mutex<Option<Instant>>> = Arc::default();
    let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (flag, running) = (wound_down.clone(), started.clone());
    let _work = a.run_as_leader(move |term| {
        let (flag, running) = (flag.clone(), running.clone());
        async move {
            running.store(true, std::sync::atomic::Ordering::SeqCst);
            term.lost().await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            *flag.lock().unwrap() = Some(Instant::now());
        }
    });
    wait_until("the leader's work", Duration::from_secs(5), || {
        started.load(std::sync::atomic::Ordering::SeqCst)
    })
    .await;
    let old = a.token().expect("leads");
    let asked = Instant::now();
    let stay_out = Duration::from_secs(2);
    assert!(a.step_down(stay_out).await.unwrap(), "it led");
    assert!(!a.is_leader());
    let wound = wound_down
        .lock()
        .unwrap()
        .expect("the work finished before the release");
    // One handover: the other candidate's next retry (or the release notification), not a
    // lease (5 s).
    let took = wait_until("the other candidate", Duration::from_millis(2_000), || {
        b.is_leader() && recorder.leader_after(asked).is_some()
    })
    .await;
    let (_, started, token) = recorder.leader_after(asked).expect("a next term");
    assert!(
        started >= wound,
        "the next term began before the work had wound down"
    );
    assert!(token > old.get());
    // The resource comes free again: the stepped-down candidate stays out all the same.
    b.shutdown().await;
    let freed = Instant::now();
    let back = wait_until(
        "the stepped-down candidate again",
        stay_out + RETRY + SLACK,
        || a.is_leader(),
    )
    .await;
    let back_at = freed + back;
    assert!(
        back_at >= asked + stay_out,
        "led again {:?} after the step-down, inside its stay-out of {stay_out:?}",
        back_at - asked
    );
    assert!(a.token().unwrap() > old);
    // A stay-out over the longest interval is refused before anything happens.
    let err = a
        .step_down(Duration::from_secs(400 * 24 * 3600))
        .await
        .unwrap_err();
    assert!(
        matches!(err, orion_beacon::ConfigError::TooLong { .. }),
        "{err:?}"
    );
    assert!(a.is_leader());
    a.shutdown().await;
    recorder.check();
    eprintln!("step-down handover took {took:?}");
}

/// The leader's payload reaches its followers: each elector writes its own with every acquire
/// and renew, and a follower's watch shows the current leader's, changing with the leader.
pub async fn followers_see_the_leaders_payload(h: &SqlHarness) {
    let resource = unique("payload");
    let mut handles = Vec::new();
    for idx in 0..2 {
        let db = h.connect_again(2).await;
        let store = h.configure(SeaOrmLeaseStore::new(db));
        let handle = Elector::builder(store)
            .resource(&resource)
            .candidate_id(format!("node-{idx}"))
            .payload(format!("http://node-{idx}:8080"))
            .lease_duration(LEASE)
            .renew_interval(RENEW)
            .retry_interval(RETRY)
            .build()
            .unwrap()
            .start();
        handles.push(handle);
    }
    let follows = |h: &ElectorHandle, leader: usize| {
        matches!(
            &h.watch().borrow(),
            Leadership::Follower { leader: Some(l), payload: Some(p) }
                if *l == format!("node-{leader}") && *p == format!("http://node-{leader}:8080")
        )
    };
    wait_until(
        "a leader and a follower that sees its payload",
        Duration::from_secs(5),
        || (0..2).any(|i| handles[i].is_leader() && follows(&handles[1 - i], i)),
    )
    .await;
    let first = handles.iter().position(|h| h.is_leader()).unwrap();
    let (a, b) = (&handles[first], &handles[1 - first]);
    // The store shows it too.
    let store = h.configure(SeaOrmLeaseStore::new(h.db().clone()));
    let rec = orion_beacon::LeaseStore::current(&store, &resource)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        rec.payload.as_deref(),
        Some(format!("http://node-{first}:8080").as_str())
    );
    // A handover: the old leader now follows and sees the new leader's payload, not its own.
    assert!(a.step_down(Duration::from_secs(2)).await.unwrap());
    wait_until(
        "the new leader's payload at the old leader",
        Duration::from_secs(5),
        || b.is_leader() && follows(a, 1 - first),
    )
    .await;
    for h in &handles {
        h.shutdown().await;
    }
}

/// A handover to a named successor: of three candidates, the one named leads next, with a
/// higher token, within one handover (not a lease, not the other follower); the old leader
/// stays out meanwhile. A handover to a candidate that is not there answers `NotTaken` and
/// costs its window, not a lease; bad requests are refused and a follower's is `NotLeader`.
pub async fn a_handover_goes_to_the_named_successor(h: &SqlHarness) {
    use orion_beacon::{ConfigError, Handover};
    let _ = tracing_subscriber::fmt()
        .with_env_filter("orion_beacon=debug")
        .with_test_writer()
        .try_init();
    let resource = unique("handover");
    let recorder = Arc::new(Recorder::default());
    let mut handles = Vec::new();
    for idx in 0..3 {
        let db = h.connect_again(2).await;
        let store = h.configure(SeaOrmLeaseStore::new(db));
        let handle = Elector::builder(store)
            .resource(&resource)
            .candidate_id(format!("node-{idx}"))
            .lease_duration(Duration::from_secs(5))
            .renew_interval(Duration::from_millis(500))
            .retry_interval(RETRY)
            .build()
            .unwrap()
            .start();
        recorder.watch(idx, &handle);
        handles.push(handle);
    }
    wait_until("a first leader", Duration::from_secs(5), || {
        handles.iter().any(|h| h.is_leader())
    })
    .await;
    let first = handles.iter().position(|h| h.is_leader()).unwrap();
    // The successor: the follower with the highest index, never the other one.
    let successor = (0..3).rev().find(|i| *i != first).unwrap();
    let a = &handles[first];
    let old = a.token().expect("leads");
    // Bad requests change nothing.
    for (to, within) in [
        (format!("node-{first}"), Duration::from_secs(2)),
        (String::new(), Duration::from_secs(2)),
        (" node-1".to_owned(), Duration::from_secs(2)),
        ("node-1".to_owned(), Duration::ZERO),
        ("node-1".to_owned(), Duration::from_secs(400 * 24 * 3600)),
    ] {
        let err = a.hand_over_to(&to, within).await.unwrap_err();
        assert!(
            matches!(
                err,
                ConfigError::Invalid(_) | ConfigError::Zero { .. } | ConfigError::TooLong { .. }
            ),
            "{to:?}/{within:?}: {err:?}"
        );
    }
    assert_eq!(a.token(), Some(old), "still leads");
    assert_eq!(
        handles[successor]
            .hand_over_to(&format!("node-{first}"), Duration::from_secs(2))
            .await
            .unwrap(),
        Handover::NotLeader
    );

    let asked = Instant::now();
    let handover = a
        .hand_over_to(&format!("node-{successor}"), Duration::from_secs(2))
        .await
        .unwrap();
    let Handover::Taken { token } = handover else {
        panic!("not taken: {handover:?}");
    };
    assert!(token > old, "{token} after {old}");
    let took = wait_until("the successor", Duration::from_secs(2), || {
        handles[successor].is_leader() && recorder.leader_after(asked).is_some()
    })
    .await;
    let (who, _, led_with) = recorder.leader_after(asked).expect("a next term");
    assert_eq!(who, successor, "the named successor leads next");
    assert_eq!(led_with, token.get());
    eprintln!("handover to a named successor in {:?}", asked.elapsed());

    // A successor that is not there: the offer lapses after its window, then anyone leads.
    let b = &handles[successor];
    let asked = Instant::now();
    let within = Duration::from_millis(800);
    assert_eq!(
        b.hand_over_to("ghost", within).await.unwrap(),
        Handover::NotTaken
    );
    assert!(
        asked.elapsed() + super::SUSPEND_SLACK >= within,
        "answered before the offer lapsed"
    );
    wait_until(
        "a leader after the lapsed offer",
        within + SLACK * 2,
        || handles.iter().any(|h| h.is_leader()) && recorder.leader_after(asked).is_some(),
    )
    .await;
    let (_, started, after) = recorder
        .leader_after(asked)
        .expect("a term after the offer");
    assert!(started >= asked + within, "led inside the offer to another");
    assert!(after > token.get() + 1, "above the offer's own token");
    for h in &handles {
        h.shutdown().await;
    }
    recorder.check();
    eprintln!("handover took {took:?} after the answer");
}

/// A handover to a named successor that only a wake-up can make fast: three electors on
/// `stores` (one per "process") that poll every 10 s; the leader hands over to the follower it
/// did not start first, which must lead well before any poll (the offer wakes it), with the
/// offered token; the other follower never leads. Returns how long the handover took.
pub async fn woken_handover(stores: &[SeaOrmLeaseStore; 3]) -> Duration {
    use orion_beacon::Handover;
    const POLL: Duration = Duration::from_secs(10);
    let resource = unique("woken_handover");
    let elector = |store: &SeaOrmLeaseStore, id: &str| {
        Elector::builder(store.clone())
            .resource(&resource)
            .candidate_id(id)
            .lease_duration(Duration::from_secs(30))
            .renew_interval(Duration::from_secs(5))
            .retry_interval(POLL)
            .jitter(0.0)
            .build()
            .unwrap()
            .start()
    };
    let a = elector(&stores[0], "a");
    a.watch().wait_for(|s| s.is_leader()).await.unwrap();
    let old = a.token().unwrap();
    let (b, c) = (elector(&stores[1], "b"), elector(&stores[2], "c"));
    for f in [&b, &c] {
        f.watch()
            .wait_for(|s| {
                matches!(
                    s,
                    Leadership::Follower {
                        leader: Some(_),
                        ..
                    }
                )
            })
            .await
            .unwrap();
    }
    let asked = Instant::now();
    let answer = tokio::time::timeout(
        Duration::from_secs(5),
        a.hand_over_to("c", Duration::from_secs(8)),
    )
    .await
    .expect("the handover answers well before the followers' poll")
    .unwrap();
    let Handover::Taken { token } = answer else {
        panic!("not taken: {answer:?}");
    };
    assert!(token > old);
    tokio::time::timeout(
        Duration::from_secs(2),
        c.watch().wait_for(|s| s.is_leader()),
    )
    .await
    .expect("the successor leads")
    .unwrap();
    let took = asked.elapsed();
    assert_eq!(c.token(), Some(token));
    assert!(!b.is_leader());
    for h in [a, b, c] {
        h.shutdown().await;
    }
    took
}

/// An elector of candidate `node` on `store` for each of `resources`, started.
fn start_leaders(
    store: &SeaOrmLeaseStore,
    resources: &[String],
    lease: Duration,
    renew: Duration,
    together: Option<bool>,
) -> Vec<ElectorHandle> {
    resources
        .iter()
        .map(|r| {
            let builder = Elector::builder(store.clone())
                .resource(r)
                .candidate_id("node")
                .lease_duration(lease)
                .renew_interval(renew)
                .retry_interval(RETRY);
            match together {
                Some(together) => builder.renew_together(together),
                None => builder,
            }
            .build()
            .unwrap()
            .start()
        })
        .collect()
}

/// Twenty electors of one process on one store, each leading its own resource: after a round
/// they renew in one statement by default (every lease carries the same `renewed_at`, the
/// database's time of one statement, and it keeps moving); with `renew_together(false)`
/// (lease by lease) the stamps differ. A
/// lease revoked under the batch is reported lost and its elector asks at once: it starts a new
/// term with a higher token well within its deadline, while the others' terms go on untouched.
/// A shutdown withdraws from the batch and releases every lease.
pub async fn leaders_of_one_process_renew_together(h: &SqlHarness) {
    const N: usize = 20;
    let lease = Duration::from_secs(3);
    let renew = Duration::from_millis(300);
    // `None`: the default, together.
    for chosen in [None, Some(false)] {
        let together = chosen.unwrap_or(true);
        let store = h.configure(SeaOrmLeaseStore::new(h.connect_again(4).await));
        let resources: Vec<String> = (0..N).map(|_| unique("together")).collect();
        let handles = start_leaders(&store, &resources, lease, renew, chosen);
        wait_until("every elector leads", Duration::from_secs(10), || {
            handles.iter().all(|h| h.is_leader())
        })
        .await;
        // A few rounds: the leaders fall into step.
        tokio::time::sleep(renew * 4).await;
        let stamps = |records: &[orion_beacon::LeaseRecord]| {
            records
                .iter()
                .map(|r| r.renewed_at.unwrap())
                .collect::<std::collections::BTreeSet<_>>()
        };
        let before = store.current_all(&resources).await.unwrap();
        assert_eq!(before.len(), N);
        let first = stamps(&before);
        // MySQL/MariaDB: leaders renew lease by lease (a batch there could not bound its wait
        // for a row a leader's fenced transaction holds).
        let batches =
            sea_orm::ConnectionTrait::get_database_backend(h.db()) != sea_orm::DbBackend::MySql;
        if together && batches {
            assert_eq!(first.len(), 1, "one statement renewed them all: {first:?}");
        } else {
            assert!(first.len() > 1, "renewed lease by lease: {first:?}");
            for h in handles {
                h.shutdown().await;
            }
            continue;
        }
        tokio::time::sleep(renew * 2).await;
        let later = stamps(&store.current_all(&resources).await.unwrap());
        assert_eq!(later.len(), 1, "still one statement: {later:?}");
        assert!(later.first() > first.first(), "the batch keeps renewing");

        // A revoke under the batch: that elector alone begins a new term, long before its
        // deadline would have ended the old one.
        let old = handles[0].token().unwrap();
        let revoked = Instant::now();
        store.revoke(&resources[0]).await.unwrap().unwrap();
        wait_until("the revoked elector's new term", lease, || {
            handles[0].token().is_some_and(|t| t > old)
        })
        .await;
        assert!(
            revoked.elapsed() < renew * 3 + SLACK,
            "asked at once, {:?} after the revoke",
            revoked.elapsed()
        );
        let tokens: Vec<_> = before
            .iter()
            .map(|r| (r.resource.clone(), r.token))
            .collect();
        for (i, r) in resources.iter().enumerate().skip(1) {
            let was = tokens.iter().find(|(res, _)| res == r).unwrap().1;
            assert_eq!(handles[i].token(), Some(was), "{r}'s term goes on");
        }
        for h in handles {
            h.shutdown().await;
        }
        let after = store.current_all(&resources).await.unwrap();
        assert!(
            after.iter().all(|r| !r.live),
            "every lease released: {after:?}"
        );
    }
}

/// Leaders renewing together, one of them inside a long fenced transaction (which holds its
/// lease row): the others keep their terms throughout (the batch waits for that row no longer
/// than a single renew would, then each renews alone), and the fenced leader's own term ends
/// at its deadline at the latest, as without batches.
pub async fn a_long_fenced_transaction_holds_up_no_other_leader(h: &SqlHarness) {
    use sea_orm::TransactionTrait;
    const N: usize = 6;
    let lease = Duration::from_secs(2);
    let renew = Duration::from_millis(250);
    let store = h.configure(SeaOrmLeaseStore::new(h.connect_again(4).await));
    let resources: Vec<String> = (0..N).map(|_| unique("fenced_batch")).collect();
    let handles = start_leaders(&store, &resources, lease, renew, None);
    wait_until("every elector leads", Duration::from_secs(10), || {
        handles.iter().all(|h| h.is_leader())
    })
    .await;
    tokio::time::sleep(renew * 3).await;
    let tokens: Vec<_> = handles.iter().map(|h| h.token()).collect();
    let term = handles[0].watch().borrow().term().cloned().unwrap();
    let txn = h.db().begin().await.unwrap();
    term.fence(&txn).await.unwrap();
    // Two leases with the row held.
    let held = Instant::now();
    while held.elapsed() < lease * 2 {
        for (i, h) in handles.iter().enumerate().skip(1) {
            assert_eq!(
                h.token(),
                tokens[i],
                "leader {i} kept its term {:?} into the fenced transaction",
                held.elapsed()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Ended by the elector's own takeover of its lapsed term, perhaps (its session is gone).
    let _ = txn.rollback().await;
    for h in handles {
        h.shutdown().await;
    }
}

/// Generates the election test for a harness setup expression.
#[macro_export]
macro_rules! election_suite {
    ($setup:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn five_electors_crash_and_graceful_handover() {
            #[allow(unused_imports)]
            use $crate::common::conformance::Harness as _;
            if let Some(h) = $setup.await {
                $crate::common::election::crash_and_graceful_handover(&h).await;
                h.teardown().await;
            }
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn followers_see_the_leaders_payload() {
            #[allow(unused_imports)]
            use $crate::common::conformance::Harness as _;
            if let Some(h) = $setup.await {
                $crate::common::election::followers_see_the_leaders_payload(&h).await;
                h.teardown().await;
            }
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_handover_goes_to_the_named_successor() {
            #[allow(unused_imports)]
            use $crate::common::conformance::Harness as _;
            if let Some(h) = $setup.await {
                $crate::common::election::a_handover_goes_to_the_named_successor(&h).await;
                h.teardown().await;
            }
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn leaders_of_one_process_renew_together() {
            #[allow(unused_imports)]
            use $crate::common::conformance::Harness as _;
            if let Some(h) = $setup.await {
                $crate::common::election::leaders_of_one_process_renew_together(&h).await;
                h.teardown().await;
            }
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_step_down_hands_over_and_stays_out() {
            #[allow(unused_imports)]
            use $crate::common::conformance::Harness as _;
            if let Some(h) = $setup.await {
                $crate::common::election::a_step_down_hands_over_and_stays_out(&h).await;
                h.teardown().await;
            }
        }
    };
}
