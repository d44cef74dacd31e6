//! PostgreSQL's error codes (SQLSTATE) the store treats specially.

use crate::backend::errors::Kind;

/// The kind of a PostgreSQL SQLSTATE, if the store treats it specially.
pub(crate) fn kind(code: &str) -> Option<Kind> {
    match code {
        // undefined_table
        "42P01" => Some(Kind::MissingTable),
        // serialization_failure, deadlock_detected
        "40001" | "40P01" => Some(Kind::Conflict),
        _ => None,
    }
}
