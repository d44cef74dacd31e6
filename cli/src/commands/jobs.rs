//! `jobs`: scheduled jobs' run records. `jobs [list]` shows each job's latest slot and its next
//! one (by the database clock), `jobs runs JOB` one job's latest records with every attempt
//! (the earlier ones from the run table's attempt history), and `jobs rerun` /
//! `jobs give-up` are the operator's marks on one slot (`orion_beacon::jobs::mark`).

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use orion_beacon::entity::job_run::{Column, Model};
use orion_beacon::jobs::{Mark, Schedule};
use orion_beacon::{BackendError, JobError, StoreError};
use sea_orm::sea_query::{
    Alias, Condition, Expr, ExprTrait, Func, JoinType, Order, Query, SelectStatement,
};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, FromQueryResult, Iterable};
use serde_json::{json, Value};

use super::{closest, store_failure_in, Ctx, Table};
use crate::args::{JobsCommand, ListArgs, Output};
use crate::connect::scrub;
use crate::exit::{chain, CliError, Outcome};
use crate::render::{emit, human, one_line, table, time};

pub async fn run(
    ctx: &Ctx,
    runs_table: &str,
    command: Option<JobsCommand>,
    list: ListArgs,
) -> Outcome {
    let db = ctx.store.connection();
    let mut t = Runs {
        ctx,
        db,
        table: runs_table,
        keys: true,
    };
    t.keys = match key_column(db, runs_table).await {
        Ok(()) => true,
        // The database named the column: a table from before `AddJobRunKey`.
        Err(e) if e.to_string().contains("run_key") => false,
        // Anything else (no table, no connection) is what every read would meet.
        Err(e) => return Err(t.db_failure(e)),
    };
    match command {
        None => t.list(list.format.get(), !list.no_headers).await,
        Some(JobsCommand::List { list }) => t.list(list.format.get(), !list.no_headers).await,
        Some(JobsCommand::Runs { job, limit, list }) => {
            t.runs(&job, limit, list.format.get(), !list.no_headers)
                .await
        }
        Some(JobsCommand::Check {
            jobs,
            stale_after,
            list,
        }) => {
            t.check(&jobs, stale_after, list.format.get(), !list.no_headers)
                .await
        }
        Some(JobsCommand::Rerun { job, slot, key }) => {
            t.mark(&job, (slot, key.as_deref()), Mark::Rerun).await
        }
        Some(JobsCommand::GiveUp { job, slot, key }) => {
            t.mark(&job, (slot, key.as_deref()), Mark::GiveUp).await
        }
    }
}

/// A job, its last finish and its first claim (`jobs check`).
type Freshness = (String, Option<DateTime<Utc>>, Option<DateTime<Utc>>);

/// The run table of one invocation.
struct Runs<'a> {
    ctx: &'a Ctx,
    db: &'a DatabaseConnection,
    table: &'a str,
    /// Whether the table has the keyed jobs' column (`AddJobRunKey`): a table without it is
    /// read as it is, its records without keys.
    keys: bool,
}

/// Reads `table`'s `run_key` column (no row): an error names the column when the table lacks
/// it. Asked qualified: SQLite reads an unknown unqualified column name as a string.
async fn key_column(db: &DatabaseConnection, table: &str) -> Result<(), DbErr> {
    let probe = Query::select()
        .column((Alias::new(table), Column::RunKey))
        .from(Alias::new(table))
        .limit(0)
        .to_owned();
    db.query_all(&probe).await.map(|_| ())
}

impl Runs<'_> {
    /// The record's columns this table has, qualified by `alias`.
    fn columns(&self, alias: &Alias) -> Vec<(Alias, Column)> {
        Column::iter()
            .filter(|c| self.keys || !matches!(c, Column::RunKey))
            .map(|c| (alias.clone(), c))
            .collect()
    }

    /// `jobs check`: each job's last finished slot against `limit`, by the database clock.
    async fn check(
        &self,
        jobs: &[String],
        limit: std::time::Duration,
        output: Output,
        headers: bool,
    ) -> Outcome {
        // Every job with a record (or the ones named), and its newest finish.
        let finished_only = Expr::col(Column::State).eq("finished");
        // MAX over the finished records only, keeping jobs that have none.
        let mut stmt = Query::select();
        stmt.column(Column::Job)
            .expr_as(
                Func::max(Expr::case(finished_only, Expr::col(Column::FinishedAt))),
                Alias::new("last_finished"),
            )
            // A job never finished counts from its first claim.
            .expr_as(
                Func::min(Expr::col(Column::ClaimedAt)),
                Alias::new("first_claimed"),
            )
            .from(Alias::new(self.table))
            .group_by_col(Column::Job);
        if !jobs.is_empty() {
            stmt.and_where(Expr::col(Column::Job).is_in(jobs.iter().cloned()));
        }
        let rows = self
            .db
            .query_all(&stmt)
            .await
            .map_err(|e| self.db_failure(e))?;
        let mut last: Vec<Freshness> = rows
            .iter()
            .map(|r| {
                Ok((
                    r.try_get_by_index(0)?,
                    r.try_get_by_index(1)?,
                    r.try_get_by_index(2)?,
                ))
            })
            .collect::<Result<_, DbErr>>()
            .map_err(|e| self.db_failure(e))?;
        for job in jobs {
            if !last.iter().any(|(j, ..)| j == job) {
                return Err(CliError::UnknownResource(format!(
                    "no run records of job {job:?} in table {:?}",
                    self.table
                )));
            }
        }
        last.sort_by(|a, b| a.0.cmp(&b.0));
        let now = self.now().await?;
        // Since the last finish, or (never finished) since the first claim.
        let since = |at: Option<DateTime<Utc>>| {
            at.and_then(|at| (now - at).to_std().ok())
                .unwrap_or_default()
        };
        let age =
            |(_, finished, first): &(String, Option<DateTime<Utc>>, Option<DateTime<Utc>>)| {
                since(finished.or(*first))
            };
        let is_stale =
            |row: &(String, Option<DateTime<Utc>>, Option<DateTime<Utc>>)| age(row) > limit;
        let stale: Vec<&str> = last
            .iter()
            .filter(|row| is_stale(row))
            .map(|(job, ..)| job.as_str())
            .collect();
        if output == Output::Json {
            let all: Vec<Value> = last
                .iter()
                .map(|row| {
                    json!({
                        "job": row.0,
                        "last_finished": row.1.map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true)),
                        "age_ms": u64::try_from(age(row).as_millis()).unwrap_or(u64::MAX),
                        "stale": is_stale(row),
                    })
                })
                .collect();
            emit(&format!("{}\n", Value::Array(all)));
        } else {
            let rows = last.iter().map(|row| {
                vec![
                    row.0.clone(),
                    time(row.1),
                    human(age(row)),
                    if is_stale(row) { "STALE" } else { "ok" }.to_owned(),
                ]
            });
            let header = vec!["JOB", "LAST FINISHED (UTC)", "AGO", "STATUS"];
            let mut text = table(headers.then_some(header), rows, &[]);
            if headers {
                text.push_str(&format!(
                    "{} of {} job{} stale (no slot finished within {}, by the database clock, now {} UTC)\n",
                    stale.len(),
                    last.len(),
                    if last.len() == 1 { "" } else { "s" },
                    human(limit),
                    time(Some(now)),
                ));
            }
            emit(&text);
        }
        if stale.is_empty() {
            Ok(())
        } else {
            Err(CliError::Stale(format!(
                "stale: no slot finished within {} for {}",
                human(limit),
                stale.join(", ")
            )))
        }
    }

    /// `jobs [list]`: each job's newest record, and its next slot after the database's now.
    async fn list(&self, output: Output, headers: bool) -> Outcome {
        let [slots, keys] = self.latest_statements();
        // Per job, one record: its newest slot, or a keyed job's newest claim (one of the
        // records sharing that time); a name with both kinds shows the later claim.
        let mut newest: std::collections::BTreeMap<String, Model> =
            std::collections::BTreeMap::new();
        for m in self
            .all(&slots)
            .await?
            .into_iter()
            .chain(self.all(&keys).await?)
        {
            match newest.get(&m.job) {
                Some(seen) if seen.claimed_at >= m.claimed_at => {}
                _ => {
                    newest.insert(m.job.clone(), m);
                }
            }
        }
        let mut latest: Vec<Model> = newest.into_values().collect();
        // Byte order, whatever the database's collation.
        latest.sort_by(|a, b| a.job.cmp(&b.job));
        let now = self.now().await?;
        let now_ms = now.timestamp_millis();
        let next = |m: &Model| {
            Schedule::parse(&m.schedule)
                .ok()
                .and_then(|s| s.next_after(now_ms))
        };
        if output == Output::Json {
            let all: Vec<Value> = latest
                .iter()
                .map(|m| {
                    let mut value = record_json(m);
                    if let Some(obj) = value.as_object_mut() {
                        let next = next(m);
                        obj.insert("next_slot".to_owned(), json!(next.and_then(rfc3339)));
                        obj.insert("next_slot_ms".to_owned(), json!(next));
                    }
                    value
                })
                .collect();
            emit(&format!("{}\n", Value::Array(all)));
            return Ok(());
        }
        if latest.is_empty() {
            if headers {
                emit(&format!("no job runs in table {:?}\n", self.table));
            }
            return Ok(());
        }
        let wide = output == Output::Wide;
        let mut header = vec![
            "JOB",
            "LAST SLOT (UTC)",
            "STATE",
            "ATTEMPTS",
            "DURATION",
            "RUN BY",
            "TOKEN",
            "NEXT SLOT (UTC)",
        ];
        if wide {
            header.extend(["SCHEDULE", "CLAIMED (UTC)", "FINISHED (UTC)", "ERROR"]);
        }
        let rows = latest.iter().map(|m| {
            let mut row = vec![
                m.job.clone(),
                slot_label(m),
                m.state.clone(),
                m.attempts.to_string(),
                duration(m),
                by(m),
                token(m),
                next(m).map_or_else(|| "-".to_owned(), slot_time),
            ];
            if wide {
                row.extend([
                    m.schedule.clone(),
                    time(m.claimed_at),
                    time(ended(m).then_some(m.finished_at).flatten()),
                    error(m),
                ]);
            }
            row
        });
        let mut text = table(headers.then_some(header), rows, &[3, 4, 6]);
        if headers {
            text.push_str(&format!(
                "{} job{} (next slots by the database clock, now {} UTC)\n",
                latest.len(),
                if latest.len() == 1 { "" } else { "s" },
                time(Some(now)),
            ));
            // The schedulers' leases: who leads, with which jobs (their leaders' payloads).
            for lease in self.ctx.store.list().await.unwrap_or_default() {
                let Some((count, names)) = super::job_set(lease.payload.as_deref()) else {
                    continue;
                };
                let jobs = format!("{count}: {}", names.join(", "));
                let who = if lease.live {
                    format!(
                        "led by {} (token {}, {} left)",
                        lease.holder,
                        lease.token,
                        human(lease.remaining)
                    )
                } else {
                    format!("no leader (last {}, token {})", lease.holder, lease.token)
                };
                text.push_str(&format!(
                    "scheduler lease {:?}: {who}; {jobs}\n",
                    lease.resource
                ));
            }
        }
        emit(&text);
        Ok(())
    }

    /// `jobs runs JOB`: its newest `limit` records, newest first.
    async fn runs(&self, job: &str, limit: u64, output: Output, headers: bool) -> Outcome {
        // A keyed job's slots are its keys' digests: its records go newest claim (or submit)
        // first.
        let keyed = Query::select()
            .column(Column::Slot)
            .from(Alias::new(self.table))
            .and_where(Expr::col(Column::Job).eq(job))
            .and_where(Expr::col((Alias::new(self.table), Column::RunKey)).is_not_null())
            .limit(1)
            .to_owned();
        let keyed = self.keys
            && !self
                .db
                .query_all(&keyed)
                .await
                .map_err(|e| self.db_failure(e))?
                .is_empty();
        let mut stmt = Query::select();
        // Qualified: SQLite reads an unknown unqualified column name as a string.
        stmt.columns(self.columns(&Alias::new(self.table)))
            .from(Alias::new(self.table))
            .and_where(Expr::col(Column::Job).eq(job));
        if keyed {
            stmt.order_by(Column::ClaimedAt, Order::Desc);
        }
        let stmt = stmt
            .order_by(Column::Slot, Order::Desc)
            .limit(limit)
            .to_owned();
        let records = self.all(&stmt).await?;
        if records.is_empty() {
            return Err(self.unknown_job(job).await);
        }
        let earlier = self.earlier_attempts(job, &records).await?;
        // Only attempts before the record's latest: rows of an earlier record of the same key
        // (pruned, then submitted again) that the new one has not reached are not its.
        let of = |m: &Model| -> Vec<&Kept> {
            earlier
                .as_ref()
                .and_then(|e| e.get(&m.slot))
                .map_or(Vec::new(), |kept| {
                    kept.iter().filter(|k| k.attempt < m.attempts).collect()
                })
        };
        if output == Output::Json {
            let all: Vec<Value> = records
                .iter()
                .map(|m| {
                    let mut v = record_json(m);
                    if let (Some(obj), Some(_)) = (v.as_object_mut(), &earlier) {
                        let kept: Vec<Value> = of(m).into_iter().map(kept_json).collect();
                        obj.insert("earlier_attempts".to_owned(), Value::Array(kept));
                    }
                    v
                })
                .collect();
            emit(&format!("{}\n", Value::Array(all)));
            return Ok(());
        }
        let wide = output == Output::Wide;
        let mut header = vec!["SLOT (UTC)"];
        if wide {
            header.push("SLOT (MS)");
        }
        header.extend([
            "STATE",
            "ATTEMPT",
            "DURATION",
            "RUN BY",
            "TOKEN",
            "FINISHED (UTC)",
        ]);
        if wide {
            header.extend(["CLAIMED (UTC)", "SCHEDULE", "ERROR"]);
        }
        let mut rows = Vec::new();
        for m in &records {
            let mut row = vec![slot_label(m)];
            if wide {
                row.push(m.slot.to_string());
            }
            row.extend([
                m.state.clone(),
                m.attempts.to_string(),
                duration(m),
                by(m),
                token(m),
                time(ended(m).then_some(m.finished_at).flatten()),
            ]);
            if wide {
                row.extend([time(m.claimed_at), m.schedule.clone(), error(m)]);
            }
            rows.push(row);
            // The slot's earlier attempts under its latest, newest first.
            for k in of(m) {
                let mut row = vec![slot_label(m)];
                if wide {
                    row.push(m.slot.to_string());
                }
                row.extend([
                    outcome(k).to_owned(),
                    k.attempt.to_string(),
                    millis_text(k.duration_ms),
                    text_or_dash(k.claimed_by.as_deref()),
                    tokens_text(k.claimed_token, k.finished_token),
                    time(k.finished_at),
                ]);
                if wide {
                    row.extend([
                        time(k.claimed_at),
                        m.schedule.clone(),
                        text_or_dash(k.error.as_deref()),
                    ]);
                }
                rows.push(row);
            }
        }
        let right: &[usize] = if wide { &[1, 3, 4, 6] } else { &[2, 3, 5] };
        let mut text = table(headers.then_some(header), rows, right);
        if headers {
            let n = records.len();
            let more = if u64::try_from(n).unwrap_or(u64::MAX) >= limit {
                " (--limit N for more)"
            } else {
                ""
            };
            let kept = match &earlier {
                Some(_) => {
                    let k: usize = records.iter().map(|m| of(m).len()).sum();
                    if k == 0 {
                        String::new()
                    } else {
                        format!(
                            ", with {k} earlier attempt{}",
                            if k == 1 { "" } else { "s" }
                        )
                    }
                }
                None => format!(
                    "; earlier attempts are not kept: {} is missing (CreateJobAttemptTable)",
                    orion_beacon::entity::job_attempt_table(self.table)
                ),
            };
            text.push_str(&format!(
                "{n} run record{} of job {job:?}, newest first{kept}{more}\n",
                if n == 1 { "" } else { "s" },
            ));
        }
        emit(&text);
        Ok(())
    }

    /// The earlier attempts of `records`' slots, by slot, newest first; `None` when the run
    /// table has no attempt history (its migration not run).
    async fn earlier_attempts(
        &self,
        job: &str,
        records: &[Model],
    ) -> Result<Option<BTreeMap<i64, Vec<Kept>>>, CliError> {
        use orion_beacon::entity::job_attempt::Column as K;
        let table = orion_beacon::entity::job_attempt_table(self.table);
        let stmt = Query::select()
            .columns(K::iter().map(|c| (Alias::new(&table), c)))
            .from(Alias::new(&table))
            .and_where(Expr::col(K::Job).eq(job))
            .and_where(Expr::col(K::Slot).is_in(records.iter().map(|m| m.slot)))
            .order_by(K::Slot, Order::Desc)
            .order_by(K::Attempt, Order::Desc)
            .to_owned();
        let rows = match self.db.query_all(&stmt).await {
            Ok(rows) => rows,
            Err(e) if missing_table(&e) => return Ok(None),
            Err(e) => return Err(self.db_failure(e)),
        };
        let mut by_slot: BTreeMap<i64, Vec<Kept>> = BTreeMap::new();
        for row in &rows {
            let k = Kept::from_query_result(row, "").map_err(|e| self.db_failure(e))?;
            by_slot.entry(k.slot).or_default().push(k);
        }
        Ok(Some(by_slot))
    }

    /// `jobs rerun|give-up JOB SLOT|--key KEY`: the record is read first (a missing one is an
    /// error, one already marked so is left alone), then marked; a refused mark says why.
    async fn mark(
        &self,
        job: &str,
        (slot, key): (Option<i64>, Option<&str>),
        mark: Mark,
    ) -> Outcome {
        let (target, verb) = match mark {
            Mark::GiveUp => ("given_up", "give up"),
            _ => ("rerun", "mark to run again"),
        };
        let (slot, at) = match (slot, key) {
            // A keyed job's record is kept at its key's digest.
            (_, Some(key)) => {
                orion_beacon::jobs::validate_key(key)
                    .map_err(|e| CliError::BadInput(e.to_string()))?;
                let slot = orion_beacon::jobs::key_slot(key);
                (slot, format!("{job:?} key {key:?}"))
            }
            (Some(slot), None) => (
                slot,
                format!("{job:?} slot {} UTC ({slot})", slot_time(slot)),
            ),
            (None, None) => {
                return Err(CliError::BadInput("give a SLOT or --key KEY".to_owned()));
            }
        };
        let Some(before) = self
            .one(job, slot)
            .await?
            // A key's slot holds that key's record, or none of its.
            .filter(|m| key.is_none() || m.run_key.as_deref() == key)
        else {
            return Err(self.missing_record(job, &at).await);
        };
        if before.state == target {
            emit(&format!(
                "no record changed: {at} is already {}\n",
                described(target)
            ));
            return Ok(());
        }
        let changed = orion_beacon::jobs::mark(self.db, self.table, job, slot, mark)
            .await
            .map_err(|e| self.job_failure(e))?;
        if changed {
            let text = match mark {
                Mark::GiveUp => format!(
                    "gave up {at}: it was {}; it will not run again{}\n",
                    before.state,
                    if before.state == "running" {
                        " (the running attempt's commit is refused, its fenced writes roll back)"
                    } else {
                        ""
                    }
                ),
                _ => format!(
                    "marked {at} to run again: it was {}; the jobs' leader runs it at its next \
                     look{}\n",
                    before.state,
                    if before.state == "finished" {
                        " (its writes are made a second time)"
                    } else {
                        ""
                    }
                ),
            };
            emit(&text);
            return Ok(());
        }
        // Refused: the record says why (read again, it may have moved on meanwhile).
        let Some(now) = self.one(job, slot).await? else {
            return Err(self.missing_record(job, &at).await);
        };
        let why = match now.state.as_str() {
            "running" => format!(
                "it is running (attempt {}, claimed by {} with token {} at {} UTC): a running \
                 slot cannot be marked to run again; give it up, or wait for it to end",
                now.attempts,
                now.claimed_by.as_deref().unwrap_or("-"),
                opt(now.claimed_token),
                time(now.claimed_at)
            ),
            "finished" => format!(
                "it finished (token {}, at {} UTC): a finished slot never runs again, there is \
                 nothing to give up",
                opt(now.finished_token.or(now.claimed_token)),
                time(now.finished_at)
            ),
            other => format!("it is {other}"),
        };
        Err(CliError::NothingChanged(format!(
            "nothing changed: could not {verb} {at}: {why}"
        )))
    }

    /// The newest record of every job: a scheduled job's newest slot; a keyed job's newest
    /// claim or submit (its slots are its keys' digests, in no order).
    fn latest_statements(&self) -> [SelectStatement; 2] {
        let keyed = || Expr::col(Column::Schedule).eq("keyed");
        let newest = |by: Column, keyed_records: bool| {
            let (r, m) = (Alias::new("r"), Alias::new("m"));
            let which = if keyed_records {
                keyed()
            } else {
                Expr::col(Column::Schedule).ne("keyed")
            };
            let inner = Query::select()
                .column(Column::Job)
                .expr_as(Func::max(Expr::col(by)), Alias::new("latest"))
                .from(Alias::new(self.table))
                .and_where(which.clone())
                .group_by_col(Column::Job)
                .to_owned();
            let mine = if keyed_records {
                Expr::col((r.clone(), Column::Schedule)).eq("keyed")
            } else {
                Expr::col((r.clone(), Column::Schedule)).ne("keyed")
            };
            Query::select()
                .columns(self.columns(&r))
                .from_as(Alias::new(self.table), r.clone())
                .join_subquery(
                    JoinType::InnerJoin,
                    inner,
                    m.clone(),
                    Condition::all()
                        .add(Expr::col((r.clone(), Column::Job)).equals((m.clone(), Column::Job)))
                        .add(
                            Condition::any()
                                .add(
                                    Expr::col((r.clone(), by))
                                        .equals((m.clone(), Alias::new("latest"))),
                                )
                                // Every record of the job without the time (written by hand).
                                .add(
                                    Expr::col((m, Alias::new("latest")))
                                        .is_null()
                                        .and(Expr::col((r.clone(), by)).is_null()),
                                ),
                        )
                        .add(mine),
                )
                .order_by((r, Column::Slot), Order::Desc)
                .to_owned()
        };
        [newest(Column::Slot, false), newest(Column::ClaimedAt, true)]
    }

    /// One slot's record.
    async fn one(&self, job: &str, slot: i64) -> Result<Option<Model>, CliError> {
        let stmt = Query::select()
            .columns(self.columns(&Alias::new(self.table)))
            .from(Alias::new(self.table))
            .and_where(Expr::col(Column::Job).eq(job))
            .and_where(Expr::col(Column::Slot).eq(slot))
            .to_owned();
        Ok(self.all(&stmt).await?.into_iter().next())
    }

    async fn all(&self, stmt: &SelectStatement) -> Result<Vec<Model>, CliError> {
        let rows = self
            .db
            .query_all(stmt)
            .await
            .map_err(|e| self.db_failure(e))?;
        rows.iter()
            .map(|row| {
                if self.keys {
                    Model::from_query_result(row, "")
                } else {
                    without_key(row)
                }
            })
            .collect::<Result<_, _>>()
            .map_err(|e| self.db_failure(e))
    }

    /// The database clock (the lease statements' now).
    async fn now(&self) -> Result<DateTime<Utc>, CliError> {
        let now = match self.db.get_database_backend() {
            DbBackend::Postgres => "statement_timestamp()",
            DbBackend::MySql => "UTC_TIMESTAMP(6)",
            _ => "strftime('%Y-%m-%d %H:%M:%f', 'now')",
        };
        let stmt = Query::select()
            .expr_as(Expr::cust(now), Alias::new("now"))
            .to_owned();
        let read = async {
            self.db
                .query_one(&stmt)
                .await?
                .ok_or_else(|| DbErr::RecordNotFound("the database clock".to_owned()))?
                .try_get_by_index::<DateTime<Utc>>(0)
        };
        read.await.map_err(|e| self.db_failure(e))
    }

    /// The job names in the table (for a "did you mean").
    async fn job_names(&self) -> Vec<String> {
        let stmt = Query::select()
            .distinct()
            .column(Column::Job)
            .from(Alias::new(self.table))
            .to_owned();
        match self.db.query_all(&stmt).await {
            Ok(rows) => rows
                .iter()
                .filter_map(|r| r.try_get_by_index::<String>(0).ok())
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    /// No record at all for `job`.
    async fn unknown_job(&self, job: &str) -> CliError {
        let names = self.job_names().await;
        let hint = match closest(job, &names) {
            Some(name) => format!("did you mean {name:?}? "),
            None => String::new(),
        };
        CliError::UnknownResource(format!(
            "no runs of job {job:?} in table {:?} (it never ran there); {hint}`orion-beacon \
             jobs` lists the jobs",
            self.table
        ))
    }

    /// No record for this slot: an unknown job, or a slot it has no record of.
    async fn missing_record(&self, job: &str, at: &str) -> CliError {
        let known = self.job_names().await.iter().any(|n| n == job);
        if !known {
            return self.unknown_job(job).await;
        }
        CliError::UnknownResource(format!(
            "no run record for {at} in table {:?}: only recorded slots can be marked; \
             `orion-beacon jobs runs {job}` lists its slots",
            self.table
        ))
    }

    /// A database error on the run table, in the operator's words: a missing table says which
    /// migration creates it, as for the lease table.
    fn db_failure(&self, err: DbErr) -> CliError {
        let which = Table::JobRuns;
        if missing_table(&err) {
            return store_failure_in(
                self.ctx,
                which,
                StoreError::MissingTable {
                    table: self.table.to_owned(),
                    source: BackendError::from(err),
                },
            );
        }
        if err.to_string().contains("run_key") {
            return CliError::Other(format!(
                "the job-run table {:?} lacks the column run_key (keyed jobs' keys): run the \
                 migration AddJobRunKey on it (`orion_beacon_migration::migrations()` has it; \
                 or `orion-beacon-migration up -u <DATABASE_URL>`): {}",
                self.table,
                scrub(&chain(&err), &self.ctx.raw_url)
            ));
        }
        if matches!(err, DbErr::Conn(_) | DbErr::ConnectionAcquire(_)) {
            return store_failure_in(
                self.ctx,
                which,
                StoreError::Database(BackendError::from(err)),
            );
        }
        CliError::Other(format!(
            "the job-run table {:?}: {}",
            self.table,
            scrub(&chain(&err), &self.ctx.raw_url)
        ))
    }

    fn job_failure(&self, err: JobError) -> CliError {
        match err {
            JobError::Database(db) => self.db_failure(db),
            JobError::InvalidOption { .. } | JobError::InvalidName { .. } => {
                CliError::BadInput(err.to_string())
            }
            other => CliError::Other(scrub(&chain(&other), &self.ctx.raw_url)),
        }
    }
}

/// Whether the database said the table is not there: PostgreSQL's and MySQL's SQLSTATE, or
/// SQLite's message (its code is a plain `SQLITE_ERROR`).
fn missing_table(err: &DbErr) -> bool {
    #[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
    {
        use sea_orm::RuntimeErr;
        if let DbErr::Exec(RuntimeErr::SqlxError(e)) | DbErr::Query(RuntimeErr::SqlxError(e)) = err
        {
            if let Some(db) = e.as_database_error() {
                return matches!(db.code().as_deref(), Some("42P01" | "42S02"))
                    || db.message().starts_with("no such table");
            }
        }
    }
    let text = err.to_string();
    text.contains("no such table")
}

/// Whether the finished columns describe the latest attempt (a running or claimed one has not
/// ended: they would be an earlier attempt's).
fn ended(m: &Model) -> bool {
    !matches!(m.state.as_str(), "running" | "claimed")
}

fn described(state: &str) -> &str {
    match state {
        "rerun" => "marked to run again",
        "claimed" => "claimed (waiting for a node's runner)",
        "given_up" => "given up",
        other => other,
    }
}

fn slot_time(ms: i64) -> String {
    time(DateTime::from_timestamp_millis(ms))
}

fn rfc3339(ms: i64) -> Option<String> {
    DateTime::from_timestamp_millis(ms).map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true))
}

fn opt(v: Option<i64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn duration(m: &Model) -> String {
    millis_text(m.duration_ms.filter(|_| ended(m)))
}

/// A duration in milliseconds as the tables print it, `-` for none.
fn millis_text(ms: Option<i64>) -> String {
    ms.map_or_else(
        || "-".to_owned(),
        |ms| {
            human(std::time::Duration::from_millis(
                u64::try_from(ms).unwrap_or(0),
            ))
        },
    )
}

fn by(m: &Model) -> String {
    text_or_dash(m.claimed_by.as_deref())
}

/// Text on one line (control characters escaped), `-` for none.
fn text_or_dash(text: Option<&str>) -> String {
    text.map_or_else(|| "-".to_owned(), one_line)
}

/// The token of the term that claimed the latest attempt, and after a slash the one that ended
/// it when that was another.
fn token(m: &Model) -> String {
    tokens_text(m.claimed_token, m.finished_token.filter(|_| ended(m)))
}

/// The token an attempt was claimed under, and after a slash the one that ended it when that
/// was another.
fn tokens_text(claimed: Option<i64>, finished: Option<i64>) -> String {
    match (claimed, finished) {
        (Some(c), Some(f)) if c != f => format!("{c}/{f}"),
        (Some(c), _) => c.to_string(),
        (None, f) => opt(f),
    }
}

/// A record of a table without the key column (before `AddJobRunKey`).
fn without_key(row: &sea_orm::QueryResult) -> Result<Model, DbErr> {
    Ok(Model {
        job: row.try_get("", "job")?,
        slot: row.try_get("", "slot")?,
        state: row.try_get("", "state")?,
        attempts: row.try_get("", "attempts")?,
        schedule: row.try_get("", "schedule")?,
        claimed_token: row.try_get("", "claimed_token")?,
        claimed_by: row.try_get("", "claimed_by")?,
        claimed_at: row.try_get("", "claimed_at")?,
        finished_token: row.try_get("", "finished_token")?,
        finished_at: row.try_get("", "finished_at")?,
        duration_ms: row.try_get("", "duration_ms")?,
        error: row.try_get("", "error")?,
        run_key: None,
    })
}

/// A record's slot as shown: its time, or a keyed job's key.
fn slot_label(m: &Model) -> String {
    match &m.run_key {
        Some(key) => format!("key {}", one_line(key)),
        None => slot_time(m.slot),
    }
}

fn error(m: &Model) -> String {
    text_or_dash(m.error.as_deref().filter(|_| ended(m)))
}

/// An earlier attempt of a slot, from the attempt history.
type Kept = orion_beacon::entity::job_attempt::Model;

/// How a kept attempt ended: `failed`, `finished` (an operator marked the slot to run again),
/// `lost` (its runner was gone before it wrote an end) or `no end` (marked before it wrote
/// one: given up while it ran, or claimed for the nodes' runners and never taken).
fn outcome(k: &Kept) -> &'static str {
    match (k.state.as_str(), &k.error, k.finished_at) {
        ("running" | "claimed", _, _) => "lost",
        ("rerun", None, None) => "no end",
        (_, None, None) => "lost",
        (_, Some(_), _) | ("failed", _, _) => "failed",
        _ => "finished",
    }
}

/// A kept attempt as JSON (times RFC 3339 UTC).
fn kept_json(k: &Kept) -> Value {
    let at = |t: Option<DateTime<Utc>>| t.map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true));
    json!({
        "attempt": k.attempt,
        "outcome": outcome(k),
        "state": k.state,
        "claimed_by": k.claimed_by,
        "claimed_token": k.claimed_token,
        "claimed_at": at(k.claimed_at),
        "finished_token": k.finished_token,
        "finished_at": at(k.finished_at),
        "duration_ms": k.duration_ms,
        "error": k.error,
    })
}

/// A record as JSON: times RFC 3339 UTC, the slot also in milliseconds; the finished fields are
/// null while an attempt runs.
fn record_json(m: &Model) -> Value {
    let at = |t: Option<DateTime<Utc>>| t.map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true));
    let ended = ended(m);
    json!({
        "job": m.job,
        "slot": if m.run_key.is_some() { None } else { rfc3339(m.slot) },
        "slot_ms": m.slot,
        "key": m.run_key,
        "state": m.state,
        "attempts": m.attempts,
        "schedule": m.schedule,
        "claimed_by": m.claimed_by,
        "claimed_token": m.claimed_token,
        "claimed_at": at(m.claimed_at),
        "finished_token": m.finished_token.filter(|_| ended),
        "finished_at": at(m.finished_at.filter(|_| ended)),
        "duration_ms": m.duration_ms.filter(|_| ended),
        "error": m.error.as_ref().filter(|_| ended),
    })
}
