//! The rate-limit run's checker: the permits every client was told of, judged together.
//!
//! 1. No permit number is given twice, and none is above the table's count at the end (a
//!    permit nobody was told of, its answer lost to a kill or a cut connection, is allowed:
//!    the limit errs towards fewer permits).
//! 2. Over the permits' database instants, no half-open span of the quota's interval holds
//!    more than `permits + burst - 1`.
//! 3. Permits keep coming: no stretch without one (by when the answers arrived) longer than
//!    the bound, unless it overlaps a server fault's window (the server itself was down).

use crate::checker::Fault;

/// One permit a client was told of.
#[derive(Debug, Clone, PartialEq)]
pub struct Grant {
    pub client: String,
    pub number: u64,
    /// The database's instant of the decision, µs since the epoch.
    pub at_us: i64,
    /// When the client had the answer (monotonic ns).
    pub answered_ns: u64,
}

/// Everything a rate-limit run recorded.
#[derive(Debug, Default)]
pub struct RateRecord {
    pub grants: Vec<Grant>,
    pub limited: usize,
    pub errors: usize,
    /// The quota's interval (µs) and the most permits a span of it may hold.
    pub interval_us: i64,
    pub most_per_interval: u64,
    /// The table's count of permits at the end.
    pub table_permits: u64,
    pub faults: Vec<Fault>,
    /// From the run's start to when the clients were told to stop (monotonic ns).
    pub start_ns: u64,
    pub quiesce_ns: u64,
}

/// What the checker found.
#[derive(Debug, Default)]
pub struct RateVerdict {
    pub violations: Vec<String>,
    /// The most permits in one span of the interval.
    pub most_in_interval: usize,
    /// The longest stretch without a permit (ns), and whether a server fault explains it.
    pub longest_gap_ns: u64,
}

const SERVER_DOWN: [&str; 5] = ["restart", "failover", "nodekill", "nodestop", "noderejoin"];

fn num<T: std::str::FromStr>(parts: &[&str], i: usize, line: &str) -> Result<T, String> {
    parts
        .get(i)
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("bad rate history line: {line:?}"))
}

impl RateRecord {
    /// Adds one client's history.
    pub fn add_history(&mut self, text: &str) -> Result<(), String> {
        let mut name = String::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let parts: Vec<&str> = line.split_whitespace().collect();
            match parts[0] {
                "start" => name = parts.get(1).ok_or("start without a name")?.to_string(),
                "permit" => self.grants.push(Grant {
                    client: name.clone(),
                    number: num(&parts, 1, line)?,
                    at_us: num(&parts, 2, line)?,
                    answered_ns: num(&parts, 4, line)?,
                }),
                "limited" => self.limited += 1,
                "error" => self.errors += 1,
                "stop" => {}
                other => return Err(format!("unknown rate history line kind {other:?}")),
            }
        }
        Ok(())
    }
}

/// The checks of the module doc; `gap_bound_ns` is the longest stretch without a permit that
/// needs no server fault to explain it.
pub fn check(record: &RateRecord, gap_bound_ns: u64) -> RateVerdict {
    let mut v = RateVerdict::default();
    // 1. Numbers: each once, none above the table's count.
    let mut numbers: Vec<(u64, &str)> = record
        .grants
        .iter()
        .map(|g| (g.number, g.client.as_str()))
        .collect();
    numbers.sort_unstable();
    for pair in numbers.windows(2) {
        if pair[0].0 == pair[1].0 {
            v.violations.push(format!(
                "permit #{} given twice: to {} and to {}",
                pair[0].0, pair[0].1, pair[1].1
            ));
        }
    }
    if let Some((highest, client)) = numbers.last() {
        if *highest > record.table_permits {
            v.violations.push(format!(
                "permit #{highest} (to {client}) is above the table's count, {}",
                record.table_permits
            ));
        }
    }
    // 2. The quota over the database's instants.
    let mut at: Vec<i64> = record.grants.iter().map(|g| g.at_us).collect();
    at.sort_unstable();
    let mut j = 0;
    for i in 0..at.len() {
        while j < at.len() && at[j] < at[i].saturating_add(record.interval_us) {
            j += 1;
        }
        if j - i > v.most_in_interval {
            v.most_in_interval = j - i;
            if (j - i) as u64 > record.most_per_interval {
                v.violations.push(format!(
                    "{} permits in the span of {} µs from {} µs (at most {})",
                    j - i,
                    record.interval_us,
                    at[i],
                    record.most_per_interval
                ));
            }
        }
    }
    // 3. Permits keep coming.
    let mut answered: Vec<u64> = record.grants.iter().map(|g| g.answered_ns).collect();
    answered.sort_unstable();
    let mut from = record.start_ns;
    for to in answered
        .iter()
        .copied()
        .filter(|t| *t <= record.quiesce_ns)
        .chain([record.quiesce_ns])
    {
        let gap = to.saturating_sub(from);
        if gap > gap_bound_ns {
            let explained = record.faults.iter().any(|f| {
                SERVER_DOWN.contains(&f.kind.as_str())
                    && f.start <= to
                    && from <= f.end.saturating_add(gap_bound_ns)
            });
            if !explained {
                v.longest_gap_ns = v.longest_gap_ns.max(gap);
                v.violations.push(format!(
                    "no permit for {} ms from {from} to {to}, and no server fault explains it",
                    gap / 1_000_000
                ));
            }
        } else {
            v.longest_gap_ns = v.longest_gap_ns.max(gap);
        }
        from = from.max(to);
    }
    if record.grants.is_empty() {
        v.violations.push("no permit was granted".to_owned());
    }
    v
}
