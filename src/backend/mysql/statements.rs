//! MySQL's and MariaDB's own statements: the conditional `INSERT ... ON DUPLICATE KEY UPDATE`
//! (every assignment conditional, in an order that gives the same row under
//! `SIMULTANEOUS_ASSIGNMENT`: see the module above), and MariaDB's form of it with `RETURNING`.

use orion_beacon_entity::lease::Column;
use sea_orm::sea_query::{
    Alias, Expr, ExprTrait, InsertStatement, LockBehavior, LockType, MysqlQueryBuilder, OnConflict,
    Query, SelectStatement, UpdateStatement,
};
use sea_orm::{DbBackend, DbErr, Statement};

use super::MySql;
use crate::backend::dialect::Dialect;
use crate::backend::statements::{
    current_payload, held_rows, insert_new_row, next_expiry, renew_set, renewed_row, returned_row,
    with_payload,
};
use crate::backend::term_checks::share_locked_check;
use crate::fencing::Term;

/// The conditional upsert (without `RETURNING`).
///
/// The payload columns are assigned first, while every column still
/// holds its old value in either assignment mode: `payload` when the lease is granted (a new
/// term or a renew), `payload_token` to the token the row is about to have.
pub(crate) fn upsert(
    table: &Alias,
    resource: &str,
    candidate: &str,
    millis: i64,
    payload: Option<&str>,
) -> Result<InsertStatement, DbErr> {
    let d = MySql;
    let col = |c: Column| Expr::col(c);
    let expired = || col(Column::ExpiresAt).lte(d.now());
    let on_duplicate = OnConflict::column(Column::Resource)
        .values([
            (
                Column::Payload,
                Expr::case(
                    col(Column::Holder).eq(candidate).or(expired()),
                    Expr::val(payload.map(str::to_owned)),
                )
                .finally(col(Column::Payload))
                .into(),
            ),
            (
                Column::PayloadToken,
                Expr::case(expired(), col(Column::FencingToken).add(1i64))
                    .case(col(Column::Holder).eq(candidate), col(Column::FencingToken))
                    .finally(col(Column::PayloadToken))
                    .into(),
            ),
            // Old row: new term, renew by the holder, or untouched.
            (
                Column::RenewedAt,
                Expr::case(expired(), d.now())
                    .case(
                        col(Column::Holder).eq(candidate),
                        d.greatest(d.now(), d.one_tick_after(col(Column::AcquiredAt))),
                    )
                    .finally(col(Column::RenewedAt))
                    .into(),
            ),
            (
                Column::AcquiredAt,
                Expr::case(expired(), d.now())
                    .finally(col(Column::AcquiredAt))
                    .into(),
            ),
            (
                Column::FencingToken,
                Expr::case(expired(), col(Column::FencingToken).add(1i64))
                    .finally(col(Column::FencingToken))
                    .into(),
            ),
            (
                Column::Holder,
                Expr::case(expired(), Expr::val(candidate))
                    .finally(col(Column::Holder))
                    .into(),
            ),
            // Granted (a new term or a renew), read with `holder` new or old: see the module.
            // `expires_at` is the old one here in either mode (it is assigned last).
            (
                Column::ExpiresAt,
                Expr::case(
                    col(Column::Holder).eq(candidate).or(expired()),
                    next_expiry(&d, col(Column::ExpiresAt), millis),
                )
                .finally(col(Column::ExpiresAt))
                .into(),
            ),
        ])
        .to_owned();
    let mut stmt = insert_new_row(&d, table, resource, candidate, millis, payload)?;
    stmt.on_conflict(on_duplicate);
    Ok(stmt)
}

/// The last column of the MariaDB form's `RETURNING` list: 1 inside a transaction.
pub(crate) const IN_TRANSACTION: &str = "CAST(@@in_transaction AS SIGNED)";
/// Its index.
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) const IN_TRANSACTION_COLUMN: usize = 6;

/// MariaDB: how long the acquire's upsert waits for a row lock, at most (its own
/// `innodb_lock_wait_timeout`, for that statement only).
pub(crate) const LOCK_WAIT_SECONDS: u64 = 1;

/// The MariaDB form: the upsert with a `RETURNING` clause of the lease row, which sea-query's
/// MySQL builder would drop. The clause is rendered by sea-query as a select list (it has no
/// parameters) and appended.
pub(crate) fn upsert_returning(
    table: &Alias,
    resource: &str,
    candidate: &str,
    millis: i64,
    payload: Option<&str>,
) -> Result<Statement, DbErr> {
    let (upsert, values) =
        upsert(table, resource, candidate, millis, payload)?.build(MysqlQueryBuilder);
    // The statement waits for a row lock at most LOCK_WAIT_SECONDS (the server counts whole
    // seconds), then fails (1205): an acquire its caller gave up on waits no longer on the
    // server, whatever the stall of the row's holder.
    let mut sql =
        format!("SET STATEMENT innodb_lock_wait_timeout = {LOCK_WAIT_SECONDS} FOR {upsert}");
    let list = Query::select()
        .exprs(returned_row(&MySql))
        .to_string(MysqlQueryBuilder);
    let list = list
        .strip_prefix("SELECT ")
        .ok_or_else(|| DbErr::Custom(format!("unexpected select list: {list}")))?;
    sql.push_str(" RETURNING ");
    sql.push_str(list);
    // Whether the statement ran inside a transaction (then it has not committed): see
    // `sessions`.
    sql.push_str(", ");
    sql.push_str(IN_TRANSACTION);
    let payload = Query::select()
        .expr(current_payload())
        .to_string(MysqlQueryBuilder);
    let payload = payload
        .strip_prefix("SELECT ")
        .ok_or_else(|| DbErr::Custom(format!("unexpected select list: {payload}")))?;
    sql.push_str(", ");
    sql.push_str(payload);
    Ok(Statement::from_sql_and_values(
        DbBackend::MySql,
        sql,
        values,
    ))
}

/// The transactional fence's check: the row locked `FOR UPDATE`, so that the transaction has
/// an id a takeover can find (a read-only one shows none).
pub(crate) fn locking_check(d: &dyn Dialect, table: &Alias, term: &Term<'_>) -> SelectStatement {
    let mut check = share_locked_check(d, table, term);
    check.lock_exclusive();
    check
}

/// Galera: the check as a write of the lease row, the expiry one microsecond later (the lease
/// only ever looks longer to a dirty reader, never shorter). [`galera_untouch`] puts it back
/// in the same transaction; the row's key stays in the write set either way, so certification
/// orders this transaction against any rival's acquire on another node.
pub(crate) fn galera_touch(d: &dyn Dialect, table: &Alias, term: &Term<'_>) -> UpdateStatement {
    Query::update()
        .table(table.clone())
        .value(
            Column::ExpiresAt,
            Expr::cust_with_exprs("? + INTERVAL 1 MICROSECOND", [Expr::col(Column::ExpiresAt)]),
        )
        .and_where(term.current(d))
        .to_owned()
}

/// Galera: undoes [`galera_touch`] on the row this transaction holds locked.
pub(crate) fn galera_untouch(table: &Alias, term: &Term<'_>) -> UpdateStatement {
    Query::update()
        .table(table.clone())
        .value(
            Column::ExpiresAt,
            Expr::cust_with_exprs("? - INTERVAL 1 MICROSECOND", [Expr::col(Column::ExpiresAt)]),
        )
        .and_where(Expr::col(Column::Resource).eq(term.resource))
        .and_where(Expr::col(Column::Holder).eq(term.holder))
        .and_where(Expr::col(Column::FencingToken).eq(term.token.get()))
        .to_owned()
}

/// The rows of a batch renew, from its JSON document (see `held_json`), in the lease
/// table's binary collation (MariaDB 10.6+ and MySQL 8.0 have `JSON_TABLE`).
pub(crate) fn held(json: String) -> Expr {
    Expr::cust_with_values(format!("SELECT `r`, `h`, `t` FROM {JSON_ROWS}"), [json])
}

/// The batch's rows as a table, `held (r, h, t)`, from the one bound JSON document.
const JSON_ROWS: &str = "JSON_TABLE(?, '$[*]' COLUMNS (\
     `r` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.r', \
     `h` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.h', \
     `t` BIGINT PATH '$.t')) AS `held`";

/// The batch's rows, then the lease table through its primary key: what a batch statement
/// reads from in place of the table (`STRAIGHT_JOIN` puts the batch's rows first, and
/// `FORCE INDEX` makes the table's rows key lookups, with [`batch_keys`] in the `WHERE`), so
/// that no statement of the batch scans the table and locks or waits for a row that is not
/// the batch's (a small table is otherwise scanned whole, and every row read locked, under
/// REPEATABLE READ).
fn batch_join(quoted: &str) -> String {
    format!("{JSON_ROWS} STRAIGHT_JOIN {quoted} FORCE INDEX (PRIMARY)")
}

/// The condition that joins the batch's rows to their lease rows by key, and keeps the live
/// ones.
fn batch_keys(table: &Alias) -> Expr {
    let held = Alias::new("held");
    let col = |c: Column| Expr::col((table.clone(), c));
    col(Column::Resource)
        .equals((held.clone(), Alias::new("r")))
        .and(col(Column::Holder).equals((held.clone(), Alias::new("h"))))
        .and(col(Column::FencingToken).equals((held, Alias::new("t"))))
        .and(col(Column::ExpiresAt).gt(MySql.now()))
}

/// `sql`, a statement sea-query rendered on `table`, with `from` (`FROM t` or `UPDATE t`)
/// reading from [`batch_join`] instead.
fn joined(sql: &str, table: &Alias, from: &str) -> Result<String, DbErr> {
    // The table name is validated (letters, digits, `_`): quoted as sea-query quotes it.
    let q = format!("`{}`", sea_orm::sea_query::Iden::to_string(table));
    let pattern = format!("{from} {q} ");
    if sql.matches(&pattern).count() != 1 {
        return Err(DbErr::Custom(format!("unexpected statement: {sql}")));
    }
    Ok(sql.replacen(&pattern, &format!("{from} {} ", batch_join(&q)), 1))
}

/// How a batch's locking read treats a row another transaction holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Busy {
    /// Left out (`SKIP LOCKED`): the batch.
    Skip,
    /// Waited for, at most [`LOCK_WAIT_SECONDS`] (MariaDB's `SET STATEMENT`): a lease
    /// renewed on its own.
    Wait,
    /// An error at once (`NOWAIT`): a lease renewed on its own where the server has no
    /// statement-level wait (MySQL).
    Fail,
}

/// The first statement of a batch renew's transaction: the batch's live rows, each locked
/// (`FOR UPDATE`) as [`Busy`] says; their keys (resource, holder, token) are the batch
/// [`renew_all`] then renews.
pub(crate) fn lock_batch(table: &Alias, json: String, busy: Busy) -> Result<Statement, DbErr> {
    let mut select = Query::select();
    select
        .columns([
            (table.clone(), Column::Resource),
            (table.clone(), Column::Holder),
            (table.clone(), Column::FencingToken),
        ])
        .from(table.clone())
        .and_where(batch_keys(table));
    match busy {
        Busy::Skip => select.lock_with_behavior(LockType::Update, LockBehavior::SkipLocked),
        Busy::Wait => select.lock(LockType::Update),
        Busy::Fail => select.lock_with_behavior(LockType::Update, LockBehavior::Nowait),
    };
    let (sql, values) = select.build(MysqlQueryBuilder);
    let mut sql = joined(&sql, table, "FROM")?;
    if busy == Busy::Wait {
        sql = format!("SET STATEMENT innodb_lock_wait_timeout = {LOCK_WAIT_SECONDS} FOR {sql}");
    }
    let mut all = vec![sea_orm::Value::from(json)];
    all.extend(values.0);
    Ok(Statement::from_sql_and_values(
        DbBackend::MySql,
        sql,
        sea_orm::Values(all),
    ))
}

/// MySQL/MariaDB have no `UPDATE ... RETURNING`: the batch renew of the rows [`lock_batch`]
/// locked, then (in the same transaction, before its commit) [`renewed`] reads what it
/// renewed.
///
/// The batch's rows are joined (see `batch_join`): with the shared form's
/// `(resource, holder, fencing_token) IN (SELECT ...)` MariaDB 10.11 takes quadratic time in
/// an `UPDATE` (60 s for 4,000 leases, so the first rows it renewed had lapsed again before it
/// finished), while the join looks each row up by its key. sea-query has no `UPDATE ... JOIN`:
/// the statement is its rendering of the shared renew, with the join spliced in for the
/// table's name.
pub(crate) fn renew_all(table: &Alias, json: String, millis: i64) -> Result<Statement, DbErr> {
    let (sql, values) = renew_set(&MySql, table, millis)
        .and_where(batch_keys(table))
        .build(MysqlQueryBuilder);
    let sql = joined(&sql, table, "UPDATE")?;
    let mut all = vec![sea_orm::Value::from(json)];
    all.extend(values.0);
    Ok(Statement::from_sql_and_values(
        DbBackend::MySql,
        sql,
        sea_orm::Values(all),
    ))
}

/// The rows [`renew_all`] renewed, read in its transaction: those of the batch that are live
/// now (a row it did not renew had lapsed or changed hands, and is not).
pub(crate) fn renewed(table: &Alias, json: String) -> SelectStatement {
    Query::select()
        .exprs(with_payload(renewed_row(&MySql)))
        .from(table.clone())
        .and_where(held_rows(&MySql, table, held(json)))
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::statements::tests::term;
    use crate::backend::statements::{current, release};

    // sea-query's MySQL builder drops clauses it lacks without a word: pin the exact SQL.
    #[test]
    fn upsert_keeps_every_assignment_conditional_and_order_independent() {
        let (sql, values) = upsert(&Alias::new("orionbeacon_leases"), "r", "me", 1500, None)
            .unwrap()
            .build(MysqlQueryBuilder);
        assert_eq!(
            sql,
            r#"INSERT INTO `orionbeacon_leases` (`resource`, `holder`, `fencing_token`, `expires_at`, `acquired_at`, `renewed_at`, `payload`, `payload_token`) VALUES (?, ?, ?, SYSDATE(6) + INTERVAL TIMESTAMPDIFF(MICROSECOND, NOW(6), UTC_TIMESTAMP(6)) MICROSECOND + INTERVAL ? MICROSECOND, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), ?, ?) ON DUPLICATE KEY UPDATE `payload` = (CASE WHEN (`holder` = ? OR `expires_at` <= (UTC_TIMESTAMP(6))) THEN ? ELSE `payload` END), `payload_token` = (CASE WHEN (`expires_at` <= (UTC_TIMESTAMP(6))) THEN `fencing_token` + ? WHEN (`holder` = ?) THEN `fencing_token` ELSE `payload_token` END), `renewed_at` = (CASE WHEN (`expires_at` <= (UTC_TIMESTAMP(6))) THEN UTC_TIMESTAMP(6) WHEN (`holder` = ?) THEN GREATEST(UTC_TIMESTAMP(6), `acquired_at` + INTERVAL 1 MICROSECOND) ELSE `renewed_at` END), `acquired_at` = (CASE WHEN (`expires_at` <= (UTC_TIMESTAMP(6))) THEN UTC_TIMESTAMP(6) ELSE `acquired_at` END), `fencing_token` = (CASE WHEN (`expires_at` <= (UTC_TIMESTAMP(6))) THEN `fencing_token` + ? ELSE `fencing_token` END), `holder` = (CASE WHEN (`expires_at` <= (UTC_TIMESTAMP(6))) THEN ? ELSE `holder` END), `expires_at` = (CASE WHEN (`holder` = ? OR `expires_at` <= (UTC_TIMESTAMP(6))) THEN GREATEST(SYSDATE(6) + INTERVAL TIMESTAMPDIFF(MICROSECOND, NOW(6), UTC_TIMESTAMP(6)) MICROSECOND + INTERVAL ? MICROSECOND, `expires_at` + INTERVAL 1 MICROSECOND) ELSE `expires_at` END)"#
        );
        assert_eq!(values.0.len(), 15, "{values:?}");
        assert!(
            values.0.contains(&1_500_000i64.into()),
            "lease in microseconds: {values:?}"
        );
    }

    #[test]
    fn mariadb_form_returns_the_row() {
        let stmt =
            upsert_returning(&Alias::new("orionbeacon_leases"), "r", "me", 1500, None).unwrap();
        assert_eq!(
            stmt.sql,
            r#"SET STATEMENT innodb_lock_wait_timeout = 1 FOR INSERT INTO `orionbeacon_leases` (`resource`, `holder`, `fencing_token`, `expires_at`, `acquired_at`, `renewed_at`, `payload`, `payload_token`) VALUES (?, ?, ?, SYSDATE(6) + INTERVAL TIMESTAMPDIFF(MICROSECOND, NOW(6), UTC_TIMESTAMP(6)) MICROSECOND + INTERVAL ? MICROSECOND, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), ?, ?) ON DUPLICATE KEY UPDATE `payload` = (CASE WHEN (`holder` = ? OR `expires_at` <= (UTC_TIMESTAMP(6))) THEN ? ELSE `payload` END), `payload_token` = (CASE WHEN (`expires_at` <= (UTC_TIMESTAMP(6))) THEN `fencing_token` + ? WHEN (`holder` = ?) THEN `fencing_token` ELSE `payload_token` END), `renewed_at` = (CASE WHEN (`expires_at` <= (UTC_TIMESTAMP(6))) THEN UTC_TIMESTAMP(6) WHEN (`holder` = ?) THEN GREATEST(UTC_TIMESTAMP(6), `acquired_at` + INTERVAL 1 MICROSECOND) ELSE `renewed_at` END), `acquired_at` = (CASE WHEN (`expires_at` <= (UTC_TIMESTAMP(6))) THEN UTC_TIMESTAMP(6) ELSE `acquired_at` END), `fencing_token` = (CASE WHEN (`expires_at` <= (UTC_TIMESTAMP(6))) THEN `fencing_token` + ? ELSE `fencing_token` END), `holder` = (CASE WHEN (`expires_at` <= (UTC_TIMESTAMP(6))) THEN ? ELSE `holder` END), `expires_at` = (CASE WHEN (`holder` = ? OR `expires_at` <= (UTC_TIMESTAMP(6))) THEN GREATEST(SYSDATE(6) + INTERVAL TIMESTAMPDIFF(MICROSECOND, NOW(6), UTC_TIMESTAMP(6)) MICROSECOND + INTERVAL ? MICROSECOND, `expires_at` + INTERVAL 1 MICROSECOND) ELSE `expires_at` END) RETURNING `holder`, `fencing_token`, `expires_at`, `acquired_at`, `renewed_at`, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), `expires_at`) DIV 1000, CAST(@@in_transaction AS SIGNED), CASE WHEN payload_token = fencing_token THEN payload END AS current_payload"#
        );
        assert_eq!(stmt.values.map(|v| v.0.len()), Some(15));
    }

    #[test]
    fn release_and_current() {
        let t = Alias::new("orionbeacon_leases");
        let (sql, values) = release(&MySql, &t, "r", "me").build(MysqlQueryBuilder);
        assert_eq!(
            sql,
            "UPDATE `orionbeacon_leases` SET `expires_at` = (CASE WHEN (`renewed_at` < (UTC_TIMESTAMP(6))) THEN `renewed_at` ELSE UTC_TIMESTAMP(6) END) WHERE `resource` = ? AND `holder` = ? AND `expires_at` > (UTC_TIMESTAMP(6))"
        );
        assert_eq!(values.0.len(), 2);
        let (sql, _) = current(&MySql, &t, "r").build(MysqlQueryBuilder);
        assert_eq!(
            sql,
            r#"SELECT `holder`, `fencing_token`, `expires_at`, `acquired_at`, `renewed_at`, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), `expires_at`) DIV 1000, CASE WHEN payload_token = fencing_token THEN payload END AS current_payload FROM `orionbeacon_leases` WHERE `resource` = ?"#
        );
    }

    #[test]
    fn galera_fence_writes_the_row_and_puts_it_back() {
        let t = Alias::new("orionbeacon_leases");
        let (sql, values) = galera_touch(&MySql, &t, &term()).build(MysqlQueryBuilder);
        assert_eq!(
            sql,
            "UPDATE `orionbeacon_leases` SET `expires_at` = `expires_at` + INTERVAL 1 MICROSECOND WHERE `resource` = ? AND `holder` = ? AND `fencing_token` = ? AND `expires_at` > (UTC_TIMESTAMP(6))"
        );
        assert_eq!(values.0.len(), 3);
        let (sql, values) = galera_untouch(&t, &term()).build(MysqlQueryBuilder);
        assert_eq!(
            sql,
            "UPDATE `orionbeacon_leases` SET `expires_at` = `expires_at` - INTERVAL 1 MICROSECOND WHERE `resource` = ? AND `holder` = ? AND `fencing_token` = ?"
        );
        assert_eq!(values.0.len(), 3);
    }

    // The batch's update and the read of what it renewed, each with the leases in one bound
    // JSON document.
    #[test]
    fn batch_renew_is_one_update_and_one_read_from_json() {
        let t = Alias::new("orionbeacon_leases");
        let stmt = renew_all(&t, "[]".to_owned(), 1500).unwrap();
        assert_eq!(
            stmt.sql,
            concat!(
                "UPDATE JSON_TABLE(?, '$[*]' COLUMNS (",
                "`r` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.r', ",
                "`h` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.h', ",
                "`t` BIGINT PATH '$.t')) AS `held` ",
                "STRAIGHT_JOIN `orionbeacon_leases` FORCE INDEX (PRIMARY) ",
                "SET `expires_at` = GREATEST(SYSDATE(6) + INTERVAL TIMESTAMPDIFF(MICROSECOND, NOW(6), UTC_TIMESTAMP(6)) MICROSECOND + INTERVAL ? MICROSECOND, `expires_at` + INTERVAL 1 MICROSECOND), ",
                "`renewed_at` = GREATEST(UTC_TIMESTAMP(6), `acquired_at` + INTERVAL 1 MICROSECOND) ",
                "WHERE `orionbeacon_leases`.`resource` = `held`.`r` AND `orionbeacon_leases`.`holder` = `held`.`h` ",
                "AND `orionbeacon_leases`.`fencing_token` = `held`.`t` ",
                "AND `orionbeacon_leases`.`expires_at` > (UTC_TIMESTAMP(6))",
            )
        );
        // The batch's rows are locked first, skipping a row another transaction holds (or
        // failing at once, for a lease renewed on its own), each looked up by its key.
        for (busy, start, behaviour) in [
            (Busy::Skip, "", " SKIP LOCKED"),
            (Busy::Fail, "", " NOWAIT"),
            (
                Busy::Wait,
                "SET STATEMENT innodb_lock_wait_timeout = 1 FOR ",
                "",
            ),
        ] {
            let lock = lock_batch(&t, "[]".to_owned(), busy).unwrap();
            assert_eq!(
                lock.sql,
                format!(
                    "{start}SELECT `orionbeacon_leases`.`resource`, `orionbeacon_leases`.`holder`, `orionbeacon_leases`.`fencing_token` \
                     FROM {JSON_ROWS} STRAIGHT_JOIN `orionbeacon_leases` FORCE INDEX (PRIMARY) \
                     WHERE `orionbeacon_leases`.`resource` = `held`.`r` AND `orionbeacon_leases`.`holder` = `held`.`h` \
                     AND `orionbeacon_leases`.`fencing_token` = `held`.`t` \
                     AND `orionbeacon_leases`.`expires_at` > (UTC_TIMESTAMP(6)) FOR UPDATE{behaviour}"
                )
            );
            assert_eq!(lock.values.map(|v| v.0), Some(vec!["[]".into()]));
        }
        // The document first (it comes first in the text), then the lease in microseconds.
        assert_eq!(
            stmt.values.map(|v| v.0),
            Some(vec!["[]".into(), 1_500_000i64.into()])
        );
        let (sql, values) = renewed(&t, "[]".to_owned()).build(MysqlQueryBuilder);
        assert_eq!(
            sql,
            r#"SELECT `holder`, `fencing_token`, `expires_at`, `acquired_at`, `renewed_at`, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), `expires_at`) DIV 1000, `resource`, CASE WHEN payload_token = fencing_token THEN payload END AS current_payload FROM `orionbeacon_leases` WHERE (`orionbeacon_leases`.`resource`, `orionbeacon_leases`.`holder`, `orionbeacon_leases`.`fencing_token`) IN (SELECT `r`, `h`, `t` FROM JSON_TABLE(?, '$[*]' COLUMNS (`r` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.r', `h` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.h', `t` BIGINT PATH '$.t')) AS `held`) AND `orionbeacon_leases`.`expires_at` > (UTC_TIMESTAMP(6))"#
        );
        assert_eq!(values.0.len(), 1, "{values:?}");
    }
}
