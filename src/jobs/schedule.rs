//! When a job is due: a cron expression in a time zone, or a fixed interval; and what happens
//! to slots that were missed or that come due while the previous one still runs.
//!
//! A *slot* is one scheduled time, an instant (milliseconds since the Unix epoch, UTC). Slots
//! are computed from the database clock's now, never a node's, so every node computes the same
//! ones.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds};
use croner::Cron;

use super::JobError;

/// The shortest interval (and the cron granularity): one second.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// The longest interval.
pub const MAX_INTERVAL: Duration = Duration::from_secs(366 * 24 * 3600);

/// When a job is due.
///
/// - [`Schedule::cron`]: a cron expression (five fields, or six with seconds first; names
///   like `MON` and nicknames like `@daily` work) read in an IANA time zone.
/// - [`Schedule::every`]: a fixed interval; slots are the multiples of the interval since the
///   Unix epoch (UTC), so every node computes the same ones.
///
/// **Daylight saving time** (cron in a zone that has it): a slot is an instant, and each
/// instant is one slot, so no slot is ever run twice. A time of day that does not exist on the
/// day the clocks go forward runs once, at the first time after the gap (02:30 becomes 03:00);
/// a fixed time of day that happens twice when the clocks go back runs once, at its first
/// occurrence. A *fixed time* has exactly one value in each of its seconds, minutes and hours
/// (`30 2 * * *`); any other expression (a wildcard, step, list or range there: every 15
/// minutes, `30 2,14 * * *`) runs in real time: on each occurrence in the repeated hour, and
/// not at the times that do not exist. This is the Open Cron Pattern Specification's rule
/// (parsing and matching by the `croner` crate).
#[derive(Clone)]
pub struct Schedule {
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    Cron {
        /// Shared by the clones of a schedule: a parsed expression carries a bitfield per
        /// field (several KiB, most of it the years'), and many jobs often share one schedule.
        cron: Arc<Cron>,
        expression: String,
        zone: Tz,
    },
    Every {
        millis: i64,
    },
    /// A keyed job's: no slot of its own, only the keys submitted to it.
    Keyed,
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

/// Parsed cron expressions by their text and zone, while a scheduler is built: jobs whose
/// schedules read alike share one (see [`Schedule::share`]).
pub(crate) type Parsed = std::collections::HashMap<(String, &'static str), Arc<Cron>>;

impl Schedule {
    /// Which parse a cron schedule holds (its address), for tests of [`share`](Self::share).
    #[cfg(test)]
    pub(crate) fn parse_id(&self) -> Option<usize> {
        match &self.kind {
            Kind::Cron { cron, .. } => Some(Arc::as_ptr(cron) as usize),
            _ => None,
        }
    }

    /// Makes this schedule share the parsed expression of an earlier one in `parsed` with the
    /// same text and zone (or records its own there): ten thousand jobs of one expression,
    /// parsed one by one, then hold one parse, not ten thousand.
    pub(crate) fn share(&mut self, parsed: &mut Parsed) {
        if let Kind::Cron {
            cron,
            expression,
            zone,
        } = &mut self.kind
        {
            let shared = parsed
                .entry((expression.clone(), zone.name()))
                .or_insert_with(|| cron.clone());
            *cron = shared.clone();
        }
    }

    /// A cron expression read in the IANA time zone `zone` (`"UTC"`, `"Europe/Berlin"`).
    /// A bad expression or an unknown zone is an error here, before anything runs.
    pub fn cron(expression: &str, zone: &str) -> Result<Self, JobError> {
        let zone: Tz = zone
            .parse()
            .map_err(|_| JobError::UnknownTimeZone(zone.to_owned()))?;
        let trimmed = expression.trim();
        let invalid =
            |reason: String, source: Option<croner::errors::CronError>| JobError::InvalidCron {
                expression: expression.to_owned(),
                reason,
                source: source.map(|e| e.into()),
            };
        let fields = trimmed.split_whitespace().count();
        if !trimmed.starts_with('@') && !(5..=6).contains(&fields) {
            return Err(invalid(
                format!(
                    "it has {fields} field(s): give 5 (minute hour day-of-month month \
                     day-of-week) or 6 (seconds first), or a nickname such as @daily"
                ),
                None,
            ));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .build()
            .parse(trimmed)
            .map_err(|e| {
                invalid(
                    "a field is out of its range or not understood (minute 0-59, hour 0-23, \
                     day 1-31, month 1-12 or JAN-DEC, day-of-week 0-7 or SUN-SAT; *, lists, \
                     ranges and steps)"
                        .to_owned(),
                    Some(e),
                )
            })?;
        // An expression that never matches (30 February) is refused now, not at its first slot.
        let probe = zone.from_utc_datetime(&Utc::now().naive_utc());
        if let Err(e) = cron.find_next_occurrence(&probe, false) {
            return Err(invalid(
                "it never matches (a day no month has, such as 30 February)".to_owned(),
                Some(e),
            ));
        }
        Ok(Self {
            kind: Kind::Cron {
                cron: Arc::new(cron),
                expression: trimmed.to_owned(),
                zone,
            },
        })
    }

    /// A fixed interval: whole milliseconds, from [`MIN_INTERVAL`] to [`MAX_INTERVAL`].
    pub fn every(interval: Duration) -> Result<Self, JobError> {
        let millis = interval.as_millis();
        if interval < MIN_INTERVAL
            || interval > MAX_INTERVAL
            || Duration::from_millis(millis as u64) != interval
        {
            return Err(JobError::InvalidInterval(interval));
        }
        Ok(Self {
            kind: Kind::Every {
                millis: millis as i64,
            },
        })
    }

    /// How the run table records the schedule (`cron 0 2 * * * Europe/Berlin`, `every 1000ms`);
    /// [`parse`](Self::parse) reads it back.
    pub fn describe(&self) -> String {
        match &self.kind {
            Kind::Cron {
                expression, zone, ..
            } => format!("cron {expression} {}", zone.name()),
            Kind::Every { millis } => format!("every {millis}ms"),
            Kind::Keyed => KEYED.to_owned(),
        }
    }

    /// A keyed job's schedule (see [`Job::keyed`](super::Job::keyed)): no slot comes due by
    /// time; each submitted key is one run.
    pub(crate) fn keyed() -> Self {
        Self { kind: Kind::Keyed }
    }

    /// Whether this is a keyed job's schedule (slots are keys' digests, not times).
    pub fn is_keyed(&self) -> bool {
        matches!(self.kind, Kind::Keyed)
    }

    /// Reads what [`describe`](Self::describe) wrote.
    pub fn parse(text: &str) -> Result<Self, JobError> {
        if text == KEYED {
            return Ok(Self::keyed());
        }
        if let Some(rest) = text.strip_prefix("every ") {
            let millis = rest
                .strip_suffix("ms")
                .and_then(|m| m.parse::<u64>().ok())
                .ok_or_else(|| JobError::InvalidCron {
                    expression: text.to_owned(),
                    reason: "not an interval in milliseconds".to_owned(),
                    source: None,
                })?;
            return Self::every(Duration::from_millis(millis));
        }
        let rest = text.strip_prefix("cron ").unwrap_or(text);
        match rest.rsplit_once(' ') {
            Some((expression, zone)) => Self::cron(expression, zone),
            None => Err(JobError::InvalidCron {
                expression: text.to_owned(),
                reason: "no time zone".to_owned(),
                source: None,
            }),
        }
    }

    /// The latest slot at or before `now_ms`, if any (within the supported calendar).
    pub fn latest_at_or_before(&self, now_ms: i64) -> Option<i64> {
        match &self.kind {
            Kind::Every { millis } => Some(now_ms.div_euclid(*millis) * millis),
            Kind::Cron { cron, zone, .. } => {
                let at = zone.from_utc_datetime(&millis_to_utc(now_ms)?.naive_utc());
                let found = cron.find_previous_occurrence(&at, true).ok()?;
                Some(found.with_timezone(&Utc).timestamp_millis())
            }
            Kind::Keyed => None,
        }
    }

    /// The first slot strictly after `after_ms`, if any.
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        match &self.kind {
            Kind::Every { millis } => (after_ms.div_euclid(*millis) + 1).checked_mul(*millis),
            Kind::Cron { cron, zone, .. } => {
                let at = zone.from_utc_datetime(&millis_to_utc(after_ms)?.naive_utc());
                let found = cron.find_next_occurrence(&at, false).ok()?;
                Some(found.with_timezone(&Utc).timestamp_millis())
            }
            Kind::Keyed => None,
        }
    }

    /// The slots after `after_ms` (exclusive) up to `until_ms` (inclusive), oldest first; at
    /// most `limit` of them, the newest ones when there are more.
    pub fn slots_between(&self, after_ms: i64, until_ms: i64, limit: usize) -> Vec<i64> {
        let mut newest_first = Vec::new();
        let mut at = self.latest_at_or_before(until_ms);
        while let Some(slot) = at {
            if slot <= after_ms || newest_first.len() >= limit {
                break;
            }
            newest_first.push(slot);
            at = slot
                .checked_sub(1)
                .and_then(|t| self.latest_at_or_before(t));
        }
        newest_first.reverse();
        newest_first
    }
}

impl FromStr for Schedule {
    type Err = JobError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// How the run table records a keyed job's schedule.
const KEYED: &str = "keyed";

/// A slot in milliseconds as a UTC time.
pub(crate) fn millis_to_utc(ms: i64) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp_millis(ms)
}

/// What a leader does with slots whose time passed while nobody ran them (no leader at 02:00,
/// a deploy, an outage). Slots before the job's first recorded run are never replayed: the
/// first run after a job is deployed is a slot no older than the
/// [starting deadline](super::Job::starting_deadline), or the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MissedSlots {
    /// Run the latest missed slot once, however late; the older ones are not run (cron's and
    /// `anacron`'s habit). The default.
    #[default]
    RunLatest,
    /// Run every missed slot since the job's latest recorded one, oldest first, one at a time
    /// unless the overlap policy allows more; at most the newest
    /// [`max_catch_up`](super::Job::max_catch_up) of them.
    RunAll,
    /// Run a slot only within its starting deadline after its time; later ones are not run
    /// (Kubernetes CronJob's `startingDeadlineSeconds`).
    Skip,
}

/// What happens to a slot that comes due while an earlier slot of the same job still runs on
/// this leader (Kubernetes CronJob's `concurrencyPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Overlap {
    /// The new slot is recorded as `skipped` and never runs. The default.
    #[default]
    Skip,
    /// The new slot waits and starts when the running one ends (missed-slot policy applies
    /// to what waited).
    Queue,
    /// The new slot starts at once, beside the running one.
    Allow,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_of(schedule: &Schedule) -> Option<&Arc<Cron>> {
        match &schedule.kind {
            Kind::Cron { cron, .. } => Some(cron),
            _ => None,
        }
    }

    #[test]
    fn schedules_that_read_alike_share_one_parse() {
        let mut parsed = Parsed::new();
        let mut a = Schedule::cron("0 2 * * *", "Europe/Berlin").unwrap();
        let mut b = Schedule::cron("0 2 * * *", "Europe/Berlin").unwrap();
        let mut other_zone = Schedule::cron("0 2 * * *", "UTC").unwrap();
        let mut every = Schedule::every(Duration::from_secs(60)).unwrap();
        for s in [&mut a, &mut b, &mut other_zone, &mut every] {
            s.share(&mut parsed);
        }
        let (a, b, other) = (parse_of(&a), parse_of(&b), parse_of(&other_zone));
        assert!(
            Arc::ptr_eq(a.unwrap(), b.unwrap()),
            "same text and zone: one parse"
        );
        assert!(
            !Arc::ptr_eq(a.unwrap(), other.unwrap()),
            "another zone: its own"
        );
        assert_eq!(parsed.len(), 2);
        assert!(parse_of(&every).is_none());
    }

    fn ms(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> i64 {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, s)
            .unwrap()
            .timestamp_millis()
    }

    #[test]
    fn cron_errors_say_what_is_wrong_in_our_words() {
        let text = |e: &str| Schedule::cron(e, "UTC").unwrap_err().to_string();
        let four = text("0 2 * *");
        assert!(
            four.contains("4 field(s)") && four.contains("give 5"),
            "{four}"
        );
        let seven = text("0 0 2 * * * 2026");
        assert!(seven.contains("7 field(s)"), "{seven}");
        let never = Schedule::cron("0 0 30 2 *", "UTC").unwrap_err();
        assert!(never.to_string().contains("never matches"), "{never}");
        assert!(
            std::error::Error::source(&never).is_some(),
            "croner's error as the source"
        );
        let range = Schedule::cron("61 2 * * *", "UTC").unwrap_err();
        assert!(range.to_string().contains("out of its range"), "{range}");
        assert!(std::error::Error::source(&range).is_some());
        for e in [four, seven] {
            assert!(
                !e.contains("Pattern must"),
                "croner's text stays in the source: {e}"
            );
        }
    }

    #[test]
    fn bad_input_is_a_typed_error() {
        assert!(matches!(
            Schedule::cron("0 2 * *", "UTC"),
            Err(JobError::InvalidCron { .. })
        ));
        assert!(matches!(
            Schedule::cron("61 2 * * *", "UTC"),
            Err(JobError::InvalidCron { .. })
        ));
        assert!(matches!(
            Schedule::cron("0 0 30 2 *", "UTC"),
            Err(JobError::InvalidCron { .. })
        ));
        assert!(matches!(
            Schedule::cron("0 2 * * *", "Mars/Olympus"),
            Err(JobError::UnknownTimeZone(_))
        ));
        for bad in [
            Duration::ZERO,
            Duration::from_millis(999),
            Duration::from_micros(1_000_500),
            MAX_INTERVAL + Duration::from_secs(1),
        ] {
            assert!(matches!(
                Schedule::every(bad),
                Err(JobError::InvalidInterval(_))
            ));
        }
    }

    #[test]
    fn intervals_are_a_grid_from_the_epoch() {
        let s = Schedule::every(Duration::from_secs(10)).unwrap();
        assert_eq!(s.latest_at_or_before(12_345), Some(10_000));
        assert_eq!(s.latest_at_or_before(10_000), Some(10_000));
        assert_eq!(s.next_after(10_000), Some(20_000));
        assert_eq!(
            s.slots_between(0, 45_000, 10),
            vec![10_000, 20_000, 30_000, 40_000]
        );
        assert_eq!(s.slots_between(0, 45_000, 2), vec![30_000, 40_000]);
        assert_eq!(s.slots_between(40_000, 45_000, 2), Vec::<i64>::new());
    }

    #[test]
    fn describe_round_trips() {
        for s in [
            Schedule::cron("0 2 * * *", "Europe/Berlin").unwrap(),
            Schedule::cron("*/5 * * * * *", "UTC").unwrap(),
            Schedule::every(Duration::from_millis(1500)).unwrap(),
        ] {
            let back = Schedule::parse(&s.describe()).unwrap();
            assert_eq!(back.describe(), s.describe());
            assert_eq!(back.next_after(0), s.next_after(0));
        }
    }

    // Europe/Berlin goes from 02:00 to 03:00 on 2026-03-29 and back from 03:00 to 02:00 on
    // 2026-10-25. A nightly 02:30 job runs exactly once on each of those days.
    #[test]
    fn daylight_saving_neither_skips_nor_doubles_a_nightly_slot() {
        let s = Schedule::cron("30 2 * * *", "Europe/Berlin").unwrap();
        // Spring forward: 02:30 does not exist; the slot is 03:00 CEST = 01:00 UTC.
        let spring = s.slots_between(ms(2026, 3, 28, 12, 0, 0), ms(2026, 3, 30, 12, 0, 0), 10);
        assert_eq!(
            spring,
            vec![ms(2026, 3, 29, 1, 0, 0), ms(2026, 3, 30, 0, 30, 0)],
            "one slot per day, the one in the gap moved to its end"
        );
        // Fall back: 02:30 happens twice (00:30 and 01:30 UTC); it runs at the first.
        let fall = s.slots_between(ms(2026, 10, 24, 12, 0, 0), ms(2026, 10, 26, 12, 0, 0), 10);
        assert_eq!(
            fall,
            vec![ms(2026, 10, 25, 0, 30, 0), ms(2026, 10, 26, 1, 30, 0)],
            "one slot per day, at the first of the two 02:30s"
        );
        // Forward and backward searches agree.
        assert_eq!(
            s.next_after(ms(2026, 10, 24, 12, 0, 0)),
            Some(ms(2026, 10, 25, 0, 30, 0))
        );
        assert_eq!(
            s.next_after(ms(2026, 10, 25, 0, 30, 0)),
            Some(ms(2026, 10, 26, 1, 30, 0))
        );
    }

    // Two values in the hours field: not a fixed time, so it runs in real time: the 02:30 in
    // the gap is skipped, and the repeated 02:30 runs twice (as the docs say).
    #[test]
    fn daylight_saving_runs_a_list_in_real_time() {
        let s = Schedule::cron("30 2,14 * * *", "Europe/Berlin").unwrap();
        let spring = s.slots_between(ms(2026, 3, 28, 23, 0, 0), ms(2026, 3, 29, 23, 0, 0), 10);
        assert_eq!(spring, vec![ms(2026, 3, 29, 12, 30, 0)]);
        let fall = s.slots_between(ms(2026, 10, 24, 23, 0, 0), ms(2026, 10, 25, 23, 0, 0), 10);
        assert_eq!(
            fall,
            vec![
                ms(2026, 10, 25, 0, 30, 0),
                ms(2026, 10, 25, 1, 30, 0),
                ms(2026, 10, 25, 13, 30, 0)
            ]
        );
    }

    #[test]
    fn daylight_saving_runs_an_interval_job_in_real_time() {
        // Every 30 minutes: the repeated hour runs on both passes (real time), the missing
        // hour has no slots; consecutive slots are 30 minutes apart in real time.
        let s = Schedule::cron("*/30 * * * *", "Europe/Berlin").unwrap();
        let fall = s.slots_between(ms(2026, 10, 24, 23, 0, 0), ms(2026, 10, 25, 3, 0, 0), 100);
        assert!(
            fall.windows(2).all(|w| w[1] - w[0] == 30 * 60 * 1000),
            "{fall:?}"
        );
        assert_eq!(fall.len(), 8);
        let spring = s.slots_between(ms(2026, 3, 28, 23, 0, 0), ms(2026, 3, 29, 3, 0, 0), 100);
        assert!(
            spring.windows(2).all(|w| w[1] - w[0] == 30 * 60 * 1000),
            "{spring:?}"
        );
    }
}
