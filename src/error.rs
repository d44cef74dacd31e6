//! The store's error type.

use std::time::Duration;

pub use orion_beacon_entity::TableNameError;
use sea_orm::DbErr;

/// Everything a [`LeaseStore`](crate::LeaseStore) operation can fail with.
///
/// Input errors (`Invalid*`) are returned before any SQL runs. Database errors keep the
/// [`DbErr`] as their source.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The resource name was refused (empty, too long, control characters, or leading or
    /// trailing white space).
    #[error("invalid resource name {name:?}: {reason}")]
    InvalidResource {
        /// The refused name.
        name: String,
        /// Why.
        reason: &'static str,
    },
    /// The shard set name was refused (same rules as resource names).
    #[error("invalid shard set name {name:?}: {reason}")]
    InvalidShardSet {
        /// The refused name.
        name: String,
        /// Why.
        reason: &'static str,
    },
    /// The candidate id was refused (same rules as resource names).
    #[error("invalid candidate id {name:?}: {reason}")]
    InvalidCandidate {
        /// The refused id.
        name: String,
        /// Why.
        reason: &'static str,
    },
    /// The lease duration was zero, under a millisecond, or absurdly long.
    #[error("invalid lease duration {duration:?}: {reason}")]
    InvalidLeaseDuration {
        /// The refused duration.
        duration: Duration,
        /// Why.
        reason: &'static str,
    },
    /// The configured table name was refused.
    #[error(transparent)]
    InvalidTableName(#[from] TableNameError),
    /// A refused lease payload (too long, or with a NUL character); see
    /// [`MAX_PAYLOAD_LEN`](crate::store::MAX_PAYLOAD_LEN).
    #[error("invalid lease payload ({len} bytes): {reason}")]
    InvalidPayload {
        /// Its length in bytes.
        len: usize,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A store setting out of its bounds (e.g. more than 64 lease connections).
    #[error("invalid setting {setting}: {reason}")]
    InvalidSetting {
        /// The setting's name.
        setting: &'static str,
        /// Why it was refused.
        reason: String,
    },
    /// The table exists but lacks columns this version needs: it was made by an earlier
    /// version's migrations, and `migration` (a step of `orion-beacon-migration`, e.g.
    /// `AddLeasePayload` for the lease table, `AddMemberHolding` for a membership table) has
    /// not run on it (yet). The store looks at the table once, before its first statement,
    /// and sends nothing else until it has those columns.
    #[error(
        "the table {table:?} lacks the columns of the migration {migration}: run it ({})",
        step_hint(table, migration)
    )]
    OutdatedSchema {
        /// The table.
        table: String,
        /// The migration step that adds the missing columns.
        migration: &'static str,
        /// The database's error (an unknown column).
        #[source]
        source: BackendError,
    },
    /// The lease table (or a shard set's membership table, or the rate-limit table) does not
    /// exist in this database: run the migration.
    #[error("the table {table:?} does not exist: run the migration first ({})", source.migration_hint(table))]
    MissingTable {
        /// The table that was looked for.
        table: String,
        /// The database's error.
        #[source]
        source: BackendError,
    },
    /// The database refused the statement because of a concurrent transaction (serialization
    /// failure, deadlock, or a busy SQLite file; on SQL Server a deadlock victim or a duplicate
    /// key) and it still failed after the store's own retries. It had no effect; safe to retry.
    #[error("lease statement conflicted with a concurrent transaction; retry")]
    Conflict {
        /// The database's error.
        #[source]
        source: BackendError,
    },
    /// The connection's backend is not compiled in (enable the matching cargo feature).
    #[error("database backend {backend} is not supported by this build of orion-beacon: enable the `{feature}` feature")]
    UnsupportedBackend {
        /// The backend of the connection.
        backend: &'static str,
        /// The cargo feature that adds it.
        feature: &'static str,
    },
    /// The lease row could not be read back (a column of an unexpected type, say).
    #[error("unexpected lease row in table {table:?}")]
    Decode {
        /// The lease table.
        table: String,
        /// The decoding error.
        #[source]
        source: DbErr,
    },
    /// This store does not implement the operation (a [`LeaseStore`](crate::LeaseStore) that
    /// keeps a trait method's default).
    #[error("this lease store does not support {operation}")]
    Unsupported {
        /// The operation.
        operation: &'static str,
    },
    /// The store's [`DatabaseConnection`](sea_orm::DatabaseConnection) is disconnected (closed,
    /// or the default value, never connected): every call fails until the program builds the
    /// store on a connected one.
    #[error("the lease store's DatabaseConnection is disconnected")]
    Disconnected,
    /// Any other database error (connection refused, pool timed out, TLS, login, a server
    /// error, ...).
    #[error("lease store database error")]
    Database(#[source] BackendError),
    /// A store's driver refused its connection string (e.g. the SQL Server store's ADO.NET
    /// string).
    #[error("invalid connection string ({expected})")]
    InvalidConnectionString {
        /// The form the store expects, with an example.
        expected: &'static str,
        /// The driver's parse error.
        #[source]
        source: BoxError,
    },
}

/// Any error, boxed (what `?` converts to): what a job's closure fails with, and a store's own
/// driver's error under [`BackendError::Driver`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The database error under a [`StoreError`]: SeaORM's for [`SeaOrmLeaseStore`](crate::SeaOrmLeaseStore),
/// the driver's own for a store on another driver (tiberius' for `orion-beacon-sqlserver`).
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// An error of SeaORM (and the sqlx driver under it).
    #[error(transparent)]
    SeaOrm(#[from] DbErr),
    /// An error of another store's driver.
    #[error("{driver} error")]
    Driver {
        /// The driver (e.g. `tiberius`).
        driver: &'static str,
        /// How that store's tables are made (named by a missing-table error).
        migration: &'static str,
        /// The driver's error.
        #[source]
        source: BoxError,
    },
}

impl BackendError {
    /// How to create `table` (the lease table, or a shard set's membership table) for this
    /// store: the migration to add to the application's Migrator first, naming a custom table.
    fn migration_hint(&self, table: &str) -> String {
        match self {
            BackendError::SeaOrm(_) => {
                let add = if table == orion_beacon_entity::DEFAULT_TABLE {
                    "`orion_beacon_migration::CreateLeaseTable::new()` (and `CreateMemberTable` \
                     for shard sets)"
                        .to_owned()
                } else if table == orion_beacon_entity::DEFAULT_MEMBER_TABLE {
                    "`orion_beacon_migration::CreateMemberTable::new()`".to_owned()
                } else if table == orion_beacon_entity::DEFAULT_RATE_LIMIT_TABLE {
                    "`orion_beacon_migration::CreateRateLimitTable::new()`".to_owned()
                } else {
                    format!(
                        "`orion_beacon_migration::CreateLeaseTable::with_table(\"{table}\")?` \
                         (`CreateMemberTable::with_table(\"{table}\")?` if it is a shard \
                         set's membership table, `CreateRateLimitTable::with_table(\"{table}\")?` \
                         if it is a rate-limit table)"
                    )
                };
                format!(
                    "add {add} to your application's Migrator and run it, e.g. `sea-orm-cli \
                     migrate up`; without a Migrator of your own, `orion-beacon-migration up -u \
                     <DATABASE_URL>` makes the default tables"
                )
            }
            BackendError::Driver { migration, .. } => (*migration).to_owned(),
        }
    }
}

/// How to run the migration step `migration` on `table`.
fn step_hint(table: &str, migration: &str) -> String {
    let default = table == orion_beacon_entity::DEFAULT_TABLE
        || table == orion_beacon_entity::DEFAULT_MEMBER_TABLE
        || table == orion_beacon_entity::DEFAULT_JOB_RUN_TABLE;
    let add = if default {
        format!("`orion_beacon_migration::migrations()` (every step, `{migration}` among them)")
    } else {
        format!("`orion_beacon_migration::{migration}::with_table(\"{table}\")?`")
    };
    let sql_server = if migration == "AddMemberHolding" || migration == "AddMemberRank" {
        "migrate_members()"
    } else {
        "migrate()"
    };
    let migrate = format!(
        "add {add} to your application's Migrator and run it, e.g. `sea-orm-cli migrate up`; \
         without a Migrator of your own, `orion-beacon-migration up -u <DATABASE_URL>`"
    );
    if migration == "AddJobRunKey" {
        // Jobs run on the SeaORM store only.
        return migrate;
    }
    format!(
        "{migrate}; on SQL Server (`orion-beacon-sqlserver`), `SqlServerLeaseStore::{sql_server}`"
    )
}

/// What kind of failure a [`StoreError`] (or a [`LockError`](crate::locks::LockError)) is: what retries, metrics labels and exit codes
/// are decided on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A refused resource name, candidate id, lease duration, table name or connection string:
    /// it fails the same way every time, before any SQL runs.
    InvalidInput,
    /// The store cannot run on this connection in this build (a backend whose cargo feature is
    /// off, a disconnected connection): it fails the same way every time.
    Unsupported,
    /// The lease table, or columns a later migration adds to it, is missing: a migration has
    /// not run (yet).
    MissingTable,
    /// A concurrent transaction got in the way, after the store's own retries; safe to retry.
    Conflict,
    /// A lease row could not be read back.
    Decode,
    /// Any other database error (connection, pool, timeout, server error).
    Database,
    /// A lock or permit was not free within the time asked for.
    TimedOut,
    /// A lock or permit was lost before the work it guarded returned.
    Lost,
}

impl ErrorKind {
    /// A short, stable name (`invalid_input`, `unsupported_backend`, `missing_table`, `conflict`,
    /// `decode`, `database`, `timed_out`, `lost`), e.g. for metrics labels and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::Unsupported => "unsupported_backend",
            ErrorKind::MissingTable => "missing_table",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Decode => "decode",
            ErrorKind::Database => "database",
            ErrorKind::TimedOut => "timed_out",
            ErrorKind::Lost => "lost",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl StoreError {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            StoreError::InvalidResource { .. }
            | StoreError::InvalidShardSet { .. }
            | StoreError::InvalidCandidate { .. }
            | StoreError::InvalidLeaseDuration { .. }
            | StoreError::InvalidTableName(_)
            | StoreError::InvalidPayload { .. }
            | StoreError::InvalidSetting { .. } => ErrorKind::InvalidInput,
            StoreError::InvalidConnectionString { .. } => ErrorKind::InvalidInput,
            StoreError::UnsupportedBackend { .. }
            | StoreError::Unsupported { .. }
            | StoreError::Disconnected => ErrorKind::Unsupported,
            StoreError::MissingTable { .. } | StoreError::OutdatedSchema { .. } => {
                ErrorKind::MissingTable
            }
            StoreError::Conflict { .. } => ErrorKind::Conflict,
            StoreError::Decode { .. } => ErrorKind::Decode,
            StoreError::Database(_) => ErrorKind::Database,
        }
    }

    /// Whether trying the same operation again may succeed (database or conflict errors), as
    /// opposed to bad input or configuration, which will fail the same way every time.
    pub fn is_retryable(&self) -> bool {
        matches!(self.kind(), ErrorKind::Conflict | ErrorKind::Database)
    }

    /// Whether this error comes from the program's own configuration (a backend this build
    /// does not support, a disconnected connection, a refused name, duration, table name or
    /// connection string): every later call fails the same way until the program changes. An
    /// elector stops on these ([`Leadership::Failed`](crate::Leadership::Failed)). Everything
    /// else, a missing lease table and an unreadable row included (a migration still running,
    /// a restore, a proxy routing a read elsewhere), may clear up and is retried.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self.kind(),
            ErrorKind::InvalidInput | ErrorKind::Unsupported
        )
    }
}

/// Why a fenced write was refused.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// The term is no longer current in the lease table (another holder, a newer token, or the
    /// lease expired by the database clock): roll back, the write must not happen.
    #[error("fenced: {holder:?} no longer holds {resource:?} with token {token}")]
    Fenced {
        /// The resource.
        resource: String,
        /// The candidate whose term was checked.
        holder: String,
        /// The token that was checked.
        token: crate::fencing::FencingToken,
    },
    /// The check itself failed (database error, missing table, bad input).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The statement-level fence ([`SeaOrmLeaseStore::fenced_by`](crate::SeaOrmLeaseStore::fenced_by),
    /// [`SeaOrmLeaseStore::execute_fenced`](crate::SeaOrmLeaseStore::execute_fenced)) on a Galera cluster: its check only reads the lease
    /// row, and neither a shared lock nor a read is replicated or certified, so a stale write
    /// could commit on another node after a takeover. Use the transactional fence
    /// ([`SeaOrmLeaseStore::fence`](crate::SeaOrmLeaseStore::fence)), which writes the lease row there.
    #[error("the statement-level fence cannot fence on a Galera cluster (a shared lock does not replicate): write inside a transaction fenced with fence(&txn, term) instead")]
    StatementFenceOnGalera,
    /// [`SeaOrmLeaseStore::fenced_by`](crate::SeaOrmLeaseStore::fenced_by) on MySQL/MariaDB by a store that has not yet learnt
    /// whether the server is a Galera node (it does at its first grant, fence or
    /// `execute_fenced`), where the statement-level fence must not be used.
    #[error("the statement-level fence needs to know whether this MySQL/MariaDB server is a Galera node: call it after the store's first grant (or use execute_fenced, or fence(&txn, term))")]
    TopologyUnknown,
    /// [`LeaderTerm::fence`](crate::LeaderTerm::fence) on a term whose elector's store cannot
    /// fence SeaORM transactions (it is not a [`SeaOrmLeaseStore`](crate::SeaOrmLeaseStore)).
    #[error("this term's elector does not run on a SeaOrmLeaseStore, so it cannot fence a SeaORM transaction")]
    Unsupported,
}

impl FenceError {
    /// Whether this is [`FenceError::Fenced`]: the caller is not the leader (any more).
    pub fn is_fenced(&self) -> bool {
        matches!(self, FenceError::Fenced { .. })
    }
}

/// `err` and its sources, `: `-separated (for a health report).
pub(crate) fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The `Debug` of this crate's errors: what `main` returning `Err` and `unwrap()` print. It
/// reads like `Display`, names the crate and the type, and lists the sources, the way `anyhow`
/// shows an error chain; match on the value (or [`StoreError::kind`]) rather than on this text.
pub(crate) fn debug_chain(
    f: &mut std::fmt::Formatter<'_>,
    type_name: &str,
    error: &dyn std::error::Error,
) -> std::fmt::Result {
    write!(f, "orion-beacon {type_name}: {error}")?;
    let mut source = error.source();
    while let Some(cause) = source {
        write!(f, "\n  caused by: {cause}")?;
        source = cause.source();
    }
    Ok(())
}

/// `Debug` for error types, through [`debug_chain`].
macro_rules! debug_as_chain {
    ($($ty:ident),+) => {$(
        impl std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                $crate::error::debug_chain(f, stringify!($ty), self)
            }
        }
    )+};
}
pub(crate) use debug_as_chain;

debug_as_chain!(FenceError, StoreError, BackendError);

#[cfg(test)]
mod tests {
    use super::{BackendError, FenceError, StoreError};
    use sea_orm::DbErr;

    fn missing(table: &str) -> String {
        StoreError::MissingTable {
            table: table.to_owned(),
            source: BackendError::SeaOrm(DbErr::Custom("no such table".to_owned())),
        }
        .to_string()
    }

    #[test]
    fn a_missing_table_names_the_migration_that_makes_it() {
        let default = missing("orionbeacon_leases");
        assert!(default.contains("CreateLeaseTable::new()"), "{default}");
        let members = missing("orionbeacon_members");
        assert!(members.contains("CreateMemberTable::new()"), "{members}");
        let custom = missing("shard_leases");
        assert!(
            custom.contains("CreateLeaseTable::with_table(\"shard_leases\")?"),
            "{custom}"
        );
        for text in [default, members, custom] {
            let migrator = text.find("your application's Migrator");
            assert!(
                migrator.is_some() && migrator < text.find("orion-beacon-migration up"),
                "the Migrator first: {text}"
            );
        }
    }

    #[test]
    fn an_outdated_table_names_the_step_and_where_it_runs() {
        let outdated = |table: &str, migration| {
            StoreError::OutdatedSchema {
                table: table.to_owned(),
                migration,
                source: BackendError::SeaOrm(DbErr::Custom("no such column".to_owned())),
            }
            .to_string()
        };
        let default = outdated("orionbeacon_leases", "AddLeasePayload");
        assert!(
            default.contains("orion_beacon_migration::migrations()")
                && default.contains("`AddLeasePayload` among them")
                && default.contains("`SqlServerLeaseStore::migrate()`"),
            "{default}"
        );
        let members = outdated("shard_members", "AddMemberHolding");
        assert!(
            members.contains("AddMemberHolding::with_table(\"shard_members\")?")
                && members.contains("`SqlServerLeaseStore::migrate_members()`"),
            "{members}"
        );
    }

    #[test]
    fn debug_reads_like_the_message_and_names_the_crate() {
        // What `fn main() -> Result<(), Box<dyn Error>>` prints for a `?` on each error type.
        let unsupported = StoreError::UnsupportedBackend {
            backend: "PostgreSQL",
            feature: "postgres",
        };
        assert_eq!(
            format!("{unsupported:?}"),
            "orion-beacon StoreError: database backend PostgreSQL is not supported by this \
             build of orion-beacon: enable the `postgres` feature"
        );
        let backend = BackendError::SeaOrm(DbErr::Custom("connection refused".to_owned()));
        assert_eq!(
            format!("{backend:?}"),
            "orion-beacon BackendError: Custom Error: connection refused"
        );
        let fenced = FenceError::Fenced {
            resource: "nightly".to_owned(),
            holder: "node-a".to_owned(),
            token: crate::fencing::FencingToken::new(7),
        };
        let text = format!("{fenced:?}");
        assert!(
            text.starts_with("orion-beacon FenceError: fenced: "),
            "{text}"
        );
        assert!(text.contains("\"nightly\"") && text.contains('7'), "{text}");
        let wrapped = FenceError::Store(StoreError::Conflict {
            source: BackendError::SeaOrm(DbErr::Custom("deadlock".to_owned())),
        });
        let text = format!("{wrapped:?}");
        assert!(
            text.starts_with("orion-beacon FenceError: lease statement conflicted")
                && text.contains("caused by: Custom Error: deadlock"),
            "{text}"
        );
    }
}
