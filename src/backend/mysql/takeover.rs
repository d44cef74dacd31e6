//! MySQL's and MariaDB's takeover past a stalled holder (see `takeover`): the fence locks the
//! row `FOR UPDATE`, so its transaction has an id; `information_schema.INNODB_LOCK_WAITS` names
//! the transaction that blocks a wait on the lapsed row, and `KILL CONNECTION` ends it. That
//! needs the `PROCESS` privilege, and `CONNECTION ADMIN` (or `SUPER`) for a holder connected as
//! another user. MySQL 8, which has no `INNODB_LOCK_WAITS`, gets no takeover.
//!
//! The `INNODB_*` tables are a cache that InnoDB refreshes only after 100 ms without readers:
//! a dashboard reading them more often freezes it, so what they say may be seconds old. So a
//! blocker they name is ended only when the live views say it is still the same transaction
//! and has done nothing since before the acquire began waiting:
//!
//! - the wait is on exactly this row: this table (compared byte for byte, as the server names
//!   it) and this key, as InnoDB prints it; a key that prints like another row's of the table
//!   (InnoDB prints characters outside the BMP as `?`) is never taken over;
//! - `SHOW ENGINE INNODB STATUS` (never cached) shows the blocker's connection still in that
//!   transaction (so it still holds the row's lock);
//! - `PROCESSLIST` (never cached) shows its client silent, or in one statement that is not ours,
//!   for at least as long as the acquire has waited.

use std::collections::HashMap;
use std::time::Duration;

use orion_beacon_entity::lease::Column;
use sea_orm::sea_query::{Alias, Expr, ExprTrait, Func, JoinType, Query, SelectStatement};

use crate::backend::dialect::Dialect;

/// MySQL/MariaDB: how soon after the look that found a blocking session the kill must go
/// out (the look and the kill are separate statements).
pub(crate) const KILL_WITHIN: Duration = Duration::from_millis(100);

/// A string key as InnoDB prints it in `lock_data`: characters outside the BMP as `?` (it
/// prints in utf8mb3), quoted, with `'` and `\` doubled.
fn innodb_key(resource: &str) -> String {
    let printed: String = resource
        .chars()
        .map(|c| if u32::from(c) > 0xFFFF { '?' } else { c })
        .collect();
    format!("'{}'", printed.replace('\\', "\\\\").replace('\'', "''"))
}

/// `CAST(e AS BINARY)`: compared byte for byte, whatever the collation (information_schema's
/// compares case-insensitively).
fn binary(e: Expr) -> Expr {
    e.cast_as(Alias::new("BINARY"))
}

/// MySQL/MariaDB: the connections and transaction ids that hold `resource`'s row locked while
/// another waits for it, if its term has lapsed by the database clock and the connection has
/// been silent (or in a statement of the application's) at least `waited_ms`; as
/// `(thread id, transaction id)`. The `INNODB_*` part may be stale: see the module's notes.
pub(crate) fn blockers(
    d: &dyn Dialect,
    table: &Alias,
    table_name: &str,
    resource: &str,
    waited_ms: i64,
) -> SelectStatement {
    let is = |t: &str| (Alias::new("information_schema"), Alias::new(t));
    let (w, l, t, r, w2, p, o) = (
        Alias::new("w"),
        Alias::new("l"),
        Alias::new("t"),
        Alias::new("r"),
        Alias::new("w2"),
        Alias::new("p"),
        Alias::new("o"),
    );
    let c = |a: &Alias, c: &str| Expr::col((a.clone(), Alias::new(c)));
    let lease_statement = format!("%`{table_name}`%");
    // Utf8mb3, as InnoDB prints keys.
    let printed = |a: &Alias| {
        binary(Expr::cust_with_exprs(
            "CONVERT(? USING utf8mb3)",
            [Expr::col((a.clone(), Column::Resource))],
        ))
    };
    Query::select()
        .distinct()
        .expr(c(&t, "trx_mysql_thread_id"))
        .expr(c(&t, "trx_id").cast_as(Alias::new("CHAR")))
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
        // The thread's state now (never cached).
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
        // This table, byte for byte (two tables whose names differ only in case are two).
        .and_where(
            binary(c(&l, "lock_table")).eq(binary(
                Func::cust(Alias::new("CONCAT"))
                    .args([
                        Expr::val("`"),
                        Func::cust(Alias::new("DATABASE")).into(),
                        Expr::val("`.`"),
                        // As the server stores the name: in lower case where it folds them.
                        Expr::cust_with_values(
                            "IF(@@lower_case_table_names = 0, ?, LOWER(?))",
                            [table_name, table_name],
                        ),
                        Expr::val("`"),
                    ])
                    .into(),
            )),
        )
        .and_where(c(&l, "lock_index").eq("PRIMARY"))
        // A wait for the row itself: never for the gap before it (an insert of another key).
        .and_where(c(&l, "lock_mode").not_like("%GAP%"))
        .and_where(c(&l, "lock_mode").not_like("%INSERT_INTENTION%"))
        // As InnoDB prints the key, byte for byte ...
        .and_where(binary(c(&l, "lock_data")).eq(binary(Expr::val(innodb_key(resource)))))
        // ... and no other row of the table prints alike.
        .and_where(
            Expr::exists(
                Query::select()
                    .expr(Expr::val(1))
                    .from_as(table.clone(), o.clone())
                    .and_where(printed(&o).eq(printed(&r)))
                    .and_where(
                        binary(Expr::col((o.clone(), Column::Resource)))
                            .ne(binary(Expr::col((r.clone(), Column::Resource)))),
                    )
                    .take(),
            )
            .not(),
        )
        // A read-only transaction shows id 0, and so does every other: never a target.
        .and_where(c(&w, "blocking_trx_id").ne(0))
        .and_where(c(&t, "trx_mysql_thread_id").ne(Func::cust(Alias::new("CONNECTION_ID"))))
        .and_where(c(&t, "trx_mysql_thread_id").ne(0))
        // A client that has sent nothing since before the acquire began waiting (stopped, cut
        // off), or that runs one statement of the application's since then: never a statement
        // naming the lease table (a grant, renew or release holding the row for a moment), a
        // commit, or a transaction of the store's between its statements.
        .and_where(c(&p, "TIME_MS").gte(waited_ms))
        .and_where(
            c(&p, "COMMAND").eq("Sleep").or(c(&p, "COMMAND")
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

/// The read-write transaction each connection is in now, from the text of `SHOW ENGINE
/// INNODB STATUS` (never cached): each `---TRANSACTION <id>, ACTIVE ...` entry is followed by a
/// line that begins `MariaDB thread id <n>,` (MySQL: `MySQL thread id`). Left out: transactions
/// not started (they hold no locks), ids at or above the `Trx id counter` (InnoDB prints a
/// made-up id, stable per connection, for a transaction without a read-write id, so it cannot
/// tell one transaction of the connection from the next), and a connection named twice (the
/// text can carry a client's statement, which could imitate an entry). Transactions the text
/// leaves out (it is truncated past a size) are absent.
pub(crate) fn transactions_now(status: &str) -> HashMap<u64, String> {
    let mut now: HashMap<u64, String> = HashMap::new();
    let mut twice: Vec<u64> = Vec::new();
    let mut counter: Option<u128> = None;
    let mut trx: Option<String> = None;
    for line in status.lines() {
        if let Some(rest) = line.strip_prefix("Trx id counter ") {
            counter = rest.trim().parse().ok();
            continue;
        }
        if let Some(rest) = line.strip_prefix("---TRANSACTION ") {
            let mut fields = rest.splitn(2, ',');
            let id = fields.next().unwrap_or_default().trim();
            let active = fields
                .next()
                .is_some_and(|f| f.trim_start().starts_with("ACTIVE"));
            let real = match (id.parse::<u128>(), counter) {
                (Ok(id), Some(counter)) => id < counter,
                _ => false,
            };
            trx = (active && real).then(|| id.to_owned());
            continue;
        }
        if line.starts_with("---") || line.starts_with("===") {
            trx = None;
            continue;
        }
        let Some(rest) = line
            .strip_prefix("MariaDB thread id ")
            .or_else(|| line.strip_prefix("MySQL thread id "))
        else {
            continue;
        };
        let Some(id) = trx.take() else { continue };
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if let Ok(thread) = digits.parse::<u64>() {
            if now.insert(thread, id).is_some() {
                twice.push(thread);
            }
        }
    }
    for thread in twice {
        now.remove(&thread);
    }
    now
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
        // utf8mb3: outside the BMP, a question mark.
        assert_eq!(innodb_key("x-\u{1F600}"), "'x-?'");
        assert_eq!(innodb_key("x-é"), "'x-é'");
    }

    #[test]
    fn the_status_says_which_transaction_each_connection_is_in() {
        let status = "\
------------
TRANSACTIONS
------------
Trx id counter 1234
---TRANSACTION 1230, ACTIVE 3 sec
2 lock struct(s), heap size 1128, 1 row lock(s)
MariaDB thread id 17, OS thread handle 1407, query id 99 localhost root
---TRANSACTION 421937, not started
0 lock struct(s), heap size 1128, 0 row lock(s)
MariaDB thread id 18, OS thread handle 1408, query id 100 localhost root
---TRANSACTION 1229, ACTIVE 5 sec starting index read
mysql tables in use 1, locked 1
LOCK WAIT 2 lock struct(s), heap size 1128, 1 row lock(s)
MySQL thread id 21, OS thread handle 1409, query id 101 localhost root updating
------- TRX HAS BEEN WAITING 5 SEC FOR THIS LOCK TO BE GRANTED:
----------------------------
END OF INNODB MONITOR OUTPUT
";
        let now = transactions_now(status);
        assert_eq!(now.get(&17).map(String::as_str), Some("1230"));
        // Not started: holds nothing.
        assert_eq!(now.get(&18), None);
        assert_eq!(now.get(&21).map(String::as_str), Some("1229"));
        assert_eq!(now.len(), 2);
        assert!(transactions_now("").is_empty());
        // A made-up id (at or above the counter), and a thread named twice (a statement's text
        // imitating an entry): neither is taken.
        let imitated = "\
Trx id counter 1234
---TRANSACTION 421938, ACTIVE 1 sec
MariaDB thread id 30, OS thread handle 1, query id 1 localhost root
---TRANSACTION 1100, ACTIVE 9 sec
MariaDB thread id 31, OS thread handle 1, query id 2 localhost root
---TRANSACTION 1101, ACTIVE 1 sec
MariaDB thread id 31, OS thread handle 1, query id 3 localhost root
---TRANSACTION 1102, ACTIVE 1 sec
MariaDB thread id 32, OS thread handle 1, query id 4 localhost root
";
        let now = transactions_now(imitated);
        assert_eq!(now.get(&30), None);
        assert_eq!(now.get(&31), None);
        assert_eq!(now.get(&32).map(String::as_str), Some("1102"));
    }

    #[test]
    fn takeover_sql() {
        let t = Alias::new("orionbeacon_leases");
        let (sql, values) =
            blockers(&MySql, &t, "orionbeacon_leases", "r", 200).build(MysqlQueryBuilder);
        assert_eq!(
            sql,
            "SELECT DISTINCT `t`.`trx_mysql_thread_id`, CAST(`t`.`trx_id` AS CHAR) FROM `information_schema`.`INNODB_LOCK_WAITS` AS `w` INNER JOIN `information_schema`.`INNODB_LOCKS` AS `l` ON `l`.`lock_id` = `w`.`requested_lock_id` INNER JOIN `information_schema`.`INNODB_TRX` AS `t` ON `t`.`trx_id` = `w`.`blocking_trx_id` INNER JOIN `information_schema`.`PROCESSLIST` AS `p` ON `p`.`ID` = `t`.`trx_mysql_thread_id` INNER JOIN `orionbeacon_leases` AS `r` ON `r`.`resource` = ? WHERE `r`.`expires_at` <= (UTC_TIMESTAMP(6)) AND CAST(`l`.`lock_table` AS BINARY) = CAST(CONCAT(?, DATABASE(), ?, IF(@@lower_case_table_names = 0, ?, LOWER(?)), ?) AS BINARY) AND `l`.`lock_index` = ? AND `l`.`lock_mode` NOT LIKE ? AND `l`.`lock_mode` NOT LIKE ? AND CAST(`l`.`lock_data` AS BINARY) = CAST(? AS BINARY) AND (NOT EXISTS(SELECT ? FROM `orionbeacon_leases` AS `o` WHERE CAST((CONVERT(`o`.`resource` USING utf8mb3)) AS BINARY) = CAST((CONVERT(`r`.`resource` USING utf8mb3)) AS BINARY) AND CAST(`o`.`resource` AS BINARY) <> CAST(`r`.`resource` AS BINARY))) AND `w`.`blocking_trx_id` <> ? AND `t`.`trx_mysql_thread_id` <> CONNECTION_ID() AND `t`.`trx_mysql_thread_id` <> ? AND `p`.`TIME_MS` >= ? AND (`p`.`COMMAND` = ? OR (`p`.`COMMAND` <> ? AND `p`.`INFO` NOT LIKE ? AND `p`.`INFO` NOT LIKE ?)) AND (NOT EXISTS(SELECT ? FROM `information_schema`.`INNODB_LOCK_WAITS` AS `w2` WHERE `w2`.`requested_lock_id` = `w`.`blocking_lock_id`))"
        );
        assert_eq!(values.0.len(), 19);
    }
}
