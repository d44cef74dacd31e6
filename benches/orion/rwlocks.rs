//! Reader-writer locks next to PostgreSQL's advisory pair (`pg_advisory_lock_shared` for
//! readers, `pg_advisory_lock` for writers): read and write round trips per second, and how
//! long a writer waits for the lock under a steady stream of readers.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use orion_beacon::locks::{Locks, RwLock};
use orion_beacon::SeaOrmLeaseStore;
use sea_orm::DatabaseConnection;
use tokio::time::Instant;

use super::*;

/// Read slots of the benchmark's locks.
const SLOTS: u32 = 4;
/// Readers in the writer-wait measurement, each holding 20-40 ms and asking again at once.
const READERS: usize = 4;

fn rw(store: &SeaOrmLeaseStore, owner: &str, name: &str) -> Result<RwLock, Error> {
    Ok(Locks::builder(store.clone())
        .owner(owner)
        .lease_duration(Duration::from_secs(30))
        .renew_interval(Duration::from_secs(10))
        .build()?
        .rw_lock(name, SLOTS)?)
}

/// `clients` tasks, each taking and releasing a reader-writer lock of its own (`try_read` or
/// `try_write`, then `release`): round trips per second.
async fn rw_rate(
    store: &SeaOrmLeaseStore,
    clients: usize,
    write: bool,
    d: Duration,
) -> Result<f64, Error> {
    super::locks::round_trip_rate(clients, d, |c| {
        let lock = rw(store, "bench", &unique(&format!("rw-{c}")))?;
        Ok(move || {
            let lock = lock.clone();
            async move {
                if write {
                    match lock.try_write().await? {
                        Some(guard) => Ok(guard.release().await.map(|_| true)?),
                        None => Ok(false),
                    }
                } else {
                    match lock.try_read().await? {
                        Some(guard) => Ok(guard.release().await.map(|_| true)?),
                        None => Ok(false),
                    }
                }
            }
        })
    })
    .await
}

/// The same loop with PostgreSQL's advisory pair through sqlx on the app's pool.
async fn advisory_rate(
    db: &DatabaseConnection,
    clients: usize,
    write: bool,
    d: Duration,
) -> Result<f64, Error> {
    super::locks::advisory_pair_rate(db, clients, d, advisory_sql(write), 8_000).await
}

/// The advisory pair's lock and unlock statements for a writer or a reader.
fn advisory_sql(write: bool) -> (&'static str, &'static str) {
    if write {
        (
            "SELECT pg_advisory_lock($1)",
            "SELECT pg_advisory_unlock($1)",
        )
    } else {
        (
            "SELECT pg_advisory_lock_shared($1)",
            "SELECT pg_advisory_unlock_shared($1)",
        )
    }
}

/// What one side of the writer-wait measurement does: hold the lock as a reader or a writer
/// for `hold`, then let go.
#[async_trait::async_trait]
trait Side: Send + Sync + 'static {
    async fn hold(&self, write: bool, hold: Duration) -> Result<(), Error>;
}

struct Ours(RwLock);

#[async_trait::async_trait]
impl Side for Ours {
    async fn hold(&self, write: bool, hold: Duration) -> Result<(), Error> {
        let timeout = Duration::from_secs(30);
        if write {
            let guard = self.0.write(timeout).await?;
            tokio::time::sleep(hold).await;
            guard.release().await?;
        } else {
            let guard = self.0.read(timeout).await?;
            tokio::time::sleep(hold).await;
            guard.release().await?;
        }
        Ok(())
    }
}

struct Advisory(sea_orm::sqlx::PgPool, i64);

#[async_trait::async_trait]
impl Side for Advisory {
    async fn hold(&self, write: bool, hold: Duration) -> Result<(), Error> {
        let (lock, unlock) = advisory_sql(write);
        let mut conn = self.0.acquire().await?;
        sea_orm::sqlx::query(lock)
            .bind(self.1)
            .execute(&mut *conn)
            .await?;
        tokio::time::sleep(hold).await;
        sea_orm::sqlx::query(unlock)
            .bind(self.1)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
}

/// [`READERS`] readers holding 20-40 ms and asking again at once; a writer asks `writes` times,
/// 100 ms apart, holding 10 ms: each write's wait (ms), and the reads done meanwhile.
async fn writer_waits<S: Side>(
    readers: Vec<S>,
    writer: S,
    writes: usize,
) -> Result<(Vec<f64>, u64), Error> {
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for r in readers {
        let (stop, reads) = (stop.clone(), reads.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                r.hold(false, Duration::from_millis(20 + fastrand::u64(0..20)))
                    .await?;
                reads.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, Error>(())
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut waits = Vec::with_capacity(writes);
    for _ in 0..writes {
        let asked = Instant::now();
        writer.hold(true, Duration::from_millis(10)).await?;
        waits.push(asked.elapsed().as_secs_f64() * 1000.0 - 10.0);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await??;
    }
    Ok((waits, reads.load(Ordering::Relaxed)))
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

pub(crate) async fn rwlocks_bench() -> Result<(), Error> {
    let d = secs();
    let pg = pg_url();
    let db = connect(&pg, 12, false).await?;
    let table = unique("obrw");
    migrate(&db, &table).await?;
    let store = SeaOrmLeaseStore::new(db.clone()).with_table(&table)?;

    println!(
        "\n## Reader-writer locks: round trips per second (PostgreSQL, {SLOTS} read slots, {d:?} per cell)\n"
    );
    println!(
        "Each cell the median of {} turns (every cell of a row run in turn); a round trip is \
         `try_read` (or `try_write`) and `release` on a lock of the client's own, next to \
         `pg_advisory_lock_shared` (or `pg_advisory_lock`) and its unlock through sqlx on the \
         same pool. A write takes the gate and every read slot: {} rows.\n",
        repeats(),
        SLOTS + 1
    );
    println!("| clients | hold | orion-beacon | advisory pair | ratio |");
    println!("| --- | --- | --- | --- | --- |");
    for clients in [1usize, 4] {
        for write in [false, true] {
            let mut turns = Vec::new();
            for _ in 0..repeats() {
                let ours = rw_rate(&store, clients, write, d).await?;
                let advisory = advisory_rate(&db, clients, write, d).await?;
                turns.push([ours, advisory]);
            }
            let cell = |k: usize| median(turns.iter().map(|t| t[k]).collect());
            let ratio = median(turns.iter().map(|t| t[0] / t[1]).collect());
            println!(
                "| {clients} | {} | {:.0} | {:.0} | {ratio:.2} |",
                if write { "write" } else { "read" },
                cell(0),
                cell(1)
            );
        }
    }

    let writes = std::env::var("BENCH_RW_WRITES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    println!(
        "\n## Reader-writer locks: a writer's wait under a steady stream of readers ({READERS} readers holding 20-40 ms and asking again at once; {writes} writes per round, {} rounds)\n",
        repeats()
    );
    println!("| lock | round | writer wait p50 (ms) | p99 (ms) | max (ms) | reads meanwhile |");
    println!("| --- | --- | --- | --- | --- | --- |");
    for round in 1..=repeats() {
        let name = unique("rwwait");
        let readers = (0..READERS)
            .map(|i| rw(&store, &format!("reader-{i}"), &name).map(Ours))
            .collect::<Result<Vec<_>, _>>()?;
        let writer = Ours(rw(&store, "writer", &name)?);
        let (waits, reads) = writer_waits(readers, writer, writes).await?;
        print_waits("orion-beacon", round, waits, reads);
        let pool = db.get_postgres_connection_pool().clone();
        let key = 9_000 + round as i64;
        let readers = (0..READERS)
            .map(|_| Advisory(pool.clone(), key))
            .collect::<Vec<_>>();
        let (waits, reads) = writer_waits(readers, Advisory(pool.clone(), key), writes).await?;
        print_waits("advisory pair", round, waits, reads);
    }
    Ok(())
}

fn print_waits(lock: &str, round: usize, waits: Vec<f64>, reads: u64) {
    println!(
        "| {lock} | {round} | {:.1} | {:.1} | {:.1} | {reads} |",
        percentile(waits.clone(), 0.5),
        percentile(waits.clone(), 0.99),
        waits.iter().copied().fold(0.0, f64::max),
    );
}
