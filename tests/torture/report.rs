//! What a configuration's run prints: one summary line of figures, then the violations, the
//! measured hazards and the fault timeline behind them.

use std::time::Duration;

use crate::checker::{Record, Verdict};
use crate::faults::Faults;
use crate::jobs_checker::{JobHistories, JobVerdict};
use crate::shard_checker::{ShardRecord, ShardVerdict};
use crate::{LEASE, SHARD_INTERVAL};

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
        if record.lapse_bound_ns > 0 && !record.pause_blocks_store {
            let (pauses_in, pauses) =
                crate::checker::inside_transactions(&record.faults, &record.transactions, "pause");
            let (cuts_in, cuts) = crate::checker::inside_transactions(
                &record.faults,
                &record.transactions,
                "partition",
            );
            println!(
                "  after a pause or a partition: another leader at most {} after the stopped term's end (bound {} ms); {} heals, the healed candidate's store answered again after at most {} (bound {} ms); inside a fenced transaction: {pauses_in} of {pauses} pauses, {cuts_in} of {cuts} partitions",
                ms(verdict.worst_after_lapse_ns),
                record.lapse_bound_ns / 1_000_000,
                verdict.heals,
                ms(verdict.worst_heal_ns),
                self.bound.as_millis(),
            );
        }
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

/// The figures of one shard-set configuration's run, as checked per resource.
pub struct ShardSummary<'a> {
    pub label: &'a str,
    pub seed: u64,
    pub nodes: usize,
    /// Nodes started under libfaketime.
    pub skewed: usize,
    pub run_start_ns: u64,
    pub record: &'a ShardRecord,
    pub verdict: &'a ShardVerdict,
    pub faults: &'a Faults,
    /// Committed ledger rows.
    pub ledger_rows: usize,
    /// The highest token in the lease table at the end.
    pub max_token: i64,
    /// The recovery bound the checker held every resource to.
    pub bound: Duration,
    /// A lock configuration: its permits (0: a lock).
    pub permits: Option<u32>,
}

impl ShardSummary<'_> {
    pub fn print(&self) {
        let (record, verdict) = (self.record, self.verdict);
        let mut kinds: Vec<String> = self
            .faults
            .counts
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        kinds.sort();
        let n = record.resources.len();
        if let Some(permits) = self.permits {
            self.print_locks(permits, &kinds);
            return;
        }
        println!(
            "torture[{}] seed={} duration={:.0}s nodes={} skewed={} shards={} operations={} (fenced {}, aborted {}, failed {}) ledger_rows={} terms={} max_token={} faults: {} violations={} (shards with a violation: {} of {}) worst_recovery={}ms (bound {}ms; by fault: {})",
            self.label,
            self.seed,
            (record.end - self.run_start_ns) as f64 / 1e9,
            self.nodes,
            self.skewed,
            n,
            record.writes_committed
                + record.writes_refused
                + record.writes_aborted
                + record.writes_failed,
            record.writes_refused,
            record.writes_aborted,
            record.writes_failed,
            self.ledger_rows,
            verdict.terms,
            self.max_token,
            kinds.join(" "),
            verdict.violations.len(),
            verdict.failed_resources,
            n,
            verdict.worst_recovery_ns / 1_000_000,
            self.bound.as_millis(),
            verdict
                .recovery_by_kind
                .iter()
                .map(|(kind, ns)| format!("{kind} {}ms", ns / 1_000_000))
                .collect::<Vec<_>>()
                .join(", "),
        );
        let lease_round = (LEASE + SHARD_INTERVAL).as_millis();
        let k = &verdict.kills;
        println!(
            "  recovery after kills: {} kills of a node leading shards, {} shards orphaned, leaderless for at most {} (median {}); lease + interval = {lease_round} ms",
            k.faults,
            k.resources,
            ms(k.worst_ns),
            ms(k.median_ns),
        );
        let p = &verdict.pauses;
        println!(
            "  takeover after pauses: {} pauses of a node leading shards, {} shards, led again (by another node, or by the woken one in a new term) after at most {} (median {}) from the SIGSTOP",
            p.faults,
            p.resources,
            ms(p.worst_ns),
            ms(p.median_ns),
        );
        let p = &verdict.partitions;
        let (pauses_in, pauses) =
            crate::checker::inside_transactions(&record.faults, &record.transactions, "pause");
        let (cuts_in, cuts) =
            crate::checker::inside_transactions(&record.faults, &record.transactions, "partition");
        println!(
            "  takeover after partitions: {} partitions of a node leading shards, {} shards, led again after at most {} (median {}) from the cut; {} heals, the healed node led a shard again after at most {}; inside a fenced transaction: {pauses_in} of {pauses} pauses, {cuts_in} of {cuts} partitions",
            p.faults,
            p.resources,
            ms(p.worst_ns),
            ms(p.median_ns),
            verdict.rejoins.heals,
            ms(verdict.rejoins.worst_ns),
        );
        let f = &verdict.fairness;
        let nodes = if f.nodes_min == f.nodes_max {
            f.nodes_min.to_string()
        } else {
            format!("{}..{}", f.nodes_min, f.nodes_max)
        };
        println!(
            "  fairness: {} steady points ({} live nodes): shards per live node {}..{} (ceil({n}/M) + slack = {}), every shard led at {} of them",
            f.samples, nodes, f.min, f.max, f.bound, f.all_led,
        );
        for v in &verdict.violations {
            println!("  VIOLATION: {v}");
        }
        if !verdict.violations.is_empty() {
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

impl ShardSummary<'_> {
    /// A lock configuration's summary: safety counts, holds at once against the permits, and
    /// how soon a hold cut off by a fault was taken by another client (a figure).
    fn print_locks(&self, permits: u32, kinds: &[String]) {
        let (record, verdict) = (self.record, self.verdict);
        println!(
            "torture[{}] seed={} duration={:.0}s clients={} skewed={} {} operations={} (fenced {}, aborted {}, failed {}) ledger_rows={} holds={} max_token={} most_at_once={} faults: {} violations={}",
            self.label,
            self.seed,
            (record.end - self.run_start_ns) as f64 / 1e9,
            self.nodes,
            self.skewed,
            if permits == 0 {
                "lock".to_owned()
            } else {
                format!("permits={permits}")
            },
            record.writes_committed
                + record.writes_refused
                + record.writes_aborted
                + record.writes_failed,
            record.writes_refused,
            record.writes_aborted,
            record.writes_failed,
            self.ledger_rows,
            verdict.terms,
            self.max_token,
            verdict.most_at_once,
            kinds.join(" "),
            verdict.violations.len(),
        );
        let (pauses_in, pauses) =
            crate::checker::inside_transactions(&record.faults, &record.transactions, "pause");
        let (cuts_in, cuts) =
            crate::checker::inside_transactions(&record.faults, &record.transactions, "partition");
        println!(
            "  taken by another client (measured): after kills at most {} (median {}), after pauses {} (median {}), after partitions {} (median {}); inside a fenced transaction: {pauses_in} of {pauses} pauses, {cuts_in} of {cuts} partitions",
            ms(verdict.kills.worst_ns),
            ms(verdict.kills.median_ns),
            ms(verdict.pauses.worst_ns),
            ms(verdict.pauses.median_ns),
            ms(verdict.partitions.worst_ns),
            ms(verdict.partitions.median_ns),
        );
        for v in &verdict.violations {
            println!("  VIOLATION: {v}");
        }
    }
}

/// A wait in nanoseconds as the summaries print it: whole milliseconds, or "never".
fn ms(ns: u64) -> String {
    if ns == u64::MAX {
        "never".to_owned()
    } else {
        format!("{} ms", ns / 1_000_000)
    }
}

/// The figures of one jobs configuration's run, as checked per slot.
pub struct JobSummary<'a> {
    pub label: &'a str,
    pub seed: u64,
    pub nodes: usize,
    /// Nodes started under libfaketime.
    pub skewed: usize,
    pub duration_ns: u64,
    pub histories: &'a JobHistories,
    pub verdict: &'a JobVerdict,
    pub faults: &'a Faults,
    pub fault_log: &'a [crate::checker::Fault],
    /// Rows in the writes table.
    pub write_rows: usize,
    /// The lease table's token at the end.
    pub last_token: i64,
}

impl JobSummary<'_> {
    pub fn print(&self) {
        let (h, v) = (self.histories, self.verdict);
        let mut kinds: Vec<String> = self
            .faults
            .counts
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        kinds.sort();
        println!(
            "torture[{}] seed={} duration={:.0}s nodes={} skewed={} slots: finished={} (at least {}; unacknowledged {}) skipped={} failed/given_up={}/{} running={} missed={} re-runs={} (slots retried {}) write_rows={} attempts={} (committed {}, refused by the fence {}, not claimed {}, failed {}, dropped {}, killed inside {}) terms={} last_token={} load jobs: records={} (not finished {}, skipped {}) keys: submitted={} created={} finished={} (at once at most {}) faults: {} violations={}",
            self.label,
            self.seed,
            self.duration_ns as f64 / 1e9,
            self.nodes,
            self.skewed,
            v.finished,
            v.liveness_bound,
            v.unacknowledged,
            v.skipped,
            v.failed,
            v.given_up,
            v.running + v.rerun,
            v.missed,
            v.reruns,
            v.retried_slots,
            self.write_rows,
            h.begun,
            h.committed.len(),
            h.refused,
            h.not_claimed,
            h.failed,
            h.dropped,
            h.killed_inside,
            h.terms.len(),
            self.last_token,
            v.load_records,
            v.load_unfinished,
            v.load_skipped,
            v.keys,
            v.keys_created,
            v.keys_finished,
            v.cap_peak,
            kinds.join(" "),
            v.violations.len(),
        );
        // Which node's attempts committed (the fenced and keyed jobs'): one node with spread
        // runs off, the spread otherwise.
        let mut by_node: std::collections::BTreeMap<&str, usize> = Default::default();
        for (node, ..) in &h.committed {
            *by_node.entry(node.as_str()).or_default() += 1;
        }
        let by_node: Vec<String> = by_node.iter().map(|(n, c)| format!("{n}={c}")).collect();
        println!("  commits by node: {}", by_node.join(" "));
        let (pauses_in, pauses) =
            crate::checker::inside_transactions(self.fault_log, &h.transactions, "pause");
        let (cuts_in, cuts) =
            crate::checker::inside_transactions(self.fault_log, &h.transactions, "partition");
        let kills_in = self
            .fault_log
            .iter()
            .filter(|f| f.kind == "kill")
            .filter(|f| {
                h.transactions.iter().any(|(c, begun, ended)| {
                    f.candidate.as_ref() == Some(c) && *begun < f.start && f.start <= *ended
                })
            })
            .count();
        let kills = self.fault_log.iter().filter(|f| f.kind == "kill").count();
        println!(
            "  inside an attempt's fenced transaction: {kills_in} of {kills} kills, {pauses_in} of {pauses} pauses, {cuts_in} of {cuts} partitions"
        );
        for violation in &v.violations {
            println!("  VIOLATION: {violation}");
        }
        if !v.violations.is_empty() {
            for f in self.fault_log {
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
