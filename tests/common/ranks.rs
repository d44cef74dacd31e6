//! Ranked candidates, on every store: the candidate list (kept apart from shard sets and other
//! lease tables), the leader's handover up the ranks, and the back-off from a successor that
//! does not take the lease.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use orion_beacon::{Elector, ElectorHandle, LeaseStore, MembershipStore, StoreError};
use tokio::time::Instant;

use super::conformance::Harness;
use super::unique;

const LEASE: Duration = Duration::from_millis(900);
const RENEW: Duration = Duration::from_millis(150);
const RETRY: Duration = Duration::from_millis(100);
const PREFER_AFTER: Duration = Duration::from_millis(300);
/// Far beyond what a loaded 2-core machine adds to the protocol's own bound.
const WITHIN: Duration = Duration::from_secs(10);

fn ranked<S: LeaseStore + 'static>(store: S, resource: &str, id: &str, rank: i64) -> ElectorHandle {
    Elector::builder(store)
        .resource(resource)
        .candidate_id(id)
        .lease_duration(LEASE)
        .renew_interval(RENEW)
        .retry_interval(RETRY)
        .health_window(WITHIN)
        .rank(rank)
        .prefer_after(PREFER_AFTER)
        .build()
        .unwrap()
        .start()
}

/// Who led, from when, with which token: every leadership any of `handles` reported.
#[derive(Default)]
struct Terms(Mutex<Vec<(String, i64, Instant)>>);

impl Terms {
    fn record(self: &Arc<Self>, id: &str, handle: &ElectorHandle) -> tokio::task::JoinHandle<()> {
        let (me, id, mut watch) = (self.clone(), id.to_owned(), handle.watch());
        tokio::spawn(async move {
            loop {
                if let Some(term) = watch.borrow_and_update().term() {
                    let mut all = me.0.lock().unwrap();
                    let token = term.token().get();
                    if !all.iter().any(|(_, t, _)| *t == token) {
                        all.push((id.clone(), token, term.began_at()));
                    }
                }
                if watch.changed().await.is_err() {
                    return;
                }
            }
        })
    }

    fn all(&self) -> Vec<(String, i64, Instant)> {
        let mut all = self.0.lock().unwrap().clone();
        all.sort_by_key(|t| t.1);
        all
    }
}

/// The candidate list: a heartbeat answers the live candidates with their ranks, ordered by
/// id; a leave removes one; an election's candidates are not a shard set's members of the
/// same name, nor another lease table's election's; bad input is refused before any SQL.
pub async fn candidates_are_listed_with_ranks_and_kept_apart<H: Harness>(h: &H) {
    let store = h.store();
    let members = store.membership().expect("every store keeps candidates");
    let r = unique("ranks");
    let ttl = Duration::from_secs(30);
    let first = members.candidate_heartbeat(&r, "b", ttl, 5).await.unwrap();
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!((first[0].candidate.as_str(), first[0].rank), ("b", 5));
    assert!(first[0].remaining <= ttl && first[0].remaining > ttl - Duration::from_secs(5));
    assert!(first[0].live_for < Duration::from_secs(5), "{first:?}");
    let second = members.candidate_heartbeat(&r, "a", ttl, -3).await.unwrap();
    let listed: Vec<(&str, i64)> = second
        .iter()
        .map(|c| (c.candidate.as_str(), c.rank))
        .collect();
    assert_eq!(listed, [("a", -3), ("b", 5)]);
    // A rank changes with the next heartbeat; the membership goes on.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let again = members.candidate_heartbeat(&r, "b", ttl, 7).await.unwrap();
    let b = again.iter().find(|c| c.candidate == "b").unwrap();
    assert_eq!(b.rank, 7);
    assert!(b.live_for >= Duration::from_millis(250), "{b:?}");
    // A shard set named like the resource has its own members, and sees no candidate.
    let joined = members
        .heartbeat(&r, "node", ttl, false)
        .await
        .expect("the shard-set heartbeat");
    assert_eq!(joined.len(), 1, "{joined:?}");
    assert_eq!(members.candidates(&r).await.unwrap().len(), 2);
    // Another lease table's election of the same name is another election.
    if let Some(other) = h.store_on_another_lease_table().await {
        let other = other.membership().unwrap();
        assert!(other.candidates(&r).await.unwrap().is_empty());
        let theirs = other.candidate_heartbeat(&r, "z", ttl, 1).await.unwrap();
        assert_eq!(theirs.len(), 1, "{theirs:?}");
        assert_eq!(members.candidates(&r).await.unwrap().len(), 2);
        assert!(other.candidate_leave(&r, "z").await.unwrap());
    }
    assert!(members.candidate_leave(&r, "a").await.unwrap());
    assert!(!members.candidate_leave(&r, "a").await.unwrap());
    let left: Vec<String> = members
        .candidates(&r)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.candidate)
        .collect();
    assert_eq!(left, ["b"]);
    assert!(members.leave(&r, "node").await.unwrap());
    // A short candidacy lapses.
    members
        .candidate_heartbeat(&r, "c", Duration::from_millis(200), 1)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let names: Vec<String> = members
        .candidates(&r)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.candidate)
        .collect();
    assert_eq!(names, ["b"]);
    for (resource, candidate, ttl) in [
        ("", "a", ttl),
        (r.as_str(), "", ttl),
        (r.as_str(), "a", Duration::ZERO),
        (&*"x".repeat(253), "a", ttl),
    ] {
        let err = members
            .candidate_heartbeat(resource, candidate, ttl, 1)
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::InvalidResource { .. }
                    | StoreError::InvalidCandidate { .. }
                    | StoreError::InvalidLeaseDuration { .. }
            ),
            "{resource:?}/{candidate:?}: {err:?}"
        );
    }
    members.candidate_leave(&r, "b").await.unwrap();
}

/// Leadership moves up to the highest-ranked live candidate, in one handover once that one has
/// been live for `prefer_after`, never to a lower rank and never twice; every term's token
/// exceeds the one before; followers see the candidates and their ranks. When the top candidate
/// shuts down, it leaves the list and the next rank comes to lead.
pub async fn the_highest_ranked_live_candidate_comes_to_lead<H: Harness>(h: &H) {
    let r = unique("ranked");
    let terms = Arc::new(Terms::default());
    let low = ranked(h.store(), &r, "low", 1);
    let watchers = vec![terms.record("low", &low)];
    tokio::time::timeout(WITHIN, low.watch().wait_for(|l| l.is_leader()))
        .await
        .expect("the only candidate leads")
        .unwrap();
    // The top rank first, seen by the leader before the middle one starts, so that it is
    // live long enough first.
    let high = ranked(h.separate_store().await, &r, "high", 3);
    let started = Instant::now();
    let mut watchers = watchers;
    watchers.push(terms.record("high", &high));
    let lists = |handle: &ElectorHandle, id: &str| {
        handle
            .candidacy()
            .is_some_and(|v| v.candidates.iter().any(|c| c.candidate == id))
    };
    let deadline = Instant::now() + WITHIN;
    while !lists(&low, "high") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mid = ranked(h.separate_store().await, &r, "mid", 2);
    watchers.push(terms.record("mid", &mid));
    tokio::time::timeout(WITHIN, high.watch().wait_for(|l| l.is_leader()))
        .await
        .expect("the highest rank comes to lead")
        .unwrap();
    let took = started.elapsed();
    assert!(
        took >= PREFER_AFTER,
        "handed over after {took:?}, before the candidate was live for {PREFER_AFTER:?}"
    );
    // It stays there: nobody ranks higher.
    tokio::time::sleep(LEASE).await;
    assert!(high.is_leader());
    let seen = terms.all();
    let leaders: Vec<&str> = seen.iter().map(|t| t.0.as_str()).collect();
    assert_eq!(
        leaders,
        ["low", "high"],
        "one handover, up the ranks: {seen:?}"
    );
    assert!(seen[1].1 > seen[0].1);
    // Followers see the candidates and their ranks (health too); a view whose heartbeat was
    // cut short by the next attempt is a failed one, so the next good one is taken.
    let deadline = Instant::now() + WITHIN;
    let view = loop {
        let view = mid.candidacy().expect("a ranked elector has a candidacy");
        if (view.error.is_none() && view.candidates.len() == 3) || Instant::now() > deadline {
            break view;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let listed: Vec<(&str, i64)> = view
        .candidates
        .iter()
        .map(|c| (c.candidate.as_str(), c.rank))
        .collect();
    assert_eq!(listed, [("high", 3), ("low", 1), ("mid", 2)], "{view:?}");
    assert_eq!(view.rank, 2);
    assert!(view.error.is_none(), "{view:?}");
    assert_eq!(low.health().candidacy.map(|c| c.rank), Some(1));
    // The top one hands over to a lower rank by hand: it stays out (and out of the candidates)
    // for the handover's window, so the new leader keeps the lease meanwhile instead of
    // offering it back to a candidate that will not take it; after that, and prefer_after, it
    // is preferred again.
    let window = Duration::from_millis(800);
    let asked = Instant::now();
    let handed = high.hand_over_to("mid", window).await.unwrap();
    assert!(
        matches!(handed, orion_beacon::Handover::Taken { .. }),
        "{handed:?}"
    );
    tokio::time::timeout(WITHIN, mid.watch().wait_for(|l| l.is_leader()))
        .await
        .expect("the named successor leads")
        .unwrap();
    let token = mid.token();
    tokio::time::sleep(window * 3 / 4).await;
    assert_eq!(
        mid.token(),
        token,
        "the new leader was made to offer the lease back during the stay-out: {:?}",
        terms.all()
    );
    tokio::time::timeout(WITHIN, high.watch().wait_for(|l| l.is_leader()))
        .await
        .expect("the top rank is preferred again after its stay-out")
        .unwrap();
    // Its new candidacy began no sooner than the stay-out's end, and is preferred only once
    // live for prefer_after.
    assert!(
        asked.elapsed() >= window + PREFER_AFTER,
        "{:?}",
        asked.elapsed()
    );
    // The top one goes: it leaves the list before it releases, and the next rank comes to
    // lead, with no offer to the one gone (an offer nobody takes would leave nobody leading
    // for its window).
    // Every offer made from here on, as the lease row shows it.
    let offers = Arc::new(Mutex::new(Vec::<String>::new()));
    let spy = {
        let (store, r, offers) = (h.store(), r.clone(), offers.clone());
        tokio::spawn(async move {
            loop {
                if let Ok(Some(record)) = store.current(&r).await {
                    if let Some(to) = record.offered_to() {
                        offers.lock().unwrap().push(to.to_owned());
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    high.shutdown().await;
    let gone = Instant::now();
    tokio::time::timeout(WITHIN, mid.watch().wait_for(|l| l.is_leader()))
        .await
        .expect("the next rank comes to lead")
        .unwrap();
    // At most the contest (a retry interval, or a wake-up) and one handover up from the
    // lowest (a renew interval, the offer taken): never an offer's window lost to the one gone.
    let took = gone.elapsed();
    assert!(
        took < Duration::from_millis(1_500),
        "{took:?}: {:?}",
        terms.all()
    );
    spy.abort();
    assert!(
        !offers.lock().unwrap().iter().any(|to| to == "high"),
        "the lease was offered to the candidate gone: {:?}",
        offers.lock().unwrap()
    );
    // The terms since the top one went: mid's, or the lowest's and then mid's (the contest's
    // winner hands over up), and mid keeps it.
    tokio::time::sleep(LEASE).await;
    let all = terms.all();
    let after: Vec<&str> = all
        .iter()
        .filter(|t| t.2 >= gone)
        .map(|t| t.0.as_str())
        .collect();
    assert!(
        after == ["mid"] || after == ["low", "mid"],
        "after the top one went: {all:?}"
    );
    let members = h.store().membership().unwrap();
    let left: Vec<String> = members
        .candidates(&r)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.candidate)
        .collect();
    assert_eq!(left, ["low", "mid"], "the stopped candidate left");
    tokio::time::sleep(LEASE).await;
    assert!(mid.is_leader() && !low.is_leader());
    let seen = terms.all();
    assert!(
        seen.windows(2).all(|w| w[1].1 > w[0].1),
        "tokens rise: {seen:?}"
    );
    assert_eq!(seen.last().map(|t| t.0.as_str()), Some("mid"), "{seen:?}");
    low.shutdown().await;
    mid.shutdown().await;
    for watcher in watchers {
        watcher.abort();
    }
}

/// A candidate that ranks higher but never takes the lease (a live heartbeat, no elector) is
/// offered it, and then again only after a back-off that doubles each time: the leader's terms
/// between offers grow, and leadership never loops at the renew rate.
pub async fn a_successor_that_never_takes_is_backed_off<H: Harness>(h: &H) {
    let r = unique("ghost");
    let members = h.store().membership().unwrap();
    // The ghost's heartbeats, kept live for the whole case.
    let ghost = {
        let (members, r) = (members.clone(), r.clone());
        tokio::spawn(async move {
            loop {
                let _ = members
                    .candidate_heartbeat(&r, "ghost", Duration::from_secs(2), 9)
                    .await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let terms = Arc::new(Terms::default());
    let low = ranked(h.store(), &r, "low", 1);
    let watcher = terms.record("low", &low);
    // Offers at about 0.3 s (the ghost live long enough), then each after the offer's window
    // (about 0.2 s) and a back-off of the lease (the larger of it and prefer_after), then twice
    // it: four terms within about 3.6 s.
    let deadline = Instant::now() + WITHIN;
    while terms.all().len() < 4 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seen = terms.all();
    assert!(
        seen.len() >= 4,
        "the leader came back after each offer lapsed: {seen:?}"
    );
    assert!(seen.iter().all(|t| t.0 == "low"));
    // Each term after a refusal lasts at least its back-off: the lease, then twice it.
    for (n, w) in seen.windows(2).enumerate().skip(1).take(2) {
        let lasted = w[1].2 - w[0].2;
        let back_off = LEASE.max(PREFER_AFTER) * (1 << (n - 1));
        assert!(
            lasted >= back_off,
            "term {n} ran {lasted:?} before the next offer, less than the back-off {back_off:?}: {seen:?}"
        );
    }
    ghost.abort();
    watcher.abort();
    low.shutdown().await;
    members.candidate_leave(&r, "ghost").await.unwrap();
}
