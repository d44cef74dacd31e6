//! The statements on the run table, built with sea-query and run inside the scheduler's fenced
//! transactions (and, for an operator's marks, on their own). Times are the database clock's.

use sea_orm::sea_query::{
    Alias, Condition, Expr, ExprTrait, Func, InsertStatement, OnConflict, Query, SelectStatement,
    UpdateStatement,
};
use sea_orm::Iterable;
use sea_orm::{DbBackend, QueryResult};

use orion_beacon_entity::job_run::Column;

use super::plan::{Open, State};

/// The most error text a failed attempt records.
pub(crate) const MAX_ERROR_LEN: usize = 1024;

/// The database's now, as the lease statements read it.
pub(crate) fn now(backend: DbBackend) -> Expr {
    match backend {
        DbBackend::Postgres => Expr::cust("statement_timestamp()"),
        DbBackend::MySql => Expr::cust("UTC_TIMESTAMP(6)"),
        _ => Expr::cust("strftime('%Y-%m-%d %H:%M:%f', 'now')"),
    }
}

/// A time as the run table's columns hold it, to compare with them: SQLite's are text in the
/// form its `strftime` writes them (a bound chrono time would be RFC 3339 text, which does not
/// compare with it), the others' are typed.
pub(crate) fn time_value(backend: DbBackend, at: chrono::DateTime<chrono::Utc>) -> Expr {
    match backend {
        DbBackend::Sqlite => Expr::val(at.format("%Y-%m-%d %H:%M:%S%.3f").to_string()),
        _ => Expr::val(at),
    }
}

/// `SELECT <now>`: the database clock.
pub(crate) fn clock(backend: DbBackend) -> SelectStatement {
    Query::select()
        .expr_as(now(backend), Alias::new("now"))
        .to_owned()
}

/// The newest recorded slot of each of `jobs`. A keyed job's records (a name that was keyed
/// once, now a schedule's) are not slots: their digests would stand for slots far ahead.
pub(crate) fn latest_slots(table: &str, jobs: &[String]) -> SelectStatement {
    Query::select()
        .column(Column::Job)
        .expr_as(Func::max(Expr::col(Column::Slot)), Alias::new("latest"))
        .from(Alias::new(table))
        .and_where(Expr::col(Column::Job).is_in(jobs.iter().cloned()))
        .and_where(Expr::col(Column::Schedule).ne(KEYED_SCHEDULE))
        .group_by_col(Column::Job)
        .to_owned()
}

/// The newest `finished_at` of each of `jobs`' finished slots.
pub(crate) fn last_finished(table: &str, jobs: &[String]) -> SelectStatement {
    Query::select()
        .column(Column::Job)
        .expr_as(
            Func::max(Expr::col(Column::FinishedAt)),
            Alias::new("last_finished"),
        )
        .from(Alias::new(table))
        .and_where(Expr::col(Column::Job).is_in(jobs.iter().cloned()))
        .and_where(Expr::col(Column::State).eq(State::Finished.as_str()))
        .group_by_col(Column::Job)
        .to_owned()
}

/// Deletes at most `batch` ended records (`finished`, `skipped`, `given_up`) of `jobs` whose
/// slot is before `before_ms`, never a job name's newest record (the planner goes on from each
/// name's newest slot, so no slot it could plan again loses its record) nor its newest
/// `finished` one (what "nothing ran" is judged by). One statement: the `LIMIT` sits in a
/// subquery (PostgreSQL and SQLite have no `DELETE ... LIMIT`), on MySQL/MariaDB inside a
/// derived table (which refuses `LIMIT` in an `IN` subquery and a subquery on the table it
/// deletes from). The outer condition repeats the job, state and slot tests, so a record
/// marked or claimed again while the statement waits for its lock is not deleted.
pub(crate) fn prune(
    backend: DbBackend,
    table: &str,
    jobs: &[String],
    before_ms: i64,
    batch: u64,
) -> sea_orm::sea_query::DeleteStatement {
    let (r, n, f) = (Alias::new("r"), Alias::new("n"), Alias::new("f"));
    let ended = [
        State::Finished.as_str(),
        State::Skipped.as_str(),
        State::GivenUp.as_str(),
    ];
    let newest = Query::select()
        .expr(Func::max(Expr::col((n.clone(), Column::Slot))))
        .from_as(Alias::new(table), n.clone())
        .and_where(Expr::col((n.clone(), Column::Job)).equals((r.clone(), Column::Job)))
        .and_where(Expr::col((n, Column::Schedule)).ne(KEYED_SCHEDULE))
        .to_owned();
    let newest_finished = Query::select()
        .expr(Func::max(Expr::col((f.clone(), Column::Slot))))
        .from_as(Alias::new(table), f.clone())
        .and_where(Expr::col((f.clone(), Column::Job)).equals((r.clone(), Column::Job)))
        .and_where(Expr::col((f.clone(), Column::State)).eq(State::Finished.as_str()))
        .and_where(Expr::col((f, Column::Schedule)).ne(KEYED_SCHEDULE))
        .to_owned();
    let mut old = Query::select();
    old.columns([(r.clone(), Column::Job), (r.clone(), Column::Slot)])
        .from_as(Alias::new(table), r.clone())
        .and_where(Expr::col((r.clone(), Column::Job)).is_in(jobs.iter().cloned()))
        .and_where(Expr::col((r.clone(), Column::State)).is_in(ended))
        .and_where(Expr::col((r.clone(), Column::Slot)).lt(before_ms))
        .and_where(Expr::col((r.clone(), Column::Schedule)).ne(KEYED_SCHEDULE))
        .and_where(Expr::col((r.clone(), Column::Slot)).lt(Expr::from(newest)))
        .and_where(
            Expr::col((r.clone(), Column::State))
                .ne(State::Finished.as_str())
                .or(Expr::col((r.clone(), Column::Slot)).lt(Expr::from(newest_finished))),
        )
        .order_by((r.clone(), Column::Job), sea_orm::sea_query::Order::Asc)
        .order_by((r, Column::Slot), sea_orm::sea_query::Order::Asc)
        .limit(batch);
    delete_chosen(
        backend,
        table,
        old,
        Condition::all()
            .add(Expr::col(Column::Job).is_in(jobs.iter().cloned()))
            .add(Expr::col(Column::State).is_in(ended))
            .add(Expr::col(Column::Slot).lt(before_ms))
            .add(Expr::col(Column::Schedule).ne(KEYED_SCHEDULE)),
    )
}

/// The states of a record that is not final and has been claimed at least once.
const OPEN: [State; 4] = [State::Running, State::Claimed, State::Failed, State::Rerun];

/// The records of `jobs` that are not final (running, claimed, failed, marked to run again);
/// not a keyed job's (see [`latest_slots`]).
pub(crate) fn open_runs(table: &str, jobs: &[String]) -> SelectStatement {
    let mut q = open_in(table, jobs, &OPEN);
    q.and_where(Expr::col(Column::Schedule).ne(KEYED_SCHEDULE))
        .order_by(Column::Slot, sea_orm::sea_query::Order::Asc);
    q
}

/// The records of `jobs` in `states`: the columns the planner reads, and the hold a running
/// attempt names (its token and holder, see [`decode_hold`]).
fn open_in(table: &str, jobs: &[String], states: &[State]) -> SelectStatement {
    Query::select()
        .columns([
            Column::Job,
            Column::Slot,
            Column::State,
            Column::Attempts,
            Column::ClaimedAt,
            Column::ClaimedToken,
            Column::ClaimedBy,
        ])
        .from(Alias::new(table))
        .and_where(Expr::col(Column::Job).is_in(jobs.iter().cloned()))
        .and_where(Expr::col(Column::State).is_in(states.iter().map(|s| s.as_str())))
        .to_owned()
}

/// An [`open_runs`] row: its job and what the planner needs (an [`open_keyed`] row's key:
/// [`decode_key`]).
pub(crate) fn decode_open(row: &QueryResult) -> Result<Option<(String, Open)>, sea_orm::DbErr> {
    let job: String = row.try_get_by_index(0)?;
    let state: String = row.try_get_by_index(2)?;
    let Some(state) = State::parse(&state) else {
        return Ok(None);
    };
    let claimed_at: Option<chrono::DateTime<chrono::Utc>> = row.try_get_by_index(4)?;
    Ok(Some((
        job,
        Open {
            slot: row.try_get_by_index(1)?,
            state,
            attempts: row.try_get_by_index(3)?,
            claimed_at_ms: claimed_at.map(|t| t.timestamp_millis()),
        },
    )))
}

/// The slot a keyed job records `key` under: the first 63 bits of the key's SHA-256 (never
/// negative). The key itself is recorded beside it (`run_key`) and compared on every submit,
/// so two keys that shared a digest would be told apart, never run as one.
pub(crate) fn key_slot(key: &str) -> i64 {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(key.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first) & i64::MAX
}

/// The schedule text of a keyed job's records.
pub(crate) const KEYED_SCHEDULE: &str = "keyed";

/// A submitted key: a `queued` record (no attempt yet; `claimed_at` is the submit's time, the
/// order keys start in) unless the job has a record at the key's slot already. One statement:
/// of submits of one key at once, exactly one inserts, and the count tells which.
///
/// MySQL/MariaDB: `INSERT IGNORE`. sea-query renders a MySQL `do_nothing` as `ON DUPLICATE
/// KEY IGNORE`, which MySQL does not have, and `ON DUPLICATE KEY UPDATE job = job` counts a
/// row found as a row changed under the `FOUND_ROWS` flag sqlx connects with. `IGNORE` would
/// also turn a value too long for its column into a warning: every value is checked first.
pub(crate) fn submit(
    backend: DbBackend,
    table: &str,
    job: &str,
    slot: i64,
    key: &str,
) -> Result<sea_orm::Statement, sea_orm::DbErr> {
    let mut insert = Query::insert();
    insert
        .into_table(Alias::new(table))
        .columns([
            Column::Job,
            Column::Slot,
            Column::State,
            Column::Attempts,
            Column::Schedule,
            Column::ClaimedAt,
            Column::RunKey,
        ])
        .values([
            job.into(),
            slot.into(),
            State::Queued.as_str().into(),
            0i32.into(),
            KEYED_SCHEDULE.into(),
            now(backend),
            key.into(),
        ])
        .map_err(|e| sea_orm::DbErr::Custom(e.to_string()))?;
    if backend != DbBackend::MySql {
        insert.on_conflict(
            OnConflict::columns([Column::Job, Column::Slot])
                .do_nothing()
                .to_owned(),
        );
    }
    let mut stmt = backend.build(&insert);
    if backend == DbBackend::MySql {
        stmt.sql = stmt
            .sql
            .strip_prefix("INSERT INTO ")
            .map(|rest| format!("INSERT IGNORE INTO {rest}"))
            .ok_or_else(|| sea_orm::DbErr::Custom(format!("unexpected insert: {}", stmt.sql)))?;
    }
    Ok(stmt)
}

/// One record, every column (a key's, after its submit), each qualified (see [`open_keyed`]).
pub(crate) fn one(table: &str, job: &str, slot: i64) -> SelectStatement {
    Query::select()
        .columns(Column::iter().map(|c| (Alias::new(table), c)))
        .from(Alias::new(table))
        .and_where(Expr::col(Column::Job).eq(job))
        .and_where(Expr::col(Column::Slot).eq(slot))
        .to_owned()
}

/// The most queued keys of one keyed job a look reads: a look claims at most 10,000 in all,
/// and a backlog of a million queued keys costs each look this many rows, not a million.
pub(crate) const QUEUED_READ_LIMIT: u64 = 1_000;

/// The claimed, failed and marked records of keyed `jobs` (every one: what to retry, give up
/// or leave alone), as [`open_runs`] with the key last, oldest claim first.
pub(crate) fn open_keyed(table: &str, jobs: &[String]) -> SelectStatement {
    keyed_in(table, jobs, &OPEN)
}

/// The queued keys of the keyed job `job`, oldest submit first, at most
/// [`QUEUED_READ_LIMIT`] (the next ones come as these start). One job's backlog never hides
/// another's keys.
pub(crate) fn queued_keys(table: &str, job: &str) -> SelectStatement {
    let mut q = keyed_in(table, &[job.to_owned()], &[State::Queued]);
    q.limit(QUEUED_READ_LIMIT);
    q
}

fn keyed_in(table: &str, jobs: &[String], states: &[State]) -> SelectStatement {
    let mut q = open_in(table, jobs, states);
    // Qualified: SQLite reads an unknown unqualified "run_key" as a string, and a table
    // without the column must fail the read, not hand every record that text as its key.
    q.column((Alias::new(table), Column::RunKey))
        .and_where(Expr::col(Column::Schedule).eq(KEYED_SCHEDULE))
        .order_by(Column::ClaimedAt, sea_orm::sea_query::Order::Asc)
        .order_by(Column::Slot, sea_orm::sea_query::Order::Asc);
    q
}

/// Deletes at most `batch` ended records (`finished`, `given_up`) of keyed `jobs` that ended
/// (or, never ended, were last claimed) before `before`, never a name's newest finished one
/// (what "nothing ran" is judged by). A pruned key runs again if it is submitted again. As
/// [`prune`], the `LIMIT` sits in a subquery (a derived table on MySQL/MariaDB) and the outer
/// condition repeats the tests.
pub(crate) fn prune_keyed(
    backend: DbBackend,
    table: &str,
    jobs: &[String],
    before: chrono::DateTime<chrono::Utc>,
    batch: u64,
) -> sea_orm::sea_query::DeleteStatement {
    let (r, f) = (Alias::new("r"), Alias::new("f"));
    let ended = [State::Finished.as_str(), State::GivenUp.as_str()];
    let at = |t: Option<&Alias>| match t {
        Some(t) => Func::coalesce([
            Expr::col((t.clone(), Column::FinishedAt)),
            Expr::col((t.clone(), Column::ClaimedAt)),
        ]),
        None => Func::coalesce([Expr::col(Column::FinishedAt), Expr::col(Column::ClaimedAt)]),
    };
    let before = time_value(backend, before);
    let newest_finished = Query::select()
        .expr(Func::max(Expr::col((f.clone(), Column::FinishedAt))))
        .from_as(Alias::new(table), f.clone())
        .and_where(Expr::col((f.clone(), Column::Job)).equals((r.clone(), Column::Job)))
        .and_where(Expr::col((f, Column::State)).eq(State::Finished.as_str()))
        .to_owned();
    let mut old = Query::select();
    old.columns([(r.clone(), Column::Job), (r.clone(), Column::Slot)])
        .from_as(Alias::new(table), r.clone())
        .and_where(Expr::col((r.clone(), Column::Job)).is_in(jobs.iter().cloned()))
        .and_where(Expr::col((r.clone(), Column::State)).is_in(ended))
        .and_where(Expr::expr(at(Some(&r))).lt(before.clone()))
        .and_where(
            Expr::col((r.clone(), Column::State))
                .ne(State::Finished.as_str())
                .or(Expr::col((r.clone(), Column::FinishedAt)).lt(Expr::from(newest_finished))),
        )
        .order_by((r.clone(), Column::Job), sea_orm::sea_query::Order::Asc)
        .order_by((r, Column::Slot), sea_orm::sea_query::Order::Asc)
        .limit(batch);
    delete_chosen(
        backend,
        table,
        old,
        Condition::all()
            .add(Expr::col(Column::Job).is_in(jobs.iter().cloned()))
            .add(Expr::col(Column::State).is_in(ended))
            .add(Expr::expr(at(None)).lt(before)),
    )
}

/// Deletes the records `chosen` (a select of `job, slot`, ordered and limited) names, where
/// `outer` still holds when the `DELETE` gets to them. The `LIMIT` sits in that subquery
/// (PostgreSQL and SQLite have no `DELETE ... LIMIT`); on MySQL/MariaDB inside a derived
/// table, which refuses `LIMIT` in an `IN` subquery and a subquery on the table it deletes
/// from.
fn delete_chosen(
    backend: DbBackend,
    table: &str,
    chosen: SelectStatement,
    outer: Condition,
) -> sea_orm::sea_query::DeleteStatement {
    let keys = [Alias::new("job"), Alias::new("slot")];
    delete_chosen_by(backend, table, &keys, chosen, outer)
}

/// [`delete_chosen`] for a table keyed by the columns `keys` (`chosen` selects them, in order).
fn delete_chosen_by(
    backend: DbBackend,
    table: &str,
    keys: &[Alias],
    chosen: SelectStatement,
    outer: Condition,
) -> sea_orm::sea_query::DeleteStatement {
    let chosen = if backend == DbBackend::MySql {
        let d = Alias::new("d");
        Query::select()
            .columns(keys.iter().map(|k| (d.clone(), k.clone())))
            .from_subquery(chosen, d)
            .to_owned()
    } else {
        chosen
    };
    Query::delete()
        .from_table(Alias::new(table))
        .cond_where(outer)
        .and_where(Expr::tuple(keys.iter().map(|k| Expr::col(k.clone()))).in_subquery(chosen))
        .to_owned()
}

/// An [`open_keyed`] row's key.
pub(crate) fn decode_key(row: &QueryResult) -> Result<Option<String>, sea_orm::DbErr> {
    row.try_get_by_index(7)
}

/// An [`open_runs`] or [`open_keyed`] row's claim: the token and holder of the term or hold
/// that claimed its latest attempt, when it names both.
pub(crate) fn decode_hold(row: &QueryResult) -> Result<Option<(i64, String)>, sea_orm::DbErr> {
    let token: Option<i64> = row.try_get_by_index(5)?;
    let by: Option<String> = row.try_get_by_index(6)?;
    Ok(token.zip(by))
}

/// Who claims: the term's token and holder, the schedule's text.
pub(crate) struct Claimant<'a> {
    pub token: i64,
    pub holder: &'a str,
    pub schedule: &'a str,
}

/// A new record: its job, slot, state (`running`, attempt 1, or `skipped`) and schedule text.
#[derive(Clone, Copy)]
pub(crate) struct NewRecord<'a> {
    pub job: &'a str,
    pub slot: i64,
    pub state: State,
    pub schedule: &'a str,
}

/// One statement adding every record of `rows` (one `INSERT` of many rows: a look's claims
/// hold the lease row for one round trip, not one per claim). No conflict clause: a slot
/// recorded since it was read fails the statement, and the claim's transaction rolls back.
pub(crate) fn insert_many(
    backend: DbBackend,
    table: &str,
    rows: &[NewRecord<'_>],
    token: i64,
    holder: &str,
) -> Result<InsertStatement, sea_orm::DbErr> {
    let mut insert = Query::insert();
    insert.into_table(Alias::new(table)).columns([
        Column::Job,
        Column::Slot,
        Column::State,
        Column::Attempts,
        Column::Schedule,
        Column::ClaimedToken,
        Column::ClaimedBy,
        Column::ClaimedAt,
    ]);
    for row in rows {
        let attempts = i32::from(matches!(row.state, State::Running | State::Claimed));
        insert
            .values([
                row.job.into(),
                row.slot.into(),
                row.state.as_str().into(),
                attempts.into(),
                row.schedule.into(),
                token.into(),
                holder.into(),
                now(backend),
            ])
            .map_err(|e| sea_orm::DbErr::Custom(e.to_string()))?;
    }
    Ok(insert)
}

/// The record of `slot` as it was read (`prior`): nothing has changed it since.
fn unchanged(update: &mut UpdateStatement, job: &str, slot: i64, state: State, attempts: i32) {
    update
        .and_where(Expr::col(Column::Job).eq(job))
        .and_where(Expr::col(Column::Slot).eq(slot))
        .and_where(Expr::col(Column::State).eq(state.as_str()))
        .and_where(Expr::col(Column::Attempts).eq(attempts));
}

/// The next attempt of `prior`, `to` `running` (the leader runs it) or `claimed` (a node's
/// runner takes it, with spread runs).
pub(crate) fn reclaim(
    backend: DbBackend,
    table: &str,
    job: &str,
    prior: &Open,
    by: &Claimant<'_>,
    to: State,
) -> UpdateStatement {
    let mut update = Query::update();
    update
        .table(Alias::new(table))
        .value(Column::State, to.as_str())
        .value(Column::Attempts, prior.next_attempt())
        .value(Column::Schedule, by.schedule)
        .value(Column::ClaimedToken, by.token)
        .value(Column::ClaimedBy, by.holder)
        .value(Column::ClaimedAt, now(backend))
        // The previous attempt's end is not this one's (its error stays, for the record).
        .value(Column::FinishedToken, Option::<i64>::None)
        .value(
            Column::FinishedAt,
            Option::<chrono::DateTime<chrono::Utc>>::None,
        )
        .value(Column::DurationMs, Option::<i64>::None);
    unchanged(&mut update, job, prior.slot, prior.state, prior.attempts);
    update
}

/// Keeps the attempt `prior` records in the attempt-history table `attempts`, before the claim
/// of its next attempt overwrites it: a copy of the record, if it is still as it was read (as
/// [`reclaim`] requires, in the same transaction). `None` when `prior` holds no attempt that
/// ran: a start claimed but never taken, a key still queued. An attempt that wrote no end
/// keeps no error (the record's is an earlier attempt's). A row already there (a key
/// submitted again after its pruned record's history outlived it) is overwritten.
pub(crate) fn keep_attempt(
    backend: DbBackend,
    tables: (&str, &str),
    job: &str,
    prior: &Open,
) -> Option<InsertStatement> {
    if prior.attempts < 1 || matches!(prior.state, State::Claimed | State::Queued) {
        return None;
    }
    Some(copy_into_history(backend, tables, Some((job, prior))))
}

/// A probe of the attempt history: [`keep_attempt`]'s statement (its lock included) copying
/// no row, which fails as a copy would if the table is not there, lacks a column or may not be
/// written.
pub(crate) fn attempts_probe(backend: DbBackend, tables: (&str, &str)) -> InsertStatement {
    copy_into_history(backend, tables, None)
}

/// The copy of `of`'s record into the history (none: no row, for the probe).
fn copy_into_history(
    backend: DbBackend,
    (runs, attempts): (&str, &str),
    of: Option<(&str, &Open)>,
) -> InsertStatement {
    use orion_beacon_entity::job_attempt::Column as Kept;
    let mut copy = Query::select();
    copy.columns([
        Column::Job,
        Column::Slot,
        Column::Attempts,
        Column::State,
        Column::ClaimedToken,
        Column::ClaimedBy,
        Column::ClaimedAt,
        Column::FinishedToken,
        Column::FinishedAt,
        Column::DurationMs,
    ])
    .expr(
        Expr::case(
            Expr::col(Column::FinishedAt).is_null(),
            Expr::value(Option::<String>::None),
        )
        .finally(Expr::col(Column::Error)),
    )
    .expr(now(backend))
    .from(Alias::new(runs));
    match of {
        Some((job, prior)) => {
            copy.and_where(Expr::col(Column::Job).eq(job))
                .and_where(Expr::col(Column::Slot).eq(prior.slot))
                .and_where(Expr::col(Column::State).eq(prior.state.as_str()))
                .and_where(Expr::col(Column::Attempts).eq(prior.attempts));
        }
        None => {
            copy.and_where(Expr::val(1).eq(0));
        }
    }
    if backend != DbBackend::Sqlite {
        // The record locked for the reclaim that follows: a change committed meanwhile (an
        // operator's mark, a late end) is waited for and re-checked, so the copy and the
        // reclaim see the same record, and InnoDB never upgrades a shared lock it took here
        // (SQLite's transaction already holds the one write lock).
        copy.lock(sea_orm::sea_query::LockType::Update);
    }
    let mut insert = Query::insert();
    insert
        .into_table(Alias::new(attempts))
        .columns([
            Kept::Job,
            Kept::Slot,
            Kept::Attempt,
            Kept::State,
            Kept::ClaimedToken,
            Kept::ClaimedBy,
            Kept::ClaimedAt,
            Kept::FinishedToken,
            Kept::FinishedAt,
            Kept::DurationMs,
            Kept::Error,
            Kept::RecordedAt,
        ])
        .select_from(copy)
        // Twelve columns into twelve, so it cannot fail (and a statement without its select
        // would be refused by the server, never run).
        .ok();
    // The record is the truth: a row of that attempt left from before (a key pruned with its
    // history not yet, then submitted again) is overwritten.
    insert.on_conflict(
        OnConflict::columns([Kept::Job, Kept::Slot, Kept::Attempt])
            .update_columns([
                Kept::State,
                Kept::ClaimedToken,
                Kept::ClaimedBy,
                Kept::ClaimedAt,
                Kept::FinishedToken,
                Kept::FinishedAt,
                Kept::DurationMs,
                Kept::Error,
                Kept::RecordedAt,
            ])
            .to_owned(),
    );
    insert
}

/// Deletes at most `batch` rows of the attempt history of `jobs` whose run record is gone
/// (pruned) or has not got past them (a key's new record, submitted again after its pruning):
/// the history goes with its record. As [`prune`], the `LIMIT` sits in a subquery.
pub(crate) fn prune_attempts(
    backend: DbBackend,
    (runs, attempts): (&str, &str),
    jobs: &[String],
    batch: u64,
) -> sea_orm::sea_query::DeleteStatement {
    use orion_beacon_entity::job_attempt::Column as Kept;
    let (a, r) = (Alias::new("a"), Alias::new("r"));
    // Its record, past the kept attempt: a row of a record gone, or of an earlier record of
    // the same key (pruned, then submitted again) that the new one has not reached, goes.
    let record = Query::select()
        .expr(Expr::val(1))
        .from_as(Alias::new(runs), r.clone())
        .and_where(Expr::col((r.clone(), Column::Job)).equals((a.clone(), Kept::Job)))
        .and_where(Expr::col((r.clone(), Column::Slot)).equals((a.clone(), Kept::Slot)))
        .and_where(Expr::col((r, Column::Attempts)).gt(Expr::col((a.clone(), Kept::Attempt))))
        .to_owned();
    let mut orphans = Query::select();
    orphans
        .columns([
            (a.clone(), Kept::Job),
            (a.clone(), Kept::Slot),
            (a.clone(), Kept::Attempt),
        ])
        .from_as(Alias::new(attempts), a.clone())
        .and_where(Expr::col((a.clone(), Kept::Job)).is_in(jobs.iter().cloned()))
        .and_where(Expr::exists(record).not())
        .order_by((a.clone(), Kept::Job), sea_orm::sea_query::Order::Asc)
        .order_by((a.clone(), Kept::Slot), sea_orm::sea_query::Order::Asc)
        .order_by((a, Kept::Attempt), sea_orm::sea_query::Order::Asc)
        .limit(batch);
    let keys = vec![Alias::new("job"), Alias::new("slot"), Alias::new("attempt")];
    delete_chosen_by(
        backend,
        attempts,
        &keys,
        orphans,
        Condition::all().add(Expr::col(Kept::Job).is_in(jobs.iter().cloned())),
    )
}

/// With spread runs: the claimed attempts of `jobs` no node runs yet, oldest claim first, at
/// most `limit`; with the key (qualified, see [`open_keyed`]) when `with_key`: job, slot,
/// attempts, claimed_at[, run_key].
pub(crate) fn claimed(table: &str, jobs: &[String], with_key: bool, limit: u64) -> SelectStatement {
    let mut q = Query::select();
    q.columns([
        Column::Job,
        Column::Slot,
        Column::Attempts,
        Column::ClaimedAt,
    ])
    .from(Alias::new(table))
    .and_where(Expr::col(Column::Job).is_in(jobs.iter().cloned()))
    .and_where(Expr::col(Column::State).eq(State::Claimed.as_str()))
    .order_by(Column::ClaimedAt, sea_orm::sea_query::Order::Asc)
    .order_by(Column::Job, sea_orm::sea_query::Order::Asc)
    .order_by(Column::Slot, sea_orm::sea_query::Order::Asc)
    .limit(limit);
    if with_key {
        q.column((Alias::new(table), Column::RunKey));
    }
    q
}

/// With spread runs: a node's runner takes claimed attempt `attempts` of `slot` under its run
/// hold (`token`, held by `holder`): the record says `running`, by that hold, from now. Only if
/// nothing changed it since it was read (another runner took it, an operator marked it).
pub(crate) fn take(
    backend: DbBackend,
    table: &str,
    job: &str,
    slot: i64,
    attempts: i32,
    (token, holder): (i64, &str),
) -> UpdateStatement {
    let mut update = Query::update();
    update
        .table(Alias::new(table))
        .value(Column::State, State::Running.as_str())
        .value(Column::ClaimedToken, token)
        .value(Column::ClaimedBy, holder)
        .value(Column::ClaimedAt, now(backend));
    unchanged(&mut update, job, slot, State::Claimed, attempts);
    update
}

/// `prior`, its attempts spent: given up.
pub(crate) fn give_up(table: &str, job: &str, prior: &Open) -> UpdateStatement {
    let mut update = Query::update();
    update
        .table(Alias::new(table))
        .value(Column::State, State::GivenUp.as_str());
    unchanged(&mut update, job, prior.slot, prior.state, prior.attempts);
    update
}

/// How an attempt ended.
pub(crate) struct Ending<'a> {
    pub state: State,
    pub token: i64,
    pub duration_ms: i64,
    pub error: Option<&'a str>,
}

/// Ends attempt `attempts` of `slot`, claimed by `claimed_token`, if the record still says it
/// runs: `finished` (with the job's writes, in their transaction), `failed` or `given_up`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn end(
    backend: DbBackend,
    table: &str,
    job: &str,
    slot: i64,
    attempts: i32,
    claimed_token: i64,
    ending: &Ending<'_>,
) -> UpdateStatement {
    let error = ending.error.map(|e| truncate(e, MAX_ERROR_LEN).to_owned());
    let mut update = Query::update();
    update
        .table(Alias::new(table))
        .value(Column::State, ending.state.as_str())
        .value(Column::FinishedToken, ending.token)
        .value(Column::FinishedAt, now(backend))
        .value(Column::DurationMs, ending.duration_ms)
        .value(Column::Error, error);
    unchanged(&mut update, job, slot, State::Running, attempts);
    update.and_where(Expr::col(Column::ClaimedToken).eq(claimed_token));
    update
}

/// An operator's mark on an existing record: `rerun` (any record but a running one) or
/// `given_up` (any but a finished one).
pub(crate) fn mark(table: &str, job: &str, slot: i64, to: State) -> UpdateStatement {
    let keep = match to {
        State::GivenUp => State::Finished,
        _ => State::Running,
    };
    Query::update()
        .table(Alias::new(table))
        .value(Column::State, to.as_str())
        .and_where(Expr::col(Column::Job).eq(job))
        .and_where(Expr::col(Column::Slot).eq(slot))
        .and_where(Expr::col(Column::State).ne(keep.as_str()))
        .to_owned()
}

/// `text` cut to at most `max` bytes on a character boundary.
pub(crate) fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use sea_orm::sea_query::{MysqlQueryBuilder, PostgresQueryBuilder, SqliteQueryBuilder};

    const T: &str = "orionbeacon_job_runs";

    fn by() -> Claimant<'static> {
        Claimant {
            token: 7,
            holder: "node-1",
            schedule: "every 1000ms",
        }
    }

    fn prior() -> Open {
        Open {
            slot: 5000,
            state: State::Failed,
            attempts: 1,
            claimed_at_ms: Some(5001),
        }
    }

    fn ending() -> Ending<'static> {
        Ending {
            state: State::Finished,
            token: 7,
            duration_ms: 12,
            error: None,
        }
    }

    // The exact SQL per backend: every condition that makes a claim or an end conditional is
    // there on each (sea-query drops nothing here, and a change to that shows in this test).
    #[test]
    fn statements_per_backend() {
        let pg = |b: DbBackend| match b {
            DbBackend::Postgres => 0,
            DbBackend::MySql => 1,
            _ => 2,
        };
        for backend in [DbBackend::Postgres, DbBackend::MySql, DbBackend::Sqlite] {
            let i = pg(backend);
            let row = |slot, state| NewRecord {
                job: "j",
                slot,
                state,
                schedule: by().schedule,
            };
            let claim = insert_many(backend, T, &[row(5000, State::Running)], 7, "node-1").unwrap();
            let claims = insert_many(
                backend,
                T,
                &[row(5000, State::Running), row(6000, State::Skipped)],
                7,
                "node-1",
            )
            .unwrap();
            let reclaim = reclaim(backend, T, "j", &prior(), &by(), State::Running);
            let end = end(backend, T, "j", 5000, 2, 7, &ending());
            let (claim, claims, reclaim, end) = match backend {
                DbBackend::Postgres => (
                    claim.to_string(PostgresQueryBuilder),
                    claims.to_string(PostgresQueryBuilder),
                    reclaim.to_string(PostgresQueryBuilder),
                    end.to_string(PostgresQueryBuilder),
                ),
                DbBackend::MySql => (
                    claim.to_string(MysqlQueryBuilder),
                    claims.to_string(MysqlQueryBuilder),
                    reclaim.to_string(MysqlQueryBuilder),
                    end.to_string(MysqlQueryBuilder),
                ),
                _ => (
                    claim.to_string(SqliteQueryBuilder),
                    claims.to_string(SqliteQueryBuilder),
                    reclaim.to_string(SqliteQueryBuilder),
                    end.to_string(SqliteQueryBuilder),
                ),
            };
            assert_eq!(claim, CLAIM[i], "{backend:?}");
            // Many claims: one statement, a row each, nothing else changed.
            let (head, first_row) = CLAIM[i].split_at(CLAIM[i].find(" VALUES ").unwrap());
            let second_row = first_row.replacen(" VALUES ", ", ", 1).replacen(
                "5000, 'running', 1",
                "6000, 'skipped', 0",
                1,
            );
            assert_eq!(
                claims,
                format!("{head}{first_row}{second_row}"),
                "{backend:?}"
            );
            assert_eq!(reclaim, RECLAIM[i], "{backend:?}");
            assert_eq!(end, END[i], "{backend:?}");
        }
        assert_eq!(
            mark(T, "j", 5000, State::Rerun).to_string(PostgresQueryBuilder),
            r#"UPDATE "orionbeacon_job_runs" SET "state" = 'rerun' WHERE "job" = 'j' AND "slot" = 5000 AND "state" <> 'running'"#
        );
        assert_eq!(
            mark(T, "j", 5000, State::GivenUp).to_string(MysqlQueryBuilder),
            "UPDATE `orionbeacon_job_runs` SET `state` = 'given_up' WHERE `job` = 'j' AND `slot` = 5000 AND `state` <> 'finished'"
        );
    }

    const CLAIM: [&str; 3] = [r#"INSERT INTO "orionbeacon_job_runs" ("job", "slot", "state", "attempts", "schedule", "claimed_token", "claimed_by", "claimed_at") VALUES ('j', 5000, 'running', 1, 'every 1000ms', 7, 'node-1', statement_timestamp())"#, "INSERT INTO `orionbeacon_job_runs` (`job`, `slot`, `state`, `attempts`, `schedule`, `claimed_token`, `claimed_by`, `claimed_at`) VALUES ('j', 5000, 'running', 1, 'every 1000ms', 7, 'node-1', UTC_TIMESTAMP(6))", r#"INSERT INTO "orionbeacon_job_runs" ("job", "slot", "state", "attempts", "schedule", "claimed_token", "claimed_by", "claimed_at") VALUES ('j', 5000, 'running', 1, 'every 1000ms', 7, 'node-1', strftime('%Y-%m-%d %H:%M:%f', 'now'))"#];
    const RECLAIM: [&str; 3] = [r#"UPDATE "orionbeacon_job_runs" SET "state" = 'running', "attempts" = 2, "schedule" = 'every 1000ms', "claimed_token" = 7, "claimed_by" = 'node-1', "claimed_at" = statement_timestamp(), "finished_token" = NULL, "finished_at" = NULL, "duration_ms" = NULL WHERE "job" = 'j' AND "slot" = 5000 AND "state" = 'failed' AND "attempts" = 1"#, "UPDATE `orionbeacon_job_runs` SET `state` = 'running', `attempts` = 2, `schedule` = 'every 1000ms', `claimed_token` = 7, `claimed_by` = 'node-1', `claimed_at` = UTC_TIMESTAMP(6), `finished_token` = NULL, `finished_at` = NULL, `duration_ms` = NULL WHERE `job` = 'j' AND `slot` = 5000 AND `state` = 'failed' AND `attempts` = 1", r#"UPDATE "orionbeacon_job_runs" SET "state" = 'running', "attempts" = 2, "schedule" = 'every 1000ms', "claimed_token" = 7, "claimed_by" = 'node-1', "claimed_at" = strftime('%Y-%m-%d %H:%M:%f', 'now'), "finished_token" = NULL, "finished_at" = NULL, "duration_ms" = NULL WHERE "job" = 'j' AND "slot" = 5000 AND "state" = 'failed' AND "attempts" = 1"#];
    const END: [&str; 3] = [r#"UPDATE "orionbeacon_job_runs" SET "state" = 'finished', "finished_token" = 7, "finished_at" = statement_timestamp(), "duration_ms" = 12, "error" = NULL WHERE "job" = 'j' AND "slot" = 5000 AND "state" = 'running' AND "attempts" = 2 AND "claimed_token" = 7"#, "UPDATE `orionbeacon_job_runs` SET `state` = 'finished', `finished_token` = 7, `finished_at` = UTC_TIMESTAMP(6), `duration_ms` = 12, `error` = NULL WHERE `job` = 'j' AND `slot` = 5000 AND `state` = 'running' AND `attempts` = 2 AND `claimed_token` = 7", r#"UPDATE "orionbeacon_job_runs" SET "state" = 'finished', "finished_token" = 7, "finished_at" = strftime('%Y-%m-%d %H:%M:%f', 'now'), "duration_ms" = 12, "error" = NULL WHERE "job" = 'j' AND "slot" = 5000 AND "state" = 'running' AND "attempts" = 2 AND "claimed_token" = 7"#];

    // The newest finish per job: the same statement on every backend (no backend-specific
    // part), with both conditions kept.
    #[test]
    fn last_finished_per_backend() {
        let q = last_finished(T, &["a".to_owned(), "b".to_owned()]);
        assert_eq!(
            q.to_string(PostgresQueryBuilder),
            r#"SELECT "job", MAX("finished_at") AS "last_finished" FROM "orionbeacon_job_runs" WHERE "job" IN ('a', 'b') AND "state" = 'finished' GROUP BY "job""#
        );
        assert_eq!(
            q.to_string(MysqlQueryBuilder),
            "SELECT `job`, MAX(`finished_at`) AS `last_finished` FROM `orionbeacon_job_runs` WHERE `job` IN ('a', 'b') AND `state` = 'finished' GROUP BY `job`"
        );
        assert_eq!(
            q.to_string(SqliteQueryBuilder),
            r#"SELECT "job", MAX("finished_at") AS "last_finished" FROM "orionbeacon_job_runs" WHERE "job" IN ('a', 'b') AND "state" = 'finished' GROUP BY "job""#
        );
    }

    // Pruning: this scheduler's names only, never a keyed job's records; the LIMIT in a
    // subquery (a derived table on MySQL); a name's newest record and newest finished one
    // excluded; only ended states, checked again outside the subquery.
    #[test]
    fn prune_per_backend() {
        let jobs = ["a".to_owned(), "b".to_owned()];
        let outer = r#"DELETE FROM "orionbeacon_job_runs" WHERE "job" IN ('a', 'b') AND "state" IN ('finished', 'skipped', 'given_up') AND "slot" < 5000 AND "schedule" <> 'keyed' AND ("job", "slot") IN "#;
        let old = r#"SELECT "r"."job", "r"."slot" FROM "orionbeacon_job_runs" AS "r" WHERE "r"."job" IN ('a', 'b') AND "r"."state" IN ('finished', 'skipped', 'given_up') AND "r"."slot" < 5000 AND "r"."schedule" <> 'keyed' AND "r"."slot" < (SELECT MAX("n"."slot") FROM "orionbeacon_job_runs" AS "n" WHERE "n"."job" = "r"."job" AND "n"."schedule" <> 'keyed') AND ("r"."state" <> 'finished' OR "r"."slot" < (SELECT MAX("f"."slot") FROM "orionbeacon_job_runs" AS "f" WHERE "f"."job" = "r"."job" AND "f"."state" = 'finished' AND "f"."schedule" <> 'keyed')) ORDER BY "r"."job" ASC, "r"."slot" ASC LIMIT 500"#;
        let expected = format!("{outer}({old})");
        assert_eq!(
            prune(DbBackend::Postgres, T, &jobs, 5000, 500).to_string(PostgresQueryBuilder),
            expected
        );
        assert_eq!(
            prune(DbBackend::Sqlite, T, &jobs, 5000, 500).to_string(SqliteQueryBuilder),
            expected
        );
        let mysql = |s: &str| s.replace('"', "`");
        assert_eq!(
            prune(DbBackend::MySql, T, &jobs, 5000, 500).to_string(MysqlQueryBuilder),
            format!(
                "{}(SELECT `d`.`job`, `d`.`slot` FROM ({}) AS `d`)",
                mysql(outer),
                mysql(old)
            )
        );
    }

    // Keys: the insert-if-absent of a submit, the keyed jobs' open records (the key last,
    // queued ones too, oldest claim or submit first) and their pruning by when they ended,
    // with every condition kept on each backend.
    #[test]
    fn key_statements_per_backend() {
        let pg = |b: DbBackend| match b {
            DbBackend::Postgres => 0,
            DbBackend::MySql => 1,
            _ => 2,
        };
        for backend in [DbBackend::Postgres, DbBackend::MySql, DbBackend::Sqlite] {
            let i = pg(backend);
            let submit = submit(backend, T, "j", 42, "tenant-1").unwrap();
            assert_eq!(submit.sql, SUBMIT[i], "{backend:?}");
            assert_eq!(
                submit.values.map(|v| v.0.len()),
                Some(6),
                "bound values: job, slot, state, attempts, schedule, key"
            );
            let open = queued_keys(T, "j");
            let before = chrono::DateTime::from_timestamp_millis(1_700_000_000_123).unwrap();
            let prune = prune_keyed(backend, T, &["j".to_owned()], before, 500);
            let (open, prune) = match backend {
                DbBackend::Postgres => (
                    open.to_string(PostgresQueryBuilder),
                    prune.to_string(PostgresQueryBuilder),
                ),
                DbBackend::MySql => (
                    open.to_string(MysqlQueryBuilder),
                    prune.to_string(MysqlQueryBuilder),
                ),
                _ => (
                    open.to_string(SqliteQueryBuilder),
                    prune.to_string(SqliteQueryBuilder),
                ),
            };
            let q = |s: &str| {
                if backend == DbBackend::MySql {
                    s.replace('"', "`")
                } else {
                    s.to_owned()
                }
            };
            assert_eq!(open, q(OPEN_KEYED), "{backend:?}");
            let at = if backend == DbBackend::Sqlite {
                "'2023-11-14 22:13:20.123'"
            } else {
                "'2023-11-14 22:13:20.123000 +00:00'"
            };
            let old = q(&PRUNE_KEYED_OLD.replace("AT", at));
            let chosen = if backend == DbBackend::MySql {
                format!("(SELECT `d`.`job`, `d`.`slot` FROM ({old}) AS `d`)")
            } else {
                format!("({old})")
            };
            assert_eq!(
                prune,
                format!("{}{chosen}", q(&PRUNE_KEYED_OUTER.replace("AT", at))),
                "{backend:?}"
            );
        }
    }

    const SUBMIT: [&str; 3] = [
        r#"INSERT INTO "orionbeacon_job_runs" ("job", "slot", "state", "attempts", "schedule", "claimed_at", "run_key") VALUES ($1, $2, $3, $4, $5, statement_timestamp(), $6) ON CONFLICT ("job", "slot") DO NOTHING"#,
        "INSERT IGNORE INTO `orionbeacon_job_runs` (`job`, `slot`, `state`, `attempts`, `schedule`, `claimed_at`, `run_key`) VALUES (?, ?, ?, ?, ?, UTC_TIMESTAMP(6), ?)",
        r#"INSERT INTO "orionbeacon_job_runs" ("job", "slot", "state", "attempts", "schedule", "claimed_at", "run_key") VALUES (?, ?, ?, ?, ?, strftime('%Y-%m-%d %H:%M:%f', 'now'), ?) ON CONFLICT ("job", "slot") DO NOTHING"#,
    ];
    const OPEN_KEYED: &str = r#"SELECT "job", "slot", "state", "attempts", "claimed_at", "claimed_token", "claimed_by", "orionbeacon_job_runs"."run_key" FROM "orionbeacon_job_runs" WHERE "job" IN ('j') AND "state" IN ('queued') AND "schedule" = 'keyed' ORDER BY "claimed_at" ASC, "slot" ASC LIMIT 1000"#;
    const PRUNE_KEYED_OUTER: &str = r#"DELETE FROM "orionbeacon_job_runs" WHERE "job" IN ('j') AND "state" IN ('finished', 'given_up') AND COALESCE("finished_at", "claimed_at") < AT AND ("job", "slot") IN "#;
    const PRUNE_KEYED_OLD: &str = r#"SELECT "r"."job", "r"."slot" FROM "orionbeacon_job_runs" AS "r" WHERE "r"."job" IN ('j') AND "r"."state" IN ('finished', 'given_up') AND COALESCE("r"."finished_at", "r"."claimed_at") < AT AND ("r"."state" <> 'finished' OR "r"."finished_at" < (SELECT MAX("f"."finished_at") FROM "orionbeacon_job_runs" AS "f" WHERE "f"."job" = "r"."job" AND "f"."state" = 'finished')) ORDER BY "r"."job" ASC, "r"."slot" ASC LIMIT 500"#;

    // A key's slot: the first 63 bits of its SHA-256, the same on every node and build.
    #[test]
    fn a_keys_slot_is_its_digest() {
        // `echo -n tenant-42 | sha256sum`: f71d3741b2bc6cc8..., its top bit cleared.
        assert_eq!(key_slot("tenant-42"), 0x771d_3741_b2bc_6cc8);
        assert_ne!(key_slot("tenant-42"), key_slot("tenant-43"));
        assert!(key_slot("") >= 0);
    }

    // A schedule's reads leave a keyed job's records out (a name keyed once, scheduled now):
    // a key's digest is no slot.
    #[test]
    fn slot_reads_leave_keys_out() {
        let jobs = ["a".to_owned()];
        assert_eq!(
            latest_slots(T, &jobs).to_string(PostgresQueryBuilder),
            r#"SELECT "job", MAX("slot") AS "latest" FROM "orionbeacon_job_runs" WHERE "job" IN ('a') AND "schedule" <> 'keyed' GROUP BY "job""#
        );
        assert_eq!(
            open_runs(T, &jobs).to_string(MysqlQueryBuilder),
            "SELECT `job`, `slot`, `state`, `attempts`, `claimed_at`, `claimed_token`, `claimed_by` FROM `orionbeacon_job_runs` WHERE `job` IN ('a') AND `state` IN ('running', 'claimed', 'failed', 'rerun') AND `schedule` <> 'keyed' ORDER BY `slot` ASC"
        );
    }

    // Spread runs: a runner's read of the claimed attempts (the key only when asked for, and
    // qualified) and its take (only of the attempt it read, still claimed), every condition
    // kept on each backend.
    #[test]
    fn spread_statements_per_backend() {
        let jobs = ["a".to_owned(), "b".to_owned()];
        let q = |backend: DbBackend, s: &str| {
            if backend == DbBackend::MySql {
                s.replace('"', "`")
            } else {
                s.to_owned()
            }
        };
        for backend in [DbBackend::Postgres, DbBackend::MySql, DbBackend::Sqlite] {
            let select = |stmt: SelectStatement| match backend {
                DbBackend::Postgres => stmt.to_string(PostgresQueryBuilder),
                DbBackend::MySql => stmt.to_string(MysqlQueryBuilder),
                _ => stmt.to_string(SqliteQueryBuilder),
            };
            let claimed_plain = select(claimed(T, &jobs, false, 8));
            let claimed_keyed = select(claimed(T, &jobs, true, 8));
            assert_eq!(claimed_plain, q(backend, CLAIMED), "{backend:?}");
            assert_eq!(
                claimed_keyed,
                q(
                    backend,
                    &CLAIMED.replace(
                        r#""claimed_at" FROM"#,
                        r#""claimed_at", "orionbeacon_job_runs"."run_key" FROM"#
                    )
                ),
                "{backend:?}"
            );
            let take = take(backend, T, "j", 5000, 2, (9, "node-2"));
            let take = match backend {
                DbBackend::Postgres => take.to_string(PostgresQueryBuilder),
                DbBackend::MySql => take.to_string(MysqlQueryBuilder),
                _ => take.to_string(SqliteQueryBuilder),
            };
            let now = match backend {
                DbBackend::Postgres => "statement_timestamp()",
                DbBackend::MySql => "UTC_TIMESTAMP(6)",
                _ => "strftime('%Y-%m-%d %H:%M:%f', 'now')",
            };
            assert_eq!(take, q(backend, &TAKE.replace("NOW", now)), "{backend:?}");
        }
    }

    const CLAIMED: &str = r#"SELECT "job", "slot", "attempts", "claimed_at" FROM "orionbeacon_job_runs" WHERE "job" IN ('a', 'b') AND "state" = 'claimed' ORDER BY "claimed_at" ASC, "job" ASC, "slot" ASC LIMIT 8"#;
    const TAKE: &str = r#"UPDATE "orionbeacon_job_runs" SET "state" = 'running', "claimed_token" = 9, "claimed_by" = 'node-2', "claimed_at" = NOW WHERE "job" = 'j' AND "slot" = 5000 AND "state" = 'claimed' AND "attempts" = 2"#;

    #[test]
    fn attempt_statements_per_backend() {
        let tables = ("runs", "runs_attempts");
        let failed = Open {
            slot: 5000,
            state: State::Failed,
            attempts: 2,
            claimed_at_ms: None,
        };
        const KEEP: &str = r#"INSERT INTO "runs_attempts" ("job", "slot", "attempt", "state", "claimed_token", "claimed_by", "claimed_at", "finished_token", "finished_at", "duration_ms", "error", "recorded_at") SELECT "job", "slot", "attempts", "state", "claimed_token", "claimed_by", "claimed_at", "finished_token", "finished_at", "duration_ms", (CASE WHEN ("finished_at" IS NULL) THEN NULL ELSE "error" END), NOW FROM "runs" WHERE "job" = 'j' AND "slot" = 5000 AND "state" = 'failed' AND "attempts" = 2LOCK CONFLICT"#;
        const UPSERT: &str = r#"ON CONFLICT ("job", "slot", "attempt") DO UPDATE SET "state" = "excluded"."state", "claimed_token" = "excluded"."claimed_token", "claimed_by" = "excluded"."claimed_by", "claimed_at" = "excluded"."claimed_at", "finished_token" = "excluded"."finished_token", "finished_at" = "excluded"."finished_at", "duration_ms" = "excluded"."duration_ms", "error" = "excluded"."error", "recorded_at" = "excluded"."recorded_at""#;
        const UPSERT_MYSQL: &str = r#"ON DUPLICATE KEY UPDATE "state" = VALUES("state"), "claimed_token" = VALUES("claimed_token"), "claimed_by" = VALUES("claimed_by"), "claimed_at" = VALUES("claimed_at"), "finished_token" = VALUES("finished_token"), "finished_at" = VALUES("finished_at"), "duration_ms" = VALUES("duration_ms"), "error" = VALUES("error"), "recorded_at" = VALUES("recorded_at")"#;
        const PRUNE: &str = r#"DELETE FROM "runs_attempts" WHERE "job" IN ('a') AND ("job", "slot", "attempt") IN (SELECT CHOSEN LIMIT 50)"#;
        const CHOSEN: &str = r#""a"."job", "a"."slot", "a"."attempt" FROM "runs_attempts" AS "a" WHERE "a"."job" IN ('a') AND (NOT EXISTS(SELECT 1 FROM "runs" AS "r" WHERE "r"."job" = "a"."job" AND "r"."slot" = "a"."slot" AND "r"."attempts" > "a"."attempt")) ORDER BY "a"."job" ASC, "a"."slot" ASC, "a"."attempt" ASC"#;
        for backend in [DbBackend::Postgres, DbBackend::MySql, DbBackend::Sqlite] {
            let keep = keep_attempt(backend, tables, "j", &failed).unwrap();
            let prune = prune_attempts(backend, tables, &["a".to_owned()], 50);
            let probe = attempts_probe(backend, tables);
            let (keep, prune, probe) = match backend {
                DbBackend::Postgres => (
                    keep.to_string(PostgresQueryBuilder),
                    prune.to_string(PostgresQueryBuilder),
                    probe.to_string(PostgresQueryBuilder),
                ),
                DbBackend::MySql => (
                    keep.to_string(MysqlQueryBuilder),
                    prune.to_string(MysqlQueryBuilder),
                    probe.to_string(MysqlQueryBuilder),
                ),
                _ => (
                    keep.to_string(SqliteQueryBuilder),
                    prune.to_string(SqliteQueryBuilder),
                    probe.to_string(SqliteQueryBuilder),
                ),
            };
            let (now, conflict, chosen) = match backend {
                DbBackend::Postgres => ("statement_timestamp()", UPSERT, CHOSEN.to_owned()),
                // The `LIMIT` in a derived table.
                DbBackend::MySql => (
                    "UTC_TIMESTAMP(6)",
                    UPSERT_MYSQL,
                    format!(r#""d"."job", "d"."slot", "d"."attempt" FROM (SELECT {CHOSEN}"#),
                ),
                _ => (
                    "strftime('%Y-%m-%d %H:%M:%f', 'now')",
                    UPSERT,
                    CHOSEN.to_owned(),
                ),
            };
            let q = |s: String| {
                if backend == DbBackend::MySql {
                    s.replace('"', "`")
                } else {
                    s
                }
            };
            let lock = if backend == DbBackend::Sqlite {
                ""
            } else {
                " FOR UPDATE"
            };
            let keep_want = KEEP
                .replace("NOW", now)
                .replace("LOCK", lock)
                .replace("CONFLICT", conflict);
            assert_eq!(keep, q(keep_want), "{backend:?}");
            let mut prune_want = PRUNE.replace("CHOSEN", &chosen);
            if backend == DbBackend::MySql {
                prune_want = prune_want.replace("LIMIT 50)", r#"LIMIT 50) AS "d")"#);
            }
            assert_eq!(prune, q(prune_want), "{backend:?}");
            // The probe: the copy of no row.
            let probe_want = KEEP
                .replace(
                    r#""job" = 'j' AND "slot" = 5000 AND "state" = 'failed' AND "attempts" = 2LOCK"#,
                    &format!("1 = 0{lock}"),
                )
                .replace("NOW", now)
                .replace("CONFLICT", conflict);
            assert_eq!(probe, q(probe_want), "{backend:?}");
        }
        // Nothing to keep: a start claimed but never taken, a key still queued, no attempt.
        for (state, attempts) in [(State::Claimed, 1), (State::Queued, 0), (State::Rerun, 0)] {
            let prior = Open {
                slot: 1,
                state,
                attempts,
                claimed_at_ms: None,
            };
            assert!(keep_attempt(DbBackend::Postgres, tables, "j", &prior).is_none());
        }
    }

    #[test]
    fn errors_are_cut_on_a_character_boundary() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("héllo", 3), "hé");
        assert_eq!(truncate("abc", 10), "abc");
    }
}
