//! A rate limit shared by every process of a service: at most so many permits per interval per
//! key, decided by the database.
//!
//! Each key's state is one row of the rate-limit table (the `CreateRateLimitTable` migration):
//! its *theoretical arrival time* (TAT), as the generic cell rate algorithm (GCRA) keeps it.
//! A call is one atomic conditional upsert on that row, judged by the **database clock**: the
//! permit is granted when the stored TAT is at most `now + tolerance`, and the TAT then moves
//! to `max(TAT, now) + emission interval`; otherwise nothing changes and the caller is told
//! how long until the next permit. There is no background loop: keys are created by their
//! first call and cost nothing while unused.
//!
//! # The guarantee
//!
//! A [`Quota`] of `n` permits per `interval` with a burst of `b` (1 unless set) spaces
//! permits `T = interval / n` apart (rounded up to the microsecond) and lets up to `b` go at
//! once. Over the database instants at which permits were granted (each decision's statement
//! start), **any half-open span `[t, t + interval)` holds at most `n + b - 1` permits** (with
//! the default burst of 1: at most `n`), and any such span of length `W` at most
//! `b + ceil(W / T) - 1`. Every caller of a key must use the same quota: the row keeps the time,
//! not the quota.
//!
//! - A permit is reported only from a statement that committed (read to its end; on MySQL 8,
//!   which has no `RETURNING`, the upsert and the read of its row are one transaction of the
//!   store's own), and only to the caller whose decision it is (each writes a random number of
//!   its own into the row).
//! - A call whose answer was lost (a connection cut after the commit) may have used a permit
//!   that nobody got: the limit errs towards fewer permits, never more.
//! - Clocks: the database's alone. On a Galera cluster whose nodes' clocks are apart by δ, a
//!   span may hold up to `ceil(δ / T)` more permits; send a key's calls to one node, or keep
//!   the nodes on NTP.
//!
//! ```
//! use std::time::Duration;
//! use orion_beacon::rate_limit::{Quota, RateLimiter, RateOutcome};
//! use orion_beacon::InMemoryLeaseStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // 100 calls a minute to the partner's API, across the cluster, 5 at once at most.
//! let quota = Quota::per(Duration::from_secs(60), 100)?.with_burst(5)?;
//! let limiter = RateLimiter::new(InMemoryLeaseStore::new(), quota);
//! match limiter.try_acquire("partner-api").await? {
//!     RateOutcome::Granted(permit) => println!("permit #{} ({} more now)", permit.number, permit.available),
//!     RateOutcome::Limited(limited) => println!("next permit in {:?}", limited.retry_after),
//!     _ => {}
//! }
//! // Or wait for one, at most 2 s.
//! let permit = limiter.acquire("partner-api", Duration::from_secs(2)).await?;
//! # let _ = permit;
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::error::{ErrorKind, StoreError};
use crate::store::{validate_resource, MAX_LEASE, MIN_LEASE};

/// How long [`RateLimiter::acquire`] waits after a retryable error before it asks again, at
/// first and at most.
const RETRY_PAUSE: Duration = Duration::from_millis(10);
const MAX_RETRY_PAUSE: Duration = Duration::from_millis(200);

/// The most permits per interval, and the largest burst, a [`Quota`] accepts.
pub const MAX_PERMITS: u32 = 1_000_000;

/// How many permits a key gives, how often: `permits` per `interval`, up to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    permits: u32,
    interval: Duration,
    burst: u32,
    /// `interval / permits`, rounded up, in µs (at least 1).
    emission_us: i64,
    /// `(burst - 1) * emission_us`.
    tolerance_us: i64,
}

fn invalid(reason: String) -> StoreError {
    StoreError::InvalidSetting {
        setting: "quota",
        reason,
    }
}

impl Quota {
    /// `permits` per `interval` (1 to [`MAX_PERMITS`] permits; an interval of 1 ms to 366 days),
    /// spaced evenly, one at a time (a burst of 1): any span of `interval` holds at most
    /// `permits` of them.
    pub fn per(interval: Duration, permits: u32) -> Result<Self, StoreError> {
        if !(1..=MAX_PERMITS).contains(&permits) {
            return Err(invalid(format!(
                "{permits} permits: a quota has 1 to {MAX_PERMITS}"
            )));
        }
        if interval < MIN_LEASE || interval > MAX_LEASE {
            return Err(invalid(format!(
                "an interval of {interval:?}: from {MIN_LEASE:?} to {MAX_LEASE:?}"
            )));
        }
        // Rounded up from nanoseconds, so the spacing is never shorter than interval / permits.
        let interval_ns = interval.as_nanos();
        let emission_ns = interval_ns.div_ceil(u128::from(permits));
        let emission_us = i64::try_from(emission_ns.div_ceil(1_000))
            .map_err(|_| invalid(format!("an interval of {interval:?} is too long")))?;
        Self {
            permits,
            interval,
            burst: 1,
            emission_us: emission_us.max(1),
            tolerance_us: 0,
        }
        .with_burst(1)
    }

    /// The same rate, with up to `burst` permits at once (1 to [`MAX_PERMITS`]; the burst's
    /// span, `(burst - 1) × interval / permits`, at most 366 days). Any span of `interval` then
    /// holds at most `permits + burst - 1` permits.
    pub fn with_burst(mut self, burst: u32) -> Result<Self, StoreError> {
        if !(1..=MAX_PERMITS).contains(&burst) {
            return Err(invalid(format!(
                "a burst of {burst}: a quota has 1 to {MAX_PERMITS}"
            )));
        }
        let max_us = i64::try_from(MAX_LEASE.as_micros()).unwrap_or(i64::MAX);
        let tolerance_us = self
            .emission_us
            .checked_mul(i64::from(burst) - 1)
            .filter(|t| *t <= max_us)
            .ok_or_else(|| {
                invalid(format!(
                    "a burst of {burst} at one permit per {:?} spans more than {MAX_LEASE:?}",
                    self.emission_interval()
                ))
            })?;
        self.burst = burst;
        self.tolerance_us = tolerance_us;
        Ok(self)
    }

    /// The permits per interval.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The interval.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The most permits at once.
    pub fn burst(&self) -> u32 {
        self.burst
    }

    /// The spacing of permits: `interval / permits`, rounded up to the microsecond.
    pub fn emission_interval(&self) -> Duration {
        Duration::from_micros(self.emission_us.unsigned_abs())
    }

    /// The most permits any span of [`interval`](Self::interval) holds: `permits + burst - 1`.
    pub fn most_per_interval(&self) -> u64 {
        u64::from(self.permits) + u64::from(self.burst) - 1
    }

    /// The spacing in whole µs, as a store's statement binds it: a permit moves the key's
    /// theoretical arrival time on by this much.
    pub fn emission_us(&self) -> i64 {
        self.emission_us
    }

    /// The burst's span in whole µs, as a store's statement binds it: a permit is due while the
    /// key's theoretical arrival time is at most this far ahead of now.
    pub fn tolerance_us(&self) -> i64 {
        self.tolerance_us
    }
}

/// A permit: the key's `number`th, granted at `granted_at` by the database clock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Permit {
    /// The key.
    pub key: String,
    /// How many permits the key has granted, this one included (it counts from 1 when the
    /// key's row is created, and never goes back while the row stays).
    pub number: u64,
    /// When the permit was granted (the database clock; the in-memory store's clock there).
    pub granted_at: DateTime<Utc>,
    /// How many more permits the key would grant at that same instant (what is left of the
    /// burst).
    pub available: u32,
}

/// No permit now: the next one is due in `retry_after`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limited {
    /// The key.
    pub key: String,
    /// How long until the key grants its next permit, if nobody else takes it first.
    pub retry_after: Duration,
    /// How many permits the key has granted so far.
    pub granted: u64,
}

/// What one call of [`RateLimitStore::take_permit`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RateOutcome {
    /// A permit.
    Granted(Permit),
    /// None now.
    Limited(Limited),
}

impl RateOutcome {
    /// The outcome a store reports for the row its decision left (for implementations of
    /// [`RateLimitStore`]): whether it `granted`, the key's `permits` so far, the theoretical
    /// arrival time's lead on the decision's now (µs) and that now (µs since the Unix epoch).
    /// A row out of range is [`StoreError::Decode`].
    pub fn decided(
        key: &str,
        quota: &Quota,
        granted: bool,
        permits: i64,
        ahead_us: i64,
        now_us: i64,
    ) -> Result<Self, StoreError> {
        outcome(key, quota, granted, permits, ahead_us, now_us)
    }

    /// The permit, if one was granted.
    pub fn permit(&self) -> Option<&Permit> {
        match self {
            RateOutcome::Granted(p) => Some(p),
            RateOutcome::Limited(_) => None,
        }
    }
}

/// A place where rate-limit keys live: the in-memory store for one process,
/// [`SeaOrmLeaseStore`](crate::SeaOrmLeaseStore) for a cluster (its rate-limit table).
#[async_trait]
pub trait RateLimitStore: Send + Sync {
    /// One decision for `key` under `quota`, atomic and judged by the store's clock: a permit,
    /// or how long until the next. The key is checked as resource names are (see
    /// [`validate_resource`]) before any SQL runs.
    async fn take_permit(&self, key: &str, quota: &Quota) -> Result<RateOutcome, StoreError>;
}

/// A random number for one decision (for implementations of [`RateLimitStore`]): written into
/// the key's row with the decision, so that the row a store reads back is known to be this
/// caller's decision and not another's (a transaction rolled back under its statements, as a
/// Galera node can, leaves the read to find the row as someone else left it).
pub fn decision_id() -> i64 {
    i64::from_ne_bytes(crate::random::random_u64().to_ne_bytes())
}

/// What the GCRA decides for a key whose stored TAT is `tat` (`None`: no row yet) at `now`
/// (µs on the store's clock), as the statements decide it: whether a permit is granted, and
/// the TAT to store.
pub(crate) fn decide(tat: Option<i64>, now: i64, quota: &Quota) -> (bool, i64) {
    match tat {
        None => (true, now.saturating_add(quota.emission_us)),
        Some(tat) if tat <= now.saturating_add(quota.tolerance_us) => {
            (true, tat.max(now).saturating_add(quota.emission_us))
        }
        Some(tat) => (false, tat),
    }
}

/// The outcome of a decision: `granted` or not, the key's permits so far, the stored TAT's
/// lead on `now` (µs), and `now`.
pub(crate) fn outcome(
    key: &str,
    quota: &Quota,
    granted: bool,
    permits: i64,
    ahead_us: i64,
    now_us: i64,
) -> Result<RateOutcome, StoreError> {
    let number = u64::try_from(permits).map_err(|_| decode(format!("{permits} permits")))?;
    if granted {
        let granted_at = DateTime::<Utc>::from_timestamp_micros(now_us)
            .ok_or_else(|| decode(format!("a grant at {now_us} µs")))?;
        // More permits at this instant while the lead stays within the tolerance.
        let available = if ahead_us <= quota.tolerance_us {
            quota.tolerance_us.saturating_sub(ahead_us) / quota.emission_us + 1
        } else {
            0
        };
        Ok(RateOutcome::Granted(Permit {
            key: key.to_owned(),
            number,
            granted_at,
            available: u32::try_from(available).unwrap_or(u32::MAX),
        }))
    } else {
        let wait = ahead_us.saturating_sub(quota.tolerance_us).max(0);
        Ok(RateOutcome::Limited(Limited {
            key: key.to_owned(),
            retry_after: Duration::from_micros(wait.unsigned_abs()),
            granted: number,
        }))
    }
}

fn decode(what: String) -> StoreError {
    StoreError::Decode {
        table: "rate limits".to_owned(),
        source: sea_orm::DbErr::Custom(format!("a rate-limit row out of range: {what}")),
    }
}

/// Checks a key (the resource-name rules).
pub(crate) fn validate_key(key: &str) -> Result<(), StoreError> {
    validate_resource(key)
}

/// Why [`RateLimiter::acquire`] has no permit.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RateLimitError {
    /// The next permit is due later than the call's timeout allows.
    #[error("no permit of {key:?} within {waited:?}: the next is due in {retry_after:?}")]
    TimedOut {
        /// The key.
        key: String,
        /// How long the call waited.
        waited: Duration,
        /// How long until the next permit, as the last decision said.
        retry_after: Duration,
    },
    /// A timeout longer than 366 days.
    #[error("a rate-limit timeout of {timeout:?} is too long: at most {max:?}")]
    TimeoutTooLong {
        /// The timeout given.
        timeout: Duration,
        /// The longest accepted.
        max: Duration,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl RateLimitError {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            RateLimitError::TimedOut { .. } => ErrorKind::TimedOut,
            RateLimitError::TimeoutTooLong { .. } => ErrorKind::InvalidInput,
            RateLimitError::Store(e) => e.kind(),
        }
    }
}

/// A [`Quota`] applied to keys of a [`RateLimitStore`]. Cheap to clone; clones share the store.
#[derive(Clone)]
pub struct RateLimiter {
    store: Arc<dyn RateLimitStore>,
    quota: Quota,
}

impl std::fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("quota", &self.quota)
            .finish_non_exhaustive()
    }
}

impl RateLimiter {
    /// A limiter giving `quota` per key of `store`.
    pub fn new(store: impl RateLimitStore + 'static, quota: Quota) -> Self {
        Self {
            store: Arc::new(store),
            quota,
        }
    }

    /// The quota.
    pub fn quota(&self) -> Quota {
        self.quota
    }

    /// One decision: a permit now, or how long until the next. One statement.
    pub async fn try_acquire(&self, key: &str) -> Result<RateOutcome, StoreError> {
        self.store.take_permit(key, &self.quota).await
    }

    /// A permit, waiting for it up to `timeout` (sleeping until each next permit is due, then
    /// asking again: others may take it first). When the next permit is due later than the
    /// timeout allows, it returns at once with [`RateLimitError::TimedOut`], which says when.
    /// A retryable store error (a conflict, a lock wait or a connection that failed: no
    /// decision known, no permit) is asked again, after 10 ms and then twice as long each time
    /// up to 200 ms, while the timeout allows; the last one is returned when it does not.
    /// Other store errors are returned as they come.
    pub async fn acquire(&self, key: &str, timeout: Duration) -> Result<Permit, RateLimitError> {
        if timeout > MAX_LEASE {
            return Err(RateLimitError::TimeoutTooLong {
                timeout,
                max: MAX_LEASE,
            });
        }
        let started = crate::clock::now();
        let deadline = started + timeout;
        let mut pause = RETRY_PAUSE;
        loop {
            let answer = match self.try_acquire(key).await {
                Err(e) if e.is_retryable() => {
                    let again = crate::clock::now() + pause;
                    if again > deadline {
                        return Err(e.into());
                    }
                    crate::clock::sleep_until(again).await;
                    pause = (pause * 2).min(MAX_RETRY_PAUSE);
                    continue;
                }
                answer => answer?,
            };
            match answer {
                RateOutcome::Granted(permit) => return Ok(permit),
                RateOutcome::Limited(limited) => {
                    let now = crate::clock::now();
                    // At least a millisecond: SQLite's clock moves in whole ones.
                    let wait = limited.retry_after.max(Duration::from_millis(1));
                    let due = now.checked_add(wait).filter(|d| *d <= deadline);
                    let Some(due) = due else {
                        return Err(RateLimitError::TimedOut {
                            key: key.to_owned(),
                            waited: now.saturating_duration_since(started),
                            retry_after: limited.retry_after,
                        });
                    };
                    crate::clock::sleep_until(due).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(interval_ms: u64, permits: u32, burst: u32) -> Quota {
        Quota::per(Duration::from_millis(interval_ms), permits)
            .and_then(|q| q.with_burst(burst))
            .unwrap()
    }

    /// Decisions at `arrivals` (µs, in order): the instants of the grants.
    fn run(q: &Quota, arrivals: &[i64]) -> Vec<i64> {
        let mut tat = None;
        let mut grants = Vec::new();
        for &now in arrivals {
            let (granted, next) = decide(tat, now, q);
            tat = Some(next);
            if granted {
                grants.push(now);
            }
        }
        grants
    }

    /// The most grants in any half-open span of `w` µs.
    fn most_in_span(grants: &[i64], w: i64) -> usize {
        let mut most = 0;
        let mut j = 0;
        for i in 0..grants.len() {
            while j < grants.len() && grants[j] < grants[i] + w {
                j += 1;
            }
            most = most.max(j - i);
        }
        most
    }

    #[test]
    fn any_span_of_the_interval_holds_at_most_permits_plus_burst_minus_one() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for (interval_ms, permits, burst) in [(1000, 10, 1), (1000, 10, 10), (60, 7, 3), (5, 3, 1)]
        {
            let q = quota(interval_ms, permits, burst);
            let mut now = 0i64;
            let arrivals: Vec<i64> = (0..20_000)
                .map(|_| {
                    now += (next() % 400) as i64;
                    now
                })
                .collect();
            let grants = run(&q, &arrivals);
            let w = i64::try_from(q.interval().as_micros()).unwrap();
            assert!(grants.len() > 10, "{q:?}: {} grants", grants.len());
            let most = most_in_span(&grants, w);
            assert!(
                most as u64 <= q.most_per_interval(),
                "{q:?}: {most} grants in one interval"
            );
            // And the bound is reached: the limit is not stricter than it says.
            assert!(most as u64 + 1 >= q.most_per_interval(), "{q:?}: {most}");
        }
    }

    #[test]
    fn a_burst_goes_at_once_then_permits_are_spaced() {
        let q = quota(1000, 10, 3);
        let at_once = run(&q, &[0, 0, 0, 0, 0]);
        assert_eq!(at_once.len(), 3);
        // The next is due one spacing after the first (100 ms).
        let (granted, _) = decide(Some(300_000), 99_999, &q);
        assert!(!granted);
        let (granted, tat) = decide(Some(300_000), 100_000, &q);
        assert!(granted);
        assert_eq!(tat, 400_000);
    }

    #[test]
    fn outcomes_say_what_is_left_and_when_the_next_is_due() {
        let q = quota(1000, 10, 3);
        // Granted with the TAT 100 ms ahead: two more now.
        let o = outcome("k", &q, true, 1, 100_000, 0).unwrap();
        assert_eq!(o.permit().map(|p| p.available), Some(2));
        let o = outcome("k", &q, true, 3, 300_000, 0).unwrap();
        assert_eq!(o.permit().map(|p| p.available), Some(0));
        // Refused with the TAT 300 ms ahead and a tolerance of 200 ms: due in 100 ms.
        match outcome("k", &q, false, 3, 300_000, 0).unwrap() {
            RateOutcome::Limited(l) => {
                assert_eq!(l.retry_after, Duration::from_millis(100));
                assert_eq!(l.granted, 3);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn quotas_are_bounded() {
        assert!(Quota::per(Duration::from_secs(1), 0).is_err());
        assert!(Quota::per(Duration::from_secs(1), MAX_PERMITS + 1).is_err());
        assert!(Quota::per(Duration::ZERO, 1).is_err());
        assert!(Quota::per(MAX_LEASE + Duration::from_secs(1), 1).is_err());
        let q = Quota::per(Duration::from_secs(1), 3).unwrap();
        assert_eq!(q.emission_interval(), Duration::from_micros(333_334));
        // Rounded up from the interval's nanoseconds, not from whole microseconds.
        let q = Quota::per(Duration::from_nanos(333_333_333), 1).unwrap();
        assert_eq!(q.emission_interval(), Duration::from_micros(333_334));
        assert!(q.with_burst(0).is_err());
        // A burst whose span is over 366 days.
        let slow = Quota::per(MAX_LEASE, 1).unwrap();
        assert!(slow.with_burst(2).is_ok());
        assert!(slow.with_burst(3).is_err());
        let e = Quota::per(Duration::from_secs(1), 0).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
    }
}
