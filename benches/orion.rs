//! orion-beacon's benchmarks: store throughput next to pgbench running the very same statement,
//! handover and failover times, one process holding 10,000 leases, batched renewal, and shard
//! sets over several node processes.
//!
//! ```sh
//! cargo bench --all-features --bench orion                    # everything (a few minutes)
//! cargo bench --all-features --bench orion -- throughput      # or: handover, scale, batch, shards
//! BENCH_SECS=10 cargo bench --all-features --bench orion -- throughput
//! ```
//!
//! Release builds only (`cargo bench` builds them): the figures in docs/performance.md are from
//! such a build. The shard-set part starts this binary again as node processes
//! (`benches/orion/shards.rs`); CPU accounting is in `benches/orion/cpu.rs`.
//!
//! Runs against private PostgreSQL and MariaDB instances of its own (`orion-beacon-testkit`,
//! started from the installed server binaries), or the servers `ORION_BEACON_PG_URL` /
//! `ORION_BEACON_MYSQL_URL` name; the round-trip count always uses a private PostgreSQL started
//! with `log_statement = 'all'`. Needs `pgbench` on the PATH. Results are printed as tables;
//! the handover/failover timeline is written to `target/orion-bench/transitions.svg`, the shard
//! ownership timeline to `target/orion-bench/shards.svg`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use orion_beacon::{
    Elector, ElectorHandle, Leadership, LeaseOutcome, LeaseStore, ReleaseEvents, SeaOrmLeaseStore,
    StoreError,
};
use plotters::prelude::*;
use sea_orm::{ConnectionTrait, DatabaseConnection};
use tokio::time::Instant;

#[path = "orion/cpu.rs"]
mod cpu;
// The tests' store double (a file of its own, nothing else of `tests/common`).
#[path = "../tests/common/double.rs"]
#[allow(dead_code)]
mod double;
#[path = "orion/shards.rs"]
mod shards;

use double::{Double, Intercept};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Whether `var` names a server of your own (then no private server is started for it).
fn external(var: &str) -> bool {
    std::env::var(var).is_ok_and(|url| !url.trim().is_empty())
}

/// The variable's URL when set, else this process's private instance.
fn server_url(var: &str, private: impl FnOnce() -> String) -> String {
    match std::env::var(var) {
        Ok(url) if !url.trim().is_empty() => url,
        _ => private(),
    }
}
fn pg_url() -> String {
    server_url("ORION_BEACON_PG_URL", || {
        orion_beacon_testkit::Postgres::shared().url()
    })
}
fn mysql_url() -> String {
    server_url("ORION_BEACON_MYSQL_URL", || {
        orion_beacon_testkit::MariaDb::shared().url()
    })
}
fn pool_mult() -> usize {
    std::env::var("BENCH_POOL_MULT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
}
fn client_counts() -> Vec<usize> {
    std::env::var("BENCH_CLIENTS")
        .ok()
        .map(|s| s.split(',').filter_map(|c| c.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 4, 16])
}
fn secs() -> Duration {
    Duration::from_secs(
        std::env::var("BENCH_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(5),
    )
}
fn repeats() -> usize {
    std::env::var("BENCH_REPEATS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
        .max(1)
}

async fn connect(
    url: &str,
    max: u32,
    test_before_acquire: bool,
) -> Result<DatabaseConnection, Error> {
    let mut o = if url.starts_with("sqlite:") {
        orion_beacon::backend::sqlite::connect_options(url)
    } else {
        sea_orm::ConnectOptions::new(url)
    };
    o.max_connections(max)
        .min_connections(max.min(4))
        .sqlx_logging(false)
        .test_before_acquire(test_before_acquire);
    Ok(sea_orm::Database::connect(o).await?)
}

fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", std::process::id())
}

async fn migrate(db: &DatabaseConnection, table: &str) -> Result<(), Error> {
    use orion_beacon_migration::{CreateLeaseTable, MigrationTrait, SchemaManager};
    let m = CreateLeaseTable::with_table(table)?;
    drop(db, table).await;
    m.up(&SchemaManager::new(db)).await?;
    Ok(())
}

/// Deletes the benchmark's leases, then drops the table (`down` keeps a table with rows).
async fn drop(db: &DatabaseConnection, table: &str) {
    use orion_beacon_migration::{CreateLeaseTable, MigrationTrait, SchemaManager};
    use sea_orm::sea_query::{Alias, Query};
    if let Ok(m) = CreateLeaseTable::with_table(table) {
        let _ = db
            .execute(&Query::delete().from_table(Alias::new(table)).to_owned())
            .await;
        let _ = m.down(&SchemaManager::new(db)).await;
    }
}

// ------------------------------------------------------------------------------------------
// Throughput

/// One throughput cell: calls per second, and CPU per call on each side.
#[derive(Debug, Clone, Copy)]
struct Rate {
    per_s: f64,
    /// Client CPU per call (µs): this process's, or pgbench's.
    client_us: f64,
    /// The private server's CPU per call (µs); `None` on a server you named.
    db_us: Option<f64>,
}

impl Rate {
    fn new(calls: u64, wall: Duration, client: Duration, db: Option<Duration>) -> Self {
        let calls = calls.max(1) as f64;
        Self {
            per_s: calls / wall.as_secs_f64(),
            client_us: client.as_secs_f64() * 1e6 / calls,
            db_us: db.map(|d| d.as_secs_f64() * 1e6 / calls),
        }
    }
}

fn us(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1} µs"))
}

/// `clients` tasks on this (2-worker) runtime, each acquiring-or-renewing its own resource in
/// a loop for `d`, on one shared pool.
async fn store_rate(
    store: &SeaOrmLeaseStore,
    clients: usize,
    d: Duration,
    server: Option<cpu::Server>,
) -> Result<Rate, Error> {
    let done = Arc::new(AtomicU64::new(0));
    let (cpu0, db0) = (cpu::process(), server.map(|s| s.cpu()));
    let start = Instant::now();
    let stop = start + d;
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (store, done) = (store.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let resource = format!("bench-{c}");
            let mut n = 0;
            while Instant::now() < stop {
                store
                    .acquire_or_renew(&resource, "bench", Duration::from_secs(60))
                    .await?;
                n += 1;
            }
            done.fetch_add(n, Ordering::Relaxed);
            Ok::<_, StoreError>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let wall = start.elapsed();
    Ok(Rate::new(
        done.load(Ordering::Relaxed),
        wall,
        cpu::process() - cpu0,
        cpu::delta(server, db0),
    ))
}

/// What each client of [`store_rate_threaded`] runs in its loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// `acquire_or_renew`, the store's call.
    Store,
    /// The store's acquire-or-renew statement (`acquire_statement`, the very text pgbench
    /// runs) sent through SeaORM (`query_all_raw`), without the store's check: what the
    /// client stack costs for one statement.
    Statement,
}

/// The loop with pgbench's threading (`-j min(clients, 2)`): each of `threads` OS threads runs
/// a current-thread runtime with its own pool of `clients / threads` connections (times
/// `BENCH_POOL_MULT`) and its own clients, so no call wakes a task on another thread.
fn store_rate_threaded(
    url: &str,
    table: &str,
    clients: usize,
    d: Duration,
    op: Op,
    server: Option<cpu::Server>,
) -> Result<Rate, Error> {
    let threads = clients.min(2);
    let go = Arc::new(std::sync::Barrier::new(threads + 1));
    let mut joins = Vec::new();
    for t in 0..threads {
        let (url, table, go) = (url.to_owned(), table.to_owned(), go.clone());
        let mine: Vec<usize> = (0..clients).filter(|c| c % threads == t).collect();
        joins.push(std::thread::spawn(move || -> Result<u64, Error> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async move {
                let db = connect(&url, (mine.len() * pool_mult()) as u32, false).await;
                go.wait(); // even on error, so the others are not left waiting
                let store = SeaOrmLeaseStore::new(db?).with_table(&table)?;
                let stop = Instant::now() + d;
                let lease = Duration::from_secs(60);
                let tasks: Vec<_> = mine
                    .into_iter()
                    .map(|c| {
                        let store = store.clone();
                        tokio::spawn(async move {
                            let resource = format!("bench-{c}");
                            let stmt = store.acquire_statement(&resource, "bench", lease)?;
                            let mut n = 0u64;
                            while Instant::now() < stop {
                                match op {
                                    Op::Store => {
                                        store.acquire_or_renew(&resource, "bench", lease).await?;
                                    }
                                    Op::Statement => {
                                        store.connection().query_all_raw(stmt.clone()).await?;
                                    }
                                }
                                n += 1;
                            }
                            Ok::<_, Error>(n)
                        })
                    })
                    .collect();
                let mut n = 0;
                for t in tasks {
                    n += t.await??;
                }
                Ok(n)
            })
        }));
    }
    go.wait();
    let (cpu0, db0, start) = (cpu::process(), server.map(|s| s.cpu()), Instant::now());
    let mut calls = 0;
    for j in joins {
        calls += j.join().map_err(|_| "a benchmark thread panicked")??;
    }
    let wall = start.elapsed();
    Ok(Rate::new(
        calls,
        wall,
        cpu::process() - cpu0,
        cpu::delta(server, db0),
    ))
}

/// pgbench running the store's exact acquire-or-renew statement, prepared, one resource per
/// client; with `check`, followed by the store's second statement on PostgreSQL (`SELECT
/// transaction_timestamp()`, the autocommit check), i.e. the two statements one call sends.
/// A call is one run of the script. Client CPU is pgbench's own (its rusage as our child).
fn pgbench_rate(
    url: &str,
    store: &SeaOrmLeaseStore,
    clients: usize,
    d: Duration,
    check: bool,
    server: Option<cpu::Server>,
) -> Result<Rate, Error> {
    let stmt = store.acquire_statement("RESOURCE", "bench", Duration::from_secs(60))?;
    let values = stmt.values.map(|v| v.0).unwrap_or_default();
    let mut sql = stmt.sql.clone();
    // $n -> a literal (or the per-client resource), highest number first so $1 does not eat $10.
    for (i, v) in values.iter().enumerate().rev() {
        let literal = match v {
            sea_orm::Value::String(Some(s)) if s == "RESOURCE" => {
                "('bench-' || :client_id)".to_owned()
            }
            sea_orm::Value::String(Some(s)) => format!("'{s}'"),
            sea_orm::Value::BigInt(Some(n)) => format!("{n}::bigint"),
            sea_orm::Value::Int(Some(n)) => n.to_string(),
            other => return Err(format!("unexpected value {other:?}").into()),
        };
        sql = sql.replace(&format!("${}", i + 1), &literal);
    }
    let dir = PathBuf::from("target/orion-bench");
    std::fs::create_dir_all(&dir)?;
    let script = dir.join(if check {
        "acquire-checked.sql"
    } else {
        "acquire.sql"
    });
    let mut text = format!("{sql};\n");
    if check {
        text.push_str("SELECT transaction_timestamp();\n");
    }
    std::fs::write(&script, text)?;
    let (cpu0, db0, start) = (cpu::children(), server.map(|s| s.cpu()), Instant::now());
    let out = std::process::Command::new("pgbench")
        .args([
            "-n",
            "-M",
            "prepared",
            "-c",
            &clients.to_string(),
            "-j",
            &clients.min(2).to_string(),
        ])
        .args(["-T", &d.as_secs().to_string(), "-f"])
        .arg(&script)
        .arg(url)
        .output()?;
    let (client, db) = (cpu::children() - cpu0, cpu::delta(server, db0));
    let wall = start.elapsed();
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |prefix: &str| -> Option<f64> {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
    };
    let tps = field("tps = ").ok_or_else(|| {
        format!(
            "no tps in pgbench output: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let calls = field("number of transactions actually processed: ")
        .unwrap_or(tps * d.as_secs_f64()) as u64;
    // pgbench's own rate excludes its connection set-up; CPU per call is over all of it.
    let mut rate = Rate::new(calls, wall, client, db);
    rate.per_s = tps;
    Ok(rate)
}

/// Statements the server logged for `n` calls of `op` on `db` (a pool of one connection to a
/// server that logs every statement to `log`): lines of that backend's pid counted in the
/// server log. One round trip per call means 1.0.
async fn pg_statements_per_call<F, Fut>(
    db: &DatabaseConnection,
    log: &std::path::Path,
    n: u64,
    mut op: F,
) -> Result<f64, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), Error>>,
{
    let pid: i32 = db
        .query_one_raw(sea_orm::Statement::from_string(
            db.get_database_backend(),
            "SELECT pg_backend_pid()",
        ))
        .await?
        .ok_or("no pid")?
        .try_get_by_index(0)?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let offset = std::fs::metadata(log)?.len();
    for _ in 0..n {
        op().await?;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let text = std::fs::read(log)?;
    let tail = String::from_utf8_lossy(&text[offset.min(text.len() as u64) as usize..]);
    let tag = format!("[{pid}] ");
    let statements = tail
        .lines()
        .filter(|l| {
            l.contains(&tag) && (l.contains(" LOG:  execute ") || l.contains(" LOG:  statement: "))
        })
        .count();
    Ok(statements as f64 / n as f64)
}

async fn throughput() -> Result<(), Error> {
    let d = secs();
    // BENCH_PG_DURABLE=1: a private PostgreSQL with Debian's durability defaults (fsync and
    // full_page_writes on) instead of the test kit's; put it on a disk with
    // ORION_TESTKIT_TMPDIR (in /dev/shm an fsync costs nothing).
    let durable =
        if std::env::var_os("BENCH_PG_DURABLE").is_some() && !external("ORION_BEACON_PG_URL") {
            Some(
                tokio::task::spawn_blocking(|| {
                    orion_beacon_testkit::Postgres::builder()
                        .setting("fsync", "on")
                        .setting("full_page_writes", "on")
                        .start()
                })
                .await??,
            )
        } else {
            None
        };
    let (url, server) = match &durable {
        Some(pg) => (pg.url(), cpu::Server::new(pg.pid())),
        None => (pg_url(), cpu::postgres()),
    };
    if durable.is_some() {
        println!("\n(throughput: a private PostgreSQL with fsync = on, full_page_writes = on)");
    }
    let table = unique("obbench");
    let mut pg_rows = Vec::new();
    for clients in client_counts() {
        let db = connect(&url, (clients * pool_mult()) as u32, false).await?;
        migrate(&db, &table).await?;
        let store = SeaOrmLeaseStore::new(db.clone()).with_table(&table)?;
        let threaded = |op: Op| {
            let (url, table) = (url.clone(), table.clone());
            tokio::task::spawn_blocking(move || {
                store_rate_threaded(&url, &table, clients, d, op, server)
            })
        };
        // The cells one after the other, `BENCH_REPEATS` times: a slow moment of the machine
        // then hits one repeat of every cell rather than all repeats of one.
        let mut reps = Vec::new();
        for _ in 0..repeats() {
            let pgbench = pgbench_rate(&url, &store, clients, d, false, server)?;
            let ours = store_rate(&store, clients, d, server).await?;
            let per_thread = threaded(Op::Store).await??;
            let statement = threaded(Op::Statement).await??;
            let pgbench2 = pgbench_rate(&url, &store, clients, d, true, server)?;
            let pinged_db = connect(&url, clients as u32, true).await?;
            let pinged = store_rate(
                &SeaOrmLeaseStore::new(pinged_db.clone()).with_table(&table)?,
                clients,
                d,
                server,
            )
            .await?;
            pinged_db.close().await?;
            reps.push([pgbench, ours, per_thread, statement, pgbench2, pinged]);
        }
        drop(&db, &table).await;
        db.close().await?;
        pg_rows.push((clients, reps));
    }
    let median = |mut v: Vec<f64>| -> f64 {
        v.sort_by(f64::total_cmp);
        match v.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    };
    // Per cell: the median rate and CPU over the repeats; ratios: the median of each repeat's
    // own ratio (the cells of one repeat ran within a minute of each other).
    let cell = |reps: &[[Rate; 6]], k: usize| -> Rate {
        let db: Vec<f64> = reps.iter().filter_map(|r| r[k].db_us).collect();
        Rate {
            per_s: median(reps.iter().map(|r| r[k].per_s).collect()),
            client_us: median(reps.iter().map(|r| r[k].client_us).collect()),
            db_us: (!db.is_empty()).then(|| median(db)),
        }
    };
    let ratio = |reps: &[[Rate; 6]], k: usize, of: usize| -> f64 {
        median(reps.iter().map(|r| r[k].per_s / r[of].per_s).collect())
    };
    println!(
        "\n## Store throughput (acquire-or-renew, one resource per client, {}s per cell, medians of {} repeats)\n",
        d.as_secs(),
        repeats()
    );
    println!(
        "Calls per second. pgbench: the store's acquire-or-renew statement, prepared (\"1 \
         statement\"), or that statement and the store's autocommit check `SELECT \
         transaction_timestamp()` (\"2 statements\": what one call sends on PostgreSQL). \
         orion-beacon: `acquire_or_renew` in tasks on one 2-worker runtime sharing one pool (the \
         harness before), or with pgbench's threading (a current-thread runtime and a pool per \
         thread, `-j min(clients, 2)`). SeaORM, 1 statement: the store's statement sent through \
         SeaORM without the check, pgbench's threading. Ratios are to pgbench, 1 statement, \
         unless named.\n"
    );
    println!("| backend | clients | pgbench, 1 statement | orion-beacon, one runtime | ratio | orion-beacon, a runtime per thread | ratio | SeaORM, 1 statement | ratio | pgbench, 2 statements | ratio of a runtime per thread to it | with test_before_acquire |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for (clients, reps) in &pg_rows {
        println!(
            "| PostgreSQL 15 | {clients} | {:.0} | {:.0} | {:.2} | {:.0} | {:.2} | {:.0} | {:.2} | {:.0} | {:.2} | {:.0} |",
            cell(reps, 0).per_s,
            cell(reps, 1).per_s,
            ratio(reps, 1, 0),
            cell(reps, 2).per_s,
            ratio(reps, 2, 0),
            cell(reps, 3).per_s,
            ratio(reps, 3, 0),
            cell(reps, 4).per_s,
            ratio(reps, 2, 4),
            cell(reps, 5).per_s,
        );
    }
    let mut other_rows = Vec::new();
    let others = if std::env::var_os("BENCH_PG_ONLY").is_some() {
        Vec::new()
    } else {
        vec![
            ("MariaDB 10.11", mysql_url()),
            (
                "SQLite (file, WAL)",
                format!(
                    "sqlite://{}/target/orion-bench/bench.db",
                    std::env::current_dir()?.display()
                ),
            ),
        ]
    };
    for (name, url) in others {
        std::fs::create_dir_all("target/orion-bench")?;
        for clients in client_counts() {
            let db = connect(&url, clients as u32, false).await?;
            migrate(&db, &table).await?;
            let store = SeaOrmLeaseStore::new(db.clone()).with_table(&table)?;
            let ours = store_rate(&store, clients, d, None).await?;
            other_rows.push(format!(
                "| {name} | {clients} | - | {:.0} | - | - | - | - | - | - | - | - |",
                ours.per_s
            ));
            drop(&db, &table).await;
        }
    }
    for row in other_rows {
        println!("{row}");
    }
    println!(
        "\n### CPU per call, PostgreSQL (client: this process's rusage, or pgbench's as our \
         child; database: the private server's processes, from /proc)\n"
    );
    println!("| clients | pgbench, 1 statement: client | database | orion-beacon, one runtime: client | database | orion-beacon, a runtime per thread: client | database | SeaORM, 1 statement: client | database | pgbench, 2 statements: client | database |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for (clients, reps) in &pg_rows {
        let cells: Vec<String> = (0..5)
            .map(|k| {
                let x = cell(reps, k);
                format!("{:.1} µs | {}", x.client_us, us(x.db_us))
            })
            .collect();
        println!("| {clients} | {} |", cells.join(" | "));
    }
    println!("\nEach repeat's ratio, a runtime per thread / pgbench, 1 statement:");
    for (clients, reps) in &pg_rows {
        let each: Vec<String> = reps
            .iter()
            .map(|r| format!("{:.2}", r[2].per_s / r[0].per_s))
            .collect();
        println!("- {clients} clients: {}", each.join(", "));
    }

    if let Some(pg) = durable {
        tokio::task::spawn_blocking(move || std::mem::drop(pg)).await?;
    }
    roundtrips().await
}

/// Round trips, counted by the server: the statements a private PostgreSQL instance (started
/// with `log_statement = 'all'`, never an external server) logged for our connection.
async fn roundtrips() -> Result<(), Error> {
    let pg = tokio::task::spawn_blocking(|| {
        orion_beacon_testkit::Postgres::builder()
            .setting("log_statement", "all")
            .start()
    })
    .await??;
    let log = pg.log_file().to_path_buf();
    let table = unique("obrt");
    let db = connect(&pg.url(), 1, false).await?;
    migrate(&db, &table).await?;
    let store = SeaOrmLeaseStore::new(db.clone()).with_table(&table)?;
    store
        .acquire_or_renew("rt", "me", Duration::from_secs(60))
        .await?;
    let s = store.clone();
    let renew = pg_statements_per_call(&db, &log, 200, || {
        let s = s.clone();
        async move {
            s.acquire_or_renew("rt", "me", Duration::from_secs(60))
                .await
                .map(|_| ())
                .map_err(Into::into)
        }
    })
    .await?;
    let s = store.clone();
    let denied = pg_statements_per_call(&db, &log, 200, || {
        let s = s.clone();
        async move {
            s.acquire_or_renew("rt", "other", Duration::from_secs(60))
                .await
                .map(|_| ())
                .map_err(Into::into)
        }
    })
    .await?;
    let s = store.clone();
    let cycle = pg_statements_per_call(&db, &log, 200, || {
        let s = s.clone();
        async move {
            s.release("rt", "me").await?;
            s.acquire_or_renew("rt", "me", Duration::from_secs(60))
                .await?;
            Ok(())
        }
    })
    .await?;
    println!(
        "\nPostgreSQL statements per call, from the server log (log_statement = 'all', 200 calls each): \
         renew {renew:.2}, denied acquire {denied:.2}, release + acquire {cycle:.2}"
    );
    drop(&db, &table).await;
    db.close().await?;
    tokio::task::spawn_blocking(move || std::mem::drop(pg)).await?;
    Ok(())
}

// ------------------------------------------------------------------------------------------
// Handover and failover

/// Transition times (ms) in an HDR histogram: microsecond resolution, 3 significant digits.
fn histogram(times_ms: &[f64]) -> Result<hdrhistogram::Histogram<u64>, Error> {
    let mut h = hdrhistogram::Histogram::<u64>::new(3)?;
    for t in times_ms {
        h.record((t * 1000.0).round().max(1.0) as u64)?;
    }
    Ok(h)
}

/// The `q` quantile of `h`, in milliseconds (`NaN` for no samples).
fn quantile_ms(h: &hdrhistogram::Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        return f64::NAN;
    }
    h.value_at_quantile(q) as f64 / 1000.0
}

async fn start(
    store: SeaOrmLeaseStore,
    resource: &str,
    name: String,
    lease: Duration,
    renew: Duration,
    retry: Duration,
) -> Result<ElectorHandle, Error> {
    Ok(Elector::builder(store)
        .resource(resource)
        .candidate_id(name)
        .lease_duration(lease)
        .renew_interval(renew)
        .retry_interval(retry)
        .jitter(0.0)
        .build()?
        .start())
}

async fn wait_leader(h: &ElectorHandle, limit: Duration) -> Result<(), Error> {
    let mut rx = h.watch();
    tokio::time::timeout(limit, rx.wait_for(|s| matches!(s, Leadership::Leader(_)))).await??;
    Ok(())
}

/// `n` transitions between two candidates; `graceful` releases, otherwise the leader is aborted.
async fn transitions(
    url: &str,
    n: usize,
    graceful: bool,
    lease: Duration,
    renew: Duration,
    retry: Duration,
) -> Result<Vec<f64>, Error> {
    let table = unique(if graceful { "obhand" } else { "obfail" });
    let admin = connect(url, 2, false).await?;
    migrate(&admin, &table).await?;
    let resource = "transitions";
    let mk = |i: usize| {
        let url = url.to_owned();
        let table = table.clone();
        async move {
            let db = connect(&url, 2, false).await?;
            let store = SeaOrmLeaseStore::new(db).with_table(&table)?;
            start(store, resource, format!("n{i}"), lease, renew, retry).await
        }
    };
    let mut leader = mk(0).await?;
    wait_leader(&leader, Duration::from_secs(10)).await?;
    let mut times = Vec::new();
    for i in 1..=n {
        let follower = mk(i).await?;
        tokio::time::sleep(renew * 2).await; // the follower has been denied once and waits
        let t0 = Instant::now();
        if graceful {
            leader.shutdown().await;
        } else {
            leader.abort().await;
        }
        wait_leader(&follower, lease * 4 + retry * 2).await?;
        times.push((Instant::now() - t0).as_secs_f64() * 1e3);
        leader = follower;
    }
    leader.shutdown().await;
    drop(&admin, &table).await;
    Ok(times)
}

/// One line per series: time to a new leader (ms) per transition.
fn svg(series: &[(&str, RGBColor, Vec<f64>)], path: &std::path::Path) -> Result<(), Error> {
    let n = series.iter().map(|s| s.2.len()).max().unwrap_or(1).max(2);
    let ymax = series
        .iter()
        .flat_map(|s| s.2.iter().copied())
        .fold(1.0, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, (720, 360)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "orion-beacon: time to a new leader per transition (ms)",
            ("sans-serif", 16),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0..n, 0.0..ymax)?;
    chart
        .configure_mesh()
        .x_desc("transition #")
        .y_desc("ms")
        .draw()?;
    for (label, color, values) in series {
        let color = *color;
        chart
            .draw_series(LineSeries::new(
                values.iter().copied().enumerate(),
                color.stroke_width(2),
            ))?
            .label(*label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

async fn handover() -> Result<(), Error> {
    let n: usize = std::env::var("BENCH_TRANSITIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50);
    let lease = Duration::from_millis(500);
    let renew = Duration::from_millis(100);
    let retry = Duration::from_secs(1);
    println!("\n## Handover and failover ({n} transitions each; lease {lease:?}, renew {renew:?}, follower retry {retry:?})\n");
    println!("| backend | transition | p50 (ms) | p99 (ms) | max (ms) | goal |");
    println!("| --- | --- | --- | --- | --- | --- |");
    std::fs::create_dir_all("target/orion-bench")?;
    let sqlite = format!(
        "sqlite://{}/target/orion-bench/handover.db",
        std::env::current_dir()?.display()
    );
    let mut chart = Vec::new();
    for (name, url) in [
        ("PostgreSQL", pg_url()),
        ("MariaDB", mysql_url()),
        ("SQLite", sqlite),
    ] {
        for graceful in [true, false] {
            let t = transitions(&url, n, graceful, lease, renew, retry).await?;
            let h = histogram(&t)?;
            let goal = match (graceful, name) {
                (true, "PostgreSQL") => "p99 < 50 ms (LISTEN/NOTIFY)".to_owned(),
                (true, _) => format!("next poll (<= {} ms)", retry.as_millis()),
                (false, _) => format!("p99 <= lease + 100 = {} ms", lease.as_millis() + 100),
            };
            println!(
                "| {name} | {} | {:.1} | {:.1} | {:.1} | {goal} |",
                if graceful {
                    "graceful release"
                } else {
                    "crash (no release)"
                },
                quantile_ms(&h, 0.5),
                quantile_ms(&h, 0.99),
                quantile_ms(&h, 1.0)
            );
            if name == "PostgreSQL" {
                chart.push((
                    if graceful {
                        "PostgreSQL graceful handover"
                    } else {
                        "PostgreSQL failover after crash"
                    },
                    if graceful {
                        RGBColor(0x1f, 0x77, 0xb4)
                    } else {
                        RGBColor(0xd6, 0x27, 0x28)
                    },
                    t,
                ));
            }
        }
    }
    let path = PathBuf::from("target/orion-bench/transitions.svg");
    svg(&chart, &path)?;
    println!("\nchart: {}", path.display());
    Ok(())
}

// ------------------------------------------------------------------------------------------
// Scale: one process, 10,000 leases

#[derive(Clone)]
struct Counting {
    renews: Arc<AtomicU64>,
    calls: Arc<AtomicU64>,
}

#[async_trait]
impl Intercept<SeaOrmLeaseStore> for Counting {
    async fn acquire_or_renew(
        &self,
        inner: &SeaOrmLeaseStore,
        r: &str,
        c: &str,
        lease: Duration,
    ) -> Result<LeaseOutcome, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let out = inner.acquire_or_renew(r, c, lease).await?;
        if matches!(out, LeaseOutcome::Renewed(_)) {
            self.renews.fetch_add(1, Ordering::Relaxed);
        }
        Ok(out)
    }
    /// No release notifications (no listener per elector): followers poll.
    fn release_events(&self, _inner: &SeaOrmLeaseStore) -> Option<ReleaseEvents> {
        None
    }
}

async fn scale() -> Result<(), Error> {
    let leases: usize = std::env::var("BENCH_LEASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let d = Duration::from_secs(
        std::env::var("BENCH_SCALE_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(30),
    );
    let table = unique("obscale");
    let db = connect(&pg_url(), 16, false).await?;
    migrate(&db, &table).await?;
    let counting = Double::over(
        SeaOrmLeaseStore::new(db.clone()).with_table(&table)?,
        Counting {
            renews: Arc::default(),
            calls: Arc::default(),
        },
    );
    let mut handles = Vec::with_capacity(leases);
    for i in 0..leases {
        handles.push(
            Elector::builder(counting.clone())
                .resource(format!("shard-{i}"))
                .candidate_id("scale-node")
                .lease_duration(Duration::from_secs(15))
                .renew_interval(Duration::from_secs(5))
                .build()?
                .start(),
        );
    }
    // Everyone elected, then measure a steady window.
    let t0 = Instant::now();
    while handles.iter().filter(|h| h.is_leader()).count() < leases {
        if t0.elapsed() > Duration::from_secs(120) {
            return Err("not all leases were acquired within 120 s".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let elected_in = t0.elapsed();
    let (cpu0, renews0, t1) = (
        cpu::process(),
        counting.renews.load(Ordering::Relaxed),
        Instant::now(),
    );
    tokio::time::sleep(d).await;
    let (cpu1, renews1, secs) = (
        cpu::process(),
        counting.renews.load(Ordering::Relaxed),
        t1.elapsed().as_secs_f64(),
    );
    let renews = (renews1 - renews0) as f64;
    let leading = handles.iter().filter(|h| h.is_leader()).count();
    println!("\n## Scale: one process, {leases} leases (lease 15 s, renew 5 s, pool of 16, PostgreSQL)\n");
    println!("| measure | value |");
    println!("| --- | --- |");
    println!(
        "| all {leases} acquired in | {:.1} s |",
        elected_in.as_secs_f64()
    );
    println!(
        "| renew statements per second | {:.0} (expected {:.0}) |",
        renews / secs,
        leases as f64 / 5.0
    );
    println!(
        "| process CPU per renewal (elector + store + driver) | {:.1} µs |",
        (cpu1 - cpu0).as_secs_f64() * 1e6 / renews.max(1.0)
    );
    println!(
        "| process CPU | {:.1} % of one core |",
        (cpu1 - cpu0).as_secs_f64() / secs * 100.0
    );
    println!("| leases still held at the end | {leading} / {leases} |");
    for h in handles {
        h.abort().await;
    }
    drop(&db, &table).await;
    Ok(())
}

// ------------------------------------------------------------------------------------------
// Batched renewal

/// One process holding `BENCH_LEASES` leases (default 10,000) in one table renews them all,
/// `BENCH_ROUNDS` times (default 5): lease by lease (16 at a time, as electors sharing a pool
/// of 16 would) and with one `renew_all` per round, side by side on the same leases. Client
/// CPU is this process's; database CPU is the private server's processes' (`/proc`), not
/// measured on a server you name.
async fn batch_backend(name: &str, url: &str, server: Option<cpu::Server>) -> Result<(), Error> {
    let leases: usize = std::env::var("BENCH_LEASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let lease = Duration::from_secs(60);
    let table = unique("obbatch");
    let db = connect(url, 16, false).await?;
    migrate(&db, &table).await?;
    let store = SeaOrmLeaseStore::new(db.clone()).with_table(&table)?;
    // Acquire them all (16 at a time).
    let mut held = Vec::with_capacity(leases);
    for chunk in (0..leases).collect::<Vec<_>>().chunks(16) {
        let grants = futures::future::join_all(chunk.iter().map(|i| {
            let store = store.clone();
            async move {
                store
                    .acquire_or_renew(&format!("shard-{i}"), "batch-node", lease)
                    .await
            }
        }))
        .await;
        for g in grants {
            match g? {
                LeaseOutcome::Acquired(l) | LeaseOutcome::Renewed(l) => held.push(l),
                LeaseOutcome::Denied(d) => return Err(format!("denied: {d:?}").into()),
            }
        }
    }
    let server_cpu = || server.map(|s| s.cpu());
    // Lease by lease.
    let (cpu0, db0, t0) = (cpu::process(), server_cpu(), Instant::now());
    for _ in 0..rounds {
        for chunk in held.chunks(16) {
            for r in futures::future::join_all(chunk.iter().map(|l| {
                let store = store.clone();
                async move { store.acquire_or_renew(&l.resource, &l.holder, lease).await }
            }))
            .await
            {
                if !matches!(r?, LeaseOutcome::Renewed(_)) {
                    return Err("a per-lease renew did not renew".into());
                }
            }
        }
    }
    let (single_cpu, single_wall) = (cpu::process() - cpu0, t0.elapsed());
    let single_db = cpu::delta(server, db0);
    // One statement per round.
    let (cpu0, db0, t0) = (cpu::process(), server_cpu(), Instant::now());
    for _ in 0..rounds {
        let out = store.renew_all(&held, lease).await?;
        if out.renewed.len() != leases {
            return Err(format!("the batch renewed {} of {leases}", out.renewed.len()).into());
        }
    }
    let (batch_cpu, batch_wall) = (cpu::process() - cpu0, t0.elapsed());
    let batch_db = cpu::delta(server, db0);
    let renewals = (leases * rounds) as f64;
    let per = |d: Duration| d.as_secs_f64() * 1e6 / renewals;
    let per_round = |d: Option<Duration>| match d {
        Some(d) => format!("{:.0} ms", d.as_secs_f64() * 1e3 / rounds as f64),
        None => "-".to_owned(),
    };
    let per_lease = |d: Option<Duration>| match d {
        Some(d) => format!("{:.1} µs", per(d)),
        None => "-".to_owned(),
    };
    let ratio = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
        (Some(a), Some(b)) => format!("{:.1}", a.as_secs_f64() / b.as_secs_f64().max(1e-9)),
        _ => "-".to_owned(),
    };
    println!(
        "\n## Batched renewal: {leases} leases, {rounds} rounds, {name}\n\n\
         | path | statements per round | wall time per round | client CPU per lease renewal | database CPU per round | database CPU per lease renewal |\n\
         | --- | --- | --- | --- | --- | --- |\n\
         | lease by lease (16 at a time) | {leases} | {:.0} ms | {:.1} µs | {} | {} |\n\
         | `renew_all` | 1 | {:.0} ms | {:.1} µs | {} | {} |\n\
         | ratio (lease by lease / batch) | {leases} | {:.1} | {:.1} | {} | |",
        single_wall.as_secs_f64() * 1e3 / rounds as f64,
        per(single_cpu),
        per_round(single_db),
        per_lease(single_db),
        batch_wall.as_secs_f64() * 1e3 / rounds as f64,
        per(batch_cpu),
        per_round(batch_db),
        per_lease(batch_db),
        single_wall.as_secs_f64() / batch_wall.as_secs_f64().max(1e-9),
        single_cpu.as_secs_f64() / batch_cpu.as_secs_f64().max(1e-9),
        ratio(single_db, batch_db),
    );
    drop(&db, &table).await;
    Ok(())
}

async fn batch() -> Result<(), Error> {
    let (pg, my) = (pg_url(), mysql_url());
    batch_backend("PostgreSQL", &pg, cpu::postgres()).await?;
    batch_backend("MariaDB", &my, cpu::mariadb()).await
}

fn main() -> Result<(), Error> {
    if shards::is_node() {
        return shards::node();
    }
    let what: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let all = what.is_empty();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        if all || what.iter().any(|w| w == "throughput") {
            throughput().await?;
        }
        if what.iter().any(|w| w == "roundtrips") {
            roundtrips().await?;
        }
        if all || what.iter().any(|w| w == "handover") {
            handover().await?;
        }
        if all || what.iter().any(|w| w == "scale") {
            scale().await?;
        }
        if all || what.iter().any(|w| w == "batch") {
            batch().await?;
        }
        if all || what.iter().any(|w| w == "shards") {
            shards::shards().await?;
        }
        Ok(())
    })
}
