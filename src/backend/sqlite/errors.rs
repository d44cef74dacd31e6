//! SQLite's result codes the store treats specially.

use sea_orm::DbErr;

use crate::backend::errors::Kind;

/// The kind of a SQLite result code, if the store treats it specially.
#[cfg_attr(not(sqlx_driver), allow(dead_code))]
pub(crate) fn code_kind(code: &str) -> Option<Kind> {
    match code {
        // BUSY, LOCKED and their extended codes (BUSY_RECOVERY, BUSY_SNAPSHOT, ...).
        "5" | "6" | "261" | "262" | "517" => Some(Kind::Conflict),
        _ => None,
    }
}

/// A missing table or column, from the driver's message (its code is plain `SQLITE_ERROR`).
#[cfg_attr(not(sqlx_driver), allow(dead_code))]
fn missing_table(message: &str) -> Option<Kind> {
    if message.starts_with("no such table") {
        Some(Kind::MissingTable)
    } else if message.starts_with("no such column") || message.contains("has no column named") {
        // A read names it ("no such column"), an insert's column list ("table t has no
        // column named payload").
        Some(Kind::UnknownColumn)
    } else {
        None
    }
}

/// How the store treats `err`: by its result code, or its message for a missing table.
#[cfg(sqlx_driver)]
pub(crate) fn kind(err: &DbErr) -> Kind {
    let Some(db) = crate::backend::errors::database_error(err) else {
        return Kind::Other;
    };
    db.code()
        .and_then(|code| code_kind(&code))
        .or_else(|| missing_table(db.message()))
        .unwrap_or(Kind::Other)
}

/// Without a driver feature the driver's error type is out of reach, but SQLite does not
/// translate its messages, so they are read instead.
#[cfg(not(sqlx_driver))]
pub(crate) fn kind(err: &DbErr) -> Kind {
    kind_by_message(&err.to_string()).unwrap_or(Kind::Other)
}

/// The kind of an error's text, where the driver's error is out of reach (a build without a
/// driver feature of ours): SQLite does not translate its messages.
#[cfg_attr(sqlx_driver, allow(dead_code))]
pub(crate) fn kind_by_message(text: &str) -> Option<Kind> {
    if text.contains("no such table") {
        Some(Kind::MissingTable)
    } else if text.contains("no such column") || text.contains("has no column named") {
        Some(Kind::UnknownColumn)
    } else if text.contains("database is locked")
        || text.contains("database table is locked")
        || text.contains("database schema is locked")
    {
        Some(Kind::Conflict)
    } else {
        None
    }
}
