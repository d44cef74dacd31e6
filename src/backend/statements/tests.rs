use super::*;
use crate::fencing::FencingToken;
use crate::fencing::Term;
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
    let (sql, values) = upsert(&Postgres, &table(), "r", "me", 1500, None)
        .unwrap()
        .build(PostgresQueryBuilder);
    assert_eq!(
        sql,
        r#"INSERT INTO "orionbeacon_leases" ("resource", "holder", "fencing_token", "expires_at", "acquired_at", "renewed_at", "payload", "payload_token") VALUES ($1, $2, $3, clock_timestamp() + $4 * INTERVAL '1 millisecond', statement_timestamp(), statement_timestamp(), $5, $6) ON CONFLICT ("resource") DO UPDATE SET "payload" = $7, "payload_token" = (CASE WHEN ("orionbeacon_leases"."expires_at" <= (statement_timestamp())) THEN "orionbeacon_leases"."fencing_token" + $8 ELSE "orionbeacon_leases"."fencing_token" END), "fencing_token" = (CASE WHEN ("orionbeacon_leases"."expires_at" <= (statement_timestamp())) THEN "orionbeacon_leases"."fencing_token" + $9 ELSE "orionbeacon_leases"."fencing_token" END), "acquired_at" = (CASE WHEN ("orionbeacon_leases"."expires_at" <= (statement_timestamp())) THEN statement_timestamp() ELSE "orionbeacon_leases"."acquired_at" END), "renewed_at" = (CASE WHEN ("orionbeacon_leases"."expires_at" <= (statement_timestamp())) THEN statement_timestamp() ELSE GREATEST(statement_timestamp(), "orionbeacon_leases"."acquired_at" + INTERVAL '1 microsecond') END), "holder" = $10, "expires_at" = GREATEST(clock_timestamp() + $11 * INTERVAL '1 millisecond', "orionbeacon_leases"."expires_at" + INTERVAL '1 microsecond') WHERE "orionbeacon_leases"."holder" = $12 OR "orionbeacon_leases"."expires_at" <= (statement_timestamp()) RETURNING "holder", "fencing_token", "expires_at", "acquired_at", "renewed_at", CAST(FLOOR(EXTRACT(EPOCH FROM ("expires_at" - statement_timestamp())) * 1000) AS BIGINT), CASE WHEN payload_token = fencing_token THEN payload END AS current_payload"#
    );
    assert_eq!(
        values.0.len(),
        12,
        "every value is a bound parameter: {values:?}"
    );
}

#[test]
fn sqlite_upsert_is_one_conditional_statement() {
    let (sql, values) = upsert(&Sqlite, &table(), "r", "me", 1500, None)
        .unwrap()
        .build(SqliteQueryBuilder);
    assert_eq!(
        sql,
        r#"INSERT INTO "orionbeacon_leases" ("resource", "holder", "fencing_token", "expires_at", "acquired_at", "renewed_at", "payload", "payload_token") VALUES (?, ?, ?, strftime('%Y-%m-%d %H:%M:%f', 'now', ?), strftime('%Y-%m-%d %H:%M:%f', 'now'), strftime('%Y-%m-%d %H:%M:%f', 'now'), ?, ?) ON CONFLICT ("resource") DO UPDATE SET "payload" = ?, "payload_token" = (CASE WHEN ("orionbeacon_leases"."expires_at" <= (strftime('%Y-%m-%d %H:%M:%f', 'now'))) THEN "orionbeacon_leases"."fencing_token" + ? ELSE "orionbeacon_leases"."fencing_token" END), "fencing_token" = (CASE WHEN ("orionbeacon_leases"."expires_at" <= (strftime('%Y-%m-%d %H:%M:%f', 'now'))) THEN "orionbeacon_leases"."fencing_token" + ? ELSE "orionbeacon_leases"."fencing_token" END), "acquired_at" = (CASE WHEN ("orionbeacon_leases"."expires_at" <= (strftime('%Y-%m-%d %H:%M:%f', 'now'))) THEN strftime('%Y-%m-%d %H:%M:%f', 'now') ELSE "orionbeacon_leases"."acquired_at" END), "renewed_at" = (CASE WHEN ("orionbeacon_leases"."expires_at" <= (strftime('%Y-%m-%d %H:%M:%f', 'now'))) THEN strftime('%Y-%m-%d %H:%M:%f', 'now') ELSE MAX(strftime('%Y-%m-%d %H:%M:%f', 'now'), strftime('%Y-%m-%d %H:%M:%f', "orionbeacon_leases"."acquired_at", '+0.001 seconds')) END), "holder" = ?, "expires_at" = MAX(strftime('%Y-%m-%d %H:%M:%f', 'now', ?), strftime('%Y-%m-%d %H:%M:%f', "orionbeacon_leases"."expires_at", '+0.001 seconds')) WHERE "orionbeacon_leases"."holder" = ? OR "orionbeacon_leases"."expires_at" <= (strftime('%Y-%m-%d %H:%M:%f', 'now')) RETURNING "holder", "fencing_token", "expires_at", "acquired_at", "renewed_at", CAST(ROUND((julianday("expires_at") - julianday('now')) * 86400000.0) AS INTEGER), CASE WHEN payload_token = fencing_token THEN payload END AS current_payload"#
    );
    assert_eq!(values.0.len(), 12);
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
        payload: None,
    }
}

/// The offer and its take, rendered per backend: one guarded `UPDATE` each, every value
/// bound, every assignment reading only its own column (MySQL runs them in order).
#[test]
fn offer_and_take_are_pinned_per_backend() {
    use crate::backend::mysql::MySql;
    use sea_orm::sea_query::{MysqlQueryBuilder, Value};
    let lease = lease_seen(None);
    let offer = |d: &dyn Dialect| offer(d, &table(), &lease, " \u{2192}b", 2_000);
    let take = |d: &dyn Dialect| take_offer(d, &table(), "r", " \u{2192}b", "b", 8, 5_000);

    let (sql, values) =
        crate::backend::postgres::statements::notifying(offer(&Postgres), "orionbeacon_leases")
            .build(PostgresQueryBuilder);
    assert_eq!(sql, "WITH \"released\" (\"resource\", \"tableoid\") AS (UPDATE \"orionbeacon_leases\" SET \"holder\" = $1, \"fencing_token\" = \"fencing_token\" + $2, \"acquired_at\" = statement_timestamp(), \"renewed_at\" = statement_timestamp(), \"expires_at\" = clock_timestamp() + $3 * INTERVAL '1 millisecond' WHERE \"resource\" = $4 AND \"holder\" = $5 AND \"fencing_token\" = $6 AND \"expires_at\" > (statement_timestamp()) RETURNING \"resource\", \"tableoid\") SELECT pg_notify($7, $8 || \"tableoid\" || \'/\' || \"resource\") FROM \"released\"");
    assert_eq!(values.0[0], Value::from(" \u{2192}b"));
    let (sql, values) = take(&Postgres).build(PostgresQueryBuilder);
    assert_eq!(sql, "UPDATE \"orionbeacon_leases\" SET \"holder\" = $1, \"renewed_at\" = GREATEST(statement_timestamp(), \"acquired_at\" + INTERVAL '1 microsecond'), \"expires_at\" = GREATEST(clock_timestamp() + $2 * INTERVAL '1 millisecond', \"expires_at\" + INTERVAL '1 microsecond') WHERE \"resource\" = $3 AND \"holder\" = $4 AND \"fencing_token\" = $5 AND \"expires_at\" > (statement_timestamp())");
    assert_eq!(values.0.len(), 5, "{values:?}");

    let (sql, _) = offer(&Sqlite).build(SqliteQueryBuilder);
    assert_eq!(sql, "UPDATE \"orionbeacon_leases\" SET \"holder\" = ?, \"fencing_token\" = \"fencing_token\" + ?, \"acquired_at\" = strftime('%Y-%m-%d %H:%M:%f', 'now'), \"renewed_at\" = strftime('%Y-%m-%d %H:%M:%f', 'now'), \"expires_at\" = strftime('%Y-%m-%d %H:%M:%f', 'now', ?) WHERE \"resource\" = ? AND \"holder\" = ? AND \"fencing_token\" = ? AND \"expires_at\" > (strftime('%Y-%m-%d %H:%M:%f', 'now'))");
    let (sql, _) = take(&Sqlite).build(SqliteQueryBuilder);
    assert_eq!(sql, "UPDATE \"orionbeacon_leases\" SET \"holder\" = ?, \"renewed_at\" = MAX(strftime('%Y-%m-%d %H:%M:%f', 'now'), strftime('%Y-%m-%d %H:%M:%f', \"acquired_at\", '+0.001 seconds')), \"expires_at\" = MAX(strftime('%Y-%m-%d %H:%M:%f', 'now', ?), strftime('%Y-%m-%d %H:%M:%f', \"expires_at\", '+0.001 seconds')) WHERE \"resource\" = ? AND \"holder\" = ? AND \"fencing_token\" = ? AND \"expires_at\" > (strftime('%Y-%m-%d %H:%M:%f', 'now'))");

    let (sql, _) = offer(&MySql).build(MysqlQueryBuilder);
    assert_eq!(sql, "UPDATE `orionbeacon_leases` SET `holder` = ?, `fencing_token` = `fencing_token` + ?, `acquired_at` = UTC_TIMESTAMP(6), `renewed_at` = UTC_TIMESTAMP(6), `expires_at` = SYSDATE(6) + INTERVAL TIMESTAMPDIFF(MICROSECOND, NOW(6), UTC_TIMESTAMP(6)) MICROSECOND + INTERVAL ? MICROSECOND WHERE `resource` = ? AND `holder` = ? AND `fencing_token` = ? AND `expires_at` > (UTC_TIMESTAMP(6))");
    let (sql, values) = take(&MySql).build(MysqlQueryBuilder);
    assert_eq!(sql, "UPDATE `orionbeacon_leases` SET `holder` = ?, `renewed_at` = GREATEST(UTC_TIMESTAMP(6), `acquired_at` + INTERVAL 1 MICROSECOND), `expires_at` = GREATEST(SYSDATE(6) + INTERVAL TIMESTAMPDIFF(MICROSECOND, NOW(6), UTC_TIMESTAMP(6)) MICROSECOND + INTERVAL ? MICROSECOND, `expires_at` + INTERVAL 1 MICROSECOND) WHERE `resource` = ? AND `holder` = ? AND `fencing_token` = ? AND `expires_at` > (UTC_TIMESTAMP(6))");
    assert_eq!(values.0[values.0.len() - 1], Value::BigInt(Some(8)));
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
        "WITH \"released\" (\"resource\", \"tableoid\") AS (UPDATE \"orionbeacon_leases\" SET \"expires_at\" = (CASE WHEN (\"renewed_at\" < (statement_timestamp())) THEN \"renewed_at\" ELSE statement_timestamp() END) \
         WHERE \"resource\" = $1 AND \"holder\" = $2 AND \"expires_at\" > (statement_timestamp()) AND \"fencing_token\" = $3 AND \"expires_at\" = $4 RETURNING \"resource\", \"tableoid\") \
         SELECT pg_notify($5, $6 || \"tableoid\" || \'/\' || \"resource\") FROM \"released\""
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
        r#"SELECT "holder", "fencing_token", "expires_at", "acquired_at", "renewed_at", CAST(FLOOR(EXTRACT(EPOCH FROM ("expires_at" - statement_timestamp())) * 1000) AS BIGINT), CASE WHEN payload_token = fencing_token THEN payload END AS current_payload FROM "orionbeacon_leases" WHERE "resource" = $1"#
    );
    assert_eq!(values.0.len(), 1);
}

#[test]
fn sqlite_lease_modifier_is_exact() {
    let (_, values) = upsert(&Sqlite, &table(), "r", "me", 86_400_007, None)
        .unwrap()
        .build(SqliteQueryBuilder);
    assert!(
        values.0.contains(&"+86400.007 seconds".into()),
        "{values:?}"
    );
}

// The statement-level fence inside a caller's UPDATE: the lock clause must survive.
