//! The statements that check a term is current, shared by the fences of every backend with
//! row locks (each backend adds its own lock phrase or marker in its folder).

use orion_beacon_entity::lease::Column;
use sea_orm::sea_query::{Alias, Expr, ExprTrait, Query, SelectStatement};

use super::dialect::Dialect;
use crate::fencing::Term;

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
mod tests {
    use super::*;
    use crate::backend::statements::tests::term;
    use crate::backend::{postgres::Postgres, sqlite::Sqlite};
    use sea_orm::sea_query::{MysqlQueryBuilder, PostgresQueryBuilder, SqliteQueryBuilder};

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
            &term(),
        ))
        .build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            r#"UPDATE "jobs" SET "owner_token" = $1 WHERE "id" = $2 AND EXISTS(SELECT $3 FROM "orionbeacon_leases" WHERE "resource" = $4 AND "holder" = $5 AND "fencing_token" = $6 AND "expires_at" > (statement_timestamp()) AND (CASE WHEN "resource" = $7 AND "holder" = $8 AND "fencing_token" = $9 AND "expires_at" > (statement_timestamp()) THEN pg_try_advisory_xact_lock_shared(hashtextextended(concat_ws('/', "tableoid", "resource", "fencing_token"), 0)) IS NOT NULL ELSE FALSE END) FOR SHARE)"#
        );
        assert_eq!(values.0.len(), 9);
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
        let (sql, values) =
            crate::backend::postgres::takeover::locking_check(&Postgres, &t, &term())
                .build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            r#"SELECT $1, pg_try_advisory_xact_lock_shared(hashtextextended(concat_ws('/', "tableoid", "resource", "fencing_token"), 0)) FROM "orionbeacon_leases" WHERE "resource" = $2 AND "holder" = $3 AND "fencing_token" = $4 AND "expires_at" > (statement_timestamp()) FOR SHARE"#
        );
        assert_eq!(values.0.len(), 4);
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
