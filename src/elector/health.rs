//! The elector's probe: its store round trips and term changes, reported to its health state
//! and (feature `metrics`) to the `metrics` facade.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::config::Config;
use super::{ConfigError, ElectorBuilder};
use crate::error::StoreError;
use crate::hold::health::{Health, HealthState, HEALTH_WINDOW_FACTOR};
use crate::hold::LossReason;

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

/// The window from the builder option, or the default for `config`.
pub(crate) fn window(option: Option<Duration>, config: &Config) -> Result<Duration, ConfigError> {
    let default = config
        .timing
        .renew_interval
        .max(config.retry_interval)
        .saturating_mul(HEALTH_WINDOW_FACTOR);
    crate::hold::health::window(option, default)
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
        result: &Result<Result<crate::lease::LeaseOutcome, StoreError>, E>,
    ) {
        let now = Instant::now();
        if let Ok(Ok(outcome)) = result {
            self.state.answered(now);
            let stalled = match outcome {
                crate::lease::LeaseOutcome::Denied(denial) => denial.stalled.as_ref().map(|why| {
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
            self.state.stalled(stalled);
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
