//! SQLite's result codes the store treats specially.

use crate::backend::errors::Kind;

/// The kind of a SQLite result code, if the store treats it specially.
#[cfg_attr(
    not(any(feature = "postgres", feature = "sqlite", feature = "mysql")),
    allow(dead_code)
)]
pub(crate) fn kind(code: &str) -> Option<Kind> {
    match code {
        // BUSY, LOCKED and their extended codes (BUSY_RECOVERY, BUSY_SNAPSHOT, ...).
        "5" | "6" | "261" | "262" | "517" => Some(Kind::Conflict),
        _ => None,
    }
}

/// A missing table, from the driver's message (its code is plain `SQLITE_ERROR`).
#[cfg_attr(
    not(any(feature = "postgres", feature = "sqlite", feature = "mysql")),
    allow(dead_code)
)]
pub(crate) fn missing_table(message: &str) -> Option<Kind> {
    message
        .starts_with("no such table")
        .then_some(Kind::MissingTable)
}

/// The kind of an error's text, where the driver's error is out of reach (a build without a
/// driver feature of ours): SQLite does not translate its messages.
#[cfg_attr(
    any(feature = "postgres", feature = "sqlite", feature = "mysql"),
    allow(dead_code)
)]
pub(crate) fn kind_by_message(text: &str) -> Option<Kind> {
    if text.contains("no such table") {
        Some(Kind::MissingTable)
    } else if text.contains("database is locked")
        || text.contains("database table is locked")
        || text.contains("database schema is locked")
    {
        Some(Kind::Conflict)
    } else {
        None
    }
}
