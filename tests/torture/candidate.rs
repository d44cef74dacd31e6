//! The candidate process: one `Elector` over the real store, its calls, believed terms and
//! fenced ledger writes recorded line by line in its history file for the checker.

use std::collections::HashMap;
use std::time::Duration;

use orion_beacon::{Elector, Leadership, LeaseStore, SeaOrmLeaseStore};
use sea_orm::sea_query::{Alias, Query};
use sea_orm::{ConnectionTrait, DatabaseConnection, TransactionTrait};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::clock::{mono_ns, MonoClock};
use crate::common::double::{Double, Intercept};
use crate::db::{connect, connect_rollback_journal};
use crate::{Args, Error, LEASE, RENEW, RETRY, ROLLBACK_BUSY_TIMEOUT};

/// The history file the checker reads: one line per event, appended.
pub struct HistoryFile(pub std::fs::File);

impl HistoryFile {
    pub fn line(&mut self, line: &str) {
        use std::io::Write;
        // One write per line; a SIGKILL loses at most the line being written.
        let _ = self.0.write_all(format!("{line}\n").as_bytes());
    }
}

/// The store as the candidate uses it (as a `Double` over the real store): every
/// acquire-or-renew and its raw outcome go to the history as a `call` line (start, end,
/// outcome), so a violation can be traced to the statements behind it.
#[derive(Clone)]
struct Logged {
    history: std::sync::Arc<std::sync::Mutex<HistoryFile>>,
    /// When the first call that answered with each token returned (the earliest moment this
    /// candidate can believe in a term of that token), for stamping term starts.
    asked: Asked,
}

/// Token -> monotonic ns at which the first call that granted it returned.
type Asked = std::sync::Arc<std::sync::Mutex<HashMap<i64, u64>>>;

#[async_trait::async_trait]
impl Intercept<SeaOrmLeaseStore> for Logged {
    async fn acquire_or_renew(
        &self,
        inner: &SeaOrmLeaseStore,
        r: &str,
        c: &str,
        lease: Duration,
    ) -> Result<orion_beacon::store::LeaseOutcome, orion_beacon::StoreError> {
        let t0 = mono_ns();
        let out = inner.acquire_or_renew(r, c, lease).await;
        let t1 = mono_ns();
        if let Ok(
            orion_beacon::store::LeaseOutcome::Acquired(l)
            | orion_beacon::store::LeaseOutcome::Renewed(l),
        ) = &out
        {
            self.asked
                .lock()
                .unwrap()
                .entry(l.token.get())
                .or_insert(t1);
        }
        let what = match &out {
            Ok(orion_beacon::store::LeaseOutcome::Acquired(l)) => format!(
                "acquired {} rem={:?} acq={:?} exp={:?}",
                l.token, l.remaining, l.acquired_at, l.expires_at
            ),
            Ok(orion_beacon::store::LeaseOutcome::Renewed(l)) => format!(
                "renewed {} rem={:?} acq={:?} exp={:?}",
                l.token, l.remaining, l.acquired_at, l.expires_at
            ),
            Ok(orion_beacon::store::LeaseOutcome::Denied(d)) => {
                format!("denied {:?} {:?} rem={:?}", d.holder, d.token, d.remaining)
            }
            Err(e) => {
                // The whole chain: the top-level message alone says only "database error".
                let mut line = format!("error {e}");
                let mut source = std::error::Error::source(e);
                while let Some(cause) = source {
                    line += &format!(": {cause}");
                    source = cause.source();
                }
                line.replace('\n', " ")
            }
        };
        self.history
            .lock()
            .unwrap()
            .line(&format!("call {t0} {t1} {what}"));
        out
    }
}

/// The candidate's believed terms, as `lead` and `lost` lines in its history.
struct Terms {
    asked: Asked,
    current: std::sync::Mutex<Option<orion_beacon::LeaderTerm>>,
    /// The last term given a `lead` line: its work may report it after the watcher saw it end,
    /// and a second line would read as a new term on the same token.
    recorded: std::sync::Mutex<Option<orion_beacon::LeaderTerm>>,
    history: std::sync::Arc<std::sync::Mutex<HistoryFile>>,
    clock: MonoClock,
}

impl Terms {
    /// `term` is (or was) this candidate's: its line, if not written yet. The start is stamped
    /// when the first call that answered with its token returned, not when the line happens to
    /// be written (a watcher can look late).
    fn lead(&self, term: &orion_beacon::LeaderTerm) {
        let mut current = self.current.lock().unwrap();
        let mut recorded = self.recorded.lock().unwrap();
        if current.as_ref() == Some(term) || recorded.as_ref() == Some(term) {
            return;
        }
        if let Some(old) = current.take() {
            self.lost(&old);
        }
        // Belief starts when the grant's answer came back, not when it was asked for (a
        // statement can wait for a lock a long while, and nobody believes in it meanwhile).
        let mut start = self.clock.ns(tokio::time::Instant::now());
        if let Some(answered) = self.asked.lock().unwrap().get(&term.token().get()) {
            start = start.min(*answered);
        }
        self.history
            .lock()
            .unwrap()
            .line(&format!("lead {} {start}", term.token()));
        *current = Some(term.clone());
        *recorded = Some(term.clone());
    }

    /// No term now.
    fn follow(&self) {
        if let Some(old) = self.current.lock().unwrap().take() {
            self.lost(&old);
        }
    }

    fn lost(&self, old: &orion_beacon::LeaderTerm) {
        let why = old
            .loss_reason()
            .map_or("replaced".to_owned(), |r| r.to_string());
        let now = tokio::time::Instant::now();
        self.history.lock().unwrap().line(&format!(
            "lost {} {} {} {why}",
            old.token(),
            self.clock.ns(now),
            self.clock.ns(old.deadline())
        ));
    }
}

/// Runs one candidate until the harness writes `shutdown` to its standard input.
pub async fn run(args: Args) -> Result<(), Error> {
    let name = args.candidate.clone().unwrap_or_default();
    if let Some(history) = &args.history {
        crate::node_log::install(history);
    }
    let clock = MonoClock::new();
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(args.history.clone().unwrap_or_default())?;
    let history = std::sync::Arc::new(std::sync::Mutex::new(HistoryFile(file)));
    let wall_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    history
        .lock()
        .unwrap()
        .line(&format!("start {name} {} {wall_ms}", mono_ns()));

    let db = if args.rollback_journal {
        connect_rollback_journal(&args.url, args.pool.unwrap_or(3), ROLLBACK_BUSY_TIMEOUT).await?
    } else {
        connect(&args.url, args.pool.unwrap_or(3)).await?
    };
    let mut store = SeaOrmLeaseStore::new(db.clone())
        .with_table(&args.table)?
        .with_transaction_pooling(args.transaction_pooling);
    if args.rank.is_some() {
        store = store.with_member_table(&args.members)?;
    }
    // Fenced writes: the same pool, or a direct one where the lease pool cannot carry them.
    let (db, fence_store) = match &args.fence_url {
        Some(url) => {
            let direct = connect(url, args.pool.unwrap_or(3)).await?;
            let fence_store = SeaOrmLeaseStore::new(direct.clone()).with_table(&args.table)?;
            (direct, fence_store)
        }
        None => (db, store.clone()),
    };
    let asked: Asked = Default::default();
    let builder = Elector::builder(Double::over(
        store.clone(),
        Logged {
            history: history.clone(),
            asked: asked.clone(),
        },
    ))
    .resource(&args.resource)
    .candidate_id(&name)
    .lease_duration(LEASE)
    .renew_interval(RENEW)
    .retry_interval(RETRY)
    .grace_period(Duration::from_millis(200));
    let builder = match args.rank {
        Some(rank) => builder
            .rank(rank)
            .prefer_after(crate::rank_checker::PREFER_AFTER),
        None => builder,
    };
    let handle = builder.build()?.start();

    // Leadership as the candidate believes it: a line when a term starts and when it ends.
    // A watch channel keeps only its latest value, so a term can begin and end between two
    // looks of the watcher; the leader work, which only runs in a term, reports its term too.
    // Either way the line is written once per term.
    let terms = std::sync::Arc::new(Terms {
        current: std::sync::Mutex::new(None),
        recorded: std::sync::Mutex::new(None),
        history: history.clone(),
        clock,
        asked: asked.clone(),
    });
    let mut rx = handle.watch();
    let watched = terms.clone();
    let watcher = tokio::spawn(async move {
        loop {
            let state = rx.borrow_and_update().clone();
            match &state {
                Leadership::Leader(term) => watched.lead(term),
                _ => watched.follow(),
            }
            if rx.changed().await.is_err() {
                watched.follow();
                return;
            }
        }
    });

    // While leading: fenced ledger writes in a loop.
    let writer = LedgerWriter {
        db: db.clone(),
        store: fence_store.clone(),
        history: history.clone(),
        ledger: args.ledger.clone(),
        me: name.clone(),
        hold: args.pool.unwrap_or(3) >= 2,
        sequences: Default::default(),
    };
    let worked = terms.clone();
    let work_writer = writer.clone();
    let _work = handle.run_as_leader(move |term| {
        worked.lead(&term);
        let writer = work_writer.clone();
        async move {
            while !term.is_lost() {
                writer.write(&term).await;
                tokio::select! {
                    _ = term.lost() => {}
                    _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
            }
        }
    });
    // The classic bug fencing exists for: a leader paused (GC, SIGSTOP) past its lease wakes
    // up and writes with the term it had. After any stall longer than the lease, this task
    // sends one fenced write with the last term it saw, whatever the elector says now; the
    // fence must refuse it (the checker fails a stale write that committed).
    let zombie_rx = handle.watch();
    let zombie = tokio::spawn(async move {
        let mut last: Option<orion_beacon::LeaderTerm> = None;
        let mut tick = std::time::Instant::now();
        loop {
            if let Some(term) = zombie_rx.borrow().term() {
                last = Some(term.clone());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            let now = std::time::Instant::now();
            if now.duration_since(tick) > LEASE {
                if let Some(term) = last.as_ref().filter(|t| !t.is_current()) {
                    writer.write(term).await;
                }
            }
            tick = now;
        }
    });

    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = stdin.next_line().await {
        if line.trim() == "shutdown" {
            break;
        }
    }
    zombie.abort();
    handle.shutdown().await;
    let _ = watcher.await;
    history.lock().unwrap().line(&format!("stop {}", mono_ns()));
    Ok(())
}

/// A ledger write in progress: dropped before it finished (its term's work was dropped), it
/// writes `<what> <now> <started>`, so the checker knows the transaction was open until then.
pub struct Unfinished<H: std::ops::Deref<Target = std::sync::Mutex<HistoryFile>>> {
    history: H,
    what: String,
    started: u64,
    done: bool,
}

impl<H: std::ops::Deref<Target = std::sync::Mutex<HistoryFile>>> Unfinished<H> {
    pub fn new(history: H, what: String, started: u64) -> Self {
        Self {
            history,
            what,
            started,
            done: false,
        }
    }

    pub fn finished(&mut self) {
        self.done = true;
    }
}

impl<H: std::ops::Deref<Target = std::sync::Mutex<HistoryFile>>> Drop for Unfinished<H> {
    fn drop(&mut self) {
        if !self.done {
            let line = format!("{} {} {}", self.what, mono_ns(), self.started);
            self.history
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .line(&line);
        }
    }
}

/// How long a ledger transaction that "does work" stays open between its insert and its commit.
pub const IN_TRANSACTION: Duration = Duration::from_millis(60);

/// Fenced writes to the ledger table, each recorded in the history: `write` (committed),
/// `refused` (the fence said the term is stale), `aborted` (the commit lost to a concurrent
/// transaction: a Galera certification failure, a deadlock) or `failed` (any other error).
#[derive(Clone)]
struct LedgerWriter {
    db: DatabaseConnection,
    store: SeaOrmLeaseStore,
    history: std::sync::Arc<std::sync::Mutex<HistoryFile>>,
    ledger: String,
    me: String,
    /// Whether a third of the transactions stay open `IN_TRANSACTION`.
    hold: bool,
    /// Sequence numbers per token: one term per token (the elector never begins a term on an
    /// earlier term's token; the checker fails a run where it did).
    sequences: std::sync::Arc<std::sync::Mutex<HashMap<i64, i64>>>,
}

impl LedgerWriter {
    async fn write(&self, term: &orion_beacon::LeaderTerm) {
        let token = term.token();
        let seq: i64 = {
            let mut all = self.sequences.lock().unwrap();
            let next = all.entry(token.get()).or_insert(0);
            *next += 1;
            *next
        };
        let started = mono_ns();
        // A write its term's end drops (a paused leader's, when it wakes) says so too.
        let mut open = Unfinished::new(self.history.clone(), format!("dropped {token}"), started);
        let result: Result<Option<bool>, Error> = async {
            let txn = self.db.begin().await?;
            match self.store.fence(&txn, term).await {
                Ok(()) => {}
                Err(e) if e.is_fenced() => {
                    txn.rollback().await?;
                    return Ok(Some(false));
                }
                Err(e) => return Err(e.into()),
            }
            let insert = Query::insert()
                .into_table(Alias::new(&self.ledger))
                .columns([
                    Alias::new("token"),
                    Alias::new("candidate"),
                    Alias::new("seq"),
                ])
                .values([token.get().into(), self.me.clone().into(), seq.into()])?
                .to_owned();
            txn.execute(&insert).await?;
            // One in three does some work of the application's before committing, so pauses
            // and partitions land inside fenced transactions often. Not on a pool of one
            // connection: there the takeover cannot run (it needs a second), a documented limit.
            if self.hold && fastrand::u8(..3) == 0 {
                tokio::time::sleep(IN_TRANSACTION).await;
            }
            if let Err(e) = txn.commit().await {
                let text = e.to_string();
                if text.contains("Deadlock") || text.contains("40001") {
                    return Ok(None);
                }
                return Err(e.into());
            }
            Ok(Some(true))
        }
        .await;
        let now = mono_ns();
        // A session the server ended (a takeover's terminate or kill) while the term was still
        // current: a healthy transaction ended, which only the harness's own faults may do.
        if let Err(e) = &result {
            if session_ended(e) && term.is_current() {
                self.history
                    .lock()
                    .unwrap()
                    .line(&format!("ended {token} {now}"));
            }
        }
        // The transaction's start last: the checker counts the faults that hit inside one.
        let line = match result {
            Ok(Some(true)) => format!("write {token} {seq} {now} {started}"),
            Ok(Some(false)) => format!("refused {token} {now} {started}"),
            Ok(None) => format!("aborted {token} {now} {started}"),
            Err(_) => format!("failed {token} {now} {started}"),
        };
        open.finished();
        self.history.lock().unwrap().line(&line);
    }
}

/// Whether `err` says the session ended under the transaction: PostgreSQL's `57P01`
/// ("terminating connection due to administrator command", `pg_terminate_backend`); MariaDB's
/// 1927 ("Connection was killed") or, for a connection killed while idle, the socket closed
/// under the client (which a partition's reset looks like too: the checker leaves out the
/// candidate's own partitions).
fn session_ended(err: &Error) -> bool {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err.as_ref());
    while let Some(cause) = source {
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text.contains("57P01")
        || text.contains("administrator command")
        || text.contains("1927")
        || text.contains("Connection was killed")
        || text.contains("UnexpectedEof")
        || text.contains("Lost connection")
        || text.contains("ConnectionReset")
}
