//! Rate limits, as tests generic over any store: a burst then spaced permits, an idle key's
//! burst refilled and no more, a limited key told when its next permit is due and granted then, timed waits, independent keys, racing
//! callers on pools of their own never over the quota at any database instant (and permit
//! numbers never given twice), bad keys refused before any SQL. Every store runs them through
//! `rate_suite!`.

use std::time::Duration;

use orion_beacon::rate_limit::{Permit, Quota, RateLimitError, RateLimiter, RateOutcome};
use orion_beacon::{ErrorKind, RateLimitStore};
use tokio::time::Instant;

use super::conformance::Harness;
use super::unique;

fn quota(interval_ms: u64, permits: u32, burst: u32) -> Quota {
    Quota::per(Duration::from_millis(interval_ms), permits)
        .and_then(|q| q.with_burst(burst))
        .expect("a valid quota")
}

fn granted(outcome: RateOutcome) -> Permit {
    match outcome {
        RateOutcome::Granted(p) => p,
        other => panic!("expected a permit, got {other:?}"),
    }
}

fn limited(outcome: RateOutcome) -> Duration {
    match outcome {
        RateOutcome::Limited(l) => l.retry_after,
        other => panic!("expected no permit, got {other:?}"),
    }
}

/// A burst of 3 goes at once, numbered 1 to 3 with what is left of the burst; the fourth is
/// refused and told the next is due within one spacing (1 s: wide enough for a slow machine's
/// four calls).
pub async fn a_burst_is_granted_then_the_next_is_due_one_spacing_later<H: Harness>(h: &H)
where
    H::Store: RateLimitStore,
{
    let limiter = RateLimiter::new(h.store(), quota(10_000, 10, 3));
    let key = unique("burst");
    let started = Instant::now();
    let mut permits = Vec::new();
    for _ in 0..3 {
        permits.push(granted(limiter.try_acquire(&key).await.unwrap()));
    }
    let wait = limited(limiter.try_acquire(&key).await.unwrap());
    let took = started.elapsed();
    assert_eq!(
        permits.iter().map(|p| p.number).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    assert_eq!(permits[0].available, 2, "{permits:?}");
    assert_eq!(permits[2].available, 0, "{permits:?}");
    assert!(permits.iter().all(|p| p.key == key));
    // The first permit's spacing, less the time the four calls took (and SQLite's clock step).
    assert!(
        wait <= Duration::from_secs(1)
            && wait + took + Duration::from_millis(10) >= Duration::from_secs(1),
        "next permit due in {wait:?} after {took:?}"
    );
}

/// A key left idle gets its burst back, and no more: the arrival time it kept is behind now,
/// and a permit counts from now, not from it.
pub async fn an_idle_key_refills_its_burst_and_no_more<H: Harness>(h: &H)
where
    H::Store: RateLimitStore,
{
    let limiter = RateLimiter::new(h.store(), quota(1_000, 10, 2));
    let key = unique("idle");
    granted(limiter.try_acquire(&key).await.unwrap());
    // Ten spacings idle: enough for a bucket that never stopped filling to hold ten.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let mut got = 0;
    let started = Instant::now();
    while let RateOutcome::Granted(_) = limiter.try_acquire(&key).await.unwrap() {
        got += 1;
        assert!(got <= 10, "an idle key kept granting");
    }
    if started.elapsed() < Duration::from_millis(100) {
        assert_eq!(got, 2, "a burst of 2 after an idle second");
    } else {
        // A slow machine: the spacing gave one more meanwhile.
        assert!(
            (2..=2 + started.elapsed().as_millis() / 100).contains(&got),
            "{got}"
        );
    }
}

/// A refused key grants again once its next permit is due, and the numbers go on.
pub async fn a_limited_key_grants_again_once_due<H: Harness>(h: &H)
where
    H::Store: RateLimitStore,
{
    let limiter = RateLimiter::new(h.store(), quota(300, 1, 1));
    let key = unique("due");
    let first = granted(limiter.try_acquire(&key).await.unwrap());
    let wait = limited(limiter.try_acquire(&key).await.unwrap());
    assert!(wait <= Duration::from_millis(300), "{wait:?}");
    tokio::time::sleep(wait + Duration::from_millis(20)).await;
    let second = granted(limiter.try_acquire(&key).await.unwrap());
    assert_eq!(second.number, first.number + 1);
    assert!(
        second.granted_at - first.granted_at >= chrono::TimeDelta::milliseconds(300),
        "{first:?} then {second:?}: closer than the spacing"
    );
}

/// `acquire` waits for the next permit when it is due within the timeout, and otherwise says
/// at once when it is due.
pub async fn acquire_waits_for_the_next_permit_or_says_when<H: Harness>(h: &H)
where
    H::Store: RateLimitStore,
{
    let limiter = RateLimiter::new(h.store(), quota(1_000, 1, 1));
    let key = unique("wait");
    let first = limiter.acquire(&key, Duration::from_secs(5)).await.unwrap();
    let started = Instant::now();
    let second = limiter.acquire(&key, Duration::from_secs(5)).await.unwrap();
    let waited = started.elapsed();
    assert_eq!(second.number, first.number + 1);
    // Spaced by the database's clock; waited for, not refused.
    assert!(
        second.granted_at - first.granted_at >= chrono::TimeDelta::milliseconds(1_000),
        "{first:?} then {second:?}"
    );
    assert!(
        waited < Duration::from_secs(4),
        "waited {waited:?} for a permit due 1 s after the last"
    );
    let started = Instant::now();
    let err = limiter
        .acquire(&key, Duration::from_millis(50))
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_millis(700),
        "a permit due after the timeout is refused at once, not waited for: {:?}",
        started.elapsed()
    );
    match &err {
        RateLimitError::TimedOut { retry_after, .. } => {
            assert!(*retry_after > Duration::from_millis(50), "{err:?}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(err.kind(), ErrorKind::TimedOut);
}

/// One key's limit is its own.
pub async fn keys_are_limited_apart<H: Harness>(h: &H)
where
    H::Store: RateLimitStore,
{
    let limiter = RateLimiter::new(h.store(), quota(60_000, 1, 1));
    let (a, b) = (unique("key-a"), unique("key-b"));
    granted(limiter.try_acquire(&a).await.unwrap());
    limited(limiter.try_acquire(&a).await.unwrap());
    assert_eq!(granted(limiter.try_acquire(&b).await.unwrap()).number, 1);
}

/// Callers race for one key, half on the harness's pool and half on pools of their own (other
/// processes; on Galera, another node): no permit number is given twice, and over the permits' database instants no span of the interval holds more
/// than `permits + burst - 1`; the quota is not stricter than it says either.
pub async fn racing_callers_never_exceed_the_quota<H: Harness>(h: &H)
where
    H::Store: RateLimitStore,
{
    let q = quota(500, 10, 2);
    let key = unique("race");
    let run_for = Duration::from_millis(1_500);
    let mut tasks = Vec::new();
    for i in 0..6 {
        let store = if i % 2 == 0 {
            h.store()
        } else {
            h.separate_store().await
        };
        let limiter = RateLimiter::new(store, q);
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let until = Instant::now() + run_for;
            let (mut permits, mut conflicts) = (Vec::new(), 0u64);
            // Everyone asks again when the next permit is due (the moment they race for), and
            // after a grant within a few milliseconds: enough to take every permit the quota
            // gives, without keeping the test binary's other tests off the two cores.
            while Instant::now() < until {
                match limiter.try_acquire(&key).await {
                    Ok(RateOutcome::Granted(p)) => {
                        permits.push(p);
                        let pause = Duration::from_micros(fastrand::u64(1_000..5_000));
                        tokio::time::sleep(pause).await;
                    }
                    Ok(RateOutcome::Limited(l)) => {
                        tokio::time::sleep(l.retry_after.max(Duration::from_millis(1))).await
                    }
                    Ok(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                    // A conflict the store gave up on is no permit: ask again.
                    Err(e) if e.is_retryable() => conflicts += 1,
                    Err(e) => panic!("{e:?}"),
                }
            }
            (permits, conflicts)
        }));
    }
    let (mut permits, mut conflicts) = (Vec::new(), 0);
    for t in tasks {
        let (got, failed) = t.await.unwrap();
        permits.extend(got);
        conflicts += failed;
    }
    let mut numbers: Vec<u64> = permits.iter().map(|p| p.number).collect();
    numbers.sort_unstable();
    let mut distinct = numbers.clone();
    distinct.dedup();
    assert_eq!(distinct, numbers, "each permit number once");
    if h.decisions_may_go_unreported() {
        // A number nobody got is a decision answered with a conflict: no more of them than
        // conflicts the callers saw.
        let skipped = numbers.last().copied().unwrap_or(0) - numbers.len() as u64;
        assert!(
            skipped <= conflicts,
            "{skipped} permit numbers went to nobody, with {conflicts} conflicts: {numbers:?}"
        );
    } else {
        let expected: Vec<u64> = (1..=permits.len() as u64).collect();
        assert_eq!(numbers, expected, "each permit number once, none skipped");
    }
    let mut at: Vec<i64> = permits
        .iter()
        .map(|p| p.granted_at.timestamp_micros())
        .collect();
    at.sort_unstable();
    let span = i64::try_from(q.interval().as_micros()).unwrap();
    let mut most = 0;
    let mut j = 0;
    for i in 0..at.len() {
        while j < at.len() && at[j] < at[i] + span {
            j += 1;
        }
        most = most.max(j - i);
    }
    assert!(
        most as u64 <= q.most_per_interval(),
        "{most} permits in one span of {:?} (at most {})",
        q.interval(),
        q.most_per_interval()
    );
    // 1.5 s at one per 50 ms, plus the burst: about 31; a slow machine gets fewer.
    assert!(
        permits.len() >= 12,
        "only {} permits in {run_for:?}",
        permits.len()
    );
}

/// Bad keys are refused with a typed error before any SQL.
pub async fn bad_keys_are_refused_before_sql<H: Harness>(h: &H)
where
    H::Store: RateLimitStore,
{
    let limiter = RateLimiter::new(h.store(), quota(1_000, 1, 1));
    for key in ["", " padded", "tab\there", &"x".repeat(256)] {
        let err = limiter.try_acquire(key).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{key:?}: {err:?}");
    }
    let err = limiter
        .acquire("fine", Duration::from_secs(400 * 24 * 3600))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err:?}");
}

#[macro_export]
macro_rules! rate_suite {
    // `#[ignore = "why"]` first: for a backend that needs a server this machine may not have.
    (#[ignore = $why:literal] $setup:expr) => {
        $crate::rate_suite!(@all [ignore = $why] $setup);
    };
    ($setup:expr) => {
        $crate::rate_suite!(@all [cfg(all())] $setup);
    };
    (@all $attr:tt $setup:expr) => {
        $crate::rate_suite!(@cases $attr $setup;
            a_burst_is_granted_then_the_next_is_due_one_spacing_later,
            an_idle_key_refills_its_burst_and_no_more,
            a_limited_key_grants_again_once_due,
            acquire_waits_for_the_next_permit_or_says_when,
            keys_are_limited_apart,
            racing_callers_never_exceed_the_quota,
            bad_keys_are_refused_before_sql,
        );
    };
    (@cases $attr:tt $setup:expr; $($case:ident),* $(,)?) => {
        mod rates {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #$attr
                async fn $case() {
                    #[allow(unused_imports)]
                    use $crate::common::conformance::Harness as _;
                    if let Some(h) = $setup.await {
                        $crate::common::rates::$case(&h).await;
                        h.teardown().await;
                    }
                }
            )*
        }
    };
}
