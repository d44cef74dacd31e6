//! orion-beacon's benchmarks: store throughput next to pgbench running the very same statement,
//! handover and failover times, one process holding 10,000 leases, batched renewal, shard sets
//! over several node processes, how late scheduled jobs start their slots, and rate-limit
//! decisions next to pgbench running the same statement, and reader-writer locks next to PostgreSQL's
//! advisory pair.
//!
//! ```sh
//! cargo bench --all-features --bench orion                    # everything (a few minutes)
//! cargo bench --all-features --bench orion -- throughput      # or: handover, scale, mixed, batch, shards, shardcost, locks, jobs, rates, rwlocks
//! BENCH_SECS=10 cargo bench --all-features --bench orion -- throughput
//! ```
//!
//! Release builds only (`cargo bench` builds them): the figures in docs/performance.md are from
//! such a build. Each benchmark has a file of its own under `benches/orion/` (`throughput.rs`,
//! `roundtrips.rs`, `handover.rs`, `locks.rs`, `scale.rs` with the batch, `shards.rs`, which starts this
//! binary again as node processes, `jobs.rs`); CPU accounting is in `cpu.rs`, and what they share is here.
//!
//! Runs against private PostgreSQL and MariaDB instances of its own (`orion-beacon-testkit`,
//! started from the installed server binaries), or the servers `ORION_BEACON_PG_URL` /
//! `ORION_BEACON_MYSQL_URL` name; the round-trip count always uses a private PostgreSQL started
//! with `log_statement = 'all'`. Needs `pgbench` on the PATH. Results are printed as tables;
//! the handover/failover timeline is written to `target/orion-bench/transitions.svg`, the shard
//! ownership timeline to `target/orion-bench/shards.svg`.

use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseConnection};

#[path = "orion/cpu.rs"]
mod cpu;
#[path = "orion/handover.rs"]
mod handover;
#[path = "orion/jobs.rs"]
mod jobs;
#[path = "orion/locks.rs"]
mod locks;
#[path = "orion/rates.rs"]
mod rates;
#[path = "orion/roundtrips.rs"]
mod roundtrips;
#[path = "orion/rwlocks.rs"]
mod rwlocks;
#[path = "orion/scale.rs"]
mod scale;
#[path = "orion/shard_cost.rs"]
mod shard_cost;
#[path = "orion/shards.rs"]
mod shards;
#[path = "orion/throughput.rs"]
mod throughput;

pub(crate) type Error = Box<dyn std::error::Error + Send + Sync>;

/// Whether `var` names a server of your own (then no private server is started for it).
pub(crate) fn external(var: &str) -> bool {
    std::env::var(var).is_ok_and(|url| !url.trim().is_empty())
}

/// The variable's URL when set, else this process's private instance.
pub(crate) fn server_url(var: &str, private: impl FnOnce() -> String) -> String {
    match std::env::var(var) {
        Ok(url) if !url.trim().is_empty() => url,
        _ => private(),
    }
}
pub(crate) fn pg_url() -> String {
    server_url("ORION_BEACON_PG_URL", || {
        orion_beacon_testkit::Postgres::shared().url()
    })
}
pub(crate) fn mysql_url() -> String {
    server_url("ORION_BEACON_MYSQL_URL", || {
        orion_beacon_testkit::MariaDb::shared().url()
    })
}
pub(crate) fn pool_mult() -> usize {
    std::env::var("BENCH_POOL_MULT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
}
pub(crate) fn client_counts() -> Vec<usize> {
    std::env::var("BENCH_CLIENTS")
        .ok()
        .map(|s| s.split(',').filter_map(|c| c.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 4, 16])
}
pub(crate) fn secs() -> Duration {
    Duration::from_secs(
        std::env::var("BENCH_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(5),
    )
}
pub(crate) fn repeats() -> usize {
    std::env::var("BENCH_REPEATS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
        .max(1)
}

pub(crate) async fn connect(
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

/// pgbench's threading (`-j min(clients, 2)`): each of `min(clients, 2)` OS threads runs a
/// current-thread runtime and `body(its clients, go)`, which sets up, calls `go.wait()` (even
/// after a failed set-up, so the others are not left waiting), runs its clients and returns
/// how many calls they made. `at_start` runs once every thread has passed `go`; returns the
/// calls of all threads and what `at_start` returned.
pub(crate) fn on_threads<S, F, Fut>(
    clients: usize,
    at_start: impl FnOnce() -> S,
    body: F,
) -> Result<(u64, S), Error>
where
    F: Fn(Vec<usize>, std::sync::Arc<std::sync::Barrier>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<u64, Error>>,
{
    let threads = clients.clamp(1, 2);
    let go = std::sync::Arc::new(std::sync::Barrier::new(threads + 1));
    let body = std::sync::Arc::new(body);
    let mut joins = Vec::new();
    for t in 0..threads {
        let (go, body) = (go.clone(), body.clone());
        let mine: Vec<usize> = (0..clients).filter(|c| c % threads == t).collect();
        joins.push(std::thread::spawn(move || -> Result<u64, Error> {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(err) => {
                    go.wait();
                    return Err(err.into());
                }
            };
            rt.block_on(body(mine, go))
        }));
    }
    go.wait();
    let started = at_start();
    let mut calls = 0;
    for j in joins {
        calls += j.join().map_err(|_| "a benchmark thread panicked")??;
    }
    Ok((calls, started))
}

/// The median of `v` (the mean of the middle two for an even count; NaN for none).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// CLOCK_MONOTONIC in seconds, perf's clock with `-k CLOCK_MONOTONIC`.
fn monotonic() -> f64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as f64 + t.tv_nsec() as f64 / 1e9)
        .unwrap_or(f64::NAN)
}

/// With `BENCH_MARK_CELLS` set, prints the `CLOCK_MONOTONIC` span of the cell `what` that
/// began at `start` and ends now: for a profile of one cell, `perf record -k CLOCK_MONOTONIC`
/// and then `perf report --time FROM,TO` with these two times.
pub(crate) fn mark_cell(what: &str, start: tokio::time::Instant) {
    if std::env::var_os("BENCH_MARK_CELLS").is_some() {
        let to = monotonic();
        let from = to - start.elapsed().as_secs_f64();
        eprintln!("cell {what}: {from:.6},{to:.6}");
    }
}

/// `n` plain sqlx connections to `url` (no pool, no SeaORM, no store), opened one by one.
pub(crate) async fn plain_connections(
    url: &str,
    n: usize,
) -> Vec<Result<sea_orm::sqlx::PgConnection, sea_orm::sqlx::Error>> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        conns.push(<sea_orm::sqlx::PgConnection as sea_orm::sqlx::Connection>::connect(url).await);
    }
    conns
}

/// A client on a plain sqlx connection: `stmts` in turn until `stop`, each prepared once
/// (sqlx's statement cache) and bound by the binder the store uses (`sea-query-sqlx`); with
/// `timeout`, each under a 30 s `tokio::time::timeout` (a timer armed while the answer is
/// awaited). How many turns it ran.
pub(crate) async fn plain_client(
    mut conn: sea_orm::sqlx::PgConnection,
    stmts: &[sea_orm::Statement],
    stop: tokio::time::Instant,
    timeout: bool,
) -> Result<u64, Error> {
    let mut n = 0u64;
    while tokio::time::Instant::now() < stop {
        for stmt in stmts {
            let values = sea_query_sqlx::SqlxValues(
                stmt.values.clone().unwrap_or(sea_orm::Values(Vec::new())),
            );
            let q =
                sea_orm::sqlx::query_with(sea_orm::sqlx::AssertSqlSafe(stmt.sql.as_str()), values)
                    .fetch_all(&mut conn);
            if timeout {
                tokio::time::timeout(Duration::from_secs(30), q).await??;
            } else {
                q.await?;
            }
        }
        n += 1;
    }
    Ok(n)
}

/// The calls the client tasks made, all of them awaited.
pub(crate) async fn calls_of(
    tasks: Vec<tokio::task::JoinHandle<Result<u64, Error>>>,
) -> Result<u64, Error> {
    let mut n = 0;
    for t in tasks {
        n += t.await??;
    }
    Ok(n)
}

pub(crate) fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", std::process::id())
}

/// The lease table as the current migrations make it (the payload columns included).
pub(crate) async fn migrate(db: &DatabaseConnection, table: &str) -> Result<(), Error> {
    use orion_beacon_migration::{
        AddLeasePayload, CreateLeaseTable, MigrationTrait, SchemaManager,
    };
    let m = CreateLeaseTable::with_table(table)?;
    drop(db, table).await;
    m.up(&SchemaManager::new(db)).await?;
    AddLeasePayload::with_table(table)?
        .up(&SchemaManager::new(db))
        .await?;
    Ok(())
}

/// Deletes the benchmark's leases, then drops the table (`down` keeps a table with rows).
pub(crate) async fn drop(db: &DatabaseConnection, table: &str) {
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
pub(crate) struct Rate {
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

pub(crate) fn us(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1} µs"))
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
            throughput::throughput().await?;
        }
        if what.iter().any(|w| w == "roundtrips") {
            roundtrips::roundtrips().await?;
        }
        if all || what.iter().any(|w| w == "handover") {
            handover::handover().await?;
        }
        if all || what.iter().any(|w| w == "scale") {
            scale::scale().await?;
        }
        if all || what.iter().any(|w| w == "mixed") {
            scale::mixed().await?;
        }
        if all || what.iter().any(|w| w == "batch") {
            scale::batch().await?;
        }
        if all || what.iter().any(|w| w == "shards") {
            shards::shards().await?;
        }
        if what.iter().any(|w| w == "shardcost") {
            shard_cost::shard_cost().await?;
        }
        if all || what.iter().any(|w| w == "locks") {
            locks::locks_bench().await?;
        }
        if all || what.iter().any(|w| w == "jobs") {
            jobs::jobs_bench().await?;
        }
        if all || what.iter().any(|w| w == "spread") {
            jobs::spread_bench().await?;
        }
        if all || what.iter().any(|w| w == "rates") {
            rates::rates_bench().await?;
        }
        if all || what.iter().any(|w| w == "rwlocks") {
            rwlocks::rwlocks_bench().await?;
        }
        Ok(())
    })
}
