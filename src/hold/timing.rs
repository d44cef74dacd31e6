//! The timing every hold shares (an elector's term, a lock's guard, a semaphore's permit, a
//! shard set's term): the options' bounds, their one check, and the local-deadline rule.

use std::time::Duration;

use tokio::time::Instant;

use crate::store::lease_millis;
use crate::{error::StoreError, lease::Lease};

/// Default lease duration (15 s).
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// Default renew interval (5 s).
pub const DEFAULT_RENEW_INTERVAL: Duration = Duration::from_secs(5);
/// Default follower retry interval (2 s).
pub const DEFAULT_RETRY_INTERVAL: Duration = Duration::from_secs(2);
/// Default grace period for leader work to return after its term ends (5 s).
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(5);
/// Default jitter on follower retries (±10 %).
pub const DEFAULT_JITTER: f64 = 0.1;
/// The longest renew interval, retry interval, grace period or health window accepted (366
/// days, the longest lease): anything longer is a bug, and bounded options keep every deadline
/// computed from them far from overflow.
pub const MAX_INTERVAL: Duration = crate::store::MAX_LEASE;
/// The smallest step-down margin accepted, whatever the lease: 1 ms.
pub const MIN_STEP_DOWN_MARGIN: Duration = Duration::from_millis(1);
/// The largest clock-rate difference the margin must absorb (0.1 %): a leader counts its
/// deadline on the host's monotonic clock, so if that clock runs slow against the database's
/// the deadline comes later, in database time, by up to this fraction of the lease. Hence
/// `step_down_margin` must be at least `lease_duration / 1000` (and [`MIN_STEP_DOWN_MARGIN`]).
pub const MAX_CLOCK_RATE_DIFFERENCE: f64 = 1e-3;

/// The smallest step-down margin accepted for `lease`: [`MIN_STEP_DOWN_MARGIN`], or the time
/// the database's clock can gain on the host's over one lease at [`MAX_CLOCK_RATE_DIFFERENCE`]
/// (the rule `margin >= rho * lease`, which the model check of the protocol derives and checks:
/// see `model/tests/model_election.rs`), whichever is larger.
pub fn min_step_down_margin(lease: Duration) -> Duration {
    lease
        .mul_f64(MAX_CLOCK_RATE_DIFFERENCE)
        .max(MIN_STEP_DOWN_MARGIN)
}

/// A bad elector option, reported by [`ElectorBuilder::build`](crate::ElectorBuilder::build).
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// No resource name was given.
    #[error("no resource name: call .resource(\"...\")")]
    MissingResource,
    /// The resource name or candidate id was refused, the lease duration is out of range, or
    /// the store cannot work with its connection (a backend this build does not support).
    #[error(transparent)]
    Invalid(#[from] StoreError),
    /// A duration option was zero.
    #[error(
        "{option} must not be zero: leave it unset for the default, or give a positive duration"
    )]
    Zero {
        /// The option.
        option: &'static str,
    },
    /// A duration option was longer than [`MAX_INTERVAL`].
    #[error("{option} {value:?} is too long: at most {max:?} would do")]
    TooLong {
        /// The option.
        option: &'static str,
        /// The value given.
        value: Duration,
        /// The largest value accepted.
        max: Duration,
    },
    /// The step-down margin is below what clock-rate differences need (see
    /// [`min_step_down_margin`]).
    #[error(
        "step_down_margin {margin:?} is too small for lease_duration {lease:?}: at least {minimum:?} \
         (the database's clock may run fast against the host's over one lease)"
    )]
    MarginTooSmall {
        /// The margin.
        margin: Duration,
        /// The lease duration.
        lease: Duration,
        /// The smallest margin accepted for this lease.
        minimum: Duration,
    },
    /// The renew interval leaves no room for a retry inside the lease.
    #[error(
        "{option} {renew:?} leaves no room for a retry: twice it must fit in lease_duration \
         {lease:?} minus the step-down margin {margin:?}; {option} {fits:?} or less would do \
         (or a longer lease_duration)",
        fits = renew_that_fits(*lease, *margin)
    )]
    RenewTooSlow {
        /// The option (`renew_interval`, or a shard set's `interval`).
        option: &'static str,
        /// The renew interval.
        renew: Duration,
        /// The lease duration.
        lease: Duration,
        /// The step-down margin.
        margin: Duration,
    },
    /// The step-down margin is half the lease or more.
    #[error(
        "step_down_margin {margin:?} must be less than half of lease_duration {lease:?}; the \
         default is a tenth of it ({default:?})",
        default = *lease / 10
    )]
    MarginTooLarge {
        /// The margin.
        margin: Duration,
        /// The lease duration.
        lease: Duration,
    },
    /// Jitter outside `0.0..=0.5`.
    #[error("jitter {0} must be between 0.0 and 0.5 (the default is 0.1)")]
    Jitter(f64),
    /// A rank ([`ElectorBuilder::rank`](crate::ElectorBuilder::rank)) this elector cannot
    /// have.
    #[error("rank: {reason}")]
    Rank {
        /// Why.
        reason: &'static str,
    },
}

/// Checks the options every lease holder shares (an elector, a shard set): none zero or too
/// long, the lease in the store's bounds, the step-down margin in its bounds (default a tenth
/// of the lease), and room for one retried renew. Returns the margin.
pub(crate) fn check_timing(
    lease: Duration,
    (renew_option, renew_interval): (&'static str, Duration),
    step_down_margin: Option<Duration>,
    grace_period: Duration,
) -> Result<Duration, ConfigError> {
    for (option, value) in [("lease_duration", lease), (renew_option, renew_interval)] {
        if value.is_zero() {
            return Err(ConfigError::Zero { option });
        }
    }
    for (option, value) in [
        (renew_option, renew_interval),
        ("grace_period", grace_period),
    ] {
        if value > MAX_INTERVAL {
            return Err(ConfigError::TooLong {
                option,
                value,
                max: MAX_INTERVAL,
            });
        }
    }
    lease_millis(lease)?;
    let step_down_margin = step_down_margin.unwrap_or(lease / 10);
    let minimum = min_step_down_margin(lease);
    if step_down_margin < minimum {
        return Err(ConfigError::MarginTooSmall {
            margin: step_down_margin,
            lease,
            minimum,
        });
    }
    if step_down_margin >= lease / 2 {
        return Err(ConfigError::MarginTooLarge {
            margin: step_down_margin,
            lease,
        });
    }
    if renew_interval.saturating_mul(2) > lease.saturating_sub(step_down_margin) {
        return Err(ConfigError::RenewTooSlow {
            option: renew_option,
            renew: renew_interval,
            lease,
            margin: step_down_margin,
        });
    }
    Ok(step_down_margin)
}

crate::error::debug_as_chain!(ConfigError);

/// The longest renew interval that [`check_timing`] accepts for `lease` and `margin`, to the
/// millisecond: what `RenewTooSlow` suggests.
pub(crate) fn renew_that_fits(lease: Duration, margin: Duration) -> Duration {
    let half = lease.saturating_sub(margin) / 2;
    Duration::from_millis(u64::try_from(half.as_millis()).unwrap_or(u64::MAX))
}

/// The timing of one kind of hold, checked (see [`TimingOptions::check`]): the lease asked for, how
/// often it is renewed, the step-down margin its local deadline keeps, and how long its work
/// may take to return once its term ended for a shutdown or a handover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timing {
    pub(crate) lease: Duration,
    pub(crate) renew_interval: Duration,
    pub(crate) step_down_margin: Duration,
    pub(crate) grace_period: Duration,
}

/// The timing options as a builder was given them (`None`: not set), one struct for the
/// elector's, the shard sets' and the locks' builders; [`check`](Self::check) fills in the
/// defaults of the kind of hold and checks them once.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TimingOptions {
    pub(crate) lease: Option<Duration>,
    pub(crate) renew_interval: Option<Duration>,
    pub(crate) step_down_margin: Option<Duration>,
    pub(crate) grace_period: Option<Duration>,
}

/// A kind of hold's timing defaults, and the name its builder gives the renew interval (in
/// errors).
pub(crate) struct TimingDefaults {
    pub(crate) lease: Duration,
    pub(crate) renew: (&'static str, Duration),
    pub(crate) grace_period: Duration,
}

/// A builder's setter of one of its [`TimingOptions`], with the builder's own docs:
/// `timing_setter!(/// docs
/// lease_duration(lease) => options.timing.lease);`.
macro_rules! timing_setter {
    ($(#[$doc:meta])* $name:ident($arg:ident) => $($field:ident).+) => {
        $(#[$doc])*
        pub fn $name(mut self, $arg: std::time::Duration) -> Self {
            self.$($field).+ = Some($arg);
            self
        }
    };
}
pub(crate) use timing_setter;

impl TimingOptions {
    /// The options with `defaults` for what was not set, checked (see [`check_timing`]; the
    /// margin defaults to a tenth of the lease).
    pub(crate) fn check(self, defaults: TimingDefaults) -> Result<Timing, ConfigError> {
        let (renew_option, renew_default) = defaults.renew;
        let lease = self.lease.unwrap_or(defaults.lease);
        let renew_interval = self.renew_interval.unwrap_or(renew_default);
        let grace_period = self.grace_period.unwrap_or(defaults.grace_period);
        let step_down_margin = check_timing(
            lease,
            (renew_option, renew_interval),
            self.step_down_margin,
            grace_period,
        )?;
        Ok(Timing {
            lease,
            renew_interval,
            step_down_margin,
            grace_period,
        })
    }
}

impl Timing {
    /// The local deadline of a lease granted or renewed by a statement sent at `sent` (see
    /// [`local_deadline`]).
    pub(crate) fn deadline(&self, lease: &Lease, sent: Instant) -> Instant {
        local_deadline(lease, sent, self.lease, self.step_down_margin)
    }

    /// The renewer's batch key: holds with the same lease and renew interval renew together.
    pub(crate) fn renew_key(&self) -> (Duration, Duration) {
        (self.lease, self.renew_interval)
    }
}

/// Checks an interval option: not zero, at most [`MAX_INTERVAL`].
pub(crate) fn check_interval(option: &'static str, value: Duration) -> Result<(), ConfigError> {
    if value.is_zero() {
        return Err(ConfigError::Zero { option });
    }
    if value > MAX_INTERVAL {
        return Err(ConfigError::TooLong {
            option,
            value,
            max: MAX_INTERVAL,
        });
    }
    Ok(())
}

/// The local deadline of a lease granted or renewed by a statement sent at `sent`: the time
/// the database granted (at most the `asked` lease), less the step-down margin. The store
/// measured from a moment after `sent`, so this is earlier than the store's expiry by at least
/// the margin. Every hold trusts its lease until then and no longer.
pub(crate) fn local_deadline(
    lease: &Lease,
    sent: Instant,
    asked: Duration,
    margin: Duration,
) -> Instant {
    let granted = lease.remaining.min(asked);
    later(sent, granted.saturating_sub(margin))
}

/// `t + d`, checked: the options are bounded (see [`MAX_INTERVAL`]), so this never saturates
/// in practice, but no option value can make a loop panic.
pub(crate) fn later(t: Instant, d: Duration) -> Instant {
    t.checked_add(d)
        .or_else(|| t.checked_add(MAX_INTERVAL))
        .unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fencing::FencingToken;

    fn lease(remaining_ms: u64) -> Lease {
        Lease::new(
            "a",
            "me",
            FencingToken::new(1),
            Duration::from_millis(remaining_ms),
        )
    }

    #[test]
    fn the_deadline_trusts_the_granted_time_less_the_margin() {
        let sent = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(
            local_deadline(&lease(800), sent, ms(1_000), ms(100)),
            sent + ms(700)
        );
        assert_eq!(
            local_deadline(&lease(5_000), sent, ms(1_000), ms(100)),
            sent + ms(900)
        );
        assert_eq!(local_deadline(&lease(50), sent, ms(1_000), ms(100)), sent);
    }
}
