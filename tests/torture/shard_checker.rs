//! The torture checker per resource, for the shard-set configurations: the nodes' histories
//! (`shard_node.rs`) and the ledger are split by resource, and each resource's record goes
//! through the single-resource checker (`checker.rs`): no two nodes' believed leadership of a
//! resource overlaps, its tokens strictly increase, its ledger rows are in token order and
//! belong to terms their writers held, it has a leader again within the bound after every fault
//! and is never leaderless longer than that unless a server fault explains it.
//!
//! A node believes in a term from the moment it published it (its watcher or the term's work
//! saw it, whichever first) until it saw the term end, or its local deadline if that came first,
//! or the SIGKILL; and the term's work counts too: a term is held until its work returned (or
//! was dropped), capped by the deadline the term had then. Work of a handed-over resource that
//! runs on while another node already leads it is an overlap.
//!
//! Then two figures: **recovery**, how long each resource a killed node led went without a
//! leader (from the SIGKILL to another node's term), and **fairness**, the most and fewest
//! resources a live node led at steady points (no membership change or fault for a while),
//! against `ceil(N / M) + slack` for `M` live nodes.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};

use crate::checker::{self, Fault, Interval, LedgerRow, Record};

/// One node process, from its history.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub name: String,
    /// Its `start` line.
    pub start: u64,
    /// Its `stop` line or its SIGKILL (`u64::MAX`: neither).
    pub end: u64,
    /// Its view of the membership as it changed: (when, how many live members it saw).
    pub views: Vec<(u64, usize)>,
}

/// What the nodes and the ledger recorded, split by resource.
#[derive(Debug, Default)]
pub struct ShardRecord {
    /// Per resource, the record the single-resource checker judges.
    pub resources: BTreeMap<String, Record>,
    pub nodes: Vec<Node>,
    pub faults: Vec<Fault>,
    pub writes_committed: u64,
    pub writes_refused: u64,
    pub writes_aborted: u64,
    pub writes_failed: u64,
    /// As in [`Record`].
    pub end: u64,
    pub quiesce: u64,
    pub pause_blocks_store: bool,
    /// The nodes' fenced ledger transactions: (node, begun, ended).
    pub transactions: Vec<(String, u64, u64)>,
    /// Safety only (no liveness, rejoin or fairness checks): the lock configurations.
    pub safety_only: bool,
    /// A reader-writer lock's write holds, from the `rwwrite` lines.
    pub rw_writes: Vec<RwWrite>,
}

/// A write hold of a reader-writer lock as its client recorded it when it began.
#[derive(Debug, Clone, PartialEq)]
pub struct RwWrite {
    pub candidate: String,
    pub token: i64,
    pub at: u64,
    /// The read slots' rows it held, with their tokens.
    pub slots: Vec<(String, i64)>,
}

/// A term while its node's history is read.
#[derive(Debug)]
struct Open {
    resource: String,
    token: i64,
    start: u64,
    lost: Option<u64>,
    work: bool,
    done: Option<u64>,
}

fn num(parts: &[&str], i: usize, line: &str) -> Result<u64, String> {
    parts
        .get(i)
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("bad history line: {line:?}"))
}

fn word<'a>(parts: &[&'a str], i: usize, line: &str) -> Result<&'a str, String> {
    parts
        .get(i)
        .copied()
        .ok_or_else(|| format!("bad history line: {line:?}"))
}

impl ShardRecord {
    /// An empty record over `resources` (each gets its record even if nobody ever led it).
    pub fn new(resources: &[String]) -> Self {
        Self {
            resources: resources
                .iter()
                .map(|r| (r.clone(), Record::default()))
                .collect(),
            ..Self::default()
        }
    }

    fn resource(&mut self, name: &str) -> Result<&mut Record, String> {
        self.resources
            .get_mut(name)
            .ok_or_else(|| format!("unknown resource {name:?}"))
    }

    /// Adds one node's history. `killed_at` ends whatever the process never saw end.
    pub fn add_history(&mut self, text: &str, killed_at: Option<u64>) -> Result<(), String> {
        let mut node = Node {
            name: String::new(),
            start: 0,
            end: killed_at.unwrap_or(u64::MAX),
            views: Vec::new(),
        };
        let mut terms: BTreeMap<u64, Open> = BTreeMap::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let parts: Vec<&str> = line.split_whitespace().collect();
            match parts[0] {
                "start" => {
                    node.name = word(&parts, 1, line)?.to_owned();
                    node.start = num(&parts, 2, line)?;
                }
                "lead" => {
                    let id = num(&parts, 4, line)?;
                    terms.insert(
                        id,
                        Open {
                            resource: word(&parts, 1, line)?.to_owned(),
                            token: num(&parts, 2, line)? as i64,
                            start: num(&parts, 3, line)?,
                            lost: None,
                            work: false,
                            done: None,
                        },
                    );
                }
                "work" | "lost" | "done" => {
                    let id = num(&parts, parts.len() - 1, line)?;
                    let term = terms
                        .get_mut(&id)
                        .ok_or_else(|| format!("{}: {line:?} before its lead", node.name))?;
                    if term.resource != word(&parts, 1, line)?
                        || term.token != num(&parts, 2, line)? as i64
                    {
                        return Err(format!("{}: {line:?} names another term", node.name));
                    }
                    match parts[0] {
                        "work" => term.work = true,
                        kind => {
                            // Believed until seen ending, or its deadline if that came first.
                            let at = num(&parts, 3, line)?;
                            let deadline = num(&parts, 4, line)?;
                            let end = at.min(deadline).max(term.start);
                            if kind == "lost" {
                                term.lost = Some(end);
                            } else {
                                term.done = Some(end);
                            }
                        }
                    }
                }
                "dropped" => {
                    let ended = num(&parts, 3, line)?;
                    let begun = num(&parts, 4, line)?;
                    self.transactions.push((node.name.clone(), begun, ended));
                }
                "write" | "refused" | "aborted" | "failed" => {
                    let at = if parts[0] == "write" { 4 } else { 3 };
                    match parts[0] {
                        "write" => self.writes_committed += 1,
                        "refused" => self.writes_refused += 1,
                        "aborted" => self.writes_aborted += 1,
                        _ => self.writes_failed += 1,
                    }
                    if parts.len() > at + 1 {
                        let ended = num(&parts, at, line)?;
                        let begun = num(&parts, at + 1, line)?;
                        self.transactions.push((node.name.clone(), begun, ended));
                    }
                }
                "rwwrite" => {
                    let mut slots = Vec::new();
                    for part in &parts[3..] {
                        let (resource, token) = part
                            .rsplit_once('=')
                            .and_then(|(r, t)| Some((r.to_owned(), t.parse().ok()?)))
                            .ok_or_else(|| format!("bad history line: {line:?}"))?;
                        slots.push((resource, token));
                    }
                    self.rw_writes.push(RwWrite {
                        candidate: node.name.clone(),
                        token: num(&parts, 1, line)? as i64,
                        at: num(&parts, 2, line)?,
                        slots,
                    });
                }
                "stop" => node.end = node.end.min(num(&parts, 1, line)?),
                "assign" => {
                    let members = num(&parts, 3, line)? as usize;
                    if node.views.last().is_none_or(|(_, m)| *m != members) {
                        node.views.push((num(&parts, 1, line)?, members));
                    }
                }
                other => return Err(format!("unknown history line kind {other:?}")),
            }
        }
        for term in terms.into_values() {
            // Held while believed or while its work ran; what never ended ends at the kill, or
            // stays open to the end of the run.
            let believed = term.lost.or(killed_at).unwrap_or(u64::MAX);
            let worked = match (term.work, term.done) {
                (false, _) => 0,
                (true, Some(done)) => done,
                (true, None) => killed_at.unwrap_or(u64::MAX),
            };
            let end = believed.max(worked).max(term.start);
            self.resource(&term.resource)?.intervals.push(Interval {
                candidate: node.name.clone(),
                token: term.token,
                start: term.start,
                end,
            });
        }
        self.nodes.push(node);
        Ok(())
    }

    /// Adds a committed ledger row of `resource` (rows in commit order).
    pub fn add_ledger_row(&mut self, resource: &str, row: LedgerRow) -> Result<(), String> {
        self.resource(resource)?.ledger.push(row);
        Ok(())
    }

    /// Gives every resource's record the run's faults and times.
    fn finish(&mut self) {
        for record in self.resources.values_mut() {
            record.faults = self.faults.clone();
            record.end = self.end;
            record.quiesce = self.quiesce;
            record.pause_blocks_store = self.pause_blocks_store;
            record.stalled_may_resume = true;
            record.safety_only = self.safety_only;
        }
    }
}

/// What the checker found, over every resource.
#[derive(Debug, Default)]
pub struct ShardVerdict {
    /// Each prefixed with its resource.
    pub violations: Vec<String>,
    /// Resources with at least one violation.
    pub failed_resources: usize,
    /// Believed terms, all resources.
    pub terms: usize,
    /// Resources that were led at all.
    pub led_resources: usize,
    /// The slowest recovery after any fault, over all resources (as in the single check).
    pub worst_recovery_ns: u64,
    pub recoveries: usize,
    /// The same per fault kind: the slowest recovery after a fault of that kind.
    pub recovery_by_kind: BTreeMap<String, u64>,
    pub kills: KillRecovery,
    pub pauses: KillRecovery,
    pub partitions: KillRecovery,
    /// After each partition of a node: how long from the heal until the node led a resource
    /// again (a member in good standing, its store answering).
    pub rejoins: Rejoins,
    pub fairness: Fairness,
    /// The most terms believed at one moment, over all resources (a semaphore's permits:
    /// never more than N).
    pub most_at_once: usize,
}

/// Heal-to-leading-again figures of partitioned nodes.
#[derive(Debug, Default, Clone)]
pub struct Rejoins {
    pub heals: usize,
    /// The longest (ns); `u64::MAX` if a node never led again.
    pub worst_ns: u64,
}

/// How long the resources a node held when it was killed (or paused) went without another
/// node leading them.
#[derive(Debug, Default, Clone)]
pub struct KillRecovery {
    /// Faults of the kind that hit a node holding resources.
    pub faults: usize,
    /// Resources the node held at the fault, summed over the faults.
    pub resources: usize,
    /// The longest such wait (ns); `u64::MAX` if one was never led again.
    pub worst_ns: u64,
    /// Its median.
    pub median_ns: u64,
}

/// Resources per live node at steady points.
#[derive(Debug, Default, Clone)]
pub struct Fairness {
    /// Steady points sampled (every 100 ms of steady time).
    pub samples: usize,
    /// Live nodes at those points (the fewest and most seen).
    pub nodes_min: usize,
    pub nodes_max: usize,
    /// The fewest and most resources one live node led at a steady point.
    pub min: usize,
    pub max: usize,
    /// `ceil(N / M) + slack` at the point where `max` was seen.
    pub bound: usize,
    /// Steady points at which every resource was led.
    pub all_led: usize,
    /// Steady points at which a live node led more than its bound.
    pub over: Vec<String>,
}

/// Checks every resource, then measures recovery and fairness. `settle_ns`: how long after a
/// membership change or a fault a point counts as steady; `slack` the shard set's.
pub fn check(
    record: &mut ShardRecord,
    recovery_bound_ns: u64,
    settle_ns: u64,
    slack: usize,
) -> ShardVerdict {
    record.finish();
    let mut v = ShardVerdict::default();
    for (resource, r) in &record.resources {
        let verdict = checker::check(r, recovery_bound_ns);
        v.terms += verdict.terms;
        v.led_resources += usize::from(verdict.terms > 0);
        v.recoveries += verdict.recoveries;
        v.worst_recovery_ns = v.worst_recovery_ns.max(verdict.worst_recovery_ns);
        if !verdict.violations.is_empty() {
            v.failed_resources += 1;
        }
        v.violations.extend(
            verdict
                .violations
                .into_iter()
                .map(|m| format!("{resource}: {m}")),
        );
    }
    // The recovery figure per fault kind: each resource checked against that kind's faults
    // alone (only the figure is read; the violations are the full check's above).
    let mut kinds: Vec<String> = record.faults.iter().map(|f| f.kind.clone()).collect();
    kinds.sort();
    kinds.dedup();
    for kind in kinds {
        let mut worst = 0;
        for r in record.resources.values() {
            let alone = Record {
                intervals: r.intervals.clone(),
                faults: r
                    .faults
                    .iter()
                    .filter(|f| f.kind == kind)
                    .cloned()
                    .collect(),
                end: r.end,
                quiesce: r.quiesce,
                pause_blocks_store: r.pause_blocks_store,
                stalled_may_resume: r.stalled_may_resume,
                ..Record::default()
            };
            worst = worst.max(checker::check(&alone, recovery_bound_ns).worst_recovery_ns);
        }
        v.recovery_by_kind.insert(kind, worst);
    }
    v.most_at_once = most_at_once(record);
    v.kills = takeovers(record, "kill", recovery_bound_ns);
    v.pauses = takeovers(record, "pause", recovery_bound_ns);
    v.partitions = takeovers(record, "partition", recovery_bound_ns);
    if record.safety_only {
        return v;
    }
    v.rejoins = rejoins(record, REJOIN_BOUND_NS);
    if v.rejoins.worst_ns > REJOIN_BOUND_NS {
        v.violations.push(format!(
            "a partitioned node did not lead a shard within {} ms of the heal (took {})",
            REJOIN_BOUND_NS / 1_000_000,
            if v.rejoins.worst_ns == u64::MAX {
                "never".to_owned()
            } else {
                format!("{} ms", v.rejoins.worst_ns / 1_000_000)
            }
        ));
    }
    v.fairness = fairness(record, settle_ns, slack);
    for over in &v.fairness.over {
        v.violations.push(format!("fairness: {over}"));
    }
    v
}

/// A healed node leads again this soon: its heartbeat and its store answer again, the others
/// see it and hand it its share (a round, their grace period, its acquire), on a loaded
/// 2-core machine. What it must never be is stuck out for good.
pub const REJOIN_BOUND_NS: u64 = 5_000_000_000;

/// After each partition of a node that lives on: heal to its first term on any resource.
fn rejoins(record: &ShardRecord, bound_ns: u64) -> Rejoins {
    let mut out = Rejoins::default();
    for fault in record.faults.iter().filter(|f| f.kind == "partition") {
        let Some(node) = fault.candidate.as_deref() else {
            continue;
        };
        let healed = fault.end;
        let died = record
            .nodes
            .iter()
            .find(|n| n.name == node)
            .map_or(u64::MAX, |n| n.end);
        let next = record
            .resources
            .values()
            .flat_map(|r| closed(record, r))
            .filter(|i| i.candidate == node && i.start >= healed)
            .map(|i| i.start - healed)
            .min();
        let wait = match next {
            Some(wait) => wait,
            // Killed, stopped, or the run ended before it could: no figure.
            None if died.min(record.quiesce).saturating_sub(healed) < bound_ns => continue,
            None => u64::MAX,
        };
        out.heals += 1;
        out.worst_ns = out.worst_ns.max(wait);
    }
    out
}

/// The most believed terms at one moment, over every resource (a sweep over their starts and
/// ends; an end at the same instant as a start comes first).
fn most_at_once(record: &ShardRecord) -> usize {
    let mut edges: Vec<(u64, i32)> = record
        .resources
        .values()
        .flat_map(|r| closed(record, r))
        .flat_map(|i| [(i.start, 1), (i.end, -1)])
        .collect();
    edges.sort_unstable();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    usize::try_from(most).unwrap_or(0)
}

/// The intervals of every resource, closed at the end of the run.
fn closed(record: &ShardRecord, r: &Record) -> Vec<Interval> {
    r.intervals
        .iter()
        .cloned()
        .map(|mut i| {
            if i.end == u64::MAX {
                i.end = record.end.max(i.start);
            }
            i
        })
        .collect()
}

/// After each fault of `kind` (a kill or a pause of one node): for every resource that node
/// held at that instant, the time until another node led it (or, after a pause, a new term of
/// the woken node itself).
fn takeovers(record: &ShardRecord, kind: &str, bound_ns: u64) -> KillRecovery {
    let mut waits = Vec::new();
    let mut faults = 0;
    for fault in record.faults.iter().filter(|f| f.kind == kind) {
        let Some(node) = fault.candidate.as_deref() else {
            continue;
        };
        let at = fault.start;
        let mut hit = false;
        for r in record.resources.values() {
            let intervals = closed(record, r);
            let held = intervals
                .iter()
                .any(|i| i.candidate == node && i.start <= at && i.end >= at);
            if !held {
                continue;
            }
            hit = true;
            let next = intervals
                .iter()
                .filter(|i| (i.candidate != node || i.start >= fault.end) && i.end > at)
                .map(|i| i.start.saturating_sub(at))
                .min();
            match next {
                Some(wait) => waits.push(wait),
                // The run ended before anyone took it: no figure.
                None if record.quiesce.saturating_sub(at) < bound_ns => {}
                None => waits.push(u64::MAX),
            }
        }
        faults += usize::from(hit);
    }
    waits.sort_unstable();
    KillRecovery {
        faults,
        resources: waits.len(),
        worst_ns: waits.last().copied().unwrap_or(0),
        median_ns: waits.get(waits.len() / 2).copied().unwrap_or(0),
    }
}

/// Resources per live node at steady points: every 100 ms from the first node's start to the
/// quiesce, the points at least `settle_ns` after the last node start, kill, stop, pause (its
/// start and its end), server fault and change of a node's view of the members, at which every
/// live node sees as many members as there are live nodes. (A node whose round came too late,
/// on a loaded machine, drops out of the others' view for a moment: not a steady point.)
fn fairness(record: &ShardRecord, settle_ns: u64, slack: usize) -> Fairness {
    let n = record.resources.len();
    let mut events: Vec<u64> = Vec::new();
    for node in &record.nodes {
        events.push(node.start);
        if node.end != u64::MAX {
            events.push(node.end);
        }
        events.extend(node.views.iter().map(|(at, _)| *at));
    }
    for f in &record.faults {
        events.push(f.start);
        events.push(f.end);
    }
    events.sort_unstable();
    let paused = |name: &str, t: u64| {
        record.faults.iter().any(|f| {
            (f.kind == "pause" || f.kind == "partition")
                && f.candidate.as_deref() == Some(name)
                && f.start <= t
                && t < f.end
        })
    };
    // Per node, its intervals of every resource.
    let mut held: HashMap<String, Vec<(u64, u64, &str)>> = HashMap::new();
    for (resource, r) in &record.resources {
        for i in closed(record, r) {
            held.entry(i.candidate)
                .or_default()
                .push((i.start, i.end, resource.as_str()));
        }
    }
    let mut out = Fairness {
        min: usize::MAX,
        nodes_min: usize::MAX,
        ..Fairness::default()
    };
    let Some(first) = record.nodes.iter().map(|n| n.start).min() else {
        return Fairness::default();
    };
    let step = 100_000_000;
    let mut t = first + settle_ns;
    while t < record.quiesce {
        let last_event = events.iter().rev().find(|e| **e <= t).copied().unwrap_or(0);
        if t - last_event < settle_ns {
            t += step;
            continue;
        }
        let live: Vec<&Node> = record
            .nodes
            .iter()
            .filter(|node| node.start <= t && t < node.end && !paused(&node.name, t))
            .collect();
        if live.is_empty() {
            t += step;
            continue;
        }
        let m = live.len();
        let agreed = live.iter().all(|node| {
            node.views
                .iter()
                .rev()
                .find(|(at, _)| *at <= t)
                .is_some_and(|(_, seen)| *seen == m)
        });
        if !agreed {
            t += step;
            continue;
        }
        let bound = n.div_ceil(m) + slack;
        let mut led_by_any = std::collections::HashSet::new();
        for node in &live {
            let mine: std::collections::HashSet<&str> = held
                .get(node.name.as_str())
                .into_iter()
                .flatten()
                .filter(|(s, e, _)| *s <= t && t < *e)
                .map(|(_, _, r)| *r)
                .collect();
            let count = mine.len();
            led_by_any.extend(mine);
            out.min = out.min.min(count);
            if count > out.max {
                out.max = count;
                out.bound = bound;
            }
            if count > bound {
                out.over.push(format!(
                    "{} led {count} resources at {t}, a steady point with {m} live nodes (bound ceil({n}/{m}) + {slack} = {bound})",
                    node.name
                ));
            }
        }
        out.samples += 1;
        out.nodes_min = out.nodes_min.min(m);
        out.nodes_max = out.nodes_max.max(m);
        out.all_led += usize::from(led_by_any.len() == n);
        t += step;
    }
    if out.samples == 0 {
        out.min = 0;
        out.nodes_min = 0;
    }
    out
}

/// The reader-writer rule over a run's write holds (the rows' own rules, one holder per slot
/// at a time, are the per-resource check's): each write hold held every read slot, each under
/// a term its client believed in when the hold began, its token is the highest of theirs, and
/// it exceeds the token of every hold of any slot that began before it, and every earlier
/// write hold's. With one holder per slot, a writer holding all of them excludes every reader.
pub fn check_rw(record: &ShardRecord) -> Vec<String> {
    let mut v = Vec::new();
    let slots: Vec<&String> = record.resources.keys().collect();
    let mut writes: Vec<&RwWrite> = record.rw_writes.iter().collect();
    writes.sort_by_key(|w| w.at);
    let mut last: Option<&RwWrite> = None;
    for w in writes {
        let mut held: Vec<&String> = w.slots.iter().map(|(r, _)| r).collect();
        held.sort();
        held.dedup();
        if held != slots {
            v.push(format!(
                "write hold of {} (token {}) at {} held the slots {held:?}, not all of {slots:?}",
                w.candidate, w.token, w.at
            ));
        }
        let highest = w.slots.iter().map(|(_, t)| *t).max();
        if highest != Some(w.token) {
            v.push(format!(
                "write hold of {} at {}: token {}, but its slots' highest is {highest:?}",
                w.candidate, w.at, w.token
            ));
        }
        for (resource, token) in &w.slots {
            let Some(rec) = record.resources.get(resource) else {
                continue;
            };
            let believed = rec.intervals.iter().any(|i| {
                i.candidate == w.candidate && i.token == *token && i.start <= w.at && w.at < i.end
            });
            if !believed {
                v.push(format!(
                    "write hold of {} (token {}) at {}: no believed term of {resource} with token {token} then",
                    w.candidate, w.token, w.at
                ));
            }
        }
        for (resource, rec) in &record.resources {
            let own = w.slots.iter().find(|(r, _)| r == resource).map(|(_, t)| *t);
            for i in rec.intervals.iter().filter(|i| i.start < w.at) {
                let ours = i.candidate == w.candidate && Some(i.token) == own;
                if !ours && i.token >= w.token {
                    v.push(format!(
                        "write hold of {} at {}: token {} not above {}'s earlier hold of {resource} (token {}, from {})",
                        w.candidate, w.at, w.token, i.candidate, i.token, i.start
                    ));
                }
            }
        }
        if let Some(prev) = last.filter(|p| w.token <= p.token) {
            v.push(format!(
                "write hold of {} at {} (token {}) not above the earlier write hold of {} at {} (token {})",
                w.candidate, w.at, w.token, prev.candidate, prev.at, prev.token
            ));
        }
        last = Some(w);
    }
    v
}
