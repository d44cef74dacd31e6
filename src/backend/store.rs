//! [`SeaOrmLeaseStore`]: leases in a table of the application's own database.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use orion_beacon_entity::{validate_table_name, DEFAULT_TABLE};
use sea_orm::sea_query::Alias;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr};

use super::errors::{classify, kind, Kind};
use super::statements::{self, Row};
use super::Dialect;
use crate::store::{validate_candidate, validate_request, validate_resource};
use crate::{Denial, LeaseOutcome, LeaseRecord, LeaseStore, StoreError};

/// How often a statement is tried when the database reports a conflict with a concurrent
/// transaction (serialization failure, deadlock, busy SQLite file). Such a failure means the
/// statement had no effect, so trying again is safe.
const ATTEMPTS: u32 = 3;

/// A [`LeaseStore`] in a table of the application's database, through SeaORM.
///
/// It shares the application's [`DatabaseConnection`] (and so its pool): every operation takes
/// one pooled connection for one statement and gives it back. Acquire-or-renew is one atomic
/// statement per backend; liveness is judged by the database clock.
///
/// The table must exist: create it with the migration (see the `orion-beacon-migration`
/// crate). A missing table is reported as [`StoreError::MissingTable`].
#[derive(Debug, Clone)]
pub struct SeaOrmLeaseStore {
    db: DatabaseConnection,
    table: Arc<str>,
}

impl SeaOrmLeaseStore {
    /// A store on the default table, `orionbeacon_leases`.
    pub fn new(db: DatabaseConnection) -> Self {
        Self {
            db,
            table: Arc::from(DEFAULT_TABLE),
        }
    }

    /// The same store on another table (validated: ASCII letters, digits and `_`, at most 63
    /// characters). Create that table with `CreateLeaseTable::with_table` of the migration crate.
    pub fn with_table(mut self, table: impl AsRef<str>) -> Result<Self, StoreError> {
        let table = table.as_ref();
        validate_table_name(table)?;
        self.table = Arc::from(table);
        Ok(self)
    }

    /// The lease table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The connection this store uses.
    pub fn connection(&self) -> &DatabaseConnection {
        &self.db
    }

    fn table_iden(&self) -> Alias {
        Alias::new(&*self.table)
    }

    fn dialect(&self) -> Result<&'static dyn Dialect, StoreError> {
        match self.db.get_database_backend() {
            #[cfg(feature = "postgres")]
            DbBackend::Postgres => Ok(&super::postgres::Postgres),
            #[cfg(feature = "sqlite")]
            DbBackend::Sqlite => Ok(&super::sqlite::Sqlite),
            #[cfg(not(feature = "postgres"))]
            DbBackend::Postgres => Err(unsupported("PostgreSQL", "postgres")),
            #[cfg(not(feature = "sqlite"))]
            DbBackend::Sqlite => Err(unsupported("SQLite", "sqlite")),
            DbBackend::MySql => Err(unsupported("MySQL", "mysql")),
            #[allow(unreachable_patterns)]
            _ => Err(unsupported("unknown", "the matching backend")),
        }
    }

    /// Runs `op` again while the database reports a conflict, at most [`ATTEMPTS`] times.
    async fn with_retry<T, F, Fut>(&self, mut op: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, DbErr>>,
    {
        let mut attempt = 1;
        loop {
            match op().await {
                Ok(value) => return Ok(value),
                Err(err) if attempt < ATTEMPTS && kind(&err) == Kind::Conflict => {
                    tracing::debug!(table = %self.table, attempt, error = %err, "lease statement conflicted; retrying");
                    tokio::time::sleep(Duration::from_millis(5 * u64::from(attempt))).await;
                    attempt += 1;
                }
                Err(err) => return Err(classify(err, &self.table)),
            }
        }
    }

    async fn read_row(&self, d: &dyn Dialect, resource: &str) -> Result<Option<Row>, StoreError> {
        let stmt = statements::current(d, &self.table_iden(), resource);
        let row = self.with_retry(|| self.db.query_one(&stmt)).await?;
        row.map(|r| Row::decode(&r))
            .transpose()
            .map_err(|source| StoreError::Decode {
                table: self.table.to_string(),
                source,
            })
    }
}

fn unsupported(backend: &'static str, feature: &'static str) -> StoreError {
    StoreError::UnsupportedBackend { backend, feature }
}

#[async_trait]
impl LeaseStore for SeaOrmLeaseStore {
    async fn acquire_or_renew(
        &self,
        resource: &str,
        candidate: &str,
        lease: Duration,
    ) -> Result<LeaseOutcome, StoreError> {
        let millis = validate_request(resource, candidate, lease)?;
        let d = self.dialect()?;
        let stmt = statements::upsert(d, &self.table_iden(), resource, candidate, millis)
            .map_err(StoreError::Database)?;
        let returned = self.with_retry(|| self.db.query_one(&stmt)).await?;
        match returned {
            Some(row) => {
                let row = Row::decode(&row).map_err(|source| StoreError::Decode {
                    table: self.table.to_string(),
                    source,
                })?;
                Ok(row.outcome(resource, candidate))
            }
            // Denied: the statement changed nothing. Say who holds the lease with a plain read;
            // the read is only a report (the holder may change between the two statements).
            None => Ok(LeaseOutcome::Denied(
                match self.read_row(d, resource).await? {
                    Some(row) => row.denial(resource),
                    None => Denial {
                        resource: resource.to_owned(),
                        holder: None,
                        token: None,
                        remaining: Duration::ZERO,
                        expires_at: None,
                    },
                },
            )),
        }
    }

    async fn release(&self, resource: &str, candidate: &str) -> Result<bool, StoreError> {
        validate_resource(resource)?;
        validate_candidate(candidate)?;
        let d = self.dialect()?;
        let stmt = statements::release(d, &self.table_iden(), resource, candidate);
        let result = self.with_retry(|| self.db.execute(&stmt)).await?;
        Ok(result.rows_affected() > 0)
    }

    async fn current(&self, resource: &str) -> Result<Option<LeaseRecord>, StoreError> {
        validate_resource(resource)?;
        let d = self.dialect()?;
        Ok(self
            .read_row(d, resource)
            .await?
            .map(|row| row.record(resource)))
    }
}
