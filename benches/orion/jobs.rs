//! Scheduled jobs: how late each slot starts against its scheduled time, with one job, 100 and
//! 10,000 jobs in one scheduler, on PostgreSQL, MariaDB and SQLite.
//!
//! Every job runs every second (every 10 s with 10,000 jobs, all due at once); its closure
//! records `run.lateness()` (the database clock's now
//! at the look that claimed the slot, minus the slot, plus the time since that look), then
//! writes one row in the slot's fenced transaction and commits it with the slot's mark
//! (`begin`, one `INSERT`, `commit`). Counted: first attempts at the slots from the first whole
//! second after the scheduler leads, `BENCH_JOB_SLOTS` of them per job (default 18) with one job
//! and half as many with 100 jobs; the slot that was already due when the scheduler started
//! (run at once, as late as the start was after it) is not counted. Afterwards the written rows
//! are checked: one per counted slot, none twice.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use orion_beacon::jobs::{Job, JobRun, Jobs, Overlap, Schedule};
use orion_beacon::SeaOrmLeaseStore;
use sea_orm::sea_query::{Alias, Expr, ExprTrait, Query};
use sea_orm::{ConnectionTrait, DatabaseConnection};
use tokio::time::Instant;

use super::handover::{histogram, quantile_ms, wait_leader};
use super::*;

const INTERVAL: Duration = Duration::from_secs(1);

/// Statements the scheduler's pool sent (sqlx's statement log, `sqlx::query`, counted by a
/// tracing layer; the admin pool does not log).
static STATEMENTS: AtomicU64 = AtomicU64::new(0);

/// Counts sqlx's statement events; every other event is disabled.
struct CountStatements;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CountStatements {
    fn enabled(
        &self,
        metadata: &tracing::Metadata<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        metadata.target() == "sqlx::query"
    }

    fn on_event(&self, _: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        STATEMENTS.fetch_add(1, Ordering::Relaxed);
    }
}

/// Installs the counter as the process's subscriber: whether it could (another one set first
/// leaves the column empty).
fn count_statements() -> bool {
    use tracing_subscriber::layer::SubscriberExt;
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(CountStatements))
        .is_ok()
}

/// What the closures record.
struct Probe {
    /// The first counted slot (ms since the epoch); nothing is counted before it is set.
    from_ms: AtomicI64,
    /// Slots counted per job.
    slots: i64,
    /// The jobs' interval (ms).
    every_ms: i64,
    lateness_ms: Mutex<Vec<f64>>,
    /// Attempts after a first one (a failed or interrupted first attempt).
    retries: AtomicU64,
    /// Every attempt started, counted or not (what the statements are divided by).
    started: AtomicU64,
}

impl Probe {
    fn record(&self, run: &JobRun) {
        self.started.fetch_add(1, Ordering::Relaxed);
        if run.attempt() > 1 {
            self.retries.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let from = self.from_ms.load(Ordering::SeqCst);
        let slot = run.slot_millis();
        let until = from.saturating_add(self.slots * self.every_ms);
        if (from..until).contains(&slot) {
            self.samples().push(run.lateness().as_secs_f64() * 1e3);
        }
    }

    fn samples(&self) -> std::sync::MutexGuard<'_, Vec<f64>> {
        self.lateness_ms
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// A job that records its lateness, then inserts one row into `work` and commits it with the
/// slot's mark.
fn job(name: String, every: Duration, work: Arc<str>, probe: Arc<Probe>) -> Result<Job, Error> {
    Ok(Job::new(
        name,
        Schedule::every(every)?,
        move |run: JobRun| {
            let (work, probe) = (work.clone(), probe.clone());
            async move {
                probe.record(&run);
                let txn = run.begin().await?;
                let insert = Query::insert()
                    .into_table(Alias::new(&*work))
                    .columns([Alias::new("job"), Alias::new("slot")])
                    .values_panic([run.job().into(), run.slot_millis().into()])
                    .to_owned();
                txn.execute(&insert).await?;
                run.commit(txn).await?;
                Ok(())
            }
        },
    ))
}

fn epoch_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The tables of one run: a lease table, a run table (the real migrations) and the jobs' own
/// table.
struct Tables {
    lease: String,
    runs: String,
    work: String,
}

impl Tables {
    async fn create(db: &DatabaseConnection, tag: &str) -> Result<Self, Error> {
        use orion_beacon_migration::{CreateJobRunTable, MigrationTrait, SchemaManager};
        let t = Self {
            lease: unique(&format!("objobs{tag}")),
            runs: unique(&format!("objobruns{tag}")),
            work: unique(&format!("objobwork{tag}")),
        };
        t.drop(db).await;
        migrate(db, &t.lease).await?;
        CreateJobRunTable::with_table(&t.runs)?
            .up(&SchemaManager::new(db))
            .await?;
        orion_beacon_migration::AddJobRunKey::with_table(&t.runs)?
            .up(&SchemaManager::new(db))
            .await?;
        orion_beacon_migration::CreateJobAttemptTable::with_table(&t.runs)?
            .up(&SchemaManager::new(db))
            .await?;
        db.execute_unprepared(&format!(
            "CREATE TABLE {} (job VARCHAR(64) NOT NULL, slot BIGINT NOT NULL)",
            t.work
        ))
        .await?;
        Ok(t)
    }

    /// Drops the three (the run table's `down` keeps a table with finished runs: they go
    /// first).
    async fn drop(&self, db: &DatabaseConnection) {
        use orion_beacon_migration::{CreateJobRunTable, MigrationTrait, SchemaManager};
        let _ = db
            .execute_unprepared(&format!("DROP TABLE IF EXISTS {}", self.work))
            .await;
        if let Ok(m) = orion_beacon_migration::CreateJobAttemptTable::with_table(&self.runs) {
            let _ = m.down(&SchemaManager::new(db)).await;
        }
        if let Ok(m) = CreateJobRunTable::with_table(&self.runs) {
            let _ = db
                .execute(
                    &Query::delete()
                        .from_table(Alias::new(&self.runs))
                        .to_owned(),
                )
                .await;
            let _ = m.down(&SchemaManager::new(db)).await;
        }
        super::drop(db, &self.lease).await;
    }
}

/// What one run measured.
struct Outcome {
    lateness_ms: Vec<f64>,
    /// Slots counted (jobs × slots per job).
    expected: usize,
    retries: u64,
    /// Rows the jobs wrote for counted slots, and (job, slot) pairs written more than once.
    written: i64,
    twice: usize,
    /// Statements the scheduler's pool sent per run started (`None`: not counted).
    statements_per_slot: Option<f64>,
}

/// `jobs` jobs in one scheduler, every `every`, for `slots` slots each.
async fn lateness(
    url: &str,
    (jobs, every): (usize, Duration),
    slots: usize,
    pool: u32,
) -> Result<Outcome, Error> {
    let admin = connect(url, 2, false).await?;
    let tables = Tables::create(&admin, &jobs.to_string()).await?;
    // The scheduler's pool logs its statements (at debug, to the counter only).
    let mut options = if url.starts_with("sqlite:") {
        orion_beacon::backend::sqlite::connect_options(url)
    } else {
        sea_orm::ConnectOptions::new(url)
    };
    options
        .max_connections(pool)
        .min_connections(Ord::min(pool, 4))
        .test_before_acquire(false)
        .sqlx_logging(true)
        .sqlx_logging_level(log::LevelFilter::Debug);
    let store = SeaOrmLeaseStore::new(sea_orm::Database::connect(options).await?)
        .with_table(&tables.lease)?;
    let probe = Arc::new(Probe {
        from_ms: AtomicI64::new(i64::MAX),
        slots: slots as i64,
        every_ms: every.as_millis() as i64,
        lateness_ms: Mutex::new(Vec::with_capacity(jobs * slots)),
        retries: AtomicU64::new(0),
        started: AtomicU64::new(0),
    });
    let work: Arc<str> = tables.work.as_str().into();
    let mut builder = Jobs::builder(store)
        .candidate_id("bench")
        .runs_table(&tables.runs);
    for j in 0..jobs {
        builder = builder.job(job(
            format!("job-{j:05}"),
            every,
            work.clone(),
            probe.clone(),
        )?);
    }
    let handle = builder.build()?.start();
    wait_leader(handle.elector(), Duration::from_secs(10)).await?;
    // Counted from the first whole interval after the scheduler leads.
    let step = every.as_millis() as i64;
    let from = (epoch_ms() / step + 1) * step;
    probe.from_ms.store(from, Ordering::SeqCst);
    let expected = jobs * slots;
    let deadline = Instant::now() + every * (slots as u32) + Duration::from_secs(60);
    // Counted from 100 ms before the first counted slot to 200 ms after the last one's start
    // (the looks in between, the renews, each run's begin, insert and commit).
    let wait = u64::try_from(from - epoch_ms() - 100).unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(wait)).await;
    let sent_before = STATEMENTS.load(Ordering::Relaxed);
    let started_before = probe.started.load(Ordering::Relaxed);
    while probe.samples().len() < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let sent = STATEMENTS.load(Ordering::Relaxed) - sent_before;
    // Divided by the runs started meanwhile (a scheduler that fell behind starts runs of
    // slots after the counted ones too).
    let runs = probe.started.load(Ordering::Relaxed) - started_before;
    // The last slots' commits, then stop (running closures get the grace period).
    tokio::time::sleep(Duration::from_millis(300)).await;
    handle.shutdown().await;

    // Exactly once: one row per counted slot, none twice.
    let until = from + slots as i64 * step;
    let in_window = |q: &mut sea_orm::sea_query::SelectStatement| {
        q.from(Alias::new(&tables.work))
            .and_where(Expr::col(Alias::new("slot")).gte(from))
            .and_where(Expr::col(Alias::new("slot")).lt(until));
    };
    let mut count = Query::select();
    count.expr(Expr::cust("COUNT(*)"));
    in_window(&mut count);
    let written: i64 = admin
        .query_one(&count)
        .await?
        .ok_or("no count")?
        .try_get_by_index(0)?;
    let mut dup = Query::select();
    dup.column(Alias::new("job"))
        .column(Alias::new("slot"))
        .group_by_col(Alias::new("job"))
        .group_by_col(Alias::new("slot"))
        .and_having(Expr::cust("COUNT(*) > 1"));
    in_window(&mut dup);
    let twice = admin.query_all(&dup).await?.len();
    tables.drop(&admin).await;
    let lateness_ms = std::mem::take(&mut *probe.samples());
    Ok(Outcome {
        lateness_ms,
        expected,
        retries: probe.retries.load(Ordering::Relaxed),
        written,
        twice,
        statements_per_slot: (sent > 0 && runs > 0).then(|| sent as f64 / runs as f64),
    })
}

pub(crate) async fn jobs_bench() -> Result<(), Error> {
    let slots: usize = std::env::var("BENCH_JOB_SLOTS")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .map_or(18, |n| n.clamp(2, 3600));
    // The job counts (`BENCH_JOB_COUNTS`, comma-separated; default 1, 100 and 10000): up to
    // 100 jobs every second, more every 10 s (all due together), 3 slots each.
    let counts: Vec<usize> = std::env::var("BENCH_JOB_COUNTS")
        .ok()
        .map(|s| {
            s.split(',')
                .filter_map(|n| n.trim().parse::<usize>().ok())
                .map(|n| n.clamp(1, 20_000))
                .collect()
        })
        .unwrap_or_else(|| vec![1, 100, 10_000]);
    println!(
        "\n## Scheduled jobs: how late each slot starts (`JobRun::lateness`, by the database clock)\n"
    );
    println!("| backend | jobs | every | slots | p50 ms | p99 ms | max ms | statements per slot |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    if !count_statements() {
        println!("(statements not counted: another tracing subscriber is set)\n");
    }
    let dir = tempfile::tempdir()?;
    let sqlite = format!("sqlite://{}?mode=rwc", dir.path().join("jobs.db").display());
    let mut notes = Vec::new();
    for (name, url, pool) in [
        ("PostgreSQL", pg_url(), 10),
        ("MariaDB", mysql_url(), 10),
        ("SQLite", sqlite, 4),
    ] {
        for &jobs in &counts {
            let (every, slots) = match jobs {
                1 => (INTERVAL, slots),
                2..=100 => (INTERVAL, slots / 2),
                _ => (INTERVAL * 10, 3),
            };
            let o = lateness(&url, (jobs, every), slots, pool).await?;
            let h = histogram(&o.lateness_ms)?;
            println!(
                "| {name} | {jobs} | {every:?} | {} | {:.1} | {:.1} | {:.1} | {} |",
                o.lateness_ms.len(),
                quantile_ms(&h, 0.5),
                quantile_ms(&h, 0.99),
                quantile_ms(&h, 1.0),
                o.statements_per_slot
                    .map_or("-".to_owned(), |n| format!("{n:.2}"))
            );
            if o.lateness_ms.len() != o.expected
                || o.written != o.expected as i64
                || o.twice > 0
                || o.retries > 0
            {
                notes.push(format!(
                    "{name}, {jobs} job(s): {} of {} slots counted, {} rows written, {} slots \
                     written twice, {} retried attempts",
                    o.lateness_ms.len(),
                    o.expected,
                    o.written,
                    o.twice,
                    o.retries
                ));
            }
        }
    }
    if notes.is_empty() {
        println!("\nEvery counted slot ran once and wrote its row once; no attempt was retried.");
    } else {
        println!();
        for note in notes {
            println!("note: {note}");
        }
    }
    Ok(())
}

/// Runs over node processes: `BENCH_SPREAD_KEYS` keys (default 1,000) of a keyed job whose
/// runs may go side by side, each run `BENCH_SPREAD_WORK_MS` (default 20) of work outside the
/// database (a call to another service, say) and then its fenced write and commit, submitted at once from the first node;
/// run by the leader alone (`max_running` 8), and spread (`spread_runs(8)` on every node,
/// `max_running` 8 per node) over 1, 3 and 5 nodes, each a scheduler with a pool of its own on
/// one host. Runs per second from the first submit to the last commit, and the busiest node's
/// share of them.
pub(crate) async fn spread_bench() -> Result<(), Error> {
    let keys: usize = std::env::var("BENCH_SPREAD_KEYS")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .map_or(1_000, |n| n.clamp(10, 100_000));
    let work_ms: u64 = std::env::var("BENCH_SPREAD_WORK_MS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(20, |n| n.clamp(0, 60_000));
    println!(
        "\n## Scheduled jobs: runs spread over nodes ({keys} keys, {work_ms} ms of work each)\n"
    );
    println!("| backend | runs on | per node at once | runs/s | against the leader alone | busiest node's share | every key once |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    let dir = tempfile::tempdir()?;
    let sqlite = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("spread.db").display()
    );
    for (name, url) in [
        ("PostgreSQL", pg_url()),
        ("MariaDB", mysql_url()),
        ("SQLite", sqlite),
    ] {
        let mut alone = None;
        for nodes in [0usize, 1, 3, 5] {
            let o = spread_run(&url, nodes, keys, work_ms).await?;
            let rate = o.runs as f64 / o.elapsed.as_secs_f64();
            let base = *alone.get_or_insert(rate);
            println!(
                "| {name} | {} | 8 | {rate:.0} | {:.2} | {:.2} | {} |",
                if nodes == 0 {
                    "the leader alone".to_owned()
                } else {
                    format!("{nodes} node(s)")
                },
                rate / base,
                o.busiest as f64 / o.runs.max(1) as f64,
                if o.once { "yes" } else { "NO" },
            );
        }
    }
    Ok(())
}

/// What one spread run measured.
struct Spread {
    runs: usize,
    busiest: usize,
    elapsed: Duration,
    once: bool,
}

/// `keys` keys over `nodes` spreading schedulers (0: one scheduler whose leader runs them).
async fn spread_run(url: &str, nodes: usize, keys: usize, work_ms: u64) -> Result<Spread, Error> {
    const PER_NODE: usize = 8;
    let admin = connect(url, 2, false).await?;
    let tables = Tables::create(&admin, &format!("s{nodes}")).await?;
    let work: Arc<str> = tables.work.as_str().into();
    let done: Arc<Mutex<std::collections::BTreeMap<String, usize>>> = Arc::default();
    let resource = unique("spread");
    let mut handles = Vec::new();
    for n in 0..nodes.max(1) {
        let db = connect(url, 6, false).await?;
        let store = SeaOrmLeaseStore::new(db).with_table(&tables.lease)?;
        let (work, done, me) = (work.clone(), done.clone(), format!("n{n}"));
        let job = Job::keyed("work", move |run: JobRun| {
            let (work, done, me) = (work.clone(), done.clone(), me.clone());
            async move {
                tokio::time::sleep(Duration::from_millis(work_ms)).await;
                let txn = run.begin().await?;
                let insert = Query::insert()
                    .into_table(Alias::new(&*work))
                    .columns([Alias::new("job"), Alias::new("slot")])
                    .values_panic([run.job().into(), run.slot_millis().into()])
                    .to_owned();
                txn.execute(&insert).await?;
                run.commit(txn).await?;
                *done
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entry(me)
                    .or_default() += 1;
                Ok(())
            }
        })
        .overlap(Overlap::Allow)
        .max_running(PER_NODE * nodes.max(1));
        let mut builder = Jobs::builder(store)
            .candidate_id(format!("n{n}"))
            .resource(&resource)
            .runs_table(&tables.runs)
            .poll_interval(Duration::from_millis(200))
            .job(job);
        if nodes > 0 {
            builder = builder.spread_runs(PER_NODE);
        }
        handles.push(builder.build()?.start());
        if n == 0 {
            wait_leader(handles[0].elector(), Duration::from_secs(10)).await?;
        }
    }
    let started = Instant::now();
    for k in 0..keys {
        handles[0].submit("work", &format!("key-{k}")).await?;
    }
    let deadline = started + Duration::from_secs(600);
    let total = || -> usize {
        done.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .sum()
    };
    while total() < keys && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = started.elapsed();
    for h in &handles {
        h.shutdown().await;
    }
    let runs = total();
    let busiest = done
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .values()
        .copied()
        .max()
        .unwrap_or(0);
    let mut count = Query::select();
    count
        .expr(Expr::cust("COUNT(DISTINCT slot)"))
        .expr(Expr::cust("COUNT(*)"))
        .from(Alias::new(&tables.work));
    let row = admin.query_one(&count).await?.ok_or("no count")?;
    let (distinct, rows): (i64, i64) = (row.try_get_by_index(0)?, row.try_get_by_index(1)?);
    tables.drop(&admin).await;
    Ok(Spread {
        runs,
        busiest,
        elapsed,
        once: runs == keys && distinct == keys as i64 && rows == keys as i64,
    })
}
