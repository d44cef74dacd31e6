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
//! nodes, candidates spread over them, node faults, one node's clock 20 ms ahead),
//! `shards-postgres` and `shards-mysql` (shard sets: every candidate is a node of one
//! `ShardSet` over `--shards` resources, each led resource writing fenced ledger rows, checked
//! per resource, see `shard_node.rs` and `shard_checker.rs`), `lock-postgres` and
//! `semaphore-mysql` (lock clients taking one lock, or a permit of a semaphore of two, under
//! the same faults, checked per lease row, see `lock_node.rs`), `rwlock-postgres` (a
//! reader-writer lock of three read slots, a third of the holds writes, also checked for every
//! write hold holding every slot with a token above every earlier hold's), `jobs-postgres` (every
//! candidate a node of one `Jobs` scheduler running the job `tick` every second, each attempt
//! writing a row in its slot's fenced transaction held open 0-300 ms; checked per slot from the
//! run table and the writes table: no slot done twice, no finished slot's write missing, no
//! write without its slot's mark, see `job_node.rs` and `jobs_checker.rs`),
//! `jobs-spread-postgres` (the same with the runs spread over the nodes, each under a hold of
//! its own, and 100 load jobs), `rate-postgres` and
//! `rate-mysql` (by name only; rate-limit clients asking for permits of one key, checked
//! together: never more than the quota allows in any span of its interval by the database
//! clock, see `rate_node.rs` and `rate_checker.rs`); by name only:
//! `galera-skew` (300 ms ahead, measured), `shards-sqlite`, `semaphore-sqlite`, `jobs-mysql`
//! and `jobs-sqlite`), `--duration SECS` (default 30, the shard sets, locks and jobs 20),
//! `--candidates N` (default 5), `--seed N` (default: random, printed), `--faults
//! kill,pause,connkill,restart,failover,nodekill,nodestop` (default all that apply), `--pool N`
//! (connections per candidate pool; default per configuration), `--no-skew` (do not run
//! candidates under `faketime`), `--shards N` (resources of the shard-set configurations,
//! default 64), `--parallel N` (configurations run at the same time, default 2; two on one
//! shared server never run together, as its faults restart it; `1` runs them one by one). The
//! candidate processes are this same binary, started with `--candidate`.
//!
//! The servers are this binary's own private PostgreSQL and MariaDB instances
//! (`orion-beacon-testkit`), whatever `ORION_BEACON_PG_URL` / `ORION_BEACON_MYSQL_URL` say: the
//! faults restart them and kill their connections, so they never act on a server the run did not
//! start.

mod candidate;
mod checker;
mod clock;
#[path = "../common/mod.rs"]
mod common;
mod db;
mod faults;
mod job_node;
mod jobs_checker;
mod lock_node;
mod node_log;
mod rank_checker;
mod rate_checker;
mod rate_node;
mod report;
mod run;
mod servers;
mod shard_checker;
mod shard_node;
mod skew;
mod timeline;

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Parser};

use crate::common::Rng;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Every candidate's elector settings.
const LEASE: Duration = Duration::from_millis(500);
const RENEW: Duration = Duration::from_millis(150);
const RETRY: Duration = Duration::from_millis(150);
/// The stated margin on top of lease + retry for recovery after a fault (pool reconnects,
/// back-off after store errors, a loaded 2-core machine).
const RECOVERY_MARGIN: Duration = Duration::from_millis(1500);
/// The documented bound from a stalled holder's lapse to the next grant (the takeover); the
/// checker adds a lease (a renew the holder sent before it stalled, queued behind its own
/// fenced transaction, renews it once more) and a follower's retry.
const TAKEOVER_BOUND: Duration = Duration::from_secs(1);

/// The shard-set configurations' nodes: the same lease (and step-down margin, a tenth of it) as
/// the electors, one round (heartbeat, batched renew, look, rebalance) every 150 ms, one
/// resource of slack, 200 ms for handed-over work to return.
const SHARD_INTERVAL: Duration = Duration::from_millis(150);
const SHARD_SLACK: usize = 1;
const SHARD_GRACE: Duration = Duration::from_millis(200);
/// A point of a shard-set run is steady this long after the last node start, kill, stop,
/// pause, server fault or change of a node's view of the members: the fairness figure is taken
/// at steady points.
const SHARD_SETTLE: Duration = Duration::from_millis(1500);
/// A shard-set configuration's run, unless `--duration` says otherwise: with 64 resources each
/// term writes every 250-400 ms, and 20 s hold about 4,000 fenced writes and seven or eight
/// faults (every kind at least once).
const SHARD_DURATION: Duration = Duration::from_secs(20);

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
    /// Shard sets: each candidate is a node of one `ShardSet` over `--shards` resources instead
    /// of an elector of one resource, and the checker works per resource.
    shards: bool,
    /// Locks: each candidate is a lock client taking the run's lock (`Some(0)`) or a permit of
    /// its semaphore of N (`Some(N)`) again and again; checked per lease row, safety only.
    locks: Option<u32>,
    /// With `locks: Some(N)`: a reader-writer lock of N read slots instead of a semaphore;
    /// also checked for every write hold holding every slot, with a token above every
    /// earlier hold's (`shard_checker::check_rw`).
    rw: bool,
    /// Jobs: each candidate is a node of one `Jobs` scheduler running the job `tick` every
    /// second, each attempt writing a row in the slot's fenced transaction; checked per slot
    /// from the run table and the writes table (`jobs_checker.rs`).
    jobs: bool,
    /// Jobs: the scheduler spreads its runs over the nodes (`JobsBuilder::spread_runs`, this
    /// many at once per node), each run under a hold of its own, with this many load jobs
    /// (not `job_node::LOAD_JOBS`).
    spread: Option<(usize, usize)>,
    /// Rate limits: each candidate is a client of one `RateLimiter` asking for permits of the
    /// run's key again and again; checked from every client's permits together
    /// (`rate_checker.rs`): never more than the quota allows in any span of its interval, no
    /// permit number twice, permits coming all along.
    rates: bool,
    /// Two tenants on one server: beside the run's candidates, a neighbour's (`nN`) elect the
    /// same resource in a lease table and ledger of the same names in a schema of their own
    /// (PostgreSQL), or of names that differ only in case (MariaDB), with faults on both; each
    /// tenant is checked on its own, and no candidate's healthy fenced transaction may be
    /// ended by anyone's takeover.
    tenants: bool,
    /// Ranked electors: candidate `cN` (and its replacements) has rank N, so `c4` is the
    /// preferred leader; checked also for the highest-ranked healthy candidate leading within
    /// `rank_checker::bound` (`rank_checker.rs`).
    ranked: bool,
}

impl Configuration {
    /// The shared server this configuration runs on (its faults restart that server and kill
    /// its connections), or `None` when it runs on servers or a file of its own. Two
    /// configurations on one shared server never run at the same time.
    fn shared_server(&self) -> Option<&'static str> {
        match self.backend {
            Backend::Sqlite => None,
            Backend::Postgres if self.failover.is_some() => None,
            Backend::Postgres => Some("postgres"),
            Backend::MySql if self.galera.is_some() => None,
            Backend::MySql => Some(self.sql_mode.unwrap_or("mariadb")),
        }
    }
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
    shards: false,
    locks: None,
    rw: false,
    jobs: false,
    spread: None,
    rates: false,
    tenants: false,
    ranked: false,
};

/// The configurations a run without `--backend` goes through, in order.
const CONFIGURATIONS: [Configuration; 26] = [
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
        name: "ranked-postgres",
        backend: Backend::Postgres,
        ranked: true,
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
    // Shard sets: five nodes of one shard set over 64 resources, with the same faults; every
    // check per resource, plus fairness and recovery figures.
    Configuration {
        name: "shards-postgres",
        backend: Backend::Postgres,
        shards: true,
        ..PLAIN
    },
    Configuration {
        name: "shards-mysql",
        backend: Backend::MySql,
        shards: true,
        ..PLAIN
    },
    // By name only: one SQLite file for five processes, every fenced write taking the file's
    // write lock (a paused node inside one stalls every node).
    Configuration {
        name: "shards-sqlite",
        backend: Backend::Sqlite,
        shards: true,
        ..PLAIN
    },
    // Locks: five clients take one lock, hold it 200-800 ms writing fenced rows, and let go
    // (released, dropped, or held idle), under every fault.
    Configuration {
        name: "lock-postgres",
        backend: Backend::Postgres,
        locks: Some(0),
        ..PLAIN
    },
    // A semaphore of two permits, five clients: at most two holders at once, fenced writes in
    // token order per permit.
    Configuration {
        name: "semaphore-mysql",
        backend: Backend::MySql,
        locks: Some(2),
        ..PLAIN
    },
    // A reader-writer lock of three read slots, five clients, a third of their holds writes:
    // one holder per slot, every write hold holding every slot with a token above every
    // earlier hold's, fenced writes in token order per slot.
    Configuration {
        name: "rwlock-postgres",
        backend: Backend::Postgres,
        locks: Some(3),
        rw: true,
        ..PLAIN
    },
    // Rate limits: five clients ask for permits of one key (20 a second, 4 at once) under
    // every fault; on MariaDB each decision is one statement with `RETURNING`.
    Configuration {
        name: "rate-postgres",
        backend: Backend::Postgres,
        rates: true,
        ..PLAIN
    },
    Configuration {
        name: "rate-mysql",
        backend: Backend::MySql,
        rates: true,
        ..PLAIN
    },
    // By name only: the same on one SQLite file.
    Configuration {
        name: "semaphore-sqlite",
        backend: Backend::Sqlite,
        locks: Some(2),
        ..PLAIN
    },
    // Two tenants on one server (a schema each on PostgreSQL, tables whose names differ only
    // in case on MariaDB), the same resource and tokens, faults on both.
    Configuration {
        name: "tenants-postgres",
        backend: Backend::Postgres,
        tenants: true,
        ..PLAIN
    },
    Configuration {
        name: "tenants-mysql",
        backend: Backend::MySql,
        tenants: true,
        ..PLAIN
    },
    // Scheduled jobs: five nodes of one scheduler, a slot every second, each attempt's write
    // and the slot's mark in one fenced transaction held open 0-300 ms, under every fault;
    // checked per slot: done once, never lost, never written without its mark.
    Configuration {
        name: "jobs-postgres",
        backend: Backend::Postgres,
        jobs: true,
        ..PLAIN
    },
    // The same with the runs spread over the five nodes (at most 20 at once on each), every
    // run under a hold of its own that a kill, pause or partition of its node ends; 100 load
    // jobs.
    Configuration {
        name: "jobs-spread-postgres",
        backend: Backend::Postgres,
        jobs: true,
        spread: Some((20, 100)),
        ..PLAIN
    },
    // By name only: the same on MariaDB and on one SQLite file.
    Configuration {
        name: "jobs-mysql",
        backend: Backend::MySql,
        jobs: true,
        ..PLAIN
    },
    Configuration {
        name: "jobs-sqlite",
        backend: Backend::Sqlite,
        jobs: true,
        ..PLAIN
    },
];

/// Configurations a run without `--backend` leaves out: measurements and slow variants that
/// need no repeating in CI.
const BY_NAME_ONLY: [&str; 6] = [
    "galera-skew",
    "shards-sqlite",
    "semaphore-sqlite",
    "jobs-mysql",
    "jobs-sqlite",
    "rate-mysql",
];

/// SQLite rollback-journal mode: the candidates' busy timeout.
const ROLLBACK_BUSY_TIMEOUT: Duration = Duration::from_millis(300);

/// The database a configuration runs on.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Backend {
    Sqlite,
    Postgres,
    MySql,
}

/// The options in the module doc, and the candidate process's own (what [`run::spawn`] passes
/// it).
#[derive(Debug, Clone, Parser)]
#[command(
    name = "torture",
    about = "The fault-injection run (see tests/torture/main.rs)"
)]
// A repeated option keeps its last value, as the hand-written parser did.
#[command(args_override_self = true)]
struct Args {
    /// A configuration to run (repeatable; default: every one but those run by name only,
    /// `BY_NAME_ONLY`).
    #[arg(long = "backend", value_name = "NAME")]
    backends: Vec<String>,
    /// Seconds per configuration (`30` or `30s`; default 30, the shard sets, locks and jobs
    /// 20).
    #[arg(long, value_name = "SECS", value_parser = seconds)]
    duration: Option<Duration>,
    /// Candidate processes per configuration.
    #[arg(long, value_name = "N", default_value_t = 5)]
    candidates: usize,
    /// The first configuration's seed, the next one's seed + 1 and so on (default: random,
    /// printed).
    #[arg(long, value_name = "N")]
    seed: Option<u64>,
    /// Fault kinds to apply, comma-separated (default: every kind that applies).
    #[arg(long, value_name = "LIST", value_delimiter = ',', action = ArgAction::Set)]
    faults: Option<Vec<String>>,
    /// Connections per candidate pool (default: per configuration).
    #[arg(long, value_name = "N")]
    pool: Option<u32>,
    /// Configurations run at the same time (never two on one shared server; `1`: one after
    /// the other).
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=8))]
    parallel: u8,
    /// Do not run candidates under libfaketime.
    #[arg(long = "no-skew", action = ArgAction::SetFalse)]
    skew: bool,
    /// Resources of the shard-set configurations (`shard-0`..); a node process is told the
    /// same.
    #[arg(long, value_name = "N", default_value_t = 64)]
    shards: usize,
    /// `cargo test FILTER` passes its filter to every test binary: this one runs only if a
    /// filter is part of "torture".
    #[arg(value_name = "FILTER")]
    filters: Vec<String>,

    /// Run as the candidate with this id (the harness starts its candidates so).
    #[arg(long, value_name = "ID", help_heading = "Candidate process")]
    candidate: Option<String>,
    /// SQLite only: rollback journal (SQLite's default) instead of WAL.
    #[arg(long, help_heading = "Candidate process")]
    rollback_journal: bool,
    /// The database the lease statements go to.
    #[arg(long, default_value = "", help_heading = "Candidate process")]
    url: String,
    /// Where fenced writes go, when not to `--url`.
    #[arg(long, help_heading = "Candidate process")]
    fence_url: Option<String>,
    /// The store's `with_transaction_pooling` mode.
    #[arg(long, help_heading = "Candidate process")]
    transaction_pooling: bool,
    /// The lease table.
    #[arg(long, default_value = "", help_heading = "Candidate process")]
    table: String,
    /// The table fenced writes go to.
    #[arg(long, default_value = "", help_heading = "Candidate process")]
    ledger: String,
    /// The resource the candidates elect a leader for.
    #[arg(long, default_value = "", help_heading = "Candidate process")]
    resource: String,
    /// The file this candidate appends its history to.
    #[arg(long, help_heading = "Candidate process")]
    history: Option<PathBuf>,
    /// Run as a node of the shard set `--resource` (with `--shards` resources) instead of an
    /// elector of the resource.
    #[arg(long, help_heading = "Candidate process")]
    shard_node: bool,
    /// The shard set's membership table (a ranked elector's too).
    #[arg(long, default_value = "", help_heading = "Candidate process")]
    members: String,
    /// A ranked elector of this rank.
    #[arg(long, value_name = "N", help_heading = "Candidate process")]
    rank: Option<i64>,
    /// Run as a lock client of the lock `--resource` (or its semaphore, with `--permits`).
    #[arg(long, help_heading = "Candidate process")]
    lock_node: bool,
    /// The semaphore's permits (0: a lock), or the read slots of the reader-writer lock.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 0,
        help_heading = "Candidate process"
    )]
    permits: u32,
    /// A lock client of the reader-writer lock `--resource` of `--permits` read slots.
    #[arg(long, help_heading = "Candidate process")]
    rw: bool,
    /// Run as a node of the scheduler leading `--resource`, with the job `tick`.
    #[arg(long, help_heading = "Candidate process")]
    job_node: bool,
    /// Run as a client of the rate limit of the key `--resource` (its table: the lease
    /// table's name with `_r`).
    #[arg(long, help_heading = "Candidate process")]
    rate_node: bool,
    /// The scheduler's run table.
    #[arg(long, default_value = "", help_heading = "Candidate process")]
    runs_table: String,
    /// The table the job's attempts write their rows to.
    #[arg(long, default_value = "", help_heading = "Candidate process")]
    writes_table: String,
    /// A job node that spreads its scheduler's runs, this many at once on it.
    #[arg(long, value_name = "N", help_heading = "Candidate process")]
    spread_runs: Option<usize>,
    /// A job node's load jobs.
    #[arg(long, value_name = "N", default_value_t = job_node::LOAD_JOBS, help_heading = "Candidate process")]
    load_jobs: usize,

    #[command(flatten)]
    _libtest: LibtestFlags,
}

/// What the test runner may pass to every test binary: accepted and ignored. `--test-threads`,
/// `--format` and `--color` take a value only after `=`: a separate word after them is a filter,
/// as it was for the hand-written parser. Anything else of libtest's (`--list`, `--skip`) is an
/// unknown option.
#[derive(Debug, Clone, clap::Args)]
#[allow(dead_code)] // accepted so the run does not fail on them, never read
struct LibtestFlags {
    #[arg(long, hide = true)]
    nocapture: bool,
    #[arg(long, short = 'q', hide = true)]
    quiet: bool,
    #[arg(long, hide = true)]
    include_ignored: bool,
    #[arg(long, hide = true)]
    ignored: bool,
    #[arg(long, hide = true)]
    exact: bool,
    #[arg(long, hide = true)]
    show_output: bool,
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "")]
    test_threads: Option<String>,
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "")]
    format: Option<String>,
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "")]
    color: Option<String>,
}

impl Args {
    /// How long `config` runs: `--duration`, or its default.
    fn duration(&self, config: &Configuration) -> Duration {
        self.duration.unwrap_or(
            if config.shards || config.locks.is_some() || config.jobs || config.rates {
                SHARD_DURATION
            } else {
                Duration::from_secs(30)
            },
        )
    }
}

/// `--duration`: seconds, with or without a trailing `s`.
fn seconds(text: &str) -> Result<Duration, String> {
    let secs = text
        .trim_end_matches('s')
        .parse::<f64>()
        .map_err(|e| e.to_string())?;
    Duration::try_from_secs_f64(secs).map_err(|e| e.to_string())
}

/// The arguments, or `None` when a test filter excludes this binary. A malformed command line
/// exits with clap's message (status 2).
fn parse_args() -> Option<Args> {
    let mut args = Args::parse();
    if !args.filters.is_empty() && !args.filters.iter().any(|f| "torture".contains(f.as_str())) {
        return None;
    }
    if args.backends.is_empty() {
        // Everything but the measurements and slow variants named in `BY_NAME_ONLY`.
        args.backends = CONFIGURATIONS
            .iter()
            .filter(|c| !BY_NAME_ONLY.contains(&c.name))
            .map(|c| c.name.to_owned())
            .collect();
    }
    Some(args)
}

fn main() {
    let args = parse_args();
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
        match args {
            None => {
                println!("torture: filtered out");
                0
            }
            Some(args) if args.candidate.is_some() && args.shard_node => {
                match shard_node::run(args).await {
                    Ok(()) => 0,
                    Err(e) => {
                        eprintln!("shard node failed: {e}");
                        3
                    }
                }
            }
            Some(args) if args.candidate.is_some() && args.lock_node => {
                match lock_node::run(args).await {
                    Ok(()) => 0,
                    Err(e) => {
                        eprintln!("lock client failed: {e}");
                        3
                    }
                }
            }
            Some(args) if args.candidate.is_some() && args.rate_node => {
                match rate_node::run(args).await {
                    Ok(()) => 0,
                    Err(e) => {
                        eprintln!("rate-limit client failed: {e}");
                        3
                    }
                }
            }
            Some(args) if args.candidate.is_some() && args.job_node => {
                match job_node::run(args).await {
                    Ok(()) => 0,
                    Err(e) => {
                        eprintln!("job node failed: {e}");
                        3
                    }
                }
            }
            Some(args) if args.candidate.is_some() => match candidate::run(args).await {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("candidate failed: {e}");
                    3
                }
            },
            Some(args) => run_configurations(args).await,
        }
    });
    std::process::exit(code);
}

/// Runs the configurations named by `--backend`, `--parallel` at a time; the process exit code.
async fn run_configurations(args: Args) -> i32 {
    let mut passed = 0;
    let mut failed = 0;
    let started = std::time::Instant::now();
    // Each configuration's wall time (servers, run, checks), printed at the end in the order
    // given.
    let mut times: Vec<(usize, String, f64)> = Vec::new();
    let base_seed = args.seed.unwrap_or_else(Rng::seed_from_time);
    let skip = std::env::var("ORION_BEACON_SKIP").unwrap_or_default();
    if skip.split(',').any(|s| s.trim() == "torture") {
        println!("SKIPPED: torture (ORION_BEACON_SKIP)");
        println!("torture: 0 passed, 0 failed");
        return 0;
    }
    let mut pending = std::collections::VecDeque::new();
    for (i, name) in args.backends.iter().enumerate() {
        let lookup = match name.as_str() {
            "mariadb" => "mysql",
            "shards-mariadb" => "shards-mysql",
            name => name,
        };
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
        pending.push_back((i, name.clone(), config));
    }
    // Each configuration's seed is the base seed plus its place in the list, whatever runs
    // beside it. The reports are printed whole: every configuration runs on this one task.
    let args = &args;
    let mut running = futures::stream::FuturesUnordered::new();
    let mut busy: Vec<&'static str> = Vec::new();
    loop {
        while running.len() < usize::from(args.parallel) {
            let free = pending
                .iter()
                .position(|(_, _, c): &(usize, String, Configuration)| {
                    c.shared_server()
                        .is_none_or(|server| !busy.contains(&server))
                });
            let Some((i, name, config)) = free.and_then(|at| pending.remove(at)) else {
                break;
            };
            busy.extend(config.shared_server());
            running.push(async move {
                let seed = base_seed.wrapping_add(i as u64);
                let config_started = std::time::Instant::now();
                let outcome = run::run_backend(config, args, seed).await;
                (i, name, config, seed, outcome, config_started.elapsed())
            });
        }
        let Some((i, name, config, seed, outcome, elapsed)) =
            futures::StreamExt::next(&mut running).await
        else {
            break;
        };
        if let Some(at) = busy.iter().position(|s| Some(*s) == config.shared_server()) {
            busy.swap_remove(at);
        }
        times.push((i, name.clone(), elapsed.as_secs_f64()));
        match outcome {
            Ok(true) => passed += 1,
            Ok(false) => failed += 1,
            Err(e) => {
                println!("torture[{name}] seed={seed}: harness error: {e}");
                failed += 1;
            }
        }
    }
    times.sort_by_key(|(i, _, _)| *i);
    println!("torture: {passed} passed, {failed} failed");
    if !times.is_empty() {
        println!("torture: seconds per configuration:");
        for (_, name, secs) in &times {
            println!("  {secs:7.1}  {name}");
        }
    }
    // In libtest's words, so the test command's summary lists this binary's time with the others.
    println!(
        "test result: {}. {passed} passed; {failed} failed; finished in {:.2}s",
        if failed > 0 { "FAILED" } else { "ok" },
        started.elapsed().as_secs_f64()
    );
    if failed > 0 {
        1
    } else {
        0
    }
}
