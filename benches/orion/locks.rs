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
    round_trip_rate(clients, d, |c| {
        let lock = locks.lock(format!("bench-lock-{c}"))?;
        Ok(move || {
            let lock = lock.clone();
            async move {
                // Free but not granted (a grant that answered too late to trust): ask again.
                match lock.try_acquire().await? {
                    Some(guard) => Ok(guard.release().await.map(|_| true)?),
                    None => Ok(false),
                }
            }
        })
    })
    .await
}

/// `clients` tasks, client `c` running the round trips `each(c)` makes for `d`: the round trips
/// per second that counted (each answers whether it did).
pub(super) async fn round_trip_rate<F, Fut>(
    clients: usize,
    d: Duration,
    each: impl Fn(usize) -> Result<F, Error>,
) -> Result<f64, Error>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<bool, Error>> + Send,
{
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (mut round_trip, done) = (each(c)?, done.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            while start.elapsed() < d {
                if round_trip().await? {
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

/// [`lock_rate`] with pgbench's threading (`-j min(clients, 2)`): each of `threads` OS threads
/// runs a current-thread runtime with a store of its own (sessions as many as its clients) and
/// its own clients, so no answer wakes a task on another thread. With `plain`, the clients send
/// the store's two statements on plain sqlx connections instead (no pool, no SeaORM, no store):
/// what the Rust client stack alone costs for one round trip.
fn lock_rate_threaded(
    url: &str,
    table: &str,
    clients: usize,
    d: Duration,
    plain: bool,
) -> Result<f64, Error> {
    let (url, table) = (url.to_owned(), table.to_owned());
    let (rounds, start) = on_threads(clients, Instant::now, move |mine, go| {
        let (url, table) = (url.clone(), table.clone());
        async move {
            let db = connect(&url, mine.len() as u32, false).await;
            let mut conns = if plain {
                plain_connections(&url, mine.len()).await
            } else {
                Vec::new()
            };
            go.wait(); // even on error, so the others are not left waiting
            let store = SeaOrmLeaseStore::new(db?)
                .with_table(&table)?
                .with_lease_connections(mine.len())?;
            let locks = locks(store.clone(), "bench")?;
            let stop = Instant::now() + d;
            let tasks: Vec<_> = mine
                .into_iter()
                .map(|c| {
                    let name = format!("bench-lock-{c}");
                    let conn = conns.pop();
                    let (store, lock) = (store.clone(), locks.lock(&name));
                    tokio::spawn(async move {
                        if let Some(conn) = conn {
                            let both = [
                                store.acquire_statement(&name, "bench", LEASE)?,
                                store.release_statement(&name, "bench")?,
                            ];
                            return plain_client(conn?, &both, stop, false).await;
                        }
                        let mut n = 0u64;
                        let lock = lock?;
                        while Instant::now() < stop {
                            if let Some(guard) = lock.try_acquire().await? {
                                guard.release().await?;
                                n += 1;
                            }
                        }
                        Ok::<_, Error>(n)
                    })
                })
                .collect();
            calls_of(tasks).await
        }
    })?;
    let rate = rounds as f64 / start.elapsed().as_secs_f64();
    let what = if plain {
        "sqlx alone"
    } else {
        "a runtime per thread"
    };
    mark_cell(&format!("locks, {what}, {clients} clients"), start);
    Ok(rate)
}

/// The same loop with PostgreSQL advisory locks through sqlx on the app's pool: a connection
/// taken from the pool, `pg_advisory_lock(key)`, `pg_advisory_unlock(key)`, back to the pool.
async fn advisory_rate(db: &DatabaseConnection, clients: usize, d: Duration) -> Result<f64, Error> {
    advisory_pair_rate(
        db,
        clients,
        d,
        (
            "SELECT pg_advisory_lock($1)",
            "SELECT pg_advisory_unlock($1)",
        ),
        7_000,
    )
    .await
}

/// `clients` tasks, each locking and unlocking an advisory key of its own (`key_base + c`)
/// with the statements `(lock, unlock)`: round trips per second.
pub(super) async fn advisory_pair_rate(
    db: &DatabaseConnection,
    clients: usize,
    d: Duration,
    (lock, unlock): (&'static str, &'static str),
    key_base: i64,
) -> Result<f64, Error> {
    let pool = db.get_postgres_connection_pool().clone();
    round_trip_rate(clients, d, |c| {
        let (pool, key) = (pool.clone(), key_base + c as i64);
        Ok(move || {
            let pool = pool.clone();
            async move {
                let mut conn = pool.acquire().await?;
                sea_orm::sqlx::query(lock)
                    .bind(key)
                    .execute(&mut *conn)
                    .await?;
                sea_orm::sqlx::query(unlock)
                    .bind(key)
                    .execute(&mut *conn)
                    .await?;
                Ok(true)
            }
        })
    })
    .await
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
    println!(
        "Each cell the median of {} turns (every cell of a row run in turn); ratios: the median \
         of each turn's own ratio. One runtime: the clients' tasks on one 2-worker runtime. A \
         runtime per thread: pgbench's threading (`-j min(clients, 2)`, a current-thread \
         runtime and a store per thread). sqlx alone: the store's two statements on a plain \
         sqlx `PgConnection` per client, pgbench's threading.\n",
        repeats()
    );
    println!("| clients | pgbench, the two statements | `try_acquire` + `release`, one runtime | ratio | a runtime per thread | ratio | sqlx alone, the two statements | ratio | a runtime per thread / sqlx alone | advisory lock + unlock (sqlx, same pool) | one runtime / advisory |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for clients in [1usize, 4] {
        let mut turns = Vec::new();
        for _ in 0..repeats() {
            let bench = pgbench_lock_rate(&pg, &store, clients, d)?;
            let ours = lock_rate(&store, clients, d).await?;
            let threaded = |plain: bool| {
                let (pg, table) = (pg.clone(), table.clone());
                tokio::task::spawn_blocking(move || {
                    lock_rate_threaded(&pg, &table, clients, d, plain)
                })
            };
            let per_thread = threaded(false).await??;
            let plain = threaded(true).await??;
            let advisory = advisory_rate(&db, clients, d).await?;
            turns.push([bench, ours, per_thread, plain, advisory]);
        }
        let cell = |k: usize| median(turns.iter().map(|t| t[k]).collect());
        let ratio = |k: usize, of: usize| median(turns.iter().map(|t| t[k] / t[of]).collect());
        println!(
            "| {clients} | {:.0} | {:.0} | {:.2} | {:.0} | {:.2} | {:.0} | {:.2} | {:.2} | {:.0} | {:.2} |",
            cell(0),
            cell(1),
            ratio(1, 0),
            cell(2),
            ratio(2, 0),
            cell(3),
            ratio(3, 0),
            ratio(2, 3),
            cell(4),
            ratio(1, 4),
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
