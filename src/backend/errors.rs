//! Sorting database errors into the store's error kinds.

use sea_orm::DbErr;

use crate::StoreError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The lease table is not there: the migration has not run.
    MissingTable,
    /// A concurrent transaction got in the way; the statement had no effect and may be retried.
    Conflict,
    Other,
}

/// Without a backend feature the driver's error type is out of reach, but SQLite (which works
/// in every build) does not translate its messages, so they are read instead.
#[cfg(not(any(feature = "postgres", feature = "sqlite", feature = "mysql")))]
pub(crate) fn kind(err: &DbErr) -> Kind {
    let text = err.to_string();
    if text.contains("no such table") {
        Kind::MissingTable
    } else if text.contains("database is locked")
        || text.contains("database table is locked")
        || text.contains("database schema is locked")
    {
        Kind::Conflict
    } else {
        Kind::Other
    }
}

#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) fn kind(err: &DbErr) -> Kind {
    use sea_orm::RuntimeErr;
    let (DbErr::Exec(RuntimeErr::SqlxError(e)) | DbErr::Query(RuntimeErr::SqlxError(e))) = err
    else {
        return Kind::Other;
    };
    let sea_orm::sqlx::Error::Database(db) = e.as_ref() else {
        return Kind::Other;
    };
    let code = db.code();
    match code.as_deref() {
        // PostgreSQL undefined_table; MySQL/MariaDB ER_NO_SUCH_TABLE.
        Some("42P01") | Some("42S02") => return Kind::MissingTable,
        // serialization_failure (PostgreSQL, MySQL deadlock 1213), deadlock_detected.
        Some("40001") | Some("40P01") => return Kind::Conflict,
        // SQLite: BUSY, LOCKED and their extended codes (BUSY_RECOVERY, BUSY_SNAPSHOT, ...).
        Some("5") | Some("6") | Some("261") | Some("262") | Some("517") => return Kind::Conflict,
        _ => {}
    }
    if db.message().starts_with("no such table") {
        return Kind::MissingTable;
    }
    Kind::Other
}

pub(crate) fn classify(err: DbErr, table: &str) -> StoreError {
    match kind(&err) {
        Kind::MissingTable => StoreError::MissingTable {
            table: table.to_owned(),
            source: err,
        },
        Kind::Conflict => StoreError::Conflict { source: err },
        Kind::Other => StoreError::Database(err),
    }
}

/// The MySQL/MariaDB error number of a database error (e.g. 1193 for an unknown system
/// variable), whatever the server's message language.
#[cfg(feature = "mysql")]
pub(crate) fn mysql_error_number(err: &DbErr) -> Option<u16> {
    use sea_orm::RuntimeErr;
    let (DbErr::Exec(RuntimeErr::SqlxError(e)) | DbErr::Query(RuntimeErr::SqlxError(e))) = err
    else {
        return None;
    };
    let db = e.as_database_error()?;
    db.try_downcast_ref::<sea_orm::sqlx::mysql::MySqlDatabaseError>()
        .map(|m| m.number())
}

#[cfg(not(feature = "mysql"))]
pub(crate) fn mysql_error_number(_err: &DbErr) -> Option<u16> {
    None
}
