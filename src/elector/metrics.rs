//! Elector metrics through the [`metrics`] facade (feature `metrics`).
//!
//! Nothing is exported unless the application installs a recorder (for Prometheus,
//! `metrics-exporter-prometheus`); without one every call here is a no-op. Handles are looked
//! up on each use, so a recorder installed after the elector started still sees everything
//! from then on. Every metric carries the labels `resource` and `candidate`.

use std::sync::Arc;
use std::time::Duration;

use metrics::{Label, Unit};

use crate::error::StoreError;
use crate::hold::LossReason;

/// Gauge: 1 while this candidate leads the resource, 0 otherwise.
pub const IS_LEADER: &str = "orion_beacon_is_leader";
/// Counter: term changes, by `change`: `elected`, or why a term ended (`denied`, `deadline`,
/// `superseded`, `shutdown`, `aborted`, `failed`).
pub const TERM_CHANGES: &str = "orion_beacon_term_changes_total";
/// Histogram: seconds a leader's renew (acquire-or-renew while leading) took, answered or not.
pub const RENEW_DURATION: &str = "orion_beacon_renew_duration_seconds";
/// Counter: failed store calls, by `kind` (`database`, `conflict`, `missing_table`,
/// `invalid_input`, `decode`, `unsupported_backend`, `timeout`, ...).
pub const STORE_ERRORS: &str = "orion_beacon_store_errors_total";
/// Gauge: seconds since the elector last completed a store round trip: the leader's last
/// successful renew, or a follower's last answered attempt. It grows while the store fails or
/// hangs (refreshed every second); the health check turns unhealthy when it passes the window.
/// An elector stopped by its configuration (`Leadership::Failed`) reports `+Inf`.
pub const SINCE_RENEW: &str = "orion_beacon_seconds_since_renew";

/// Counter: denials because the previous holder's lease lapsed but its session still holds
/// the lease row locked and the store did not end it (see
/// [`Denial::stalled`](crate::store::Denial::stalled)): nobody can lead until that session ends.
pub const STALLED_DENIALS: &str = "orion_beacon_stalled_holder_denials_total";

#[doc(no_inline)]
pub use crate::shards::metrics::{SHARDS_LED, SHARD_SHARE};

/// How often the time-since-last-round-trip gauge is refreshed.
pub(crate) const REPORT_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub(crate) struct Metrics {
    labels: [(&'static str, Arc<str>); 2],
}

impl Metrics {
    pub(crate) fn new(resource: &Arc<str>, candidate: &Arc<str>) -> Self {
        metrics::describe_gauge!(
            IS_LEADER,
            "1 while this candidate leads the resource, 0 otherwise"
        );
        metrics::describe_counter!(
            TERM_CHANGES,
            "Leadership term changes of this candidate: elected, or why a term ended"
        );
        metrics::describe_histogram!(
            RENEW_DURATION,
            Unit::Seconds,
            "Duration of the leader's acquire-or-renew calls"
        );
        metrics::describe_counter!(STORE_ERRORS, "Failed lease-store calls, by kind");
        metrics::describe_counter!(
            STALLED_DENIALS,
            "Denials past a lapsed holder whose session still holds the lease row locked"
        );
        metrics::describe_gauge!(
            SINCE_RENEW,
            Unit::Seconds,
            "Seconds since the elector last completed a lease-store round trip"
        );
        let metrics = Self {
            labels: [
                ("resource", resource.clone()),
                ("candidate", candidate.clone()),
            ],
        };
        metrics::gauge!(IS_LEADER, &metrics.labels).set(0.0);
        metrics::gauge!(SINCE_RENEW, &metrics.labels).set(0.0);
        metrics
    }

    fn with(&self, key: &'static str, value: impl Into<metrics::SharedString>) -> Vec<Label> {
        let mut labels: Vec<Label> = self.labels.iter().map(Label::from).collect();
        labels.push(Label::new(key, value));
        labels
    }

    /// A denial named a stalled holder the store did not end.
    pub(crate) fn stalled_denial(&self) {
        metrics::counter!(STALLED_DENIALS, &self.labels).increment(1);
    }

    pub(crate) fn store_call(&self, leading: bool, took: Duration, error: Option<&'static str>) {
        if leading {
            metrics::histogram!(RENEW_DURATION, &self.labels).record(took.as_secs_f64());
        }
        match error {
            None => metrics::gauge!(SINCE_RENEW, &self.labels).set(0.0),
            Some(kind) => metrics::counter!(STORE_ERRORS, self.with("kind", kind)).increment(1),
        }
    }

    pub(crate) fn elected(&self) {
        metrics::gauge!(IS_LEADER, &self.labels).set(1.0);
        metrics::counter!(TERM_CHANGES, self.with("change", "elected")).increment(1);
    }

    pub(crate) fn lost(&self, reason: LossReason) {
        metrics::gauge!(IS_LEADER, &self.labels).set(0.0);
        metrics::counter!(TERM_CHANGES, self.with("change", reason.to_string())).increment(1);
    }

    pub(crate) fn round_trip_age(&self, age: Duration) {
        let seconds = if age == Duration::MAX {
            f64::INFINITY
        } else {
            age.as_secs_f64()
        };
        metrics::gauge!(SINCE_RENEW, &self.labels).set(seconds);
    }
}

/// The `kind` label of a store error.
pub(crate) fn error_kind(err: &StoreError) -> &'static str {
    err.kind().as_str()
}
