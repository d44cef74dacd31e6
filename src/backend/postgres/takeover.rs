//! PostgreSQL's takeover past a stalled holder (see `takeover`). The fence also takes a shared
//! transaction-level advisory lock, the session's marker, keyed by a hash of the lease row's own
//! table OID (`tableoid`), resource and token: one key per term of one resource of one table,
//! whatever the schema or `search_path` (two tenants' tables of the same name have different
//! OIDs). The takeover runs while an acquire waits for the lapsed row and ends a session only
//! when all of these hold, in one statement:
//!
//! - it blocks a wait on exactly this row (`pg_blocking_pids` of the sessions queued on the
//!   row's tuple: this table's OID, this row's `ctid`);
//! - it holds the marker of the row's term, and the row has lapsed by the database clock;
//! - it has been idle in that transaction (or running one statement) for the whole wait.
//!
//! `pg_terminate_backend` needs the same role as the holder, or membership of
//! `pg_signal_backend` (and `pg_read_all_stats` to see another role's session state).

use orion_beacon_entity::lease::Column;
use sea_orm::sea_query::{
    Alias, CommonTableExpression, Expr, ExprTrait, Func, Query, SelectStatement, WithClause,
    WithQuery,
};

use crate::backend::dialect::Dialect;
use crate::backend::term_checks::{share_locked_check, statement_check};
use crate::fencing::Term;

/// The marker key of the row in `from` (a table alias, or the table itself): a 64-bit hash of
/// its table's OID, its resource and its token, computed by the server from the row itself.
fn marker_key(from: Option<&str>) -> Expr {
    let col = |c: &str| match from {
        Some(alias) => format!("\"{alias}\".\"{c}\""),
        None => format!("\"{c}\""),
    };
    Expr::cust(format!(
        "hashtextextended(concat_ws('/', {}, {}, {}), 0)",
        col("tableoid"),
        col("resource"),
        col("fencing_token")
    ))
}

/// `pg_try_advisory_xact_lock_shared(key)`: the marker a fence leaves on its session until its
/// transaction ends (true unless someone holds the key exclusively, which nothing does; the
/// fence never depends on the answer).
fn marker() -> Expr {
    Func::cust(Alias::new("pg_try_advisory_xact_lock_shared"))
        .arg(marker_key(None))
        .into()
}

/// Ends the sessions that block a wait on `resource`'s row, hold the marker of its term, and
/// have been idle in their transaction (or in one statement) at least `idle_ms`, if the row has
/// lapsed by the database clock. One row per blocking session of the lapsed term: whether it
/// was signalled, and whether its state is hidden from this role.
///
/// The lapsed row and the blockers of its waiters are computed once each (common table
/// expressions: `pg_blocking_pids` takes the lock manager's locks, so it runs once per waiter,
/// not once per session of the server).
pub(crate) fn takeover(d: &dyn Dialect, table: &Alias, resource: &str, idle_ms: i64) -> WithQuery {
    let (a, r, w, m, b) = (
        Alias::new("a"),
        Alias::new("r"),
        Alias::new("w"),
        Alias::new("m"),
        Alias::new("b"),
    );
    let c = |t: &Alias, c: &str| Expr::col((t.clone(), Alias::new(c)));
    let this_database = || {
        Query::select()
            .column(Alias::new("oid"))
            .from(Alias::new("pg_database"))
            .and_where(
                Expr::col(Alias::new("datname")).eq(Func::cust(Alias::new("current_database"))),
            )
            .take()
    };
    // The lapsed row: its table's OID, its tuple, its term.
    let lapsed = Query::select()
        .expr_as(Expr::col(Alias::new("tableoid")), Alias::new("tableoid"))
        .expr_as(
            Expr::cust("(CAST(CAST(\"ctid\" AS text) AS point))[0]"),
            Alias::new("page"),
        )
        .expr_as(
            Expr::cust("(CAST(CAST(\"ctid\" AS text) AS point))[1]"),
            Alias::new("tuple"),
        )
        .column(Column::Resource)
        .column(Column::FencingToken)
        .from(table.clone())
        .and_where(Expr::col(Column::Resource).eq(resource))
        .and_where(Expr::col(Column::ExpiresAt).lte(d.now()))
        .to_owned();
    // The sessions that block one queued on exactly that row: this table (by OID, in this
    // database), this tuple (numbers compared: no cast that a row of another kind could fail).
    let blockers = Query::select()
        .distinct()
        .expr_as(
            Func::cust(Alias::new("unnest"))
                .arg(Func::cust(Alias::new("pg_blocking_pids")).arg(c(&w, "pid"))),
            Alias::new("pid"),
        )
        .from_as(Alias::new("pg_locks"), w.clone())
        .from(r.clone())
        .and_where(c(&w, "locktype").eq("tuple"))
        .and_where(c(&w, "database").eq(this_database()))
        .and_where(c(&w, "relation").equals((r.clone(), Alias::new("tableoid"))))
        .and_where(
            c(&w, "page")
                .cast_as(Alias::new("float8"))
                .equals((r.clone(), Alias::new("page"))),
        )
        .and_where(
            c(&w, "tuple")
                .cast_as(Alias::new("float8"))
                .equals((r.clone(), Alias::new("tuple"))),
        )
        .to_owned();
    // The marker of the row's term (pg_locks shows a bigint key as its high 32 bits in classid
    // and its low 32 bits in objid, objsubid 1).
    let key = marker_key(Some("r"));
    let marked = Query::select()
        .expr(Expr::val(1))
        .from_as(Alias::new("pg_locks"), m.clone())
        .and_where(c(&m, "pid").equals((a.clone(), Alias::new("pid"))))
        .and_where(c(&m, "locktype").eq("advisory"))
        .and_where(c(&m, "mode").eq("ShareLock"))
        .and_where(c(&m, "granted").eq(true))
        .and_where(c(&m, "objsubid").eq(1))
        .and_where(c(&m, "database").eq(this_database()))
        .and_where(Expr::cust_with_exprs(
            "CAST(\"m\".\"classid\" AS bigint) = (($1 >> 32) & 4294967295)",
            [key.clone()],
        ))
        .and_where(Expr::cust_with_exprs(
            "CAST(\"m\".\"objid\" AS bigint) = ($1 & 4294967295)",
            [key],
        ))
        .take();
    let since = || {
        Expr::cust_with_values(
            "clock_timestamp() - make_interval(secs => $1)",
            [idle_ms as f64 / 1000.0],
        )
    };
    // Stalled: idle inside the transaction, or in one statement, at least `idle_ms`.
    let stalled = c(&a, "state")
        .is_in(["idle in transaction", "idle in transaction (aborted)"])
        .and(c(&a, "state_change").lte(since()))
        .or(c(&a, "state")
            .eq("active")
            .and(c(&a, "query_start").lte(since())));
    // Signalled only when stalled (a CASE is evaluated in order); a session whose state the
    // server hides from this role (another role's, without pg_read_all_stats) is reported.
    let select = Query::select()
        .expr(Expr::cust_with_exprs(
            "CASE WHEN $1 THEN pg_terminate_backend(\"a\".\"pid\") ELSE FALSE END",
            [stalled],
        ))
        .expr(c(&a, "state").is_null())
        .from_as(Alias::new("pg_stat_activity"), a.clone())
        .from(b.clone())
        .from(r.clone())
        .and_where(c(&b, "pid").equals((a.clone(), Alias::new("pid"))))
        .and_where(c(&a, "pid").ne(Func::cust(Alias::new("pg_backend_pid"))))
        .and_where(Expr::exists(marked))
        .to_owned();
    let with = WithClause::new()
        .cte(
            CommonTableExpression::new()
                .query(lapsed)
                .table_name(r)
                .to_owned(),
        )
        .cte(
            CommonTableExpression::new()
                .query(blockers)
                .table_name(b)
                .to_owned(),
        )
        .to_owned();
    select.with(with)
}

/// The transactional fence's check: [`share_locked_check`] with the session's marker, taken
/// for the row the check admits (a select-list expression, evaluated for matched rows only).
pub(crate) fn locking_check(d: &dyn Dialect, table: &Alias, term: &Term<'_>) -> SelectStatement {
    let mut check = share_locked_check(d, table, term);
    check.expr(marker());
    check
}

/// The subquery of the statement-level fence: [`statement_check`] with the same marker, taken
/// only when the check admits (a `CASE` is evaluated in order; never gating the fence: the
/// marker is taken, whatever it answers).
pub(crate) fn statement_fence(d: &dyn Dialect, table: &Alias, term: &Term<'_>) -> SelectStatement {
    let mut check = statement_check(d, table, term);
    check.and_where(Expr::cust_with_exprs(
        "CASE WHEN $1 THEN $2 IS NOT NULL ELSE FALSE END",
        [term.current(d), marker()],
    ));
    check
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::postgres::Postgres;
    use sea_orm::sea_query::PostgresQueryBuilder;

    #[test]
    fn takeover_sql() {
        let t = Alias::new("orionbeacon_leases");
        let (sql, values) = takeover(&Postgres, &t, "r", 200).build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            r#"WITH "r" AS (SELECT "tableoid" AS "tableoid", (CAST(CAST("ctid" AS text) AS point))[0] AS "page", (CAST(CAST("ctid" AS text) AS point))[1] AS "tuple", "resource", "fencing_token" FROM "orionbeacon_leases" WHERE "resource" = $1 AND "expires_at" <= (statement_timestamp())) , "b" AS (SELECT DISTINCT unnest(pg_blocking_pids("w"."pid")) AS "pid" FROM "pg_locks" AS "w", "r" WHERE "w"."locktype" = $2 AND "w"."database" = (SELECT "oid" FROM "pg_database" WHERE "datname" = current_database()) AND "w"."relation" = "r"."tableoid" AND CAST("w"."page" AS float8) = "r"."page" AND CAST("w"."tuple" AS float8) = "r"."tuple") SELECT CASE WHEN ("a"."state" IN ($3, $4) AND "a"."state_change" <= (clock_timestamp() - make_interval(secs => $5))) OR ("a"."state" = $6 AND "a"."query_start" <= (clock_timestamp() - make_interval(secs => $7))) THEN pg_terminate_backend("a"."pid") ELSE FALSE END, "a"."state" IS NULL FROM "pg_stat_activity" AS "a", "b", "r" WHERE "b"."pid" = "a"."pid" AND "a"."pid" <> pg_backend_pid() AND EXISTS(SELECT $8 FROM "pg_locks" AS "m" WHERE "m"."pid" = "a"."pid" AND "m"."locktype" = $9 AND "m"."mode" = $10 AND "m"."granted" = $11 AND "m"."objsubid" = $12 AND "m"."database" = (SELECT "oid" FROM "pg_database" WHERE "datname" = current_database()) AND (CAST("m"."classid" AS bigint) = ((hashtextextended(concat_ws('/', "r"."tableoid", "r"."resource", "r"."fencing_token"), 0) >> 32) & 4294967295)) AND (CAST("m"."objid" AS bigint) = (hashtextextended(concat_ws('/', "r"."tableoid", "r"."resource", "r"."fencing_token"), 0) & 4294967295)))"#
        );
        assert_eq!(values.0.len(), 12);
    }
}
