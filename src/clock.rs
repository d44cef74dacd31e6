//! The local clock that terms' deadlines are judged by.
//!
//! A leader trusts its term until a deadline on its own clock (see `elector/decision.rs`).
//! tokio's [`Instant`] reads `CLOCK_MONOTONIC` on Linux, which stops while the host or VM is
//! suspended, while the database clock runs on: after a resume, a leader judged by it alone
//! would believe in a lease that lapsed during the suspend. So every instant the elector and
//! the shard sets judge by is tokio's instant plus the time the host has spent suspended since
//! the process started, measured as the growth of `CLOCK_BOOTTIME` (which counts suspend) over
//! `CLOCK_MONOTONIC` (which does not). Both are slewed by NTP alike, so the difference moves
//! only across a suspend. Timers are set in tokio's time by taking the suspended time back out
//! ([`sleep_until`], [`timeout_at`]); a suspend during a wait only makes the wait end late,
//! and the check after it then sees the deadline passed.
//!
//! Where the OS has no such clock (anything but Linux and Android) the suspended time is zero:
//! deadlines follow the monotonic clock alone, which may stop during a suspend there. Fenced
//! writes stay safe either way: they are judged by the database clock.
//!
//! Under tokio's paused test time the suspended time is zero too (it is measured on the real
//! clocks, which run together), so paused-time tests see exactly tokio's instants.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Suspends shorter than this are not counted: the two clocks are read one after the other,
/// and this keeps the reading's own jitter out of every instant.
const RESOLUTION_NANOS: u64 = 1_000_000;

/// The most suspended time seen so far, in nanoseconds (it never goes back).
static SUSPENDED: AtomicU64 = AtomicU64::new(0);

/// Now, for judging deadlines: tokio's instant plus the time spent suspended.
pub(crate) fn now() -> Instant {
    let now = Instant::now();
    now.checked_add(suspended()).unwrap_or(now)
}

/// The time the host has spent suspended since the process first asked.
pub(crate) fn suspended() -> Duration {
    let seen = os::suspended_nanos()
        .map(|n| n - n % RESOLUTION_NANOS)
        .unwrap_or(0);
    let max = SUSPENDED.fetch_max(seen, Ordering::Relaxed).max(seen);
    Duration::from_nanos(max).saturating_add(test::extra())
}

/// `instant` (judged by [`now`]) as a tokio instant, for a timer.
pub(crate) fn timer(instant: Instant) -> Instant {
    instant.checked_sub(suspended()).unwrap_or(instant)
}

/// Sleeps until [`now`] reaches `instant` (or later, if the host suspends meanwhile).
pub(crate) fn sleep_until(instant: Instant) -> tokio::time::Sleep {
    tokio::time::sleep_until(timer(instant))
}

/// `future`, given up when [`now`] reaches `instant`.
pub(crate) fn timeout_at<F: Future>(instant: Instant, future: F) -> tokio::time::Timeout<F> {
    tokio::time::timeout_at(timer(instant), future)
}

#[cfg(any(target_os = "linux", target_os = "android"))]
mod os {
    use std::sync::OnceLock;

    use rustix::time::{clock_gettime, ClockId, Timespec};

    fn nanos(t: Timespec) -> Option<u64> {
        let secs = u64::try_from(t.tv_sec).ok()?;
        let nanos = u64::try_from(t.tv_nsec).ok()?;
        secs.checked_mul(1_000_000_000)?.checked_add(nanos)
    }

    /// `CLOCK_BOOTTIME - CLOCK_MONOTONIC`, in nanoseconds (see [`super::gap_of`]).
    fn gap() -> Option<u64> {
        super::gap_of(|| {
            let before = nanos(clock_gettime(ClockId::Monotonic))?;
            let boot = nanos(clock_gettime(ClockId::Boottime))?;
            let after = nanos(clock_gettime(ClockId::Monotonic))?;
            Some((before, boot, after))
        })
    }

    /// The gap's growth since the first call.
    pub(super) fn suspended_nanos() -> Option<u64> {
        static START: OnceLock<Option<u64>> = OnceLock::new();
        let start = (*START.get_or_init(gap))?;
        gap()?.checked_sub(start)
    }
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
mod os {
    pub(super) fn suspended_nanos() -> Option<u64> {
        None
    }
}

/// The most the two monotonic readings around a boot-time reading may differ by for the gap
/// to be taken as is: a thread preempted between the readings (a busy host) would otherwise
/// see the preemption as a suspend, and the clock would run ahead for good (the most seen is
/// kept).
const TIGHT_NANOS: u64 = 20_000;
/// Readings tried for a tight one.
const TRIES: usize = 4;

/// The gap between the boot-time and the monotonic clock from readings `(monotonic,
/// boottime, monotonic)`, as its lower bound (boot time less the later monotonic reading, at
/// least zero): a preemption inside a reading makes it smaller, never larger, so a suspend is
/// counted a little late at worst and one that did not happen is never counted beyond the
/// start reading's own error (kept under a millisecond by the rounding in `suspended`). The
/// first tight reading's; with none, the largest of the tries' (each a lower bound, the
/// largest the nearest).
#[cfg_attr(not(any(target_os = "linux", target_os = "android")), allow(dead_code))]
fn gap_of(mut read: impl FnMut() -> Option<(u64, u64, u64)>) -> Option<u64> {
    let mut best: Option<u64> = None;
    for _ in 0..TRIES {
        let (before, boot, after) = read()?;
        let gap = boot.saturating_sub(after);
        if after.saturating_sub(before) <= TIGHT_NANOS {
            return Some(gap);
        }
        best = Some(best.map_or(gap, |b| b.max(gap)));
    }
    best
}

#[cfg(test)]
pub(crate) mod test {
    //! A suspend the test makes: it adds to the measured one, on this thread only (a
    //! current-thread runtime runs the elector on the test's thread).
    use std::cell::Cell;
    use std::time::Duration;

    thread_local! {
        static EXTRA: Cell<Duration> = const { Cell::new(Duration::ZERO) };
    }

    /// As if the host had been suspended for `d` just now.
    pub(crate) fn suspend(d: Duration) {
        EXTRA.with(|e| e.set(e.get().saturating_add(d)));
    }

    pub(super) fn extra() -> Duration {
        EXTRA.with(Cell::get)
    }
}

#[cfg(not(test))]
mod test {
    use std::time::Duration;

    pub(super) fn extra() -> Duration {
        Duration::ZERO
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A reading preempted between its clocks (2 ms here) is not a suspend: the tight reading
    // after it counts; with none tight, the lower bound of the last.
    #[test]
    fn a_preempted_reading_is_no_suspend() {
        let mut script = vec![
            (1_000_000, 3_000_500, 3_000_000), // preempted for 2 ms
            (4_000_000, 4_000_600, 4_000_010), // tight: gap 590 ns
        ]
        .into_iter();
        assert_eq!(gap_of(|| script.next()), Some(590));
        // None tight: the largest lower bound (800 ns here, the second reading's).
        let mut noisy = [
            (0, 2_000_500, 2_000_000),
            (3_000_000, 5_000_800, 5_000_000),
            (6_000_000, 8_000_100, 8_000_000),
            (9_000_000, 11_000_000, 11_000_000),
        ]
        .into_iter();
        assert_eq!(gap_of(|| noisy.next()), Some(800));
        // The boot clock read before the later monotonic reading: no negative gap.
        assert_eq!(gap_of(|| Some((10, 15, 20))), Some(0));
        assert_eq!(gap_of(|| None), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_suspend_moves_now_and_timers_alike() {
        let before = now();
        let timer_before = timer(before);
        test::suspend(Duration::from_secs(5));
        let after = now();
        assert!(after - before >= Duration::from_secs(5));
        // The same instant is five seconds nearer in tokio's time: a timer fires at once.
        assert!(timer(before) + Duration::from_secs(5) <= timer_before + Duration::from_millis(1));
        let start = Instant::now();
        sleep_until(before + Duration::from_secs(3)).await;
        assert_eq!(
            Instant::now(),
            start,
            "a deadline passed during the suspend is due now"
        );
    }

    /// A host suspend longer than the lease: the leader's term is not current the moment it
    /// resumes (before the loop runs again), `deadline()` has moved earlier by the suspend, and
    /// the elector ends the term within a renew interval. Seen failing with `now()` judging by
    /// tokio's instant alone.
    #[tokio::test(start_paused = true)]
    async fn a_leader_resumed_from_a_suspend_past_its_lease_no_longer_leads() {
        use crate::{elector::Elector, hold::Leadership};
        let lease = Duration::from_secs(3);
        let renew = Duration::from_secs(1);
        let handle = Elector::builder_in_memory()
            .resource("suspended")
            .lease_duration(lease)
            .renew_interval(renew)
            .build()
            .unwrap()
            .start();
        let mut rx = handle.watch();
        let leading = rx
            .wait_for(|s| matches!(s, Leadership::Leader(_)))
            .await
            .unwrap();
        let term = leading.term().cloned().unwrap();
        assert!(term.is_current());
        let before = term.deadline();
        test::suspend(lease * 2);
        assert!(!term.is_current(), "trusted past its lease after a resume");
        assert!(!handle.is_leader());
        assert!(term.deadline() + lease * 2 <= before + Duration::from_millis(1));
        tokio::time::timeout(renew + Duration::from_millis(100), term.lost())
            .await
            .expect("the elector ended the term within a renew interval of the resume");
        handle.abort().await;
    }

    #[test]
    fn the_suspended_time_never_goes_back() {
        let a = suspended();
        let b = suspended();
        assert!(b >= a);
    }
}
