//! The torture run: N candidate OS processes run the real `Elector` over a real database while a
//! fault scheduler kills, pauses, disconnects and restarts things; then a checker proves from
//! the recorded histories and the ledger table that there were never two leaders, tokens never
//! went backwards, no stale write committed, and leadership came back after every fault.
//!
//! ```sh
//! cargo test --all-features --test torture                      # the short CI run, every backend
//! cargo test --release --all-features --test torture -- --backend postgres --duration 600 --candidates 5 --seed 42
//! ```
//!
//! Options: `--backend NAME` (repeatable; default all configurations: `sqlite`, `postgres`,
//! `mysql`, `sqlite-rollback` (SQLite's rollback journal with a reader holding the file past
//! the busy timeout), `mariadb-simultaneous` (a server-wide `sql_mode` with
//! `SIMULTANEOUS_ASSIGNMENT`, candidates on pools of one connection), `postgres-pgbouncer`
//! (lease statements through a transaction-pooling PgBouncer), `pg-sync-failover` and
//! `pg-async-failover` (a primary and a standby behind one address, with the `failover`
//! fault; the asynchronous one holds its standby 2 s behind and kills the leader inside that
//! window before each failover, and its violations are measured, not failed on), `galera` (three
//! nodes, candidates spread over them, node faults, one node's clock 20 ms ahead); by name
//! only: `galera-skew` (300 ms ahead, measured)), `--duration SECS` (default 30),
//! `--candidates N` (default 5), `--seed N` (default: random, printed), `--faults
//! kill,pause,connkill,restart,failover,nodekill,nodestop` (default all that apply), `--pool N`
//! (connections per candidate pool; default per configuration), `--no-skew` (do not run
//! candidates under `faketime`). The candidate processes are this same binary, started with
//! `--candidate`.
//!
//! The servers are this binary's own private PostgreSQL and MariaDB instances
//! (`orion-beacon-testkit`), whatever `ORION_BEACON_PG_URL` / `ORION_BEACON_MYSQL_URL` say: the
//! faults restart them and kill their connections, so they never act on a server the run did not
//! start.

mod checker;
mod timeline;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::time::{clock_gettime, ClockId};
use nix::unistd::Pid;
use orion_beacon::{Elector, Leadership, LeaseStore, SeaOrmLeaseStore};
use sea_orm::sea_query::{Alias, ColumnDef, Query, Table};
use sea_orm::{ConnectionTrait, DatabaseConnection, TransactionTrait};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

type Error = Box<dyn std::error::Error + Send + Sync>;

const LEASE: Duration = Duration::from_millis(500);
const RENEW: Duration = Duration::from_millis(150);
const RETRY: Duration = Duration::from_millis(150);
/// The stated margin on top of lease + retry for recovery after a fault (pool reconnects,
/// back-off after store errors, a loaded 2-core machine).
const RECOVERY_MARGIN: Duration = Duration::from_millis(1500);

/// `CLOCK_MONOTONIC` in nanoseconds: comparable across processes on this host.
fn mono_ns() -> u64 {
    clock_gettime(ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

/// Maps a tokio instant (std `Instant`, i.e. `CLOCK_MONOTONIC` on Linux) to nanoseconds.
struct MonoClock {
    base_instant: std::time::Instant,
    base_ns: u64,
}

impl MonoClock {
    fn new() -> Self {
        Self {
            base_instant: std::time::Instant::now(),
            base_ns: mono_ns(),
        }
    }
    fn ns(&self, t: tokio::time::Instant) -> u64 {
        let t = t.into_std();
        if t >= self.base_instant {
            self.base_ns + (t - self.base_instant).as_nanos() as u64
        } else {
            self.base_ns - (self.base_instant - t).as_nanos() as u64
        }
    }
}

/// One configuration of the run: a backend and the settings around it that change semantics.
#[derive(Debug, Clone, Copy)]
struct Configuration {
    name: &'static str,
    backend: Backend,
    /// Connections per candidate pool (the elector and its fenced writes share it).
    pool: u32,
    /// SQLite: rollback journal (a commit waits for every reader) with a reader that holds
    /// its read lock now and then longer than the candidates' busy timeout.
    rollback_journal: bool,
    /// MariaDB: the server-wide `sql_mode`, when not the default.
    sql_mode: Option<&'static str>,
    /// PostgreSQL: the lease statements go through a transaction-pooling PgBouncer (the store
    /// in its `with_transaction_pooling` mode); fenced writes go to the server directly.
    pgbouncer: bool,
    /// PostgreSQL: a primary and a streaming standby behind one stable address (a PgBouncer in
    /// session pooling, re-pointed at failover), with the `failover` fault.
    failover: Option<orion_beacon_testkit::Replication>,
    /// Violations are the hazard being measured (asynchronous replication loses committed
    /// lease writes at failover): reported, and the run does not fail on them.
    measured: bool,
    /// Failover: the primary's WAL sender is stopped this long before the primary dies, so the
    /// standby is that far behind (replication lag, as across a network; on one machine an
    /// asynchronous standby is otherwise microseconds behind).
    standby_lag: Option<Duration>,
    /// MariaDB: a three-node Galera cluster, candidates spread over the nodes, with node
    /// faults; node 2's clock ahead by this much (libfaketime `FAKETIME`), if set.
    galera: Option<GaleraTopology>,
}

#[derive(Debug, Clone, Copy)]
struct GaleraTopology {
    node2_skew: Option<&'static str>,
}

/// One server with its defaults: three connections per candidate, nothing else changed.
const PLAIN: Configuration = Configuration {
    name: "",
    backend: Backend::Sqlite,
    pool: 3,
    rollback_journal: false,
    sql_mode: None,
    pgbouncer: false,
    failover: None,
    measured: false,
    standby_lag: None,
    galera: None,
};

/// The configurations a run without `--backend` goes through, in order.
const CONFIGURATIONS: [Configuration; 10] = [
    Configuration {
        name: "sqlite",
        backend: Backend::Sqlite,
        ..PLAIN
    },
    Configuration {
        name: "postgres",
        backend: Backend::Postgres,
        ..PLAIN
    },
    Configuration {
        name: "mysql",
        backend: Backend::MySql,
        ..PLAIN
    },
    // SQLite's own default journal, a long reader, pools of two.
    Configuration {
        name: "sqlite-rollback",
        backend: Backend::Sqlite,
        pool: 2,
        rollback_journal: true,
        ..PLAIN
    },
    // Every assignment of an UPDATE reads the old row (as `sql_mode=ORACLE` has it), pools of
    // one connection.
    Configuration {
        name: "mariadb-simultaneous",
        backend: Backend::MySql,
        pool: 1,
        sql_mode: Some(
            "STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_AUTO_CREATE_USER,NO_ENGINE_SUBSTITUTION,SIMULTANEOUS_ASSIGNMENT",
        ),
        ..PLAIN
    },
    // Lease statements through PgBouncer in `pool_mode = transaction`: consecutive statements
    // of one candidate reach different server connections. (A SeaORM transaction cannot go
    // through PgBouncer 1.18 at all, named prepared statements: fenced writes go direct.)
    Configuration {
        name: "postgres-pgbouncer",
        backend: Backend::Postgres,
        pgbouncer: true,
        ..PLAIN
    },
    // A primary and a synchronous standby: the standby has every commit a client was told of,
    // so a failover loses no grant.
    Configuration {
        name: "pg-sync-failover",
        backend: Backend::Postgres,
        failover: Some(orion_beacon_testkit::Replication::Synchronous),
        ..PLAIN
    },
    // The same with asynchronous replication and a standby 2 s behind when the primary
    // dies: the last committed lease writes are lost. Measured, not a failure.
    Configuration {
        name: "pg-async-failover",
        backend: Backend::Postgres,
        failover: Some(orion_beacon_testkit::Replication::Asynchronous),
        measured: true,
        standby_lag: Some(Duration::from_secs(2)),
        ..PLAIN
    },
    // Three Galera nodes, candidates spread over them; node 2's clock 20 ms ahead, inside the
    // step-down margin (lease / 10 = 50 ms): every node judges leases with its own clock.
    Configuration {
        name: "galera",
        backend: Backend::MySql,
        galera: Some(GaleraTopology {
            node2_skew: Some("+0.02"),
        }),
        ..PLAIN
    },
    // The same with node 2's clock 300 ms ahead, beyond the margin: a lease written through
    // another node looks expired on node 2 while its holder still trusts it. Measured.
    Configuration {
        name: "galera-skew",
        backend: Backend::MySql,
        measured: true,
        galera: Some(GaleraTopology {
            node2_skew: Some("+0.3"),
        }),
        ..PLAIN
    },
];

/// SQLite rollback-journal mode: the candidates' busy timeout.
const ROLLBACK_BUSY_TIMEOUT: Duration = Duration::from_millis(300);

#[derive(Debug, Clone)]
struct Args {
    candidate: Option<String>,
    backends: Vec<String>,
    duration: Duration,
    candidates: usize,
    seed: Option<u64>,
    faults: Option<Vec<String>>,
    skew: bool,
    /// Connections in each candidate's pool (default: per configuration).
    pool: Option<u32>,
    // candidate mode
    /// SQLite only: rollback journal (SQLite's default) instead of WAL.
    rollback_journal: bool,
    url: String,
    /// Where fenced writes go, when not to `url`.
    fence_url: Option<String>,
    /// The store's `with_transaction_pooling` mode.
    transaction_pooling: bool,
    table: String,
    ledger: String,
    resource: String,
    history: PathBuf,
}

fn parse_args() -> Result<Option<Args>, Error> {
    let mut a = Args {
        candidate: None,
        backends: Vec::new(),
        duration: Duration::from_secs(30),
        candidates: 5,
        seed: None,
        faults: None,
        skew: true,
        pool: None,
        rollback_journal: false,
        url: String::new(),
        fence_url: None,
        transaction_pooling: false,
        table: String::new(),
        ledger: String::new(),
        resource: String::new(),
        history: PathBuf::new(),
    };
    let mut filters = Vec::new();
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--candidate" => a.candidate = Some(value()?),
            "--backend" => a.backends.push(value()?),
            "--duration" => {
                a.duration = Duration::from_secs_f64(value()?.trim_end_matches('s').parse()?)
            }
            "--candidates" => a.candidates = value()?.parse()?,
            "--seed" => a.seed = Some(value()?.parse()?),
            "--faults" => a.faults = Some(value()?.split(',').map(str::to_owned).collect()),
            "--no-skew" => a.skew = false,
            "--pool" => a.pool = Some(value()?.parse()?),
            "--rollback-journal" => a.rollback_journal = true,
            "--url" => a.url = value()?,
            "--fence-url" => a.fence_url = Some(value()?),
            "--transaction-pooling" => a.transaction_pooling = true,
            "--table" => a.table = value()?,
            "--ledger" => a.ledger = value()?,
            "--resource" => a.resource = value()?,
            "--history" => a.history = PathBuf::from(value()?),
            // What the test runner may pass to every test binary.
            "--nocapture" | "--quiet" | "-q" | "--include-ignored" | "--ignored" | "--exact"
            | "--show-output" => {}
            s if s.starts_with("--test-threads")
                || s.starts_with("--format")
                || s.starts_with("--color") => {}
            s if s.starts_with('-') => return Err(format!("unknown option {s}").into()),
            s => filters.push(s.to_owned()),
        }
    }
    // `cargo test some_filter` passes the filter to every test binary: run only if it matches.
    if !filters.is_empty() && !filters.iter().any(|f| "torture".contains(f.as_str())) {
        return Ok(None);
    }
    if a.backends.is_empty() {
        // Everything but the skewed Galera run, a measurement that needs no repeating in CI.
        a.backends = CONFIGURATIONS
            .iter()
            .filter(|c| c.name != "galera-skew")
            .map(|c| c.name.to_owned())
            .collect();
    }
    Ok(Some(a))
}

fn main() {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("torture: no runtime: {e}");
            std::process::exit(2);
        }
    };
    let code = runtime.block_on(async {
        match parse_args() {
            Ok(None) => {
                println!("torture: filtered out");
                0
            }
            Ok(Some(args)) if args.candidate.is_some() => match candidate(args).await {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("candidate failed: {e}");
                    3
                }
            },
            Ok(Some(args)) => harness(args).await,
            Err(e) => {
                eprintln!("torture: {e}");
                2
            }
        }
    });
    std::process::exit(code);
}

// ---------------------------------------------------------------------------------------------
// The candidate process.

struct HistoryFile(std::fs::File);

impl HistoryFile {
    fn line(&mut self, line: &str) {
        use std::io::Write;
        // One write per line; a SIGKILL loses at most the line being written.
        let _ = self.0.write_all(format!("{line}\n").as_bytes());
    }
}

/// The store as the candidate uses it: every call and its raw outcome go to the history as a
/// `call` line (start, end, outcome), so a violation can be traced to the statements behind it.
#[derive(Clone)]
struct Logged {
    inner: SeaOrmLeaseStore,
    history: std::sync::Arc<std::sync::Mutex<HistoryFile>>,
    /// When the first call that answered with each token returned (the earliest moment this
    /// candidate can believe in a term of that token), for stamping term starts.
    asked: Asked,
}

/// Token -> monotonic ns at which the first call that granted it returned.
type Asked = std::sync::Arc<std::sync::Mutex<HashMap<i64, u64>>>;

#[async_trait::async_trait]
impl LeaseStore for Logged {
    async fn acquire_or_renew(
        &self,
        r: &str,
        c: &str,
        lease: Duration,
    ) -> Result<orion_beacon::LeaseOutcome, orion_beacon::StoreError> {
        let t0 = mono_ns();
        let out = self.inner.acquire_or_renew(r, c, lease).await;
        let t1 = mono_ns();
        if let Ok(
            orion_beacon::LeaseOutcome::Acquired(l) | orion_beacon::LeaseOutcome::Renewed(l),
        ) = &out
        {
            self.asked
                .lock()
                .unwrap()
                .entry(l.token.get())
                .or_insert(t1);
        }
        let what = match &out {
            Ok(orion_beacon::LeaseOutcome::Acquired(l)) => format!(
                "acquired {} rem={:?} acq={:?} exp={:?}",
                l.token, l.remaining, l.acquired_at, l.expires_at
            ),
            Ok(orion_beacon::LeaseOutcome::Renewed(l)) => format!(
                "renewed {} rem={:?} acq={:?} exp={:?}",
                l.token, l.remaining, l.acquired_at, l.expires_at
            ),
            Ok(orion_beacon::LeaseOutcome::Denied(d)) => {
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
    async fn release(&self, r: &str, c: &str) -> Result<bool, orion_beacon::StoreError> {
        self.inner.release(r, c).await
    }
    async fn release_lease(
        &self,
        lease: &orion_beacon::Lease,
    ) -> Result<bool, orion_beacon::StoreError> {
        self.inner.release_lease(lease).await
    }
    async fn current(
        &self,
        r: &str,
    ) -> Result<Option<orion_beacon::LeaseRecord>, orion_beacon::StoreError> {
        self.inner.current(r).await
    }
    fn release_events(&self) -> Option<orion_beacon::ReleaseEvents> {
        self.inner.release_events()
    }
}

async fn connect(url: &str, max: u32) -> Result<DatabaseConnection, Error> {
    let mut options = if url.starts_with("sqlite:") {
        orion_beacon::backend::sqlite::connect_options(url)
    } else {
        sea_orm::ConnectOptions::new(url)
    };
    options
        .max_connections(max)
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(2))
        .sqlx_logging(false);
    Ok(sea_orm::Database::connect(options).await?)
}

/// The candidate's believed terms, as `lead` and `lost` lines in its history.
struct Terms {
    asked: Asked,
    current: std::sync::Mutex<Option<orion_beacon::LeaderTerm>>,
    history: std::sync::Arc<std::sync::Mutex<HistoryFile>>,
    clock: MonoClock,
}

impl Terms {
    /// `term` is (or was) this candidate's: its line, if not written yet. The start is stamped
    /// when the first call that answered with its token returned, not when the line happens to
    /// be written (a watcher can look late).
    fn lead(&self, term: &orion_beacon::LeaderTerm) {
        let mut current = self.current.lock().unwrap();
        if current.as_ref() == Some(term) {
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

/// SQLite in rollback-journal mode (SQLite's own default) with a short busy timeout.
async fn connect_rollback_journal(
    url: &str,
    max: u32,
    busy_timeout: Duration,
) -> Result<DatabaseConnection, Error> {
    use sea_orm::sqlx::sqlite::SqliteJournalMode;
    let mut options = sea_orm::ConnectOptions::new(url);
    options
        .max_connections(max)
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(2))
        .sqlx_logging(false)
        .map_sqlx_sqlite_opts(move |o| {
            o.journal_mode(SqliteJournalMode::Delete)
                .busy_timeout(busy_timeout)
                .create_if_missing(true)
        });
    Ok(sea_orm::Database::connect(options).await?)
}

async fn candidate(args: Args) -> Result<(), Error> {
    let name = args.candidate.clone().unwrap_or_default();
    let clock = MonoClock::new();
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.history)?;
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
    let store = SeaOrmLeaseStore::new(db.clone())
        .with_table(&args.table)?
        .with_transaction_pooling(args.transaction_pooling);
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
    let handle = Elector::builder(Logged {
        inner: store.clone(),
        history: history.clone(),
        asked: asked.clone(),
    })
    .resource(&args.resource)
    .candidate_id(&name)
    .lease_duration(LEASE)
    .renew_interval(RENEW)
    .retry_interval(RETRY)
    .grace_period(Duration::from_millis(200))
    .build()?
    .start();

    // Leadership as the candidate believes it: a line when a term starts and when it ends.
    // A watch channel keeps only its latest value, so a term can begin and end between two
    // looks of the watcher; the leader work, which only runs in a term, reports its term too.
    // Either way the line is written once per term.
    let terms = std::sync::Arc::new(Terms {
        current: std::sync::Mutex::new(None),
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
    /// Sequence numbers per token: after a local step-down the store may renew the same token
    /// into a new local term, and that is still one term in the ledger.
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
        let line = match result {
            Ok(Some(true)) => format!("write {token} {seq} {now}"),
            Ok(Some(false)) => format!("refused {token} {now}"),
            Ok(None) => format!("aborted {token} {now}"),
            Err(_) => format!("failed {token} {now}"),
        };
        self.history.lock().unwrap().line(&line);
    }
}

// ---------------------------------------------------------------------------------------------
// The harness: candidates, faults, then the checker.

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Backend {
    Sqlite,
    Postgres,
    MySql,
}

struct Setup {
    backend: Backend,
    config: Configuration,
    /// The private MariaDB of this configuration.
    mariadb: Option<&'static orion_beacon_testkit::MariaDb>,
    /// The failover configurations' primary, standby and stable address.
    cluster: Option<std::sync::Arc<std::sync::Mutex<Cluster>>>,
    /// The Galera configurations' cluster, one URL per node (candidate `cN` uses node N mod
    /// 3), and the harness's connection to each node.
    galera: Option<std::sync::Arc<orion_beacon_testkit::Galera>>,
    node_urls: Vec<String>,
    node_admins: Vec<DatabaseConnection>,
    /// The URL candidates use.
    url: String,
    /// The URL candidates send fenced writes to, when not `url`.
    fence_url: Option<String>,
    /// The URL the harness itself uses (probes, the ledger).
    admin_url: String,
    table: String,
    ledger: String,
    resource: String,
    admin: DatabaseConnection,
    _dir: tempfile::TempDir,
    dir: PathBuf,
}

struct Proc {
    name: String,
    child: Child,
    history: PathBuf,
    pid: Option<u32>,
    skewed: bool,
    /// The libfaketime offset it runs under (`-3h`), if skewed.
    offset: Option<String>,
}

impl Proc {
    /// libfaketime keeps a shared-memory segment per process (`/dev/shm/faketime_shm_<pid>`,
    /// `sem.faketime_sem_<pid>`) and removes it at exit; a SIGKILLed candidate cannot.
    fn remove_faketime_leftovers(&self) {
        if let (true, Some(pid)) = (self.skewed, self.pid) {
            let _ = std::fs::remove_file(format!("/dev/shm/faketime_shm_{pid}"));
            let _ = std::fs::remove_file(format!("/dev/shm/sem.faketime_sem_{pid}"));
        }
    }
}

async fn harness(args: Args) -> i32 {
    let mut passed = 0;
    let mut failed = 0;
    let base_seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let skip = std::env::var("ORION_BEACON_SKIP").unwrap_or_default();
    if skip.split(',').any(|s| s.trim() == "torture") {
        println!("SKIPPED: torture (ORION_BEACON_SKIP)");
        println!("torture: 0 passed, 0 failed");
        return 0;
    }
    for (i, name) in args.backends.iter().enumerate() {
        let lookup = if name == "mariadb" { "mysql" } else { name };
        let Some(mut config) = CONFIGURATIONS.iter().copied().find(|c| c.name == lookup) else {
            eprintln!(
                "torture: unknown backend {name} (one of: {})",
                CONFIGURATIONS.map(|c| c.name).join(", ")
            );
            failed += 1;
            continue;
        };
        if let Some(pool) = args.pool {
            config.pool = pool;
        }
        if skip.split(',').any(|s| s.trim() == name) {
            println!("SKIPPED: torture[{name}] (ORION_BEACON_SKIP)");
            continue;
        }
        let seed = base_seed.wrapping_add(i as u64);
        match run_backend(config, &args, seed).await {
            Ok(true) => passed += 1,
            Ok(false) => failed += 1,
            Err(e) => {
                println!("torture[{name}] seed={seed}: harness error: {e}");
                failed += 1;
            }
        }
    }
    println!("torture: {passed} passed, {failed} failed");
    if failed > 0 {
        1
    } else {
        0
    }
}

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}_{:x}",
        std::process::id(),
        mono_ns() & 0xffff_ffff
    )
}

async fn setup(config: Configuration) -> Result<Setup, Error> {
    let backend = config.backend;
    let mut mariadb = None;
    let dir = tempfile::tempdir()?;
    let path = dir.path().to_path_buf();
    if std::env::var_os("ORION_TORTURE_KEEP").is_some() {
        println!("torture: histories kept in {}", path.display());
    }
    let mut fence_url = None;
    let mut cluster = None;
    let mut galera = None;
    let mut node_urls = Vec::new();
    let mut node_admins = Vec::new();
    let (url, admin_url) = match backend {
        Backend::MySql if config.galera.is_some() => {
            let topology = config.galera.ok_or("no topology")?;
            let g = tokio::task::spawn_blocking(move || start_galera(topology)).await??;
            connect(&g.node(0).url(), 1)
                .await?
                .execute_unprepared("CREATE DATABASE IF NOT EXISTS orion_torture")
                .await?;
            for node in g.nodes() {
                let url = node.url_for("orion_torture");
                node_admins.push(connect(&url, 2).await?);
                node_urls.push(url);
            }
            let url = node_urls[0].clone();
            galera = Some(std::sync::Arc::new(g));
            (url.clone(), url)
        }
        Backend::Postgres if config.failover.is_some() => {
            let replication = config
                .failover
                .unwrap_or(orion_beacon_testkit::Replication::Synchronous);
            let c = tokio::task::spawn_blocking(move || Cluster::start(replication)).await??;
            let base = c.bouncer.url();
            cluster = Some(std::sync::Arc::new(std::sync::Mutex::new(c)));
            let url = format!(
                "{base}?application_name=orion-torture-{}",
                std::process::id()
            );
            (url, base)
        }
        Backend::Sqlite => {
            let url = format!("sqlite://{}", path.join("torture.db").display());
            (url.clone(), url)
        }
        Backend::Postgres => {
            let base = private_postgres().await?.url();
            let url = format!(
                "{base}?application_name=orion-torture-{}",
                std::process::id()
            );
            if config.pgbouncer {
                let bouncer = private_pgbouncer().await?;
                let through = format!(
                    "{}?application_name=orion-torture-{}",
                    bouncer.url(),
                    std::process::id()
                );
                fence_url = Some(url);
                (through, base)
            } else {
                (url, base)
            }
        }
        Backend::MySql => {
            // A database of its own: connection kills hit only the candidates.
            let server = private_mariadb(config.sql_mode).await?;
            mariadb = Some(server);
            connect(&server.url(), 1)
                .await?
                .execute_unprepared("CREATE DATABASE IF NOT EXISTS orion_torture")
                .await?;
            let url = server.url_for("orion_torture");
            (url.clone(), url)
        }
    };
    // The harness's own connection: the candidates' journal mode (switching it needs the whole
    // file), with a patient busy timeout.
    let admin = if config.rollback_journal {
        connect_rollback_journal(&admin_url, 2, Duration::from_secs(10)).await?
    } else {
        connect(&admin_url, 2).await?
    };
    let table = unique("tt");
    let ledger = unique("ledger");
    use orion_beacon_migration::{CreateLeaseTable, MigrationTrait, SchemaManager};
    CreateLeaseTable::with_table(&table)?
        .up(&SchemaManager::new(&admin))
        .await?;
    let create = Table::create()
        .table(Alias::new(&ledger))
        .col(
            ColumnDef::new(Alias::new("id"))
                .big_integer()
                .not_null()
                .auto_increment()
                .primary_key(),
        )
        .col(ColumnDef::new(Alias::new("token")).big_integer().not_null())
        .col(
            ColumnDef::new(Alias::new("candidate"))
                .string_len(64)
                .not_null(),
        )
        .col(ColumnDef::new(Alias::new("seq")).big_integer().not_null())
        .to_owned();
    admin.execute(&create).await?;
    Ok(Setup {
        backend,
        config,
        mariadb,
        cluster,
        galera,
        node_urls,
        node_admins,
        url,
        fence_url,
        admin_url,
        table,
        ledger,
        resource: unique("job"),
        admin,
        _dir: dir,
        dir: path,
    })
}

fn spawn(s: &Setup, name: &str, skew: Option<&str>) -> Result<Proc, Error> {
    let exe = std::env::current_exe()?;
    // Galera: candidate `cN` (and its replacements `cN-rM`) talks to node N mod 3.
    let url = match s.node_urls.len() {
        0 => &s.url,
        nodes => {
            let index: usize = name
                .trim_start_matches('c')
                .split("-r")
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            &s.node_urls[index % nodes]
        }
    };
    let history = s.dir.join(format!("{name}.history"));
    let mut cmd = Command::new(&exe);
    if let Some(offset) = skew {
        // libfaketime preloaded into the candidate itself (the `faketime` wrapper would fork,
        // and a signal to the wrapper would miss the candidate). Only the wall clock moves.
        cmd.env("LD_PRELOAD", faketime_lib().unwrap_or_default())
            .env("FAKETIME", offset)
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    }
    cmd.args([
        "--candidate",
        name,
        "--url",
        url,
        "--table",
        &s.table,
        "--ledger",
        &s.ledger,
        "--resource",
        &s.resource,
    ])
    .arg("--history")
    .arg(&history)
    .args(["--pool", &s.config.pool.to_string()])
    .args(s.config.rollback_journal.then_some("--rollback-journal"))
    .args(s.config.pgbouncer.then_some("--transaction-pooling"))
    .args(
        s.fence_url
            .as_deref()
            .map(|url| ["--fence-url", url])
            .into_iter()
            .flatten(),
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::null())
    .stderr(Stdio::inherit())
    .kill_on_drop(true);
    let child = cmd.spawn()?;
    Ok(Proc {
        name: name.to_owned(),
        pid: child.id(),
        child,
        history,
        skewed: skew.is_some(),
        offset: skew.map(str::to_owned),
    })
}

/// Whether a skewed candidate's wall clock really ran at `offset` (e.g. `-3h`): its history's
/// `start` line has its monotonic and wall-clock times; ours, read now, give the true offset
/// between the two clocks. `None` if it did, else what is wrong.
fn skew_problem(history: &str, offset: &str) -> Option<String> {
    let start = history.lines().find(|l| l.starts_with("start "))?;
    let parts: Vec<&str> = start.split_whitespace().collect();
    let (mono, wall): (u64, u128) = match (parts.get(2)?.parse(), parts.get(3)?.parse()) {
        (Ok(m), Ok(w)) => (m, w),
        _ => return Some(format!("unreadable start line {start:?}")),
    };
    let unit = |c: char| match c {
        'h' => Some(3_600_000i128),
        'm' => Some(60_000),
        's' => Some(1_000),
        'd' => Some(86_400_000),
        _ => None,
    };
    let expected_ms = offset
        .strip_suffix(|c: char| c.is_ascii_alphabetic())
        .and_then(|n| n.parse::<i128>().ok())
        .zip(offset.chars().last().and_then(unit))
        .map(|(n, u)| n * u)?;
    let now_wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_millis() as i128;
    let now_mono = mono_ns() as i128;
    // Our wall clock at the candidate's start instant.
    let true_wall = now_wall - (now_mono - mono as i128) / 1_000_000;
    let seen = wall as i128 - true_wall;
    if (seen - expected_ms).abs() > 5_000 {
        Some(format!(
            "its wall clock was {seen} ms off, not {offset} ({expected_ms} ms): libfaketime did not take effect"
        ))
    } else {
        None
    }
}

/// libfaketime, from Debian's `faketime` package (or `ORION_TORTURE_FAKETIME_LIB`).
fn faketime_lib() -> Option<String> {
    if let Ok(path) = std::env::var("ORION_TORTURE_FAKETIME_LIB") {
        return Some(path);
    }
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
    ]
    .iter()
    .find(|p| std::path::Path::new(p).exists())
    .map(|p| p.to_string())
}

/// Read transactions on the lease table, one after another: 100 ms, and every fifth 450 ms
/// (half as long again as the candidates' busy timeout, so that commit fails and is rolled back).
async fn long_reader(db: DatabaseConnection, table: String) {
    let select = format!("SELECT COUNT(*) FROM \"{table}\"");
    for round in 0u64.. {
        let hold = if round % 5 == 4 { 450 } else { 100 };
        if let Ok(txn) = db.begin().await {
            let read = sea_orm::Statement::from_string(sea_orm::DbBackend::Sqlite, select.clone());
            let _ = txn.query_all_raw(read).await;
            tokio::time::sleep(Duration::from_millis(hold)).await;
            let _ = txn.commit().await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Aborts a background task when the run ends, however it ends.
struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

fn signal(p: &Proc, sig: Signal) {
    if let Some(pid) = p.child.id() {
        let _ = kill(Pid::from_raw(pid as i32), sig);
    }
}

async fn db_answers(url: &str) -> bool {
    match tokio::time::timeout(Duration::from_secs(3), connect(url, 1)).await {
        Ok(Ok(db)) => db.execute_unprepared("SELECT 1").await.is_ok(),
        _ => false,
    }
}

/// This binary's private PostgreSQL instance (started on first use, off the async threads).
async fn private_postgres() -> Result<&'static orion_beacon_testkit::Postgres, Error> {
    Ok(tokio::task::spawn_blocking(orion_beacon_testkit::Postgres::shared).await?)
}

/// The window in which a killed Galera node rejoined (its state transfer).
fn rejoined(start: u64, end: u64) -> checker::Fault {
    checker::Fault {
        kind: "noderejoin".into(),
        candidate: None,
        start,
        end,
    }
}

/// A three-node Galera cluster for the torture run. Galera's failure detector is tuned down
/// from its 5 s defaults (a silent node stalls every node's writes until it is suspected), as
/// deployments that need fast failover do.
fn start_galera(topology: GaleraTopology) -> Result<orion_beacon_testkit::Galera, Error> {
    let mut builder = orion_beacon_testkit::Galera::builder(3)
        .provider_option("evs.keepalive_period", "PT0.3S")
        .provider_option("evs.suspect_timeout", "PT1.5S")
        .provider_option("evs.inactive_check_period", "PT0.5S")
        .provider_option("evs.inactive_timeout", "PT3S")
        .provider_option("evs.install_timeout", "PT3S");
    if let Some(offset) = topology.node2_skew {
        let lib =
            faketime_lib().ok_or("libfaketime is not installed (apt-get install faketime)")?;
        builder = builder
            .node_env(2, "LD_PRELOAD", lib)
            .node_env(2, "FAKETIME", offset)
            .node_env(2, "FAKETIME_DONT_FAKE_MONOTONIC", "1");
    }
    Ok(builder.start()?)
}

/// A primary, its streaming standby (none while one is being rebuilt after a failover) and
/// the one address candidates use: a PgBouncer in session pooling, re-pointed at failover the
/// way HAProxy or Patroni move a service address.
struct Cluster {
    primary: orion_beacon_testkit::Postgres,
    standby: Option<orion_beacon_testkit::Postgres>,
    bouncer: orion_beacon_testkit::Pgbouncer,
    replication: orion_beacon_testkit::Replication,
}

impl Cluster {
    fn start(replication: orion_beacon_testkit::Replication) -> Result<Self, Error> {
        use orion_beacon_testkit::{Pgbouncer, PoolMode, Postgres};
        let primary = Postgres::builder().start()?;
        let standby = Self::standby_of(&primary, replication)?;
        let bouncer = Pgbouncer::builder(&primary)
            .pool_mode(PoolMode::Session)
            .setting("server_login_retry", "1")
            .start()?;
        Ok(Self {
            primary,
            standby: Some(standby),
            bouncer,
            replication,
        })
    }

    /// The primary's machine dies: SIGKILL to the postmaster and every backend at once (a
    /// backend left running could still answer). Then the standby is promoted and the address
    /// moves to it. `false` if there was no standby to fail over to.
    fn fail_over(&mut self, held_sender: Option<i32>) -> Result<bool, Error> {
        let Some(standby) = self.standby.take() else {
            return Ok(false);
        };
        if let Some(sender) = held_sender {
            // The lag must be real: the primary has committed WAL the standby never received.
            let behind = (|| -> Result<bool, Error> {
                let sent = lsn(&self.primary.sql("SELECT pg_current_wal_lsn()")?)?;
                let received =
                    lsn(&standby.sql("SELECT COALESCE(pg_last_wal_receive_lsn(), '0/0')")?)?;
                Ok(received < sent)
            })();
            if !matches!(behind, Ok(true)) {
                // Let the sender go, so the servers shut down normally, then fail the run.
                let _ = kill(Pid::from_raw(sender), Signal::SIGCONT);
                self.standby = Some(standby);
                return Err(match behind {
                    Err(e) => format!("could not compare WAL positions: {e}").into(),
                    _ => "the standby was not behind: the lag was not applied".into(),
                });
            }
        }
        if let Some(pid) = self.primary.pid() {
            kill_tree(pid);
        }
        self.primary.kill()?;
        standby.promote()?;
        self.bouncer.point_to(&standby)?;
        // Server connections to the dead primary are gone; PgBouncer opens new ones there.
        let old = std::mem::replace(&mut self.primary, standby);
        drop(old);
        Ok(true)
    }

    /// Stops the primary's WAL sender (SIGSTOP): the primary goes on committing (replication
    /// is asynchronous) while the standby receives nothing, as across a slow network.
    /// [`fail_over`](Self::fail_over) then kills the primary with it. `None` if there is no
    /// standby yet (it is being rebuilt).
    fn hold_sender(&self) -> Result<Option<i32>, Error> {
        if self.standby.is_none() {
            return Ok(None);
        }
        // The sender that streams to the standby (not one of a base backup just ending).
        // Right after a restart the standby takes a moment to reconnect.
        let give_up = std::time::Instant::now() + Duration::from_secs(3);
        let sender = loop {
            let pid = self
                .primary
                .sql("SELECT pid FROM pg_stat_replication WHERE state = 'streaming' LIMIT 1")
                .ok()
                .and_then(|out| out.trim().parse::<i32>().ok());
            if let Some(pid) = pid {
                break pid;
            }
            if std::time::Instant::now() > give_up {
                return Err("the primary streams to no standby: the lag cannot be applied".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        kill(Pid::from_raw(sender), Signal::SIGSTOP)?;
        Ok(Some(sender))
    }

    /// A new standby of the current primary, so the run can fail over again.
    fn rebuild_standby(&mut self) -> Result<(), Error> {
        self.standby = Some(Self::standby_of(&self.primary, self.replication)?);
        Ok(())
    }

    /// A streaming standby that reconnects 200 ms after losing its primary (default 5 s):
    /// under synchronous replication every commit waits for it, so after a primary restart no
    /// lease statement commits until it is back.
    fn standby_of(
        primary: &orion_beacon_testkit::Postgres,
        replication: orion_beacon_testkit::Replication,
    ) -> Result<orion_beacon_testkit::Postgres, Error> {
        Ok(primary
            .standby()
            .synchronous(replication == orion_beacon_testkit::Replication::Synchronous)
            .setting("wal_retrieve_retry_interval", "200ms")
            .start()?)
    }
}

/// A PostgreSQL LSN (`16/B374D848`) as a number.
fn lsn(text: &str) -> Result<u64, Error> {
    let (high, low) = text
        .trim()
        .split_once('/')
        .ok_or_else(|| format!("not an LSN: {text:?}"))?;
    Ok((u64::from_str_radix(high, 16)? << 32) | u64::from_str_radix(low, 16)?)
}

/// The process ids whose parent is `pid`.
fn children(pid: u32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|child| {
            std::fs::read_to_string(format!("/proc/{child}/stat"))
                .ok()
                .and_then(|stat| {
                    let rest = &stat[stat.rfind(')')? + 2..];
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

/// SIGKILL to `pid` and all its children, children first.
fn kill_tree(pid: u32) {
    let children = children(pid);
    let _ = kill(Pid::from_raw(pid as i32), Signal::SIGSTOP);
    for child in children {
        let _ = kill(Pid::from_raw(child), Signal::SIGKILL);
    }
    let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
}

/// This binary's PgBouncer (`pool_mode = transaction`) in front of its private PostgreSQL.
async fn private_pgbouncer() -> Result<&'static orion_beacon_testkit::Pgbouncer, Error> {
    static BOUNCER: tokio::sync::OnceCell<orion_beacon_testkit::Pgbouncer> =
        tokio::sync::OnceCell::const_new();
    let pg = private_postgres().await?;
    BOUNCER
        .get_or_try_init(|| async move {
            tokio::task::spawn_blocking(move || {
                orion_beacon_testkit::Pgbouncer::builder(pg)
                    .pool_mode(orion_beacon_testkit::PoolMode::Transaction)
                    // After one failed server login (a restart, killed connections), PgBouncer
                    // turns every client away for this long (default 15 s): no leader then.
                    .setting("server_login_retry", "1")
                    .start()
            })
            .await?
            .map_err(Error::from)
        })
        .await
}

/// This binary's private MariaDB instance, one per server-wide `sql_mode`.
async fn private_mariadb(
    sql_mode: Option<&'static str>,
) -> Result<&'static orion_beacon_testkit::MariaDb, Error> {
    Ok(tokio::task::spawn_blocking(move || match sql_mode {
        Some(mode) => orion_beacon_testkit::MariaDb::builder()
            .arg(format!("--sql-mode={mode}"))
            .shared(),
        None => orion_beacon_testkit::MariaDb::shared(),
    })
    .await?)
}

/// Restarts the private server (a clean stop, then a start on the same port and data), then
/// waits until it answers queries.
async fn restart_server(s: &Setup, probe_url: &str) -> Result<(), Error> {
    match s.backend {
        Backend::Postgres if s.cluster.is_some() => {
            let cluster = s.cluster.clone().ok_or("no cluster")?;
            tokio::task::spawn_blocking(move || {
                let c = cluster.lock().unwrap_or_else(|e| e.into_inner());
                c.primary.restart()
            })
            .await??;
        }
        Backend::Postgres => {
            let pg = private_postgres().await?;
            tokio::task::spawn_blocking(move || pg.restart()).await??;
        }
        Backend::MySql => {
            let db = s.mariadb.ok_or("no private MariaDB")?;
            tokio::task::spawn_blocking(move || db.restart()).await??;
        }
        Backend::Sqlite => return Ok(()),
    }
    for _ in 0..120 {
        if db_answers(probe_url).await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err("the database did not come back within 60 s".into())
}

async fn kill_connections(s: &Setup) -> Result<u64, Error> {
    match s.backend {
        Backend::Postgres => {
            let sql = format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'orion-torture-{}'",
                std::process::id()
            );
            Ok(s.admin
                .query_all_raw(sea_orm::Statement::from_string(
                    s.admin.get_database_backend(),
                    sql,
                ))
                .await?
                .len() as u64)
        }
        Backend::MySql => {
            let admins = if s.node_admins.is_empty() {
                std::slice::from_ref(&s.admin)
            } else {
                &s.node_admins[..]
            };
            let mut n = 0;
            for admin in admins {
                // A node that is down has no connections to kill.
                let Ok(rows) = admin
                    .query_all_raw(sea_orm::Statement::from_string(
                        admin.get_database_backend(),
                        "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = 'orion_torture' AND ID <> CONNECTION_ID()",
                    ))
                    .await
                else {
                    continue;
                };
                for row in rows {
                    let id: i64 = row
                        .try_get_by_index::<u64>(0)
                        .map(|v| v as i64)
                        .or_else(|_| row.try_get_by_index::<i64>(0))?;
                    if admin
                        .execute_unprepared(&format!("KILL CONNECTION {id}"))
                        .await
                        .is_ok()
                    {
                        n += 1;
                    }
                }
            }
            Ok(n)
        }
        Backend::Sqlite => Ok(0),
    }
}

/// What the fault loop records about the faults it applied.
struct Faults<'a> {
    fault_log: &'a mut Vec<checker::Fault>,
    kills: &'a mut HashMap<String, u64>,
    counts: &'a mut HashMap<String, u32>,
    incarnation: &'a mut u32,
}

/// SIGKILLs the leader (no release: its lease must lapse) and, after a while, starts a new
/// incarnation (a new candidate id) in its place. `false` if no leader was found.
async fn kill_leader(
    s: &Setup,
    procs: &mut Vec<Proc>,
    run: &mut Faults<'_>,
    rng: &mut Rng,
) -> Result<bool, Error> {
    let Some(p) = leader_process(s, procs).await else {
        return Ok(false);
    };
    let name = p.name.clone();
    signal(p, Signal::SIGKILL);
    let at = mono_ns();
    run.kills.insert(name.clone(), at);
    run.fault_log.push(checker::Fault {
        kind: "kill".into(),
        candidate: Some(name.clone()),
        start: at,
        end: at,
    });
    *run.counts.entry("kill".into()).or_default() += 1;
    tokio::time::sleep(Duration::from_millis(300 + rng.below(700))).await;
    *run.incarnation += 1;
    let base = name.split("-r").next().unwrap_or(&name);
    let fresh = format!("{base}-r{}", run.incarnation);
    if let Some(slot) = procs.iter_mut().find(|p| p.name == name) {
        let _ = slot.child.wait().await;
        // The replacement runs on the same (skewed) host clock.
        let offset = slot.offset.clone();
        let old = std::mem::replace(slot, spawn(s, &fresh, offset.as_deref())?);
        // keep the dead one's history for the checker
        procs.push(old);
    }
    Ok(true)
}

async fn leader_process<'a>(s: &Setup, procs: &'a [Proc]) -> Option<&'a Proc> {
    let store = SeaOrmLeaseStore::new(s.admin.clone())
        .with_table(&s.table)
        .ok()?;
    let rec = store.current(&s.resource).await.ok()??;
    if !rec.live {
        return None;
    }
    procs.iter().find(|p| p.name == rec.holder)
}

async fn run_backend(config: Configuration, args: &Args, seed: u64) -> Result<bool, Error> {
    let backend = config.backend;
    let label = config.name.to_owned();
    let mut rng = Rng(seed.max(1));
    let s = setup(config).await?;
    // SQLite rollback journal: a reader that holds the file's read lock now and then, sometimes
    // past the candidates' busy timeout, so their commits fail and are rolled back.
    let reader = if config.rollback_journal {
        let db = connect_rollback_journal(&s.url, 1, ROLLBACK_BUSY_TIMEOUT).await?;
        let table = s.table.clone();
        Some(tokio::spawn(long_reader(db, table)))
    } else {
        None
    };
    let probe = s.admin_url.clone();
    let all_faults: Vec<&str> = match backend {
        Backend::Sqlite => vec!["kill", "pause"],
        _ if s.cluster.is_some() => vec!["kill", "pause", "connkill", "restart", "failover"],
        _ if s.galera.is_some() => {
            vec![
                "kill", "pause", "connkill", "restart", "nodekill", "nodestop",
            ]
        }
        _ => vec!["kill", "pause", "connkill", "restart"],
    };
    let faults: Vec<String> = match &args.faults {
        Some(list) => all_faults
            .iter()
            .filter(|f| list.iter().any(|l| l == *f))
            .map(|f| f.to_string())
            .collect(),
        None => all_faults.iter().map(|f| f.to_string()).collect(),
    };
    // SQLite's clock is each process's own wall clock (the library runs in the candidate), so
    // skewing one process's wall clock is a setup that cannot exist on a real host: there the
    // processes share the host clock. Skew is a fault for the server backends, whose clock is
    // the server's.
    let skew = args.skew && backend != Backend::Sqlite;
    let _reader = AbortOnDrop(reader);
    if skew && faketime_lib().is_none() {
        return Err(
            "libfaketime is not installed (apt-get install faketime), or pass --no-skew".into(),
        );
    }
    let offsets = ["-3h", "+5h", "-26h"];
    let mut procs: Vec<Proc> = Vec::new();
    let mut fault_log: Vec<checker::Fault> = Vec::new();
    let mut kills: HashMap<String, u64> = HashMap::new();
    let mut skewed = 0;
    for i in 0..args.candidates {
        let name = format!("c{i}");
        let offset = if skew && i % 2 == 1 {
            Some(offsets[(i / 2) % offsets.len()])
        } else {
            None
        };
        skewed += usize::from(offset.is_some());
        procs.push(spawn(&s, &name, offset)?);
    }
    let started = tokio::time::Instant::now();
    let run_start_ns = mono_ns();
    let mut incarnation = 0;
    let mut counts: HashMap<String, u32> = HashMap::new();
    // Every kind at least once, in a seeded order, then random ones.
    let mut bag: Vec<String> = faults.clone();
    for i in (1..bag.len()).rev() {
        bag.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut restarts = 0;
    // Failovers with a leader killed inside the replication lag (see `standby_lag`).
    let mut lag_kills = 0;
    // Faults of the run itself that did nothing (a connkill that killed nothing, a requested
    // kind never applied, a clock that was not skewed): the run proves less than it says.
    let mut run_violations: Vec<String> = Vec::new();
    // Kinds that found no leader to hit: tried again later.
    let mut skipped: Vec<String> = Vec::new();
    // Standbys being rebuilt after a failover.
    let mut rebuilds = Vec::new();
    // A Galera node rejoining after a kill.
    let mut rejoin: Option<tokio::task::JoinHandle<Result<(u64, u64), Error>>> = None;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    while started.elapsed() + Duration::from_secs(3) < args.duration && !faults.is_empty() {
        let kind = match (skipped.len() > 3, bag.pop()) {
            (false, Some(kind)) => kind,
            (_, popped) => {
                bag.extend(popped);
                skipped
                    .pop()
                    .unwrap_or_else(|| faults[rng.below(faults.len() as u64) as usize].clone())
            }
        };
        // A restart takes a while; one per 60 s of run is plenty.
        if kind == "restart" && restarts as f64 > args.duration.as_secs_f64() / 60.0 {
            continue;
        }
        match kind.as_str() {
            "kill" => {
                let mut run = Faults {
                    fault_log: &mut fault_log,
                    kills: &mut kills,
                    counts: &mut counts,
                    incarnation: &mut incarnation,
                };
                if !kill_leader(&s, &mut procs, &mut run, &mut rng).await? {
                    skipped.push(kind.clone());
                }
            }
            "pause" => {
                if let Some(p) = leader_process(&s, &procs).await {
                    let name = p.name.clone();
                    let from = mono_ns();
                    signal(p, Signal::SIGSTOP);
                    tokio::time::sleep(LEASE * 2 + Duration::from_millis(rng.below(500))).await;
                    if let Some(p) = procs.iter().find(|p| p.name == name) {
                        signal(p, Signal::SIGCONT);
                    }
                    let to = mono_ns();
                    // Liveness: another candidate takes over, measured from `from`.
                    fault_log.push(checker::Fault {
                        kind: "pause".into(),
                        candidate: Some(name),
                        start: from,
                        end: to,
                    });
                    *counts.entry(kind.clone()).or_default() += 1;
                } else {
                    skipped.push(kind.clone());
                }
            }
            "connkill" => {
                let at = mono_ns();
                let n = kill_connections(&s).await?;
                fault_log.push(checker::Fault {
                    kind: "connkill".into(),
                    candidate: None,
                    start: at,
                    end: at,
                });
                *counts.entry(kind.clone()).or_default() += 1;
                if n == 0 {
                    run_violations.push(format!("connkill at {at} killed no connection"));
                }
            }
            "nodekill" | "nodestop" | "restart" if s.galera.is_some() => {
                let Some(g) = s.galera.clone() else {
                    continue;
                };
                // One node fault at a time: a node still rejoining is not hit again (two of
                // three nodes down is no quorum, which no lease store survives).
                if rejoin.as_ref().is_some_and(|r| !r.is_finished()) {
                    skipped.push(kind.clone());
                } else {
                    if let Some(r) = rejoin.take() {
                        match r.await? {
                            Ok((start, end)) => fault_log.push(rejoined(start, end)),
                            Err(e) => {
                                run_violations.push(format!("a Galera node did not rejoin: {e}"))
                            }
                        }
                    }
                    // Nodes 1 and 2: the harness reads the ledger through node 0.
                    let node = 1 + rng.below(2) as usize;
                    let stop_for = LEASE + Duration::from_millis(100 + rng.below(100));
                    let from = mono_ns();
                    let kill = kind == "nodekill";
                    let restart = kind == "restart";
                    let g2 = g.clone();
                    tokio::task::spawn_blocking(move || -> Result<(), Error> {
                        if restart {
                            // Cleanly: it rejoins with an incremental state transfer.
                            g2.node(node).restart()?;
                            g2.wait_synced(Duration::from_secs(120))?;
                            return Ok(());
                        }
                        if kill {
                            // The others go on as a cluster of two once they suspect it.
                            g2.node(node).kill()?;
                        } else {
                            // Longer than a lease, shorter than the failure detector: every
                            // node's writes wait for it.
                            g2.node(node).signal("STOP")?;
                            std::thread::sleep(stop_for);
                            g2.node(node).signal("CONT")?;
                        }
                        if g2.wait_synced(Duration::from_secs(30)).is_err() && !kill {
                            // Evicted after all and stuck outside the cluster: what an
                            // operator does, a restart, after which it rejoins.
                            g2.node(node).restart()?;
                            g2.wait_synced(Duration::from_secs(120))?;
                        } else if kill {
                            g2.wait_synced(Duration::from_secs(60))?;
                        }
                        Ok(())
                    })
                    .await??;
                    let to = mono_ns();
                    fault_log.push(checker::Fault {
                        kind: kind.clone(),
                        candidate: None,
                        start: from,
                        end: to,
                    });
                    *counts.entry(kind.clone()).or_default() += 1;
                    if kill {
                        // Back after a while, with a full state transfer (its data after a
                        // SIGKILL is not trusted).
                        // The state transfer blocks the donor's writes while it runs: a
                        // server fault window of its own.
                        rejoin = Some(tokio::task::spawn_blocking(
                            move || -> Result<(u64, u64), Error> {
                                std::thread::sleep(Duration::from_secs(2));
                                let start = mono_ns();
                                g.node(node).start()?;
                                g.wait_synced(Duration::from_secs(120))?;
                                Ok((start, mono_ns()))
                            },
                        ));
                    }
                }
            }
            "failover" => {
                let Some(cluster) = s.cluster.clone() else {
                    continue;
                };
                // Replication lag: the primary stops sending WAL, and a term changes hands (the
                // leader is killed) while the standby is behind, so the writes the failover
                // loses include a grant.
                let mut held = None;
                if let Some(lag) = s.config.standby_lag {
                    let lag_end = tokio::time::Instant::now() + lag;
                    let c = cluster.clone();
                    held = tokio::task::spawn_blocking(move || {
                        c.lock().unwrap_or_else(|e| e.into_inner()).hold_sender()
                    })
                    .await??;
                    if let Some(sender) = held {
                        let mut run = Faults {
                            fault_log: &mut fault_log,
                            kills: &mut kills,
                            counts: &mut counts,
                            incarnation: &mut incarnation,
                        };
                        match kill_leader(&s, &mut procs, &mut run, &mut rng).await {
                            Ok(true) => lag_kills += 1,
                            Ok(false) => {}
                            Err(e) => {
                                let _ = kill(Pid::from_raw(sender), Signal::SIGCONT);
                                return Err(e);
                            }
                        }
                        tokio::time::sleep_until(lag_end).await;
                    }
                }
                let from = mono_ns();
                let failed_over = tokio::task::spawn_blocking(move || {
                    cluster
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .fail_over(held)
                })
                .await??;
                if failed_over {
                    let to = mono_ns();
                    fault_log.push(checker::Fault {
                        kind: "failover".into(),
                        candidate: None,
                        start: from,
                        end: to,
                    });
                    *counts.entry(kind.clone()).or_default() += 1;
                    // A standby of the new primary, so the run can fail over again.
                    let cluster = s.cluster.clone();
                    rebuilds.push(tokio::task::spawn_blocking(move || match cluster {
                        Some(c) => c
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .rebuild_standby(),
                        None => Ok(()),
                    }));
                } else {
                    // The standby is still being rebuilt.
                    skipped.push(kind.clone());
                }
            }
            "restart" => {
                let from = mono_ns();
                restart_server(&s, &probe).await?;
                let to = mono_ns();
                restarts += 1;
                fault_log.push(checker::Fault {
                    kind: "restart".into(),
                    candidate: None,
                    start: from,
                    end: to,
                });
                *counts.entry(kind.clone()).or_default() += 1;
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(1000 + rng.below(1500))).await;
    }
    let remaining = args.duration.saturating_sub(started.elapsed());
    tokio::time::sleep(remaining.max(Duration::from_secs(2))).await;

    for rebuild in rebuilds {
        if let Err(e) = rebuild.await? {
            run_violations.push(format!("a standby could not be rebuilt: {e}"));
        }
    }
    if let Some(r) = rejoin.take() {
        match r.await? {
            Ok((start, end)) => fault_log.push(rejoined(start, end)),
            Err(e) => run_violations.push(format!("a Galera node did not rejoin: {e}")),
        }
    }
    // Stop everyone gracefully, then read what they wrote.
    let quiesce_ns = mono_ns();
    for p in &mut procs {
        if let Some(stdin) = p.child.stdin.as_mut() {
            let _ = stdin.write_all(b"shutdown\n").await;
        }
    }
    for p in &mut procs {
        if tokio::time::timeout(Duration::from_secs(10), p.child.wait())
            .await
            .is_err()
        {
            let _ = p.child.start_kill();
            let _ = p.child.wait().await;
        }
    }
    for p in &procs {
        p.remove_faketime_leftovers();
    }
    let run_end_ns = mono_ns();
    let mut record = checker::Record {
        end: run_end_ns,
        quiesce: quiesce_ns,
        // A SIGSTOPped candidate may be inside a fenced transaction, which holds the lease
        // row's lock (SQLite: the file's) until it ends: no takeover until it wakes, on any
        // backend. That is the fence working, so recovery counts from the wake-up.
        pause_blocks_store: true,
        faults: fault_log,
        ..checker::Record::default()
    };
    for p in &procs {
        let text = std::fs::read_to_string(&p.history).unwrap_or_default();
        record.add_history(&text, kills.get(&p.name).copied())?;
        if let Some(offset) = &p.offset {
            if let Some(problem) = skew_problem(&text, offset) {
                run_violations.push(format!("{}: {problem}", p.name));
            }
        }
    }
    for kind in &faults {
        if !counts.contains_key(kind) {
            run_violations.push(format!("fault {kind} was requested but never applied"));
        }
    }
    if counts.contains_key("pause") && record.writes_refused + record.writes_aborted == 0 {
        run_violations.push(
            "leaders were paused past their lease, yet no stale write was refused by the fence \
             or aborted at commit (the woken leader's write never reached the database)"
                .to_owned(),
        );
    }
    let admin = &s.admin;
    let rows = admin
        .query_all(
            &Query::select()
                .columns([
                    Alias::new("id"),
                    Alias::new("token"),
                    Alias::new("candidate"),
                    Alias::new("seq"),
                ])
                .from(Alias::new(&s.ledger))
                .order_by(Alias::new("id"), sea_orm::sea_query::Order::Asc)
                .to_owned(),
        )
        .await?;
    for row in rows {
        record.ledger.push(checker::LedgerRow {
            id: row.try_get_by_index(0)?,
            token: row.try_get_by_index(1)?,
            candidate: row.try_get_by_index(2)?,
            seq: row.try_get_by_index(3)?,
        });
    }
    let bound = LEASE + RETRY + RECOVERY_MARGIN;
    let mut verdict = checker::check(&record, bound.as_nanos() as u64);
    // A measured hazard: what the checker found is the figure, not a failure of the run.
    let measured = if config.measured {
        std::mem::take(&mut verdict.violations)
    } else {
        Vec::new()
    };
    verdict.violations.extend(run_violations);
    let tokens_in_table = SeaOrmLeaseStore::new(admin.clone())
        .with_table(&s.table)?
        .current(&s.resource)
        .await?
        .map(|r| r.token.get());

    let mut kinds: Vec<String> = counts.iter().map(|(k, v)| format!("{k}={v}")).collect();
    kinds.sort();
    println!(
        "torture[{label}] seed={seed} duration={:.0}s candidates={} skewed={skewed} operations={} (fenced {}, aborted {}, failed {}) terms={} last_token={} faults: {} violations={} worst_recovery={}ms (bound {}ms)",
        (run_end_ns - run_start_ns) as f64 / 1e9,
        args.candidates,
        record.writes_committed
            + record.writes_refused
            + record.writes_aborted
            + record.writes_failed,
        record.writes_refused,
        record.writes_aborted,
        record.writes_failed,
        verdict.terms,
        tokens_in_table.unwrap_or(0),
        kinds.join(" "),
        verdict.violations.len(),
        verdict.worst_recovery_ns / 1_000_000,
        bound.as_millis(),
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
            "  failovers: {} ({lag_kills} with a leader killed inside the lag; primary killed to \
             address moved: {min}..{max} ms; lease {} ms)",
            failovers.len(),
            LEASE.as_millis()
        );
    }
    for v in &verdict.violations {
        println!("  VIOLATION: {v}");
    }
    if config.measured {
        let mut by_kind: std::collections::BTreeMap<String, usize> = Default::default();
        for v in &measured {
            // "token 7 reused: by c1 and by c2" counts as "token reused".
            let head = v.split(':').next().unwrap_or(v);
            let head = head.split(" within").next().unwrap_or(head);
            let kind: Vec<&str> = head
                .split_whitespace()
                .filter(|w| !w.chars().all(|c| c.is_ascii_digit()))
                .collect();
            *by_kind.entry(kind.join(" ")).or_default() += 1;
        }
        let mut kinds: Vec<String> = counts.iter().map(|(k, v)| format!("{k}={v}")).collect();
        kinds.sort();
        println!(
            "  measured (not a failure): {} violations {:?} with faults {}",
            measured.len(),
            by_kind,
            kinds.join(" ")
        );
        for v in &measured {
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
    // The picture, next to the histories; kept (with them) when asked for or when the run
    // failed. (A measured configuration finds something on every run: its histories are kept
    // only when asked for, or every test run would leave a directory behind.)
    let picture = s.dir.join("timeline.svg");
    std::fs::write(&picture, timeline::render(&record, &label, run_start_ns))?;
    if std::env::var_os("ORION_TORTURE_KEEP").is_some() || !verdict.violations.is_empty() {
        println!("  timeline: {}", picture.display());
        std::mem::forget(s._dir);
        return Ok(verdict.violations.is_empty() && verdict.terms > 0);
    }
    // Clean up the tables (the temp dir goes by itself).
    let _ = admin
        .execute(&Table::drop().table(Alias::new(&s.ledger)).to_owned())
        .await;
    let _ = admin
        .execute(&Table::drop().table(Alias::new(&s.table)).to_owned())
        .await;
    Ok(verdict.violations.is_empty() && verdict.terms > 0)
}
