//! A job node process: one `Jobs` scheduler over the real store, its elector leading the run's
//! resource, with one fenced job, `tick`, every second, beside 300 load jobs (see
//! `LOAD_JOBS`). Each attempt at a slot opens the slot's fenced
//! transaction (`run.begin()`), inserts a row `(job, slot, token, writer)` into the run's
//! writes table (no key: a slot written twice shows as two rows), stays open 0-300 ms (so
//! kills, pauses and partitions land inside it) and commits with `run.commit(txn)`, which
//! writes the slot's "finished" mark in the same transaction. The checker (`jobs_checker.rs`)
//! reads the run table and the writes table afterwards; the history says what each attempt was
//! told.
//!
//! With `--spread-runs N` the scheduler spreads its runs over the nodes (each node's runner
//! runs up to N claimed runs, each under a hold of its own whose token is the attempt's).
//!
//! Beside them, a keyed job, `keyed` (the same fenced attempt, keys side by side under a cap
//! of `KEYED_CAP` permits, cluster-wide, and as many on the leader): each key's write
//! also names its run's permit and token, and the run's span by the database clock (read as
//! the run starts, before its work, and stamped by an update just before the commit), for
//! the checker's rule 10. Every node submits the keys `k-0`, `k-1`, ... one every
//! `SUBMIT_EVERY` from its start, so the nodes submit each key at about the same time, and a
//! node restarted after a kill submits the earlier keys again.
//!
//! History lines (times are `CLOCK_MONOTONIC` nanoseconds):
//!
//! ```text
//! start <node> <ns> <wall-unix-ms>
//! lead <token> <ns>                                   the node's elector leads (the scheduler runs)
//! follow <ns>                                         it does not
//! begin <job> <slot> <token> <attempt> <ns>                 an attempt's closure started
//! committed <job> <slot> <token> <attempt> <ns> <begun-ns>  `run.commit` returned Ok
//! refused <job> <slot> <token> <attempt> <ns> <begun-ns>    the term was no longer current (the fence)
//! notclaimed <job> <slot> <token> <attempt> <ns> <begun-ns> the record no longer said this attempt runs
//! failed <job> <slot> <token> <attempt> <ns> <begun-ns>     another error (a database error)
//! dropped <job> <slot> <token> <attempt> <ns> <begun-ns>    the attempt was dropped before it ended
//! submitted <key> <slot> <created: 0|1> <ns>                 `submit` answered with the key's record
//! stop <ns>
//! ```

use std::time::Duration;

use orion_beacon::jobs::{Job, JobError, JobRun, Jobs, MissedSlots, Overlap, Schedule};
use orion_beacon::{Leadership, SeaOrmLeaseStore};
use sea_orm::sea_query::{Alias, Expr, ExprTrait, Query};
use sea_orm::ConnectionTrait;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::candidate::Unfinished;
use crate::clock::mono_ns;
use crate::db::{connect, connect_rollback_journal};
use crate::shard_node::{line, open_history, History};
use crate::{Args, Error, LEASE, RENEW, RETRY, ROLLBACK_BUSY_TIMEOUT};

/// The fenced job of the run.
pub const JOB: &str = "tick";
/// Its schedule: a slot every second.
pub const EVERY: Duration = Duration::from_secs(1);
/// The keyed job of the run, and how often each node submits its next key.
pub const KEYED_JOB: &str = "keyed";
const SUBMIT_EVERY: Duration = Duration::from_millis(500);
/// The keyed job's cap (`jobs_checker::KEYED_CAP`).
pub const KEYED_CAP: u32 = 2;
/// A key's work before its fenced transaction, and inside it (ms, drawn per attempt).
const KEYED_WORK_MS: std::ops::Range<u64> = 0..300;
const KEYED_HOLD_MS: std::ops::Range<u64> = 0..20;
/// Beside it, this many load jobs (`load-000`...): every `LOAD_EVERY`, each run returning
/// after at most `LOAD_WORK_MS`, long before its next slot; the even ones under
/// `MissedSlots::RunAll` (every slot of theirs must have a record: missed ones are caught up),
/// the odd ones under the defaults (no slot may be `skipped` unless the run before it still
/// ran at its time). See `jobs_checker::check_load`.
pub const LOAD_JOBS: usize = 300;
pub const LOAD_PREFIX: &str = "load-";
pub const LOAD_EVERY: Duration = Duration::from_secs(2);
const LOAD_WORK_MS: std::ops::Range<u64> = 0..200;
/// How long an attempt keeps its fenced transaction open after its insert (ms, drawn per
/// attempt).
const WORK_MS: std::ops::Range<u64> = 0..300;
/// Retries of a failed or crashed slot: 200 ms, doubling, at most 2 s; a thousand attempts
/// (the most allowed), so no slot is given up during a run.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(2));
const MAX_ATTEMPTS: u32 = 1000;

/// What an attempt's closure needs.
#[derive(Clone)]
struct Tick {
    history: History,
    writes: String,
    me: String,
    /// The work before the fenced transaction, and inside it (ms, drawn per attempt).
    work: (std::ops::Range<u64>, std::ops::Range<u64>),
    /// The node's pool: a capped run reads the database clock there as it starts.
    db: sea_orm::DatabaseConnection,
}

impl Tick {
    /// One attempt: the fenced insert, the work, the commit with the slot's mark. Its outcome
    /// goes to the history; an error fails the attempt (the scheduler retries the slot).
    async fn attempt(&self, run: JobRun) -> Result<(), Error> {
        let (slot, token, attempt) = (run.slot_millis(), run.token().get(), run.attempt());
        let job = run.job().to_owned();
        let begun = mono_ns();
        line(
            &self.history,
            &format!("begin {job} {slot} {token} {attempt} {begun}"),
        );
        // An attempt its term's end drops (the work is aborted) says so too.
        let mut open = Unfinished::new(
            self.history.clone(),
            format!("dropped {job} {slot} {token} {attempt}"),
            begun,
        );
        let result: Result<(), Error> = async {
            let permit = run.permit();
            // A capped run's span starts with the run, by the database clock: it holds its
            // permit from before this until after its commit.
            let begun_ms: Option<i64> = match permit {
                Some(_) => {
                    let backend = self.db.get_database_backend();
                    let read = Query::select().expr(database_ms(backend)).to_owned();
                    let row = self.db.query_one(&read).await?;
                    Some(row.ok_or("no clock")?.try_get_by_index(0)?)
                }
                None => None,
            };
            let before = fastrand::u64(self.work.0.clone());
            if before > 0 {
                tokio::time::sleep(Duration::from_millis(before)).await;
            }
            let txn = run.begin().await?;
            let backend = txn.get_database_backend();
            let mut insert = Query::insert()
                .into_table(Alias::new(&self.writes))
                .columns([
                    Alias::new("job"),
                    Alias::new("slot"),
                    Alias::new("token"),
                    Alias::new("writer"),
                    Alias::new("permit"),
                    Alias::new("permit_token"),
                    Alias::new("begun_ms"),
                ])
                .to_owned();
            insert.values([
                run.job().into(),
                slot.into(),
                token.into(),
                self.me.clone().into(),
                permit.map(|p| p.resource().to_owned()).into(),
                permit.map(|p| p.token().get()).into(),
                begun_ms.into(),
            ])?;
            txn.execute(&insert).await?;
            tokio::time::sleep(Duration::from_millis(fastrand::u64(self.work.1.clone()))).await;
            if permit.is_some() {
                // The span's end: the transaction's last statement before its commit.
                let stamp = Query::update()
                    .table(Alias::new(&self.writes))
                    .value(Alias::new("ended_ms"), database_ms(backend))
                    .and_where(Expr::col(Alias::new("job")).eq(run.job()))
                    .and_where(Expr::col(Alias::new("slot")).eq(slot))
                    .and_where(Expr::col(Alias::new("token")).eq(token))
                    .to_owned();
                txn.execute(&stamp).await?;
            }
            run.commit(txn).await?;
            Ok(())
        }
        .await;
        let what = match &result {
            Ok(()) => "committed",
            Err(e) => match e.downcast_ref::<JobError>() {
                Some(JobError::Superseded { .. }) => "refused",
                Some(JobError::NotClaimed { .. }) => "notclaimed",
                _ => "failed",
            },
        };
        open.finished();
        line(
            &self.history,
            &format!(
                "{what} {job} {slot} {token} {attempt} {} {begun}",
                mono_ns()
            ),
        );
        result
    }
}

/// The database's clock at the statement, in ms since the Unix epoch (not the transaction's
/// start: PostgreSQL's `clock_timestamp()`, MySQL's `NOW(6)` per statement, SQLite's `'now'`).
fn database_ms(backend: sea_orm::DbBackend) -> Expr {
    Expr::cust(match backend {
        sea_orm::DbBackend::Postgres => {
            "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)"
        }
        sea_orm::DbBackend::MySql => "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000 AS SIGNED)",
        _ => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
    })
}

/// Runs one node until the harness writes `shutdown` to its standard input.
pub async fn run(args: Args) -> Result<(), Error> {
    let name = args.candidate.clone().unwrap_or_default();
    let history = open_history(&args, &name)?;
    // The scheduler's fenced transactions (claims, runs) go through the store's own
    // connection: with a separate address for fenced writes, the whole scheduler uses it.
    let url = args.fence_url.as_deref().unwrap_or(&args.url);
    let pool = args.pool.unwrap_or(3);
    let db = if args.rollback_journal {
        connect_rollback_journal(url, pool, ROLLBACK_BUSY_TIMEOUT).await?
    } else {
        connect(url, pool).await?
    };
    let store = SeaOrmLeaseStore::new(db.clone())
        .with_table(&args.table)?
        .with_transaction_pooling(args.transaction_pooling && args.fence_url.is_none());
    let tick = Tick {
        history: history.clone(),
        writes: args.writes_table.clone(),
        me: name.clone(),
        work: (0..1, WORK_MS),
        db: db.clone(),
    };
    // Keys run side by side: their work comes first, their fenced transactions stay short
    // (each holds the lease row, and on SQLite the write lock, while it is open).
    let keyed_tick = Tick {
        work: (KEYED_WORK_MS, KEYED_HOLD_MS),
        ..tick.clone()
    };
    let job = Job::new(JOB, Schedule::every(EVERY)?, move |run: JobRun| {
        let tick = tick.clone();
        async move { tick.attempt(run).await }
    })
    .retry_backoff(BACKOFF.0, BACKOFF.1)
    .max_attempts(MAX_ATTEMPTS);
    let keyed = Job::keyed(KEYED_JOB, move |run: JobRun| {
        let tick = keyed_tick.clone();
        async move { tick.attempt(run).await }
    })
    .overlap(Overlap::Allow)
    // The leader's own bound too: without it every look plans every queued key and asks for a
    // permit, and on a loaded CI host the leader fell behind its fenced job's liveness bound.
    .max_running(KEYED_CAP as usize)
    .cap(KEYED_CAP)
    .retry_backoff(BACKOFF.0, BACKOFF.1)
    .max_attempts(MAX_ATTEMPTS);
    let load = (0..args.load_jobs).map(|i| {
        Job::new(
            format!("{LOAD_PREFIX}{i:03}"),
            Schedule::every(LOAD_EVERY).expect("a valid interval"),
            |_run| async {
                tokio::time::sleep(Duration::from_millis(fastrand::u64(LOAD_WORK_MS))).await;
                Ok(())
            },
        )
        .missed_slots(if i % 2 == 0 {
            MissedSlots::RunAll
        } else {
            MissedSlots::RunLatest
        })
        .retry_backoff(BACKOFF.0, BACKOFF.1)
        .max_attempts(MAX_ATTEMPTS)
    });
    let mut builder = Jobs::builder(store);
    for job in load {
        builder = builder.job(job);
    }
    if let Some(per_node) = args.spread_runs {
        builder = builder.spread_runs(per_node);
    }
    let handle = builder
        .resource(&args.resource)
        .candidate_id(&name)
        .lease_duration(LEASE)
        .renew_interval(RENEW)
        .retry_interval(RETRY)
        .runs_table(&args.runs_table)
        .job(job)
        .job(keyed)
        .build()?
        .start();
    let handle = std::sync::Arc::new(handle);

    // The keys, one every `SUBMIT_EVERY`; what each submit was answered.
    let submitter = {
        let (handle, history) = (handle.clone(), history.clone());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(SUBMIT_EVERY);
            for i in 0u64.. {
                every.tick().await;
                let key = format!("k-{i}");
                if let Ok(s) = handle.submit(KEYED_JOB, &key).await {
                    line(
                        &history,
                        &format!(
                            "submitted {key} {} {} {}",
                            s.record.slot,
                            u8::from(s.created),
                            mono_ns()
                        ),
                    );
                }
            }
        })
    };

    // Whether the node's elector leads, as published: a line per change.
    let mut rx = handle.elector().watch();
    let watch_history = history.clone();
    let watcher = tokio::spawn(async move {
        let mut last: Option<Option<i64>> = None;
        loop {
            let now = match rx.borrow_and_update() {
                Leadership::Leader(term) => Some(term.token().get()),
                _ => None,
            };
            if last != Some(now) {
                last = Some(now);
                let text = match now {
                    Some(token) => format!("lead {token} {}", mono_ns()),
                    None => format!("follow {}", mono_ns()),
                };
                line(&watch_history, &text);
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    });

    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(text)) = stdin.next_line().await {
        if text.trim() == "shutdown" {
            break;
        }
    }
    submitter.abort();
    handle.shutdown().await;
    watcher.abort();
    line(&history, &format!("stop {}", mono_ns()));
    Ok(())
}
