//! MySQL's and MariaDB's error codes the store treats specially.

use crate::backend::errors::Kind;

/// `ER_UNKNOWN_SYSTEM_VARIABLE`: asked for `wsrep_on` on a server without Galera.
#[cfg(feature = "mysql")]
pub(crate) const UNKNOWN_SYSTEM_VARIABLE: u16 = 1193;

/// The kind of a MySQL/MariaDB SQLSTATE, if the store treats it specially.
pub(crate) fn kind(code: &str) -> Option<Kind> {
    match code {
        // ER_NO_SUCH_TABLE
        "42S02" => Some(Kind::MissingTable),
        // ER_LOCK_DEADLOCK (1213) and other serialization failures
        "40001" => Some(Kind::Conflict),
        _ => None,
    }
}

/// The MySQL/MariaDB error number of a database error (e.g. 1193 for an unknown system
/// variable), whatever the server's message language.
#[cfg(feature = "mysql")]
pub(crate) fn error_number(err: &sea_orm::DbErr) -> Option<u16> {
    use sea_orm::DbErr;
    use sea_orm::RuntimeErr;
    let (DbErr::Exec(RuntimeErr::SqlxError(e)) | DbErr::Query(RuntimeErr::SqlxError(e))) = err
    else {
        return None;
    };
    let db = e.as_database_error()?;
    db.try_downcast_ref::<sea_orm::sqlx::mysql::MySqlDatabaseError>()
        .map(|m| m.number())
}
