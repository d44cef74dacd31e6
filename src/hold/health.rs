//! Health for readiness and liveness probes: has a holder (an elector, a shard set node) heard
//! from its store lately?
//!
//! An elector is healthy while it has completed a store round trip within its health window:
//! any answer counts (acquired, renewed or denied); errors and calls that did not answer in
//! time do not. That holds for leaders and followers alike, so a wedged elector (a hung
//! connection pool, a store that fails every call) shows up even while another candidate leads
//! and nothing else looks wrong. Ages are measured on [`tokio::time::Instant`], never the wall
//! clock.

use crate::mutex::lock;
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::timing::{ConfigError, MAX_INTERVAL};
use crate::error::StoreError;

/// The default health window is this many times the longer of the renew and retry intervals.
pub const HEALTH_WINDOW_FACTOR: u32 = 3;

/// The answer to [`ElectorHandle::health`](crate::ElectorHandle::health): for a readiness or
/// liveness probe.
///
/// With the `serde` feature it serializes with durations in milliseconds (`last_round_trip_ms`,
/// `window_ms`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Health {
    /// Whether the elector completed a store round trip (any answer: acquired, renewed or
    /// denied) within the last [`window`](Self::window). Right after start, the window counts
    /// from the start.
    pub healthy: bool,
    /// Whether this candidate leads right now (as
    /// [`ElectorHandle::is_leader`](crate::ElectorHandle::is_leader)).
    pub leader: bool,
    /// How long ago the last store round trip completed; `None` if none has yet.
    #[cfg_attr(
        feature = "serde",
        serde(
            rename = "last_round_trip_ms",
            serialize_with = "crate::lease::opt_millis"
        )
    )]
    pub last_round_trip: Option<Duration>,
    /// The health window ([`ElectorBuilder::health_window`](crate::ElectorBuilder::health_window)).
    #[cfg_attr(
        feature = "serde",
        serde(rename = "window_ms", serialize_with = "crate::lease::millis")
    )]
    pub window: Duration,
    /// Why the elector stopped for good, if it did: the store refused its configuration (see
    /// [`Leadership::Failed`](crate::Leadership::Failed)). Such an elector is never healthy.
    pub failure: Option<String>,
    /// Set while the store's last answer was a denial because the previous holder's lease has
    /// lapsed but its session still holds the lease row locked and the store did not end it
    /// ([`Denial::stalled`](crate::store::Denial::stalled)): who, and why. The elector stays healthy
    /// (the store answers), but nobody can lead until that session ends: worth an alert.
    /// (Left out of the `serde` form when `None`.)
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub stalled_holder: Option<String>,
    /// A ranked elector's view of its election
    /// ([`ElectorHandle::candidacy`](crate::ElectorHandle::candidacy)); `None` otherwise (and
    /// left out of the `serde` form).
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub candidacy: Option<crate::elector::Candidacy>,
}

impl fmt::Display for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let role = if self.leader { "leader" } else { "follower" };
        let status = if self.healthy { "healthy" } else { "UNHEALTHY" };
        if let Some(failure) = &self.failure {
            return write!(f, "{status}: stopped: {failure}");
        }
        match self.last_round_trip {
            Some(age) => write!(
                f,
                "{status}: {role}, last store answer {age:?} ago (window {:?})",
                self.window
            )?,
            None => write!(
                f,
                "{status}: {role}, no store answer yet (window {:?})",
                self.window
            )?,
        }
        match &self.stalled_holder {
            Some(stalled) => write!(f, "; stalled holder: {stalled}"),
            None => Ok(()),
        }
    }
}

/// The health window from the builder option (checked), or `default`.
pub(crate) fn window(option: Option<Duration>, default: Duration) -> Result<Duration, ConfigError> {
    match option {
        Some(window) if window.is_zero() => Err(ConfigError::Zero {
            option: "health_window",
        }),
        Some(window) if window > MAX_INTERVAL => Err(ConfigError::TooLong {
            option: "health_window",
            value: window,
            max: MAX_INTERVAL,
        }),
        Some(window) => Ok(window),
        None => Ok(default),
    }
}

#[derive(Debug)]
pub(crate) struct HealthState {
    started: Instant,
    window: Duration,
    last_round_trip: Mutex<Option<Instant>>,
    /// A step-down's stay-out ends then: no round trip is due before, and none is missed.
    resting_until: Mutex<Option<Instant>>,
    /// The stalled holder the last answer named, and why it was not ended.
    stalled: Mutex<Option<String>>,
}

impl HealthState {
    /// A state whose window counts from now.
    pub(crate) fn new(window: Duration) -> Self {
        Self {
            started: Instant::now(),
            window,
            last_round_trip: Mutex::new(None),
            resting_until: Mutex::new(None),
            stalled: Mutex::new(None),
        }
    }

    /// No store call is due until `until` (a step-down's stay-out): the time until then counts
    /// as heard from.
    pub(crate) fn resting_until(&self, until: Instant) {
        *lock(&self.resting_until) = Some(until);
    }

    /// The store answered now.
    pub(crate) fn answered_now(&self) {
        self.answered(Instant::now());
    }

    /// The health as of now.
    pub(crate) fn health(&self, failure: Option<&StoreError>, leader: bool) -> Health {
        let now = Instant::now();
        let age = now.saturating_duration_since(self.heard().unwrap_or(self.started));
        let failure = failure.map(|err| crate::error::chain(err));
        Health {
            healthy: age <= self.window && failure.is_none(),
            failure,
            leader,
            // The real last round trip, also during a stay-out.
            last_round_trip: self.last().map(|at| now.saturating_duration_since(at)),
            window: self.window,
            stalled_holder: lock(&self.stalled).clone(),
            candidacy: None,
        }
    }

    fn last(&self) -> Option<Instant> {
        *lock(&self.last_round_trip)
    }

    /// The last round trip, or the time up to now a stay-out covered, whichever is later:
    /// what health is judged by.
    fn heard(&self) -> Option<Instant> {
        let resting = lock(&self.resting_until).map(|until| until.min(Instant::now()));
        self.last().max(resting)
    }

    pub(crate) fn answered(&self, at: Instant) {
        *lock(&self.last_round_trip) = Some(at);
    }

    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn age(&self) -> Duration {
        Instant::now().saturating_duration_since(self.heard().unwrap_or(self.started))
    }

    /// The stalled holder the last answer named (and why it was not ended), if any.
    pub(crate) fn stalled(&self, stalled: Option<String>) {
        *lock(&self.stalled) = stalled;
    }
}
