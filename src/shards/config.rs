//! Shard set options, their defaults and their validation.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use crate::error::StoreError;
use crate::hold::health::HEALTH_WINDOW_FACTOR;
use crate::hold::timing::{
    ConfigError, Timing, TimingDefaults, TimingOptions, DEFAULT_GRACE_PERIOD,
    DEFAULT_LEASE_DURATION,
};
use crate::membership::validate_shard_set;
use crate::store::{validate_candidate, validate_resource};

/// A bad shard set option, reported by [`ShardSetBuilder::build`](crate::ShardSetBuilder::build):
/// what is wrong with the set itself, or an option every lease holder shares ([`ConfigError`]).
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum ShardConfigError {
    /// An option every lease holder shares (timing, a refused name): see [`ConfigError`].
    #[error(transparent)]
    Options(#[from] ConfigError),
    /// A shard set without a name: call `.name("...")`.
    #[error("no shard set name: call .name(\"...\")")]
    MissingName,
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

crate::error::debug_as_chain!(ShardConfigError);

impl From<StoreError> for ShardConfigError {
    fn from(err: StoreError) -> Self {
        ShardConfigError::Options(ConfigError::Invalid(err))
    }
}

/// Default interval between a node's rounds (heartbeat, batched renew, rebalancing): 2 s.
pub const DEFAULT_SHARD_INTERVAL: Duration = Duration::from_secs(2);

/// Default slack: how many resources above its share a node may lead before it hands some
/// over (against flapping when members come and go).
pub const DEFAULT_SLACK: usize = 1;

#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub name: Arc<str>,
    pub member: Arc<str>,
    pub resources: Vec<Arc<str>>,
    /// The fingerprint of `resources` (see [`crate::Holding::fingerprint`]).
    pub set_hash: u64,
    /// The lease, the renew interval (the round interval: every round renews the node's
    /// leases), the step-down margin and the grace period.
    pub timing: Timing,
    pub slack: usize,
    pub prefer: HashMap<Arc<str>, Arc<str>>,
    pub release_on_shutdown: bool,
    /// How long the node may go without a store answer before it reports itself unhealthy.
    pub health_window: Duration,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Options {
    pub name: Option<String>,
    pub member: Option<String>,
    pub resources: Vec<String>,
    /// The lease, the round interval, the step-down margin and the grace period.
    pub timing: TimingOptions,
    pub slack: Option<usize>,
    pub prefer: Vec<(String, String)>,
    pub release_on_shutdown: Option<bool>,
    pub health_window: Option<Duration>,
}

impl Config {
    /// The round interval: every round renews the node's leases.
    pub(crate) fn interval(&self) -> Duration {
        self.timing.renew_interval
    }
}

impl Options {
    pub(crate) fn validate(self) -> Result<Config, ShardConfigError> {
        let name = self.name.ok_or(ShardConfigError::MissingName)?;
        validate_shard_set(&name)?;
        let member = self
            .member
            .unwrap_or_else(crate::hold::default_candidate_id);
        validate_candidate(&member)?;
        if self.resources.is_empty() {
            return Err(ShardConfigError::EmptyResourceSet);
        }
        let mut seen = HashSet::with_capacity(self.resources.len());
        for r in &self.resources {
            validate_resource(r)?;
            if !seen.insert(r.as_str()) {
                return Err(ShardConfigError::DuplicateResource { name: r.clone() });
            }
        }
        let slack = self.slack.unwrap_or(DEFAULT_SLACK);
        if slack > self.resources.len() {
            return Err(ShardConfigError::SlackTooLarge {
                slack,
                resources: self.resources.len(),
            });
        }
        let mut prefer = HashMap::new();
        for (resource, preferred) in self.prefer {
            if !seen.contains(resource.as_str()) {
                return Err(ShardConfigError::UnknownResource { name: resource });
            }
            validate_candidate(&preferred)?;
            if prefer
                .insert(Arc::<str>::from(resource.as_str()), Arc::from(preferred))
                .is_some()
            {
                return Err(ShardConfigError::DuplicatePreference { name: resource });
            }
        }
        let timing = self.timing.check(TimingDefaults {
            lease: DEFAULT_LEASE_DURATION,
            renew: ("interval", DEFAULT_SHARD_INTERVAL),
            grace_period: DEFAULT_GRACE_PERIOD,
        })?;
        let health_window = crate::hold::health::window(
            self.health_window,
            timing.renew_interval.saturating_mul(HEALTH_WINDOW_FACTOR),
        )?;
        Ok(Config {
            health_window,
            name: Arc::from(name),
            member: Arc::from(member),
            set_hash: crate::membership::Holding::fingerprint(&self.resources),
            resources: self.resources.into_iter().map(Arc::from).collect(),
            timing,
            slack,
            prefer,
            release_on_shutdown: self.release_on_shutdown.unwrap_or(true),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::StoreError;

    fn opts(resources: &[&str]) -> Options {
        Options {
            name: Some("orders".into()),
            resources: resources.iter().map(|r| r.to_string()).collect(),
            ..Options::default()
        }
    }

    #[test]
    fn bad_sets_are_typed_errors() {
        assert!(matches!(
            Options::default().validate(),
            Err(ShardConfigError::MissingName)
        ));
        assert!(matches!(
            opts(&[]).validate(),
            Err(ShardConfigError::EmptyResourceSet)
        ));
        assert!(matches!(
            opts(&["a", "b", "a"]).validate(),
            Err(ShardConfigError::DuplicateResource { name }) if name == "a"
        ));
        assert!(matches!(
            opts(&["a", " b"]).validate(),
            Err(ShardConfigError::Options(ConfigError::Invalid(
                StoreError::InvalidResource { .. }
            )))
        ));
        let mut o = opts(&["a", "b"]);
        o.slack = Some(3);
        assert!(matches!(
            o.validate(),
            Err(ShardConfigError::SlackTooLarge {
                slack: 3,
                resources: 2
            })
        ));
        let mut o = opts(&["a"]);
        o.prefer = vec![("z".into(), "node".into())];
        assert!(matches!(
            o.validate(),
            Err(ShardConfigError::UnknownResource { .. })
        ));
        let mut o = opts(&["a"]);
        o.prefer = vec![("a".into(), "".into())];
        assert!(matches!(
            o.validate(),
            Err(ShardConfigError::Options(ConfigError::Invalid(
                StoreError::InvalidCandidate { .. }
            )))
        ));
        let mut o = opts(&["a"]);
        o.name = Some("".into());
        assert!(matches!(
            o.validate(),
            Err(ShardConfigError::Options(ConfigError::Invalid(
                StoreError::InvalidShardSet { .. }
            )))
        ));
        let mut o = opts(&["a"]);
        o.timing.renew_interval = Some(Duration::from_secs(7));
        assert!(matches!(
            o.validate(),
            Err(ShardConfigError::Options(ConfigError::RenewTooSlow {
                option: "interval",
                ..
            }))
        ));
        // Errors name the builder's own option.
        let mut o = opts(&["a"]);
        o.timing.renew_interval = Some(Duration::ZERO);
        assert!(matches!(
            o.validate(),
            Err(ShardConfigError::Options(ConfigError::Zero {
                option: "interval"
            }))
        ));
    }

    #[test]
    fn defaults() {
        let c = opts(&["a", "b"]).validate().unwrap();
        assert_eq!(c.timing.renew_interval, Duration::from_secs(2));
        assert_eq!(c.timing.lease, Duration::from_secs(15));
        assert_eq!(c.slack, 1);
        assert!(c.release_on_shutdown);
    }
}
