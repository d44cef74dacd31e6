//! MySQL and MariaDB: `UTC_TIMESTAMP(6)` is the clock, `DATETIME(6)` the column type.
//!
//! sea-query's MySQL builder silently drops `ON CONFLICT ... WHERE` and `RETURNING`: a
//! PostgreSQL-shaped upsert run here would overwrite a live lease. So this backend builds its
//! own `INSERT ... ON DUPLICATE KEY UPDATE`, where every assignment is conditional.
//!
//! The assignments give the same row whichever way the server evaluates them. By default
//! MySQL and MariaDB run them left to right, each seeing the columns already updated; with
//! MariaDB's `SIMULTANEOUS_ASSIGNMENT` `sql_mode` flag (part of `sql_mode=ORACLE`) every one
//! reads the old row. So `renewed_at`, `acquired_at`, `fencing_token` and `holder` come first
//! and read only columns assigned after them (old values either way), and `expires_at` comes
//! last with a condition that is true for a new term or a renew whether `holder` is already
//! the new one (the candidate exactly when granted) or still the old one (then the old row's
//! "held by the candidate, or expired" decides).
//!
//! Two ways to read the result, chosen per server with `SELECT VERSION()`:
//! - MariaDB 10.5+: the statement ends in `RETURNING`, which gives the final row in every case
//!   (granted, renewed, or the unchanged row of the holder that denied us): one round trip.
//! - MySQL (no `RETURNING`): one transaction, the upsert then a read of the row it locked,
//!   then commit.

use sea_orm::sea_query::{
    Alias, Expr, ExprTrait, InsertStatement, MysqlQueryBuilder, OnConflict, Query,
};
use sea_orm::{DbBackend, DbErr, Statement};

use orion_beacon_entity::lease::Column;

use super::statements::{insert_new_row, returned_row};
use super::Dialect;

#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) struct MySql;

impl Dialect for MySql {
    fn now(&self) -> Expr {
        // Evaluated once per statement; UTC regardless of the session time zone.
        Expr::cust("UTC_TIMESTAMP(6)")
    }

    // `SYSDATE(6)` is read when the row is written, after any row-lock wait, but in the
    // session's time zone; the statement's constant UTC offset turns it into UTC.
    fn lease_end(&self, millis: i64) -> Expr {
        Expr::cust_with_values(
            "SYSDATE(6) + INTERVAL TIMESTAMPDIFF(MICROSECOND, NOW(6), UTC_TIMESTAMP(6)) MICROSECOND + INTERVAL ? MICROSECOND",
            [millis.saturating_mul(1000)],
        )
    }

    fn one_tick_after(&self, ts: Expr) -> Expr {
        Expr::cust_with_exprs("? + INTERVAL 1 MICROSECOND", [ts])
    }

    // `DATETIME(6)` holds UTC without a zone: compare with the naive UTC value.
    fn stored_time(&self, t: chrono::DateTime<chrono::Utc>) -> Expr {
        Expr::val(t.naive_utc())
    }

    fn remaining_millis(&self, expires: Expr) -> Expr {
        Expr::cust_with_exprs(
            "TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), ?) DIV 1000",
            [expires],
        )
    }
}

/// How the result of the MySQL upsert is read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MySqlUpsert {
    /// `INSERT ... ON DUPLICATE KEY UPDATE ... RETURNING` (MariaDB 10.5 and later).
    Returning,
    /// A transaction: the upsert, then a read of the row before commit (MySQL).
    Transaction,
}

impl MySqlUpsert {
    /// The form a server supports, from its `SELECT VERSION()` answer.
    pub fn for_version(version: &str) -> Self {
        let Some(idx) = version.find("MariaDB") else {
            return MySqlUpsert::Transaction;
        };
        // "10.11.6-MariaDB-0+deb12u1", or "5.5.5-10.11.6-MariaDB" through some proxies.
        let numbers = version[..idx].trim_start_matches("5.5.5-");
        let mut parts = numbers
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|p| p.parse::<u32>().ok());
        match (parts.next(), parts.next()) {
            (Some(major), Some(minor)) if (major, minor) >= (10, 5) => MySqlUpsert::Returning,
            _ => MySqlUpsert::Transaction,
        }
    }
}

/// The conditional upsert (without `RETURNING`).
pub(crate) fn upsert(
    table: &Alias,
    resource: &str,
    candidate: &str,
    millis: i64,
) -> Result<InsertStatement, DbErr> {
    let d = MySql;
    let col = |c: Column| Expr::col(c);
    let expired = || col(Column::ExpiresAt).lte(d.now());
    let on_duplicate = OnConflict::column(Column::Resource)
        .values([
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
            (
                Column::ExpiresAt,
                Expr::case(
                    col(Column::Holder).eq(candidate).or(expired()),
                    d.lease_end(millis),
                )
                .finally(col(Column::ExpiresAt))
                .into(),
            ),
        ])
        .to_owned();
    let mut stmt = insert_new_row(&d, table, resource, candidate, millis)?;
    stmt.on_conflict(on_duplicate);
    Ok(stmt)
}

/// The last column of the MariaDB form's `RETURNING` list: 1 inside a transaction.
pub(crate) const IN_TRANSACTION: &str = "CAST(@@in_transaction AS SIGNED)";
/// Its index.
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) const IN_TRANSACTION_COLUMN: usize = 6;

/// The MariaDB form: the upsert with a `RETURNING` clause of the lease row, which sea-query's
/// MySQL builder would drop. The clause is rendered by sea-query as a select list (it has no
/// parameters) and appended.
pub(crate) fn upsert_returning(
    table: &Alias,
    resource: &str,
    candidate: &str,
    millis: i64,
) -> Result<Statement, DbErr> {
    let (mut sql, values) = upsert(table, resource, candidate, millis)?.build(MysqlQueryBuilder);
    let list = Query::select()
        .exprs(returned_row(&MySql))
        .to_string(MysqlQueryBuilder);
    let list = list
        .strip_prefix("SELECT ")
        .ok_or_else(|| DbErr::Custom(format!("unexpected select list: {list}")))?;
    sql.push_str(" RETURNING ");
    sql.push_str(list);
    // Whether the statement ran inside a transaction (then it has not committed): see
    // `autocommit`.
    sql.push_str(", ");
    sql.push_str(IN_TRANSACTION);
    Ok(Statement::from_sql_and_values(
        DbBackend::MySql,
        sql,
        values,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::statements::{current, release};

    #[test]
    fn version_detection() {
        assert_eq!(
            MySqlUpsert::for_version("10.11.19-MariaDB-0+deb12u1"),
            MySqlUpsert::Returning
        );
        assert_eq!(
            MySqlUpsert::for_version("10.5.0-MariaDB"),
            MySqlUpsert::Returning
        );
        assert_eq!(
            MySqlUpsert::for_version("5.5.5-10.6.12-MariaDB-log"),
            MySqlUpsert::Returning
        );
        assert_eq!(
            MySqlUpsert::for_version("10.4.32-MariaDB"),
            MySqlUpsert::Transaction
        );
        assert_eq!(MySqlUpsert::for_version("8.0.36"), MySqlUpsert::Transaction);
        assert_eq!(
            MySqlUpsert::for_version("8.4.0-commercial"),
            MySqlUpsert::Transaction
        );
        assert_eq!(MySqlUpsert::for_version(""), MySqlUpsert::Transaction);
    }

    const UPSERT: &str = concat!(
        "INSERT INTO `orionbeacon_leases` (`resource`, `holder`, `fencing_token`, `expires_at`, `acquired_at`, `renewed_at`) ",
        "VALUES (?, ?, ?, SYSDATE(6) + INTERVAL TIMESTAMPDIFF(MICROSECOND, NOW(6), UTC_TIMESTAMP(6)) MICROSECOND + INTERVAL ? MICROSECOND, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)) ",
        "ON DUPLICATE KEY UPDATE ",
        "`renewed_at` = (CASE WHEN (`expires_at` <= (UTC_TIMESTAMP(6))) THEN UTC_TIMESTAMP(6) WHEN (`holder` = ?) THEN GREATEST(UTC_TIMESTAMP(6), `acquired_at` + INTERVAL 1 MICROSECOND) ELSE `renewed_at` END), ",
        "`acquired_at` = (CASE WHEN (`expires_at` <= (UTC_TIMESTAMP(6))) THEN UTC_TIMESTAMP(6) ELSE `acquired_at` END), ",
        "`fencing_token` = (CASE WHEN (`expires_at` <= (UTC_TIMESTAMP(6))) THEN `fencing_token` + ? ELSE `fencing_token` END), ",
        "`holder` = (CASE WHEN (`expires_at` <= (UTC_TIMESTAMP(6))) THEN ? ELSE `holder` END), ",
        "`expires_at` = (CASE WHEN (`holder` = ? OR `expires_at` <= (UTC_TIMESTAMP(6))) THEN SYSDATE(6) + INTERVAL TIMESTAMPDIFF(MICROSECOND, NOW(6), UTC_TIMESTAMP(6)) MICROSECOND + INTERVAL ? MICROSECOND ELSE `expires_at` END)",
    );

    // sea-query's MySQL builder drops clauses it lacks without a word: pin the exact SQL.
    #[test]
    fn upsert_keeps_every_assignment_conditional_and_order_independent() {
        let (sql, values) = upsert(&Alias::new("orionbeacon_leases"), "r", "me", 1500)
            .unwrap()
            .build(MysqlQueryBuilder);
        assert_eq!(sql, UPSERT);
        assert_eq!(values.0.len(), 9, "{values:?}");
        assert!(
            values.0.contains(&1_500_000i64.into()),
            "lease in microseconds: {values:?}"
        );
    }

    #[test]
    fn mariadb_form_returns_the_row() {
        let stmt = upsert_returning(&Alias::new("orionbeacon_leases"), "r", "me", 1500).unwrap();
        assert_eq!(
            stmt.sql,
            format!(
                "{UPSERT} RETURNING `holder`, `fencing_token`, `expires_at`, `acquired_at`, `renewed_at`, \
                 TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), `expires_at`) DIV 1000, CAST(@@in_transaction AS SIGNED)"
            )
        );
        assert_eq!(stmt.values.map(|v| v.0.len()), Some(9));
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
            "SELECT `holder`, `fencing_token`, `expires_at`, `acquired_at`, `renewed_at`, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), `expires_at`) DIV 1000 FROM `orionbeacon_leases` WHERE `resource` = ?"
        );
    }
}
