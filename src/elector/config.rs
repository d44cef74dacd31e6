//! Elector options, their defaults and their validation.

use std::sync::Arc;
use std::time::Duration;

use crate::random::random_u64;
use crate::store::{lease_millis, validate_candidate, validate_resource};
use crate::StoreError;

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
    /// A shard set without a name: call `.name("...")`.
    #[error("no shard set name: call .name(\"...\")")]
    MissingShardSet,
    /// A shard set without resources.
    #[error("the shard set has no resources: give at least one with .resources(...)")]
    EmptyResourceSet,
    /// A resource given twice to one shard set.
    #[error("resource {name:?} appears more than once in the shard set")]
    DuplicateResource {
        /// The resource.
        name: String,
    },
    /// More slack than the shard set has resources.
    #[error(
        "slack {slack} is more than the shard set's {resources} resources: {resources} or less \
         would do (the default is 1; 0 balances exactly)"
    )]
    SlackTooLarge {
        /// The slack asked for.
        slack: usize,
        /// How many resources the set has.
        resources: usize,
    },
    /// Two preferred members for one resource.
    #[error("more than one preferred member is given for {name:?}")]
    DuplicatePreference {
        /// The resource.
        name: String,
    },
    /// A preference for a resource that is not in the shard set.
    #[error("a preferred member is given for {name:?}, which is not in the shard set")]
    UnknownResource {
        /// The resource.
        name: String,
    },
}

/// Validated elector settings.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub resource: Arc<str>,
    pub candidate: Arc<str>,
    pub lease: Duration,
    pub renew_interval: Duration,
    pub retry_interval: Duration,
    pub step_down_margin: Duration,
    pub grace_period: Duration,
    pub jitter: f64,
    pub release_on_shutdown: bool,
    /// Written into the lease by every acquire and renew.
    pub payload: Option<Arc<str>>,
    /// Renews go out with other leaders' of the process (see `together`).
    pub renew_together: bool,
}

/// Options as given, before validation.
#[derive(Debug, Clone, Default)]
pub(crate) struct Options {
    pub resource: Option<String>,
    pub candidate: Option<String>,
    pub lease: Option<Duration>,
    pub renew_interval: Option<Duration>,
    pub retry_interval: Option<Duration>,
    pub step_down_margin: Option<Duration>,
    pub grace_period: Option<Duration>,
    pub jitter: Option<f64>,
    pub release_on_shutdown: Option<bool>,
    pub payload: Option<String>,
    pub renew_together: Option<bool>,
}

impl Options {
    pub(crate) fn validate(self) -> Result<Config, ConfigError> {
        let resource = self.resource.ok_or(ConfigError::MissingResource)?;
        validate_resource(&resource)?;
        let candidate = self.candidate.unwrap_or_else(default_candidate_id);
        validate_candidate(&candidate)?;
        if let Some(payload) = &self.payload {
            crate::store::validate_payload(payload)?;
        }
        let lease = self.lease.unwrap_or(DEFAULT_LEASE_DURATION);
        let renew_interval = self.renew_interval.unwrap_or(DEFAULT_RENEW_INTERVAL);
        let retry_interval = self.retry_interval.unwrap_or(DEFAULT_RETRY_INTERVAL);
        let grace_period = self.grace_period.unwrap_or(DEFAULT_GRACE_PERIOD);
        if retry_interval.is_zero() {
            return Err(ConfigError::Zero {
                option: "retry_interval",
            });
        }
        if retry_interval > MAX_INTERVAL {
            return Err(ConfigError::TooLong {
                option: "retry_interval",
                value: retry_interval,
                max: MAX_INTERVAL,
            });
        }
        let step_down_margin = check_timing(
            lease,
            ("renew_interval", renew_interval),
            self.step_down_margin,
            grace_period,
        )?;
        let jitter = self.jitter.unwrap_or(DEFAULT_JITTER);
        if !(0.0..=0.5).contains(&jitter) {
            return Err(ConfigError::Jitter(jitter));
        }
        Ok(Config {
            resource: Arc::from(resource),
            candidate: Arc::from(candidate),
            lease,
            renew_interval,
            retry_interval,
            step_down_margin,
            grace_period,
            jitter,
            release_on_shutdown: self.release_on_shutdown.unwrap_or(true),
            payload: self.payload.map(Arc::from),
            renew_together: self.renew_together.unwrap_or(false),
        })
    }
}

/// The host name as the system reports it (`HOSTNAME`, else the kernel's), or `host`.
/// Checks the options every lease holder shares (an elector, a shard set): none zero or too
/// long, the lease in the store's bounds, the step-down margin in its bounds (default a tenth
/// of the lease), and room for one retried renew. Returns the margin.
pub(crate) fn check_timing(
    lease: Duration,
    (renew_option, renew_interval): (&'static str, Duration),
    step_down_margin: Option<Duration>,
    grace_period: Duration,
) -> Result<Duration, ConfigError> {
    for (option, value) in [
        ("lease_duration", lease),
        ("renew_interval", renew_interval),
    ] {
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

impl std::fmt::Debug for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        crate::error::debug_chain(f, "ConfigError", self)
    }
}

/// The longest renew interval that [`check_timing`] accepts for `lease` and `margin`, to the
/// millisecond: what `RenewTooSlow` suggests.
fn renew_that_fits(lease: Duration, margin: Duration) -> Duration {
    let half = lease.saturating_sub(margin) / 2;
    Duration::from_millis(u64::try_from(half.as_millis()).unwrap_or(u64::MAX))
}

fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".to_owned())
}

/// Host name + process id + a random suffix: unique per elector, readable in `leases` output.
pub(crate) fn default_candidate_id() -> String {
    let host: String = host_name()
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect();
    format!(
        "{}-{}-{:08x}",
        host.trim(),
        std::process::id(),
        random_u64() as u32
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> Options {
        Options {
            resource: Some("r".into()),
            ..Options::default()
        }
    }

    #[test]
    fn defaults() {
        let c = opts().validate().unwrap();
        assert_eq!(c.lease, Duration::from_secs(15));
        assert_eq!(c.renew_interval, Duration::from_secs(5));
        assert_eq!(c.retry_interval, Duration::from_secs(2));
        assert_eq!(c.step_down_margin, Duration::from_millis(1500));
        assert!(c.release_on_shutdown);
        assert!(c.candidate.contains(&std::process::id().to_string()));
        assert_ne!(default_candidate_id(), default_candidate_id());
    }

    /// Every bound is inclusive: the value right at it is accepted.
    #[test]
    fn bounds_are_inclusive() {
        let at = |f: fn(&mut Options)| {
            let mut o = opts();
            f(&mut o);
            o.validate()
        };
        assert!(at(|o| o.grace_period = Some(MAX_INTERVAL)).is_ok());
        assert!(at(|o| o.retry_interval = Some(MAX_INTERVAL)).is_ok());
        // margin == the minimum the rule allows
        let lease = Duration::from_secs(10);
        let c = at(|o| {
            o.lease = Some(Duration::from_secs(10));
            o.renew_interval = Some(Duration::from_secs(3));
            o.step_down_margin = Some(min_step_down_margin(Duration::from_secs(10)));
        })
        .unwrap();
        assert_eq!(c.step_down_margin, min_step_down_margin(lease));
        // 2 × renew == lease - margin: exactly room for one retry
        assert!(at(|o| {
            o.lease = Some(Duration::from_secs(10));
            o.step_down_margin = Some(Duration::from_secs(1));
            o.renew_interval = Some(Duration::from_millis(4500));
        })
        .is_ok());
        assert!(at(|o| {
            o.lease = Some(Duration::from_secs(10));
            o.step_down_margin = Some(Duration::from_secs(1));
            o.renew_interval = Some(Duration::from_millis(4501));
        })
        .is_err());
    }

    /// The default id is `<host>-<pid>-<8 hex>`, with the host name as the system reports it
    /// (control characters dropped).
    #[test]
    fn default_id_names_the_host() {
        let host = host_name();
        let id = default_candidate_id();
        let expected = format!("{}-{}-", host.trim(), std::process::id());
        assert!(
            id.starts_with(&expected),
            "{id} should start with {expected}"
        );
        assert_eq!(id.len(), expected.len() + 8, "{id}");
        assert!(!id.chars().any(char::is_control));
    }

    /// The values the errors suggest are accepted.
    #[test]
    fn suggested_values_work() {
        let with = |lease: u64, renew: u64| Options {
            resource: Some("r".into()),
            lease: Some(Duration::from_millis(lease)),
            renew_interval: Some(Duration::from_millis(renew)),
            ..Options::default()
        };
        for (lease, renew) in [(15_000, 10_000), (10_000, 5_000), (1_001, 999), (333, 200)] {
            let err = with(lease, renew).validate().unwrap_err();
            let ConfigError::RenewTooSlow {
                lease: l, margin, ..
            } = err
            else {
                panic!("{err:?}");
            };
            let fits = renew_that_fits(l, margin);
            assert!(
                err.to_string()
                    .contains(&format!("renew_interval {fits:?} or less would do")),
                "{err}"
            );
            let fits = u64::try_from(fits.as_millis()).unwrap();
            with(lease, fits)
                .validate()
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let mut o = opts();
        o.step_down_margin = Some(Duration::from_secs(10));
        let err = o.validate().unwrap_err();
        assert!(
            err.to_string()
                .contains("the default is a tenth of it (1.5s)"),
            "{err}"
        );
    }

    #[test]
    fn bad_options() {
        assert!(matches!(
            Options::default().validate(),
            Err(ConfigError::MissingResource)
        ));
        let bad = |f: fn(&mut Options)| {
            let mut o = opts();
            f(&mut o);
            o.validate().unwrap_err()
        };
        assert!(matches!(
            bad(|o| o.resource = Some(String::new())),
            ConfigError::Invalid(StoreError::InvalidResource { .. })
        ));
        assert!(matches!(
            bad(|o| o.candidate = Some(" x".into())),
            ConfigError::Invalid(StoreError::InvalidCandidate { .. })
        ));
        assert!(matches!(
            bad(|o| o.lease = Some(Duration::ZERO)),
            ConfigError::Zero {
                option: "lease_duration"
            }
        ));
        assert!(matches!(
            bad(|o| o.renew_interval = Some(Duration::ZERO)),
            ConfigError::Zero { .. }
        ));
        assert!(matches!(
            bad(|o| o.retry_interval = Some(Duration::ZERO)),
            ConfigError::Zero { .. }
        ));
        assert!(matches!(
            bad(|o| o.renew_interval = Some(Duration::from_secs(7))),
            ConfigError::RenewTooSlow { .. }
        ));
        assert!(matches!(
            bad(|o| o.renew_interval = Some(Duration::from_secs(15))),
            ConfigError::RenewTooSlow { .. }
        ));
        assert!(matches!(
            bad(|o| o.step_down_margin = Some(Duration::from_secs(8))),
            ConfigError::MarginTooLarge { .. }
        ));
        assert!(matches!(
            bad(|o| o.lease = Some(Duration::from_secs(400 * 86400))),
            ConfigError::Invalid(StoreError::InvalidLeaseDuration { .. })
        ));
        assert!(matches!(
            bad(|o| o.step_down_margin = Some(Duration::ZERO)),
            ConfigError::MarginTooSmall { .. }
        ));
        assert!(matches!(
            bad(|o| o.step_down_margin = Some(Duration::from_millis(14))),
            ConfigError::MarginTooSmall { minimum, .. } if minimum == Duration::from_millis(15)
        ));
        assert!(matches!(
            bad(|o| o.grace_period = Some(Duration::MAX)),
            ConfigError::TooLong {
                option: "grace_period",
                ..
            }
        ));
        assert!(matches!(
            bad(|o| o.retry_interval = Some(MAX_INTERVAL + Duration::from_nanos(1))),
            ConfigError::TooLong {
                option: "retry_interval",
                ..
            }
        ));
        assert!(matches!(
            bad(|o| o.jitter = Some(0.9)),
            ConfigError::Jitter(_)
        ));
        assert!(matches!(
            bad(|o| o.jitter = Some(f64::NAN)),
            ConfigError::Jitter(_)
        ));
    }
}
