//! MySQL's and MariaDB's takeover past a stalled holder (see `takeover`): the fence locks the
//! row `FOR UPDATE`, so its transaction has an id; `information_schema.INNODB_LOCK_WAITS` names
//! the transaction that blocks a wait on the lapsed row, and `KILL CONNECTION` ends it. That
//! needs the `PROCESS` privilege, and `CONNECTION ADMIN` (or `SUPER`) for a holder connected as
//! another user. MySQL 8, which has no `INNODB_LOCK_WAITS`, gets no takeover (a warning says
//! so).

use std::time::Duration;

use orion_beacon_entity::lease::Column;
use sea_orm::sea_query::{Alias, Expr, ExprTrait, Func, JoinType, Query, SelectStatement};

use crate::backend::dialect::Dialect;

/// MySQL/MariaDB: how long a blocking transaction's client must have been silent to be ended.
const SILENT_MS: i64 = 200;

/// MySQL/MariaDB: how soon after the look that found a blocking session the kill must go
/// out (the look and the kill are two statements).
pub(crate) const KILL_WITHIN: Duration = Duration::from_millis(100);

/// A string key as InnoDB prints it in `lock_data`: quoted, with `'` and `\` doubled.
fn innodb_key(resource: &str) -> String {
    format!("'{}'", resource.replace('\\', "\\\\").replace('\'', "''"))
}

/// MySQL/MariaDB: the connections whose transactions hold `resource`'s row locked while
/// another waits for it, if its term has lapsed by the database clock.
pub(crate) fn blockers(
    d: &dyn Dialect,
    table: &Alias,
    table_name: &str,
    resource: &str,
) -> SelectStatement {
    let is = |t: &str| (Alias::new("information_schema"), Alias::new(t));
    let (w, l, t, r, w2, p) = (
        Alias::new("w"),
        Alias::new("l"),
        Alias::new("t"),
        Alias::new("r"),
        Alias::new("w2"),
        Alias::new("p"),
    );
    let c = |a: &Alias, c: &str| Expr::col((a.clone(), Alias::new(c)));
    let lease_statement = format!("%`{table_name}`%");
    Query::select()
        .distinct()
        .expr(c(&t, "trx_mysql_thread_id"))
        .from_as(is("INNODB_LOCK_WAITS"), w.clone())
        .join_as(
            JoinType::InnerJoin,
            is("INNODB_LOCKS"),
            l.clone(),
            c(&l, "lock_id").equals((w.clone(), Alias::new("requested_lock_id"))),
        )
        .join_as(
            JoinType::InnerJoin,
            is("INNODB_TRX"),
            t.clone(),
            c(&t, "trx_id").equals((w.clone(), Alias::new("blocking_trx_id"))),
        )
        // The thread's state now (the INNODB_* tables are a snapshot up to 0.1 s old).
        .join_as(
            JoinType::InnerJoin,
            is("PROCESSLIST"),
            p.clone(),
            c(&p, "ID").equals((t.clone(), Alias::new("trx_mysql_thread_id"))),
        )
        .join_as(
            JoinType::InnerJoin,
            table.clone(),
            r.clone(),
            Expr::col((r.clone(), Column::Resource)).eq(resource),
        )
        .and_where(Expr::col((r.clone(), Column::ExpiresAt)).lte(d.now()))
        .and_where(
            c(&l, "lock_table").eq(Func::cust(Alias::new("CONCAT")).args([
                Expr::val("`"),
                Func::cust(Alias::new("DATABASE")).into(),
                Expr::val("`.`"),
                Expr::val(table_name),
                Expr::val("`"),
            ])),
        )
        .and_where(c(&l, "lock_index").eq("PRIMARY"))
        // As InnoDB prints the key (quotes doubled), compared byte for byte (information_schema
        // compares case-insensitively).
        .and_where(
            c(&l, "lock_data")
                .cast_as(Alias::new("BINARY"))
                .eq(Expr::val(innodb_key(resource)).cast_as(Alias::new("BINARY"))),
        )
        // A read-only transaction shows id 0, and so does every other: never a target.
        .and_where(c(&w, "blocking_trx_id").ne(0))
        .and_where(c(&t, "trx_mysql_thread_id").ne(Func::cust(Alias::new("CONNECTION_ID"))))
        .and_where(c(&t, "trx_mysql_thread_id").ne(0))
        // A transaction whose client has sent nothing for 200 ms (stopped, cut off), or that
        // runs a statement of the application's: never a statement naming the lease table (a
        // grant, renew or release holding the row for a moment), a commit, or a transaction
        // of the store's between its statements.
        .and_where(
            c(&p, "COMMAND")
                .eq("Sleep")
                .and(c(&p, "TIME_MS").gte(SILENT_MS))
                .or(c(&p, "COMMAND")
                    .ne("Sleep")
                    .and(c(&p, "INFO").not_like(lease_statement))
                    .and(c(&p, "INFO").not_like("COMMIT%"))),
        )
        // A transaction queued before ours is reported as blocking it too: only the holder.
        .and_where(
            Expr::exists(
                Query::select()
                    .expr(Expr::val(1))
                    .from_as(is("INNODB_LOCK_WAITS"), w2.clone())
                    .and_where(
                        c(&w2, "requested_lock_id")
                            .equals((w.clone(), Alias::new("blocking_lock_id"))),
                    )
                    .take(),
            )
            .not(),
        )
        .to_owned()
}

/// Whether the connection `id` is still there.
pub(crate) fn still_there(id: u64) -> SelectStatement {
    Query::select()
        .expr(Expr::val(1))
        .from((Alias::new("information_schema"), Alias::new("PROCESSLIST")))
        .and_where(Expr::col(Alias::new("ID")).eq(id))
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::mysql::MySql;
    use sea_orm::sea_query::MysqlQueryBuilder;

    #[test]
    fn keys_are_quoted_as_innodb_prints_them() {
        assert_eq!(innodb_key("r"), "'r'");
        assert_eq!(innodb_key("it's"), "'it''s'");
        assert_eq!(innodb_key(r"a\b"), r"'a\\b'");
    }

    #[test]
    fn takeover_sql() {
        let t = Alias::new("orionbeacon_leases");
        let (sql, values) =
            blockers(&MySql, &t, "orionbeacon_leases", "r").build(MysqlQueryBuilder);
        assert_eq!(
            sql,
            "SELECT DISTINCT `t`.`trx_mysql_thread_id` FROM `information_schema`.`INNODB_LOCK_WAITS` AS `w` INNER JOIN `information_schema`.`INNODB_LOCKS` AS `l` ON `l`.`lock_id` = `w`.`requested_lock_id` INNER JOIN `information_schema`.`INNODB_TRX` AS `t` ON `t`.`trx_id` = `w`.`blocking_trx_id` INNER JOIN `information_schema`.`PROCESSLIST` AS `p` ON `p`.`ID` = `t`.`trx_mysql_thread_id` INNER JOIN `orionbeacon_leases` AS `r` ON `r`.`resource` = ? WHERE `r`.`expires_at` <= (UTC_TIMESTAMP(6)) AND `l`.`lock_table` = CONCAT(?, DATABASE(), ?, ?, ?) AND `l`.`lock_index` = ? AND CAST(`l`.`lock_data` AS BINARY) = CAST(? AS BINARY) AND `w`.`blocking_trx_id` <> ? AND `t`.`trx_mysql_thread_id` <> CONNECTION_ID() AND `t`.`trx_mysql_thread_id` <> ? AND ((`p`.`COMMAND` = ? AND `p`.`TIME_MS` >= ?) OR (`p`.`COMMAND` <> ? AND `p`.`INFO` NOT LIKE ? AND `p`.`INFO` NOT LIKE ?)) AND (NOT EXISTS(SELECT ? FROM `information_schema`.`INNODB_LOCK_WAITS` AS `w2` WHERE `w2`.`requested_lock_id` = `w`.`blocking_lock_id`))"
        );
        assert_eq!(values.0.len(), 15);
    }
}
