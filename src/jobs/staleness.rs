//! "Nothing ran": each job's time since its last finished slot, as the leader knows it, against
//! the limit the job declares ([`Job::stale_after`](super::Job::stale_after)).
//!
//! The leader reads each job's newest `finished_at` once per term (with its first look, and
//! again after a failed one) and then counts the finishes of its own attempts; ages are judged
//! by the database clock, estimated between looks as the last reading plus the local time
//! since (a look comes at least every poll interval). A job with no finished slot at all
//! counts from the leader's first look at it in this term.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

use crate::mutex::lock;

/// A job whose last finished slot is older than its [`stale_after`](super::Job::stale_after)
/// limit, in [`JobsHealth::stale`](super::JobsHealth::stale).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct StaleJob {
    /// The job.
    pub job: String,
    /// When its newest finished slot was marked finished (database clock); `None` if none
    /// ever was.
    pub last_finished: Option<DateTime<Utc>>,
    /// How long ago that was (or, with none, how long the leader has looked at the job in its
    /// term).
    #[cfg_attr(
        feature = "serde",
        serde(rename = "age_ms", serialize_with = "crate::lease::millis")
    )]
    pub age: Duration,
    /// The job's limit.
    #[cfg_attr(
        feature = "serde",
        serde(rename = "limit_ms", serialize_with = "crate::lease::millis")
    )]
    pub limit: Duration,
}

impl std::fmt::Display for StaleJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (age, limit) = (self.age.as_secs_f64(), self.limit.as_secs_f64());
        match self.last_finished {
            Some(at) => write!(
                f,
                "{}: last slot finished {age:.1} s ago ({at}), over its limit of {limit:.1} s",
                self.job
            ),
            None => write!(
                f,
                "{}: no slot finished in {age:.1} s, over its limit of {limit:.1} s",
                self.job
            ),
        }
    }
}

/// What the leader knows, per job (indexed as the scheduler's jobs).
#[derive(Default)]
struct Known {
    /// Set while this node's scheduler leads and has read the finishes.
    leading: bool,
    /// The last reading of the database clock (ms since the epoch) and when it was taken.
    clock: Option<(i64, Instant)>,
    /// Each job's newest finish (database ms), if any.
    finished: Vec<Option<i64>>,
    /// Each job's first look in this term (database ms): a job never finished counts from it.
    seen: Vec<Option<i64>>,
}

impl Known {
    fn now_ms(&self) -> Option<i64> {
        self.clock.map(|(ms, at)| {
            ms.saturating_add(i64::try_from(at.elapsed().as_millis()).unwrap_or(i64::MAX))
        })
    }
}

/// The scheduler's freshness record, shared by the leader's loop, its attempts and `health`.
pub(crate) struct Freshness {
    names: Vec<Arc<str>>,
    limits: Vec<Option<Duration>>,
    known: Mutex<Known>,
}

impl Freshness {
    /// Each job's name and limit, in the scheduler's order.
    pub(crate) fn new(jobs: Vec<(Arc<str>, Option<Duration>)>) -> Self {
        let (names, limits) = jobs.into_iter().unzip();
        Self {
            names,
            limits,
            known: Mutex::new(Known::default()),
        }
    }

    /// Whether any job declares a limit.
    pub(crate) fn watches(&self) -> bool {
        self.limits.iter().any(Option::is_some)
    }

    /// A term begins (or looks again after a failed look): each job's newest finish as the
    /// run table says.
    pub(crate) fn read(&self, finished: Vec<Option<i64>>) {
        let mut k = lock(&self.known);
        let jobs = self.limits.len();
        // Read again in a term (after a failed look): a finish counted since the read's
        // snapshot stays.
        let mut merged = finished;
        merged.resize(jobs, None);
        for (new, old) in merged.iter_mut().zip(&k.finished) {
            *new = match (*new, *old) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
        }
        k.finished = merged;
        if k.seen.len() != jobs {
            k.seen = vec![None; jobs];
        }
        k.leading = true;
    }

    /// A look read the database clock `now_ms` at `at`.
    pub(crate) fn look(&self, now_ms: i64, at: Instant) {
        let mut k = lock(&self.known);
        k.clock = Some((now_ms, at));
        for seen in &mut k.seen {
            seen.get_or_insert(now_ms);
        }
    }

    /// Sets each job's age metric from the estimated database clock: after every look, good
    /// or failed, so the age keeps growing while the looks fail.
    pub(crate) fn publish(&self) {
        let k = lock(&self.known);
        let ages: Vec<Option<Duration>> = (0..self.limits.len()).map(|i| age(&k, i)).collect();
        drop(k);
        for (name, age) in self.names.iter().zip(ages) {
            if let Some(age) = age {
                super::metrics_hook::age(name, age);
            }
        }
    }

    /// Job `i`'s attempt finished its slot now.
    pub(crate) fn finished(&self, i: usize) {
        let mut k = lock(&self.known);
        if let Some(now) = k.now_ms() {
            if let Some(slot) = k.finished.get_mut(i) {
                *slot = Some(slot.map_or(now, |t| t.max(now)));
            }
        }
    }

    /// The term ended: this node knows nothing any more, and its age metrics go to zero (the
    /// leader's are the ones that count: alert on their maximum).
    pub(crate) fn forget(&self) {
        let was = std::mem::take(&mut *lock(&self.known));
        if was.leading {
            for name in &self.names {
                super::metrics_hook::age(name, Duration::ZERO);
            }
        }
    }

    /// The jobs over their limit, while this node leads.
    pub(crate) fn stale(&self) -> Vec<StaleJob> {
        let k = lock(&self.known);
        if !k.leading {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (i, limit) in self.limits.iter().enumerate() {
            let (Some(limit), Some(age)) = (limit, age(&k, i)) else {
                continue;
            };
            if age > *limit {
                out.push(StaleJob {
                    job: self.names.get(i).map(|n| n.to_string()).unwrap_or_default(),
                    last_finished: k
                        .finished
                        .get(i)
                        .copied()
                        .flatten()
                        .and_then(DateTime::from_timestamp_millis),
                    age,
                    limit: *limit,
                });
            }
        }
        out
    }
}

/// Job `i`'s time since its newest finish (or since its first look), by the estimated
/// database clock; `None` before the first look.
fn age(k: &Known, i: usize) -> Option<Duration> {
    let now = k.now_ms()?;
    let since = k
        .finished
        .get(i)
        .copied()
        .flatten()
        .or_else(|| k.seen.get(i).copied().flatten())?;
    Some(Duration::from_millis(
        u64::try_from(now.saturating_sub(since)).unwrap_or(0),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn ages_follow_the_database_clock_and_the_finishes() {
        let limits = [
            Some(Duration::from_secs(10)),
            None,
            Some(Duration::from_secs(5)),
        ];
        let f = Freshness::new(
            limits
                .iter()
                .enumerate()
                .map(|(i, l)| (Arc::from(format!("j{i}")), *l))
                .collect(),
        );
        // Nothing known before a term reads the finishes.
        assert!(f.stale().is_empty());
        f.read(vec![Some(1_000_000), Some(0)]);
        f.look(1_004_000, Instant::now());
        assert!(f.stale().is_empty(), "4 s since j0's finish, j2 just seen");
        tokio::time::advance(Duration::from_secs(7)).await;
        let stale = f.stale();
        assert_eq!(stale.len(), 2, "{stale:?}");
        assert_eq!(stale[0].job, "j0");
        assert_eq!(stale[0].age, Duration::from_secs(11));
        assert_eq!(
            stale[0].last_finished,
            DateTime::from_timestamp_millis(1_000_000)
        );
        assert_eq!(
            (stale[1].job.as_str(), stale[1].last_finished),
            ("j2", None)
        );
        assert_eq!(stale[1].age, Duration::from_secs(7));
        // j0 finishes: fresh again; j1 has no limit, never reported.
        f.finished(0);
        let stale = f.stale();
        assert_eq!(stale.len(), 1);
        assert_eq!(stale[0].job, "j2");
        f.forget();
        assert!(f.stale().is_empty(), "a follower knows nothing");
    }
}
