//! Job metrics through the [`metrics`] facade (feature `metrics`). Nothing is exported unless
//! the application installs a recorder. Every metric carries the label `job`.

/// Counter: ended attempts and skipped slots, by `outcome`: `finished`, `failed` (to be
/// retried), `given_up`, `skipped` (came due while the previous slot ran) and `superseded`
/// (the term ended before the attempt could be marked; the slot is claimed again).
pub const RUNS: &str = "orion_beacon_job_runs_total";
/// Histogram: seconds from a slot's time to its attempt's start, by the database clock.
pub const LATENESS: &str = "orion_beacon_job_lateness_seconds";
/// Histogram: seconds an attempt took, from its start to its end.
pub const DURATION: &str = "orion_beacon_job_duration_seconds";
/// Gauge, set by the leader after each look (failed ones too): seconds since the job's last
/// finished slot was marked finished (database clock; a job never finished counts from the
/// leader's first look at it in its term); set to zero when the node stops leading, so alert
/// on the maximum over nodes. Compare it with the job's
/// [`stale_after`](super::Job::stale_after) to alert when nothing ran.
pub const LAST_FINISHED_AGE: &str = "orion_beacon_job_last_finished_age_seconds";

pub(crate) fn describe() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        metrics::describe_counter!(RUNS, "Ended job attempts and skipped slots, by outcome");
        metrics::describe_histogram!(
            LATENESS,
            metrics::Unit::Seconds,
            "Seconds from a slot's time to its attempt's start (database clock)"
        );
        metrics::describe_gauge!(
            LAST_FINISHED_AGE,
            metrics::Unit::Seconds,
            "Seconds since the job's last finished slot (database clock), at the leader's look"
        );
        metrics::describe_histogram!(
            DURATION,
            metrics::Unit::Seconds,
            "Seconds a job attempt took"
        );
    });
}
