//! What a configuration's run prints: one summary line of figures, then the violations, the
//! measured hazards and the fault timeline behind them.

use std::time::Duration;

use crate::checker::{Record, Verdict};
use crate::faults::Faults;
use crate::LEASE;

/// The figures of one configuration's run, as checked.
pub struct Summary<'a> {
    pub label: &'a str,
    pub seed: u64,
    pub candidates: usize,
    /// Candidates started under libfaketime.
    pub skewed: usize,
    pub run_start_ns: u64,
    pub record: &'a Record,
    pub verdict: &'a Verdict,
    /// A measured configuration's findings (not failures); `None` for the others.
    pub measured: Option<&'a [String]>,
    pub faults: &'a Faults,
    /// The lease table's token at the end.
    pub last_token: i64,
    /// The recovery bound the checker held the run to.
    pub bound: Duration,
}

impl Summary<'_> {
    pub fn print(&self) {
        let (record, verdict) = (self.record, self.verdict);
        let mut kinds: Vec<String> = self
            .faults
            .counts
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        kinds.sort();
        println!(
            "torture[{}] seed={} duration={:.0}s candidates={} skewed={} operations={} (fenced {}, aborted {}, failed {}) terms={} last_token={} faults: {} violations={} worst_recovery={}ms (bound {}ms)",
            self.label,
            self.seed,
            (record.end - self.run_start_ns) as f64 / 1e9,
            self.candidates,
            self.skewed,
            record.writes_committed
                + record.writes_refused
                + record.writes_aborted
                + record.writes_failed,
            record.writes_refused,
            record.writes_aborted,
            record.writes_failed,
            verdict.terms,
            self.last_token,
            kinds.join(" "),
            verdict.violations.len(),
            verdict.worst_recovery_ns / 1_000_000,
            self.bound.as_millis(),
        );
        let failovers: Vec<u64> = record
            .faults
            .iter()
            .filter(|f| f.kind == "failover")
            .map(|f| f.end.saturating_sub(f.start) / 1_000_000)
            .collect();
        if let (Some(min), Some(max)) = (failovers.iter().min(), failovers.iter().max()) {
            // Against the lease: a failover shorter than a lease is when lost writes can matter.
            println!(
                "  failovers: {} ({} with a leader killed inside the lag; primary killed to \
                 address moved: {min}..{max} ms; lease {} ms)",
                failovers.len(),
                self.faults.lag_kills,
                LEASE.as_millis()
            );
        }
        for v in &verdict.violations {
            println!("  VIOLATION: {v}");
        }
        let measured = self.measured.unwrap_or_default();
        if self.measured.is_some() {
            println!(
                "  measured (not a failure): {} violations {:?} with faults {}",
                measured.len(),
                by_kind(measured),
                kinds.join(" ")
            );
            for v in measured {
                println!("  measured: {v}");
            }
        }
        if !verdict.violations.is_empty() || !measured.is_empty() {
            // The fault timeline, in the same monotonic nanoseconds as the violations.
            for f in &record.faults {
                println!(
                    "  fault {} {} at {}..{}",
                    f.kind,
                    f.candidate.as_deref().unwrap_or("-"),
                    f.start,
                    f.end
                );
            }
        }
    }
}

/// Violations counted by kind: "token 7 reused: by c1 and by c2" counts as "token reused".
fn by_kind(violations: &[String]) -> std::collections::BTreeMap<String, usize> {
    let mut by_kind: std::collections::BTreeMap<String, usize> = Default::default();
    for v in violations {
        let head = v.split(':').next().unwrap_or(v);
        let head = head.split(" within").next().unwrap_or(head);
        let kind: Vec<&str> = head
            .split_whitespace()
            .filter(|w| !w.chars().all(|c| c.is_ascii_digit()))
            .collect();
        *by_kind.entry(kind.join(" ")).or_default() += 1;
    }
    by_kind
}
