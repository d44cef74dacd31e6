//! Random numbers without a dependency: the suffix of default candidate ids and lock holds,
//! the names of the MySQL wake-ups' check, and the jitter that spreads follower retries.

use std::time::Duration;

/// A random number from the standard library's per-process hasher keys (no extra dependency;
/// good enough for ids and jitter, not for cryptography).
pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.finish()
}

/// `base`, randomly spread by up to `jitter` of itself either way: candidates that failed
/// together do not retry together.
pub(crate) fn jittered(base: Duration, jitter: f64) -> Duration {
    if jitter == 0.0 {
        return base;
    }
    // Uniform in [1 - jitter, 1 + jitter].
    let unit = (random_u64() >> 11) as f64 / (1u64 << 53) as f64;
    Duration::try_from_secs_f64(base.as_secs_f64() * (1.0 - jitter + 2.0 * jitter * unit))
        .unwrap_or(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_in_range() {
        let mut spread = std::collections::HashSet::new();
        for _ in 0..1000 {
            let d = jittered(Duration::from_secs(2), 0.1);
            assert!(
                d >= Duration::from_millis(1800) && d <= Duration::from_millis(2200),
                "{d:?}"
            );
            spread.insert(d);
        }
        // Jitter spreads the waits (candidates that failed together do not retry together),
        // over the whole range, both sides of the base.
        assert!(spread.len() > 900, "{} distinct waits", spread.len());
        let (low, high) = (spread.iter().min().unwrap(), spread.iter().max().unwrap());
        assert!(*low < Duration::from_millis(1850), "lowest {low:?}");
        assert!(*high > Duration::from_millis(2150), "highest {high:?}");
        assert_eq!(
            jittered(Duration::from_secs(2), 0.0),
            Duration::from_secs(2)
        );
    }
}
