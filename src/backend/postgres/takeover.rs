//! PostgreSQL's takeover past a stalled holder (see `takeover`): the fence also takes a shared
//! transaction-level advisory lock keyed by a 64-bit hash of (table, resource, token), which
//! `pg_locks` shows with its session; `pg_terminate_backend` ends the sessions that hold the
//! key of the lapsed row's term. That needs the same role as the holder, or membership of
//! `pg_signal_backend`.

use orion_beacon_entity::lease::Column;
use sea_orm::sea_query::{Alias, Expr, ExprTrait, Func, Query, SelectStatement};

use crate::backend::dialect::Dialect;
use crate::backend::term_checks::{share_locked_check, statement_check};
use crate::fencing::Term;

/// The advisory-lock key a fence marks its session with: FNV-1a (64 bits) over
/// the table, the resource and the token, so one key names one term of one resource.
pub(crate) fn marker_key(table: &str, resource: &str, token: i64) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = table
        .bytes()
        .chain([0])
        .chain(resource.bytes())
        .chain([0])
        .chain(token.to_le_bytes());
    for byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash as i64
}

/// `pg_try_advisory_xact_lock_shared(key)`: the marker a fence leaves on its
/// session until its transaction ends (true unless someone holds the key exclusively, which
/// nothing does; the fence never depends on the answer).
pub(crate) fn marker(table: &str, resource: &str, token: i64) -> Expr {
    Func::cust(Alias::new("pg_try_advisory_xact_lock_shared"))
        .arg(marker_key(table, resource, token))
        .into()
}

/// The token of `resource`'s row if its lease has lapsed by the database clock.
pub(crate) fn lapsed(d: &dyn Dialect, table: &Alias, resource: &str) -> SelectStatement {
    Query::select()
        .column(Column::FencingToken)
        .from(table.clone())
        .and_where(Expr::col(Column::Resource).eq(resource))
        .and_where(Expr::col(Column::ExpiresAt).lte(d.now()))
        .to_owned()
}

/// Ends the sessions that hold the marker of `resource`'s term `token`, if the row
/// is still that term, lapsed by the database clock; one row per session signalled.
pub(crate) fn takeover(
    d: &dyn Dialect,
    table: &Alias,
    table_name: &str,
    resource: &str,
    token: i64,
) -> SelectStatement {
    let l = Alias::new("l");
    let col = |c: &str| Expr::col((l.clone(), Alias::new(c)));
    // pg_locks shows a bigint key as its high (classid) and low (objid) 32 bits, objsubid 1.
    let key = marker_key(table_name, resource, token) as u64;
    let (high, low) = ((key >> 32) as i64, (key & 0xffff_ffff) as i64);
    Query::select()
        .expr(Func::cust(Alias::new("pg_terminate_backend")).arg(col("pid")))
        .from_as(Alias::new("pg_locks"), l.clone())
        .and_where(col("locktype").eq("advisory"))
        .and_where(col("mode").eq("ShareLock"))
        .and_where(col("granted").eq(true))
        .and_where(col("objsubid").eq(1))
        .and_where(col("classid").cast_as(Alias::new("bigint")).eq(high))
        .and_where(col("objid").cast_as(Alias::new("bigint")).eq(low))
        .and_where(
            col("database").eq(Query::select()
                .column(Alias::new("oid"))
                .from(Alias::new("pg_database"))
                .and_where(
                    Expr::col(Alias::new("datname")).eq(Func::cust(Alias::new("current_database"))),
                )
                .take()),
        )
        .and_where(col("pid").ne(Func::cust(Alias::new("pg_backend_pid"))))
        .and_where(Expr::exists(
            lapsed(d, table, resource)
                .and_where(Expr::col(Column::FencingToken).eq(token))
                .take(),
        ))
        .to_owned()
}

/// The transactional fence's check: [`share_locked_check`] with the session's marker, which a
/// takeover past a stalled holder finds it by (see `takeover`).
pub(crate) fn locking_check(
    d: &dyn Dialect,
    table: &Alias,
    table_name: &str,
    term: &Term<'_>,
) -> SelectStatement {
    let mut check = share_locked_check(d, table, term);
    check.expr(marker(table_name, term.resource, term.token.get()));
    check
}

/// The subquery of the statement-level fence: [`statement_check`] with the same marker.
pub(crate) fn statement_fence(
    d: &dyn Dialect,
    table: &Alias,
    table_name: &str,
    term: &Term<'_>,
) -> SelectStatement {
    let mut check = statement_check(d, table, term);
    // Never gating the fence: the marker is taken, whatever it answers.
    check.and_where(marker(table_name, term.resource, term.token.get()).is_not_null());
    check
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::postgres::Postgres;
    use sea_orm::sea_query::PostgresQueryBuilder;

    #[test]
    fn the_marker_key_names_one_term_of_one_resource() {
        let t = "orionbeacon_leases";
        assert_eq!(marker_key(t, "r", 7), marker_key(t, "r", 7));
        assert_ne!(marker_key(t, "r", 7), marker_key(t, "s", 7));
        assert_ne!(marker_key(t, "r", 7), marker_key(t, "r", 8));
        assert_ne!(marker_key(t, "r", 7), marker_key("other", "r", 7));
        assert_ne!(marker_key("a", "bc", 1), marker_key("ab", "c", 1));
    }

    #[test]
    fn takeover_sql() {
        let t = Alias::new("orionbeacon_leases");
        let (sql, values) =
            takeover(&Postgres, &t, "orionbeacon_leases", "r", 7).build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            r#"SELECT pg_terminate_backend("l"."pid") FROM "pg_locks" AS "l" WHERE "l"."locktype" = $1 AND "l"."mode" = $2 AND "l"."granted" = $3 AND "l"."objsubid" = $4 AND CAST("l"."classid" AS bigint) = $5 AND CAST("l"."objid" AS bigint) = $6 AND "l"."database" = (SELECT "oid" FROM "pg_database" WHERE "datname" = current_database()) AND "l"."pid" <> pg_backend_pid() AND EXISTS(SELECT "fencing_token" FROM "orionbeacon_leases" WHERE "resource" = $7 AND "expires_at" <= (statement_timestamp()) AND "fencing_token" = $8)"#
        );
        assert_eq!(values.0.len(), 8);
        let (sql, _) = lapsed(&Postgres, &t, "r").build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            r#"SELECT "fencing_token" FROM "orionbeacon_leases" WHERE "resource" = $1 AND "expires_at" <= (statement_timestamp())"#
        );
    }
}
