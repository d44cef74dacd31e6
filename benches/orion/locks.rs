//! Locks: acquire + release round trips per second next to pgbench running the same two
//! statements and next to PostgreSQL advisory locks, and the time from a release to the next
//! waiter's grant on every server backend and SQLite, next to an advisory lock's waiter.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use orion_beacon::locks::Locks;
use orion_beacon::SeaOrmLeaseStore;
use sea_orm::DatabaseConnection;
use tokio::time::Instant;

use super::handover::ROUNDS;
use super::throughput::{pgbench_script_rate, pgbench_sql};
use super::*;

/// The locks' options in this benchmark: a lease long enough that no renew runs during a
/// measurement, a waiter's retry interval at its default.
const LEASE: Duration = Duration::from_secs(30);

fn locks(store: SeaOrmLeaseStore, owner: &str) -> Result<Locks, Error> {
    Ok(Locks::builder(store)
        .owner(owner)
        .lease_duration(LEASE)
        .renew_interval(Duration::from_secs(10))
        .build()?)
}

/// `clients` tasks, each taking and releasing a lock of its own in a loop (`try_acquire`, then
/// `release`): round trips per second (one round trip: both calls).
async fn lock_rate(store: &SeaOrmLeaseStore, clients: usize, d: Duration) -> Result<f64, Error> {
    let locks = locks(store.clone(), "bench")?;
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (lock, done) = (locks.lock(format!("bench-lock-{c}"))?, done.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            while start.elapsed() < d {
                // Free but not granted (a grant that answered too late to trust): ask again.
                if let Some(guard) = lock.try_acquire().await? {
                    guard.release().await?;
                    n += 1;
                }
            }
            done.fetch_add(n, Ordering::Relaxed);
            Ok::<_, Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}

/// The same loop with PostgreSQL advisory locks through sqlx on the app's pool: a connection
/// taken from the pool, `pg_advisory_lock(key)`, `pg_advisory_unlock(key)`, back to the pool.
async fn advisory_rate(db: &DatabaseConnection, clients: usize, d: Duration) -> Result<f64, Error> {
    let pool = db.get_postgres_connection_pool().clone();
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (pool, done) = (pool.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let key = 7_000 + c as i64;
            let mut n = 0;
            while start.elapsed() < d {
                let mut conn = pool.acquire().await?;
                sea_orm::sqlx::query("SELECT pg_advisory_lock($1)")
                    .bind(key)
                    .execute(&mut *conn)
                    .await?;
                sea_orm::sqlx::query("SELECT pg_advisory_unlock($1)")
                    .bind(key)
                    .execute(&mut *conn)
                    .await?;
                n += 1;
            }
            done.fetch_add(n, Ordering::Relaxed);
            Ok::<_, Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}

/// `n` releases of a held lock, each with a waiter already in `acquire` (denied once): the
/// time from the release's call to the waiter's grant (ms). The release comes at a random
/// moment of the waiter's retry interval. Holder and waiter are two processes' worth of
/// `Locks`, each on a pool of its own; a first round (the waiter's notification listener
/// connecting) is not counted.
async fn release_to_grant(url: &str, table: &str, n: usize) -> Result<Vec<f64>, Error> {
    let store = |db| SeaOrmLeaseStore::new(db).with_table(table);
    let a = locks(store(connect(url, 2, false).await?)?, "holder")?;
    let b = locks(store(connect(url, 2, false).await?)?, "waiter")?;
    let retry = orion_beacon::locks::DEFAULT_LOCK_RETRY_INTERVAL.as_millis() as u64;
    let mut times = Vec::with_capacity(n);
    for i in 0..=n {
        let name = format!("handover-{i}");
        let held = a.lock(&name)?.try_acquire().await?.ok_or("not free")?;
        let lock = b.lock(&name)?;
        let waiter = tokio::spawn(async move {
            let guard = lock.acquire(Duration::from_secs(10)).await?;
            Ok::<_, Error>((Instant::now(), guard))
        });
        // The waiter has asked, been denied, and waits (for a notification, or its next retry).
        tokio::time::sleep(Duration::from_millis(30 + fastrand::u64(0..retry))).await;
        let released = Instant::now();
        held.release().await?;
        let (granted, guard) = waiter.await??;
        if i > 0 {
            times.push(granted.saturating_duration_since(released).as_secs_f64() * 1e3);
        }
        guard.release().await?;
    }
    Ok(times)
}

/// The same with an advisory lock: the waiter blocks in `pg_advisory_lock` on a connection of
/// its own; the time from the holder's `pg_advisory_unlock` call to the waiter's answer (ms).
async fn advisory_release_to_grant(db: &DatabaseConnection, n: usize) -> Result<Vec<f64>, Error> {
    let pool = db.get_postgres_connection_pool().clone();
    let mut times = Vec::with_capacity(n);
    for i in 0..=n {
        let key = 9_000 + i as i64;
        let mut holder = pool.acquire().await?;
        sea_orm::sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(key)
            .execute(&mut *holder)
            .await?;
        let waiter_pool = pool.clone();
        let waiter = tokio::spawn(async move {
            let mut conn = waiter_pool.acquire().await?;
            sea_orm::sqlx::query("SELECT pg_advisory_lock($1)")
                .bind(key)
                .execute(&mut *conn)
                .await?;
            let granted = Instant::now();
            sea_orm::sqlx::query("SELECT pg_advisory_unlock($1)")
                .bind(key)
                .execute(&mut *conn)
                .await?;
            Ok::<_, Error>(granted)
        });
        tokio::time::sleep(Duration::from_millis(30 + fastrand::u64(0..40))).await;
        let released = Instant::now();
        sea_orm::sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(key)
            .execute(&mut *holder)
            .await?;
        let granted = waiter.await??;
        if i > 0 {
            times.push(granted.saturating_duration_since(released).as_secs_f64() * 1e3);
        }
    }
    Ok(times)
}

/// pgbench running what one lock round trip sends: the store's acquire statement and its
/// release statement (one lock per client), prepared.
fn pgbench_lock_rate(
    url: &str,
    store: &SeaOrmLeaseStore,
    clients: usize,
    d: Duration,
) -> Result<f64, Error> {
    let acquire = store.acquire_statement("RESOURCE", "bench", LEASE)?;
    let release = store.release_statement("RESOURCE", "bench")?;
    let text = format!("{};\n{};\n", pgbench_sql(acquire)?, pgbench_sql(release)?);
    let script = PathBuf::from("target/orion-bench").join("lock.sql");
    Ok(pgbench_script_rate(url, &script, &text, clients, d, None)?.per_s)
}

/// One row: the releases of every round, then `super::handover::round_cells`.
async fn row<F, Fut>(name: &str, n: usize, mut round: F) -> Result<String, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Vec<f64>, Error>>,
{
    let mut rounds = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        rounds.push(round().await?);
    }
    Ok(format!(
        "| {name} | {ROUNDS} x {n} | {} |",
        super::handover::round_cells(&rounds)?
    ))
}

pub(crate) async fn locks_bench() -> Result<(), Error> {
    let d = secs();
    let pg = pg_url();
    let db = connect(&pg, 8, false).await?;
    let table = unique("oblocks");
    migrate(&db, &table).await?;
    let store = SeaOrmLeaseStore::new(db.clone()).with_table(&table)?;

    println!("\n## Locks: acquire + release round trips per second (PostgreSQL, {d:?} per cell)\n");
    println!("| clients | pgbench, the two statements | orion-beacon `try_acquire` + `release` | ratio | advisory lock + unlock (sqlx, same pool) | ratio to advisory |");
    println!("| --- | --- | --- | --- | --- | --- |");
    for clients in [1usize, 4] {
        let bench = pgbench_lock_rate(&pg, &store, clients, d)?;
        let ours = lock_rate(&store, clients, d).await?;
        let advisory = advisory_rate(&db, clients, d).await?;
        println!(
            "| {clients} | {bench:.0} | {ours:.0} | {:.2} | {advisory:.0} | {:.2} |",
            ours / bench,
            ours / advisory
        );
    }

    let n = std::env::var("BENCH_LOCK_RELEASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    println!("\n## Locks: from a release to the next waiter's grant ({ROUNDS} rounds of {n} releases; goal p99 < 20 ms)\n");
    println!(
        "| backend | releases | p50 (ms) | p99 per round (ms) | spread of p99 (ms) | max (ms) |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    let rows = [
        row("PostgreSQL (release notification)", n, || {
            release_to_grant(&pg, &table, n)
        })
        .await?,
        row("PostgreSQL advisory lock (a blocked waiter)", n, || {
            advisory_release_to_grant(&db, n)
        })
        .await?,
    ];
    for r in rows {
        println!("{r}");
    }
    let mysql = mysql_url();
    let admin = connect(&mysql, 2, false).await?;
    migrate(&admin, &table).await?;
    println!(
        "{}",
        row("MariaDB (the holder's named lock)", n, || {
            release_to_grant(&mysql, &table, n)
        })
        .await?
    );
    super::drop(&admin, &table).await;
    let dir = tempfile::tempdir()?;
    let sqlite = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("locks.db").display()
    );
    let admin = connect(&sqlite, 2, false).await?;
    migrate(&admin, &table).await?;
    println!(
        "{}",
        row("SQLite (the file's change events)", n, || {
            release_to_grant(&sqlite, &table, n)
        })
        .await?
    );
    super::drop(&db, &table).await;
    Ok(())
}
