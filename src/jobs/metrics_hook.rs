//! The scheduler's metric points: no-ops without the `metrics` feature.

use std::time::Duration;

#[cfg(feature = "metrics")]
use super::metrics::{describe, DURATION, LAST_FINISHED_AGE, LATENESS, RUNS};

/// An attempt ended (or a slot was skipped or given up without running).
pub(crate) fn outcome(job: &str, outcome: &'static str) {
    #[cfg(feature = "metrics")]
    {
        describe();
        metrics::counter!(RUNS, "job" => job.to_owned(), "outcome" => outcome).increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (job, outcome);
}

/// An attempt ended after running for `took`.
pub(crate) fn finished(job: &str, outcome: &'static str, took: Duration) {
    self::outcome(job, outcome);
    #[cfg(feature = "metrics")]
    metrics::histogram!(DURATION, "job" => job.to_owned()).record(took.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = took;
}

/// An attempt started `late` after its slot.
pub(crate) fn lateness(job: &str, late: Duration) {
    #[cfg(feature = "metrics")]
    {
        describe();
        metrics::histogram!(LATENESS, "job" => job.to_owned()).record(late.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (job, late);
}

/// Job `job`'s time since its last finished slot, as the leader sees it at a look.
pub(crate) fn age(job: &str, age: Duration) {
    #[cfg(feature = "metrics")]
    {
        describe();
        metrics::gauge!(LAST_FINISHED_AGE, "job" => job.to_owned()).set(age.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (job, age);
}
