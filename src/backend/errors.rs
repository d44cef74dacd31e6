//! Sorting database errors into the store's error kinds; each backend's folder knows its own
//! codes (`errors.rs` there).

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
    super::sqlite::errors::kind_by_message(&err.to_string()).unwrap_or(Kind::Other)
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
    // The codes of the three backends do not overlap (five-character SQLSTATEs on PostgreSQL
    // and MySQL, numbers on SQLite), so every backend's list is asked.
    let by_code = db.code().and_then(|code| {
        super::postgres::errors::kind(&code)
            .or_else(|| super::mysql::errors::kind(&code))
            .or_else(|| super::sqlite::errors::kind(&code))
    });
    by_code
        .or_else(|| super::sqlite::errors::missing_table(db.message()))
        .unwrap_or(Kind::Other)
}

pub(crate) fn classify(err: DbErr, table: &str) -> StoreError {
    match kind(&err) {
        Kind::MissingTable => StoreError::MissingTable {
            table: table.to_owned(),
            source: err.into(),
        },
        Kind::Conflict => StoreError::Conflict { source: err.into() },
        Kind::Other => StoreError::Database(err.into()),
    }
}
