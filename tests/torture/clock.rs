//! Monotonic time in nanoseconds, the one time line every candidate's history and the
//! harness's fault log share.

use nix::time::{clock_gettime, ClockId};

/// `CLOCK_MONOTONIC` in nanoseconds: comparable across processes on this host.
pub fn mono_ns() -> u64 {
    clock_gettime(ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

/// Maps a tokio instant (std `Instant`, i.e. `CLOCK_MONOTONIC` on Linux) to nanoseconds.
pub struct MonoClock {
    base_instant: std::time::Instant,
    base_ns: u64,
}

impl MonoClock {
    pub fn new() -> Self {
        Self {
            base_instant: std::time::Instant::now(),
            base_ns: mono_ns(),
        }
    }
    pub fn ns(&self, t: tokio::time::Instant) -> u64 {
        let t = t.into_std();
        if t >= self.base_instant {
            self.base_ns + (t - self.base_instant).as_nanos() as u64
        } else {
            self.base_ns - (self.base_instant - t).as_nanos() as u64
        }
    }
}
