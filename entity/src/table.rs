//! Rules for configurable lease-table names, shared by the store and the migration.

/// The default lease table name.
pub const DEFAULT_TABLE: &str = "orionbeacon_leases";

/// The default membership table name (shard sets).
pub const DEFAULT_MEMBER_TABLE: &str = "orionbeacon_members";

/// The default run-record table name (scheduled jobs).
pub const DEFAULT_JOB_RUN_TABLE: &str = "orionbeacon_job_runs";

/// The default rate-limit table name.
pub const DEFAULT_RATE_LIMIT_TABLE: &str = "orionbeacon_rate_limits";

/// The longest accepted table name (PostgreSQL truncates identifiers past 63 bytes).
pub const MAX_TABLE_NAME_LEN: usize = 63;

/// Why a table name was refused.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TableNameError {
    /// The name was empty.
    #[error("table name is empty")]
    Empty,
    /// The name was longer than [`MAX_TABLE_NAME_LEN`].
    #[error("table name {name:?} is longer than {max} characters", max = MAX_TABLE_NAME_LEN)]
    TooLong {
        /// The refused name.
        name: String,
    },
    /// The name had a character other than ASCII letters, digits and `_`, or began with a digit.
    #[error(
        "table name {name:?} may only contain ASCII letters, digits and '_', and must not start with a digit"
    )]
    BadCharacter {
        /// The refused name.
        name: String,
    },
}

/// Reads like `Display` and names the crate, as `main` returning `Err` prints it.
impl std::fmt::Debug for TableNameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "orion-beacon TableNameError: {self}")
    }
}

/// Checks a configured table name: 1 to 63 ASCII letters, digits or `_`, not starting with a
/// digit. Names that pass can never change the meaning of a statement, and are quoted anyway.
pub fn validate_table_name(name: &str) -> Result<(), TableNameError> {
    if name.is_empty() {
        return Err(TableNameError::Empty);
    }
    if name.len() > MAX_TABLE_NAME_LEN {
        return Err(TableNameError::TooLong {
            name: name.to_owned(),
        });
    }
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(TableNameError::BadCharacter {
            name: name.to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_names() {
        for ok in ["orionbeacon_leases", "_x", "Leases2", &"a".repeat(63)] {
            assert_eq!(validate_table_name(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn refuses_everything_else() {
        assert_eq!(validate_table_name(""), Err(TableNameError::Empty));
        assert!(matches!(
            validate_table_name(&"a".repeat(64)),
            Err(TableNameError::TooLong { .. })
        ));
        for bad in [
            "1abc",
            "a-b",
            "a b",
            "a\"b",
            "a;drop table x",
            "a`b",
            "ä",
            "a.b",
            "a]b",
        ] {
            assert!(
                matches!(
                    validate_table_name(bad),
                    Err(TableNameError::BadCharacter { .. })
                ),
                "{bad}"
            );
        }
    }
}
