//! The lease statements every backend shares, built with sea-query, and the decoding of the
//! rows they return. What only one backend sends lives in that backend's `statements`.

use std::time::Duration;

use chrono::{DateTime, Utc};
use orion_beacon_entity::lease::Column;
use sea_orm::sea_query::{
    Alias, BinOper, Expr, ExprTrait, InsertStatement, OnConflict, Query, SelectStatement,
    UpdateStatement,
};
use sea_orm::{DbErr, QueryResult};

use super::dialect::Dialect;
use crate::fencing::Term;
use crate::{Denial, FencingToken, Lease, LeaseOutcome, LeaseRecord};

/// The columns every lease statement returns, in this order; `remaining_millis` follows.
const ROW: [Column; 5] = [
    Column::Holder,
    Column::FencingToken,
    Column::ExpiresAt,
    Column::AcquiredAt,
    Column::RenewedAt,
];

/// The one-statement acquire-or-renew for backends with `ON CONFLICT ... DO UPDATE ... WHERE`
/// and `RETURNING` (PostgreSQL, SQLite).
///
/// - no row: insert with token 1;
/// - row expired (whoever held it): new term, token + 1, `acquired_at = renewed_at = now`;
/// - row live and held by the candidate: renew, token and `acquired_at` kept, and
///   `renewed_at = greatest(now, acquired_at + 1 tick)`, so `acquired_at = renewed_at` holds
///   exactly for new terms and tells `Acquired` from `Renewed` without a second read;
/// - row live and held by another: the `WHERE` is false, nothing changes, no row returns.
///
/// The expiry is [`next_expiry`] in every case: a renew never ends at or before the write it
/// replaces. All `SET` expressions read the row as it was before the statement.
pub(crate) fn upsert(
    d: &dyn Dialect,
    table: &Alias,
    resource: &str,
    candidate: &str,
    millis: i64,
) -> Result<InsertStatement, DbErr> {
    let stmt = insert_new_row(d, table, resource, candidate, millis)?;
    Ok(upsert_onto(d, table, candidate, millis, stmt))
}

/// The conflict clause and `RETURNING` of [`upsert`], onto `stmt`, an insert of the fresh row
/// (from [`insert_new_row`], or a `SELECT` of [`new_row`]).
pub(crate) fn upsert_onto(
    d: &dyn Dialect,
    table: &Alias,
    candidate: &str,
    millis: i64,
    mut stmt: InsertStatement,
) -> InsertStatement {
    let old = |c: Column| Expr::col((table.clone(), c));
    let expired = old(Column::ExpiresAt).lte(d.now());
    let mine = old(Column::Holder).eq(candidate);
    let on_conflict = OnConflict::column(Column::Resource)
        .values([
            (
                Column::FencingToken,
                Expr::case(expired.clone(), old(Column::FencingToken).add(1))
                    .finally(old(Column::FencingToken))
                    .into(),
            ),
            (
                Column::AcquiredAt,
                Expr::case(expired.clone(), d.now())
                    .finally(old(Column::AcquiredAt))
                    .into(),
            ),
            (
                Column::RenewedAt,
                Expr::case(expired.clone(), d.now())
                    .finally(d.greatest(d.now(), d.one_tick_after(old(Column::AcquiredAt))))
                    .into(),
            ),
            (Column::Holder, Expr::val(candidate)),
            (
                Column::ExpiresAt,
                next_expiry(d, old(Column::ExpiresAt), millis),
            ),
        ])
        .action_and_where(mine.or(expired))
        .to_owned();
    stmt.on_conflict(on_conflict)
        .returning(Query::returning().exprs(returned_row(d)));
    stmt
}

/// The expiry of a write to a lease row whose expiry was `old`: a whole lease from the write,
/// and at least one tick (the column's resolution, see [`Dialect::one_tick_after`]) after
/// `old`.
///
/// A write is named by its holder, token and expiry (`release_write`). Within a term the
/// expiry only grows, one tick at least per write, so no two writes of a term share a name:
/// not two renews in the same tick of the clock (SQLite stores milliseconds), not a renew
/// asking for a shorter lease, not a renew by another process on a clock behind (another
/// Galera node). A release or revoke moves the expiry back, but ends the term: a row is
/// renewed only while live, and a new term has a higher token. For a new term the old expiry
/// has passed, so the lease from the write is the later one and this is plain `lease_end`.
pub(crate) fn next_expiry(d: &dyn Dialect, old: Expr, millis: i64) -> Expr {
    d.greatest(d.lease_end(millis), d.one_tick_after(old))
}

/// `INSERT` of a fresh lease row (token 1, times from the database clock), the part every
/// backend's upsert shares; each adds its own conflict clause.
pub(crate) fn insert_new_row(
    d: &dyn Dialect,
    table: &Alias,
    resource: &str,
    candidate: &str,
    millis: i64,
) -> Result<InsertStatement, DbErr> {
    let mut stmt = Query::insert();
    stmt.into_table(table.clone())
        .columns(NEW_ROW)
        .values(new_row(d, resource, candidate, millis))
        .map_err(|e| DbErr::Custom(e.to_string()))?;
    Ok(stmt)
}

/// The columns of a fresh lease row, in the order of [`new_row`].
pub(crate) const NEW_ROW: [Column; 6] = [
    Column::Resource,
    Column::Holder,
    Column::FencingToken,
    Column::ExpiresAt,
    Column::AcquiredAt,
    Column::RenewedAt,
];

/// A fresh lease row's values: token 1, times from the database clock.
pub(crate) fn new_row(d: &dyn Dialect, resource: &str, candidate: &str, millis: i64) -> [Expr; 6] {
    [
        Expr::val(resource),
        Expr::val(candidate),
        Expr::val(1i64),
        d.lease_end(millis),
        d.now(),
        d.now(),
    ]
}

/// The row columns plus the remaining lease time, for `RETURNING` and `SELECT`.
pub(crate) fn returned_row(d: &dyn Dialect) -> Vec<Expr> {
    let mut exprs: Vec<Expr> = ROW.iter().map(|c| Expr::col(*c)).collect();
    exprs.push(d.remaining_millis(Expr::col(Column::ExpiresAt)));
    exprs
}

/// The expiry a release or a revoke leaves behind: the term's last renew (`renewed_at`, never
/// later than the database's now), not plain now.
///
/// Liveness is judged at a statement's *start*. A renew sent just before the release (say one
/// the elector gave up waiting for) that then waited for the row lock started before the
/// release's now, would still see the lease as live and extend the same term, undoing the
/// release. Every renew of the holder starts after its previous renew, which set `renewed_at`,
/// so with the expiry there each of them sees the lease ended (and at most starts a new term,
/// with a higher token).
pub(crate) fn tombstone(d: &dyn Dialect) -> Expr {
    Expr::case(
        Expr::col(Column::RenewedAt).lt(d.now()),
        Expr::col(Column::RenewedAt),
    )
    .finally(d.now())
    .into()
}

/// The guarded release: a [`tombstone`] only for the live lease of `candidate`.
pub(crate) fn release(
    d: &dyn Dialect,
    table: &Alias,
    resource: &str,
    candidate: &str,
) -> UpdateStatement {
    Query::update()
        .table(table.clone())
        .value(Column::ExpiresAt, tombstone(d))
        .and_where(Expr::col(Column::Resource).eq(resource))
        .and_where(Expr::col(Column::Holder).eq(candidate))
        .and_where(Expr::col(Column::ExpiresAt).gt(d.now()))
        .to_owned()
}

/// The release of one exact write: [`release`] of `lease`'s holder, only while the row still
/// carries `lease`'s token and expiry (no renew or new term since: every write of a term has
/// an expiry of its own, see [`next_expiry`]). A lease without a stored expiry names no write:
/// `None`.
pub(crate) fn release_write(
    d: &dyn Dialect,
    table: &Alias,
    lease: &Lease,
) -> Option<UpdateStatement> {
    let expires_at = lease.expires_at?;
    Some(
        release(d, table, &lease.resource, &lease.holder)
            .and_where(Expr::col(Column::FencingToken).eq(lease.token.get()))
            .and_where(Expr::col(Column::ExpiresAt).eq(d.stored_time(expires_at)))
            .to_owned(),
    )
}

/// The stored row of `resource` with its remaining time (negative once expired).
pub(crate) fn current(d: &dyn Dialect, table: &Alias, resource: &str) -> SelectStatement {
    Query::select()
        .exprs(returned_row(d))
        .from(table.clone())
        .and_where(Expr::col(Column::Resource).eq(resource))
        .to_owned()
}

/// The batch renew: every lease in `held` (rows of resource, holder and token, in each
/// backend's form of a table from one bound JSON document, see [`held_json`]) whose row still
/// has that holder and token and is live by the database clock gets a whole lease from the
/// write (at least one tick past its expiry, see [`next_expiry`]), and `renewed_at` as a renew
/// sets it. Nothing else changes: no term starts, and a row whose term ended is left alone.
pub(crate) fn renew_held(
    d: &dyn Dialect,
    table: &Alias,
    held: Expr,
    millis: i64,
) -> UpdateStatement {
    renew_set(d, table, millis)
        .and_where(held_rows(d, table, held))
        .to_owned()
}

/// The assignments of a renew, without a condition: a whole lease from the write, at least
/// one tick after the expiry it replaces ([`next_expiry`]), and `renewed_at` as a renew sets
/// it.
pub(crate) fn renew_set(d: &dyn Dialect, table: &Alias, millis: i64) -> UpdateStatement {
    Query::update()
        .table(table.clone())
        .value(
            Column::ExpiresAt,
            next_expiry(d, Expr::col(Column::ExpiresAt), millis),
        )
        .value(
            Column::RenewedAt,
            d.greatest(d.now(), d.one_tick_after(Expr::col(Column::AcquiredAt))),
        )
        .to_owned()
}

/// The rows of `held` that are live: the condition of [`renew_held`], and of the read that
/// reports its result where `UPDATE` has no `RETURNING`.
pub(crate) fn held_rows(d: &dyn Dialect, table: &Alias, held: Expr) -> Expr {
    let key = Expr::tuple([
        Expr::col((table.clone(), Column::Resource)),
        Expr::col((table.clone(), Column::Holder)),
        Expr::col((table.clone(), Column::FencingToken)),
    ]);
    key.binary(BinOper::In, held)
        .and(Expr::col((table.clone(), Column::ExpiresAt)).gt(d.now()))
}

/// The columns a batch renew returns per renewed row: the lease row, then the resource.
pub(crate) fn renewed_row(d: &dyn Dialect) -> Vec<Expr> {
    let mut exprs = returned_row(d);
    exprs.push(Expr::col(Column::Resource));
    exprs
}

/// The leases of a batch as one JSON document, bound as a single parameter:
/// `[{"r": resource, "h": holder, "t": token}, ...]`.
pub(crate) fn held_json(held: &[Lease]) -> String {
    let rows: Vec<serde_json::Value> = held
        .iter()
        .map(|l| serde_json::json!({"r": l.resource, "h": l.holder, "t": l.token.get()}))
        .collect();
    serde_json::Value::Array(rows).to_string()
}

/// The leases in rows of [`renewed_row`]; a row that is not live (a lease shorter than the
/// database's rounding) renews nothing.
pub(crate) fn renewed_leases(rows: &[QueryResult]) -> Result<Vec<Lease>, DbErr> {
    let mut leases = Vec::with_capacity(rows.len());
    for r in rows {
        let row = Row::decode(r)?;
        let resource: String = r.try_get_by_index(6)?;
        leases.extend(row.live_lease(resource));
    }
    Ok(leases)
}

/// A decoded lease row.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub holder: String,
    pub token: i64,
    pub expires_at: DateTime<Utc>,
    pub acquired_at: DateTime<Utc>,
    pub renewed_at: DateTime<Utc>,
    pub remaining_millis: i64,
}

impl Row {
    pub(crate) fn decode(row: &QueryResult) -> Result<Self, DbErr> {
        Ok(Self {
            holder: row.try_get_by_index(0)?,
            token: row.try_get_by_index(1)?,
            expires_at: row.try_get_by_index(2)?,
            acquired_at: row.try_get_by_index(3)?,
            renewed_at: row.try_get_by_index(4)?,
            remaining_millis: row.try_get_by_index(5)?,
        })
    }

    /// Liveness by the database clock: the expiry is still ahead of the database's now.
    pub(crate) fn live(&self) -> bool {
        self.remaining_millis > 0
    }

    fn remaining(&self) -> Duration {
        Duration::from_millis(u64::try_from(self.remaining_millis).unwrap_or(0))
    }

    /// The lease this row is for its holder, if it is live (a renewed row of a batch).
    pub(crate) fn live_lease(self, resource: String) -> Option<Lease> {
        self.live().then(|| Lease {
            resource,
            token: FencingToken::new(self.token),
            remaining: self.remaining(),
            expires_at: Some(self.expires_at),
            acquired_at: Some(self.acquired_at),
            holder: self.holder,
        })
    }

    /// The outcome this row means for `candidate`, when it is the row after the upsert.
    pub(crate) fn outcome(self, resource: &str, candidate: &str) -> LeaseOutcome {
        if self.holder != candidate {
            return LeaseOutcome::Denied(self.denial(resource));
        }
        if !self.live() {
            // The row names us but is not live by the database clock: whatever wrote it, it is
            // no lease to lead on (a correct statement never leaves this behind).
            tracing::warn!(
                resource,
                token = self.token,
                remaining_ms = self.remaining_millis,
                "the lease row names this candidate but is not live; not a grant"
            );
            return LeaseOutcome::Denied(self.denial_for(resource, candidate));
        }
        let new_term = self.acquired_at == self.renewed_at;
        let lease = Lease {
            resource: resource.to_owned(),
            token: FencingToken::new(self.token),
            remaining: self.remaining(),
            expires_at: Some(self.expires_at),
            acquired_at: Some(self.acquired_at),
            holder: self.holder,
        };
        if new_term {
            LeaseOutcome::Acquired(lease)
        } else {
            LeaseOutcome::Renewed(lease)
        }
    }

    pub(crate) fn denial(self, resource: &str) -> Denial {
        Denial {
            resource: resource.to_owned(),
            token: Some(FencingToken::new(self.token)),
            remaining: self.remaining(),
            expires_at: Some(self.expires_at),
            holder: Some(self.holder),
        }
    }

    /// The denial report for `candidate`: never names the candidate itself as the holder (a
    /// stale snapshot or an expired row of its own can), since it would then follow itself.
    pub(crate) fn denial_for(self, resource: &str, candidate: &str) -> Denial {
        let mut denial = self.denial(resource);
        if denial.holder.as_deref() == Some(candidate) {
            denial.holder = None;
            denial.remaining = Duration::ZERO;
        }
        denial
    }

    pub(crate) fn record(self, resource: &str) -> LeaseRecord {
        LeaseRecord {
            resource: resource.to_owned(),
            live: self.live(),
            token: FencingToken::new(self.token),
            remaining: self.remaining(),
            expires_at: Some(self.expires_at),
            acquired_at: Some(self.acquired_at),
            renewed_at: Some(self.renewed_at),
            holder: self.holder,
        }
    }
}

impl Term<'_> {
    /// The lease row is this term's and live by the database clock.
    pub(crate) fn current(&self, d: &dyn Dialect) -> Expr {
        Expr::col(Column::Resource)
            .eq(self.resource)
            .and(Expr::col(Column::Holder).eq(self.holder))
            .and(Expr::col(Column::FencingToken).eq(self.token.get()))
            .and(Expr::col(Column::ExpiresAt).gt(d.now()))
    }
}

/// `SELECT 1 FROM leases WHERE <term is current> FOR SHARE` (the lock phrase per backend; SQLite
/// has none and serializes writers instead).
pub(crate) fn share_locked_check(
    d: &dyn Dialect,
    table: &Alias,
    term: &Term<'_>,
) -> SelectStatement {
    Query::select()
        .expr(Expr::val(1))
        .from(table.clone())
        .and_where(term.current(d))
        .lock_shared()
        .to_owned()
}

/// The subquery of the statement-level fence: [`share_locked_check`], except where the
/// backend has no row locks (SQLite: one statement runs under the write lock already).
pub(crate) fn statement_check(d: &dyn Dialect, table: &Alias, term: &Term<'_>) -> SelectStatement {
    if d.locks_rows() {
        return share_locked_check(d, table, term);
    }
    current_check(d, table, term)
}

/// `SELECT 1 FROM leases WHERE <term is current>`, without a lock: whether a term is current.
pub(crate) fn current_check(d: &dyn Dialect, table: &Alias, term: &Term<'_>) -> SelectStatement {
    Query::select()
        .expr(Expr::val(1))
        .from(table.clone())
        .and_where(term.current(d))
        .to_owned()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The term the statement tests of every backend fence with.
    pub(crate) fn term() -> Term<'static> {
        Term {
            resource: "r",
            holder: "me",
            token: FencingToken::new(7),
        }
    }

    use crate::backend::{postgres::Postgres, sqlite::Sqlite};
    use sea_orm::sea_query::{MysqlQueryBuilder, PostgresQueryBuilder, SqliteQueryBuilder};

    fn table() -> Alias {
        Alias::new("orionbeacon_leases")
    }

    // sea-query drops clauses a backend lacks without a word: pin the exact SQL.
    #[test]
    fn postgres_upsert_is_one_conditional_statement() {
        let (sql, values) = upsert(&Postgres, &table(), "r", "me", 1500)
            .unwrap()
            .build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            concat!(
                r#"INSERT INTO "orionbeacon_leases" ("resource", "holder", "fencing_token", "expires_at", "acquired_at", "renewed_at") "#,
                r#"VALUES ($1, $2, $3, clock_timestamp() + $4 * INTERVAL '1 millisecond', statement_timestamp(), statement_timestamp()) "#,
                r#"ON CONFLICT ("resource") DO UPDATE SET "#,
                r#""fencing_token" = (CASE WHEN ("orionbeacon_leases"."expires_at" <= (statement_timestamp())) THEN "orionbeacon_leases"."fencing_token" + $5 ELSE "orionbeacon_leases"."fencing_token" END), "#,
                r#""acquired_at" = (CASE WHEN ("orionbeacon_leases"."expires_at" <= (statement_timestamp())) THEN statement_timestamp() ELSE "orionbeacon_leases"."acquired_at" END), "#,
                r#""renewed_at" = (CASE WHEN ("orionbeacon_leases"."expires_at" <= (statement_timestamp())) THEN statement_timestamp() ELSE GREATEST(statement_timestamp(), "orionbeacon_leases"."acquired_at" + INTERVAL '1 microsecond') END), "#,
                r#""holder" = $6, "expires_at" = GREATEST(clock_timestamp() + $7 * INTERVAL '1 millisecond', "orionbeacon_leases"."expires_at" + INTERVAL '1 microsecond') "#,
                r#"WHERE "orionbeacon_leases"."holder" = $8 OR "orionbeacon_leases"."expires_at" <= (statement_timestamp()) "#,
                r#"RETURNING "holder", "fencing_token", "expires_at", "acquired_at", "renewed_at", "#,
                r#"CAST(FLOOR(EXTRACT(EPOCH FROM ("expires_at" - statement_timestamp())) * 1000) AS BIGINT)"#,
            )
        );
        assert_eq!(
            values.0.len(),
            8,
            "every value is a bound parameter: {values:?}"
        );
    }

    #[test]
    fn sqlite_upsert_is_one_conditional_statement() {
        let (sql, values) = upsert(&Sqlite, &table(), "r", "me", 1500)
            .unwrap()
            .build(SqliteQueryBuilder);
        assert_eq!(
            sql,
            concat!(
                r#"INSERT INTO "orionbeacon_leases" ("resource", "holder", "fencing_token", "expires_at", "acquired_at", "renewed_at") "#,
                r#"VALUES (?, ?, ?, strftime('%Y-%m-%d %H:%M:%f', 'now', ?), strftime('%Y-%m-%d %H:%M:%f', 'now'), strftime('%Y-%m-%d %H:%M:%f', 'now')) "#,
                r#"ON CONFLICT ("resource") DO UPDATE SET "#,
                r#""fencing_token" = (CASE WHEN ("orionbeacon_leases"."expires_at" <= (strftime('%Y-%m-%d %H:%M:%f', 'now'))) THEN "orionbeacon_leases"."fencing_token" + ? ELSE "orionbeacon_leases"."fencing_token" END), "#,
                r#""acquired_at" = (CASE WHEN ("orionbeacon_leases"."expires_at" <= (strftime('%Y-%m-%d %H:%M:%f', 'now'))) THEN strftime('%Y-%m-%d %H:%M:%f', 'now') ELSE "orionbeacon_leases"."acquired_at" END), "#,
                r#""renewed_at" = (CASE WHEN ("orionbeacon_leases"."expires_at" <= (strftime('%Y-%m-%d %H:%M:%f', 'now'))) THEN strftime('%Y-%m-%d %H:%M:%f', 'now') ELSE MAX(strftime('%Y-%m-%d %H:%M:%f', 'now'), strftime('%Y-%m-%d %H:%M:%f', "orionbeacon_leases"."acquired_at", '+0.001 seconds')) END), "#,
                r#""holder" = ?, "expires_at" = MAX(strftime('%Y-%m-%d %H:%M:%f', 'now', ?), strftime('%Y-%m-%d %H:%M:%f', "orionbeacon_leases"."expires_at", '+0.001 seconds')) "#,
                r#"WHERE "orionbeacon_leases"."holder" = ? OR "orionbeacon_leases"."expires_at" <= (strftime('%Y-%m-%d %H:%M:%f', 'now')) "#,
                r#"RETURNING "holder", "fencing_token", "expires_at", "acquired_at", "renewed_at", "#,
                r#"CAST(ROUND((julianday("expires_at") - julianday('now')) * 86400000.0) AS INTEGER)"#,
            )
        );
        assert_eq!(values.0.len(), 8);
        assert!(
            values.0.contains(&"+1.500 seconds".into()),
            "exact ms modifier: {values:?}"
        );
    }

    fn lease_seen(expires_at: Option<DateTime<Utc>>) -> Lease {
        Lease {
            resource: "r".into(),
            holder: "me".into(),
            token: FencingToken::new(7),
            remaining: Duration::from_secs(1),
            expires_at,
            acquired_at: None,
        }
    }

    /// The release of one write names its token and its expiry, each as a bound value in the
    /// form the backend stored it in.
    #[test]
    fn release_of_one_write_is_pinned_per_backend() {
        use crate::backend::mysql::MySql;
        use sea_orm::sea_query::{MysqlQueryBuilder, Value};
        let t: DateTime<Utc> = "2026-11-30T08:54:26.123456Z".parse().unwrap();
        let lease = lease_seen(Some(t));

        let update = release_write(&Postgres, &table(), &lease).unwrap();
        let (sql, values) =
            crate::backend::postgres::statements::notifying(update, "orionbeacon_leases")
                .build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            "WITH \"released\" (\"resource\") AS (UPDATE \"orionbeacon_leases\" SET \"expires_at\" = (CASE WHEN (\"renewed_at\" < (statement_timestamp())) THEN \"renewed_at\" ELSE statement_timestamp() END) \
             WHERE \"resource\" = $1 AND \"holder\" = $2 AND \"expires_at\" > (statement_timestamp()) AND \"fencing_token\" = $3 AND \"expires_at\" = $4 RETURNING \"resource\") \
             SELECT pg_notify($5, $6 || \"resource\") FROM \"released\""
        );
        assert_eq!(values.0[2], Value::BigInt(Some(7)));
        assert_eq!(values.0[3], Value::ChronoDateTimeUtc(Some(t)));

        let (sql, values) = release_write(&Sqlite, &table(), &lease)
            .unwrap()
            .build(SqliteQueryBuilder);
        assert_eq!(
            sql,
            r#"UPDATE "orionbeacon_leases" SET "expires_at" = (CASE WHEN ("renewed_at" < (strftime('%Y-%m-%d %H:%M:%f', 'now'))) THEN "renewed_at" ELSE strftime('%Y-%m-%d %H:%M:%f', 'now') END) WHERE "resource" = ? AND "holder" = ? AND "expires_at" > (strftime('%Y-%m-%d %H:%M:%f', 'now')) AND "fencing_token" = ? AND "expires_at" = ?"#
        );
        // The text strftime('%Y-%m-%d %H:%M:%f') writes, milliseconds only.
        assert_eq!(values.0[3], Value::from("2026-11-30 08:54:26.123"));

        let (sql, values) = release_write(&MySql, &table(), &lease)
            .unwrap()
            .build(MysqlQueryBuilder);
        assert_eq!(
            sql,
            "UPDATE `orionbeacon_leases` SET `expires_at` = (CASE WHEN (`renewed_at` < (UTC_TIMESTAMP(6))) THEN `renewed_at` ELSE UTC_TIMESTAMP(6) END) WHERE `resource` = ? AND `holder` = ? AND `expires_at` > (UTC_TIMESTAMP(6)) AND `fencing_token` = ? AND `expires_at` = ?"
        );
        assert_eq!(values.0[3], Value::ChronoDateTime(Some(t.naive_utc())));

        assert!(
            release_write(&Postgres, &table(), &lease_seen(None)).is_none(),
            "a lease without an expiry names no write"
        );
    }

    #[test]
    fn release_and_current_are_guarded_and_bound() {
        let (sql, values) = release(&Postgres, &table(), "r", "me").build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            r#"UPDATE "orionbeacon_leases" SET "expires_at" = (CASE WHEN ("renewed_at" < (statement_timestamp())) THEN "renewed_at" ELSE statement_timestamp() END) WHERE "resource" = $1 AND "holder" = $2 AND "expires_at" > (statement_timestamp())"#
        );
        assert_eq!(values.0.len(), 2);
        let (sql, _) = release(&Sqlite, &table(), "r", "me").build(SqliteQueryBuilder);
        assert_eq!(
            sql,
            r#"UPDATE "orionbeacon_leases" SET "expires_at" = (CASE WHEN ("renewed_at" < (strftime('%Y-%m-%d %H:%M:%f', 'now'))) THEN "renewed_at" ELSE strftime('%Y-%m-%d %H:%M:%f', 'now') END) WHERE "resource" = ? AND "holder" = ? AND "expires_at" > (strftime('%Y-%m-%d %H:%M:%f', 'now'))"#
        );
        let (sql, values) = current(&Postgres, &table(), "r").build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            r#"SELECT "holder", "fencing_token", "expires_at", "acquired_at", "renewed_at", CAST(FLOOR(EXTRACT(EPOCH FROM ("expires_at" - statement_timestamp())) * 1000) AS BIGINT) FROM "orionbeacon_leases" WHERE "resource" = $1"#
        );
        assert_eq!(values.0.len(), 1);
    }

    fn row(holder: &str, remaining_millis: i64) -> Row {
        let t = DateTime::<Utc>::UNIX_EPOCH;
        Row {
            holder: holder.to_owned(),
            token: 3,
            expires_at: t,
            acquired_at: t,
            renewed_at: t,
            remaining_millis,
        }
    }

    #[test]
    fn a_report_never_names_the_caller() {
        let d = row("me", 500).denial_for("r", "me");
        assert_eq!((d.holder, d.remaining), (None, Duration::ZERO));
        let d = row("other", 500).denial_for("r", "me");
        assert_eq!(d.holder.as_deref(), Some("other"));
        assert_eq!(d.remaining, Duration::from_millis(500));
    }

    #[test]
    fn a_row_that_names_the_caller_but_is_not_live_is_no_grant() {
        assert!(matches!(
            row("me", 0).outcome("r", "me"),
            LeaseOutcome::Denied(Denial { holder: None, .. })
        ));
        assert!(matches!(
            row("me", 1).outcome("r", "me"),
            LeaseOutcome::Acquired(_)
        ));
    }

    #[test]
    fn sqlite_lease_modifier_is_exact() {
        let (_, values) = upsert(&Sqlite, &table(), "r", "me", 86_400_007)
            .unwrap()
            .build(SqliteQueryBuilder);
        assert!(
            values.0.contains(&"+86400.007 seconds".into()),
            "{values:?}"
        );
    }

    // The statement-level fence inside a caller's UPDATE: the lock clause must survive.
    #[test]
    fn fenced_by_sql_per_backend() {
        let t = Alias::new("orionbeacon_leases");
        let update = |fence: SelectStatement| {
            Query::update()
                .table(Alias::new("jobs"))
                .value(Alias::new("owner_token"), 7i64)
                .and_where(Expr::col(Alias::new("id")).eq(1))
                .and_where(Expr::exists(fence))
                .to_owned()
        };
        let (sql, values) = update(crate::backend::postgres::takeover::statement_fence(
            &Postgres,
            &t,
            "orionbeacon_leases",
            &term(),
        ))
        .build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            r#"UPDATE "jobs" SET "owner_token" = $1 WHERE "id" = $2 AND EXISTS(SELECT $3 FROM "orionbeacon_leases" WHERE "resource" = $4 AND "holder" = $5 AND "fencing_token" = $6 AND "expires_at" > (statement_timestamp()) AND pg_try_advisory_xact_lock_shared($7) IS NOT NULL FOR SHARE)"#
        );
        assert_eq!(values.0.len(), 7);
        let (sql, _) = update(statement_check(&crate::backend::mysql::MySql, &t, &term()))
            .build(MysqlQueryBuilder);
        assert_eq!(
            sql,
            "UPDATE `jobs` SET `owner_token` = ? WHERE `id` = ? AND EXISTS(SELECT ? FROM `orionbeacon_leases` WHERE `resource` = ? AND `holder` = ? AND `fencing_token` = ? AND `expires_at` > (UTC_TIMESTAMP(6)) LOCK IN SHARE MODE)"
        );
        let (sql, _) = update(statement_check(&Sqlite, &t, &term())).build(SqliteQueryBuilder);
        assert_eq!(
            sql,
            r#"UPDATE "jobs" SET "owner_token" = ? WHERE "id" = ? AND EXISTS(SELECT ? FROM "orionbeacon_leases" WHERE "resource" = ? AND "holder" = ? AND "fencing_token" = ? AND "expires_at" > (strftime('%Y-%m-%d %H:%M:%f', 'now')))"#
        );
    }

    #[test]
    fn fence_sql_per_backend() {
        let t = Alias::new("orionbeacon_leases");
        let (sql, values) = crate::backend::postgres::takeover::locking_check(
            &Postgres,
            &t,
            "orionbeacon_leases",
            &term(),
        )
        .build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            r#"SELECT $1, pg_try_advisory_xact_lock_shared($2) FROM "orionbeacon_leases" WHERE "resource" = $3 AND "holder" = $4 AND "fencing_token" = $5 AND "expires_at" > (statement_timestamp()) FOR SHARE"#
        );
        assert_eq!(values.0.len(), 5);
        let (sql, _) = crate::backend::mysql::statements::locking_check(
            &crate::backend::mysql::MySql,
            &t,
            &term(),
        )
        .build(MysqlQueryBuilder);
        assert_eq!(
            sql,
            "SELECT ? FROM `orionbeacon_leases` WHERE `resource` = ? AND `holder` = ? AND `fencing_token` = ? AND `expires_at` > (UTC_TIMESTAMP(6)) FOR UPDATE"
        );
        let (sql, _) = crate::backend::sqlite::statements::write_lock(&t, term().current(&Sqlite))
            .build(SqliteQueryBuilder);
        assert_eq!(
            sql,
            r#"UPDATE "orionbeacon_leases" SET "fencing_token" = "fencing_token" WHERE "resource" = ? AND "holder" = ? AND "fencing_token" = ? AND "expires_at" > (strftime('%Y-%m-%d %H:%M:%f', 'now'))"#
        );
    }
}
