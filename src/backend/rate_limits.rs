//! The rate-limit table on the SeaORM backends: one conditional upsert per decision.
//!
//! `INSERT ... ON CONFLICT (limit_key) DO UPDATE` (MySQL's `ON DUPLICATE KEY UPDATE`) with
//! every assignment a `CASE` on the key's stored TAT as it was before the statement, judged at
//! the database's now (the statement's start, in whole microseconds): the row decides the
//! permit atomically, whoever else asks at the same moment. `granted` and `decided_us` record
//! the decision in the row itself, with `decision_id`, a random number of the caller's, so the
//! row the statement leaves is the whole answer and is known to be this caller's: returned by
//! the statement (`RETURNING`: PostgreSQL, SQLite, MariaDB) or read back in the same
//! transaction (MySQL), and reported only once committed. `tat_us` is assigned last: MySQL
//! assigns in order, and every other assignment must read the old TAT.

use async_trait::async_trait;
use orion_beacon_entity::rate_limit::Column;
use sea_orm::sea_query::{
    Alias, Expr, ExprTrait, InsertStatement, OnConflict, Query, ReturningClause, SelectStatement,
};
use sea_orm::{DbErr, QueryResult, Statement};

use super::context::Context;
use super::dialect::Dialect;
use super::store::SeaOrmLeaseStore;
use crate::error::StoreError;
use crate::rate_limit::{outcome, validate_key, Quota, RateLimitStore, RateOutcome};

/// One decision to make: a backend renders the statements its form sends.
pub(crate) struct RateDecision<'a> {
    table: Alias,
    key: &'a str,
    quota: &'a Quota,
    /// This caller's number, written into the row with its decision.
    pub(crate) id: i64,
}

#[allow(dead_code)] // which forms a build renders depends on the backends it compiles
impl<'a> RateDecision<'a> {
    /// The decision for `key` under `quota` on the store's rate-limit table.
    pub(crate) fn new(cx: &Context, key: &'a str, quota: &'a Quota) -> Self {
        Self {
            table: Alias::new(&*cx.rate_table),
            key,
            quota,
            id: crate::rate_limit::decision_id(),
        }
    }

    /// The upsert with `RETURNING` (PostgreSQL, SQLite).
    pub(crate) fn returning(&self, cx: &Context) -> Result<Statement, StoreError> {
        upsert_returning(cx.dialect, &self.table, self.key, self.quota, self.id)
            .map(|s| cx.build(&s))
            .map_err(|e| StoreError::Database(e.into()))
    }

    /// The upsert alone, for a transaction that reads the row back ([`read`](Self::read)).
    pub(crate) fn upsert(&self, cx: &Context) -> Result<Statement, StoreError> {
        upsert(cx.dialect, &self.table, self.key, self.quota, self.id)
            .map(|s| cx.build(&s))
            .map_err(|e| StoreError::Database(e.into()))
    }

    /// The key.
    pub(crate) fn key(&self) -> &str {
        self.key
    }

    /// The read of the row the upsert left.
    pub(crate) fn read(&self, cx: &Context) -> Statement {
        cx.build(&read(&self.table, self.key))
    }

    /// MariaDB's form: the upsert with a `RETURNING` clause (which sea-query's MySQL builder
    /// would drop, so it is rendered as a select list and appended), ending in whether the
    /// statement ran inside a transaction ([`MARIADB_IN_TRANSACTION_COLUMN`]; see `sessions`).
    /// It waits for the row's lock at most a second.
    #[cfg(feature = "mysql")]
    pub(crate) fn mariadb_returning(&self) -> Result<Statement, StoreError> {
        use sea_orm::sea_query::MysqlQueryBuilder;
        let failed = |e: DbErr| StoreError::Database(e.into());
        let (upsert, values) = upsert(
            &super::mysql::MySql,
            &self.table,
            self.key,
            self.quota,
            self.id,
        )
        .map_err(failed)?
        .build(MysqlQueryBuilder);
        let list = Query::select().exprs(answer()).to_string(MysqlQueryBuilder);
        let list = list
            .strip_prefix("SELECT ")
            .ok_or_else(|| failed(DbErr::Custom(format!("unexpected select list: {list}"))))?;
        let sql = format!(
            "SET STATEMENT innodb_lock_wait_timeout = {} FOR {upsert} RETURNING {list}, {}",
            super::mysql::statements::LOCK_WAIT_SECONDS,
            super::mysql::statements::IN_TRANSACTION,
        );
        Ok(Statement::from_sql_and_values(
            sea_orm::DbBackend::MySql,
            sql,
            values,
        ))
    }
}

/// The column of [`RateDecision::mariadb_returning`]'s `@@in_transaction`.
#[cfg(feature = "mysql")]
pub(crate) const MARIADB_IN_TRANSACTION_COLUMN: usize = 5;

/// What a decision returns, in this order: whether it granted, the key's permits, the TAT's
/// lead on the decision's now (µs), that now (µs since the epoch), the decision's number.
fn answer() -> [Expr; 5] {
    [
        Expr::col(Column::Granted),
        Expr::col(Column::Permits),
        Expr::col(Column::TatUs).sub(Expr::col(Column::DecidedUs)),
        Expr::col(Column::DecidedUs),
        Expr::col(Column::DecisionId),
    ]
}

/// The conditional upsert of `key`'s row under `quota`, by the caller numbered `id`.
pub(crate) fn upsert(
    d: &dyn Dialect,
    table: &Alias,
    key: &str,
    quota: &Quota,
    id: i64,
) -> Result<InsertStatement, DbErr> {
    let old = |c: Column| Expr::col((table.clone(), c));
    let emission = quota.emission_us();
    // The permit is due: the stored TAT at most the burst's span ahead of now.
    let due = || old(Column::TatUs).lte(d.now_micros().add(quota.tolerance_us()));
    let on_conflict = OnConflict::column(Column::LimitKey)
        .values([
            (Column::Granted, due()),
            (
                Column::Permits,
                Expr::case(due(), old(Column::Permits).add(1i64))
                    .finally(old(Column::Permits))
                    .into(),
            ),
            (Column::DecidedUs, d.now_micros()),
            (Column::DecisionId, Expr::val(id)),
            (
                Column::TatUs,
                Expr::case(
                    due(),
                    d.greatest(old(Column::TatUs), d.now_micros()).add(emission),
                )
                .finally(old(Column::TatUs))
                .into(),
            ),
        ])
        .to_owned();
    let mut stmt = Query::insert();
    stmt.into_table(table.clone())
        .columns([
            Column::LimitKey,
            Column::TatUs,
            Column::Permits,
            Column::Granted,
            Column::DecidedUs,
            Column::DecisionId,
        ])
        .values([
            Expr::val(key),
            d.now_micros().add(emission),
            Expr::val(1i64),
            Expr::val(true),
            d.now_micros(),
            Expr::val(id),
        ])
        .map_err(|e| DbErr::Custom(e.to_string()))?
        .on_conflict(on_conflict);
    Ok(stmt)
}

/// [`upsert`] returning the row it left ([`answer`]).
pub(crate) fn upsert_returning(
    d: &dyn Dialect,
    table: &Alias,
    key: &str,
    quota: &Quota,
    id: i64,
) -> Result<InsertStatement, DbErr> {
    let mut stmt = upsert(d, table, key, quota, id)?;
    stmt.returning(ReturningClause::Exprs(answer().into()));
    Ok(stmt)
}

/// The read of `key`'s row ([`answer`]), in the upsert's transaction.
pub(crate) fn read(table: &Alias, key: &str) -> SelectStatement {
    Query::select()
        .exprs(answer())
        .from(table.clone())
        .and_where(Expr::col(Column::LimitKey).eq(key))
        .to_owned()
}

/// A decision's row: granted, permits, lead (µs), now (µs), the decision's number.
pub(crate) fn decode(row: &QueryResult) -> Result<(bool, i64, i64, i64, i64), DbErr> {
    Ok((
        row.try_get_by_index(0)?,
        row.try_get_by_index(1)?,
        row.try_get_by_index(2)?,
        row.try_get_by_index(3)?,
        row.try_get_by_index(4)?,
    ))
}

/// The error for a row that is not this caller's decision: another caller's, read because
/// this one's transaction was rolled back under it (a Galera brute-force abort). No permit,
/// and retryable.
pub(crate) fn not_ours(key: &str) -> StoreError {
    tracing::warn!(
        key,
        "the rate-limit row read back is another caller's decision (this one's transaction was \
         rolled back under it?); no permit"
    );
    StoreError::Conflict {
        source: DbErr::Custom(format!(
            "the rate-limit row of {key:?} read back is another caller's decision: this \
             decision's transaction was rolled back under it (a Galera brute-force abort?)"
        ))
        .into(),
    }
}

impl SeaOrmLeaseStore {
    /// `err` of a rate-limit statement: a missing table is the rate-limit table.
    fn rate_table_error(&self, err: StoreError) -> StoreError {
        match err {
            StoreError::MissingTable { source, .. } => StoreError::MissingTable {
                table: self.rate_limit_table().to_string(),
                source,
            },
            other => other,
        }
    }
}

#[async_trait]
impl RateLimitStore for SeaOrmLeaseStore {
    async fn take_permit(&self, key: &str, quota: &Quota) -> Result<RateOutcome, StoreError> {
        validate_key(key)?;
        let engine = self.engine()?;
        let cx = &engine.cx;
        let decision = RateDecision::new(cx, key, quota);
        let rows = engine
            .backend
            .rate_decision(cx, &decision)
            .await
            .map_err(|e| self.rate_table_error(e))?;
        // Several rows: a Galera node re-ran the statement after a failed certification
        // (`wsrep_retry_autocommit`) and sent the rows of every attempt, the committed one
        // last. Read to its end without an error, the statement committed; every row carrying
        // this caller's number, the last is its decision.
        let mut decided = None;
        for row in &rows {
            let answer = decode(row).map_err(|source| StoreError::Decode {
                table: self.rate_limit_table().to_string(),
                source,
            })?;
            if answer.4 != decision.id {
                return Err(not_ours(key));
            }
            decided = Some(answer);
        }
        let Some((granted, permits, ahead, now, _)) = decided else {
            // The upsert always leaves the row, and its transaction reads its own write.
            return Err(StoreError::Conflict {
                source: DbErr::RecordNotFound(format!(
                    "the rate-limit row of {key:?}, in its own transaction (rolled back under it)"
                ))
                .into(),
            });
        };
        if rows.len() > 1 {
            tracing::debug!(
                key,
                rows = rows.len(),
                "a rate-limit decision re-run by the server"
            );
        }
        outcome(key, quota, granted, permits, ahead, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{mysql::MySql, postgres::Postgres, sqlite::Sqlite};
    use sea_orm::sea_query::{MysqlQueryBuilder, PostgresQueryBuilder, SqliteQueryBuilder};
    use std::time::Duration;

    fn table() -> Alias {
        Alias::new("orionbeacon_rate_limits")
    }

    fn quota() -> Quota {
        Quota::per(Duration::from_secs(1), 10)
            .and_then(|q| q.with_burst(3))
            .unwrap()
    }

    // sea-query drops clauses a backend lacks without a word: pin the exact SQL.
    #[test]
    fn a_decision_is_one_conditional_upsert_per_backend() {
        let (sql, values) = upsert_returning(&Postgres, &table(), "api", &quota(), 7)
            .unwrap()
            .build(PostgresQueryBuilder);
        let now = "CAST(EXTRACT(EPOCH FROM statement_timestamp()) * 1000000 AS BIGINT)";
        let t = r#""orionbeacon_rate_limits""#;
        assert_eq!(
            sql,
            format!(
                r#"INSERT INTO {t} ("limit_key", "tat_us", "permits", "granted", "decided_us", "decision_id") VALUES ($1, ({now}) + $2, $3, $4, {now}, $5) ON CONFLICT ("limit_key") DO UPDATE SET "granted" = {t}."tat_us" <= ({now}) + $6, "permits" = (CASE WHEN ({t}."tat_us" <= ({now}) + $7) THEN {t}."permits" + $8 ELSE {t}."permits" END), "decided_us" = {now}, "decision_id" = $9, "tat_us" = (CASE WHEN ({t}."tat_us" <= ({now}) + $10) THEN GREATEST({t}."tat_us", {now}) + $11 ELSE {t}."tat_us" END) RETURNING "granted", "permits", "tat_us" - "decided_us", "decided_us", "decision_id""#
            )
        );
        // The key, the spacing (100 ms), the burst's span (200 ms), the caller's number, all
        // bound.
        assert_eq!(values.0[0], "api".into());
        assert_eq!(values.0[1], 100_000i64.into());
        assert_eq!(values.0[4], 7i64.into());
        assert_eq!(values.0[5], 200_000i64.into());
        assert_eq!(values.0[8], 7i64.into());
        assert_eq!(values.0[10], 100_000i64.into());

        let (sql, _) = upsert_returning(&Sqlite, &table(), "api", &quota(), 7)
            .unwrap()
            .build(SqliteQueryBuilder);
        let now = "CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER) * 1000";
        assert_eq!(
            sql,
            format!(
                r#"INSERT INTO {t} ("limit_key", "tat_us", "permits", "granted", "decided_us", "decision_id") VALUES (?, ({now}) + ?, ?, ?, {now}, ?) ON CONFLICT ("limit_key") DO UPDATE SET "granted" = {t}."tat_us" <= ({now}) + ?, "permits" = (CASE WHEN ({t}."tat_us" <= ({now}) + ?) THEN {t}."permits" + ? ELSE {t}."permits" END), "decided_us" = {now}, "decision_id" = ?, "tat_us" = (CASE WHEN ({t}."tat_us" <= ({now}) + ?) THEN MAX({t}."tat_us", {now}) + ? ELSE {t}."tat_us" END) RETURNING "granted", "permits", "tat_us" - "decided_us", "decided_us", "decision_id""#
            )
        );

        let (sql, _) = upsert(&MySql, &table(), "api", &quota(), 7)
            .unwrap()
            .build(MysqlQueryBuilder);
        let now = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))";
        let t = "`orionbeacon_rate_limits`";
        let mysql_upsert = format!(
            r#"INSERT INTO {t} (`limit_key`, `tat_us`, `permits`, `granted`, `decided_us`, `decision_id`) VALUES (?, ({now}) + ?, ?, ?, {now}, ?) ON DUPLICATE KEY UPDATE `granted` = {t}.`tat_us` <= ({now}) + ?, `permits` = (CASE WHEN ({t}.`tat_us` <= ({now}) + ?) THEN {t}.`permits` + ? ELSE {t}.`permits` END), `decided_us` = {now}, `decision_id` = ?, `tat_us` = (CASE WHEN ({t}.`tat_us` <= ({now}) + ?) THEN GREATEST({t}.`tat_us`, {now}) + ? ELSE {t}.`tat_us` END)"#
        );
        assert_eq!(sql, mysql_upsert);
        let (sql, values) = read(&table(), "api").build(MysqlQueryBuilder);
        assert_eq!(
            sql,
            "SELECT `granted`, `permits`, `tat_us` - `decided_us`, `decided_us`, `decision_id` FROM `orionbeacon_rate_limits` WHERE `limit_key` = ?"
        );
        assert_eq!(values.0.len(), 1);

        // MariaDB: the same upsert, its lock wait bounded, with RETURNING and whether it ran
        // inside a transaction.
        let decision = RateDecision {
            table: table(),
            key: "api",
            quota: &quota(),
            id: 7,
        };
        let stmt = decision.mariadb_returning().unwrap();
        assert_eq!(
            stmt.sql,
            format!(
                "SET STATEMENT innodb_lock_wait_timeout = 1 FOR {mysql_upsert} RETURNING `granted`, `permits`, `tat_us` - `decided_us`, `decided_us`, `decision_id`, CAST(@@in_transaction AS SIGNED)"
            )
        );
        assert_eq!(stmt.values.map(|v| v.0.len()), Some(11));
    }
}
