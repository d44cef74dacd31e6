//! Rules for configurable lease-table names, shared by the store and the migration.

/// The default lease table name.
pub const DEFAULT_TABLE: &str = "orionbeacon_leases";

/// The default membership table name (shard sets).
pub const DEFAULT_MEMBER_TABLE: &str = "orionbeacon_members";

/// The default run-record table name (scheduled jobs).
pub const DEFAULT_JOB_RUN_TABLE: &str = "orionbeacon_job_runs";

/// The default attempt-history table name (scheduled jobs): the history of
/// [`DEFAULT_JOB_RUN_TABLE`], see [`job_attempt_table`].
pub const DEFAULT_JOB_ATTEMPT_TABLE: &str = "orionbeacon_job_runs_attempts";

/// The attempt-history table of run table `runs`: `<runs>_attempts`. A run table longer than
/// 54 characters gives its first 45, `_`, eight hex digits of a digest of its whole name, and
/// `_attempts`, so the name stays within [`MAX_TABLE_NAME_LEN`] and two run tables never share
/// a history. A run table has exactly one, so configuring the run table configures both.
pub fn job_attempt_table(runs: &str) -> String {
    const SUFFIX: &str = "_attempts";
    if runs.len() + SUFFIX.len() <= MAX_TABLE_NAME_LEN {
        return format!("{runs}{SUFFIX}");
    }
    // FNV-1a: stable across versions and platforms (the name is in the schema).
    let digest = runs.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    let mut end = 45.min(runs.len());
    while !runs.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}_{digest:08x}{SUFFIX}", &runs[..end])
}

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
    fn a_run_tables_attempt_table() {
        assert_eq!(
            job_attempt_table(DEFAULT_JOB_RUN_TABLE),
            DEFAULT_JOB_ATTEMPT_TABLE
        );
        assert_eq!(job_attempt_table("nightly_runs"), "nightly_runs_attempts");
        let fits = "r".repeat(MAX_TABLE_NAME_LEN - "_attempts".len());
        assert_eq!(job_attempt_table(&fits), format!("{fits}_attempts"));
        // Longer: cut, and two names that share the cut still differ.
        let (a, b) = (
            "r".repeat(MAX_TABLE_NAME_LEN),
            format!("{}s", "r".repeat(62)),
        );
        let (da, db) = (job_attempt_table(&a), job_attempt_table(&b));
        assert_ne!(da, db);
        for derived in [&da, &db] {
            assert_eq!(derived.len(), MAX_TABLE_NAME_LEN, "{derived}");
            assert!(validate_table_name(derived).is_ok());
            assert!(derived.ends_with("_attempts"));
        }
    }

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
