//! The store's error type.

use std::time::Duration;

pub use orion_beacon_entity::TableNameError;
use sea_orm::DbErr;

/// Everything a [`LeaseStore`](crate::LeaseStore) operation can fail with.
///
/// Input errors (`Invalid*`) are returned before any SQL runs. Database errors keep the
/// [`DbErr`] as their source.
#[derive(Debug, thiserror::Error)]
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
    /// The lease table does not exist in this database.
    #[error(
        "the lease table {table:?} does not exist: run the migration first (add \
         `orion_beacon_migration::CreateLeaseTable` to your application's Migrator, or run \
         `orion-beacon-migration up -u <DATABASE_URL>` for the default table)"
    )]
    MissingTable {
        /// The table that was looked for.
        table: String,
        /// The database's error.
        #[source]
        source: DbErr,
    },
    /// The database refused the statement because of a concurrent transaction (serialization
    /// failure, deadlock, or a busy SQLite file) and it still failed after the store's own
    /// retries. Safe to retry.
    #[error("lease statement conflicted with a concurrent transaction; retry")]
    Conflict {
        /// The database's error.
        #[source]
        source: DbErr,
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
    /// Any other database error (connection refused, pool timed out, ...).
    #[error("lease store database error")]
    Database(#[source] DbErr),
    /// SQL Server: tiberius' parser refused the ADO.NET connection string.
    #[cfg(feature = "sqlserver")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlserver")))]
    #[error("invalid SQL Server connection string (ADO.NET, e.g. `Server=localhost;Database=app;User Id=sa;Password=...;TrustServerCertificate=True`)")]
    InvalidConnectionString {
        /// tiberius' parse error.
        #[source]
        source: tiberius::error::Error,
    },
    /// SQL Server: the lease table does not exist in this database (error 208).
    #[cfg(feature = "sqlserver")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlserver")))]
    #[error(
        "the lease table {table:?} does not exist: run the migration first \
         (`SqlServerLeaseStore::migrate()`, or the T-SQL \
         migration/sql/m20261129_000001_create_orionbeacon_leases.sqlserver.sql)"
    )]
    SqlServerMissingTable {
        /// The table that was looked for.
        table: String,
        /// SQL Server's error.
        #[source]
        source: tiberius::error::Error,
    },
    /// SQL Server: the statement was chosen as a deadlock victim (1205) or hit a duplicate key
    /// (2627) and still failed after the store's own retries. It had no effect; safe to retry.
    #[cfg(feature = "sqlserver")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlserver")))]
    #[error("lease statement conflicted with a concurrent transaction on SQL Server; retry")]
    SqlServerConflict {
        /// SQL Server's error.
        #[source]
        source: tiberius::error::Error,
    },
    /// SQL Server: any other error (connection refused, TLS, login, protocol, server error, ...).
    #[cfg(feature = "sqlserver")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlserver")))]
    #[error("lease store SQL Server error")]
    SqlServer(#[source] tiberius::error::Error),
}

impl StoreError {
    /// Whether trying the same operation again may succeed (database or conflict errors), as
    /// opposed to bad input or configuration, which will fail the same way every time.
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::Conflict { .. } | StoreError::Database(_) => true,
            #[cfg(feature = "sqlserver")]
            StoreError::SqlServerConflict { .. } | StoreError::SqlServer(_) => true,
            _ => false,
        }
    }

    /// Whether this error comes from the program's own configuration (a backend this build
    /// does not support, a refused name, duration, table name or connection string): every
    /// later call fails the same way until the program changes. An elector stops on these
    /// ([`Leadership::Failed`](crate::Leadership::Failed)). Everything else, a missing lease
    /// table and an unreadable row included (a migration still running, a restore, a proxy
    /// routing a read elsewhere), may clear up and is retried.
    pub fn is_permanent(&self) -> bool {
        match self {
            StoreError::UnsupportedBackend { .. }
            | StoreError::InvalidResource { .. }
            | StoreError::InvalidCandidate { .. }
            | StoreError::InvalidLeaseDuration { .. }
            | StoreError::InvalidTableName(_) => true,
            #[cfg(feature = "sqlserver")]
            StoreError::InvalidConnectionString { .. } => true,
            _ => false,
        }
    }
}
