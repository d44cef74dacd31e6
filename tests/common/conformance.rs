//! The store contract, as tests generic over any `LeaseStore`. Every store and backend runs all
//! of them through `conformance_suite!`.

use std::time::Duration;

use async_trait::async_trait;
use orion_beacon::{store::LeaseOutcome, FencingToken, Lease, LeaseStore, StoreError};

use super::{unique, Rng};

#[allow(unused_imports)]
pub use super::ranks::{
    a_successor_that_never_takes_is_backed_off, candidates_are_listed_with_ranks_and_kept_apart,
    the_highest_ranked_live_candidate_comes_to_lead,
};

/// A lease short enough to wait out in tests.
pub const SHORT: Duration = Duration::from_millis(400);
/// Long enough past `SHORT` that every clock agrees it is over.
pub const PAST_SHORT: Duration = Duration::from_millis(700);
/// A lease that never runs out during a test.
pub const LONG: Duration = Duration::from_secs(60);

/// One store under test.
#[async_trait]
pub trait Harness: Send + Sync + 'static {
    type Store: LeaseStore + Clone + 'static;
    /// A store on the harness's table (one shared connection pool).
    fn store(&self) -> Self::Store;
    /// A store on the same table with a connection pool of its own, as another process has.
    async fn separate_store(&self) -> Self::Store;
    /// A store with a pool of its own on another lease table of the same database that
    /// shares the harness's membership table (another group of the same service), where the
    /// store can be told its tables; `None` where it cannot.
    async fn store_on_another_lease_table(&self) -> Option<Self::Store> {
        None
    }
    /// Removes what the harness created.
    async fn teardown(self);
    /// How long after the write a store may measure `remaining` (a form that reads the row in
    /// a second statement sees a little less than the whole lease).
    fn read_delay(&self) -> Duration {
        Duration::ZERO
    }
    /// Whether a committed rate-limit decision may be answered with a conflict instead (MySQL
    /// 8's form on Galera, whose read after the COMMIT can find another caller's decision): its
    /// permit number then goes to nobody (fewer permits, never more).
    fn decisions_may_go_unreported(&self) -> bool {
        false
    }
}

/// A grant or renew has the whole lease left, measured from the start of the statement: the
/// lease runs from when the row was written, which may be a moment later.
fn assert_full_lease<H: Harness>(h: &H, remaining: Duration, lease: Duration) {
    assert!(
        remaining + h.read_delay() >= lease && remaining <= lease + Duration::from_secs(1),
        "a fresh grant or renew has the whole lease left: {remaining:?} for a lease of {lease:?}"
    );
}

fn acquired(outcome: &LeaseOutcome) -> FencingToken {
    match outcome {
        LeaseOutcome::Acquired(lease) => lease.token,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

fn renewed(outcome: &LeaseOutcome) -> FencingToken {
    match outcome {
        LeaseOutcome::Renewed(lease) => lease.token,
        other => panic!("expected Renewed, got {other:?}"),
    }
}

pub async fn new_resource_is_acquired_with_token_1<H: Harness>(h: &H) {
    let store = h.store();
    let r = unique("fresh");
    let out = store.acquire_or_renew(&r, "a", LONG).await.unwrap();
    assert_eq!(acquired(&out), FencingToken::new(1));
    let lease = out.lease().unwrap();
    assert_eq!(lease.holder, "a");
    assert_eq!(lease.resource, r);
    assert_full_lease(h, lease.remaining, LONG);
}

pub async fn renew_keeps_token_and_extends<H: Harness>(h: &H) {
    let store = h.store();
    let r = unique("renew");
    let first = store.acquire_or_renew(&r, "a", SHORT).await.unwrap();
    let token = acquired(&first);
    // Renew immediately (same millisecond is possible on SQLite) and after a while.
    let again = store.acquire_or_renew(&r, "a", SHORT).await.unwrap();
    assert_eq!(renewed(&again), token);
    for _ in 0..3 {
        tokio::time::sleep(SHORT / 2).await;
        let out = store.acquire_or_renew(&r, "a", SHORT).await.unwrap();
        assert_eq!(renewed(&out), token, "renewing keeps the token");
        assert_full_lease(h, out.lease().unwrap().remaining, SHORT);
    }
    // 1.5 leases after the first grant, still held: the renews really extended it.
    let rec = store.current(&r).await.unwrap().unwrap();
    assert!(rec.live);
    assert_eq!(rec.holder, "a");
    assert_eq!(rec.token, token);
    let first_exp = first.lease().unwrap().expires_at;
    let first_exp = first_exp.expect("every store reports the expiry it wrote");
    let now_exp = rec
        .expires_at
        .expect("every store reports the expiry it holds");
    assert!(
        now_exp > first_exp,
        "expiry moved forward: {first_exp} -> {now_exp}"
    );
    assert_eq!(
        rec.acquired_at,
        first.lease().unwrap().acquired_at,
        "acquired_at kept"
    );
    match (rec.acquired_at, rec.renewed_at) {
        (Some(acquired), Some(renewed)) => assert!(renewed > acquired),
        // The in-memory store keeps no term timestamps.
        (None, None) => {}
        other => panic!("one term timestamp without the other: {other:?}"),
    }
}

pub async fn live_lease_of_another_is_denied_with_holder<H: Harness>(h: &H) {
    let store = h.store();
    let r = unique("denied");
    let token = acquired(&store.acquire_or_renew(&r, "a", LONG).await.unwrap());
    let out = store.acquire_or_renew(&r, "b", LONG).await.unwrap();
    let LeaseOutcome::Denied(denial) = out else {
        panic!("expected Denied, got {out:?}")
    };
    assert_eq!(denial.holder.as_deref(), Some("a"));
    assert_eq!(denial.token, Some(token));
    assert!(
        denial.remaining > LONG - Duration::from_secs(10) && denial.remaining <= LONG,
        "{:?}",
        denial.remaining
    );
    // Nothing changed.
    let rec = store.current(&r).await.unwrap().unwrap();
    assert_eq!(
        (rec.holder.as_str(), rec.token, rec.live),
        ("a", token, true)
    );
    assert_eq!(
        renewed(&store.acquire_or_renew(&r, "a", LONG).await.unwrap()),
        token
    );
}

pub async fn expired_lease_goes_to_next_with_higher_token<H: Harness>(h: &H) {
    let store = h.store();
    let r = unique("expired");
    let t1 = acquired(&store.acquire_or_renew(&r, "a", SHORT).await.unwrap());
    tokio::time::sleep(PAST_SHORT).await;
    let rec = store.current(&r).await.unwrap().unwrap();
    assert!(!rec.live, "lease should have lapsed: {rec:?}");
    assert_eq!(rec.remaining, Duration::ZERO);
    let out = store.acquire_or_renew(&r, "b", SHORT).await.unwrap();
    let t2 = acquired(&out);
    assert_eq!(t2.get(), t1.get() + 1);
    // The old holder is now denied and told who leads.
    let LeaseOutcome::Denied(d) = store.acquire_or_renew(&r, "a", SHORT).await.unwrap() else {
        panic!("old holder must be denied")
    };
    assert_eq!(d.holder.as_deref(), Some("b"));
}

pub async fn own_expired_lease_is_a_new_term<H: Harness>(h: &H) {
    let store = h.store();
    let r = unique("own_expired");
    let t1 = acquired(&store.acquire_or_renew(&r, "a", SHORT).await.unwrap());
    tokio::time::sleep(PAST_SHORT).await;
    let t2 = acquired(&store.acquire_or_renew(&r, "a", SHORT).await.unwrap());
    assert_eq!(t2.get(), t1.get() + 1, "a lapsed lease is never renewed");
}

pub async fn release_tombstones_and_keeps_the_token<H: Harness>(h: &H) {
    let store = h.store();
    let r = unique("release");
    let t1 = acquired(&store.acquire_or_renew(&r, "a", LONG).await.unwrap());
    assert!(
        store.release(&r, "a").await.unwrap(),
        "holder releases its live lease"
    );
    let rec = store
        .current(&r)
        .await
        .unwrap()
        .expect("the row survives a release");
    assert!(!rec.live);
    assert_eq!(rec.token, t1, "the token survives the release");
    assert!(
        !store.release(&r, "a").await.unwrap(),
        "releasing twice does nothing"
    );
    // Next acquirer (the same candidate too) advances past the kept token, even after idling.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let t2 = acquired(&store.acquire_or_renew(&r, "a", LONG).await.unwrap());
    assert_eq!(t2.get(), t1.get() + 1);
    assert!(store.release(&r, "a").await.unwrap());
    let t3 = acquired(&store.acquire_or_renew(&r, "b", LONG).await.unwrap());
    assert_eq!(t3.get(), t2.get() + 1);
}

fn granted(outcome: LeaseOutcome) -> Lease {
    match outcome {
        LeaseOutcome::Acquired(lease) | LeaseOutcome::Renewed(lease) => lease,
        LeaseOutcome::Denied(denial) => panic!("expected a grant, got {denial:?}"),
    }
}

/// `release_lease` ends exactly the write it names: never a later renew (even by the same
/// holder, as a restarted process that reuses its id makes), nor a later term.
pub async fn release_lease_ends_only_the_write_it_names<H: Harness>(h: &H) {
    let store = h.store();
    let r = unique("release_lease");
    let first = granted(store.acquire_or_renew(&r, "a", LONG).await.unwrap());
    assert!(first.expires_at.is_some(), "a grant names its write");
    // Past the coarsest store clock step (SQLite: 1 ms), so the renew writes a new expiry.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let renewed = granted(store.acquire_or_renew(&r, "a", LONG).await.unwrap());
    assert_eq!(renewed.token, first.token);
    assert_ne!(renewed.expires_at, first.expires_at);
    assert!(
        !store.release_lease(&first).await.unwrap(),
        "a release naming an earlier write ended a later renew"
    );
    let row = store.current(&r).await.unwrap().unwrap();
    assert!(row.live && row.holder == "a", "{row:?}");
    assert_eq!(
        row.expires_at, renewed.expires_at,
        "the renew's write is intact"
    );

    let mut other_holder = renewed.clone();
    other_holder.holder = "b".into();
    assert!(!store.release_lease(&other_holder).await.unwrap());
    let mut other_token = renewed.clone();
    other_token.token = FencingToken::new(renewed.token.get() + 1);
    assert!(!store.release_lease(&other_token).await.unwrap());
    let mut no_write = renewed.clone();
    no_write.expires_at = None;
    assert!(!store.release_lease(&no_write).await.unwrap());
    assert!(store.current(&r).await.unwrap().unwrap().live);

    assert!(
        store.release_lease(&renewed).await.unwrap(),
        "the last write is released"
    );
    let row = store.current(&r).await.unwrap().unwrap();
    assert!(!row.live, "{row:?}");
    assert_eq!(row.token, first.token, "the token survives the release");
    assert!(
        !store.release_lease(&renewed).await.unwrap(),
        "releasing twice does nothing"
    );
    // The same holder's next term is not ended by the last term's release.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let next = granted(store.acquire_or_renew(&r, "a", LONG).await.unwrap());
    assert_eq!(next.token.get(), first.token.get() + 1);
    assert!(!store.release_lease(&renewed).await.unwrap());
    assert!(store.current(&r).await.unwrap().unwrap().live);
    assert!(store.release_lease(&next).await.unwrap());

    let mut nameless = next.clone();
    nameless.resource = String::new();
    assert!(matches!(
        store.release_lease(&nameless).await,
        Err(StoreError::InvalidResource { .. })
    ));
    let mut holderless = next;
    holderless.holder = String::new();
    assert!(matches!(
        store.release_lease(&holderless).await,
        Err(StoreError::InvalidCandidate { .. })
    ));
}

/// A late `release_lease` of one write never ends a later renew of the same term, even one
/// made within the same tick of the store's clock (SQLite stores milliseconds): two processes
/// with one candidate id renew back to back, then the first sends the release of its own
/// earlier write. Every write of a term must have an expiry of its own.
pub async fn a_late_release_never_ends_a_renew_in_the_same_clock_step<H: Harness>(h: &H) {
    let p1 = h.store();
    let p2 = h.separate_store().await;
    let r = unique("same_step");
    for i in 0..100 {
        let w1 = granted(p1.acquire_or_renew(&r, "a", LONG).await.unwrap());
        // Straight after, from the other process: the acquire-or-renew and the batch renew.
        let w2 = if i % 2 == 0 {
            granted(p2.acquire_or_renew(&r, "a", LONG).await.unwrap())
        } else {
            let out = p2.renew_all(std::slice::from_ref(&w1), LONG).await.unwrap();
            assert_eq!(out.renewed.len(), 1, "iteration {i}: {out:?}");
            out.renewed[0].clone()
        };
        assert_eq!(w2.token, w1.token, "iteration {i}: one term");
        assert!(
            !p1.release_lease(&w1).await.unwrap(),
            "iteration {i}: a late release of an earlier write ended a later renew of the term \
             (expiries {:?} and {:?})",
            w1.expires_at,
            w2.expires_at
        );
        assert!(
            w2.expires_at > w1.expires_at,
            "iteration {i}: a renew wrote no expiry of its own: {:?} then {:?}",
            w1.expires_at,
            w2.expires_at
        );
        let row = p1.current(&r).await.unwrap().unwrap();
        assert!(row.live, "iteration {i}: {row:?}");
        assert_eq!(
            row.expires_at, w2.expires_at,
            "iteration {i}: the renew's write"
        );
        let out = p1.acquire_or_renew(&r, "c", LONG).await.unwrap();
        assert!(
            matches!(out, LeaseOutcome::Denied(_)),
            "iteration {i}: a third candidate was granted while the term was live: {out:?}"
        );
    }
}

/// A renew never moves a term's expiry back, not even one asking for a shorter lease: a
/// write that ended at or before an earlier one could carry that earlier write's name (holder,
/// token, expiry), and a late release of it would end the term. The remaining time reported is
/// the new expiry's.
pub async fn a_renew_never_moves_the_expiry_back<H: Harness>(h: &H) {
    let p1 = h.store();
    let p2 = h.separate_store().await;
    let r = unique("no_step_back");
    let started = std::time::Instant::now();
    let first = granted(p1.acquire_or_renew(&r, "a", LONG).await.unwrap());
    // Shorter leases, which would end before the earlier writes' expiries.
    let shorter = granted(p2.acquire_or_renew(&r, "a", SHORT).await.unwrap());
    let out = p2
        .renew_all(std::slice::from_ref(&shorter), Duration::from_millis(1))
        .await
        .unwrap();
    assert_eq!(out.renewed.len(), 1, "{out:?}");
    let batch = out.renewed[0].clone();
    let shortest = granted(
        p1.acquire_or_renew(&r, "a", Duration::from_millis(1))
            .await
            .unwrap(),
    );
    let writes = [first, shorter, batch, shortest];
    for pair in writes.windows(2) {
        assert_eq!(pair[1].token, pair[0].token, "one term: {pair:?}");
        assert!(
            pair[1].expires_at > pair[0].expires_at,
            "a renew moved the expiry back: {:?} then {:?}",
            pair[0].expires_at,
            pair[1].expires_at
        );
    }
    for w in &writes[1..] {
        let least = LONG.saturating_sub(started.elapsed() + Duration::from_secs(1));
        assert!(
            w.remaining >= least,
            "the remaining time is the new expiry's: {w:?}"
        );
    }
    let last = &writes[3];
    for earlier in &writes[..3] {
        assert!(
            !p1.release_lease(earlier).await.unwrap(),
            "a late release of {earlier:?} ended the later write {last:?}"
        );
    }
    let row = p2.current(&r).await.unwrap().unwrap();
    assert!(row.live && row.expires_at == last.expires_at, "{row:?}");
    assert!(matches!(
        p2.acquire_or_renew(&r, "c", LONG).await.unwrap(),
        LeaseOutcome::Denied(_)
    ));
    assert!(
        p2.release_lease(last).await.unwrap(),
        "the last write is released"
    );
    let next = granted(p1.acquire_or_renew(&r, "c", LONG).await.unwrap());
    assert_eq!(next.token.get(), last.token.get() + 1);
}

pub async fn release_by_non_holder_or_of_expired_changes_nothing<H: Harness>(h: &H) {
    let store = h.store();
    let r = unique("release_guard");
    assert!(!store.release(&r, "a").await.unwrap(), "nothing to release");
    let t1 = acquired(&store.acquire_or_renew(&r, "a", SHORT).await.unwrap());
    assert!(
        !store.release(&r, "b").await.unwrap(),
        "only the holder may release"
    );
    let rec = store.current(&r).await.unwrap().unwrap();
    assert!(rec.live && rec.holder == "a" && rec.token == t1);
    tokio::time::sleep(PAST_SHORT).await;
    assert!(
        !store.release(&r, "a").await.unwrap(),
        "an expired lease is not released"
    );
    let rec2 = store.current(&r).await.unwrap().unwrap();
    assert_eq!((rec2.holder.as_str(), rec2.token), ("a", t1));
    assert_eq!(
        rec2.expires_at, rec.expires_at,
        "release of an expired lease wrote nothing"
    );
}

pub async fn current_reports_rows<H: Harness>(h: &H) {
    let store = h.store();
    let r = unique("current");
    assert!(store.current(&r).await.unwrap().is_none());
    let t = acquired(&store.acquire_or_renew(&r, "node-a", LONG).await.unwrap());
    let rec = store.current(&r).await.unwrap().unwrap();
    assert_eq!(rec.resource, r);
    assert_eq!(rec.holder, "node-a");
    assert_eq!(rec.token, t);
    assert!(rec.live);
    assert!(rec.remaining > LONG - Duration::from_secs(10) && rec.remaining <= LONG);
    // Unicode names round-trip exactly; case matters.
    let r2 = unique("Résumé-ÜBER");
    let t2 = acquired(&store.acquire_or_renew(&r2, "Node-A", LONG).await.unwrap());
    assert_eq!(t2, FencingToken::new(1));
    assert!(matches!(
        store.acquire_or_renew(&r2, "node-a", LONG).await.unwrap(),
        LeaseOutcome::Denied(_)
    ));
    assert_eq!(store.current(&r2).await.unwrap().unwrap().holder, "Node-A");
}

/// 16 candidates with their own connection pools race for a fresh resource, then for the
/// same resource once it lapsed: exactly one wins each time, nobody sees an error.
pub async fn first_insert_race_has_one_winner<H: Harness>(h: &H) {
    const N: usize = 16;
    let r = unique("race");
    let mut stores = Vec::new();
    for _ in 0..N {
        stores.push(h.separate_store().await);
    }
    for round in 0..2u32 {
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(N));
        let mut tasks = Vec::new();
        for (i, store) in stores.iter().enumerate() {
            let (store, r, barrier) = (store.clone(), r.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                store.acquire_or_renew(&r, &format!("c{i}"), SHORT).await
            }));
        }
        let mut winners = Vec::new();
        for task in tasks {
            match task.await.unwrap() {
                Ok(LeaseOutcome::Acquired(lease)) => winners.push(lease),
                Ok(LeaseOutcome::Denied(_)) => {}
                Ok(other) => panic!("unexpected {other:?}"),
                Err(e) => panic!("round {round}: a racer saw an error: {e:?}"),
            }
        }
        assert_eq!(
            winners.len(),
            1,
            "round {round}: exactly one winner, got {winners:?}"
        );
        assert_eq!(winners[0].token.get(), i64::from(round) + 1);
        tokio::time::sleep(PAST_SHORT).await;
    }
}

/// A long randomized run of acquire / renew / release / expiry by several candidates: every
/// new term's token is exactly one more than the last, renews keep it, and only the term's
/// holder ever renews.
pub async fn randomized_run_tokens_strictly_increase<H: Harness>(h: &H) {
    let seed = std::env::var("ORION_BEACON_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(Rng::seed_from_time);
    eprintln!("randomized run seed: {seed} (replay with ORION_BEACON_SEED={seed})");
    let mut rng = Rng::new(seed);
    let store = h.store();
    let r = unique("random");
    let candidates = ["a", "b", "c", "d"];
    let mut last: Option<(String, FencingToken)> = None;
    let mut terms = 0;
    for step in 0..300 {
        let who = candidates[rng.below(4) as usize];
        match rng.below(10) {
            0..=5 => {
                let lease = Duration::from_millis(20 + rng.below(60));
                match store.acquire_or_renew(&r, who, lease).await.unwrap() {
                    LeaseOutcome::Acquired(l) => {
                        let expected = last.as_ref().map_or(1, |(_, t)| t.get() + 1);
                        assert_eq!(
                            l.token.get(),
                            expected,
                            "seed {seed} step {step}: new term token"
                        );
                        last = Some((who.to_owned(), l.token));
                        terms += 1;
                    }
                    LeaseOutcome::Renewed(l) => {
                        let (holder, token) = last.clone().expect("renew before any term");
                        assert_eq!(
                            (holder.as_str(), l.token),
                            (who, token),
                            "seed {seed} step {step}: renew"
                        );
                    }
                    LeaseOutcome::Denied(d) => {
                        let (holder, _) = last.clone().expect("denied before any term");
                        assert_ne!(
                            holder, who,
                            "seed {seed} step {step}: holder denied its own lease"
                        );
                        if let Some(h) = d.holder {
                            assert_eq!(h, holder);
                        }
                    }
                }
            }
            6..=7 => {
                let released = store.release(&r, who).await.unwrap();
                if released {
                    assert_eq!(
                        last.as_ref().map(|(h, _)| h.as_str()),
                        Some(who),
                        "seed {seed} step {step}"
                    );
                }
            }
            _ => tokio::time::sleep(Duration::from_millis(rng.below(40))).await,
        }
    }
    assert!(
        terms >= 10,
        "seed {seed}: only {terms} terms; the run did not exercise handovers"
    );
}

pub async fn bad_input_is_refused_before_sql<H: Harness>(h: &H) {
    let store = h.store();
    let long = "x".repeat(256);
    let cases: Vec<(&str, &str, Duration)> = vec![
        ("", "a", LONG),
        (&long, "a", LONG),
        ("r\n", "a", LONG),
        (" r", "a", LONG),
        ("r", "", LONG),
        ("r", &long, LONG),
        ("r", "a", Duration::ZERO),
        ("r", "a", Duration::from_micros(10)),
        ("r", "a", Duration::from_secs(400 * 24 * 3600)),
    ];
    for (r, c, lease) in cases {
        let err = store.acquire_or_renew(r, c, lease).await.unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::InvalidResource { .. }
                    | StoreError::InvalidCandidate { .. }
                    | StoreError::InvalidLeaseDuration { .. }
            ),
            "{r:?}/{c:?}/{lease:?}: {err:?}"
        );
        assert!(!err.is_retryable());
    }
    assert!(matches!(
        store.release("", "a").await,
        Err(StoreError::InvalidResource { .. })
    ));
    assert!(matches!(
        store.release("r", "").await,
        Err(StoreError::InvalidCandidate { .. })
    ));
    assert!(matches!(
        store.current(&long).await,
        Err(StoreError::InvalidResource { .. })
    ));
}

pub async fn renew_all_renews_held_terms_and_reports_the_lost<H: Harness>(h: &H) {
    let store = h.store();
    let names: Vec<String> = (0..5).map(|i| unique(&format!("batch{i}"))).collect();
    let kept = granted(store.acquire_or_renew(&names[0], "a", LONG).await.unwrap());
    let released = granted(store.acquire_or_renew(&names[1], "a", LONG).await.unwrap());
    let lapsing = granted(store.acquire_or_renew(&names[2], "a", SHORT).await.unwrap());
    let other_holder = granted(store.acquire_or_renew(&names[3], "b", LONG).await.unwrap());
    let taken = granted(store.acquire_or_renew(&names[4], "a", SHORT).await.unwrap());
    assert!(store.release(&names[1], "a").await.unwrap());
    tokio::time::sleep(PAST_SHORT).await;
    // names[4] lapsed and went to "c": a's term there is over, though the row is live.
    let rival = granted(store.acquire_or_renew(&names[4], "c", LONG).await.unwrap());
    // A term the store never granted: the right holder, a token from the future.
    let mut stale = lapsing.clone();
    stale.token = FencingToken::new(lapsing.token.get() + 7);

    let held = [
        lapsing.clone(),
        kept.clone(),
        released.clone(),
        other_holder.clone(),
        taken.clone(),
    ];
    let out = store.renew_all(&held, LONG).await.unwrap();
    let resources = |v: &[Lease]| v.iter().map(|l| l.resource.clone()).collect::<Vec<_>>();
    assert_eq!(
        resources(&out.renewed),
        vec![names[0].clone(), names[3].clone()],
        "the live terms are renewed, in the order given: {out:?}"
    );
    assert_eq!(
        resources(&out.lost),
        vec![names[2].clone(), names[1].clone(), names[4].clone()],
        "lapsed, released and taken-over terms are lost: {out:?}"
    );
    for (renewed, before) in out.renewed.iter().zip([&kept, &other_holder]) {
        assert_eq!(
            (&renewed.holder, renewed.token),
            (&before.holder, before.token),
            "a renew keeps the term"
        );
        // A whole lease, less the moment a store that reads the renewed rows back in a second
        // statement (MySQL) spends between the two.
        assert!(
            renewed.remaining + Duration::from_millis(250) >= LONG
                && renewed.remaining <= LONG + Duration::from_secs(1),
            "a renew has the whole lease left: {renewed:?}"
        );
    }
    assert_eq!(out.lost[0], lapsing, "a lost lease comes back as given");

    // No term was started or touched for the lost ones.
    let lapsed = store.current(&names[2]).await.unwrap().unwrap();
    assert_eq!((lapsed.live, lapsed.token), (false, lapsing.token));
    let tomb = store.current(&names[1]).await.unwrap().unwrap();
    assert_eq!((tomb.live, tomb.token), (false, released.token));
    let now_rival = store.current(&names[4]).await.unwrap().unwrap();
    assert_eq!(
        (now_rival.holder.as_str(), now_rival.token),
        ("c", rival.token)
    );
    // The renewed leases really were extended, and stay the holders' terms.
    assert_eq!(
        renewed(&store.acquire_or_renew(&names[0], "a", LONG).await.unwrap()),
        kept.token
    );
    // A token the row does not carry renews nothing, even for the holder of a live lease.
    let out = store.renew_all(&[stale], LONG).await.unwrap();
    assert!(out.renewed.is_empty() && out.lost.len() == 1, "{out:?}");
    assert_eq!(
        store.current(&names[2]).await.unwrap().unwrap().token,
        lapsing.token
    );
    // Nothing to renew: no error.
    let out = store.renew_all(&[], LONG).await.unwrap();
    assert!(out.renewed.is_empty() && out.lost.is_empty());
}

/// A batch the size of a busy node's (thousands of leases) renews every one of them, in far
/// less than a lease: a plan that is quadratic in the batch (MariaDB's for an `UPDATE ... IN
/// (SELECT ...)` took 34 s for 3,000) renews the first rows it touches too early to count.
pub async fn renew_all_renews_a_large_batch<H: Harness>(h: &H) {
    let store = h.store();
    let prefix = unique("big");
    let mut held = Vec::new();
    for i in 0..3_000 {
        held.push(granted(
            store
                .acquire_or_renew(&format!("{prefix}-{i}"), "a", LONG)
                .await
                .unwrap(),
        ));
    }
    let started = std::time::Instant::now();
    let out = store.renew_all(&held, LONG).await.unwrap();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "3,000 renews took {took:?}");
    assert_eq!(
        (out.renewed.len(), out.lost.len()),
        (held.len(), 0),
        "lost: {:?}",
        out.lost.iter().take(5).collect::<Vec<_>>()
    );
}

pub async fn renew_all_refuses_bad_input_before_sql<H: Harness>(h: &H) {
    let store = h.store();
    let r = unique("batch_bad");
    let lease = granted(store.acquire_or_renew(&r, "a", LONG).await.unwrap());
    let twice = store
        .renew_all(&[lease.clone(), lease.clone()], LONG)
        .await
        .unwrap_err();
    assert!(
        matches!(twice, StoreError::InvalidResource { .. }),
        "a resource twice in one batch: {twice:?}"
    );
    let zero = store
        .renew_all(std::slice::from_ref(&lease), Duration::ZERO)
        .await
        .unwrap_err();
    assert!(
        matches!(zero, StoreError::InvalidLeaseDuration { .. }),
        "{zero:?}"
    );
    let mut bad = lease.clone();
    bad.holder = " a".into();
    let err = store.renew_all(&[bad], LONG).await.unwrap_err();
    assert!(
        matches!(err, StoreError::InvalidCandidate { .. }),
        "{err:?}"
    );
    // The refused batches changed nothing.
    let rec = store.current(&r).await.unwrap().unwrap();
    assert_eq!((rec.token, rec.expires_at), (lease.token, lease.expires_at));
}

fn payload_of(outcome: &LeaseOutcome) -> Option<&str> {
    match outcome {
        LeaseOutcome::Acquired(l) | LeaseOutcome::Renewed(l) => l.payload.as_deref(),
        LeaseOutcome::Denied(d) => d.payload.as_deref(),
    }
}

/// A payload is written by the statement that grants or renews, read back by the holder,
/// reported to rivals in their denial and by `current`; every renew writes the one it is given
/// (none clears it), a batch renew keeps it.
pub async fn a_payload_is_written_by_the_grant_and_shown_to_rivals<H: Harness>(h: &H) {
    let store = h.store();
    let other = h.separate_store().await;
    let r = unique("payload");
    let out = store
        .acquire_or_renew_with(&r, "a", LONG, Some("10.0.0.1:8080"))
        .await
        .unwrap();
    assert_eq!(acquired(&out), FencingToken::new(1));
    assert_eq!(payload_of(&out), Some("10.0.0.1:8080"));
    let denied = other
        .acquire_or_renew_with(&r, "b", LONG, Some("b's own"))
        .await
        .unwrap();
    assert!(matches!(denied, LeaseOutcome::Denied(_)), "{denied:?}");
    assert_eq!(payload_of(&denied), Some("10.0.0.1:8080"), "{denied:?}");
    let record = other.current(&r).await.unwrap().unwrap();
    assert_eq!(record.payload.as_deref(), Some("10.0.0.1:8080"));
    // A renew writes its own payload, in the same statement.
    let out = store
        .acquire_or_renew_with(&r, "a", LONG, Some("v2"))
        .await
        .unwrap();
    assert_eq!(renewed(&out), FencingToken::new(1));
    assert_eq!(payload_of(&out), Some("v2"));
    assert_eq!(
        other.current(&r).await.unwrap().unwrap().payload.as_deref(),
        Some("v2")
    );
    // The batch renew keeps it.
    let held = out.lease().unwrap().clone();
    let renewals = store.renew_all(&[held], LONG).await.unwrap();
    assert_eq!(renewals.renewed.len(), 1, "{renewals:?}");
    assert_eq!(renewals.renewed[0].payload.as_deref(), Some("v2"));
    assert_eq!(
        other.current(&r).await.unwrap().unwrap().payload.as_deref(),
        Some("v2")
    );
    // A renew without one clears it (plain acquire_or_renew writes none).
    let out = store.acquire_or_renew(&r, "a", LONG).await.unwrap();
    assert_eq!(renewed(&out), FencingToken::new(1));
    assert_eq!(payload_of(&out), None);
    let denied = other.acquire_or_renew(&r, "b", LONG).await.unwrap();
    assert_eq!(payload_of(&denied), None, "{denied:?}");
    assert_eq!(other.current(&r).await.unwrap().unwrap().payload, None);
    // Up to the limit, byte for byte (multi-byte characters, quotes, white space).
    let exact = format!("{}'\"` \t{}", "é".repeat(500), "x".repeat(1024 - 1000 - 5));
    assert_eq!(exact.len(), orion_beacon::store::MAX_PAYLOAD_LEN);
    let out = store
        .acquire_or_renew_with(&r, "a", LONG, Some(&exact))
        .await
        .unwrap();
    assert_eq!(payload_of(&out), Some(exact.as_str()));
    assert_eq!(
        other.current(&r).await.unwrap().unwrap().payload.as_deref(),
        Some(exact.as_str())
    );
    assert!(store.release(&r, "a").await.unwrap());
}

/// A payload belongs to the term that wrote it: a later term that wrote none, after a lapse or
/// a release, never shows the earlier term's.
pub async fn a_new_term_never_shows_an_earlier_terms_payload<H: Harness>(h: &H) {
    let store = h.store();
    let other = h.separate_store().await;
    let r = unique("payload_term");
    store
        .acquire_or_renew_with(&r, "a", SHORT, Some("a's address"))
        .await
        .unwrap();
    tokio::time::sleep(PAST_SHORT).await;
    let out = other.acquire_or_renew(&r, "b", LONG).await.unwrap();
    assert_eq!(acquired(&out), FencingToken::new(2));
    assert_eq!(payload_of(&out), None, "{out:?}");
    let denied = store
        .acquire_or_renew_with(&r, "a", LONG, Some("a again"))
        .await
        .unwrap();
    assert!(matches!(denied, LeaseOutcome::Denied(_)), "{denied:?}");
    assert_eq!(payload_of(&denied), None, "{denied:?}");
    assert_eq!(store.current(&r).await.unwrap().unwrap().payload, None);
    // Released with a payload; the next term writes none.
    other
        .acquire_or_renew_with(&r, "b", LONG, Some("b's address"))
        .await
        .unwrap();
    assert!(other.release(&r, "b").await.unwrap());
    let out = store.acquire_or_renew(&r, "c", LONG).await.unwrap();
    assert_eq!(acquired(&out), FencingToken::new(3));
    assert_eq!(payload_of(&out), None, "{out:?}");
    assert_eq!(other.current(&r).await.unwrap().unwrap().payload, None);
    // And a term of the same holder, after its own lapse, starts without one too.
    let r2 = unique("payload_own");
    store
        .acquire_or_renew_with(&r2, "a", SHORT, Some("first"))
        .await
        .unwrap();
    tokio::time::sleep(PAST_SHORT).await;
    let out = store.acquire_or_renew(&r2, "a", SHORT).await.unwrap();
    assert_eq!(acquired(&out), FencingToken::new(2));
    assert_eq!(payload_of(&out), None);
    // A new term over a lapsed row writes its own payload, shown to the next rival.
    tokio::time::sleep(PAST_SHORT).await;
    let out = other
        .acquire_or_renew_with(&r2, "b", LONG, Some("b's term"))
        .await
        .unwrap();
    assert_eq!(acquired(&out), FencingToken::new(3));
    assert_eq!(payload_of(&out), Some("b's term"));
    let denied = store.acquire_or_renew(&r2, "a", LONG).await.unwrap();
    assert_eq!(payload_of(&denied), Some("b's term"), "{denied:?}");
}

/// A payload over the limit, or with a NUL, is refused with a typed error before any SQL: the
/// lease is untouched.
pub async fn a_bad_payload_is_refused_before_sql<H: Harness>(h: &H) {
    let store = h.store();
    let r = unique("payload_bad");
    let too_long = "x".repeat(orion_beacon::store::MAX_PAYLOAD_LEN + 1);
    // 513 two-byte characters: under the limit in characters, over it in bytes.
    let too_many_bytes = "é".repeat(513);
    for bad in [too_long.as_str(), too_many_bytes.as_str(), "a\0b"] {
        let err = store
            .acquire_or_renew_with(&r, "a", LONG, Some(bad))
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::InvalidPayload { len, .. } if len == bad.len()),
            "{err:?}"
        );
        assert_eq!(err.kind(), orion_beacon::ErrorKind::InvalidInput);
        assert!(err.is_permanent());
    }
    assert!(
        store.current(&r).await.unwrap().is_none(),
        "nothing was written"
    );
}

fn denial(outcome: &LeaseOutcome) -> &orion_beacon::store::Denial {
    match outcome {
        LeaseOutcome::Denied(denial) => denial,
        other => panic!("expected Denied, got {other:?}"),
    }
}

/// A planned handover: the offer ends the holder's term (its renew and releases fail)
/// and begins a new one with the next token, which only the named successor can take; every
/// other candidate is denied, told whom it is offered to, and sees no payload of the ended
/// term; the successor's take and renew carry that token, and the offer cannot be taken twice.
pub async fn an_offer_ends_the_term_and_only_the_successor_takes_it<H: Harness>(h: &H) {
    let (store, other) = (h.store(), h.separate_store().await);
    let r = unique("offer");
    let granted = store
        .acquire_or_renew_with(&r, "a", LONG, Some("addr-a"))
        .await
        .unwrap();
    let t = acquired(&granted);
    let lease = granted.lease().unwrap().clone();
    assert!(store.offer(&lease, "b", LONG).await.unwrap());
    let next = FencingToken::new(t.get() + 1);

    // The old holder's term is over.
    let asked = store.acquire_or_renew(&r, "a", LONG).await.unwrap();
    assert_eq!(denial(&asked).offered_to(), Some("b"), "{asked:?}");
    assert!(!store.release_lease(&lease).await.unwrap());
    assert!(!store.release(&r, "a").await.unwrap());
    assert!(
        !store.offer(&lease, "c", LONG).await.unwrap(),
        "an ended term offers nothing"
    );
    // Everyone else is denied: the offer's token, its successor, no payload of the ended term.
    let seen = other.acquire_or_renew(&r, "c", LONG).await.unwrap();
    let d = denial(&seen);
    assert_eq!(d.offered_to(), Some("b"));
    assert_eq!(d.token, Some(next));
    assert_eq!(d.payload, None);
    assert!(d.remaining > Duration::ZERO);
    let record = other.current(&r).await.unwrap().unwrap();
    assert!(record.live);
    assert_eq!(record.offered_to(), Some("b"));
    assert_eq!(record.token, next);
    // Only `b`, only with the offer's token.
    assert!(!other.take_offer(&r, "c", next, LONG).await.unwrap());
    assert!(!other.take_offer(&r, "b", t, LONG).await.unwrap());
    assert!(other.take_offer(&r, "b", next, LONG).await.unwrap());
    assert!(
        !other.take_offer(&r, "b", next, LONG).await.unwrap(),
        "taken once"
    );
    let renewed_by_b = other
        .acquire_or_renew_with(&r, "b", LONG, Some("addr-b"))
        .await
        .unwrap();
    assert_eq!(
        renewed(&renewed_by_b),
        next,
        "the successor's term has the next token"
    );
    assert_full_lease(h, renewed_by_b.lease().unwrap().remaining, LONG);
    let seen = store.acquire_or_renew(&r, "a", LONG).await.unwrap();
    let d = denial(&seen);
    assert_eq!(d.holder.as_deref(), Some("b"));
    assert_eq!(d.offered_to(), None);
    assert_eq!(d.payload.as_deref(), Some("addr-b"));
    // And it ends like any term: released, the next grant's token is higher still.
    assert!(other.release(&r, "b").await.unwrap());
    let again = store.acquire_or_renew(&r, "a", LONG).await.unwrap();
    assert_eq!(acquired(&again), FencingToken::new(next.get() + 1));
}

/// An offer nobody takes lapses like a lease: after it, the successor can no longer take it and
/// the next grant, to anyone, has a token higher than the offer's.
pub async fn an_offer_nobody_takes_lapses_to_a_higher_token<H: Harness>(h: &H) {
    let store = h.store();
    let r = unique("offer_lapses");
    let granted = store.acquire_or_renew(&r, "a", LONG).await.unwrap();
    let t = acquired(&granted);
    assert!(store
        .offer(granted.lease().unwrap(), "b", SHORT)
        .await
        .unwrap());
    let d = store.acquire_or_renew(&r, "c", LONG).await.unwrap();
    assert!(
        denial(&d).remaining <= SHORT + Duration::from_millis(50),
        "{d:?}"
    );
    tokio::time::sleep(PAST_SHORT).await;
    let offered = FencingToken::new(t.get() + 1);
    assert!(!store.take_offer(&r, "b", offered, LONG).await.unwrap());
    let next = store.acquire_or_renew(&r, "c", LONG).await.unwrap();
    assert_eq!(acquired(&next), FencingToken::new(t.get() + 2));
}

/// Offers and takes with bad names or durations are typed errors before any SQL.
pub async fn bad_offers_are_refused_before_sql<H: Harness>(h: &H) {
    let store = h.store();
    let r = unique("bad_offer");
    let granted = store.acquire_or_renew(&r, "a", LONG).await.unwrap();
    let lease = granted.lease().unwrap().clone();
    let too_long = "x".repeat(orion_beacon::store::MAX_OFFER_TARGET_LEN + 1);
    for (to, within) in [
        ("", LONG),
        (" b", LONG),
        ("b\n", LONG),
        (too_long.as_str(), LONG),
        ("a", LONG),
        ("b", Duration::ZERO),
        ("b", Duration::from_secs(400 * 24 * 3600)),
    ] {
        let err = store.offer(&lease, to, within).await.unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::InvalidCandidate { .. } | StoreError::InvalidLeaseDuration { .. }
            ),
            "{to:?}/{within:?}: {err:?}"
        );
    }
    let token = FencingToken::new(2);
    for (resource, candidate, lease) in [
        ("", "b", LONG),
        (r.as_str(), too_long.as_str(), LONG),
        (r.as_str(), "b", Duration::ZERO),
    ] {
        let err = store
            .take_offer(resource, candidate, token, lease)
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::InvalidResource { .. }
                    | StoreError::InvalidCandidate { .. }
                    | StoreError::InvalidLeaseDuration { .. }
            ),
            "{resource:?}/{candidate:?}/{lease:?}: {err:?}"
        );
    }
    // Nothing was offered: the holder still renews.
    let again = store.acquire_or_renew(&r, "a", LONG).await.unwrap();
    assert_eq!(renewed(&again), lease.token);
}

/// A candidate that only watches (`campaign(false)`) follows the leader and its payload, sees a
/// free lease as no leader and leaves it free, never leads, and never takes an offer made to it.
pub async fn a_watcher_follows_the_leader_and_never_leads<H: Harness>(h: &H) {
    use orion_beacon::{Elector, Handover, Leadership};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let resource = unique("watched");
    let elector = |store: H::Store, id: &str, campaign: bool| {
        Elector::builder(store)
            .resource(&resource)
            .candidate_id(id)
            .payload(format!("http://{id}"))
            .lease_duration(Duration::from_millis(1_500))
            .renew_interval(Duration::from_millis(300))
            .retry_interval(Duration::from_millis(100))
            // Far above any stalled read of a loaded machine.
            .health_window(Duration::from_secs(10))
            .campaign(campaign)
            .build()
            .unwrap()
            .start()
    };
    let watcher = elector(h.separate_store().await, "watcher", false);
    let led = Arc::new(AtomicBool::new(false));
    let spy = {
        let (watch, led) = (watcher.watch(), led.clone());
        tokio::spawn(async move {
            loop {
                led.fetch_or(watch.borrow().is_leader(), Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let follows = |leader: Option<&str>| {
        let expected = leader.map(|l| (l.to_owned(), format!("http://{l}")));
        move |state: &Leadership| match state {
            Leadership::Follower { leader, payload } => {
                let seen = leader.clone().zip(payload.clone());
                seen == expected
            }
            _ => false,
        }
    };
    let within = Duration::from_secs(10);
    tokio::time::timeout(within, watcher.watch().wait_for(follows(None)))
        .await
        .expect("the watcher sees no leader")
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        h.store().current(&resource).await.unwrap().is_none(),
        "a watcher never asks for the lease"
    );
    let a = elector(h.store(), "a", true);
    tokio::time::timeout(within, watcher.watch().wait_for(follows(Some("a"))))
        .await
        .expect("the watcher follows the leader, with its payload")
        .unwrap();
    // An offer to the watcher is never taken.
    let offered = a
        .hand_over_to("watcher", Duration::from_millis(400))
        .await
        .unwrap();
    assert_eq!(offered, Handover::NotTaken);
    tokio::time::timeout(within, a.watch().wait_for(|s| s.is_leader()))
        .await
        .expect("the leader leads again after the offer lapsed")
        .unwrap();
    let last = a.token().expect("a leads");
    a.shutdown().await;
    tokio::time::timeout(within, watcher.watch().wait_for(follows(None)))
        .await
        .expect("the watcher sees the lease released")
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    // The last write is still a's release of its last term: the watcher wrote nothing since.
    let record = h.store().current(&resource).await.unwrap().unwrap();
    assert!(
        !record.live && record.holder == "a" && record.token == last,
        "{record:?}"
    );
    spy.abort();
    assert!(!led.load(Ordering::SeqCst), "the watcher led");
    let health = watcher.health();
    assert!(health.healthy && !health.leader, "{health:?}");
    watcher.shutdown().await;
}

/// Generates one `#[tokio::test]` per contract case for a harness setup expression
/// (`async -> Option<Harness>`; `None` means the backend was opted out).
#[macro_export]
macro_rules! conformance_suite {
    // `#[ignore = "why"]` first: for a backend that needs a server this machine may not have.
    (#[ignore = $why:literal] $setup:expr) => {
        $crate::conformance_suite!(@all [ignore = $why] $setup);
    };
    ($setup:expr) => {
        $crate::conformance_suite!(@all [cfg(all())] $setup);
    };
    (@all $attr:tt $setup:expr) => {
        $crate::conformance_suite!(@cases $attr $setup;
            new_resource_is_acquired_with_token_1,
            renew_keeps_token_and_extends,
            live_lease_of_another_is_denied_with_holder,
            expired_lease_goes_to_next_with_higher_token,
            own_expired_lease_is_a_new_term,
            release_tombstones_and_keeps_the_token,
            release_by_non_holder_or_of_expired_changes_nothing,
            release_lease_ends_only_the_write_it_names,
            a_late_release_never_ends_a_renew_in_the_same_clock_step,
            a_renew_never_moves_the_expiry_back,
            current_reports_rows,
            first_insert_race_has_one_winner,
            randomized_run_tokens_strictly_increase,
            bad_input_is_refused_before_sql,
            renew_all_renews_held_terms_and_reports_the_lost,
            renew_all_refuses_bad_input_before_sql,
            renew_all_renews_a_large_batch,
            a_payload_is_written_by_the_grant_and_shown_to_rivals,
            a_new_term_never_shows_an_earlier_terms_payload,
            a_bad_payload_is_refused_before_sql,
            an_offer_ends_the_term_and_only_the_successor_takes_it,
            an_offer_nobody_takes_lapses_to_a_higher_token,
            bad_offers_are_refused_before_sql,
            a_watcher_follows_the_leader_and_never_leads,
            candidates_are_listed_with_ranks_and_kept_apart,
            the_highest_ranked_live_candidate_comes_to_lead,
            a_successor_that_never_takes_is_backed_off,
        );
    };
    (@cases $attr:tt $setup:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #$attr
            async fn $case() {
                #[allow(unused_imports)]
                use $crate::common::conformance::Harness as _;
                if let Some(h) = $setup.await {
                    $crate::common::conformance::$case(&h).await;
                    h.teardown().await;
                }
            }
        )*
    };
}
