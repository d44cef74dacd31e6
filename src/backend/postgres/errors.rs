//! PostgreSQL's error codes (SQLSTATE) the store treats specially.

use sea_orm::DbErr;

use crate::backend::errors::{database_error, Kind};

/// The kind of a PostgreSQL SQLSTATE, if the store treats it specially.
pub(crate) fn code_kind(code: &str) -> Option<Kind> {
    match code {
        // undefined_table
        "42P01" => Some(Kind::MissingTable),
        // undefined_column
        "42703" => Some(Kind::UnknownColumn),
        // serialization_failure, deadlock_detected
        "40001" | "40P01" => Some(Kind::Conflict),
        _ => None,
    }
}

/// The SQLSTATE of the server's error inside `err`.
fn code(err: &DbErr) -> Option<String> {
    Some(database_error(err)?.code()?.into_owned())
}

/// How the store treats `err`.
pub(crate) fn kind(err: &DbErr) -> Kind {
    code(err)
        .and_then(|code| code_kind(&code))
        .unwrap_or(Kind::Other)
}

/// `lock_not_available` (`55P03`): the statement gave up waiting for a lock (what the bounded
/// upsert's own `lock_timeout` raises).
pub(crate) fn lock_wait_ran_out(err: &sea_orm::sqlx::Error) -> bool {
    sqlstate_is(err, "55P03")
}

/// `25P02`: the connection is inside a transaction that already failed.
pub(crate) fn in_failed_transaction(err: &sea_orm::sqlx::Error) -> bool {
    sqlstate_is(err, "25P02")
}

/// `insufficient_privilege` (`42501`): the server will not end that session for this role.
pub(crate) fn refusal(err: &DbErr) -> bool {
    code(err).is_some_and(|code| code == "42501")
}

fn sqlstate_is(err: &sea_orm::sqlx::Error, sqlstate: &str) -> bool {
    err.as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == sqlstate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_servers_own_codes_count() {
        // A message that reads like one is no code: never a refusal, a lock wait or a kind.
        let custom = DbErr::Custom("permission denied; 42501; 55P03".into());
        assert!(!refusal(&custom));
        assert_eq!(kind(&custom), Kind::Other);
        assert_eq!(code_kind("42P01"), Some(Kind::MissingTable));
        assert_eq!(code_kind("40001"), Some(Kind::Conflict));
        assert_eq!(code_kind("40P01"), Some(Kind::Conflict));
        assert_eq!(code_kind("42501"), None);
    }
}
