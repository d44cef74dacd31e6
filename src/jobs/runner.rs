//! The leader's loop: read the database clock and the run table, plan every job
//! (`plan::plan`), claim what starts in one fenced transaction, run each claimed slot in its
//! own task, and sleep until the next slot, retry or poll.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sea_orm::{ConnectionTrait, DbBackend};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::plan::{self, Action, Open, Policy, State, View};
use super::records::{self, Claimant};
use super::run::{begin_fenced, JobRun, RunState};
use super::staleness::Freshness;
use super::{Job, JobError};
use crate::locks::LockGuard;
use crate::mutex::lock;
use crate::{backend::SeaOrmLeaseStore, hold::LeaderTerm};

pub(crate) mod attempt;
use attempt::{start, Launch};

/// What every term's loop shares.
pub(crate) struct Shared {
    pub store: SeaOrmLeaseStore,
    pub table: Arc<str>,
    /// The run table's attempt history (`CreateJobAttemptTable`).
    pub attempts_table: Arc<str>,
    pub poll: Duration,
    /// How long a look's claim transaction may go on adding records and updates (see `claim`).
    pub claim_budget: Duration,
    /// How long ended slots' records are kept (ms after their slot), if not forever.
    pub keep_finished_ms: Option<i64>,
    pub jobs: Vec<Registered>,
    /// Why the leader's last look failed, while it does (cleared by the next good one).
    pub problem: Mutex<Option<String>>,
    /// The job set as published in the lease's payload.
    pub job_set: String,
    /// Another job set's leader, while one leads (see `compare_job_sets`).
    pub other_job_set: Mutex<Option<String>>,
    /// Each job's time since its last finished slot, while this node leads.
    pub freshness: Freshness,
    /// Wakes the leader's loop: a key was submitted on this node.
    pub wake: tokio::sync::Notify,
    /// With spread runs ([`JobsBuilder::spread_runs`](super::JobsBuilder::spread_runs)): how
    /// many runs this node's runner runs at once at most.
    pub spread: Option<usize>,
    /// Wakes this node's runner: this node's leader claimed attempts.
    pub runner_wake: tokio::sync::Notify,
    /// Why this node's runner's last look failed, while it does.
    pub runner_problem: Mutex<Option<String>>,
    /// While this node leads: the claimed starts no runner has taken for too long.
    pub waiting: Mutex<Option<super::WaitingStarts>>,
    /// Set by `abort`: the runs' permits and holds lapse instead of being released.
    pub aborted: AtomicBool,
}

/// A job as the scheduler keeps it.
pub(crate) struct Registered {
    pub job: Job,
    pub name: Arc<str>,
    pub schedule_text: String,
    pub policy: Policy,
    /// The semaphore whose permits a capped job's runs hold ([`Job::cap`]).
    pub cap: Option<crate::locks::Semaphore>,
    /// With spread runs: the semaphore whose permits are the job's run holds (one per run
    /// the job may have at once), each run's term.
    pub run_hold: Option<crate::locks::Semaphore>,
    /// The name of the job's run semaphore (`<resource>/run/<job>`), whether or not this node
    /// spreads (another node may), when its every permit's name is a valid resource.
    pub run_semaphore: Option<String>,
}

impl Registered {
    pub(crate) fn new(job: Job, policy: Policy) -> Self {
        Self {
            name: job.name.as_str().into(),
            schedule_text: job.schedule.describe(),
            job,
            policy,
            cap: None,
            run_hold: None,
            run_semaphore: None,
        }
    }
}

/// After a failed read or claim, the next look.
const AFTER_ERROR: Duration = Duration::from_millis(500);
/// The shortest sleep between two looks when nothing could start (no busy loop).
const MIN_SLEEP: Duration = Duration::from_millis(5);
/// The longest wait before a look asks again for a cap's permit that none was free of.
const CAP_RETRY: Duration = Duration::from_millis(500);
/// The most claims one look decides. They go in one fenced transaction, which holds the lease
/// row (on SQLite the write lock) while the leader's own renews wait for it, so the claim
/// budget bounds it too: what the budget leaves out waits for the next look.
const MAX_CLAIMS_PER_LOOK: usize = 10_000;
/// The most new records one `INSERT` adds (seven parameters each, well within every
/// backend's limit of parameters per statement); the budget is checked between them.
const ROWS_PER_INSERT: usize = 500;

/// What this term runs, per job: the slots whose closure runs (overlap is judged by them),
/// and the slots with an attempt here whose end may not be written yet (never reclaimed);
/// the attempts' tasks, and the channel on which each says its closure returned.
struct Here {
    running: Vec<BTreeSet<i64>>,
    attempts: Vec<BTreeSet<i64>>,
    /// The attempt each task runs, to clear it however the task ends.
    tasks: HashMap<tokio::task::Id, (usize, i64)>,
    set: JoinSet<()>,
    returned_tx: mpsc::UnboundedSender<tokio::task::Id>,
    returned_rx: mpsc::UnboundedReceiver<tokio::task::Id>,
}

/// What woke the loop.
enum Woke {
    Lost,
    Timer,
    Submitted,
    Returned(tokio::task::Id),
    Ended(tokio::task::Id),
}

impl Here {
    fn new(jobs: usize) -> Self {
        let (returned_tx, returned_rx) = mpsc::unbounded_channel();
        Self {
            running: vec![BTreeSet::new(); jobs],
            attempts: vec![BTreeSet::new(); jobs],
            tasks: HashMap::new(),
            set: JoinSet::new(),
            returned_tx,
            returned_rx,
        }
    }

    /// The closure of task `id` returned: its job may start its next slot. (A message of a
    /// task that has ended since is stale: the slot may be another attempt's by now.)
    fn returned(&mut self, id: tokio::task::Id) {
        if let Some(&(job, slot)) = self.tasks.get(&id) {
            if let Some(set) = self.running.get_mut(job) {
                set.remove(&slot);
            }
        }
    }

    /// Task `id` ended: its attempt's end is written (or it never will be from here).
    fn ended(&mut self, id: tokio::task::Id) {
        self.returned(id);
        if let Some((job, slot)) = self.tasks.remove(&id) {
            if let Some(set) = self.attempts.get_mut(job) {
                set.remove(&slot);
            }
        }
    }

    /// Takes in everything that returned or ended so far, not one of it per look: a run that
    /// returned before its job's next slot never makes that slot skipped.
    fn catch_up(&mut self) {
        while let Ok(id) = self.returned_rx.try_recv() {
            self.returned(id);
        }
        while let Some(done) = self.set.try_join_next_with_id() {
            self.ended(task_id(&done));
        }
    }
}

/// Clears the scheduler's reported problem when the term's loop ends, however it ends: a
/// node that no longer leads has no look that fails.
struct ClearProblem<'a>(&'a Shared);

impl Drop for ClearProblem<'_> {
    fn drop(&mut self) {
        *lock(&self.0.problem) = None;
        self.0.freshness.forget();
    }
}

/// Clears what only a leader knows when its term's loop ends (or is dropped).
struct LeaderOnly(Arc<Shared>);

impl Drop for LeaderOnly {
    fn drop(&mut self) {
        *lock(&self.0.waiting) = None;
    }
}

/// How long a claimed start may wait for a runner before health says so: ten polls, at least
/// 5 s.
fn waiting_limit(poll: Duration) -> Duration {
    poll.saturating_mul(10).max(Duration::from_secs(5))
}

/// One term's loop. Returns when the term ends (the elector drops it at once when the lease no
/// longer covers it, and with it every run it started).
pub(crate) async fn lead(shared: Arc<Shared>, term: LeaderTerm) {
    let _leader_only = LeaderOnly(shared.clone());
    let _clear = ClearProblem(&shared);
    let names: Vec<String> = shared.jobs.iter().map(|j| j.name.to_string()).collect();
    // Each job's names whose records are its history: its own and its earlier ones.
    let history: Vec<(String, usize)> = shared
        .jobs
        .iter()
        .enumerate()
        .flat_map(|(i, j)| {
            std::iter::once((j.name.to_string(), i))
                .chain(j.job.renamed_from.iter().map(move |old| (old.clone(), i)))
        })
        .collect();
    let mut here = Here::new(names.len());
    let mut look = Look {
        latest: None,
        first_look: vec![None; names.len()],
        cursor: 0,
        pruned: None,
        prune_more: false,
        keyed_problem: None,
        cap_problem: None,
        finishes_read: None,
        dead_holds: HashSet::new(),
        history: History::Unknown,
        copy_failures: 0,
    };
    // With spread runs, a run that ends on any node releases its hold: the store's release
    // events (where it has them) wake this loop for the next start at once, not at its poll.
    let mut events = shared
        .spread
        .and_then(|_| crate::store::LeaseStore::release_events(&shared.store));
    let run_semaphores: HashSet<&str> = shared
        .jobs
        .iter()
        .filter_map(|j| j.run_semaphore.as_deref())
        .collect();
    tracing::info!(token = %term.token(), jobs = names.len(), "scheduling jobs");
    loop {
        if term.is_lost() {
            break;
        }
        if !term.is_current() {
            // Past its local deadline but not lost: a renew answered late may still extend
            // it. Claim nothing meanwhile; the elector ends the term or renews it.
            tokio::select! {
                _ = term.lost() => break,
                _ = tokio::time::sleep(Duration::from_millis(20)) => continue,
            }
        }
        let looked = tick(&shared, &term, (&names, &history), &mut look, &mut here).await;
        shared.freshness.publish();
        // A refused fence included: the elector, not this loop, decides when the term ends (a
        // loop that returned while the term went on would run nothing until the next term).
        let sleep = match looked {
            Ok(sleep) => {
                let problems: Vec<String> = [look.keyed_problem.take(), look.cap_problem.take()]
                    .into_iter()
                    .flatten()
                    .collect();
                *lock(&shared.problem) = (!problems.is_empty()).then(|| problems.join("; "));
                sleep
            }
            Err(e) => {
                // Read the newest slots again: a claim whose commit failed may have committed.
                look.latest = None;
                tracing::warn!(error = %e, "job scheduling failed; looking again");
                *lock(&shared.problem) = Some(crate::error::chain(&e));
                AFTER_ERROR
            }
        };
        let wake = Instant::now() + sleep;
        let woke = tokio::select! {
            _ = term.lost() => Woke::Lost,
            _ = tokio::time::sleep_until(wake) => Woke::Timer,
            _ = shared.wake.notified() => Woke::Submitted,
            () = run_ended(&mut events, &run_semaphores) => Woke::Submitted,
            Some(id) = here.returned_rx.recv() => Woke::Returned(id),
            Some(done) = here.set.join_next_with_id() => Woke::Ended(task_id(&done)),
        };
        match woke {
            Woke::Lost => break,
            Woke::Timer | Woke::Submitted => {}
            Woke::Returned(id) => here.returned(id),
            Woke::Ended(id) => here.ended(id),
        }
    }
    *lock(&shared.waiting) = None;
    // A shutdown or handover: nothing new is claimed, and the runs under way get the grace
    // period to finish (on every other end of the term this future is dropped at once, and
    // the runs with it).
    if !here.set.is_empty() {
        tracing::info!(
            runs = here.set.len(),
            "term ending: letting the running slots finish"
        );
    }
    while here.set.join_next().await.is_some() {}
}

/// Returns when the store reports a release of one of `semaphores`' permits (or, having
/// lagged, may have missed one); never without release events.
async fn run_ended(events: &mut Option<crate::store::ReleaseEvents>, semaphores: &HashSet<&str>) {
    use tokio::sync::broadcast::error::RecvError;
    if let Some(rx) = events.as_mut() {
        loop {
            match rx.recv().await {
                Ok(resource) => {
                    let semaphore = resource.rsplit_once('#').map_or(&*resource, |(s, _)| s);
                    if semaphores.contains(semaphore) {
                        // The others that came meanwhile count for the same look.
                        while rx.try_recv().is_ok() {}
                        return;
                    }
                }
                Err(RecvError::Lagged(_)) => return,
                Err(RecvError::Closed) => break,
            }
        }
        *events = None;
    }
    std::future::pending().await
}

fn task_id(done: &Result<(tokio::task::Id, ()), tokio::task::JoinError>) -> tokio::task::Id {
    match done {
        Ok((id, ())) => *id,
        Err(e) => e.id(),
    }
}

/// What a term's looks carry from one to the next.
struct Look {
    /// The newest recorded slot per job, read once per term (and after a failed look): while
    /// it leads, this term is the only one that adds records (its claims are fenced;
    /// operators only mark existing ones).
    latest: Option<Vec<Option<i64>>>,
    /// The database's now at this term's first look, per job (see `View::first_look_ms`).
    first_look: Vec<Option<i64>>,
    /// Which job's actions come first in the next look's round robin.
    cursor: usize,
    /// When this term last pruned ended records, and whether that batch was full.
    pruned: Option<Instant>,
    prune_more: bool,
    /// Why this look could not read the keyed jobs' records (the slots went on).
    keyed_problem: Option<String>,
    /// Why this look could not ask for a cap's permits (the capped starts wait).
    cap_problem: Option<String>,
    /// When the jobs' newest finishes were last read.
    finishes_read: Option<Instant>,
    /// Running records' holds found not live in this term (see `live_runs`).
    dead_holds: HashSet<NamedHold>,
    /// Whether the attempt history is kept (its table is there).
    history: History,
    /// Claims in a row that failed on their copy into the history.
    copy_failures: u32,
}

/// Whether the run table's attempt history ([`Shared::attempts_table`]) can keep the earlier
/// attempts. Asked at a term's first claim, and again a minute after it was found missing or a
/// copy into it kept failing (see `tick`).
#[derive(Debug, Clone, Copy)]
enum History {
    Unknown,
    Kept,
    Missing(Instant),
}

/// How long a term goes on without the attempt history before it asks again.
const HISTORY_ASK_AGAIN: Duration = Duration::from_secs(60);

/// Asks whether the attempt history can be kept, if it is time to: a copy of no row, in a
/// transaction rolled back. A statement the server refuses (no table, a missing column or
/// grant) means no history for a minute, said in the log; no answer at all fails the look, as
/// any read would (a history switched off by an outage would lose the retries' attempts).
async fn ask_history(shared: &Shared, history: &mut History) -> Result<(), JobError> {
    match history {
        History::Kept => return Ok(()),
        History::Missing(at) if at.elapsed() < HISTORY_ASK_AGAIN => return Ok(()),
        _ => {}
    }
    let backend = shared.store.connection().get_database_backend();
    let probe = records::attempts_probe(backend, (&shared.table, &shared.attempts_table));
    let txn = shared.store.begin_whole().await?;
    let tried = txn.execute(&probe).await;
    txn.rollback().await?;
    *history = match tried {
        Ok(_) => History::Kept,
        Err(e) if shared.store.engine()?.refused_statement(&e) => {
            tracing::warn!(
                table = %shared.attempts_table,
                error = %e,
                "the attempt history cannot be written: only each slot's latest attempt is kept; \
                 add orion_beacon_migration::CreateJobAttemptTable to your Migrator and run it, \
                 or grant the table"
            );
            History::Missing(Instant::now())
        }
        Err(e) => return Err(e.into()),
    };
    Ok(())
}

/// Each job's newest finish, for "nothing ran" (see `staleness`).
async fn read_finishes(
    shared: &Shared,
    jobs: usize,
    history: &[(String, usize)],
) -> Result<(), JobError> {
    let all: Vec<String> = history.iter().map(|(n, _)| n.clone()).collect();
    let mut finished: Vec<Option<i64>> = vec![None; jobs];
    for row in read(shared, &records::last_finished(&shared.table, &all)).await? {
        let job: String = row.try_get_by_index(0)?;
        let at: Option<chrono::DateTime<chrono::Utc>> = row.try_get_by_index(1)?;
        if let (Some((_, i)), Some(at)) = (history.iter().find(|(n, _)| *n == job), at) {
            let ms = at.timestamp_millis();
            finished[*i] = Some(finished[*i].map_or(ms, |t: i64| t.max(ms)));
        }
    }
    shared.freshness.read(finished);
    Ok(())
}

/// With spread runs, how often the leader reads the jobs' newest finishes again.
const FINISHES_EVERY: Duration = Duration::from_secs(1);

/// The running attempts (job index, slot) among `suspects` (each with the token and holder
/// its record names) that run under a live hold of a node that spreads its runs: a permit of
/// the job's run semaphore, live, held by that holder with that token. The permits' leases
/// are read through the store (`current_all`): first as many as this node's semaphore has
/// (one when it does not spread), then, for a record still unmatched, the rest up to the most
/// a semaphore may have (a node whose job allows more runs at once, during a deploy that
/// changes it).
///
/// A record whose hold is not live is an attempt whose runner died, paused or was cut off (or
/// an earlier leader's own): its hold cannot be renewed any more (an expired lease is a new
/// term with a higher token), so neither its end nor a write fenced by it can commit, and the
/// planner runs the slot again as it would a dead leader's. A hold's holder is unique to it
/// (the locks' `<owner>/<instance>-<n>`): the pair names one hold. Returns the records under
/// way: those found live, and those the look left unjudged (the second pass reads the rest of
/// the permits of at most [`SECOND_PASS_JOBS`] jobs per look; a record found not live is not
/// read again).
async fn live_runs(
    shared: &Shared,
    suspects: Vec<NamedHold>,
    dead: &mut HashSet<NamedHold>,
) -> Result<HashSet<(usize, i64)>, JobError> {
    // Only a hold's holder can be a run's: an earlier leader's own attempt (its candidate id)
    // is not live, as ever, and costs no read.
    let mut runs: Vec<NamedHold> = suspects
        .into_iter()
        .filter(|(i, .., by)| {
            shared.jobs[*i].run_semaphore.is_some() && crate::locks::is_hold_holder(by)
        })
        .collect();
    if runs.is_empty() {
        dead.clear();
        return Ok(HashSet::new());
    }
    // A hold found not live never is again (an expired or released lease is a new term with
    // another holder or a higher token): not read again while its record stays as it is.
    let present: HashSet<&NamedHold> = runs.iter().collect();
    dead.retain(|d| present.contains(d));
    drop(present);
    runs.retain(|r| !dead.contains(r));
    let mut live = HashSet::new();
    // Records not judged in this look (the second pass's budget): under way until they are.
    let mut unknown = HashSet::new();
    let own = |i: usize| {
        shared.jobs[i]
            .run_hold
            .as_ref()
            .map_or(1, crate::locks::Semaphore::permits)
    };
    for pass in 0..2 {
        let mut jobs: std::collections::BTreeSet<usize> = runs
            .iter()
            .filter(|(i, slot, ..)| !live.contains(&(*i, *slot)))
            .map(|(i, ..)| *i)
            .collect();
        if pass == 1 {
            // The rest of the permits of a few jobs per look: a statement per 1,000.
            let later: Vec<usize> = jobs.iter().copied().skip(SECOND_PASS_JOBS).collect();
            for i in later {
                jobs.remove(&i);
                unknown.extend(
                    runs.iter()
                        .filter(|(j, slot, ..)| *j == i && !live.contains(&(*j, *slot)))
                        .map(|(j, slot, ..)| (*j, *slot)),
                );
            }
        }
        // Each permit's resource and its job.
        let mut resources: HashMap<String, usize> = HashMap::new();
        for i in jobs {
            let Some(name) = &shared.jobs[i].run_semaphore else {
                continue;
            };
            let permits = if pass == 0 {
                0..own(i)
            } else {
                own(i)..crate::locks::MAX_PERMITS
            };
            for n in permits {
                resources.insert(format!("{name}#{n}"), i);
            }
        }
        if resources.is_empty() {
            break;
        }
        let wanted: Vec<String> = resources.keys().cloned().collect();
        let leases = crate::store::LeaseStore::current_all(&shared.store, &wanted).await?;
        let held: HashSet<(usize, &str, i64)> = leases
            .iter()
            .filter(|l| l.live)
            .filter_map(|l| {
                resources
                    .get(&l.resource)
                    .map(|i| (*i, l.holder.as_str(), l.token.get()))
            })
            .collect();
        for (i, slot, token, by) in &runs {
            if held.contains(&(*i, by.as_str(), *token)) {
                live.insert((*i, *slot));
            }
        }
    }
    dead.extend(
        runs.into_iter().filter(|(i, slot, ..)| {
            !live.contains(&(*i, *slot)) && !unknown.contains(&(*i, *slot))
        }),
    );
    live.extend(unknown);
    Ok(live)
}

/// How many jobs' records a look judges by the rest of their permits (see `live_runs`).
const SECOND_PASS_JOBS: usize = 4;

/// A running record's hold: (job index, slot, token, holder).
type NamedHold = (usize, i64, i64, String);

/// One look: plan, claim, start. Returns how long to sleep.
async fn tick(
    shared: &Arc<Shared>,
    term: &LeaderTerm,
    (names, history): (&[String], &[(String, usize)]),
    look: &mut Look,
    here: &mut Here,
) -> Result<Duration, JobError> {
    let backend = shared.store.connection().get_database_backend();
    let table = &*shared.table;
    if look.latest.is_none() {
        let all: Vec<String> = history.iter().map(|(n, _)| n.clone()).collect();
        let rows = read(shared, &records::latest_slots(table, &all)).await?;
        let mut found = vec![None; names.len()];
        for row in rows {
            let job: String = row.try_get_by_index(0)?;
            let slot: Option<i64> = row.try_get_by_index(1)?;
            if let Some((_, i)) = history.iter().find(|(n, _)| *n == job) {
                found[*i] = plan::latest(found[*i], slot);
            }
        }
        look.latest = Some(found);
        read_finishes(shared, names.len(), history).await?;
        look.finishes_read = Some(Instant::now());
    } else if shared.spread.is_some()
        && shared.freshness.watches()
        && look
            .finishes_read
            .is_none_or(|at| at.elapsed() >= FINISHES_EVERY)
    {
        // With spread runs the slots finish on every node, not only in this one's attempts.
        read_finishes(shared, names.len(), history).await?;
        look.finishes_read = Some(Instant::now());
    }
    // The database's now before the records: every end committed before it is in what they
    // say, so a run that ended before a slot's time never has that slot skipped (read after
    // them, a run that ended in between would still look under way at a later now).
    let now_ms = database_now(shared, backend).await?;
    let read_at = Instant::now();
    shared.freshness.look(now_ms, read_at);
    let mut open: Vec<Vec<Open>> = vec![Vec::new(); names.len()];
    // The keys of the keyed jobs' open records, by (job, slot).
    let mut keys: HashMap<(usize, i64), Arc<str>> = HashMap::new();
    let (scheduled, keyed) = split_names(&shared.jobs);
    let mut rows = Vec::new();
    if !scheduled.is_empty() {
        rows.extend(
            read(shared, &records::open_runs(table, &scheduled))
                .await?
                .into_iter()
                .map(|row| (row, false)),
        );
    }
    look.keyed_problem = None;
    if !keyed.is_empty() {
        // A failed read of the keys (a table without their column, say) stops the keys, not
        // the slots: it is reported, and the look goes on.
        let mut found = read(shared, &records::open_keyed(table, &keyed)).await;
        for job in &keyed {
            // One read per keyed job: each job's queue is bounded on its own.
            if let Ok(rows) = &mut found {
                match read(shared, &records::queued_keys(table, job)).await {
                    Ok(queued) => rows.extend(queued),
                    Err(e) => found = Err(e),
                }
            }
        }
        match found {
            Ok(found) => rows.extend(found.into_iter().map(|row| (row, true))),
            Err(e) => {
                let e = keyed_error(shared, e);
                tracing::warn!(error = %e, "reading the keyed jobs' records failed; the scheduled jobs go on");
                look.keyed_problem = Some(format!("keyed jobs: {}", crate::error::chain(&e)));
            }
        }
    }
    // The holds running records name (token, holder), by (job, slot).
    let mut holds: HashMap<(usize, i64), (i64, String)> = HashMap::new();
    for (row, is_keyed) in rows {
        let decoded = records::decode_open(&row).and_then(|open| {
            let key = if is_keyed {
                records::decode_key(&row)?
            } else {
                None
            };
            Ok(open.map(|o| (o, key)))
        });
        let decoded = decoded.map(|d| d.map(|d| (d, records::decode_hold(&row))));
        match decoded {
            Ok(Some((((job, record), key), hold))) => {
                if let Some(i) = names.iter().position(|n| *n == job) {
                    if let Some(key) = key {
                        keys.insert((i, record.slot), key.into());
                    } else if is_keyed {
                        // A keyed job's record without its key (written by hand): not run.
                        tracing::warn!(%job, slot = record.slot, "a keyed job's record has no key; left alone");
                        continue;
                    }
                    if record.state == State::Running {
                        match hold {
                            Ok(Some(hold)) => {
                                holds.insert((i, record.slot), hold);
                            }
                            Ok(None) => {}
                            // Judged as a record without a hold: not under way.
                            Err(e) => {
                                tracing::warn!(error = %e, "a run record's claim could not be read")
                            }
                        }
                    }
                    open[i].push(record);
                }
            }
            Ok(None) => {}
            // One unreadable record (edited by hand, say) does not stop every job.
            Err(e) => tracing::warn!(error = %e, "a run record could not be read; left alone"),
        }
    }
    // Claimed starts that no runner has taken for too long (with spread runs, a node's runner
    // takes each within its poll while one has room).
    let limit = waiting_limit(shared.poll);
    let waited: Vec<i64> = open
        .iter()
        .flatten()
        .filter(|o| shared.spread.is_some() && o.state == State::Claimed)
        .filter_map(|o| o.claimed_at_ms.map(|at| now_ms.saturating_sub(at)))
        .filter(|&ms| u128::try_from(ms).is_ok_and(|ms| ms > limit.as_millis()))
        .collect();
    *lock(&shared.waiting) = waited.iter().max().map(|&oldest| super::WaitingStarts {
        count: waited.len(),
        oldest: Duration::from_millis(u64::try_from(oldest).unwrap_or(0)),
        limit,
    });
    // With spread runs, the attempts claimed for the runners and those a live hold runs are
    // under way wherever they run: the planner counts them as running (overlap, caps of runs
    // at once) and never claims them again. The rest stay open for it to judge.
    // So are, whether or not this node spreads, the runs of nodes that do (a rolling deploy
    // that turns spreading on or off): a running record that is not this term's own attempt
    // is judged by its hold.
    let spread = shared.spread.is_some();
    let suspects: Vec<NamedHold> = holds
        .into_iter()
        .filter(|((i, slot), _)| spread || !here.attempts[*i].contains(slot))
        .map(|((i, slot), (token, by))| (i, slot, token, by))
        .collect();
    let live = live_runs(shared, suspects, &mut look.dead_holds).await?;
    let mut under_way: Vec<BTreeSet<i64>> = vec![BTreeSet::new(); names.len()];
    for (i, records) in open.iter_mut().enumerate() {
        records.retain(|o| {
            let busy = (spread && o.state == State::Claimed)
                || (o.state == State::Running && live.contains(&(i, o.slot)));
            if busy {
                under_way[i].insert(o.slot);
            }
            !busy
        });
    }
    // Everything that returned or ended so far, up to the end of the reads, counts for this
    // look's plan: a run that returned before its job's next slot never makes it skipped.
    here.catch_up();
    let latest_now = look
        .latest
        .as_mut()
        .ok_or_else(|| JobError::Database(sea_orm::DbErr::Custom("no latest slots".to_owned())))?;

    let mut wake_ms: Option<i64> = None;
    let mut queues: Vec<VecDeque<(usize, Action)>> = Vec::with_capacity(names.len());
    for (i, reg) in shared.jobs.iter().enumerate() {
        let first_look_ms = *look.first_look[i].get_or_insert(now_ms);
        // Runs under way elsewhere count as this term's own do.
        let (running, here_now);
        let (running, here_now) = if under_way[i].is_empty() {
            (&here.running[i], &here.attempts[i])
        } else {
            running = here.running[i].union(&under_way[i]).copied().collect();
            here_now = here.attempts[i].union(&under_way[i]).copied().collect();
            (&running, &here_now)
        };
        let p = plan::plan(
            &View {
                schedule: &reg.job.schedule,
                policy: &reg.policy,
                latest: latest_now[i],
                open: &open[i],
                running,
                here: here_now,
                first_look_ms,
            },
            now_ms,
        );
        wake_ms = plan::earliest(wake_ms, p.wake_ms);
        queues.push(p.actions.into_iter().map(|a| (i, a)).collect());
    }
    let (decided, next_first, mut more) = interleave(queues, look.cursor, MAX_CLAIMS_PER_LOOK);
    look.cursor = next_first;
    // A capped job's starts take their permits before the claim; one left without waits.
    // (With spread runs the runner that takes a start takes its permit.)
    let (decided, mut permits, cap_wait) = if shared.spread.is_some() {
        (decided, HashMap::new(), false)
    } else {
        take_permits(shared, decided, here, &mut look.cap_problem).await
    };
    let mut handed = false;
    if !decided.is_empty() {
        ask_history(shared, &mut look.history).await?;
        let keep = matches!(look.history, History::Kept);
        let mut copy_failed = None;
        let claimed = claim(shared, term, backend, &decided, (keep, &mut copy_failed)).await;
        let (claimed, left_out) = match claimed {
            Ok(claimed) => {
                look.copy_failures = 0;
                claimed
            }
            Err(e) => {
                if let Some(refused) = copy_failed {
                    // A copy the server refused for what it is (a grant, a row check the
                    // probe could not see), or one that failed in two looks running: the term
                    // goes on without the history and asks again in a minute, so a history
                    // never stops the claims for longer.
                    look.copy_failures += 1;
                    if refused || look.copy_failures >= 2 {
                        look.history = History::Missing(Instant::now());
                        look.copy_failures = 0;
                    }
                }
                return Err(e);
            }
        };
        if let Some(first) = left_out {
            // What the budget left out comes first in the next look, as what the look's limit
            // left out does.
            look.cursor = first;
            more = true;
        }
        for (i, action) in claimed {
            match action {
                Action::Start { slot, prior } => {
                    latest_now[i] = Some(latest_now[i].map_or(slot, |l| l.max(slot)));
                    if shared.spread.is_some() {
                        // Claimed for the nodes' runners (this one's is woken below).
                        tracing::debug!(job = %shared.jobs[i].name, slot, "attempt claimed for a runner");
                        handed = true;
                        continue;
                    }
                    let attempt = prior.as_ref().map_or(1, Open::next_attempt);
                    // A key's lateness counts from its submit (a queued record's claim time);
                    // a slot's from its time.
                    let since = match &prior {
                        Some(p) if p.state == State::Queued => p.claimed_at_ms.unwrap_or(now_ms),
                        _ if shared.jobs[i].job.is_keyed() => now_ms,
                        _ => slot,
                    };
                    let lateness_ms = now_ms.saturating_sub(since).max(0) as u64;
                    let lateness =
                        Duration::from_millis(lateness_ms).saturating_add(read_at.elapsed());
                    here.running[i].insert(slot);
                    here.attempts[i].insert(slot);
                    let key = keys.get(&(i, slot)).cloned();
                    let permit = permits.remove(&(i, slot));
                    debug_assert!(
                        permit.is_some() || shared.jobs[i].cap.is_none(),
                        "a capped start claimed without its permit"
                    );
                    let id = start(
                        shared,
                        term,
                        Launch {
                            job: i,
                            slot,
                            key,
                            permit,
                            hold: None,
                            attempt,
                            lateness,
                        },
                        &mut here.set,
                        Some(here.returned_tx.clone()),
                    );
                    here.tasks.insert(id, (i, slot));
                }
                Action::Skip { slot } => {
                    latest_now[i] = Some(latest_now[i].map_or(slot, |l| l.max(slot)));
                    super::metrics_hook::outcome(&shared.jobs[i].name, "skipped");
                    tracing::info!(job = %shared.jobs[i].name, slot, "slot skipped: the previous one still runs, or its cap is full");
                }
                Action::GiveUp { prior } => {
                    super::metrics_hook::outcome(&shared.jobs[i].name, "given_up");
                    tracing::warn!(job = %shared.jobs[i].name, slot = prior.slot, attempts = prior.attempts, "slot given up: its attempts are spent");
                }
            }
        }
    }
    if handed {
        shared.runner_wake.notify_one();
    }
    // Permits taken for what was not claimed go back now, before the pruning.
    drop(permits);

    if let Some(keep) = shared.keep_finished_ms {
        // A batch every half `keep` (at most a minute apart), another at the next look after
        // a full one. Best effort: a failure is logged, the look goes on.
        let every = Duration::from_millis(u64::try_from(keep / 2).unwrap_or(0)).min(PRUNE_EVERY);
        if look.pruned.is_none_or(|at| at.elapsed() >= every) || look.prune_more {
            look.pruned = Some(Instant::now());
            // A scheduled job's slots are times; a keyed job's records are pruned by when they
            // ended.
            let all: Vec<String> = history
                .iter()
                .filter(|(_, i)| !shared.jobs[*i].job.is_keyed())
                .map(|(n, _)| n.clone())
                .collect();
            let cutoff = now_ms.saturating_sub(keep);
            let kept = match ask_history(shared, &mut look.history).await {
                Ok(()) => matches!(look.history, History::Kept),
                Err(_) => false,
            };
            look.prune_more = match prune(shared, backend, (&all, &keyed), cutoff, kept).await {
                Ok(full) => full,
                Err(e) => {
                    tracing::warn!(error = %e, "pruning ended run records failed; trying again later");
                    false
                }
            };
            more |= look.prune_more;
        }
    }
    let poll = if cap_wait {
        shared.poll.min(CAP_RETRY)
    } else {
        shared.poll
    };
    if more {
        return Ok(MIN_SLEEP);
    }
    let sleep = match wake_ms {
        Some(wake) => {
            let ahead = u64::try_from(wake.saturating_sub(now_ms)).unwrap_or(0);
            Duration::from_millis(ahead)
                .saturating_sub(read_at.elapsed())
                .min(poll)
        }
        None => poll,
    };
    Ok(sleep.max(MIN_SLEEP))
}

/// Takes a permit of its cap for each start of a capped job ([`Job::cap`]), before the claim:
/// a start left without one waits for a later look, except a new slot of a job that skips
/// overlapping slots, which is skipped, unless one of this job's attempts here has returned
/// and not yet ended (its permit goes back once its end is written: a run that returned never
/// makes the next slot skipped). Once a cap has no free permit, the look asks it for no more.
/// Returns the actions, the permits by (job, slot), and whether a start waits.
async fn take_permits(
    shared: &Shared,
    decided: Vec<(usize, Action)>,
    here: &Here,
    problem: &mut Option<String>,
) -> (
    Vec<(usize, Action)>,
    HashMap<(usize, i64), crate::locks::LockGuard>,
    bool,
) {
    let mut permits = HashMap::new();
    // Caps (by semaphore) with no free permit in this look, and those whose ask failed (their
    // new slots wait rather than be skipped for an error).
    let mut full: BTreeSet<&str> = BTreeSet::new();
    let mut failed: BTreeSet<&str> = BTreeSet::new();
    let mut waiting = false;
    let mut kept = Vec::with_capacity(decided.len());
    for (i, action) in decided {
        let reg = &shared.jobs[i];
        let start = match &action {
            Action::Start { slot, prior } => Some((*slot, prior.is_none())),
            _ => None,
        };
        let (Some(cap), Some((slot, new))) = (&reg.cap, start) else {
            kept.push((i, action));
            continue;
        };
        let name = cap.name();
        if !full.contains(name) && !failed.contains(name) {
            match cap.try_acquire().await {
                Ok(Some(permit)) => {
                    permits.insert((i, slot), permit);
                    kept.push((i, action));
                    continue;
                }
                Ok(None) => {
                    full.insert(name);
                }
                Err(e) => {
                    let e = JobError::Cap(e);
                    tracing::warn!(job = %reg.name, error = %e, "asking for a cap's permit failed; the start waits");
                    *problem = Some(format!("caps: {}", crate::error::chain(&e)));
                    failed.insert(name);
                }
            }
        }
        // An attempt here whose closure returned and whose end is being written still holds
        // its permit: not a run under way.
        let ending_here = here.attempts[i].len() > here.running[i].len();
        let policy = &reg.policy;
        if new
            && !failed.contains(name)
            && !ending_here
            && !reg.job.is_keyed()
            && policy.skips_when_busy()
        {
            tracing::debug!(job = %reg.name, slot, "its cap's permits are all held: the slot is skipped");
            kept.push((i, Action::Skip { slot }));
        } else {
            tracing::debug!(job = %reg.name, slot, "start waits for a permit of its cap");
            waiting = true;
        }
    }
    (kept, permits, waiting)
}

/// Round robin over the jobs' queues (each job's own actions stay in order), at most `max`,
/// starting with queue `first`: one action of each queue in turn. Returns them, the queue the
/// next look starts with (the one after the last served), and whether any was left. So that
/// neither one job's long catch-up nor the order the jobs were added in decides who gets the
/// claims of a look: a job left out of one look is among the first of the next.
fn interleave<T>(mut queues: Vec<VecDeque<T>>, first: usize, max: usize) -> (Vec<T>, usize, bool) {
    let n = queues.len();
    let mut taken = Vec::new();
    if n == 0 {
        return (taken, 0, false);
    }
    let mut left: usize = queues.iter().map(VecDeque::len).sum();
    let mut at = first % n;
    let mut next = at;
    while taken.len() < max && left > 0 {
        if let Some(action) = queues[at].pop_front() {
            taken.push(action);
            left -= 1;
            next = (at + 1) % n;
        }
        at = (at + 1) % n;
    }
    (taken, next, left > 0)
}

/// A read of the run table through the store's checked path: on a connection known to be
/// outside any transaction somebody abandoned, read to the end.
pub(crate) async fn read(
    shared: &Shared,
    query: &sea_orm::sea_query::SelectStatement,
) -> Result<Vec<sea_orm::QueryResult>, JobError> {
    let stmt = shared
        .store
        .connection()
        .get_database_backend()
        .build(query);
    match shared.store.engine()?.plain(stmt).await {
        Ok(rows) => Ok(rows),
        Err(crate::error::StoreError::MissingTable { source, .. }) => {
            Err(JobError::MissingRunTable {
                table: shared.table.to_string(),
                source,
            })
        }
        Err(e) => Err(e.into()),
    }
}

/// A read of the keyed jobs' records failed: a table without the key column lacks the
/// `AddJobRunKey` step, said as such.
pub(crate) fn keyed_error(shared: &Shared, err: JobError) -> JobError {
    match err {
        JobError::Store(crate::error::StoreError::Database(source))
            if shared
                .store
                .engine()
                .is_ok_and(|e| e.unknown_column_in(&source)) =>
        {
            JobError::Store(crate::error::StoreError::OutdatedSchema {
                table: shared.table.to_string(),
                migration: JOB_RUN_KEY_STEP,
                source,
            })
        }
        other => other,
    }
}

/// The migration step that adds the key column to the run table.
pub(crate) const JOB_RUN_KEY_STEP: &str = "AddJobRunKey";

/// The jobs' names: the scheduled ones, then the keyed ones.
fn split_names(jobs: &[Registered]) -> (Vec<String>, Vec<String>) {
    let mut scheduled = Vec::new();
    let mut keyed = Vec::new();
    for reg in jobs {
        if reg.job.is_keyed() {
            keyed.push(reg.name.to_string());
        } else {
            scheduled.push(reg.name.to_string());
        }
    }
    (scheduled, keyed)
}

/// A run-table statement's error: a missing table named as such.
fn runs_error(shared: &Shared, err: sea_orm::DbErr) -> JobError {
    match shared.store.engine() {
        Ok(engine) if engine.missing_table(&err) => JobError::MissingRunTable {
            table: shared.table.to_string(),
            source: err.into(),
        },
        _ => err.into(),
    }
}

/// The database clock, in milliseconds since the Unix epoch.
pub(crate) async fn database_now(shared: &Shared, backend: DbBackend) -> Result<i64, JobError> {
    let row = read(shared, &records::clock(backend))
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| JobError::Database(sea_orm::DbErr::RecordNotFound("now".to_owned())))?;
    let now: chrono::DateTime<chrono::Utc> = row.try_get_by_index(0)?;
    Ok(now.timestamp_millis())
}

/// The most ended records deleted at one look.
const PRUNE_BATCH: u64 = 500;
/// The longest time between two prunes (shorter for a short `keep_finished_for`).
const PRUNE_EVERY: Duration = Duration::from_secs(60);
/// Job names per prune statement.
const PRUNE_NAMES: usize = 1000;

/// Deletes a batch of this scheduler's ended records of slots before `before_ms` (never a
/// name's newest, nor its newest finished), in a transaction of its own begun whole and
/// committed before the answer; whether the batch was full (more may be left).
async fn prune(
    shared: &Shared,
    backend: DbBackend,
    (names, keyed): (&[String], &[String]),
    before_ms: i64,
    history: bool,
) -> Result<bool, JobError> {
    let before = chrono::DateTime::from_timestamp_millis(before_ms).unwrap_or_default();
    let batches = names
        .chunks(PRUNE_NAMES)
        .map(|chunk| (chunk, false))
        .chain(keyed.chunks(PRUNE_NAMES).map(|chunk| (chunk, true)));
    let deleted = delete_batched(
        shared,
        batches,
        |chunk, is_keyed, left| {
            if is_keyed {
                records::prune_keyed(backend, &shared.table, chunk, before, left)
            } else {
                records::prune(backend, &shared.table, chunk, before_ms, left)
            }
        },
        |e| runs_error(shared, e),
    )
    .await?;
    // The attempt history of the records pruned (in this batch or before) goes after them, in
    // a transaction of its own: a history that cannot be pruned (no grant) is logged, and
    // never keeps the records from being pruned.
    let mut kept_deleted = 0;
    if history {
        match prune_history(shared, backend, (names, keyed)).await {
            Ok(n) => kept_deleted = n,
            Err(e) => {
                tracing::warn!(error = %e, "pruning the attempt history failed; trying again later")
            }
        }
    }
    if deleted > 0 || kept_deleted > 0 {
        tracing::debug!(deleted, kept_deleted, before_ms, "ended run records pruned");
    }
    Ok(deleted >= PRUNE_BATCH || kept_deleted >= PRUNE_BATCH)
}

/// Deletes a batch of the attempt history of `names`' and `keyed`'s records that are gone;
/// how many rows it deleted.
async fn prune_history(
    shared: &Shared,
    backend: DbBackend,
    (names, keyed): (&[String], &[String]),
) -> Result<u64, JobError> {
    let tables = (&*shared.table, &*shared.attempts_table);
    let batches = names
        .chunks(PRUNE_NAMES)
        .chain(keyed.chunks(PRUNE_NAMES))
        .map(|chunk| (chunk, false));
    delete_batched(
        shared,
        batches,
        |chunk, _, left| records::prune_attempts(backend, tables, chunk, left),
        JobError::from,
    )
    .await
}

/// At most [`PRUNE_BATCH`] rows deleted in a transaction of its own, begun whole and committed
/// before the answer: one statement per batch of names, `delete` built for the batch (and
/// whether its jobs are keyed) and the rows still allowed; `failed` says a statement's error.
/// How many rows went.
async fn delete_batched<'a>(
    shared: &Shared,
    batches: impl Iterator<Item = (&'a [String], bool)>,
    delete: impl Fn(&'a [String], bool, u64) -> sea_orm::sea_query::DeleteStatement,
    failed: impl Fn(sea_orm::DbErr) -> JobError,
) -> Result<u64, JobError> {
    let txn = shared.store.begin_whole().await?;
    let mut deleted = 0;
    for (chunk, is_keyed) in batches {
        let left = PRUNE_BATCH.saturating_sub(deleted);
        if left == 0 {
            break;
        }
        match txn.execute(&delete(chunk, is_keyed, left)).await {
            Ok(done) => deleted += done.rows_affected(),
            Err(e) => {
                let _ = txn.rollback().await;
                return Err(failed(e));
            }
        }
    }
    txn.commit().await?;
    Ok(deleted)
}

/// Claims (or skips, or gives up) what the planner decided, in one transaction fenced by the
/// term. A record changed since it was read is left out (its update matched nothing).
///
/// The transaction holds the lease row (on SQLite the write lock), so the leader's own renew
/// waits for it: the new records go in multi-row statements of [`ROWS_PER_INSERT`] each, then
/// the updates (retries, each after the copy of its earlier attempt into the history;
/// give-ups). The inserts stop once the row has been held for `claim_budget` (half of it when
/// updates wait), the updates once it has been held for all of it, each after at least one
/// statement. The answer names the job of the first claim left out (the next look starts with
/// it). A copy into the history that fails is said in `copy_failed` (whether the server
/// refused it for what it is).
/// One statement per claim held the row for as many round trips as there were claims, and on
/// a slow or busy host the leader lost its term to its own claims.
async fn claim(
    shared: &Shared,
    term: &LeaderTerm,
    backend: DbBackend,
    decided: &[(usize, Action)],
    (keep_history, copy_failed): (bool, &mut Option<bool>),
) -> Result<(Vec<(usize, Action)>, Option<usize>), JobError> {
    let table = &*shared.table;
    // A start is run by this leader, or with spread runs claimed for the nodes' runners.
    let started = if shared.spread.is_some() {
        State::Claimed
    } else {
        State::Running
    };
    if term.is_lost() {
        // A shutdown began during this look: nothing new starts.
        return Ok((Vec::new(), None));
    }
    // Refused by the fence: nothing is claimed; the loop looks again, and the elector ends the
    // term.
    let txn = begin_fenced(&shared.store, term).await??;
    // From here the transaction holds the lease row.
    let held = Instant::now();
    let token = term.token().get();
    let holder = term.candidate();
    let mut done = Vec::with_capacity(decided.len());
    // The new records (first starts and skips), each with the action it records; the rest
    // are updates of records read in this look.
    let mut new: Vec<(&(usize, Action), records::NewRecord<'_>)> = Vec::new();
    let mut changed = Vec::new();
    for decision in decided {
        let (i, action) = decision;
        let (slot, state) = match action {
            Action::Start { slot, prior: None } => (*slot, started),
            Action::Skip { slot } => (*slot, State::Skipped),
            Action::Start { prior: Some(_), .. } | Action::GiveUp { .. } => {
                changed.push(decision);
                continue;
            }
        };
        let reg = &shared.jobs[*i];
        let record = records::NewRecord {
            job: &reg.name,
            slot,
            state,
            schedule: &reg.schedule_text,
        };
        new.push((decision, record));
    }
    let mut left_out = None;
    let insert_budget = if changed.is_empty() {
        shared.claim_budget
    } else {
        shared.claim_budget / 2
    };
    for (n, chunk) in new.chunks(ROWS_PER_INSERT).enumerate() {
        // At least one statement per look; the rest while the budget lasts, half of it when
        // updates wait (retries and keys are never starved by a flood of new slots).
        if n > 0 && held.elapsed() >= insert_budget {
            left_out = chunk.first().map(|((i, _), _)| *i);
            break;
        }
        let rows: Vec<_> = chunk.iter().map(|(_, row)| *row).collect();
        let inserted = match records::insert_many(backend, table, &rows, token, holder) {
            Ok(insert) => txn.execute(&insert).await,
            Err(e) => Err(e),
        };
        match inserted {
            // Every row or an error: a slot recorded meanwhile fails the whole statement.
            Ok(r) if r.rows_affected() == chunk.len() as u64 => {
                done.extend(chunk.iter().map(|((i, action), _)| (*i, action.clone())));
            }
            Ok(r) => {
                let _ = txn.rollback().await;
                return Err(JobError::Database(sea_orm::DbErr::Custom(format!(
                    "{} of {} new run records inserted",
                    r.rows_affected(),
                    chunk.len()
                ))));
            }
            Err(e) => {
                let _ = txn.rollback().await;
                return Err(runs_error(shared, e));
            }
        }
    }
    for (n, (i, action)) in changed.into_iter().enumerate() {
        // At least one update per look, so retries and give-ups always progress.
        if n > 0 && held.elapsed() >= shared.claim_budget {
            left_out = left_out.or(Some(*i));
            break;
        }
        let reg = &shared.jobs[*i];
        let by = Claimant {
            token,
            holder,
            schedule: &reg.schedule_text,
        };
        let result = match action {
            Action::Start {
                prior: Some(prior), ..
            } => {
                // The attempt the record holds goes to the history first, while the record
                // is as read (the copy locks it and tests what the reclaim tests); a copy
                // that fails fails the claim, and the next look asks whether to keep it.
                let copy = keep_history
                    .then(|| {
                        records::keep_attempt(
                            backend,
                            (table, &shared.attempts_table),
                            &reg.name,
                            prior,
                        )
                    })
                    .flatten();
                if let Some(copy) = copy {
                    if let Err(e) = txn.execute(&copy).await {
                        let _ = txn.rollback().await;
                        *copy_failed = Some(shared.store.engine()?.refused_statement(&e));
                        tracing::warn!(error = %e, table = %shared.attempts_table, "keeping an earlier attempt failed");
                        return Err(e.into());
                    }
                }
                txn.execute(&records::reclaim(
                    backend, table, &reg.name, prior, &by, started,
                ))
                .await
            }
            Action::GiveUp { prior } => {
                txn.execute(&records::give_up(table, &reg.name, prior))
                    .await
            }
            // Partitioned out above.
            Action::Start { prior: None, .. } | Action::Skip { .. } => continue,
        };
        match result {
            Ok(r) if r.rows_affected() == 1 => done.push((*i, action.clone())),
            Ok(_) => {
                tracing::debug!(job = %reg.name, ?action, "run record changed since it was read")
            }
            Err(e) => {
                let _ = txn.rollback().await;
                return Err(runs_error(shared, e));
            }
        }
    }
    txn.commit().await?;
    Ok((done, left_out))
}

#[cfg(test)]
mod tests;
