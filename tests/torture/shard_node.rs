//! A shard-set node process: one `ShardSet` over the run's resources on the real store, whose
//! work per led resource (`run_per_shard`) writes fenced ledger rows with `term.fence(&txn)`.
//! Every term the node believes it holds, the end of each term's work and every ledger write
//! go to its history file, line by line, for the per-resource checker (`shard_checker.rs`).
//!
//! History lines (times are `CLOCK_MONOTONIC` nanoseconds; `<id>` numbers the node's terms, so a
//! resource led again with the same token would be another term, which the checker fails):
//!
//! ```text
//! start <node> <ns> <wall-unix-ms>
//! lead <resource> <token> <ns> <id>                the node published the term (watch or work)
//! work <resource> <token> <ns> <id>                the term's work started
//! lost <resource> <token> <ns> <deadline-ns> <why> <id>   the term ended, as observed
//! done <resource> <token> <ns> <deadline-ns> <id>  the term's work returned or was dropped
//! write <resource> <token> <seq> <ns>              a fenced ledger write committed
//! refused <resource> <token> <ns>                  the fence refused it (stale term)
//! aborted <resource> <token> <ns>                  its commit lost to a concurrent transaction
//! failed <resource> <token> <ns>                   another database error
//! assign <ns> <share> <members> <led> <handing-over>   the node's assignment changed
//! stop <ns>
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use orion_beacon::{LeaderTerm, SeaOrmLeaseStore, ShardSet};
use sea_orm::sea_query::{Alias, Query};
use sea_orm::{ConnectionTrait, DatabaseConnection, TransactionTrait};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::candidate::HistoryFile;
use crate::clock::{mono_ns, MonoClock};
use crate::db::{connect, connect_rollback_journal};
use crate::{Args, Error, LEASE, ROLLBACK_BUSY_TIMEOUT, SHARD_GRACE, SHARD_INTERVAL, SHARD_SLACK};

/// Connections for the node's ledger transactions, a pool of their own: a dozen terms' fenced
/// transactions never hold up the shard set's round (heartbeat, batched renew) waiting for a
/// connection.
pub(crate) const LEDGER_POOL: u32 = 4;

/// Pause between one term's ledger writes (ms, drawn per write).
const WRITE_EVERY_MS: std::ops::Range<u64> = 250..400;

/// The resources of a shard set of `n`: `shard-0`..`shard-{n-1}`.
pub fn resources(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("shard-{i}")).collect()
}

pub(crate) type History = Arc<Mutex<HistoryFile>>;

pub(crate) fn line(history: &History, text: &str) {
    history.lock().unwrap_or_else(|p| p.into_inner()).line(text);
}

/// One term the node has published.
struct Entry {
    term: LeaderTerm,
    id: u64,
    /// Its `lost` line is written.
    lost: bool,
}

/// The node's terms as it believes them: a `lead` line when a term is first seen (by the
/// watcher or by the work it starts, whichever comes first) and a `lost` line when it ends.
pub(crate) struct Terms {
    history: History,
    clock: MonoClock,
    state: Mutex<(u64, HashMap<String, Vec<Entry>>)>,
}

impl Terms {
    pub(crate) fn new(history: History) -> Arc<Self> {
        Arc::new(Terms {
            history,
            clock: MonoClock::new(),
            state: Mutex::new((0, HashMap::new())),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, HashMap<String, Vec<Entry>>)> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `term` is published: its `lead` line, once; its id.
    fn lead(self: &Arc<Self>, term: &LeaderTerm) -> u64 {
        let mut state = self.lock();
        let (next, by_resource) = &mut *state;
        let list = by_resource.entry(term.resource().to_owned()).or_default();
        if let Some(e) = list.iter().find(|e| e.term == *term) {
            return e.id;
        }
        // An earlier term of the resource whose end nobody logged yet ended before this one was
        // granted (the shard set ends a term before it forgets it).
        for e in list.iter_mut().filter(|e| !e.lost) {
            e.lost = true;
            self.lost_line(&e.term, e.id);
        }
        *next += 1;
        let id = *next;
        line(
            &self.history,
            &format!(
                "lead {} {} {} {id}",
                term.resource(),
                term.token(),
                mono_ns()
            ),
        );
        list.push(Entry {
            term: term.clone(),
            id,
            lost: false,
        });
        if list.len() > 4 {
            list.remove(0);
        }
        drop(state);
        let (terms, term) = (self.clone(), term.clone());
        tokio::spawn(async move {
            term.lost().await;
            terms.lost(&term);
        });
        id
    }

    /// `term`'s work starts: its `work` line.
    pub(crate) fn work(self: &Arc<Self>, term: &LeaderTerm) {
        let id = self.lead(term);
        line(
            &self.history,
            &format!(
                "work {} {} {} {id}",
                term.resource(),
                term.token(),
                mono_ns()
            ),
        );
    }

    /// `term` ended: its `lost` line, once.
    pub(crate) fn lost(&self, term: &LeaderTerm) {
        let mut state = self.lock();
        if let Some(e) = state
            .1
            .get_mut(term.resource())
            .and_then(|list| list.iter_mut().find(|e| e.term == *term))
            .filter(|e| !e.lost)
        {
            e.lost = true;
            self.lost_line(term, e.id);
        }
    }

    /// `term`'s work returned or was dropped.
    fn done(&self, term: &LeaderTerm) {
        let state = self.lock();
        if let Some(e) = state
            .1
            .get(term.resource())
            .and_then(|list| list.iter().find(|e| e.term == *term))
        {
            let deadline = self.clock.ns(term.deadline());
            line(
                &self.history,
                &format!(
                    "done {} {} {} {deadline} {}",
                    term.resource(),
                    term.token(),
                    mono_ns(),
                    e.id
                ),
            );
        }
    }

    /// The node stopped: every term has ended, logged or not yet.
    pub(crate) fn close_all(&self) {
        let mut state = self.lock();
        for list in state.1.values_mut() {
            for e in list.iter_mut().filter(|e| !e.lost) {
                e.lost = true;
                self.lost_line(&e.term, e.id);
            }
        }
    }

    /// The `lost` line of `term` (the caller holds the lock).
    fn lost_line(&self, term: &LeaderTerm, id: u64) {
        let why = term
            .loss_reason()
            .map_or("replaced".to_owned(), |r| r.to_string());
        let deadline = self.clock.ns(term.deadline());
        line(
            &self.history,
            &format!(
                "lost {} {} {} {deadline} {why} {id}",
                term.resource(),
                term.token(),
                mono_ns()
            ),
        );
    }
}

/// Writes the `done` line of a term's work when the work future returns or is dropped.
pub(crate) struct Done {
    pub terms: Arc<Terms>,
    pub term: LeaderTerm,
}

impl Drop for Done {
    fn drop(&mut self) {
        self.terms.done(&self.term);
    }
}

/// The process's history file, its own log beside it, and the `start` line.
pub(crate) fn open_history(args: &Args, name: &str) -> Result<History, Error> {
    if let Some(history) = &args.history {
        crate::node_log::install(history);
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(args.history.clone().unwrap_or_default())?;
    let history: History = Arc::new(Mutex::new(HistoryFile(file)));
    let wall_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    line(&history, &format!("start {name} {} {wall_ms}", mono_ns()));
    Ok(history)
}

/// The node's pools: the store's (`--pool` connections, default 3) and the ledger
/// transactions' own ([`LEDGER_POOL`]), in the configuration's SQLite journal mode.
pub(crate) async fn connect_pools(
    args: &Args,
) -> Result<(DatabaseConnection, DatabaseConnection), Error> {
    let pool = args.pool.unwrap_or(3);
    Ok(if args.rollback_journal {
        (
            connect_rollback_journal(&args.url, pool, ROLLBACK_BUSY_TIMEOUT).await?,
            connect_rollback_journal(&args.url, LEDGER_POOL, ROLLBACK_BUSY_TIMEOUT).await?,
        )
    } else {
        (
            connect(&args.url, pool).await?,
            connect(&args.url, LEDGER_POOL).await?,
        )
    })
}

/// Runs one node until the harness writes `shutdown` to its standard input.
pub async fn run(args: Args) -> Result<(), Error> {
    let name = args.candidate.clone().unwrap_or_default();
    let history = open_history(&args, &name)?;

    let (db, ledger_db) = connect_pools(&args).await?;
    let store = SeaOrmLeaseStore::new(db)
        .with_table(&args.table)?
        .with_member_table(&args.members)?;
    let handle = ShardSet::builder(store)
        .name(&args.resource)
        .resources(resources(args.shards))
        .member_id(&name)
        .lease_duration(LEASE)
        .interval(SHARD_INTERVAL)
        .grace_period(SHARD_GRACE)
        .slack(SHARD_SLACK)
        .build()?
        .start();

    let terms = Terms::new(history.clone());
    // What the node leads, as published: a line per term, and one per change of its share,
    // its view of the members or the number it leads.
    let mut rx = handle.watch();
    let watched = terms.clone();
    let watch_history = history.clone();
    let watcher = tokio::spawn(async move {
        let mut last = None;
        loop {
            let assignment = rx.borrow_and_update().clone();
            for term in assignment.led.values().filter(|t| t.is_current()) {
                watched.lead(term);
            }
            let view = (
                assignment.share,
                assignment.members.len(),
                assignment.led.len(),
                assignment.handing_over,
            );
            if last != Some(view) {
                last = Some(view);
                line(
                    &watch_history,
                    &format!(
                        "assign {} {} {} {} {}",
                        mono_ns(),
                        view.0,
                        view.1,
                        view.2,
                        view.3
                    ),
                );
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    });

    // Each led resource's work: fenced ledger writes while its term is current.
    let ledger = Ledger {
        db: ledger_db,
        history: history.clone(),
        table: args.ledger.clone(),
        me: name.clone(),
        sequences: Default::default(),
    };
    let work_terms = terms.clone();
    let work_ledger = ledger.clone();
    let _work = handle.run_per_shard(move |term| {
        work_terms.work(&term);
        let done = Done {
            terms: work_terms.clone(),
            term: term.clone(),
        };
        let ledger = work_ledger.clone();
        async move {
            let _done = done;
            while term.is_current() {
                ledger.write(&term).await;
                let pause = Duration::from_millis(fastrand::u64(WRITE_EVERY_MS));
                tokio::select! {
                    _ = term.lost() => {}
                    _ = tokio::time::sleep(pause) => {}
                }
            }
        }
    });

    // The write fencing exists for: a node paused (GC, SIGSTOP) past its leases wakes up and
    // writes with the terms it had. After any stall longer than the lease, this task sends one
    // fenced write with each term it saw before the stall that is no longer current; the fence
    // must refuse them (the checker fails a stale write that committed).
    let zombie_rx = handle.watch();
    let zombie = tokio::spawn(async move {
        loop {
            let before: Vec<LeaderTerm> = zombie_rx.borrow().led.values().cloned().collect();
            let tick = std::time::Instant::now();
            tokio::time::sleep(Duration::from_millis(50)).await;
            if tick.elapsed() > LEASE {
                for term in before.iter().filter(|t| !t.is_current()) {
                    ledger.write(term).await;
                }
            }
        }
    });

    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(text)) = stdin.next_line().await {
        if text.trim() == "shutdown" {
            break;
        }
    }
    zombie.abort();
    handle.shutdown().await;
    let _ = watcher.await;
    terms.close_all();
    line(&history, &format!("stop {}", mono_ns()));
    Ok(())
}

/// Fenced writes of `(resource, token, node, seq)` rows to the ledger table, each recorded in
/// the history (see the module doc).
#[derive(Clone)]
pub(crate) struct Ledger {
    pub db: DatabaseConnection,
    pub history: History,
    pub table: String,
    pub me: String,
    /// Sequence numbers per resource and token (a term renewed into a new local term is still
    /// one term in the ledger).
    pub sequences: Arc<Mutex<HashMap<(String, i64), i64>>>,
}

impl Ledger {
    pub(crate) async fn write(&self, term: &LeaderTerm) {
        self.write_all(&[term], Duration::ZERO, None).await
    }

    /// One fenced transaction for every term of `terms` (a client holding two locks fences
    /// its write with both): each term's fence, a row for each, then `hold` of the
    /// application's work before the commit. While it is open, `marker` exists (the fault
    /// scheduler aims its pauses and partitions at holders inside one). Each term gets its
    /// line: `write` when it committed, `refused` for the term whose fence refused (and
    /// `aborted` for the others), `aborted`/`failed` otherwise.
    pub(crate) async fn write_all(
        &self,
        terms: &[&LeaderTerm],
        hold: Duration,
        marker: Option<&std::path::Path>,
    ) {
        let seqs: Vec<i64> = {
            let mut all = self.sequences.lock().unwrap_or_else(|p| p.into_inner());
            terms
                .iter()
                .map(|term| {
                    let key = (term.resource().to_owned(), term.token().get());
                    let next = all.entry(key).or_insert(0);
                    *next += 1;
                    *next
                })
                .collect()
        };
        let started = mono_ns();
        // A write its term's end drops (a paused node's, when it wakes) says so too.
        let mut open: Vec<_> = terms
            .iter()
            .map(|term| {
                crate::candidate::Unfinished::new(
                    self.history.clone(),
                    format!("dropped {} {}", term.resource(), term.token()),
                    started,
                )
            })
            .collect();
        let _marker = marker.map(Marker::new);
        // Which term's fence refused, if one did.
        let mut refused_by = None;
        let result: Result<bool, Error> = async {
            let txn = self.db.begin().await?;
            for (i, term) in terms.iter().enumerate() {
                match term.fence(&txn).await {
                    Ok(()) => {}
                    Err(e) if e.is_fenced() => {
                        txn.rollback().await?;
                        refused_by = Some(i);
                        return Ok(false);
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            for (term, seq) in terms.iter().zip(&seqs) {
                let insert = Query::insert()
                    .into_table(Alias::new(&self.table))
                    .columns([
                        Alias::new("resource"),
                        Alias::new("token"),
                        Alias::new("candidate"),
                        Alias::new("seq"),
                    ])
                    .values([
                        term.resource().into(),
                        term.token().get().into(),
                        self.me.clone().into(),
                        (*seq).into(),
                    ])?
                    .to_owned();
                txn.execute(&insert).await?;
            }
            if !hold.is_zero() {
                tokio::time::sleep(hold).await;
            }
            if let Err(e) = txn.commit().await {
                let text = e.to_string();
                if text.contains("Deadlock") || text.contains("40001") {
                    return Ok(false);
                }
                return Err(e.into());
            }
            Ok(true)
        }
        .await;
        let now = mono_ns();
        for (i, ((term, seq), open)) in terms.iter().zip(&seqs).zip(&mut open).enumerate() {
            let (resource, token) = (term.resource(), term.token());
            let text = match &result {
                Ok(true) => format!("write {resource} {token} {seq} {now} {started}"),
                Ok(false) if refused_by == Some(i) => {
                    format!("refused {resource} {token} {now} {started}")
                }
                Ok(false) => format!("aborted {resource} {token} {now} {started}"),
                Err(_) => format!("failed {resource} {token} {now} {started}"),
            };
            open.finished();
            line(&self.history, &text);
        }
    }
}

/// A file that exists while a fenced transaction is open (see [`Ledger::write_all`]).
struct Marker<'a>(&'a std::path::Path);

impl<'a> Marker<'a> {
    fn new(path: &'a std::path::Path) -> Self {
        let _ = std::fs::write(path, b"");
        Self(path)
    }
}

impl Drop for Marker<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0);
    }
}
