//! Rate limits: decisions per second next to pgbench running the very same statement, and
//! whether a key shared by every client stays within its quota at full speed.

use std::path::PathBuf;
use std::time::Duration;

use orion_beacon::rate_limit::{Quota, RateLimiter, RateOutcome, MAX_PERMITS};
use orion_beacon::SeaOrmLeaseStore;
use tokio::time::Instant;

use super::throughput::{pgbench_script_rate, pgbench_sql};
use super::*;

/// A quota no benchmark client reaches (a million permits a millisecond, as many at once):
/// every decision is a grant, so both sides run the same statement to the same effect.
fn unlimited() -> Result<Quota, Error> {
    Ok(Quota::per(Duration::from_millis(1), MAX_PERMITS)?.with_burst(MAX_PERMITS)?)
}

/// The rate-limit table next to the benchmark's lease table `table`.
fn rate_table(table: &str) -> String {
    format!("{table}_r")
}

/// `clients` clients with pgbench's threading (`-j min(clients, 2)`, a current-thread runtime
/// and a store per thread), each calling `try_acquire` on `key(client)` in a loop: decisions
/// per second, and the permits granted.
fn limiter_rate_threaded(
    url: &str,
    table: &str,
    clients: usize,
    d: Duration,
    quota: Quota,
    key: fn(usize) -> String,
) -> Result<f64, Error> {
    let (url, table) = (url.to_owned(), table.to_owned());
    let (calls, start) = on_threads(clients, Instant::now, move |mine, go| {
        let (url, table) = (url.clone(), table.clone());
        async move {
            let db = connect(&url, mine.len() as u32, false).await;
            go.wait();
            let store = SeaOrmLeaseStore::new(db?)
                .with_table(&table)?
                .with_rate_limit_table(rate_table(&table))?
                .with_lease_connections(mine.len())?;
            let limiter = RateLimiter::new(store, quota);
            let stop = Instant::now() + d;
            let tasks: Vec<_> = mine
                .into_iter()
                .map(|c| {
                    let (limiter, key) = (limiter.clone(), key(c));
                    tokio::spawn(async move {
                        let mut n = 0u64;
                        while Instant::now() < stop {
                            limiter.try_acquire(&key).await?;
                            n += 1;
                        }
                        Ok::<_, Error>(n)
                    })
                })
                .collect();
            calls_of(tasks).await
        }
    })?;
    let rate = calls as f64 / start.elapsed().as_secs_f64();
    mark_cell(&format!("rate limiter, {clients} clients"), start);
    Ok(rate)
}

/// pgbench running the decision's statement, prepared, a key per client.
fn pgbench_limiter_rate(
    url: &str,
    store: &SeaOrmLeaseStore,
    clients: usize,
    d: Duration,
) -> Result<f64, Error> {
    let mut stmts = store.rate_limit_statements("RESOURCE", &unlimited()?)?;
    let stmt = stmts.pop().ok_or("no statement")?;
    let text = format!("{};\n", pgbench_sql(stmt)?);
    let script = PathBuf::from("target/orion-bench").join("rate.sql");
    Ok(pgbench_script_rate(url, &script, &text, clients, d, None)?.per_s)
}

/// One key shared by `clients` clients at full speed under `quota`: the permits granted per
/// second of the run, against what the quota allows.
async fn shared_key(
    store: &SeaOrmLeaseStore,
    clients: usize,
    d: Duration,
    quota: Quota,
) -> Result<(u64, f64), Error> {
    let limiter = RateLimiter::new(store.clone(), quota);
    let key = unique("bench-shared");
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (limiter, key) = (limiter.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            let mut granted = 0u64;
            while start.elapsed() < d {
                match limiter.try_acquire(&key).await? {
                    RateOutcome::Granted(_) => granted += 1,
                    RateOutcome::Limited(l) => tokio::time::sleep(l.retry_after).await,
                    _ => {}
                }
            }
            Ok::<_, Error>(granted)
        }));
    }
    let granted = calls_of(tasks).await?;
    let seconds = start.elapsed().as_secs_f64();
    let allowed = f64::from(quota.burst()) + seconds / quota.emission_interval().as_secs_f64();
    Ok((granted, allowed))
}

pub(crate) async fn rates_bench() -> Result<(), Error> {
    let d = secs();
    let pg = pg_url();
    let db = connect(&pg, 8, false).await?;
    let table = unique("obrates");
    migrate(&db, &table).await?;
    {
        use orion_beacon_migration::{CreateRateLimitTable, MigrationTrait, SchemaManager};
        let m = CreateRateLimitTable::with_table(rate_table(&table))?;
        let _ = m.down(&SchemaManager::new(&db)).await;
        m.up(&SchemaManager::new(&db)).await?;
    }
    let store = SeaOrmLeaseStore::new(db.clone())
        .with_table(&table)?
        .with_rate_limit_table(rate_table(&table))?;

    println!("\n## Rate limits: decisions per second (PostgreSQL, {d:?} per cell)\n");
    println!(
        "Each cell the median of {} turns; ratios: the median of each turn's own ratio. A key \
         per client, under a quota no client reaches (every decision a grant). pgbench runs \
         the decision's statement, prepared; the limiter runs with pgbench's threading (`-j \
         min(clients, 2)`, a current-thread runtime and a store per thread).\n",
        repeats()
    );
    println!("| clients | pgbench, the statement | `try_acquire` | ratio |");
    println!("| --- | --- | --- | --- |");
    let quota = unlimited()?;
    for clients in client_counts() {
        let mut turns = Vec::new();
        for _ in 0..repeats() {
            let bench = pgbench_limiter_rate(&pg, &store, clients, d)?;
            let (pg2, table2) = (pg.clone(), table.clone());
            let ours = tokio::task::spawn_blocking(move || {
                limiter_rate_threaded(&pg2, &table2, clients, d, quota, |c| format!("bench-{c}"))
            })
            .await??;
            turns.push([bench, ours]);
        }
        let cell = |k: usize| median(turns.iter().map(|t| t[k]).collect());
        let ratio = median(turns.iter().map(|t| t[1] / t[0]).collect());
        println!(
            "| {clients} | {:.0} | {:.0} | {ratio:.2} |",
            cell(0),
            cell(1)
        );
    }

    println!("\n## Rate limits: one key, every client at full speed\n");
    println!("| clients | quota | permits granted | what the quota allows | share |");
    println!("| --- | --- | --- | --- | --- |");
    let quota = Quota::per(Duration::from_secs(1), 1_000)?.with_burst(100)?;
    for clients in client_counts() {
        let (granted, allowed) = shared_key(&store, clients, d, quota).await?;
        println!(
            "| {clients} | 1,000 a second, 100 at once | {granted} | {allowed:.0} | {:.3} |",
            granted as f64 / allowed
        );
    }
    super::drop(&db, &table).await;
    Ok(())
}
