//! The lease statements every backend shares, built with sea-query (their rows are decoded in
//! `row`). What only one backend sends lives in that backend's `statements`.

use orion_beacon_entity::lease::Column;
use sea_orm::sea_query::{
    Alias, BinOper, Expr, ExprTrait, InsertStatement, OnConflict, Query, SelectStatement,
    UpdateStatement,
};
use sea_orm::DbErr;

use super::dialect::Dialect;
use crate::Lease;

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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::fencing::Term;
    use crate::FencingToken;
    use chrono::{DateTime, Utc};
    use std::time::Duration;

    /// The term the statement tests of every backend fence with.
    pub(crate) fn term() -> Term<'static> {
        Term {
            resource: "r",
            holder: "me",
            token: FencingToken::new(7),
        }
    }

    use crate::backend::{postgres::Postgres, sqlite::Sqlite};
    use sea_orm::sea_query::{PostgresQueryBuilder, SqliteQueryBuilder};

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
}
