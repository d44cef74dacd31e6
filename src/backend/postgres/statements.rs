//! PostgreSQL's own statements: the acquire-or-renew that reports the holder when it grants
//! nothing, and releases that wake the followers (`pg_notify`), each one round trip.

use orion_beacon_entity::lease::Column;
use sea_orm::sea_query::{
    Alias, CommonTableExpression, Expr, ExprTrait, InsertStatement, LockBehavior, LockType, Query,
    UnionType, UpdateStatement, WithClause, WithQuery,
};
use sea_orm::DbErr;

use crate::backend::dialect::Dialect;
use crate::backend::statements::{
    held_rows, new_row, new_row_columns, release, renew_held, renewed_row, returned_row,
    upsert_onto, with_payload, PAYLOAD_COLUMN,
};
use crate::backend::{MIN_WAIT_BEFORE_TAKEOVER, WAIT_BEFORE_TAKEOVER};

/// The channel PostgreSQL release notifications go to; the payload is `<table>@<table OID>/<resource>`.
pub(crate) const RELEASE_CHANNEL: &str = "orionbeacon_releases";

/// The names of the returned row's columns, for the CTEs below.
const ROW_NAMES: [&str; 6] = [
    "holder",
    "fencing_token",
    "expires_at",
    "acquired_at",
    "renewed_at",
    "remaining_ms",
];

/// The index of `transaction_timestamp()` in [`upsert_reporting`]'s rows.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) const TRANSACTION_START_COLUMN: usize = 7;

/// PostgreSQL: `set_config('lock_timeout', …, TRUE)`: the statement that evaluates it waits for
/// a lock at most `waits` times the takeover's first wait (a fifth of the lease `$1` in
/// milliseconds, at most 200 ms, at least 10 ms), then fails (`55P03`), and the setting ends
/// with its transaction.
fn lock_wait(d: &dyn Dialect, millis: i64, waits: u32) -> Expr {
    let (most, least) = (
        WAIT_BEFORE_TAKEOVER.as_millis() * u128::from(waits),
        MIN_WAIT_BEFORE_TAKEOVER.as_millis() * u128::from(waits),
    );
    let share = if waits == 1 {
        "$1 / 5".to_owned()
    } else {
        format!("$1 / 5 * {waits}")
    };
    Expr::cust_with_values(
        format!("set_config('lock_timeout', CAST(LEAST({most}, GREATEST({least}, {share})) AS text) || 'ms', TRUE)"),
        [d.lease_value(millis)],
    )
}

/// How many of the takeover's first waits an acquire's statement waits for the row lock: the
/// takeover runs while it waits (after the first), since it ends only a session that blocks a
/// wait on the row, and the second is left for the grant once that session has gone.
const ACQUIRE_WAITS: u32 = 2;

/// PostgreSQL: the shared upsert (`statements::upsert`), its fresh row selected from a
/// subquery that first bounds the statement's lock waits ([`lock_wait`]). A row held locked
/// by a transaction that does not end (a holder stopped or cut off inside a fenced
/// transaction) then costs an acquire that wait, not a pool connection and a server-side
/// statement queued for as long as the stall: a caller that stops waiting (a shard set's round
/// bound) leaves nothing behind that could still grant it a lease later.
pub(crate) fn bounded_upsert(
    d: &dyn Dialect,
    table: &Alias,
    resource: &str,
    candidate: &str,
    millis: i64,
    payload: Option<&str>,
) -> Result<InsertStatement, DbErr> {
    let bound = Alias::new("bound");
    let lock_timeout = Alias::new("lock_timeout");
    let settings = Query::select()
        .expr_as(lock_wait(d, millis, ACQUIRE_WAITS), lock_timeout.clone())
        .to_owned();
    // The fresh row is produced (so the setting made) before the insert looks for a conflict.
    let source = Query::select()
        .exprs(new_row(d, resource, candidate, millis, payload))
        .from_subquery(settings, bound.clone())
        .and_where(Expr::col((bound, lock_timeout)).is_not_null())
        .to_owned();
    let mut stmt = Query::insert();
    stmt.into_table(table.clone())
        .columns(new_row_columns())
        .select_from(source)
        .map_err(|e| DbErr::Custom(e.to_string()))?;
    Ok(upsert_onto(d, table, candidate, millis, payload, stmt))
}

/// PostgreSQL: the [`bounded_upsert`] and, when it grants nothing, the lease row as it stood when the
/// statement began, in one statement (one round trip even when denied). The last column says
/// which: `TRUE` for the granted row, `FALSE` for the report. The report comes from the
/// statement's snapshot, so during a race it can be stale or missing: it is a hint about who
/// holds the lease, never a grant. The column after it is `transaction_timestamp()`, for the
/// check that the statement committed on its own (see `sessions`).
pub(crate) fn upsert_reporting(
    d: &dyn Dialect,
    table: &Alias,
    resource: &str,
    candidate: &str,
    millis: i64,
    payload: Option<&str>,
) -> Result<WithQuery, DbErr> {
    let granted = Alias::new("granted");
    // The payload column last, after the flag and the start.
    let names = || {
        let mut names: Vec<Alias> = ROW_NAMES.iter().map(|n| Alias::new(*n)).collect();
        names.push(Alias::new(PAYLOAD_COLUMN));
        names
    };
    let cte = CommonTableExpression::new()
        .table_name(granted.clone())
        .columns(names())
        .query(bounded_upsert(
            d, table, resource, candidate, millis, payload,
        )?)
        .to_owned();
    let mut row = returned_row(d);
    row.extend([Expr::cust("FALSE"), Expr::cust("transaction_timestamp()")]);
    let report = Query::select()
        .exprs(with_payload(row))
        .from(table.clone())
        .and_where(Expr::col(Column::Resource).eq(resource))
        .and_where(
            Expr::exists(
                Query::select()
                    .expr(Expr::cust("1"))
                    .from(granted.clone())
                    .to_owned(),
            )
            .not(),
        )
        .to_owned();
    let mut main = Query::select();
    main.columns(ROW_NAMES.iter().map(|n| Alias::new(*n)))
        .expr(Expr::cust("TRUE"))
        .expr(Expr::cust("transaction_timestamp()"));
    main.column(Alias::new(PAYLOAD_COLUMN));
    let main = main.from(granted).union(UnionType::All, report).to_owned();
    Ok(WithClause::new().cte(cte).to_owned().query(main))
}

/// PostgreSQL: the guarded [`release`] that also notifies followers (`pg_notify`, delivered on
/// commit), in one statement. Returns one row per released lease.
pub(crate) fn release_notifying(
    d: &dyn Dialect,
    table: &Alias,
    table_name: &str,
    resource: &str,
    candidate: &str,
) -> WithQuery {
    notifying(release(d, table, resource, candidate), table_name)
}

/// PostgreSQL: a release `update` that also notifies followers of each row it released.
pub(crate) fn notifying(mut update: UpdateStatement, table_name: &str) -> WithQuery {
    let released = Alias::new("released");
    update.returning(Query::returning().columns([Alias::new("resource"), Alias::new("tableoid")]));
    let cte = CommonTableExpression::new()
        .table_name(released.clone())
        .columns([Alias::new("resource"), Alias::new("tableoid")])
        .query(update)
        .to_owned();
    // `<table>@<table OID>/<resource>`: the OID tells apart tables of one name in other
    // schemas (one per tenant), so their listeners never wake for each other's releases.
    let notify = Query::select()
        .expr(Expr::cust_with_values(
            "pg_notify($1, $2 || \"tableoid\" || '/' || \"resource\")",
            [RELEASE_CHANNEL.to_owned(), format!("{table_name}@")],
        ))
        .from(released)
        .to_owned();
    WithClause::new().cte(cte).to_owned().query(notify)
}

/// The rows of a batch renew, from its JSON document (see `held_json`).
pub(crate) fn held(json: String) -> Expr {
    Expr::cust_with_values(
        r#"SELECT "r", "h", "t" FROM json_to_recordset(CAST($1 AS json)) AS "held" ("r" text, "h" text, "t" bigint)"#,
        [json],
    )
}

/// The batch renew, returning each renewed row (see `renewed_row`) and
/// `transaction_timestamp()` at [`RENEW_TRANSACTION_START_COLUMN`], for the check that it
/// committed on its own (see `sessions`).
///
/// It never waits for a row lock: the rows it renews are first locked by a subquery
/// `FOR NO KEY UPDATE SKIP LOCKED`, and a row another transaction holds (a holder's own fenced
/// transaction, a stuck statement) is left out, neither renewed nor waited for; the caller
/// renews such a row on its own ([`renew_bounded`]). A row that does not match the batch is
/// never locked (the lock is taken above the subquery's filter). So a batch can never join a
/// deadlock with a transaction that fences with several of its leases.
pub(crate) fn renew_all(
    d: &dyn Dialect,
    table: &Alias,
    json: String,
    millis: i64,
) -> UpdateStatement {
    let free = Query::select()
        .column((table.clone(), Column::Resource))
        .from(table.clone())
        .and_where(held_rows(d, table, held(json.clone())))
        .lock_with_behavior(LockType::NoKeyUpdate, LockBehavior::SkipLocked)
        .to_owned();
    let mut update = renew_waiting(d, table, json, millis);
    update.and_where(Expr::col((table.clone(), Column::Resource)).in_subquery(free));
    update
}

/// The batch renew as it waits for a locked row: for [`renew_bounded`].
fn renew_waiting(d: &dyn Dialect, table: &Alias, json: String, millis: i64) -> UpdateStatement {
    let mut exprs = renewed_row(d);
    exprs.push(Expr::cust("transaction_timestamp()"));
    renew_held(d, table, held(json), millis)
        .returning(Query::returning().exprs(with_payload(exprs)))
        .to_owned()
}

/// The renew of a lease the batch left out because its row was locked: it waits for the row
/// at most [`lock_wait`] (for a lease of `millis`), as a single renew's upsert does, then
/// fails with `55P03`. Sent for one lease at a time, so it holds no other row while it waits.
pub(crate) fn renew_bounded(
    d: &dyn Dialect,
    table: &Alias,
    json: String,
    millis: i64,
) -> UpdateStatement {
    let settings = Query::select().expr(lock_wait(d, millis, 1)).to_owned();
    let mut update = renew_waiting(d, table, json, millis);
    update.and_where(
        Expr::SubQuery(
            None,
            Box::new(sea_orm::sea_query::QueryStatementBuilder::into_sub_query_statement(settings)),
        )
        .is_not_null(),
    );
    update
}

/// The index of `transaction_timestamp()` in [`renew_all`]'s rows.
pub(crate) const RENEW_TRANSACTION_START_COLUMN: usize = 7;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::postgres::Postgres;
    use sea_orm::sea_query::PostgresQueryBuilder;

    fn table() -> Alias {
        Alias::new("orionbeacon_leases")
    }

    #[test]
    fn postgres_reporting_upsert_and_notifying_release() {
        let (sql, values) = upsert_reporting(&Postgres, &table(), "r", "me", 1500, None)
            .unwrap()
            .build(PostgresQueryBuilder);
        let (insert, _) = bounded_upsert(&Postgres, &table(), "r", "me", 1500, None)
            .unwrap()
            .build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            r#"WITH "granted" ("holder", "fencing_token", "expires_at", "acquired_at", "renewed_at", "remaining_ms", "current_payload") AS (INSERT INTO "orionbeacon_leases" ("resource", "holder", "fencing_token", "expires_at", "acquired_at", "renewed_at", "payload", "payload_token") SELECT $1, $2, $3, clock_timestamp() + $4 * INTERVAL '1 millisecond', statement_timestamp(), statement_timestamp(), $5, $6 FROM (SELECT set_config('lock_timeout', CAST(LEAST(400, GREATEST(20, $7 / 5 * 2)) AS text) || 'ms', TRUE) AS "lock_timeout") AS "bound" WHERE "bound"."lock_timeout" IS NOT NULL ON CONFLICT ("resource") DO UPDATE SET "payload" = $8, "payload_token" = (CASE WHEN ("orionbeacon_leases"."expires_at" <= (statement_timestamp())) THEN "orionbeacon_leases"."fencing_token" + $9 ELSE "orionbeacon_leases"."fencing_token" END), "fencing_token" = (CASE WHEN ("orionbeacon_leases"."expires_at" <= (statement_timestamp())) THEN "orionbeacon_leases"."fencing_token" + $10 ELSE "orionbeacon_leases"."fencing_token" END), "acquired_at" = (CASE WHEN ("orionbeacon_leases"."expires_at" <= (statement_timestamp())) THEN statement_timestamp() ELSE "orionbeacon_leases"."acquired_at" END), "renewed_at" = (CASE WHEN ("orionbeacon_leases"."expires_at" <= (statement_timestamp())) THEN statement_timestamp() ELSE GREATEST(statement_timestamp(), "orionbeacon_leases"."acquired_at" + INTERVAL '1 microsecond') END), "holder" = $11, "expires_at" = GREATEST(clock_timestamp() + $12 * INTERVAL '1 millisecond', "orionbeacon_leases"."expires_at" + INTERVAL '1 microsecond') WHERE "orionbeacon_leases"."holder" = $13 OR "orionbeacon_leases"."expires_at" <= (statement_timestamp()) RETURNING "holder", "fencing_token", "expires_at", "acquired_at", "renewed_at", CAST(FLOOR(EXTRACT(EPOCH FROM ("expires_at" - statement_timestamp())) * 1000) AS BIGINT), CASE WHEN payload_token = fencing_token THEN payload END AS current_payload) SELECT "holder", "fencing_token", "expires_at", "acquired_at", "renewed_at", "remaining_ms", TRUE, transaction_timestamp(), "current_payload" FROM "granted" UNION ALL (SELECT "holder", "fencing_token", "expires_at", "acquired_at", "renewed_at", CAST(FLOOR(EXTRACT(EPOCH FROM ("expires_at" - statement_timestamp())) * 1000) AS BIGINT), FALSE, transaction_timestamp(), CASE WHEN payload_token = fencing_token THEN payload END AS current_payload FROM "orionbeacon_leases" WHERE "resource" = $14 AND (NOT EXISTS(SELECT 1 FROM "granted")))"#
        );
        // The CTE is the bounded upsert itself.
        assert!(sql.contains(&format!(" AS ({insert}) SELECT ")), "{sql}");
        assert_eq!(values.0.len(), 14);
        let (sql, values) = release_notifying(&Postgres, &table(), "orionbeacon_leases", "r", "me")
            .build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            "WITH \"released\" (\"resource\", \"tableoid\") AS (UPDATE \"orionbeacon_leases\" SET \"expires_at\" = (CASE WHEN (\"renewed_at\" < (statement_timestamp())) THEN \"renewed_at\" ELSE statement_timestamp() END) \
             WHERE \"resource\" = $1 AND \"holder\" = $2 AND \"expires_at\" > (statement_timestamp()) RETURNING \"resource\", \"tableoid\") \
             SELECT pg_notify($3, $4 || \"tableoid\" || \'/\' || \"resource\") FROM \"released\""
        );
        assert_eq!(values.0.len(), 4);
    }

    // The fresh row comes from a subquery that first sets the statement's lock_timeout: the
    // insert looks for its conflict (and waits for the row lock) only after that.
    #[test]
    fn postgres_upsert_bounds_its_lock_wait_first() {
        let (sql, values) = bounded_upsert(&Postgres, &table(), "r", "me", 1500, None)
            .unwrap()
            .build(PostgresQueryBuilder);
        assert!(
            sql.starts_with(
                "INSERT INTO \"orionbeacon_leases\" (\"resource\", \"holder\", \"fencing_token\", \"expires_at\", \"acquired_at\", \"renewed_at\", \"payload\", \"payload_token\") \
                 SELECT $1, $2, $3, clock_timestamp() + $4 * INTERVAL '1 millisecond', statement_timestamp(), statement_timestamp(), $5, $6 \
                 FROM (SELECT set_config('lock_timeout', CAST(LEAST(400, GREATEST(20, $7 / 5 * 2)) AS text) || 'ms', TRUE) AS \"lock_timeout\") AS \"bound\" \
                 WHERE \"bound\".\"lock_timeout\" IS NOT NULL \
                 ON CONFLICT (\"resource\") DO UPDATE SET "
            ),
            "{sql}"
        );
        // The lease length bound twice more: the fresh row's expiry and the lock wait.
        let v = &values.0;
        assert_eq!(
            (v[0].clone(), v[1].clone(), v[3].clone(), v[6].clone()),
            ("r".into(), "me".into(), 1500i64.into(), 1500i64.into())
        );
        // The rest is the shared upsert's conflict clause, as on SQLite.
        let (shared, _) =
            crate::backend::statements::upsert(&Postgres, &table(), "r", "me", 1500, None)
                .unwrap()
                .build(PostgresQueryBuilder);
        let tail = |s: &str| s.split_once(" ON CONFLICT ").map(|(_, t)| t.to_owned());
        // Each `$n` of the shared form is `$n+1` here (the lock wait is bound first).
        let renumbered = tail(&shared).map(|t| {
            let mut parts = t.split('$');
            let mut out = parts.next().unwrap_or_default().to_owned();
            for part in parts {
                let digits = part.chars().take_while(char::is_ascii_digit).count();
                let n: usize = part[..digits].parse().unwrap();
                out.push_str(&format!("${}{}", n + 1, &part[digits..]));
            }
            out
        });
        assert_eq!(tail(&sql), renumbered);
    }

    // One statement for the whole batch, its leases in one bound JSON document (twice: the
    // rows locked first, skipping any another transaction holds, then renewed).
    #[test]
    fn batch_renew_is_one_update_from_json() {
        let (sql, values) =
            renew_all(&Postgres, &table(), "[]".to_owned(), 1500).build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            r#"UPDATE "orionbeacon_leases" SET "expires_at" = GREATEST(clock_timestamp() + $1 * INTERVAL '1 millisecond', "expires_at" + INTERVAL '1 microsecond'), "renewed_at" = GREATEST(statement_timestamp(), "acquired_at" + INTERVAL '1 microsecond') WHERE ("orionbeacon_leases"."resource", "orionbeacon_leases"."holder", "orionbeacon_leases"."fencing_token") IN (SELECT "r", "h", "t" FROM json_to_recordset(CAST($2 AS json)) AS "held" ("r" text, "h" text, "t" bigint)) AND "orionbeacon_leases"."expires_at" > (statement_timestamp()) AND "orionbeacon_leases"."resource" IN (SELECT "orionbeacon_leases"."resource" FROM "orionbeacon_leases" WHERE ("orionbeacon_leases"."resource", "orionbeacon_leases"."holder", "orionbeacon_leases"."fencing_token") IN (SELECT "r", "h", "t" FROM json_to_recordset(CAST($3 AS json)) AS "held" ("r" text, "h" text, "t" bigint)) AND "orionbeacon_leases"."expires_at" > (statement_timestamp()) FOR NO KEY UPDATE SKIP LOCKED) RETURNING "holder", "fencing_token", "expires_at", "acquired_at", "renewed_at", CAST(FLOOR(EXTRACT(EPOCH FROM ("expires_at" - statement_timestamp())) * 1000) AS BIGINT), "resource", transaction_timestamp(), CASE WHEN payload_token = fencing_token THEN payload END AS current_payload"#
        );
        assert_eq!(values.0.len(), 3, "{values:?}");
    }

    /// The renew of a lease the batch left out: the batch renew without its skip, its lock
    /// waits bounded first by the
    /// same `set_config` a single renew's upsert makes (a subquery every row's condition
    /// needs, so it runs before any row is locked).
    #[test]
    fn the_bounded_batch_renew_sets_its_lock_timeout_first() {
        let (plain, _) =
            renew_waiting(&Postgres, &table(), "[]".into(), 1500).build(PostgresQueryBuilder);
        let (sql, values) =
            renew_bounded(&Postgres, &table(), "[]".into(), 1500).build(PostgresQueryBuilder);
        let bound = r#" AND (SELECT set_config('lock_timeout', CAST(LEAST(200, GREATEST(10, $3 / 5)) AS text) || 'ms', TRUE)) IS NOT NULL RETURNING "#;
        assert_eq!(sql, plain.replacen(" RETURNING ", bound, 1));
        assert_eq!(
            values.0.last(),
            Some(&sea_orm::sea_query::Value::BigInt(Some(1500)))
        );
    }
}
