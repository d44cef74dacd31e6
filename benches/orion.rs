//! orion-beacon's benchmarks: store throughput next to pgbench running the very same statement,
//! handover and failover times, and one process holding 10,000 leases.
//!
//! ```sh
//! cargo bench --all-features --bench orion                    # everything (a few minutes)
//! cargo bench --all-features --bench orion -- throughput      # or: handover, scale, batch
//! BENCH_SECS=10 cargo bench --all-features --bench orion -- throughput
//! ```
//!
//! Runs against private PostgreSQL and MariaDB instances of its own (`orion-beacon-testkit`,
//! started from the installed server binaries), or the servers `ORION_BEACON_PG_URL` /
//! `ORION_BEACON_MYSQL_URL` name; the round-trip count always uses a private PostgreSQL started
//! with `log_statement = 'all'`. Needs `pgbench` on the PATH. Results are printed as tables;
//! the handover/failover timeline is written to `target/orion-bench/transitions.svg`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use orion_beacon::{
    Elector, ElectorHandle, Leadership, LeaseOutcome, LeaseRecord, LeaseStore, SeaOrmLeaseStore,
    StoreError,
};
use plotters::prelude::*;
use sea_orm::{ConnectionTrait, DatabaseConnection};
use tokio::time::Instant;

type Error = Box<dyn std::error::Error + Send + Sync>;

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
fn secs() -> Duration {
    Duration::from_secs(
        std::env::var("BENCH_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(10),
    )
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

/// `clients` tasks, each acquiring-or-renewing its own resource in a loop for `d`.
async fn store_rate(store: &SeaOrmLeaseStore, clients: usize, d: Duration) -> Result<f64, Error> {
    let done = Arc::new(AtomicU64::new(0));
    let stop = Instant::now() + d;
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (store, done) = (store.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let resource = format!("bench-{c}");
            while Instant::now() < stop {
                store
                    .acquire_or_renew(&resource, "bench", Duration::from_secs(60))
                    .await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, StoreError>(())
        }));
    }
    let start = Instant::now();
    for t in tasks {
        t.await??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}

/// pgbench running the store's exact acquire-or-renew statement, prepared, one resource per
/// client.
fn pgbench_rate(store: &SeaOrmLeaseStore, clients: usize, d: Duration) -> Result<f64, Error> {
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
    let script = dir.join("acquire.sql");
    std::fs::write(&script, format!("{sql};\n"))?;
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
        .arg(pg_url())
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let tps = text
        .lines()
        .find(|l| l.starts_with("tps = "))
        .and_then(|l| l.trim_start_matches("tps = ").split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| {
            format!(
                "no tps in pgbench output: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    Ok(tps)
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
    println!(
        "\n## Store throughput (acquire-or-renew, one resource per client, {}s per cell)\n",
        d.as_secs()
    );
    println!("| backend | clients | orion-beacon (stmt/s) | pgbench, same statement (stmt/s) | ratio | with test_before_acquire (stmt/s) |");
    println!("| --- | --- | --- | --- | --- | --- |");
    let table = unique("obbench");
    for clients in [1usize, 4, 16] {
        let db = connect(&pg_url(), clients as u32, false).await?;
        migrate(&db, &table).await?;
        let store = SeaOrmLeaseStore::new(db.clone()).with_table(&table)?;
        let ours = store_rate(&store, clients, d).await?;
        let pgbench = pgbench_rate(&store, clients, d)?;
        let pinged_db = connect(&pg_url(), clients as u32, true).await?;
        let pinged = store_rate(
            &SeaOrmLeaseStore::new(pinged_db).with_table(&table)?,
            clients,
            d,
        )
        .await?;
        println!(
            "| PostgreSQL 15 | {clients} | {ours:.0} | {pgbench:.0} | {:.2} | {pinged:.0} |",
            ours / pgbench
        );
        drop(&db, &table).await;
    }
    for (name, url) in [
        ("MariaDB 10.11", mysql_url()),
        (
            "SQLite (file, WAL)",
            format!(
                "sqlite://{}/target/orion-bench/bench.db",
                std::env::current_dir()?.display()
            ),
        ),
    ] {
        std::fs::create_dir_all("target/orion-bench")?;
        for clients in [1usize, 4, 16] {
            let db = connect(&url, clients as u32, false).await?;
            migrate(&db, &table).await?;
            let store = SeaOrmLeaseStore::new(db.clone()).with_table(&table)?;
            let ours = store_rate(&store, clients, d).await?;
            println!("| {name} | {clients} | {ours:.0} | - | - | - |");
            drop(&db, &table).await;
        }
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
    inner: SeaOrmLeaseStore,
    renews: Arc<AtomicU64>,
    calls: Arc<AtomicU64>,
}

#[async_trait]
impl LeaseStore for Counting {
    async fn acquire_or_renew(
        &self,
        r: &str,
        c: &str,
        lease: Duration,
    ) -> Result<LeaseOutcome, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let out = self.inner.acquire_or_renew(r, c, lease).await?;
        if matches!(out, LeaseOutcome::Renewed(_)) {
            self.renews.fetch_add(1, Ordering::Relaxed);
        }
        Ok(out)
    }
    async fn release(&self, r: &str, c: &str) -> Result<bool, StoreError> {
        self.inner.release(r, c).await
    }
    async fn release_lease(&self, lease: &orion_beacon::Lease) -> Result<bool, StoreError> {
        self.inner.release_lease(lease).await
    }
    async fn current(&self, r: &str) -> Result<Option<LeaseRecord>, StoreError> {
        self.inner.current(r).await
    }
}

fn cpu_time() -> Duration {
    use nix::sys::resource::{getrusage, UsageWho};
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let t = |tv: nix::sys::time::TimeVal| {
                Duration::new(tv.tv_sec() as u64, tv.tv_usec() as u32 * 1000)
            };
            t(u.user_time()) + t(u.system_time())
        }
        Err(_) => Duration::ZERO,
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
    let counting = Counting {
        inner: SeaOrmLeaseStore::new(db.clone()).with_table(&table)?,
        renews: Arc::default(),
        calls: Arc::default(),
    };
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
        cpu_time(),
        counting.renews.load(Ordering::Relaxed),
        Instant::now(),
    );
    tokio::time::sleep(d).await;
    let (cpu1, renews1, secs) = (
        cpu_time(),
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
/// of 16 would) and with one `renew_all` per round, side by side on the same leases.
async fn batch_backend(name: &str, url: &str) -> Result<(), Error> {
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
    // Lease by lease.
    let (cpu0, t0) = (cpu_time(), Instant::now());
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
    let (single_cpu, single_wall) = (cpu_time() - cpu0, t0.elapsed());
    // One statement per round.
    let (cpu0, t0) = (cpu_time(), Instant::now());
    for _ in 0..rounds {
        let out = store.renew_all(&held, lease).await?;
        if out.renewed.len() != leases {
            return Err(format!("the batch renewed {} of {leases}", out.renewed.len()).into());
        }
    }
    let (batch_cpu, batch_wall) = (cpu_time() - cpu0, t0.elapsed());
    let renewals = (leases * rounds) as f64;
    let per = |d: Duration| d.as_secs_f64() * 1e6 / renewals;
    println!(
        "\n## Batched renewal: {leases} leases, {rounds} rounds, {name}\n\n\
         | path | statements per round | wall time per round | client CPU per lease renewal |\n\
         | --- | --- | --- | --- |\n\
         | lease by lease (16 at a time) | {leases} | {:.0} ms | {:.1} µs |\n\
         | `renew_all` | 1 | {:.0} ms | {:.1} µs |\n\
         | ratio (lease by lease / batch) | {leases} | {:.1} | {:.1} |",
        single_wall.as_secs_f64() * 1e3 / rounds as f64,
        per(single_cpu),
        batch_wall.as_secs_f64() * 1e3 / rounds as f64,
        per(batch_cpu),
        single_wall.as_secs_f64() / batch_wall.as_secs_f64().max(1e-9),
        single_cpu.as_secs_f64() / batch_cpu.as_secs_f64().max(1e-9),
    );
    drop(&db, &table).await;
    Ok(())
}

async fn batch() -> Result<(), Error> {
    batch_backend("PostgreSQL", &pg_url()).await?;
    batch_backend("MariaDB", &mysql_url()).await
}

fn main() -> Result<(), Error> {
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
        Ok(())
    })
}
