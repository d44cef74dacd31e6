//! Any option values: `build()` refuses them with a typed error, or the elector runs (leads,
//! runs work, shuts down) without panicking. Randomized over extremes and ordinary values; the
//! seed is printed (set `ORION_BEACON_SEED` to replay one).

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::Rng;
use orion_beacon::{ConfigError, Elector, InMemoryLeaseStore};

/// Panics anywhere in this test binary (the elector's own task included), counted by a hook:
/// a panic in a spawned task is otherwise silent.
static PANICS: AtomicUsize = AtomicUsize::new(0);

/// An extreme value, a random one, or (most often) a plausible fraction of `lease`.
fn duration(rng: &mut Rng, lease: Duration) -> Duration {
    const EXTREMES: [Duration; 9] = [
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_millis(1),
        Duration::from_millis(999),
        Duration::from_secs(15),
        Duration::from_secs(366 * 24 * 3600),
        Duration::from_secs(366 * 24 * 3600 + 1),
        Duration::from_secs(u64::MAX / 2),
        Duration::MAX,
    ];
    match rng.below(6) {
        0 => EXTREMES[rng.below(EXTREMES.len() as u64) as usize],
        1 => Duration::from_millis(rng.below(120_000)),
        2 => Duration::from_nanos(rng.next()),
        _ => lease.mul_f64(rng.below(1000) as f64 / 2000.0),
    }
}

#[tokio::test(start_paused = true)]
async fn any_options_build_an_error_or_a_working_elector() {
    std::panic::set_hook(Box::new(|info| {
        PANICS.fetch_add(1, Ordering::SeqCst);
        eprintln!("panic: {info}");
    }));
    let seed = std::env::var("ORION_BEACON_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(Rng::seed_from_time);
    eprintln!("seed {seed}");
    let mut rng = Rng::new(seed);
    let (mut built, mut refused) = (0, 0);
    for case in 0..600 {
        let mut b = Elector::builder(InMemoryLeaseStore::new())
            .resource("r")
            .candidate_id("c");
        // Each option set or left at its default, at random.
        let lease = if rng.below(4) > 0 {
            let lease = if rng.below(3) == 0 {
                duration(&mut rng, Duration::from_secs(15))
            } else {
                Duration::from_millis(1 + rng.below(60_000))
            };
            b = b.lease_duration(lease);
            lease
        } else {
            Duration::from_secs(15)
        };
        if rng.below(4) > 0 {
            b = b.renew_interval(duration(&mut rng, lease));
        }
        if rng.below(4) > 0 {
            b = b.retry_interval(duration(&mut rng, lease));
        }
        if rng.below(4) > 0 {
            b = b.step_down_margin(duration(&mut rng, lease));
        }
        if rng.below(4) > 0 {
            b = b.grace_period(duration(&mut rng, lease));
        }
        if rng.below(4) > 0 {
            b = b.health_window(duration(&mut rng, lease));
        }
        if rng.below(4) > 0 {
            let jitters = [0.0, 0.1, 0.5, 0.500_001, -0.1, f64::NAN, f64::INFINITY];
            b = b.jitter(jitters[rng.below(jitters.len() as u64) as usize]);
        }
        let debug = format!("{b:?}");
        let elector = match b.build() {
            Ok(e) => e,
            Err(err) => {
                // Typed, and says which option.
                assert!(!err.to_string().is_empty());
                let _: &ConfigError = &err;
                refused += 1;
                continue;
            }
        };
        built += 1;
        let handle = Arc::new(elector.start());
        let work = handle.run_as_leader(|term| async move {
            term.lost().await;
        });
        // Contend against a rival on the same store for a while, in large and small steps.
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_millis(rng.below(10_000))).await;
            let _ = handle.health();
            let _ = handle.is_leader();
        }
        let handle = Arc::try_unwrap(handle).expect("one handle");
        tokio::time::timeout(Duration::from_secs(400 * 24 * 3600), handle.shutdown())
            .await
            .unwrap_or_else(|_| panic!("case {case}: shutdown hung: {debug}"));
        let _ = work.await;
        assert_eq!(
            PANICS.load(Ordering::SeqCst),
            0,
            "case {case} (seed {seed}) panicked: {debug}"
        );
    }
    eprintln!("{built} option sets built and ran, {refused} refused");
    assert!(
        built > 20 && refused > 20,
        "both kinds covered: {built}/{refused}"
    );
}
