//! The jobs configurations' checker: what the run table and the writes table say after the
//! run, against "exactly once per slot" (see `job_node.rs` for what the nodes write).
//!
//! 1. No slot was done twice: at most one record per (job, slot), and at most one row per
//!    (job, slot) in the writes table (which has no key, so a second commit would show).
//! 2. No finished slot lost its writes: every `finished` record has exactly one writes row,
//!    and its token is the record's `finished_token`.
//! 3. No write without its mark: every writes row belongs to a `finished` record (a write
//!    commits only with the slot's "finished" mark, in the same fenced transaction).
//! 4. The tokens agree: `finished_token == claimed_token`, the writes row's token is the
//!    `finished_token`, and its writer is the record's `claimed_by` (the attempt that finished
//!    is the one claimed last; with spread runs `claimed_by` is the run's hold,
//!    `<writer>/<instance>-<n>`).
//! 5. Every commit a node was told succeeded (its history's `committed` lines) is in the table:
//!    a `finished` record of that slot with that token.
//! 6. Liveness: at least one finished slot per two seconds of the run.
//! 7. Slots come from the database clock: no slot is claimed before its time by that clock,
//!    and no first attempt more than 10 s after it (two nodes run with wall clocks hours off).
//! 8. The load jobs (`job_node::LOAD_JOBS`, runs far shorter than their interval), half under
//!    `MissedSlots::RunAll`: every slot between such a job's first and last record has a
//!    record (missed slots are caught up, none skipped while one runs); half under the
//!    defaults (`RunLatest`, `Overlap::Skip`): no slot is recorded `skipped` whose previous
//!    slot's run had ended (its end recorded, by the database clock) before the slot's time:
//!    a run that returned never makes its next slot skipped (checked for the fenced job too).
//!    Their catch-up may come late, so rule 7 checks only "not before its time" for them.
//! 9. The keyed job (`job_node::KEYED_JOB`; rules 1 to 5 hold for its keys as for slots):
//!    of the submits of one key (from every node, again after a restart), at most one was
//!    answered "created"; every key a node was answered for has a record carrying that key,
//!    at the slot the answer named; and every key first submitted `KEY_DONE_WITHIN_NS` before
//!    the run's end is finished.
//! 10. The keyed job's cap (`job_node::KEYED_CAP` permits, cluster-wide): every committed key
//!     write names the permit its run held, one of the cap's; no permit term (permit, token)
//!     wrote twice; and the committed runs, timed by the database clock from their start to
//!     their transaction's last statement, never overlap more than the cap at any instant
//!     (each lies inside its permit's tenure: a run whose permit lapsed commits nothing).
//! 11. The attempt history (`check_history`): every kept attempt belongs to a record and is
//!     an earlier attempt than the record's latest, kept as it ended (`failed`, `running` for a
//!     lost one, `rerun` for one an operator marked), and a lost one kept with no end.

use std::collections::{BTreeMap, BTreeSet};

/// The keyed job's name (`job_node::KEYED_JOB`).
const KEYED_JOB: &str = "keyed";

/// The keyed job's cap (`job_node::KEYED_CAP`).
pub const KEYED_CAP: usize = 2;

/// The latest a slot's first attempt may be claimed after its time: the default policy runs
/// the latest due slot, so lateness stays under the interval plus a leader change.
const FIRST_CLAIM_WITHIN_MS: i64 = 10_000;

/// How long a submitted key may take to finish, under the faults, before the run's end.
const KEY_DONE_WITHIN_NS: u64 = 12_000_000_000;

/// One row of the run table.
#[derive(Debug, Clone)]
pub struct RunRecord {
    pub job: String,
    pub slot: i64,
    pub state: String,
    pub attempts: i32,
    pub claimed_token: Option<i64>,
    pub claimed_by: Option<String>,
    pub finished_token: Option<i64>,
    /// When the latest attempt was claimed (database clock, ms).
    pub claimed_at_ms: Option<i64>,
    /// When the latest attempt's end was recorded (database clock, ms).
    pub finished_at_ms: Option<i64>,
    /// A keyed job's key.
    pub key: Option<String>,
}

/// Whether `record`'s latest attempt was claimed by node `node`: by the node itself, or with
/// spread runs by one of its holds, `<node>/<instance>-<n>`.
fn claimed_by(record: &RunRecord, node: &str) -> bool {
    record.claimed_by.as_deref().is_some_and(|by| {
        by == node
            || by
                .strip_prefix(node)
                .is_some_and(|rest| rest.starts_with('/'))
    })
}

/// One row of the attempt history.
#[derive(Debug, Clone)]
pub struct KeptAttempt {
    pub job: String,
    pub slot: i64,
    pub attempt: i32,
    pub state: String,
    pub finished_token: Option<i64>,
}

/// Rule 11: every kept attempt is an earlier one of a record, kept as it ended. Returns how
/// many were kept.
pub fn check_history(records: &[RunRecord], kept: &[KeptAttempt], v: &mut JobVerdict) -> usize {
    let latest: BTreeMap<(&str, i64), i32> = records
        .iter()
        .map(|r| ((r.job.as_str(), r.slot), r.attempts))
        .collect();
    for k in kept {
        match latest.get(&(k.job.as_str(), k.slot)) {
            None => v.violations.push(format!(
                "history: attempt {} of {} slot {} kept without its record",
                k.attempt, k.job, k.slot
            )),
            Some(&latest) if k.attempt < 1 || k.attempt >= latest => v.violations.push(format!(
                "history: attempt {} of {} slot {} kept, but the record's latest is {latest}: \
                     a kept attempt is an earlier one",
                k.attempt, k.job, k.slot
            )),
            Some(_) => {}
        }
        match k.state.as_str() {
            "failed" | "rerun" => {}
            "running" if k.finished_token.is_none() => {}
            other => v.violations.push(format!(
                "history: attempt {} of {} slot {} kept as {other:?} (end token {:?}): an attempt \
                 is kept as it ended, failed, lost (running, no end) or marked to rerun",
                k.attempt, k.job, k.slot, k.finished_token
            )),
        }
    }
    kept.len()
}

/// One row of the writes table.
#[derive(Debug, Clone)]
pub struct WriteRow {
    pub job: String,
    pub slot: i64,
    pub token: i64,
    pub writer: String,
    /// A capped run's permit (its lease row) and that permit's token.
    pub permit: Option<(String, i64)>,
    /// The database's clock as the run started and at its transaction's last statement (ms).
    pub span_ms: Option<(i64, i64)>,
}

/// What the nodes' histories say, summed over the nodes.
#[derive(Debug, Default)]
pub struct JobHistories {
    /// Attempts whose closure started.
    pub begun: usize,
    /// `run.commit` returned Ok: (node, job, slot, token).
    pub committed: Vec<(String, String, i64, i64)>,
    /// Keys a submit was answered for: (node, key, slot, created, ns).
    pub submitted: Vec<(String, String, i64, bool, u64)>,
    /// Refused because the term was no longer current.
    pub refused: usize,
    /// Refused because the record no longer said this attempt runs.
    pub not_claimed: usize,
    /// Another error.
    pub failed: usize,
    /// Dropped before it ended (the term's work was aborted).
    pub dropped: usize,
    /// Killed inside an attempt (its history ends with the attempt open).
    pub killed_inside: usize,
    /// The attempts' fenced transactions: (node, begun, ended).
    pub transactions: Vec<(String, u64, u64)>,
    /// Terms the nodes led, by (node, token).
    pub terms: BTreeSet<(String, i64)>,
}

fn num<T: std::str::FromStr>(parts: &[&str], i: usize, line: &str) -> Result<T, String> {
    parts
        .get(i)
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("bad history line: {line:?}"))
}

impl JobHistories {
    /// Adds one node's history. `killed_at` closes an attempt the process never saw end.
    pub fn add_history(&mut self, text: &str, killed_at: Option<u64>) -> Result<(), String> {
        let mut name = String::new();
        // Attempts begun and not ended yet: (job, slot, token, attempt) -> begun.
        let mut open: BTreeMap<(String, i64, i64, u32), u64> = BTreeMap::new();
        let mut last_seen = 0u64;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let parts: Vec<&str> = line.split_whitespace().collect();
            match parts[0] {
                "start" => {
                    name = parts.get(1).ok_or("start without a name")?.to_string();
                    last_seen = num(&parts, 2, line)?;
                }
                "lead" => {
                    self.terms.insert((name.clone(), num(&parts, 1, line)?));
                    last_seen = num(&parts, 2, line)?;
                }
                "follow" | "stop" => last_seen = num(&parts, 1, line)?,
                "begin" => {
                    let key = (
                        num::<String>(&parts, 1, line)?,
                        num(&parts, 2, line)?,
                        num(&parts, 3, line)?,
                        num(&parts, 4, line)?,
                    );
                    last_seen = num(&parts, 5, line)?;
                    open.insert(key, last_seen);
                    self.begun += 1;
                }
                "submitted" => {
                    let key: String = num(&parts, 1, line)?;
                    let slot: i64 = num(&parts, 2, line)?;
                    let created: u8 = num(&parts, 3, line)?;
                    last_seen = num(&parts, 4, line)?;
                    self.submitted
                        .push((name.clone(), key, slot, created == 1, last_seen));
                }
                kind @ ("committed" | "refused" | "notclaimed" | "failed" | "dropped") => {
                    let job: String = num(&parts, 1, line)?;
                    let (slot, token): (i64, i64) = (num(&parts, 2, line)?, num(&parts, 3, line)?);
                    let attempt: u32 = num(&parts, 4, line)?;
                    last_seen = num(&parts, 5, line)?;
                    let begun: u64 = num(&parts, 6, line)?;
                    open.remove(&(job.clone(), slot, token, attempt));
                    self.transactions.push((name.clone(), begun, last_seen));
                    match kind {
                        "committed" => self.committed.push((name.clone(), job, slot, token)),
                        "refused" => self.refused += 1,
                        "notclaimed" => self.not_claimed += 1,
                        "failed" => self.failed += 1,
                        _ => self.dropped += 1,
                    }
                }
                other => return Err(format!("unknown history line kind {other:?}")),
            }
        }
        // Killed inside an attempt: its transaction was open until the kill.
        for begun in open.into_values() {
            self.killed_inside += 1;
            let end = killed_at.unwrap_or(last_seen).max(begun);
            self.transactions.push((name.clone(), begun, end));
        }
        Ok(())
    }
}

/// What the checker found.
#[derive(Debug, Default)]
pub struct JobVerdict {
    pub violations: Vec<String>,
    /// Records by state.
    pub finished: usize,
    pub skipped: usize,
    pub failed: usize,
    pub given_up: usize,
    pub running: usize,
    pub rerun: usize,
    /// Attempts beyond the first, over all records.
    pub reruns: i64,
    /// Records with more than one attempt.
    pub retried_slots: usize,
    /// The keyed job: keys submitted, answered "created", finished.
    pub keys: usize,
    pub keys_created: usize,
    pub keys_finished: usize,
    /// The most capped runs under way at one database instant (rule 10).
    pub cap_peak: usize,
    /// Slot times between the first and the last record that have no record at all (missed
    /// while nobody led: `MissedSlots::RunLatest` runs only the latest).
    pub missed: usize,
    /// The load jobs' records, and those of them that are not finished yet (failed, running).
    pub load_records: usize,
    pub load_unfinished: usize,
    /// Load slots recorded skipped (allowed where the run before still ran at their time).
    pub load_skipped: usize,
    /// The fewest finished slots the run must show.
    pub liveness_bound: usize,
    /// Finished slots whose commit no node was told succeeded (the commit's answer was lost:
    /// a killed connection, a dropped attempt, a killed node): the slot is still done once.
    pub unacknowledged: usize,
}

/// Whether load job `job` runs under `MissedSlots::RunAll` (the even ones; see
/// `job_node::LOAD_JOBS`).
pub fn run_all(job: &str) -> bool {
    job.bytes()
        .last()
        .is_some_and(|digit| digit.is_ascii_digit() && (digit - b'0').is_multiple_of(2))
}

/// Rule 7's first half: a slot claimed before its time by the database clock.
fn claimed_early(r: &RunRecord, v: &mut JobVerdict) {
    if let Some(at) = r.claimed_at_ms.filter(|at| *at < r.slot) {
        v.violations.push(format!(
            "slot {} of {} claimed {} ms before its time (database clock)",
            r.slot,
            r.job,
            r.slot - at
        ));
    }
}

/// A slot recorded skipped whose previous slot's run had ended (by the database clock) before
/// the slot's time: a run that returned never makes the next slot skipped. A skip is no
/// violation when another run of the job was under way when it was recorded (its record's
/// latest attempt claimed before the skip and ended after it): a retry of an older slot,
/// claimed again after its end could not be written (a server restart), makes the job busy,
/// and the default overlap skips a slot that comes due then.
fn false_skips(by_slot: &BTreeMap<(&str, i64), &RunRecord>, every_ms: i64, v: &mut JobVerdict) {
    for r in by_slot.values().filter(|r| r.state == "skipped") {
        let busy = r.claimed_at_ms.is_some_and(|skip_at| {
            by_slot
                .range((r.job.as_str(), i64::MIN)..=(r.job.as_str(), i64::MAX))
                .filter(|(_, o)| o.slot != r.slot && o.state != "skipped")
                .any(|(_, o)| {
                    o.claimed_at_ms.is_some_and(|at| at <= skip_at)
                        && o.finished_at_ms.is_none_or(|end| end >= skip_at)
                })
        });
        if busy {
            continue;
        }
        let before = by_slot.get(&(r.job.as_str(), r.slot - every_ms));
        if let Some(ended) = before.and_then(|b| b.finished_at_ms) {
            if ended < r.slot {
                v.violations.push(format!(
                    "slot {} of {} was skipped, though the run of the slot before had ended {} ms before its time",
                    r.slot,
                    r.job,
                    r.slot - ended
                ));
            }
        }
    }
}

/// Rule 8 for the load jobs (names starting with `prefix`, slots `every_ms` apart).
fn check_load(prefix: &str, every_ms: i64, records: &[RunRecord], v: &mut JobVerdict) {
    let mut slots: BTreeMap<&str, BTreeSet<i64>> = BTreeMap::new();
    for r in records.iter().filter(|r| r.job.starts_with(prefix)) {
        v.load_records += 1;
        if r.state != "finished" {
            v.load_unfinished += 1;
        }
        if r.state == "skipped" {
            v.load_skipped += 1;
        }
        claimed_early(r, v);
        slots.entry(&r.job).or_default().insert(r.slot);
    }
    let by_slot: BTreeMap<(&str, i64), &RunRecord> = records
        .iter()
        .filter(|r| r.job.starts_with(prefix))
        .map(|r| ((r.job.as_str(), r.slot), r))
        .collect();
    false_skips(&by_slot, every_ms, v);
    for (job, slots) in slots {
        if !run_all(job) {
            continue;
        }
        let (Some(first), Some(last)) = (slots.first(), slots.last()) else {
            continue;
        };
        let mut at = *first;
        while at < *last {
            if !slots.contains(&at) {
                v.violations.push(format!(
                    "slot {at} of {job} has no record, though its policy (RunAll) runs every slot"
                ));
            }
            at += every_ms;
        }
    }
}

/// Checks the rules above for `job`, whose slots are `every_ms` apart, and the load jobs
/// (`load`: their name prefix and interval), over a run of `duration_secs`.
pub fn check(
    (job, every_ms): (&str, i64),
    load: (&str, i64),
    records: &[RunRecord],
    writes: &[WriteRow],
    histories: &JobHistories,
    (duration_secs, end_ns): (u64, u64),
) -> JobVerdict {
    let mut v = JobVerdict {
        liveness_bound: (duration_secs / 2) as usize,
        ..JobVerdict::default()
    };
    check_load(load.0, load.1, records, &mut v);
    let records: Vec<RunRecord> = records
        .iter()
        .filter(|r| !r.job.starts_with(load.0))
        .cloned()
        .collect();
    let records = records.as_slice();
    // 1. One record per slot (the primary key's promise), and at most one write per slot.
    let mut by_slot: BTreeMap<(&str, i64), &RunRecord> = BTreeMap::new();
    for r in records {
        let keyed = r.job == KEYED_JOB;
        if r.job != job && !keyed {
            v.violations.push(format!(
                "a record of an unknown job {:?} (slot {})",
                r.job, r.slot
            ));
        }
        if by_slot.insert((&r.job, r.slot), r).is_some() {
            v.violations
                .push(format!("slot {} of {} has two records", r.slot, r.job));
        }
        match r.state.as_str() {
            "finished" if keyed => v.keys_finished += 1,
            "queued" if keyed => {}
            "finished" => v.finished += 1,
            "skipped" => v.skipped += 1,
            "failed" => v.failed += 1,
            "given_up" => v.given_up += 1,
            // Claimed (spread runs), not yet taken by a runner when the nodes stopped: open,
            // as a running one.
            "running" | "claimed" => v.running += 1,
            "rerun" => v.rerun += 1,
            other => v.violations.push(format!(
                "slot {} of {} has an unknown state {other:?}",
                r.slot, r.job
            )),
        }
        // 7. Slots come from the database clock: none is claimed before its time by it, and a
        // first attempt not long after it (a node that judged by its own skewed clock would
        // claim hours early, or run hours-old slots late).
        if keyed {
            // A key's slot is its digest, not a time.
            if r.attempts > 1 {
                v.reruns += i64::from(r.attempts - 1);
                v.retried_slots += 1;
            }
            continue;
        }
        if let Some(at) = r.claimed_at_ms {
            if r.attempts == 1 && at - r.slot > FIRST_CLAIM_WITHIN_MS {
                v.violations.push(format!(
                    "slot {} of {} first claimed {} ms after its time (database clock)",
                    r.slot,
                    r.job,
                    at - r.slot
                ));
            }
        }
        claimed_early(r, &mut v);
        if r.attempts > 1 {
            v.reruns += i64::from(r.attempts - 1);
            v.retried_slots += 1;
        }
    }
    false_skips(&by_slot, every_ms, &mut v);
    let mut written: BTreeMap<(&str, i64), Vec<&WriteRow>> = BTreeMap::new();
    for w in writes {
        written.entry((&w.job, w.slot)).or_default().push(w);
    }
    for ((job, slot), rows) in &written {
        if rows.len() > 1 {
            let by: Vec<String> = rows
                .iter()
                .map(|w| format!("token {} by {}", w.token, w.writer))
                .collect();
            v.violations.push(format!(
                "slot {slot} of {job} written {} times: {}",
                rows.len(),
                by.join(", ")
            ));
        }
        // 3. A write only with its slot's mark.
        match by_slot.get(&(*job, *slot)) {
            None => v.violations.push(format!(
                "slot {slot} of {job} written (token {} by {}) without any record",
                rows[0].token, rows[0].writer
            )),
            Some(r) if r.state != "finished" => v.violations.push(format!(
                "slot {slot} of {job} written (token {} by {}) but its record is {:?} (attempts {}, claimed by token {:?})",
                rows[0].token, rows[0].writer, r.state, r.attempts, r.claimed_token
            )),
            Some(_) => {}
        }
    }
    // 2 and 4. Every finished slot has exactly its one write, with its tokens.
    for r in records.iter().filter(|r| r.state == "finished") {
        let slot = r.slot;
        let Some(finished) = r.finished_token else {
            v.violations
                .push(format!("slot {slot} is finished without a finished_token"));
            continue;
        };
        if let Some(claimed) = r.claimed_token {
            // Only the attempt that holds the claim may finish it, with that claim's term.
            if finished != claimed {
                v.violations.push(format!(
                    "slot {slot} finished by token {finished}, but its claim is token {claimed}"
                ));
            }
        } else {
            v.violations
                .push(format!("slot {slot} is finished without a claimed_token"));
        }
        let rows = written
            .get(&(r.job.as_str(), slot))
            .map(Vec::as_slice)
            .unwrap_or_default();
        match rows {
            [] => v.violations.push(format!(
                "slot {slot} is finished (token {finished}) but its write is missing"
            )),
            [w] => {
                if w.token != finished {
                    v.violations.push(format!(
                        "slot {slot} finished by token {finished}, but its write has token {} (by {})",
                        w.token, w.writer
                    ));
                }
                if !claimed_by(r, &w.writer) {
                    v.violations.push(format!(
                        "slot {slot} was last claimed by {:?}, but written by {}",
                        r.claimed_by, w.writer
                    ));
                }
            }
            // Already reported as written twice.
            _ => {}
        }
    }
    // 5. Every acknowledged commit is there.
    for (node, job, slot, token) in &histories.committed {
        match by_slot.get(&(job.as_str(), *slot)) {
            // By that node, too (with spread runs the record names the run's hold,
            // `<node>/...`, and permits of one semaphore may share a token).
            Some(r)
                if r.state == "finished"
                    && r.finished_token == Some(*token)
                    && claimed_by(r, node) => {}
            Some(r) => v.violations.push(format!(
                "{node} was told slot {slot} committed with token {token}, but its record is {:?} with finished_token {:?} by {:?}",
                r.state, r.finished_token, r.claimed_by
            )),
            None => v.violations.push(format!(
                "{node} was told slot {slot} committed with token {token}, but it has no record"
            )),
        }
    }
    let acknowledged: BTreeSet<(i64, i64)> = histories
        .committed
        .iter()
        .map(|(_, _, slot, token)| (*slot, *token))
        .collect();
    v.unacknowledged = records
        .iter()
        .filter(|r| r.state == "finished")
        .filter(|r| {
            r.finished_token
                .is_none_or(|token| !acknowledged.contains(&(r.slot, token)))
        })
        .count();
    // Slot times without a record between the first and the last one.
    let slots: Vec<i64> = records
        .iter()
        .filter(|r| r.job == job)
        .map(|r| r.slot)
        .collect();
    if let (Some(first), Some(last)) = (slots.iter().min(), slots.iter().max()) {
        if every_ms > 0 {
            let span = ((last - first) / every_ms + 1) as usize;
            v.missed = span.saturating_sub(slots.len());
        }
    }
    check_keys(&by_slot, histories, end_ns, &mut v);
    check_cap(writes, KEYED_CAP, &mut v);
    // 6. Liveness.
    if v.finished < v.liveness_bound {
        v.violations.push(format!(
            "only {} slots finished in {duration_secs} s (at least {} expected)",
            v.finished, v.liveness_bound
        ));
    }
    v
}

/// Rule 9: the keyed job's submits against its records.
fn check_keys(
    by_slot: &BTreeMap<(&str, i64), &RunRecord>,
    histories: &JobHistories,
    end_ns: u64,
    v: &mut JobVerdict,
) {
    // Per key: how many submits were answered "created", the slots answered, the first submit.
    let mut keys: BTreeMap<&str, (usize, BTreeSet<i64>, u64)> = BTreeMap::new();
    for (_, key, slot, created, at) in &histories.submitted {
        let entry = keys.entry(key).or_insert((0, BTreeSet::new(), *at));
        entry.0 += usize::from(*created);
        entry.1.insert(*slot);
        entry.2 = entry.2.min(*at);
    }
    v.keys = keys.len();
    for (key, (created, slots, first)) in &keys {
        v.keys_created += created.min(&1);
        if *created > 1 {
            v.violations.push(format!(
                "key {key} was answered \"created\" {created} times"
            ));
        }
        if slots.len() > 1 {
            v.violations
                .push(format!("key {key} was answered with slots {slots:?}"));
        }
        for slot in slots {
            match by_slot.get(&(KEYED_JOB, *slot)) {
                None => v.violations.push(format!(
                    "key {key} was answered with slot {slot}, which has no record"
                )),
                Some(r) if r.key.as_deref() != Some(*key) => v.violations.push(format!(
                    "key {key}'s slot {slot} records the key {:?}",
                    r.key
                )),
                Some(r) => {
                    if r.state != "finished" && first.saturating_add(KEY_DONE_WITHIN_NS) < end_ns {
                        v.violations.push(format!(
                            "key {key}, first submitted {} ms before the end, is {:?} (attempts {})",
                            (end_ns - first) / 1_000_000,
                            r.state,
                            r.attempts
                        ));
                    }
                }
            }
        }
    }
}

/// Rule 10: the keyed job's committed writes against its cap of `cap` permits.
pub fn check_cap(writes: &[WriteRow], cap: usize, v: &mut JobVerdict) {
    let mut terms: BTreeMap<(&str, i64), i64> = BTreeMap::new();
    // (time, +1 opens / -1 closes); at one instant closes count first (a span is [begun, ended)).
    let mut events: Vec<(i64, i32)> = Vec::new();
    for w in writes.iter().filter(|w| w.job == KEYED_JOB) {
        let Some((permit, token)) = &w.permit else {
            v.violations.push(format!(
                "cap: slot {} of the keyed job was written (token {} by {}) without a permit",
                w.slot, w.token, w.writer
            ));
            continue;
        };
        let index = permit
            .rsplit_once('#')
            .and_then(|(_, n)| n.parse::<usize>().ok());
        if index.is_none_or(|n| n >= cap) {
            v.violations.push(format!(
                "cap: slot {} of the keyed job was written under {permit}, not one of the cap's {cap} permits",
                w.slot
            ));
        }
        if let Some(other) = terms.insert((permit, *token), w.slot) {
            v.violations.push(format!(
                "cap: {permit} token {token} wrote slots {other} and {} of the keyed job: one permit term, two runs",
                w.slot
            ));
        }
        match w.span_ms {
            Some((begun, ended)) if begun <= ended => {
                events.push((begun, 1));
                events.push((ended, -1));
            }
            other => v.violations.push(format!(
                "cap: slot {} of the keyed job has no database span ({other:?})",
                w.slot
            )),
        }
    }
    events.sort_unstable();
    let mut open = 0i64;
    for (at, step) in events {
        open += i64::from(step);
        let now = usize::try_from(open).unwrap_or(0);
        if now > v.cap_peak {
            v.cap_peak = now;
            if now > cap {
                v.violations.push(format!(
                    "cap: {now} capped runs under way at {at} ms (database clock), over the cap of {cap}"
                ));
            }
        }
    }
}
