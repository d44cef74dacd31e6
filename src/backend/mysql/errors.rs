//! MySQL's and MariaDB's error codes the store treats specially.

use sea_orm::sqlx::mysql::MySqlDatabaseError;
use sea_orm::DbErr;

use crate::backend::errors::{database_error, Kind};

/// `ER_UNKNOWN_SYSTEM_VARIABLE`: asked for `wsrep_on` on a server without Galera.
pub(crate) const UNKNOWN_SYSTEM_VARIABLE: u16 = 1193;

/// `ER_LOCK_WAIT_TIMEOUT`: a statement gave up waiting for a row lock
/// (`innodb_lock_wait_timeout`).
const LOCK_WAIT_TIMEOUT: u16 = 1205;

/// `ER_CANT_CHANGE_TX_CHARACTERISTICS`: `SET TRANSACTION` inside a transaction.
pub(crate) const CANT_CHANGE_TX_CHARACTERISTICS: u16 = 1568;

/// The kind of a MySQL/MariaDB SQLSTATE, if the store treats it specially.
pub(crate) fn code_kind(code: &str) -> Option<Kind> {
    match code {
        // ER_NO_SUCH_TABLE
        "42S02" => Some(Kind::MissingTable),
        // ER_BAD_FIELD_ERROR (1054)
        "42S22" => Some(Kind::UnknownColumn),
        // ER_LOCK_DEADLOCK (1213) and other serialization failures
        "40001" => Some(Kind::Conflict),
        _ => None,
    }
}

/// How the store treats `err`.
pub(crate) fn kind(err: &DbErr) -> Kind {
    database_error(err)
        .and_then(|db| db.code())
        .and_then(|code| code_kind(&code))
        .unwrap_or(Kind::Other)
}

/// The MySQL/MariaDB error number of a database error (e.g. 1193 for an unknown system
/// variable), whatever the server's message language.
pub(crate) fn error_number(err: &DbErr) -> Option<u16> {
    database_error(err)?
        .try_downcast_ref::<MySqlDatabaseError>()
        .map(|m| m.number())
}

/// The error number of a driver error.
pub(crate) fn sqlx_error_number(err: &sea_orm::sqlx::Error) -> Option<u16> {
    err.as_database_error()?
        .try_downcast_ref::<MySqlDatabaseError>()
        .map(|e| e.number())
}

/// Whether a statement gave up waiting for a row lock (1205).
pub(crate) fn lock_wait_ran_out(err: &sea_orm::sqlx::Error) -> bool {
    sqlx_error_number(err) == Some(LOCK_WAIT_TIMEOUT)
}

/// `ER_LOCK_NOWAIT` (MySQL 8): a `NOWAIT` read found a row locked (MariaDB says 1205).
const LOCK_NOWAIT: u16 = 3572;

/// Whether a statement found a row lock it would not wait for, or gave up waiting (1205,
/// 3572), in a `DbErr` from the store's own connections or sea-orm.
pub(crate) fn row_busy(err: &sea_orm::DbErr) -> bool {
    matches!(
        crate::backend::errors::sqlx_error(err).and_then(sqlx_error_number),
        Some(LOCK_WAIT_TIMEOUT | LOCK_NOWAIT)
    )
}

/// Whether the server will not end a session for this user: access denied (1044, 1142, 1143,
/// 1227), not the thread's owner (1095), unknown information_schema table (1109: MySQL 8 has
/// no `INNODB_LOCK_WAITS`).
pub(crate) fn refusal(err: &DbErr) -> bool {
    error_number(err).is_some_and(|n| matches!(n, 1044 | 1095 | 1109 | 1142 | 1143 | 1227))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_servers_own_numbers_count() {
        let custom = DbErr::Custom("Access denied; 1227; 1205".into());
        assert!(!refusal(&custom));
        assert_eq!(error_number(&custom), None);
        assert_eq!(kind(&custom), Kind::Other);
        assert_eq!(code_kind("42S02"), Some(Kind::MissingTable));
        assert_eq!(code_kind("40001"), Some(Kind::Conflict));
    }
}
