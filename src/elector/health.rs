//! Health for readiness and liveness probes: has the elector heard from its store lately?
//!
//! An elector is healthy while it has completed a store round trip within its health window:
//! any answer counts (acquired, renewed or denied); errors and calls that did not answer in
//! time do not. That holds for leaders and followers alike, so a wedged elector (a hung
//! connection pool, a store that fails every call) shows up even while another candidate leads
//! and nothing else looks wrong. Ages are measured on [`tokio::time::Instant`], never the wall
//! clock.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::config::Config;
use super::term::LossReason;
use super::{ConfigError, ElectorBuilder};
use crate::StoreError;

/// The default health window is this many times the longer of the renew and retry intervals.
pub const HEALTH_WINDOW_FACTOR: u32 = 3;

/// The answer to [`ElectorHandle::health`](super::ElectorHandle::health): for a readiness or
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
    /// [`ElectorHandle::is_leader`](super::ElectorHandle::is_leader)).
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
    /// The health window ([`ElectorBuilder::health_window`]).
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
    /// ([`Denial::stalled`](crate::Denial::stalled)): who, and why. The elector stays healthy
    /// (the store answers), but nobody can lead until that session ends: worth an alert.
    /// (Left out of the `serde` form when `None`.)
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub stalled_holder: Option<String>,
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

impl ElectorBuilder {
    /// How long the elector may go without completing a store round trip before
    /// [`ElectorHandle::health`](super::ElectorHandle::health) reports it unhealthy. Default:
    /// three times the longer of the renew and retry intervals (15 s with the default
    /// intervals). Errors and timeouts do not count as round trips, so this is the time a store
    /// can fail or hang before probes see it.
    pub fn health_window(mut self, window: Duration) -> Self {
        self.health_window = Some(window);
        self
    }
}

/// `err` and its sources, `: `-separated.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The window from the builder option, or the default for `config`.
pub(crate) fn window(option: Option<Duration>, config: &Config) -> Result<Duration, ConfigError> {
    match option {
        Some(window) if window.is_zero() => Err(ConfigError::Zero {
            option: "health_window",
        }),
        Some(window) if window > super::config::MAX_INTERVAL => Err(ConfigError::TooLong {
            option: "health_window",
            value: window,
            max: super::config::MAX_INTERVAL,
        }),
        Some(window) => Ok(window),
        None => Ok(config
            .renew_interval
            .max(config.retry_interval)
            .saturating_mul(HEALTH_WINDOW_FACTOR)),
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
        *self
            .resting_until
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(until);
    }

    /// The store answered now.
    pub(crate) fn answered_now(&self) {
        self.answered(Instant::now());
    }

    /// The health as of now.
    pub(crate) fn health(&self, failure: Option<&StoreError>, leader: bool) -> Health {
        let now = Instant::now();
        let age = now.saturating_duration_since(self.heard().unwrap_or(self.started));
        let failure = failure.map(|err| error_chain(err));
        Health {
            healthy: age <= self.window && failure.is_none(),
            failure,
            leader,
            // The real last round trip, also during a stay-out.
            last_round_trip: self.last().map(|at| now.saturating_duration_since(at)),
            window: self.window,
            stalled_holder: self
                .stalled
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .clone(),
        }
    }

    fn last(&self) -> Option<Instant> {
        *self
            .last_round_trip
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The last round trip, or the time up to now a stay-out covered, whichever is later:
    /// what health is judged by.
    fn heard(&self) -> Option<Instant> {
        let resting = self
            .resting_until
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .map(|until| until.min(Instant::now()));
        self.last().max(resting)
    }

    fn answered(&self, at: Instant) {
        *self
            .last_round_trip
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(at);
    }

    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn age(&self) -> Duration {
        Instant::now().saturating_duration_since(self.heard().unwrap_or(self.started))
    }
}

/// What the elector's loop reports: store round trips and term changes, to the health state
/// and (feature `metrics`) to the `metrics` facade.
#[derive(Debug, Clone)]
pub(crate) struct Probe {
    state: Arc<HealthState>,
    #[cfg(feature = "metrics")]
    metrics: Arc<super::metrics::Metrics>,
}

impl Probe {
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn new(config: &Config, window: Duration) -> Self {
        Self {
            state: Arc::new(HealthState::new(window)),
            #[cfg(feature = "metrics")]
            metrics: Arc::new(super::metrics::Metrics::new(
                &config.resource,
                &config.candidate,
            )),
        }
    }

    /// One acquire-or-renew call ended (`result` as the loop saw it: answered, failed, or not
    /// answered in time). `leading`: it was a leader's renew.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn store_call<E>(
        &self,
        leading: bool,
        sent: Instant,
        result: &Result<Result<crate::LeaseOutcome, StoreError>, E>,
    ) {
        let now = Instant::now();
        if let Ok(Ok(outcome)) = result {
            self.state.answered(now);
            let stalled = match outcome {
                crate::LeaseOutcome::Denied(denial) => denial.stalled.as_ref().map(|why| {
                    format!(
                        "{} (token {}): {why}",
                        denial
                            .holder
                            .as_deref()
                            .unwrap_or("this candidate's lapsed term"),
                        denial.token.map_or(0, |t| t.get())
                    )
                }),
                _ => None,
            };
            #[cfg(feature = "metrics")]
            if stalled.is_some() {
                self.metrics.stalled_denial();
            }
            *self
                .state
                .stalled
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) = stalled;
        }
        #[cfg(feature = "metrics")]
        self.metrics.store_call(
            leading,
            now.saturating_duration_since(sent),
            match result {
                Ok(Ok(_)) => None,
                Ok(Err(err)) => Some(super::metrics::error_kind(err)),
                Err(_) => Some("timeout"),
            },
        );
    }

    /// Health as of now (see [`ElectorHandle::health`](super::ElectorHandle::health)):
    /// `failure` is why the elector stopped for good, if it did; `leader` whether it leads.
    pub(crate) fn health(&self, failure: Option<&StoreError>, leader: bool) -> Health {
        self.state.health(failure, leader)
    }

    /// A step-down keeps the elector from the store until `until` (on the clock of
    /// `crate::clock`).
    pub(crate) fn staying_out(&self, until: Instant) {
        self.state.resting_until(crate::clock::timer(until));
    }

    /// A term began.
    pub(crate) fn elected(&self) {
        #[cfg(feature = "metrics")]
        self.metrics.elected();
    }

    /// The elector stopped for good (`Leadership::Failed`): no round trip will come again, so
    /// the time-since-last-round-trip gauge reads as infinite from now on, and alerts on it fire.
    pub(crate) fn failed(&self) {
        #[cfg(feature = "metrics")]
        self.metrics.round_trip_age(Duration::MAX);
    }

    /// A term ended.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn lost(&self, reason: LossReason) {
        #[cfg(feature = "metrics")]
        self.metrics.lost(reason);
    }

    /// Runs the elector's loop; with metrics, also refreshes the time-since-last-round-trip
    /// gauge every second meanwhile (so it grows while the store hangs), and stops with it.
    pub(crate) async fn supervise<F: Future<Output = ()>>(self, run: F) {
        #[cfg(feature = "metrics")]
        {
            tokio::pin!(run);
            let mut tick = tokio::time::interval(super::metrics::REPORT_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    biased;
                    () = &mut run => return,
                    _ = tick.tick() => self.metrics.round_trip_age(self.state.age()),
                }
            }
        }
        #[cfg(not(feature = "metrics"))]
        run.await
    }
}
