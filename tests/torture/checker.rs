//! The torture run's checker: reads what the candidates and the fault scheduler wrote down and
//! the ledger table, and proves (or refutes) safety from that record alone.
//!
//! History lines (one file per candidate process, times are `CLOCK_MONOTONIC` nanoseconds,
//! comparable across processes on one host):
//!
//! ```text
//! start <candidate> <ns> <wall-unix-ms>
//! lead <token> <ns>                       the candidate saw itself elected
//! lost <token> <ns> <deadline-ns> <why>   the term ended (as observed; believed until min(ns, deadline))
//! write <token> <seq> <ns> [<begun>]     a fenced ledger write committed
//! refused <token> <ns> [<begun>]         the fence refused a ledger write (its term was stale)
//! aborted <token> <ns> [<begun>]         its commit lost to a concurrent transaction
//! failed <token> <ns> [<begun>]          a ledger write failed (another database error)
//! dropped <token> <ns> <begun>          a ledger write dropped unfinished (its term's work was)
//! call <sent> <answered> <outcome...>    a store call and its raw outcome
//! stop <ns>
//! ```
//!
//! Faults (the scheduler's): `kill` and `pause` of a candidate, `connkill`, `restart` (and
//! `failover`) of the server. After a kill or the start of a pause, *another* candidate must
//! lead within the bound (the paused one still believes it leads until its deadline); after a
//! server fault ends, any candidate. Between the first term and the end of the run, no stretch
//! without a leader may be longer than the bound unless a server fault window explains it.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};

/// One believed leadership interval.
#[derive(Debug, Clone, PartialEq)]
pub struct Interval {
    pub candidate: String,
    pub token: i64,
    pub start: u64,
    pub end: u64,
}

/// A fault, with the instant it ended (from which liveness is measured).
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    pub kind: String,
    pub candidate: Option<String>,
    pub start: u64,
    pub end: u64,
}

/// One store call of a candidate (its `call` line): when it was sent and answered, and
/// whether the store answered (granted, renewed or denied) rather than failed.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub candidate: String,
    pub start: u64,
    pub end: u64,
    pub answered: bool,
}

/// A committed ledger row, in id order.
#[derive(Debug, Clone, PartialEq)]
pub struct LedgerRow {
    pub id: i64,
    pub token: i64,
    pub candidate: String,
    pub seq: i64,
}

#[derive(Debug, Default)]
pub struct Record {
    pub intervals: Vec<Interval>,
    pub faults: Vec<Fault>,
    pub ledger: Vec<LedgerRow>,
    pub writes_committed: u64,
    /// Writes the fence refused (a stale term).
    pub writes_refused: u64,
    /// Writes whose commit lost to a concurrent transaction (Galera certification, deadlock).
    pub writes_aborted: u64,
    /// Writes that failed with another database error.
    pub writes_failed: u64,
    /// Run end (ns): intervals still open at the end are closed here.
    pub end: u64,
    /// When the candidates were told to stop (ns; 0: at `end`): leaderless time after it is
    /// the shutdown, not a fault.
    pub quiesce: u64,
    /// A paused candidate can stall every other one until it wakes (inside a fenced
    /// transaction it holds the lease row's lock; SQLite: the file's): recovery from a pause
    /// is then measured from the wake-up, by anyone.
    pub pause_blocks_store: bool,
    /// Candidates on pools of one connection: the takeover, which needs a second connection,
    /// cannot run, so a pause or a partition inside a fenced transaction holds the lease row
    /// until it ends (recovery from it is measured from its end, by anyone, as for
    /// `pause_blocks_store`).
    pub no_takeover: bool,
    /// The candidates' store calls (electors only; empty for shard sets).
    pub calls: Vec<Call>,
    /// The candidates' fenced ledger transactions: (candidate, begun, ended).
    pub transactions: Vec<(String, u64, u64)>,
    /// After a pause or a partition, another candidate must lead within this of the stopped
    /// term's end (its believed end, which comes no later than its lease's lapse by the
    /// database clock); 0: not checked.
    pub lapse_bound_ns: u64,
    /// After a pause or a partition, a new term of the stalled candidate itself, begun after
    /// it woke or healed, counts as the recovery too (shard sets: a node back before the
    /// others dropped it from their view keeps its share).
    pub stalled_may_resume: bool,
    /// Only the safety checks (1 to 3): the lock configurations' clients let go of a permit
    /// now and then, so a free permit is no liveness problem there.
    pub safety_only: bool,
    /// Fenced transactions whose session the server ended (terminated, killed) while their
    /// term was still current: (candidate, when the candidate saw it). Outside the harness's
    /// own session-ending faults, each is a healthy transaction ended by someone's takeover.
    pub ended_live: Vec<(String, u64)>,
}

/// Fault kinds whose window (start to end, then the bound) may leave the run leaderless: the
/// server itself was down.
const SERVER_DOWN: [&str; 5] = ["restart", "failover", "nodekill", "nodestop", "noderejoin"];

/// How long around a harness fault that ends sessions (a connection kill, a server down) a
/// session ended counts as the harness's doing: the candidate sees it at its next statement.
const HARNESS_MARGIN_NS: u64 = 2_000_000_000;

fn num(parts: &[&str], i: usize, line: &str) -> Result<u64, String> {
    parts
        .get(i)
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("bad history line: {line:?}"))
}

impl Record {
    /// The latest end of the server outages (`SERVER_DOWN` faults) that overlap `from..=to`:
    /// a leaderless stretch there counts from it.
    fn outage_end(&self, from: u64, to: u64) -> Option<u64> {
        self.faults
            .iter()
            .filter(|f| SERVER_DOWN.contains(&f.kind.as_str()))
            .filter(|f| f.start <= to && from <= f.end)
            .map(|f| f.end)
            .max()
    }

    /// Adds one candidate's history. `killed_at` closes a term the process never saw end.
    pub fn add_history(&mut self, text: &str, killed_at: Option<u64>) -> Result<(), String> {
        let mut name = String::new();
        let mut open: Option<(i64, u64)> = None;
        let mut last_seen = 0u64;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let parts: Vec<&str> = line.split_whitespace().collect();
            match parts[0] {
                "start" => {
                    name = parts.get(1).ok_or("start without a name")?.to_string();
                    last_seen = num(&parts, 2, line)?;
                }
                "lead" => {
                    let token = num(&parts, 1, line)? as i64;
                    let at = num(&parts, 2, line)?;
                    if let Some((t, s)) = open.take() {
                        // A new term without a logged end: the old one ended no later than now.
                        self.intervals.push(Interval {
                            candidate: name.clone(),
                            token: t,
                            start: s,
                            end: at,
                        });
                    }
                    open = Some((token, at));
                    last_seen = at;
                }
                "lost" => {
                    let token = num(&parts, 1, line)? as i64;
                    let at = num(&parts, 2, line)?;
                    let deadline = num(&parts, 3, line)?;
                    if let Some((t, s)) = open.take() {
                        if t != token {
                            return Err(format!("{name}: lost {token} while leading {t}"));
                        }
                        self.intervals.push(Interval {
                            candidate: name.clone(),
                            token,
                            start: s,
                            end: at.min(deadline).max(s),
                        });
                    }
                    last_seen = at;
                }
                "write" | "refused" | "failed" | "aborted" => {
                    let at = if parts[0] == "write" { 3 } else { 2 };
                    match parts[0] {
                        "write" => self.writes_committed += 1,
                        "refused" => self.writes_refused += 1,
                        "failed" => self.writes_failed += 1,
                        _ => self.writes_aborted += 1,
                    }
                    last_seen = num(&parts, at, line)?;
                    if parts.len() > at + 1 {
                        let begun = num(&parts, at + 1, line)?;
                        self.transactions.push((name.clone(), begun, last_seen));
                    }
                }
                "dropped" => {
                    last_seen = num(&parts, 2, line)?;
                    let begun = num(&parts, 3, line)?;
                    self.transactions.push((name.clone(), begun, last_seen));
                }
                // A write whose session the server ended while its term was current.
                "ended" => {
                    last_seen = num(&parts, 2, line)?;
                    self.ended_live.push((name.clone(), last_seen));
                }
                "stop" => last_seen = num(&parts, 1, line)?,
                // Raw store calls: whether a candidate answers again after a partition heals.
                "call" => {
                    let start = num(&parts, 1, line)?;
                    let end = num(&parts, 2, line)?;
                    let answered = matches!(
                        parts.get(3),
                        Some(&"acquired") | Some(&"renewed") | Some(&"denied")
                    );
                    self.calls.push(Call {
                        candidate: name.clone(),
                        start,
                        end,
                        answered,
                    });
                    last_seen = end;
                }
                other => return Err(format!("unknown history line kind {other:?}")),
            }
        }
        if let Some((token, start)) = open {
            // Never saw its term end: killed (ends at the kill), or cut off (open to the end).
            let end = killed_at.unwrap_or(u64::MAX).max(start);
            let _ = last_seen;
            self.intervals.push(Interval {
                candidate: name,
                token,
                start,
                end,
            });
        }
        Ok(())
    }
}

impl Record {
    /// Whether `fault` (a pause or a partition) stopped every other candidate until it ended:
    /// on SQLite always, on pools of one connection when it hit inside a fenced transaction.
    fn blocks_store(&self, fault: &Fault) -> bool {
        self.pause_blocks_store || (self.no_takeover && inside(fault, &self.transactions))
    }
}

/// Whether `fault` began inside one of its candidate's fenced transactions.
fn inside(fault: &Fault, transactions: &[(String, u64, u64)]) -> bool {
    transactions.iter().any(|(c, begun, ended)| {
        fault.candidate.as_ref() == Some(c) && *begun < fault.start && fault.start < *ended
    })
}

/// How many faults of `kind` hit a candidate inside one of its fenced transactions (the fault
/// began after the transaction did and before it ended), of how many there were.
pub fn inside_transactions(
    faults: &[Fault],
    transactions: &[(String, u64, u64)],
    kind: &str,
) -> (usize, usize) {
    let of_kind: Vec<&Fault> = faults.iter().filter(|f| f.kind == kind).collect();
    let hit = of_kind.iter().filter(|f| inside(f, transactions)).count();
    (hit, of_kind.len())
}

/// What the checker found.
#[derive(Debug, Default)]
pub struct Verdict {
    pub violations: Vec<String>,
    pub terms: usize,
    pub worst_recovery_ns: u64,
    pub recoveries: usize,
    /// After a pause or a partition: the longest wait from the stopped term's end to another
    /// candidate's term.
    pub worst_after_lapse_ns: u64,
    /// After a partition healed: the longest wait until the cut-off candidate's store answered
    /// again (a healthy follower), and how many heals were measured.
    pub worst_heal_ns: u64,
    pub heals: usize,
}

/// Checks the four properties. `recovery_bound_ns` is lease + retry + the stated margin.
pub fn check(record: &Record, recovery_bound_ns: u64) -> Verdict {
    let mut v = Verdict::default();
    let mut intervals = record.intervals.clone();
    for i in &mut intervals {
        if i.end == u64::MAX {
            i.end = record.end.max(i.start);
        }
    }
    intervals.sort_by_key(|i| (i.start, i.end));
    v.terms = intervals.len();

    // 1. No two candidates' believed intervals overlap.
    let mut reach: Option<&Interval> = None;
    for i in &intervals {
        if let Some(r) = reach {
            if i.start < r.end && i.candidate != r.candidate {
                v.violations.push(format!(
                    "overlap: {} (token {}) believed it led until {} but {} (token {}) led from {} ({} µs of two leaders)",
                    r.candidate, r.token, r.end, i.candidate, i.token, i.start, (r.end - i.start) / 1000
                ));
            }
        }
        if reach.is_none_or(|r| i.end > r.end) {
            reach = Some(i);
        }
    }

    // 0. Nobody's takeover ends a healthy transaction: a fenced transaction whose session the
    // server ended while its term was current counts, unless the harness itself ended
    // sessions then (a connection kill, a server restart or failover, a node fault, or the
    // candidate's own partition or pause).
    for (candidate, at) in &record.ended_live {
        let harness = record.faults.iter().any(|f| {
            let ends_sessions = f.kind == "connkill"
                || SERVER_DOWN.contains(&f.kind.as_str())
                || (matches!(f.kind.as_str(), "partition" | "pause")
                    && f.candidate.as_deref() == Some(candidate.as_str()));
            ends_sessions
                && f.start.saturating_sub(HARNESS_MARGIN_NS) <= *at
                && *at <= f.end.saturating_add(HARNESS_MARGIN_NS)
        });
        if !harness {
            v.violations.push(format!(
                "a healthy transaction was ended: {candidate}'s fenced transaction lost its \
                 session at {at} while its term was current"
            ));
        }
    }

    // 2. Tokens strictly increase from term to term and are never reused: each candidate's
    // term has a token above every earlier term's of that candidate (a term begun again on an
    // earlier term's token is one fencing cannot tell from it), no term's is below the term
    // before it, and no two candidates share one.
    let mut highest: HashMap<&str, &Interval> = HashMap::new();
    for i in &intervals {
        match highest.get(i.candidate.as_str()) {
            Some(prev) if i.token <= prev.token => v.violations.push(format!(
                "token not above an earlier term's: {} began a term with token {} at {}, after its term with token {} from {}",
                i.candidate, i.token, i.start, prev.token, prev.start
            )),
            _ => {
                highest.insert(&i.candidate, i);
            }
        }
    }
    let mut seen: HashMap<i64, &Interval> = HashMap::new();
    for pair in intervals.windows(2) {
        if pair[1].token < pair[0].token {
            v.violations.push(format!(
                "token went backwards: {} (token {}) after {} (token {})",
                pair[1].candidate, pair[1].token, pair[0].candidate, pair[0].token
            ));
        }
    }
    for i in &intervals {
        if let Some(prev) = seen.insert(i.token, i) {
            if prev.candidate != i.candidate {
                v.violations.push(format!(
                    "token {} reused: by {} and by {}",
                    i.token, prev.candidate, i.candidate
                ));
            }
        }
    }

    // 3. Ledger: tokens never go backwards in commit order, every row belongs to a term of its
    // writer, and each term's sequence numbers increase.
    let mut max_token = i64::MIN;
    let mut last_seq: BTreeMap<(String, i64), i64> = BTreeMap::new();
    for row in &record.ledger {
        if row.token < max_token {
            v.violations.push(format!(
                "stale write committed: row {} with token {} after a row with token {}",
                row.id, row.token, max_token
            ));
        }
        max_token = max_token.max(row.token);
        if !intervals
            .iter()
            .any(|i| i.token == row.token && i.candidate == row.candidate)
        {
            v.violations.push(format!(
                "row {} by {} carries token {}, which was never its term",
                row.id, row.candidate, row.token
            ));
        }
        let key = (row.candidate.clone(), row.token);
        if let Some(prev) = last_seq.insert(key, row.seq) {
            if row.seq <= prev {
                v.violations.push(format!(
                    "row {}: sequence {} after {} in one term",
                    row.id, row.seq, prev
                ));
            }
        }
    }

    if record.safety_only {
        return v;
    }

    // 4. Liveness: after each fault, another candidate leads within the bound.
    for fault in &record.faults {
        // A killed or paused candidate does not count: the paused one still believes it leads
        // until its deadline, and must be replaced, measured from when the pause began.
        let (from, other) = match fault.kind.as_str() {
            // Nobody could write while it was stopped: from the wake-up, anyone (the woken
            // one too, with a new term: its old one ended at its deadline).
            "pause" | "partition" if record.blocks_store(fault) => (fault.end, None),
            "kill" | "pause" | "partition" => (fault.start, fault.candidate.as_deref()),
            _ => (fault.end, None),
        };
        let resumed = |i: &Interval| {
            record.stalled_may_resume
                && (fault.kind == "pause" || fault.kind == "partition")
                && i.start >= fault.end
        };
        let counts = |i: &&Interval| other.is_none_or(|c| i.candidate != c || resumed(i));
        let covering = intervals
            .iter()
            .filter(counts)
            .any(|i| i.start <= from && i.end > from);
        let recovery = if covering {
            0
        } else {
            match intervals
                .iter()
                .filter(counts)
                .filter(|i| i.start >= from)
                .map(|i| i.start)
                .min()
            {
                Some(start) => start - from,
                None if record.end > from && record.end - from < recovery_bound_ns => continue, // run ended first
                None => u64::MAX,
            }
        };
        // A candidate's fault inside a server outage (a node's state transfer blocking its
        // donor, a restart): nobody can be granted while the server cannot write, so the
        // recovery counts from the end of the outages the leaderless stretch overlaps, as
        // the leaderless-stretch rule (5) does.
        let recovery = if recovery == 0 || SERVER_DOWN.contains(&fault.kind.as_str()) {
            recovery
        } else {
            let led_at = from.saturating_add(recovery);
            match record.outage_end(from, led_at) {
                Some(end) if recovery != u64::MAX => led_at.saturating_sub(end.max(from)),
                Some(end) if record.end.saturating_sub(end) < recovery_bound_ns => continue,
                _ => recovery,
            }
        };
        v.recoveries += 1;
        v.worst_recovery_ns = v.worst_recovery_ns.max(recovery);
        if recovery > recovery_bound_ns {
            v.violations.push(format!(
                "no {}leader within {} ms after {}{} {} at {}{}",
                if other.is_some() { "other " } else { "" },
                recovery_bound_ns / 1_000_000,
                fault.kind,
                other.map(|c| format!(" of {c}")).unwrap_or_default(),
                if from == fault.start {
                    "began"
                } else {
                    "ended"
                },
                from,
                if recovery == u64::MAX {
                    " (never)".to_owned()
                } else {
                    format!(" (took {} ms)", recovery / 1_000_000)
                }
            ));
        }
    }

    // 4b. From the lapse: after a pause or a partition of a leader, another candidate leads
    // within the lapse bound of the stopped term's end.
    if record.lapse_bound_ns > 0 && !record.pause_blocks_store {
        for fault in &record.faults {
            if fault.kind != "pause" && fault.kind != "partition" {
                continue;
            }
            let Some(c) = fault.candidate.as_deref() else {
                continue;
            };
            if record.blocks_store(fault) {
                continue; // measured from its end, above
            }
            let Some(term) = intervals
                .iter()
                .find(|i| i.candidate == c && i.start <= fault.start && i.end > fault.start)
            else {
                continue;
            };
            let lapse = term.end;
            let next = intervals
                .iter()
                .filter(|i| i.candidate != c && i.start >= term.start)
                .map(|i| i.start.saturating_sub(lapse))
                .min();
            let wait = match next {
                Some(wait) => wait,
                None if record.end.saturating_sub(lapse) < record.lapse_bound_ns => continue,
                None => u64::MAX,
            };
            // As in rule 4: a wait that overlaps a server outage (a Galera donor blocked by a
            // rejoining node's state transfer) counts from the outage's end.
            let wait = if wait == u64::MAX || wait <= record.lapse_bound_ns {
                wait
            } else {
                let led_at = lapse.saturating_add(wait);
                record
                    .outage_end(lapse, led_at)
                    .map_or(wait, |end| led_at.saturating_sub(end.max(lapse)))
            };
            v.worst_after_lapse_ns = v.worst_after_lapse_ns.max(wait);
            if wait > record.lapse_bound_ns {
                v.violations.push(format!(
                    "no other leader within {} ms of the end of {c}'s term {} (its {} began at {}){}",
                    record.lapse_bound_ns / 1_000_000,
                    term.token,
                    fault.kind,
                    fault.start,
                    if wait == u64::MAX {
                        " (never)".to_owned()
                    } else {
                        format!(" (took {} ms)", wait / 1_000_000)
                    }
                ));
            }
        }
    }

    // 4c. A healed candidate is a healthy follower again: after a partition ends, the cut-off
    // candidate's store answers again within the recovery bound (no connection of its pool is
    // stuck on a socket the partition left half-open).
    if !record.calls.is_empty() {
        for fault in record.faults.iter().filter(|f| f.kind == "partition") {
            let Some(c) = fault.candidate.as_deref() else {
                continue;
            };
            let healed = fault.end;
            let answered = record
                .calls
                .iter()
                .filter(|call| call.candidate == c && call.answered && call.end >= healed)
                .map(|call| call.end - healed)
                .min();
            // Killed before it answered again: nothing to measure (an answer before the kill
            // is measured as any other).
            let killed_at = record
                .faults
                .iter()
                .filter(|f| f.kind == "kill" && f.candidate.as_deref() == Some(c))
                .map(|f| f.start)
                .filter(|at| *at >= healed)
                .min();
            let wait = match answered {
                Some(wait) if killed_at.is_none_or(|k| healed + wait <= k) => wait,
                _ if killed_at.is_some_and(|k| k - healed < recovery_bound_ns) => continue,
                Some(wait) => wait,
                None if record.end.saturating_sub(healed) < recovery_bound_ns => continue,
                None => u64::MAX,
            };
            v.heals += 1;
            v.worst_heal_ns = v.worst_heal_ns.max(wait);
            if wait > recovery_bound_ns {
                v.violations.push(format!(
                    "{c}'s store did not answer within {} ms after its partition healed at {healed}{}",
                    recovery_bound_ns / 1_000_000,
                    if wait == u64::MAX {
                        " (never)".to_owned()
                    } else {
                        format!(" (took {} ms)", wait / 1_000_000)
                    }
                ));
            }
        }
    }

    // 5. No unexplained leaderless stretch: from the first term to the stop, every gap in the
    // union of believed terms is shorter than the bound, or overlaps a server fault's window.
    let quiesce = if record.quiesce == 0 {
        record.end
    } else {
        record.quiesce
    };
    if let Some(first) = intervals.first() {
        let mut covered_to = first.end;
        let mut gaps = Vec::new();
        for i in &intervals[1..] {
            if i.start > covered_to {
                gaps.push((covered_to, i.start));
            }
            covered_to = covered_to.max(i.end);
        }
        if covered_to < quiesce {
            gaps.push((covered_to, quiesce));
        }
        for (from, to) in gaps {
            let to = to.min(quiesce);
            if to <= from || to - from <= recovery_bound_ns {
                continue;
            }
            let explained = record.faults.iter().any(|f| {
                (SERVER_DOWN.contains(&f.kind.as_str())
                    || (record.pause_blocks_store && (f.kind == "pause" || f.kind == "partition")))
                    && f.start <= to
                    && from <= f.end.saturating_add(recovery_bound_ns)
            });
            if !explained {
                v.violations.push(format!(
                    "no leader for {} ms from {from} to {to}, and no server fault explains it",
                    (to - from) / 1_000_000
                ));
            }
        }
    }
    v
}
