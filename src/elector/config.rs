//! Elector options, their defaults and their validation.

use std::sync::Arc;
use std::time::Duration;

use crate::hold::default_candidate_id;
use crate::hold::timing::{
    check_interval, ConfigError, Timing, TimingDefaults, TimingOptions, DEFAULT_GRACE_PERIOD,
    DEFAULT_JITTER, DEFAULT_LEASE_DURATION, DEFAULT_RENEW_INTERVAL, DEFAULT_RETRY_INTERVAL,
    MAX_INTERVAL,
};
use crate::store::{validate_candidate, validate_resource};

/// Validated elector settings.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub resource: Arc<str>,
    pub candidate: Arc<str>,
    /// The lease, the renew interval, the step-down margin and the grace period.
    pub timing: Timing,
    pub retry_interval: Duration,
    pub jitter: f64,
    pub release_on_shutdown: bool,
    /// Written into the lease by every acquire and renew.
    pub payload: Option<Arc<str>>,
    /// Renews go out with other leaders' of the process (see `together`).
    pub renew_together: bool,
    /// Whether this candidate asks for the lease at all (false: it only watches).
    pub campaign: bool,
    /// A ranked candidate's rank (see `preference`).
    pub rank: Option<i64>,
    /// How long a higher-ranked candidate must have been live before the leader hands over.
    pub prefer_after: Duration,
}

/// Options as given, before validation.
#[derive(Debug, Clone, Default)]
pub(crate) struct Options {
    pub resource: Option<String>,
    pub candidate: Option<String>,
    /// The lease, the renew interval, the step-down margin and the grace period.
    pub timing: TimingOptions,
    pub retry_interval: Option<Duration>,
    pub jitter: Option<f64>,
    pub release_on_shutdown: Option<bool>,
    pub payload: Option<String>,
    pub renew_together: Option<bool>,
    pub campaign: Option<bool>,
    pub rank: Option<i64>,
    pub prefer_after: Option<Duration>,
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
        let retry_interval = self.retry_interval.unwrap_or(DEFAULT_RETRY_INTERVAL);
        check_interval("retry_interval", retry_interval)?;
        let timing = self.timing.check(TimingDefaults {
            lease: DEFAULT_LEASE_DURATION,
            renew: ("renew_interval", DEFAULT_RENEW_INTERVAL),
            grace_period: DEFAULT_GRACE_PERIOD,
        })?;
        let jitter = self.jitter.unwrap_or(DEFAULT_JITTER);
        if !(0.0..=0.5).contains(&jitter) {
            return Err(ConfigError::Jitter(jitter));
        }
        let campaign = self.campaign.unwrap_or(true);
        if self.rank.is_some() && !campaign {
            return Err(ConfigError::Rank {
                reason: "a candidate that does not campaign has no rank (it never leads)",
            });
        }
        let prefer_after = match self.prefer_after {
            Some(_) if self.rank.is_none() => {
                return Err(ConfigError::Rank {
                    reason: "prefer_after is for ranked candidates: give a rank too",
                });
            }
            // Zero is allowed: a higher rank is preferred as soon as it is seen live.
            Some(after) if after > MAX_INTERVAL => {
                return Err(ConfigError::TooLong {
                    option: "prefer_after",
                    value: after,
                    max: MAX_INTERVAL,
                })
            }
            Some(after) => after,
            None => timing.lease,
        };
        Ok(Config {
            resource: Arc::from(resource),
            candidate: Arc::from(candidate),
            timing,
            retry_interval,
            jitter,
            release_on_shutdown: self.release_on_shutdown.unwrap_or(true),
            payload: self.payload.map(Arc::from),
            renew_together: self.renew_together.unwrap_or(true),
            campaign,
            rank: self.rank,
            prefer_after,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::StoreError;
    use crate::hold::timing::{min_step_down_margin, renew_that_fits, MAX_INTERVAL};

    fn opts() -> Options {
        Options {
            resource: Some("r".into()),
            ..Options::default()
        }
    }

    #[test]
    fn defaults() {
        let c = opts().validate().unwrap();
        assert_eq!(c.timing.lease, Duration::from_secs(15));
        assert_eq!(c.timing.renew_interval, Duration::from_secs(5));
        assert_eq!(c.retry_interval, Duration::from_secs(2));
        assert_eq!(c.timing.step_down_margin, Duration::from_millis(1500));
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
        assert!(at(|o| o.timing.grace_period = Some(MAX_INTERVAL)).is_ok());
        assert!(at(|o| o.retry_interval = Some(MAX_INTERVAL)).is_ok());
        // margin == the minimum the rule allows
        let lease = Duration::from_secs(10);
        let c = at(|o| {
            o.timing.lease = Some(Duration::from_secs(10));
            o.timing.renew_interval = Some(Duration::from_secs(3));
            o.timing.step_down_margin = Some(min_step_down_margin(Duration::from_secs(10)));
        })
        .unwrap();
        assert_eq!(c.timing.step_down_margin, min_step_down_margin(lease));
        // 2 × renew == lease - margin: exactly room for one retry
        assert!(at(|o| {
            o.timing.lease = Some(Duration::from_secs(10));
            o.timing.step_down_margin = Some(Duration::from_secs(1));
            o.timing.renew_interval = Some(Duration::from_millis(4500));
        })
        .is_ok());
        assert!(at(|o| {
            o.timing.lease = Some(Duration::from_secs(10));
            o.timing.step_down_margin = Some(Duration::from_secs(1));
            o.timing.renew_interval = Some(Duration::from_millis(4501));
        })
        .is_err());
    }

    /// The values the errors suggest are accepted.
    #[test]
    fn suggested_values_work() {
        let with = |lease: u64, renew: u64| Options {
            resource: Some("r".into()),
            timing: TimingOptions {
                lease: Some(Duration::from_millis(lease)),
                renew_interval: Some(Duration::from_millis(renew)),
                ..TimingOptions::default()
            },
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
        o.timing.step_down_margin = Some(Duration::from_secs(10));
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
            bad(|o| o.timing.lease = Some(Duration::ZERO)),
            ConfigError::Zero {
                option: "lease_duration"
            }
        ));
        assert!(matches!(
            bad(|o| o.timing.renew_interval = Some(Duration::ZERO)),
            ConfigError::Zero { .. }
        ));
        assert!(matches!(
            bad(|o| o.retry_interval = Some(Duration::ZERO)),
            ConfigError::Zero { .. }
        ));
        assert!(matches!(
            bad(|o| o.timing.renew_interval = Some(Duration::from_secs(7))),
            ConfigError::RenewTooSlow { .. }
        ));
        assert!(matches!(
            bad(|o| o.timing.renew_interval = Some(Duration::from_secs(15))),
            ConfigError::RenewTooSlow { .. }
        ));
        assert!(matches!(
            bad(|o| o.timing.step_down_margin = Some(Duration::from_secs(8))),
            ConfigError::MarginTooLarge { .. }
        ));
        assert!(matches!(
            bad(|o| o.timing.lease = Some(Duration::from_secs(400 * 86400))),
            ConfigError::Invalid(StoreError::InvalidLeaseDuration { .. })
        ));
        assert!(matches!(
            bad(|o| o.timing.step_down_margin = Some(Duration::ZERO)),
            ConfigError::MarginTooSmall { .. }
        ));
        assert!(matches!(
            bad(|o| o.timing.step_down_margin = Some(Duration::from_millis(14))),
            ConfigError::MarginTooSmall { minimum, .. } if minimum == Duration::from_millis(15)
        ));
        assert!(matches!(
            bad(|o| o.timing.grace_period = Some(Duration::MAX)),
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
