//! The store's error kinds, and the errors it makes of them. Each backend sorts its own
//! driver's errors into these kinds (`errors.rs` in its folder).

use sea_orm::DbErr;

use crate::error::StoreError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The lease table is not there: the migration has not run.
    MissingTable,
    /// A concurrent transaction got in the way; the statement had no effect and may be retried.
    Conflict,
    /// A column the statement names is not there (the payload columns, on a table made
    /// before them, or after their migration was rolled back).
    UnknownColumn,
    Other,
}

/// The function a backend sorts its errors with.
pub(crate) type Classifier = fn(&DbErr) -> Kind;

/// The store's error for a database error of `kind` on `table`.
pub(crate) fn classify(err: DbErr, kind: Kind, table: &str) -> StoreError {
    match kind {
        Kind::MissingTable => StoreError::MissingTable {
            table: table.to_owned(),
            source: err.into(),
        },
        Kind::Conflict => StoreError::Conflict { source: err.into() },
        Kind::UnknownColumn | Kind::Other => StoreError::Database(err.into()),
    }
}

/// The driver error inside `err`.
#[cfg(sqlx_driver)]
pub(crate) fn sqlx_error(err: &DbErr) -> Option<&sea_orm::sqlx::Error> {
    use sea_orm::RuntimeErr;
    match err {
        DbErr::Exec(RuntimeErr::SqlxError(e)) | DbErr::Query(RuntimeErr::SqlxError(e)) => {
            Some(e.as_ref())
        }
        _ => None,
    }
}

/// The driver's database error inside `err`, if the server answered with one.
#[cfg(sqlx_driver)]
pub(crate) fn database_error(err: &DbErr) -> Option<&dyn sea_orm::sqlx::error::DatabaseError> {
    sqlx_error(err)?.as_database_error()
}

/// The database's own error inside a store error, through every wrapper, if there is one.
pub(crate) fn db_err_in(err: &StoreError) -> Option<&DbErr> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        // `BackendError` is transparent: its `source()` skips the `DbErr` it holds.
        if let Some(crate::error::BackendError::SeaOrm(db)) =
            e.downcast_ref::<crate::error::BackendError>()
        {
            return Some(db);
        }
        if let Some(db) = e.downcast_ref::<DbErr>() {
            return Some(db);
        }
        source = e.source();
    }
    None
}
