//! Memory of scheduled jobs: the heap a scheduler keeps per job, and per run held at once.
//!
//! ```sh
//! cargo bench --all-features --bench memory
//! ```
//!
//! Counted by the allocator (every allocation and free of the process, through
//! `stats_alloc`), not by resident memory, which an allocator keeps after a free and reuses:
//! the live heap's growth over a step. On SQLite (a temporary file): what a job and a run
//! cost in the scheduler does not depend on the backend.
//!
//! - **Per job**: a scheduler with 100 jobs and one with `BENCH_MEMORY_JOBS` (default 10,000),
//!   each after a few looks at its run table with no slot due (a yearly schedule); the
//!   difference over the difference in jobs, so the scheduler's own fixed cost (its elector,
//!   pool connections, buffers) drops out.
//! - **Per held run**: `BENCH_HELD_RUNS` (default 1,000) keys of one keyed job claimed and
//!   running at once, each closure waiting; the growth from before the keys were submitted to
//!   when all of them run, over the runs (a `JobRun`, its task, the closure's future and the
//!   scheduler's bookkeeping of the attempt).
//!
//! It runs in its own process (a bench target of its own) so that no other benchmark pays for
//! the counting allocator.

use std::alloc::System;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use orion_beacon::jobs::{Job, Jobs, JobsHandle, Overlap, Schedule};
use orion_beacon::SeaOrmLeaseStore;
use orion_beacon_migration::{Migrator, MigratorTrait};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tokio::sync::Semaphore;
use tokio::time::Instant;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The live heap's growth since `region` began, in bytes.
fn grown(region: &Region<'_, System>) -> i64 {
    let change = region.change();
    change.bytes_allocated as i64 - change.bytes_deallocated as i64
}

fn env(name: &str, default: usize, bounds: (usize, usize)) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .map_or(default, |n| n.clamp(bounds.0, bounds.1))
}

async fn store(dir: &std::path::Path, name: &str) -> Result<SeaOrmLeaseStore, Error> {
    let url = format!("sqlite://{}?mode=rwc", dir.join(name).display());
    let options = orion_beacon::backend::sqlite::connect_options(url);
    let db = sea_orm::Database::connect(options).await?;
    Migrator::up(&db, None).await?;
    Ok(SeaOrmLeaseStore::new(db))
}

async fn leading(handle: &JobsHandle) -> Result<(), Error> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !handle.elector().is_leader() {
        if Instant::now() > deadline {
            return Err("the scheduler did not lead within 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// How the jobs of a measured scheduler get their schedules.
#[derive(Clone, Copy)]
enum Schedules {
    /// One schedule, cloned for every job.
    Cloned,
    /// The same cron expression, parsed for each job.
    ParsedAlike,
    /// A cron expression of its own for each job (a minute, hour and day of its own).
    Distinct,
}

impl Schedules {
    fn describe(self) -> &'static str {
        match self {
            Schedules::Cloned => "one cron schedule cloned for every job",
            Schedules::ParsedAlike => "the same cron expression parsed for each job",
            Schedules::Distinct => "a cron expression of its own for each job",
        }
    }
}

/// The live heap a scheduler of `jobs` jobs holds once built (its jobs, schedules and
/// policies), and after a few looks, in bytes.
async fn scheduler(
    dir: &std::path::Path,
    jobs: usize,
    schedules: Schedules,
) -> Result<(i64, i64), Error> {
    use chrono::Datelike;
    let store = store(dir, &format!("jobs{jobs}-{}.db", schedules as u8)).await?;
    // Never due while measured: a day of the month six months from now.
    let month = (chrono::Utc::now().month() + 5) % 12 + 1;
    let cron = |j: usize| {
        let (minute, hour, day) = match schedules {
            Schedules::Distinct => (j % 60, (j / 60) % 24, 1 + (j / 1440) % 28),
            _ => (0, 0, 1),
        };
        Schedule::cron(&format!("{minute} {hour} {day} {month} *"), "UTC")
    };
    let shared = cron(0)?;
    let region = Region::new(GLOBAL);
    let mut builder = Jobs::builder(store)
        .candidate_id("memory")
        .poll_interval(Duration::from_millis(200));
    for j in 0..jobs {
        builder = builder.job(Job::new(
            format!("job-{j:05}"),
            match schedules {
                Schedules::Cloned => shared.clone(),
                _ => cron(j)?,
            },
            |_run| async { Ok(()) },
        ));
    }
    let built = builder.build()?;
    let at_build = grown(&region);
    let handle = built.start();
    leading(&handle).await?;
    // A few looks: the per-job state of a scheduler at work, not only of its build.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let bytes = grown(&region);
    handle.shutdown().await;
    Ok((at_build, bytes))
}

/// The live heap `n` held runs add, per run, in bytes.
async fn held_runs(dir: &std::path::Path, n: usize) -> Result<f64, Error> {
    let store = store(dir, "held.db").await?;
    let running = Arc::new(AtomicUsize::new(0));
    // The closures wait for a permit of this (none until all run).
    let go = Arc::new(Semaphore::new(0));
    let job = {
        let (running, go) = (running.clone(), go.clone());
        Job::keyed("held", move |_run| {
            let (running, go) = (running.clone(), go.clone());
            async move {
                running.fetch_add(1, Ordering::SeqCst);
                let _ = go.acquire().await;
                Ok(())
            }
        })
        .overlap(Overlap::Allow)
    };
    let handle = Jobs::builder(store)
        .candidate_id("memory")
        .poll_interval(Duration::from_millis(200))
        .job(job)
        .build()?
        .start();
    leading(&handle).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let region = Region::new(GLOBAL);
    for k in 0..n {
        handle.submit("held", &format!("key-{k:05}")).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while running.load(Ordering::SeqCst) < n {
        if Instant::now() > deadline {
            return Err(format!(
                "only {} of {n} runs started within 120 s",
                running.load(Ordering::SeqCst)
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let bytes = grown(&region);
    go.add_permits(n);
    tokio::time::sleep(Duration::from_millis(500)).await;
    handle.shutdown().await;
    Ok(bytes as f64 / n as f64)
}

fn main() -> Result<(), Error> {
    // `cargo bench` passes `--bench`; a filter names the benchmarks of the other target.
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with('-') && a != "memory")
    {
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let dir = tempfile::tempdir()?;
        let many = env("BENCH_MEMORY_JOBS", 10_000, (1_000, 100_000));
        let held = env("BENCH_HELD_RUNS", 1_000, (10, 10_000));
        let mut per_job = Vec::new();
        let mut totals = Vec::new();
        let kinds = [
            Schedules::Cloned,
            Schedules::ParsedAlike,
            Schedules::Distinct,
        ];
        for schedules in kinds {
            let (few_built, few_bytes) = scheduler(dir.path(), 100, schedules).await?;
            let (many_built, many_bytes) = scheduler(dir.path(), many, schedules).await?;
            totals.push((few_bytes, many_bytes));
            per_job.push((
                (many_bytes - few_bytes) as f64 / (many - 100) as f64,
                (many_built - few_built) as f64 / (many - 100) as f64,
            ));
        }
        let (few_bytes, many_bytes) = totals[0];
        let per_run = held_runs(dir.path(), held).await?;
        println!("\n## Scheduled jobs: memory (live heap, counted by the allocator)\n");
        println!("| measure | value |");
        println!("| --- | --- |");
        println!(
            "| a scheduler with 100 jobs (one schedule), after its looks | {:.1} KiB |",
            few_bytes as f64 / 1024.0
        );
        println!(
            "| a scheduler with {many} jobs (one schedule), after its looks | {:.1} KiB |",
            many_bytes as f64 / 1024.0
        );
        for ((after_looks, built), schedules) in per_job.iter().zip(kinds) {
            let how = schedules.describe();
            println!(
                "| per job, {how} (the difference, over {} jobs) | {after_looks:.0} bytes, \
                 {built:.0} of them once built |",
                many - 100,
            );
        }
        println!("| per run held at once ({held} runs of a keyed job) | {per_run:.0} bytes |");
        Ok(())
    })
}
