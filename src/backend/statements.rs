//! The lease statements every backend shares, built with sea-query (their rows are decoded in
//! `row`). What only one backend sends lives in that backend's `statements`.

use orion_beacon_entity::lease::Column;
use sea_orm::sea_query::{
    Alias, BinOper, Expr, ExprTrait, InsertStatement, OnConflict, Query, SelectStatement,
    UpdateStatement,
};
use sea_orm::DbErr;

use super::dialect::Dialect;
use crate::lease::Lease;

/// The columns every lease statement returns, in this order; `remaining_millis` follows.
const ROW: [Column; 5] = [
    Column::Holder,
    Column::FencingToken,
    Column::ExpiresAt,
    Column::AcquiredAt,
    Column::RenewedAt,
];

/// The payload of the row's current term, as [`PAYLOAD_COLUMN`]: the stored payload only
/// while the term that wrote it is the row's (a term that wrote none, say an older release's
/// renew, leaves an earlier term's payload behind, which is never shown).
pub(crate) fn current_payload() -> Expr {
    Expr::cust("CASE WHEN payload_token = fencing_token THEN payload END AS current_payload")
}

/// `exprs` and the payload column last.
pub(crate) fn with_payload(mut exprs: Vec<Expr>) -> Vec<Expr> {
    exprs.push(current_payload());
    exprs
}

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
///
/// The grant also writes `payload` (`None` clears it) and sets `payload_token` to the row's
/// new token (the fencing token's own expression), and returns [`current_payload`] last.
pub(crate) fn upsert(
    d: &dyn Dialect,
    table: &Alias,
    resource: &str,
    candidate: &str,
    millis: i64,
    payload: Option<&str>,
) -> Result<InsertStatement, DbErr> {
    let stmt = insert_new_row(d, table, resource, candidate, millis, payload)?;
    Ok(upsert_onto(d, table, candidate, millis, payload, stmt))
}

/// The conflict clause and `RETURNING` of [`upsert`], onto `stmt`, an insert of the fresh row
/// (from [`insert_new_row`], or a `SELECT` of [`new_row`]).
pub(crate) fn upsert_onto(
    d: &dyn Dialect,
    table: &Alias,
    candidate: &str,
    millis: i64,
    payload: Option<&str>,
    mut stmt: InsertStatement,
) -> InsertStatement {
    let old = |c: Column| Expr::col((table.clone(), c));
    let expired = old(Column::ExpiresAt).lte(d.now());
    let mine = old(Column::Holder).eq(candidate);
    let token: Expr = Expr::case(expired.clone(), old(Column::FencingToken).add(1))
        .finally(old(Column::FencingToken))
        .into();
    let mut values = Vec::with_capacity(7);
    values.push((Column::Payload, Expr::val(payload.map(str::to_owned))));
    values.push((Column::PayloadToken, token.clone()));
    let on_conflict = OnConflict::column(Column::Resource)
        .values(
            values.into_iter().chain([
                (Column::FencingToken, token),
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
            ]),
        )
        .action_and_where(mine.or(expired))
        .to_owned();
    stmt.on_conflict(on_conflict)
        .returning(Query::returning().exprs(with_payload(returned_row(d))));
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
    payload: Option<&str>,
) -> Result<InsertStatement, DbErr> {
    let mut stmt = Query::insert();
    stmt.into_table(table.clone())
        .columns(new_row_columns())
        .values(new_row(d, resource, candidate, millis, payload))
        .map_err(|e| DbErr::Custom(e.to_string()))?;
    Ok(stmt)
}

/// The columns of a fresh lease row, in the order of [`new_row`].
pub(crate) fn new_row_columns() -> [Column; 8] {
    [
        Column::Resource,
        Column::Holder,
        Column::FencingToken,
        Column::ExpiresAt,
        Column::AcquiredAt,
        Column::RenewedAt,
        Column::Payload,
        Column::PayloadToken,
    ]
}

/// A fresh lease row's values: token 1, times from the database clock (and the payload,
/// written by term 1).
pub(crate) fn new_row(
    d: &dyn Dialect,
    resource: &str,
    candidate: &str,
    millis: i64,
    payload: Option<&str>,
) -> Vec<Expr> {
    vec![
        Expr::val(resource),
        Expr::val(candidate),
        Expr::val(1i64),
        d.lease_end(millis),
        d.now(),
        d.now(),
        Expr::val(payload.map(str::to_owned)),
        Expr::val(1i64),
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

/// The offer of `lease`'s live term to the holder `marker` (see `LeaseStore::offer`): a new
/// term, the token one higher, from now until `millis` after the write. Every assignment reads
/// only its own column (MySQL runs them left to right), and the payload of the ended term is
/// hidden by the token change (see [`current_payload`]).
pub(crate) fn offer(
    d: &dyn Dialect,
    table: &Alias,
    lease: &Lease,
    marker: &str,
    millis: i64,
) -> UpdateStatement {
    Query::update()
        .table(table.clone())
        .value(Column::Holder, marker)
        .value(Column::FencingToken, Expr::col(Column::FencingToken).add(1))
        .value(Column::AcquiredAt, d.now())
        .value(Column::RenewedAt, d.now())
        .value(Column::ExpiresAt, d.lease_end(millis))
        .and_where(Expr::col(Column::Resource).eq(lease.resource.as_str()))
        .and_where(Expr::col(Column::Holder).eq(lease.holder.as_str()))
        .and_where(Expr::col(Column::FencingToken).eq(lease.token.get()))
        .and_where(Expr::col(Column::ExpiresAt).gt(d.now()))
        .to_owned()
}

/// The take of an open offer to `candidate` (held by `marker`) whose term has `token`: the
/// term becomes `candidate`'s for `millis` from the write, as a renew writes it.
pub(crate) fn take_offer(
    d: &dyn Dialect,
    table: &Alias,
    resource: &str,
    marker: &str,
    candidate: &str,
    token: i64,
    millis: i64,
) -> UpdateStatement {
    Query::update()
        .table(table.clone())
        .value(Column::Holder, candidate)
        .value(
            Column::RenewedAt,
            d.greatest(d.now(), d.one_tick_after(Expr::col(Column::AcquiredAt))),
        )
        .value(
            Column::ExpiresAt,
            next_expiry(d, Expr::col(Column::ExpiresAt), millis),
        )
        .and_where(Expr::col(Column::Resource).eq(resource))
        .and_where(Expr::col(Column::Holder).eq(marker))
        .and_where(Expr::col(Column::FencingToken).eq(token))
        .and_where(Expr::col(Column::ExpiresAt).gt(d.now()))
        .to_owned()
}

/// A read that names the columns the last lease-table migration (`AddLeasePayload`) added and
/// returns nothing: it fails with an unknown column on a table made before them. The names are not quoted: SQLite takes a quoted name
/// that is no column for a string.
pub(crate) fn payload_probe(table: &Alias) -> SelectStatement {
    Query::select()
        .expr(current_payload())
        .from(table.clone())
        .limit(0)
        .to_owned()
}

/// The stored row of `resource` with its remaining time (negative once expired).
pub(crate) fn current(d: &dyn Dialect, table: &Alias, resource: &str) -> SelectStatement {
    Query::select()
        .exprs(with_payload(returned_row(d)))
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

/// The columns a batch renew returns per renewed row: the lease row, then the resource (and
/// then the payload column, by [`with_payload`], after any a backend adds).
pub(crate) fn renewed_row(d: &dyn Dialect) -> Vec<Expr> {
    let mut exprs = returned_row(d);
    exprs.push(Expr::col(Column::Resource));
    exprs
}

pub(crate) use crate::store::support::{held_json, PAYLOAD_COLUMN};

#[cfg(test)]
pub(crate) mod tests;

#[cfg(test)]
mod payload_statements {
    use super::*;
    use crate::backend::{mysql, postgres, postgres::Postgres, sqlite::Sqlite};
    use sea_orm::sea_query::{MysqlQueryBuilder, PostgresQueryBuilder, SqliteQueryBuilder};
    use sea_orm::Value;

    fn table() -> Alias {
        Alias::new("orionbeacon_leases")
    }

    const PAYLOAD: Option<&str> = Some("p");

    // The payload form of each deciding statement, pinned as the plain forms are: the payload
    // columns are written by the grant itself (first, on MySQL, while every column still
    // holds its old value), `payload_token` takes the fencing token's own expression, and the
    // payload of the row's current term comes last, by name.
    #[test]
    fn the_payload_forms_write_and_return_the_payload() {
        let (sql, values) =
            postgres::statements::upsert_reporting(&Postgres, &table(), "r", "me", 1500, PAYLOAD)
                .unwrap()
                .build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            r#"WITH "granted" ("holder", "fencing_token", "expires_at", "acquired_at", "renewed_at", "remaining_ms", "current_payload") AS (INSERT INTO "orionbeacon_leases" ("resource", "holder", "fencing_token", "expires_at", "acquired_at", "renewed_at", "payload", "payload_token") SELECT $1, $2, $3, clock_timestamp() + $4 * INTERVAL '1 millisecond', statement_timestamp(), statement_timestamp(), $5, $6 FROM (SELECT set_config('lock_timeout', CAST(LEAST(400, GREATEST(20, $7 / 5 * 2)) AS text) || 'ms', TRUE) AS "lock_timeout") AS "bound" WHERE "bound"."lock_timeout" IS NOT NULL ON CONFLICT ("resource") DO UPDATE SET "payload" = $8, "payload_token" = (CASE WHEN ("orionbeacon_leases"."expires_at" <= (statement_timestamp())) THEN "orionbeacon_leases"."fencing_token" + $9 ELSE "orionbeacon_leases"."fencing_token" END), "fencing_token" = (CASE WHEN ("orionbeacon_leases"."expires_at" <= (statement_timestamp())) THEN "orionbeacon_leases"."fencing_token" + $10 ELSE "orionbeacon_leases"."fencing_token" END), "acquired_at" = (CASE WHEN ("orionbeacon_leases"."expires_at" <= (statement_timestamp())) THEN statement_timestamp() ELSE "orionbeacon_leases"."acquired_at" END), "renewed_at" = (CASE WHEN ("orionbeacon_leases"."expires_at" <= (statement_timestamp())) THEN statement_timestamp() ELSE GREATEST(statement_timestamp(), "orionbeacon_leases"."acquired_at" + INTERVAL '1 microsecond') END), "holder" = $11, "expires_at" = GREATEST(clock_timestamp() + $12 * INTERVAL '1 millisecond', "orionbeacon_leases"."expires_at" + INTERVAL '1 microsecond') WHERE "orionbeacon_leases"."holder" = $13 OR "orionbeacon_leases"."expires_at" <= (statement_timestamp()) RETURNING "holder", "fencing_token", "expires_at", "acquired_at", "renewed_at", CAST(FLOOR(EXTRACT(EPOCH FROM ("expires_at" - statement_timestamp())) * 1000) AS BIGINT), CASE WHEN payload_token = fencing_token THEN payload END AS current_payload) SELECT "holder", "fencing_token", "expires_at", "acquired_at", "renewed_at", "remaining_ms", TRUE, transaction_timestamp(), "current_payload" FROM "granted" UNION ALL (SELECT "holder", "fencing_token", "expires_at", "acquired_at", "renewed_at", CAST(FLOOR(EXTRACT(EPOCH FROM ("expires_at" - statement_timestamp())) * 1000) AS BIGINT), FALSE, transaction_timestamp(), CASE WHEN payload_token = fencing_token THEN payload END AS current_payload FROM "orionbeacon_leases" WHERE "resource" = $14 AND (NOT EXISTS(SELECT 1 FROM "granted")))"#
        );
        assert_eq!(values.0.len(), 14, "{values:?}");
        assert_eq!(values.0[4], Value::from(Some("p".to_owned())));
        assert_eq!(values.0[7], Value::from(Some("p".to_owned())));

        let (sql, values) = upsert(&Sqlite, &table(), "r", "me", 1500, PAYLOAD)
            .unwrap()
            .build(SqliteQueryBuilder);
        assert_eq!(
            sql,
            r#"INSERT INTO "orionbeacon_leases" ("resource", "holder", "fencing_token", "expires_at", "acquired_at", "renewed_at", "payload", "payload_token") VALUES (?, ?, ?, strftime('%Y-%m-%d %H:%M:%f', 'now', ?), strftime('%Y-%m-%d %H:%M:%f', 'now'), strftime('%Y-%m-%d %H:%M:%f', 'now'), ?, ?) ON CONFLICT ("resource") DO UPDATE SET "payload" = ?, "payload_token" = (CASE WHEN ("orionbeacon_leases"."expires_at" <= (strftime('%Y-%m-%d %H:%M:%f', 'now'))) THEN "orionbeacon_leases"."fencing_token" + ? ELSE "orionbeacon_leases"."fencing_token" END), "fencing_token" = (CASE WHEN ("orionbeacon_leases"."expires_at" <= (strftime('%Y-%m-%d %H:%M:%f', 'now'))) THEN "orionbeacon_leases"."fencing_token" + ? ELSE "orionbeacon_leases"."fencing_token" END), "acquired_at" = (CASE WHEN ("orionbeacon_leases"."expires_at" <= (strftime('%Y-%m-%d %H:%M:%f', 'now'))) THEN strftime('%Y-%m-%d %H:%M:%f', 'now') ELSE "orionbeacon_leases"."acquired_at" END), "renewed_at" = (CASE WHEN ("orionbeacon_leases"."expires_at" <= (strftime('%Y-%m-%d %H:%M:%f', 'now'))) THEN strftime('%Y-%m-%d %H:%M:%f', 'now') ELSE MAX(strftime('%Y-%m-%d %H:%M:%f', 'now'), strftime('%Y-%m-%d %H:%M:%f', "orionbeacon_leases"."acquired_at", '+0.001 seconds')) END), "holder" = ?, "expires_at" = MAX(strftime('%Y-%m-%d %H:%M:%f', 'now', ?), strftime('%Y-%m-%d %H:%M:%f', "orionbeacon_leases"."expires_at", '+0.001 seconds')) WHERE "orionbeacon_leases"."holder" = ? OR "orionbeacon_leases"."expires_at" <= (strftime('%Y-%m-%d %H:%M:%f', 'now')) RETURNING "holder", "fencing_token", "expires_at", "acquired_at", "renewed_at", CAST(ROUND((julianday("expires_at") - julianday('now')) * 86400000.0) AS INTEGER), CASE WHEN payload_token = fencing_token THEN payload END AS current_payload"#
        );
        assert_eq!(values.0.len(), 12, "{values:?}");

        let stmt = mysql::statements::upsert_returning(&table(), "r", "me", 1500, PAYLOAD).unwrap();
        assert_eq!(
            stmt.sql,
            r#"SET STATEMENT innodb_lock_wait_timeout = 1 FOR INSERT INTO `orionbeacon_leases` (`resource`, `holder`, `fencing_token`, `expires_at`, `acquired_at`, `renewed_at`, `payload`, `payload_token`) VALUES (?, ?, ?, SYSDATE(6) + INTERVAL TIMESTAMPDIFF(MICROSECOND, NOW(6), UTC_TIMESTAMP(6)) MICROSECOND + INTERVAL ? MICROSECOND, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), ?, ?) ON DUPLICATE KEY UPDATE `payload` = (CASE WHEN (`holder` = ? OR `expires_at` <= (UTC_TIMESTAMP(6))) THEN ? ELSE `payload` END), `payload_token` = (CASE WHEN (`expires_at` <= (UTC_TIMESTAMP(6))) THEN `fencing_token` + ? WHEN (`holder` = ?) THEN `fencing_token` ELSE `payload_token` END), `renewed_at` = (CASE WHEN (`expires_at` <= (UTC_TIMESTAMP(6))) THEN UTC_TIMESTAMP(6) WHEN (`holder` = ?) THEN GREATEST(UTC_TIMESTAMP(6), `acquired_at` + INTERVAL 1 MICROSECOND) ELSE `renewed_at` END), `acquired_at` = (CASE WHEN (`expires_at` <= (UTC_TIMESTAMP(6))) THEN UTC_TIMESTAMP(6) ELSE `acquired_at` END), `fencing_token` = (CASE WHEN (`expires_at` <= (UTC_TIMESTAMP(6))) THEN `fencing_token` + ? ELSE `fencing_token` END), `holder` = (CASE WHEN (`expires_at` <= (UTC_TIMESTAMP(6))) THEN ? ELSE `holder` END), `expires_at` = (CASE WHEN (`holder` = ? OR `expires_at` <= (UTC_TIMESTAMP(6))) THEN GREATEST(SYSDATE(6) + INTERVAL TIMESTAMPDIFF(MICROSECOND, NOW(6), UTC_TIMESTAMP(6)) MICROSECOND + INTERVAL ? MICROSECOND, `expires_at` + INTERVAL 1 MICROSECOND) ELSE `expires_at` END) RETURNING `holder`, `fencing_token`, `expires_at`, `acquired_at`, `renewed_at`, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), `expires_at`) DIV 1000, CAST(@@in_transaction AS SIGNED), CASE WHEN payload_token = fencing_token THEN payload END AS current_payload"#
        );
        assert_eq!(stmt.values.map(|v| v.0.len()), Some(15));

        // None clears: NULL is bound where the payload goes.
        let (_, values) = upsert(&Sqlite, &table(), "r", "me", 1500, None)
            .unwrap()
            .build(SqliteQueryBuilder);
        assert_eq!(values.0[6], Value::String(None));
    }

    #[test]
    fn reads_and_batch_renews_return_the_current_terms_payload_last() {
        let (sql, _) = postgres::statements::renew_all(&Postgres, &table(), "[]".into(), 1500)
            .build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            r#"UPDATE "orionbeacon_leases" SET "expires_at" = GREATEST(clock_timestamp() + $1 * INTERVAL '1 millisecond', "expires_at" + INTERVAL '1 microsecond'), "renewed_at" = GREATEST(statement_timestamp(), "acquired_at" + INTERVAL '1 microsecond') WHERE ("orionbeacon_leases"."resource", "orionbeacon_leases"."holder", "orionbeacon_leases"."fencing_token") IN (SELECT "r", "h", "t" FROM json_to_recordset(CAST($2 AS json)) AS "held" ("r" text, "h" text, "t" bigint)) AND "orionbeacon_leases"."expires_at" > (statement_timestamp()) AND "orionbeacon_leases"."resource" IN (SELECT "orionbeacon_leases"."resource" FROM "orionbeacon_leases" WHERE ("orionbeacon_leases"."resource", "orionbeacon_leases"."holder", "orionbeacon_leases"."fencing_token") IN (SELECT "r", "h", "t" FROM json_to_recordset(CAST($3 AS json)) AS "held" ("r" text, "h" text, "t" bigint)) AND "orionbeacon_leases"."expires_at" > (statement_timestamp()) FOR NO KEY UPDATE SKIP LOCKED) RETURNING "holder", "fencing_token", "expires_at", "acquired_at", "renewed_at", CAST(FLOOR(EXTRACT(EPOCH FROM ("expires_at" - statement_timestamp())) * 1000) AS BIGINT), "resource", transaction_timestamp(), CASE WHEN payload_token = fencing_token THEN payload END AS current_payload"#
        );
        let (sql, _) = mysql::statements::renewed(&table(), "[]".into()).build(MysqlQueryBuilder);
        assert_eq!(
            sql,
            r#"SELECT `holder`, `fencing_token`, `expires_at`, `acquired_at`, `renewed_at`, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), `expires_at`) DIV 1000, `resource`, CASE WHEN payload_token = fencing_token THEN payload END AS current_payload FROM `orionbeacon_leases` WHERE (`orionbeacon_leases`.`resource`, `orionbeacon_leases`.`holder`, `orionbeacon_leases`.`fencing_token`) IN (SELECT `r`, `h`, `t` FROM JSON_TABLE(?, '$[*]' COLUMNS (`r` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.r', `h` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.h', `t` BIGINT PATH '$.t')) AS `held`) AND `orionbeacon_leases`.`expires_at` > (UTC_TIMESTAMP(6))"#
        );
        let (sql, _) = current(&Sqlite, &table(), "r").build(SqliteQueryBuilder);
        assert_eq!(
            sql,
            r#"SELECT "holder", "fencing_token", "expires_at", "acquired_at", "renewed_at", CAST(ROUND((julianday("expires_at") - julianday('now')) * 86400000.0) AS INTEGER), CASE WHEN payload_token = fencing_token THEN payload END AS current_payload FROM "orionbeacon_leases" WHERE "resource" = ?"#
        );
        // Unquoted names: SQLite reads a quoted name that is no column as a string, and the
        // probe would then find columns that are not there.
        let (sql, _) = payload_probe(&table()).build(SqliteQueryBuilder);
        assert_eq!(
            sql,
            r#"SELECT CASE WHEN payload_token = fencing_token THEN payload END AS current_payload FROM "orionbeacon_leases" LIMIT ?"#
        );
    }
}
