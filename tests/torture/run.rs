//! One configuration's run: its servers and tables, the candidate processes, the faults
//! applied to them, then the checker's verdict on what they recorded.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use orion_beacon::{LeaseStore, SeaOrmLeaseStore};
use sea_orm::sea_query::{Alias, ColumnDef, Query, Table};
use sea_orm::{ConnectionTrait, DatabaseConnection};
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};

use crate::clock::mono_ns;
use crate::common::{unique, Rng};
use crate::db::{connect, connect_rollback_journal};
use crate::servers::{private_mariadb, private_pgbouncer, private_postgres, start_galera, Cluster};
use crate::skew::{faketime_lib, skew_problem};
use crate::{checker, faults, jobs_checker, report, shard_checker, timeline};
use crate::{
    Args, Backend, Configuration, Error, LEASE, RECOVERY_MARGIN, RETRY, SHARD_INTERVAL,
    SHARD_SETTLE, SHARD_SLACK, TAKEOVER_BOUND,
};

/// One configuration's servers, tables and working directory, as the run set them up.
pub struct Setup {
    pub backend: Backend,
    pub config: Configuration,
    /// The private MariaDB of this configuration.
    pub mariadb: Option<&'static orion_beacon_testkit::MariaDb>,
    /// The failover configurations' primary, standby and stable address.
    pub cluster: Option<std::sync::Arc<std::sync::Mutex<Cluster>>>,
    /// The Galera configurations' cluster, one URL per node (candidate `cN` uses node N mod
    /// 3), and the harness's connection to each node.
    pub galera: Option<std::sync::Arc<orion_beacon_testkit::Galera>>,
    node_urls: Vec<String>,
    pub node_admins: Vec<DatabaseConnection>,
    /// The URL candidates use.
    pub url: String,
    /// The URL candidates send fenced writes to, when not `url`.
    fence_url: Option<String>,
    /// The proxies that cut candidates off from the servers (the `partition` fault).
    pub partitions: crate::common::partition::Partitions,
    /// The URL the harness itself uses (probes, the ledger).
    pub admin_url: String,
    pub table: String,
    ledger: String,
    /// The resource the candidates elect a leader for; in the shard-set configurations, the
    /// shard set's name.
    pub resource: String,
    /// The shard-set configurations: the membership table and the shard set's resources.
    members: String,
    pub shards: Vec<String>,
    /// The jobs configurations: the scheduler's run table and the table its job's attempts
    /// write to (no key: a slot written twice shows as two rows).
    runs: String,
    writes: String,
    pub admin: DatabaseConnection,
    /// The neighbour tenant of the `tenants` configurations.
    pub neighbour: Option<Neighbour>,
    _dir: tempfile::TempDir,
    dir: PathBuf,
}

/// The neighbour tenant: its candidates' URL, the harness's connection as they see the
/// database, and its lease table and ledger as they name them.
pub struct Neighbour {
    url: String,
    /// The URL the harness asks the neighbour's tables on.
    pub admin_url: String,
    pub admin: DatabaseConnection,
    pub table: String,
    ledger: String,
}

/// A neighbour's candidate: `nN` (and its replacements `nN-rM`).
pub fn is_neighbour(name: &str) -> bool {
    name.starts_with('n')
}

/// A candidate process the run started.
pub struct Proc {
    pub name: String,
    pub child: Child,
    pub history: PathBuf,
    pid: Option<u32>,
    skewed: bool,
    /// The libfaketime offset it runs under (`-3h`), if skewed.
    pub offset: Option<String>,
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

/// The configuration's servers (started on first use), lease table and ledger table (and
/// membership table for shard sets of `shards` resources).
async fn setup(config: Configuration, shards: usize) -> Result<Setup, Error> {
    let backend = config.backend;
    let mut mariadb = None;
    let dir = tempfile::tempdir()?;
    let path = dir.path().to_path_buf();
    if std::env::var_os("ORION_TORTURE_KEEP").is_some() {
        println!(
            "torture[{}]: histories kept in {}",
            config.name,
            path.display()
        );
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
            // Certification is synchronous but applying is not: a node that has not
            // applied node 0's CREATE DATABASE yet refuses a connection to it (1049).
            // The statement on each node is ordered after the first one, so it waits.
            for node in g.nodes() {
                connect(&node.url(), 1)
                    .await?
                    .execute_unprepared("CREATE DATABASE IF NOT EXISTS orion_torture")
                    .await?;
            }
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
    let members = format!("{table}_m");
    let runs = format!("{table}_runs");
    let writes = format!("{table}_writes");
    use orion_beacon_migration::{
        AddLeasePayload, AddMemberHolding, CreateJobRunTable, CreateLeaseTable, CreateMemberTable,
        MigrationTrait, SchemaManager,
    };
    if config.rates {
        orion_beacon_migration::CreateRateLimitTable::with_table(crate::rate_node::rate_table(
            &table,
        ))?
        .up(&SchemaManager::new(&admin))
        .await?;
    }
    CreateLeaseTable::with_table(&table)?
        .up(&SchemaManager::new(&admin))
        .await?;
    AddLeasePayload::with_table(&table)?
        .up(&SchemaManager::new(&admin))
        .await?;
    if config.ranked {
        CreateMemberTable::with_table(&members)?
            .up(&SchemaManager::new(&admin))
            .await?;
        AddMemberHolding::with_table(&members)?
            .up(&SchemaManager::new(&admin))
            .await?;
        orion_beacon_migration::AddMemberRank::with_table(&members)?
            .up(&SchemaManager::new(&admin))
            .await?;
    }
    if config.shards {
        CreateMemberTable::with_table(&members)?
            .up(&SchemaManager::new(&admin))
            .await?;
        // The members' counts, as a user who runs every migration has them: nodes skip their
        // looks while the set is settled, so the faults also meet that path.
        AddMemberHolding::with_table(&members)?
            .up(&SchemaManager::new(&admin))
            .await?;
    }
    if config.jobs {
        CreateJobRunTable::with_table(&runs)?
            .up(&SchemaManager::new(&admin))
            .await?;
        orion_beacon_migration::AddJobRunKey::with_table(&runs)?
            .up(&SchemaManager::new(&admin))
            .await?;
        orion_beacon_migration::CreateJobAttemptTable::with_table(&runs)?
            .up(&SchemaManager::new(&admin))
            .await?;
        let create = Table::create()
            .table(Alias::new(&writes))
            .col(ColumnDef::new(Alias::new("job")).string_len(64).not_null())
            .col(ColumnDef::new(Alias::new("slot")).big_integer().not_null())
            .col(ColumnDef::new(Alias::new("token")).big_integer().not_null())
            .col(
                ColumnDef::new(Alias::new("writer"))
                    .string_len(64)
                    .not_null(),
            )
            // A capped run's permit, its token, and its fenced transaction's span by the
            // database clock (see `job_node`).
            .col(ColumnDef::new(Alias::new("permit")).string_len(255).null())
            .col(
                ColumnDef::new(Alias::new("permit_token"))
                    .big_integer()
                    .null(),
            )
            .col(ColumnDef::new(Alias::new("begun_ms")).big_integer().null())
            .col(ColumnDef::new(Alias::new("ended_ms")).big_integer().null())
            .to_owned();
        admin.execute(&create).await?;
    }
    let create = ledger_table(&ledger, config.shards || config.locks.is_some());
    admin.execute(&create).await?;
    let neighbour = if config.tenants {
        Some(neighbour(backend, &url, &admin_url, &table, &ledger).await?)
    } else {
        None
    };
    let resource = unique(match (config.shards, config.locks) {
        (true, _) => "set",
        (_, Some(_)) => "lock",
        _ if config.rates => "limit",
        _ => "job",
    });
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
        partitions: crate::common::partition::Partitions::default(),
        admin_url,
        table,
        ledger,
        neighbour,
        resource: resource.clone(),
        members,
        runs,
        writes,
        shards: match config.locks {
            Some(permits) => crate::lock_node::resources(&resource, permits, config.rw),
            None if config.shards => crate::shard_node::resources(shards),
            None => Vec::new(),
        },
        admin,
        _dir: dir,
        dir: path,
    })
}

/// The ledger table `name` the candidates' fenced transactions write to; keyed by resource
/// where one run has many (shard sets, locks).
fn ledger_table(name: &str, by_resource: bool) -> sea_orm::sea_query::TableCreateStatement {
    let mut create = Table::create()
        .table(Alias::new(name))
        .col(
            ColumnDef::new(Alias::new("id"))
                .big_integer()
                .not_null()
                .auto_increment()
                .primary_key(),
        )
        .to_owned();
    if by_resource {
        create.col(
            ColumnDef::new(Alias::new("resource"))
                .string_len(64)
                .not_null(),
        );
    }
    create
        .col(ColumnDef::new(Alias::new("token")).big_integer().not_null())
        .col(
            ColumnDef::new(Alias::new("candidate"))
                .string_len(64)
                .not_null(),
        )
        .col(ColumnDef::new(Alias::new("seq")).big_integer().not_null())
        .to_owned()
}

/// The neighbour tenant's tables, made as the run's: PostgreSQL, the same names in a schema of
/// its own (its sessions' `search_path`, set in the URL); MariaDB, names that differ only in
/// case in the same database.
async fn neighbour(
    backend: Backend,
    url: &str,
    admin_url: &str,
    table: &str,
    ledger: &str,
) -> Result<Neighbour, Error> {
    use orion_beacon_migration::{
        AddLeasePayload, CreateLeaseTable, MigrationTrait, SchemaManager,
    };
    let (url, admin_url, table, ledger) = match backend {
        Backend::Postgres => {
            let schema = unique("neighbour");
            connect(admin_url, 1)
                .await?
                .execute_unprepared(&format!("CREATE SCHEMA \"{schema}\""))
                .await?;
            let with_path = |url: &str| {
                let join = if url.contains('?') { '&' } else { '?' };
                format!("{url}{join}options=-c%20search_path%3D{schema}")
            };
            (
                with_path(url),
                with_path(admin_url),
                table.to_owned(),
                ledger.to_owned(),
            )
        }
        Backend::MySql => (
            url.to_owned(),
            admin_url.to_owned(),
            table.to_uppercase(),
            ledger.to_uppercase(),
        ),
        Backend::Sqlite => return Err("no tenants on SQLite".into()),
    };
    let admin = connect(&admin_url, 2).await?;
    CreateLeaseTable::with_table(&table)?
        .up(&SchemaManager::new(&admin))
        .await?;
    AddLeasePayload::with_table(&table)?
        .up(&SchemaManager::new(&admin))
        .await?;
    admin.execute(&ledger_table(&ledger, false)).await?;
    Ok(Neighbour {
        url,
        admin_url,
        admin,
        table,
        ledger,
    })
}

/// Starts candidate `name` (this binary with `--candidate`), its wall clock at `skew` if given.
pub fn spawn(s: &Setup, name: &str, skew: Option<&str>) -> Result<Proc, Error> {
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
    let (url, table, ledger) = match &s.neighbour {
        Some(n) if is_neighbour(name) => (&n.url, &n.table, &n.ledger),
        _ => (url, &s.table, &s.ledger),
    };
    // Every connection of the candidate goes through its proxy, so a partition cuts them all.
    let url = s.partitions.route(name, url)?;
    let fence_url = s
        .fence_url
        .as_deref()
        .map(|u| s.partitions.route(name, u))
        .transpose()?;
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
        &url,
        "--table",
        table,
        "--ledger",
        ledger,
        "--resource",
        &s.resource,
    ])
    .arg("--history")
    .arg(&history)
    .args(match s.config.locks {
        Some(permits) => {
            let mut args = vec![
                "--lock-node".to_owned(),
                "--permits".to_owned(),
                permits.to_string(),
            ];
            if s.config.rw {
                args.push("--rw".to_owned());
            }
            args
        }
        None if s.config.shards => vec![
            "--shard-node".to_owned(),
            "--shards".to_owned(),
            s.shards.len().to_string(),
            "--members".to_owned(),
            s.members.clone(),
        ],
        None if s.config.rates => vec!["--rate-node".to_owned()],
        None if s.config.jobs => {
            let mut args = vec![
                "--job-node".to_owned(),
                "--runs-table".to_owned(),
                s.runs.clone(),
                "--writes-table".to_owned(),
                s.writes.clone(),
            ];
            if let Some((per_node, load)) = s.config.spread {
                args.extend([
                    "--spread-runs".to_owned(),
                    per_node.to_string(),
                    "--load-jobs".to_owned(),
                    load.to_string(),
                ]);
            }
            args
        }
        None if s.config.ranked => vec![
            "--members".to_owned(),
            s.members.clone(),
            "--rank".to_owned(),
            crate::rank_checker::rank_of(name).to_string(),
        ],
        None => Vec::new(),
    })
    .args(["--pool", &s.config.pool.to_string()])
    .args(s.config.rollback_journal.then_some("--rollback-journal"))
    .args(s.config.pgbouncer.then_some("--transaction-pooling"))
    .args(
        fence_url
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

/// Runs one configuration: sets it up, starts the candidates, applies the faults, stops the
/// candidates and checks what they recorded. `true` if it passed.
pub async fn run_backend(config: Configuration, args: &Args, seed: u64) -> Result<bool, Error> {
    let backend = config.backend;
    let label = config.name.to_owned();
    let mut rng = Rng::new(seed);
    let s = setup(config, args.shards).await?;
    let duration = args.duration(&config);
    let _reader = faults::start_long_reader(&s).await?;
    let kinds = faults::applicable(&s, args.faults.as_deref());
    // SQLite's clock is each process's own wall clock (the library runs in the candidate), so
    // skewing one process's wall clock is a setup that cannot exist on a real host: there the
    // processes share the host clock. Skew is a fault for the server backends, whose clock is
    // the server's.
    let skew = args.skew && backend != Backend::Sqlite;
    if skew && faketime_lib().is_none() {
        return Err(
            "libfaketime is not installed (apt-get install faketime), or pass --no-skew".into(),
        );
    }
    let offsets = ["-3h", "+5h", "-26h"];
    let mut procs: Vec<Proc> = Vec::new();
    let mut skewed = 0;
    // The neighbour tenant's candidates: as many, named `nN`, skewed alike.
    let tenants = if config.tenants { 2 } else { 1 };
    for i in 0..args.candidates * tenants {
        let name = if i < args.candidates {
            format!("c{i}")
        } else {
            format!("n{}", i - args.candidates)
        };
        let i = i % args.candidates;
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
    let mut applied = faults::apply(&s, &mut procs, &kinds, duration, started, &mut rng).await?;
    // Faults of the run itself that did nothing (a connkill that killed nothing, a requested
    // kind never applied, a clock that was not skewed): the run proves less than it says.
    let mut run_violations = std::mem::take(&mut applied.problems);

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
    if config.rates {
        return finish_rates(
            s,
            &procs,
            applied,
            run_violations,
            &kinds,
            seed,
            run_start_ns,
            quiesce_ns,
        )
        .await;
    }
    if config.jobs {
        let times = ShardTimes {
            seed,
            candidates: args.candidates,
            skewed,
            run_start_ns,
            quiesce_ns,
            run_end_ns,
        };
        return finish_jobs(s, &procs, applied, run_violations, &kinds, times, duration).await;
    }
    if config.shards || config.locks.is_some() {
        let times = ShardTimes {
            seed,
            candidates: args.candidates,
            skewed,
            run_start_ns,
            quiesce_ns,
            run_end_ns,
        };
        return finish_shards(s, &procs, applied, run_violations, &kinds, times).await;
    }
    let mut record = checker::Record {
        end: run_end_ns,
        quiesce: quiesce_ns,
        // A SIGSTOPped or cut-off candidate may be inside a fenced transaction. On SQLite it
        // holds the file's write lock until it wakes (recovery counts from the wake-up); on
        // PostgreSQL and MariaDB the next candidate ends its session once its lease lapsed, so
        // recovery counts from the fault's start, as for a kill.
        pause_blocks_store: s.backend == Backend::Sqlite,
        // The takeover needs a second connection of the next candidate's pool.
        no_takeover: s.config.pool < 2,
        lapse_bound_ns: (TAKEOVER_BOUND + LEASE + RETRY).as_nanos() as u64,
        faults: std::mem::take(&mut applied.log),
        ..checker::Record::default()
    };
    // The neighbour tenant, checked on its own with the same faults (taken before the run's
    // record moves them).
    // Each tenant's record keeps the server-wide faults and its own candidates'.
    let neighbour_faults: Vec<checker::Fault> = record
        .faults
        .iter()
        .filter(|f| f.candidate.as_deref().is_none_or(is_neighbour))
        .cloned()
        .collect();
    if s.neighbour.is_some() {
        record
            .faults
            .retain(|f| f.candidate.as_deref().is_none_or(|c| !is_neighbour(c)));
    }
    for p in procs.iter().filter(|p| !is_neighbour(&p.name)) {
        let text = std::fs::read_to_string(&p.history).unwrap_or_default();
        record.add_history(&text, applied.kills.get(&p.name).copied())?;
        if let Some(offset) = &p.offset {
            if let Some(problem) = skew_problem(&text, offset) {
                run_violations.push(format!("{}: {problem}", p.name));
            }
        }
    }
    for kind in &kinds {
        if !applied.counts.contains_key(kind) {
            run_violations.push(format!("fault {kind} was requested but never applied"));
        }
    }
    stalls_inside_transactions(&record.faults, &record.transactions, &mut run_violations);
    // A woken leader's write that failed on a database error (its Galera node down, the server
    // restarting) never reached the fence: the pause then proves nothing either way, and the
    // committed-stale-write check still guards the run.
    if applied.counts.contains_key("pause")
        && record.writes_refused + record.writes_aborted == 0
        && record.writes_failed == 0
    {
        run_violations.push(
            "leaders were paused past their lease, yet no stale write was refused by the fence \
             or aborted at commit (the woken leader's write never reached the database)"
                .to_owned(),
        );
    }
    let admin = &s.admin;
    record.ledger = read_ledger(admin, &s.ledger).await?;
    let bound = LEASE + RETRY + RECOVERY_MARGIN;
    let mut verdict = checker::check(&record, bound.as_nanos() as u64);
    if config.ranked {
        let incarnations: Vec<crate::rank_checker::Incarnation> = procs
            .iter()
            .filter_map(|p| {
                let text = std::fs::read_to_string(&p.history).ok()?;
                let start = text
                    .lines()
                    .find_map(|l| l.strip_prefix("start "))?
                    .split_whitespace()
                    .nth(1)?
                    .parse()
                    .ok()?;
                Some(crate::rank_checker::Incarnation {
                    name: p.name.clone(),
                    start,
                    killed: applied.kills.get(&p.name).copied(),
                })
            })
            .collect();
        let ranked = crate::rank_checker::check(
            &record.intervals,
            &record.faults,
            &incarnations,
            run_start_ns,
            quiesce_ns,
        );
        println!(
            "torture[{label}] ranked: the highest-ranked healthy candidate checked over {} ms, {} violations",
            ranked.checked_ns / 1_000_000,
            ranked.violations.len()
        );
        verdict.violations.extend(ranked.violations);
    }
    if let Some(n) = &s.neighbour {
        let mut theirs = checker::Record {
            end: record.end,
            quiesce: record.quiesce,
            pause_blocks_store: record.pause_blocks_store,
            no_takeover: record.no_takeover,
            lapse_bound_ns: record.lapse_bound_ns,
            faults: neighbour_faults,
            ..checker::Record::default()
        };
        for p in procs.iter().filter(|p| is_neighbour(&p.name)) {
            let text = std::fs::read_to_string(&p.history).unwrap_or_default();
            theirs.add_history(&text, applied.kills.get(&p.name).copied())?;
        }
        theirs.ledger = read_ledger(&n.admin, &n.ledger).await?;
        let their_verdict = checker::check(&theirs, bound.as_nanos() as u64);
        println!(
            "torture[{label}] neighbour tenant: {} terms, {} writes committed, {} refused, {} failed, {} healthy transactions ended, {} violations",
            their_verdict.terms,
            theirs.writes_committed,
            theirs.writes_refused,
            theirs.writes_failed,
            theirs.ended_live.len(),
            their_verdict.violations.len()
        );
        if their_verdict.terms == 0 {
            run_violations.push("the neighbour tenant never had a leader".to_owned());
        }
        run_violations.extend(
            their_verdict
                .violations
                .into_iter()
                .map(|v| format!("neighbour tenant: {v}")),
        );
    }
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

    report::Summary {
        label: &label,
        seed,
        candidates: args.candidates,
        skewed,
        run_start_ns,
        record: &record,
        verdict: &verdict,
        measured: config.measured.then_some(&measured[..]),
        faults: &applied,
        last_token: tokens_in_table.unwrap_or(0),
        bound,
    }
    .print();
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

/// The rows of an elector run's ledger, in order.
async fn read_ledger(
    admin: &DatabaseConnection,
    ledger: &str,
) -> Result<Vec<checker::LedgerRow>, Error> {
    let rows = admin
        .query_all(
            &Query::select()
                .columns([
                    Alias::new("id"),
                    Alias::new("token"),
                    Alias::new("candidate"),
                    Alias::new("seq"),
                ])
                .from(Alias::new(ledger))
                .order_by(Alias::new("id"), sea_orm::sea_query::Order::Asc)
                .to_owned(),
        )
        .await?;
    let mut out = Vec::new();
    for row in rows {
        out.push(checker::LedgerRow {
            id: row.try_get_by_index(0)?,
            token: row.try_get_by_index(1)?,
            candidate: row.try_get_by_index(2)?,
            seq: row.try_get_by_index(3)?,
        });
    }
    Ok(out)
}

/// A shard-set run's figures from the harness, for its summary.
struct ShardTimes {
    seed: u64,
    candidates: usize,
    skewed: usize,
    run_start_ns: u64,
    quiesce_ns: u64,
    run_end_ns: u64,
}

/// A shard-set configuration's verdict, once its nodes have stopped: the histories and the
/// ledger split by resource and checked per resource (`shard_checker.rs`), the fault problems
/// of the run itself, the summary. `true` if it passed.
async fn finish_shards(
    s: Setup,
    procs: &[Proc],
    mut applied: faults::Faults,
    mut run_violations: Vec<String>,
    kinds: &[String],
    times: ShardTimes,
) -> Result<bool, Error> {
    let label = s.config.name;
    let mut record = shard_checker::ShardRecord::new(&s.shards);
    record.end = times.run_end_ns;
    record.quiesce = times.quiesce_ns;
    // A node stopped inside a fenced transaction on SQLite holds the whole file until it runs
    // again (recovery from a pause counts from the wake-up); elsewhere its lapsed sessions are
    // ended by the next holder.
    record.pause_blocks_store = s.backend == Backend::Sqlite;
    record.safety_only = s.config.locks.is_some();
    record.faults = std::mem::take(&mut applied.log);
    for p in procs {
        let text = std::fs::read_to_string(&p.history).unwrap_or_default();
        record.add_history(&text, applied.kills.get(&p.name).copied())?;
        if let Some(offset) = &p.offset {
            if let Some(problem) = skew_problem(&text, offset) {
                run_violations.push(format!("{}: {problem}", p.name));
            }
        }
    }
    for kind in kinds {
        if !applied.counts.contains_key(kind) {
            run_violations.push(format!("fault {kind} was requested but never applied"));
        }
    }
    stalls_inside_transactions(&record.faults, &record.transactions, &mut run_violations);
    if s.config.locks.is_some() {
        // Lock runs aim their pauses and partitions at holders inside a fenced transaction
        // (see `faults::leader_process`): most must land there.
        for kind in ["pause", "partition"] {
            let (inside, of) =
                checker::inside_transactions(&record.faults, &record.transactions, kind);
            if of >= 4 && inside * 2 < of {
                run_violations.push(format!(
                    "only {inside} of {of} {kind} faults hit a holder inside a fenced transaction"
                ));
            }
        }
    }
    if applied.counts.contains_key("pause")
        && record.writes_refused + record.writes_aborted == 0
        && record.writes_failed == 0
    {
        run_violations.push(
            "nodes were paused past their leases, yet no stale write was refused by the fence \
             or aborted at commit (the woken node's writes never reached the database)"
                .to_owned(),
        );
    }
    let admin = &s.admin;
    let rows = admin
        .query_all(
            &Query::select()
                .columns([
                    Alias::new("id"),
                    Alias::new("resource"),
                    Alias::new("token"),
                    Alias::new("candidate"),
                    Alias::new("seq"),
                ])
                .from(Alias::new(&s.ledger))
                .order_by(Alias::new("id"), sea_orm::sea_query::Order::Asc)
                .to_owned(),
        )
        .await?;
    let ledger_rows = rows.len();
    for row in rows {
        let resource: String = row.try_get_by_index(1)?;
        record.add_ledger_row(
            &resource,
            checker::LedgerRow {
                id: row.try_get_by_index(0)?,
                token: row.try_get_by_index(2)?,
                candidate: row.try_get_by_index(3)?,
                seq: row.try_get_by_index(4)?,
            },
        )?;
    }
    let bound = LEASE + SHARD_INTERVAL + RECOVERY_MARGIN;
    let mut verdict = shard_checker::check(
        &mut record,
        bound.as_nanos() as u64,
        SHARD_SETTLE.as_nanos() as u64,
        SHARD_SLACK,
    );
    verdict.violations.extend(run_violations);
    if s.config.rw {
        verdict.violations.extend(
            shard_checker::check_rw(&record)
                .into_iter()
                .map(|v| format!("rw: {v}")),
        );
        println!(
            "torture[{label}] write holds: {} (each checked to hold all {} read slots, its token above every earlier hold's)",
            record.rw_writes.len(),
            s.shards.len()
        );
        if record.rw_writes.is_empty() {
            verdict
                .violations
                .push("no write hold began: the run proves nothing about writers".to_owned());
        }
    }
    if s.config.locks.is_some() {
        // One per lease row (the lock and its pair, or each permit).
        let most = s.shards.len();
        if verdict.most_at_once > most {
            verdict.violations.push(format!(
                "{} holds believed at one moment, of {most} lease rows",
                verdict.most_at_once
            ));
        }
    }
    let last_tokens = SeaOrmLeaseStore::new(admin.clone())
        .with_table(&s.table)?
        .current_all(&s.shards)
        .await?
        .iter()
        .map(|r| r.token.get())
        .collect::<Vec<_>>();
    report::ShardSummary {
        label,
        seed: times.seed,
        nodes: times.candidates,
        skewed: times.skewed,
        run_start_ns: times.run_start_ns,
        record: &record,
        verdict: &verdict,
        faults: &applied,
        ledger_rows,
        max_token: last_tokens.iter().copied().max().unwrap_or(0),
        bound,
        permits: s.config.locks,
    }
    .print();
    let passed = verdict.violations.is_empty() && verdict.led_resources == s.shards.len();
    if !passed {
        print_logs_around_gap(procs, &verdict.violations);
    }
    if std::env::var_os("ORION_TORTURE_KEEP").is_some() || !passed {
        // The fault log next to the histories, in their monotonic nanoseconds.
        let log: String = record
            .faults
            .iter()
            .map(|f| {
                format!(
                    "{} {} {} {}\n",
                    f.kind,
                    f.candidate.as_deref().unwrap_or("-"),
                    f.start,
                    f.end
                )
            })
            .collect();
        std::fs::write(s.dir.join("faults"), log)?;
        println!("  histories: {}", s.dir.display());
        std::mem::forget(s._dir);
        return Ok(passed);
    }
    for table in [&s.ledger, &s.table, &s.members] {
        let _ = admin
            .execute(&Table::drop().table(Alias::new(table)).to_owned())
            .await;
    }
    Ok(passed)
}

/// The nodes' own log lines from a second before the first unexplained leaderless stretch
/// (a violation `<resource>: no leader for <ms> ms from <ns> to <ns>, ...`) to its end.
fn print_logs_around_gap(procs: &[Proc], violations: &[String]) {
    let gap = violations.iter().find_map(|v| {
        let (resource, rest) = v.split_once(": no leader for ")?;
        let mut words = rest.split(' ');
        let from = words
            .find(|w| *w == "from")
            .and(words.next())?
            .parse::<u64>()
            .ok()?;
        let to = words.find(|w| *w == "to").and(words.next())?;
        let to = to.trim_end_matches(',').parse::<u64>().ok()?;
        Some((resource.to_owned(), from, to))
    });
    let Some((resource, from, to)) = gap else {
        return;
    };
    let logs: Vec<(String, PathBuf)> = procs
        .iter()
        .map(|p| (p.name.clone(), crate::node_log::path(&p.history)))
        .collect();
    println!("  the nodes' log from 1 s before {resource}'s gap to its end (its lines, warnings, errors):");
    for l in crate::node_log::around(&logs, &resource, from.saturating_sub(1_000_000_000), to, 60) {
        println!("    {l}");
    }
}

/// Pauses and partitions must hit leaders inside fenced transactions too (what the takeover
/// is for): a run with ten or more of a kind and none inside one proves nothing about that.
fn stalls_inside_transactions(
    faults: &[checker::Fault],
    transactions: &[(String, u64, u64)],
    run_violations: &mut Vec<String>,
) {
    for kind in ["pause", "partition"] {
        let (inside, of) = checker::inside_transactions(faults, transactions, kind);
        if of >= 10 && inside == 0 {
            run_violations.push(format!(
                "none of {of} {kind} faults hit a leader inside a fenced transaction"
            ));
        }
    }
}

/// A rate-limit configuration's verdict, once its clients have stopped: every client's
/// permits checked together with the table's count (`rate_checker.rs`), the fault problems of
/// the run itself, the summary. `true` if it passed.
#[allow(clippy::too_many_arguments)]
async fn finish_rates(
    s: Setup,
    procs: &[Proc],
    mut applied: faults::Faults,
    mut run_violations: Vec<String>,
    kinds: &[String],
    seed: u64,
    run_start_ns: u64,
    quiesce_ns: u64,
) -> Result<bool, Error> {
    let label = s.config.name;
    let quota = crate::rate_node::quota()?;
    let rates = crate::rate_node::rate_table(&s.table);
    let mut record = crate::rate_checker::RateRecord {
        interval_us: i64::try_from(quota.interval().as_micros())?,
        most_per_interval: quota.most_per_interval(),
        faults: std::mem::take(&mut applied.log),
        start_ns: run_start_ns,
        quiesce_ns,
        ..Default::default()
    };
    for p in procs {
        let text = std::fs::read_to_string(&p.history).unwrap_or_default();
        record.add_history(&text)?;
    }
    for kind in kinds {
        if !applied.counts.contains_key(kind) {
            run_violations.push(format!("fault {kind} was requested but never applied"));
        }
    }
    let admin = &s.admin;
    let row = admin
        .query_one(
            &Query::select()
                .column(Alias::new("permits"))
                .from(Alias::new(&rates))
                .and_where(sea_orm::sea_query::ExprTrait::eq(
                    sea_orm::sea_query::Expr::col(Alias::new("limit_key")),
                    s.resource.as_str(),
                ))
                .to_owned(),
        )
        .await?;
    record.table_permits = match row {
        Some(row) => u64::try_from(row.try_get_by_index::<i64>(0)?)?,
        None => 0,
    };
    let bound = LEASE + RETRY + RECOVERY_MARGIN;
    let mut verdict = crate::rate_checker::check(&record, bound.as_nanos() as u64);
    verdict.violations.extend(run_violations);
    let mut kinds: Vec<String> = applied
        .counts
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    kinds.sort();
    let seconds = quiesce_ns.saturating_sub(run_start_ns) as f64 / 1e9;
    // What the quota allows over the run: the burst, then one per spacing.
    let allowed = f64::from(quota.burst()) + seconds / quota.emission_interval().as_secs_f64();
    println!(
        "torture[{label}] seed={seed} duration={seconds:.0}s clients={} quota={}/{:?} burst {} permits={} ({:.0} % of what the quota allows; {} in the table, {} never answered) limited={} errors={} most_in_interval={} (at most {}) longest_gap={}ms (bound {}ms) faults: {} violations={}",
        procs.iter().filter(|p| !p.name.contains("-r")).count(),
        quota.permits(),
        quota.interval(),
        quota.burst(),
        record.grants.len(),
        record.grants.len() as f64 * 100.0 / allowed,
        record.table_permits,
        record.table_permits.saturating_sub(record.grants.len() as u64),
        record.limited,
        record.errors,
        verdict.most_in_interval,
        record.most_per_interval,
        verdict.longest_gap_ns / 1_000_000,
        bound.as_millis(),
        kinds.join(" "),
        verdict.violations.len()
    );
    for violation in &verdict.violations {
        println!("  VIOLATION: {violation}");
    }
    let passed = verdict.violations.is_empty();
    if std::env::var_os("ORION_TORTURE_KEEP").is_some() || !passed {
        println!("  histories: {}", s.dir.display());
        std::mem::forget(s._dir);
        return Ok(passed);
    }
    for table in [&rates, &s.ledger, &s.table] {
        let _ = admin
            .execute(&Table::drop().table(Alias::new(table)).to_owned())
            .await;
    }
    Ok(passed)
}

/// A jobs configuration's verdict, once its nodes have stopped: the nodes' histories, the run
/// table and the writes table checked per slot (`jobs_checker.rs`), the fault problems of the
/// run itself, the summary. `true` if it passed.
async fn finish_jobs(
    s: Setup,
    procs: &[Proc],
    mut applied: faults::Faults,
    mut run_violations: Vec<String>,
    kinds: &[String],
    times: ShardTimes,
    duration: Duration,
) -> Result<bool, Error> {
    let label = s.config.name;
    let mut histories = jobs_checker::JobHistories::default();
    for p in procs {
        let text = match std::fs::read_to_string(&p.history) {
            Ok(text) => text,
            Err(e) => {
                run_violations.push(format!("{}: no history ({e})", p.name));
                String::new()
            }
        };
        histories.add_history(&text, applied.kills.get(&p.name).copied())?;
        if let Some(offset) = &p.offset {
            if let Some(problem) = skew_problem(&text, offset) {
                run_violations.push(format!("{}: {problem}", p.name));
            }
        }
    }
    for kind in kinds {
        if !applied.counts.contains_key(kind) {
            run_violations.push(format!("fault {kind} was requested but never applied"));
        }
    }
    // How many faults hit inside an attempt's transaction is printed, not required: an attempt
    // holds its transaction open a fifth of each second or so, and a run's few faults can all
    // miss it (`stalls_inside_transactions` expects the elector's near-continuous writes).
    let faults_log = std::mem::take(&mut applied.log);

    let admin = &s.admin;
    let col = |name: &str| Alias::new(name);
    let rows = admin
        .query_all(
            &Query::select()
                .columns([
                    col("job"),
                    col("slot"),
                    col("state"),
                    col("attempts"),
                    col("claimed_token"),
                    col("claimed_by"),
                    col("finished_token"),
                    col("claimed_at"),
                    col("finished_at"),
                    col("run_key"),
                ])
                .from(Alias::new(&s.runs))
                .order_by(col("slot"), sea_orm::sea_query::Order::Asc)
                .to_owned(),
        )
        .await?;
    let mut records = Vec::with_capacity(rows.len());
    for row in rows {
        records.push(jobs_checker::RunRecord {
            job: row.try_get_by_index(0)?,
            slot: row.try_get_by_index(1)?,
            state: row.try_get_by_index(2)?,
            attempts: row.try_get_by_index(3)?,
            claimed_token: row.try_get_by_index(4)?,
            claimed_by: row.try_get_by_index(5)?,
            finished_token: row.try_get_by_index(6)?,
            claimed_at_ms: row
                .try_get_by_index::<Option<chrono::DateTime<chrono::Utc>>>(7)?
                .map(|t| t.timestamp_millis()),
            finished_at_ms: row
                .try_get_by_index::<Option<chrono::DateTime<chrono::Utc>>>(8)?
                .map(|t| t.timestamp_millis()),
            key: row.try_get_by_index(9)?,
        });
    }
    let rows = admin
        .query_all(
            &Query::select()
                .columns([
                    col("job"),
                    col("slot"),
                    col("token"),
                    col("writer"),
                    col("permit"),
                    col("permit_token"),
                    col("begun_ms"),
                    col("ended_ms"),
                ])
                .from(Alias::new(&s.writes))
                .order_by(col("slot"), sea_orm::sea_query::Order::Asc)
                .to_owned(),
        )
        .await?;
    let mut writes = Vec::with_capacity(rows.len());
    for row in rows {
        writes.push(jobs_checker::WriteRow {
            job: row.try_get_by_index(0)?,
            slot: row.try_get_by_index(1)?,
            token: row.try_get_by_index(2)?,
            writer: row.try_get_by_index(3)?,
            permit: row
                .try_get_by_index::<Option<String>>(4)?
                .zip(row.try_get_by_index::<Option<i64>>(5)?),
            span_ms: row
                .try_get_by_index::<Option<i64>>(6)?
                .zip(row.try_get_by_index::<Option<i64>>(7)?),
        });
    }
    let kept_table = orion_beacon::entity::job_attempt_table(&s.runs);
    let rows = admin
        .query_all(
            &Query::select()
                .columns([
                    col("job"),
                    col("slot"),
                    col("attempt"),
                    col("state"),
                    col("finished_token"),
                ])
                .from(Alias::new(&kept_table))
                .to_owned(),
        )
        .await?;
    let mut kept = Vec::with_capacity(rows.len());
    for row in rows {
        kept.push(jobs_checker::KeptAttempt {
            job: row.try_get_by_index(0)?,
            slot: row.try_get_by_index(1)?,
            attempt: row.try_get_by_index(2)?,
            state: row.try_get_by_index(3)?,
            finished_token: row.try_get_by_index(4)?,
        });
    }
    let mut verdict = jobs_checker::check(
        (
            crate::job_node::JOB,
            crate::job_node::EVERY.as_millis() as i64,
        ),
        (
            crate::job_node::LOAD_PREFIX,
            crate::job_node::LOAD_EVERY.as_millis() as i64,
        ),
        &records,
        &writes,
        &histories,
        (duration.as_secs(), times.run_end_ns),
    );
    let kept = jobs_checker::check_history(&records, &kept, &mut verdict);
    println!("attempt history: {kept} earlier attempts kept");
    verdict.violations.extend(run_violations);
    let last_token = SeaOrmLeaseStore::new(admin.clone())
        .with_table(&s.table)?
        .current(&s.resource)
        .await?
        .map_or(0, |r| r.token.get());
    report::JobSummary {
        label,
        seed: times.seed,
        nodes: times.candidates,
        skewed: times.skewed,
        duration_ns: times.run_end_ns - times.run_start_ns,
        histories: &histories,
        verdict: &verdict,
        faults: &applied,
        fault_log: &faults_log,
        write_rows: writes.len(),
        last_token,
    }
    .print();
    let passed = verdict.violations.is_empty();
    if std::env::var_os("ORION_TORTURE_KEEP").is_some() || !passed {
        let log: String = faults_log
            .iter()
            .map(|f| {
                format!(
                    "{} {} {} {}\n",
                    f.kind,
                    f.candidate.as_deref().unwrap_or("-"),
                    f.start,
                    f.end
                )
            })
            .collect();
        std::fs::write(s.dir.join("faults"), log)?;
        println!("  histories: {}", s.dir.display());
        std::mem::forget(s._dir);
        return Ok(passed);
    }
    for table in [&s.writes, &s.runs, &s.ledger, &s.table] {
        let _ = admin
            .execute(&Table::drop().table(Alias::new(table)).to_owned())
            .await;
    }
    Ok(passed)
}
