//! The [`LeaseStore`] operations: acquire-or-renew (the `MERGE`, then a plain read on a denial),
//! the releases, the batch renew and the read, with the lease rows they decode.

use std::time::Duration;

use async_trait::async_trait;
use sea_orm::DbErr;
use tiberius::ToSql;

use super::exec::{column, split_lease, Reply, Want};
use super::names::{check_candidate, check_resource};
use super::SqlServerLeaseStore;
use crate::backend::row::Row;
use crate::backend::statements::held_json;
use crate::store::{validate_batch, validate_request};
use crate::{Denial, Lease, LeaseOutcome, LeaseRecord, LeaseStore, Renewals, StoreError};

impl SqlServerLeaseStore {
    async fn rows(&self, sql: &str, params: &[&dyn ToSql]) -> Result<Vec<Row>, StoreError> {
        match self.run(Want::Rows, sql, params).await {
            Ok(Reply::Rows(rows)) => {
                rows.iter()
                    .map(decode)
                    .collect::<Result<_, _>>()
                    .map_err(|source| StoreError::Decode {
                        table: self.table.to_string(),
                        source,
                    })
            }
            Ok(Reply::RowsAffected(_)) => Ok(Vec::new()),
            Err(err) => Err(self.classify(err)),
        }
    }

    async fn read_row(&self, resource: &str) -> Result<Option<Row>, StoreError> {
        Ok(self
            .rows(&self.sql.current, &[&resource])
            .await?
            .into_iter()
            .next())
    }
}

/// Decodes `holder, fencing_token, expires_at, acquired_at, renewed_at, remaining_ms`.
fn decode(row: &tiberius::Row) -> Result<Row, DbErr> {
    let time = |idx, name| column::<chrono::NaiveDateTime>(row, idx, name).map(|t| t.and_utc());
    Ok(Row {
        holder: column::<&str>(row, 0, "holder")?.to_owned(),
        token: column::<i64>(row, 1, "fencing_token")?,
        expires_at: time(2, "expires_at")?,
        acquired_at: time(3, "acquired_at")?,
        renewed_at: time(4, "renewed_at")?,
        remaining_millis: column::<i64>(row, 5, "remaining_ms")?,
        payload: None,
    })
}

#[async_trait]
impl LeaseStore for SqlServerLeaseStore {
    async fn acquire_or_renew(
        &self,
        resource: &str,
        candidate: &str,
        lease: Duration,
    ) -> Result<LeaseOutcome, StoreError> {
        let millis = validate_request(resource, candidate, lease)?;
        check_resource(resource)?;
        check_candidate(candidate)?;
        let (seconds, rest_ms) = split_lease(millis, lease)?;
        let returned = self
            .rows(
                &self.sql.upsert,
                &[&resource, &candidate, &seconds, &rest_ms],
            )
            .await?;
        let mut returned = returned.into_iter();
        match (returned.next(), returned.next()) {
            // Several rows for one statement: trust none of them.
            (Some(_), Some(_)) => Ok(LeaseOutcome::Denied(Denial::new(resource))),
            (Some(row), None) => Ok(row.outcome(resource, candidate)),
            // Denied: the MERGE changed nothing. Say who holds the lease with a plain read; the
            // read is only a report (the holder may change between the two statements).
            (None, _) => Ok(LeaseOutcome::Denied(
                match self.read_row(resource).await? {
                    Some(row) => row.denial_for(resource, candidate),
                    None => Denial::new(resource),
                },
            )),
        }
    }

    async fn release(&self, resource: &str, candidate: &str) -> Result<bool, StoreError> {
        check_resource(resource)?;
        check_candidate(candidate)?;
        match self
            .run(
                Want::RowsAffected,
                &self.sql.release,
                &[&resource, &candidate],
            )
            .await
        {
            Ok(Reply::RowsAffected(n)) => Ok(n > 0),
            Ok(Reply::Rows(rows)) => Ok(!rows.is_empty()),
            Err(err) => Err(self.classify(err)),
        }
    }

    async fn release_lease(&self, lease: &Lease) -> Result<bool, StoreError> {
        check_resource(&lease.resource)?;
        check_candidate(&lease.holder)?;
        let Some(expires_at) = lease.expires_at else {
            return Ok(false);
        };
        let (expires_at, token) = (expires_at.naive_utc(), lease.token.get());
        match self
            .run(
                Want::RowsAffected,
                &self.sql.release_write,
                &[
                    &lease.resource.as_str(),
                    &lease.holder.as_str(),
                    &token,
                    &expires_at,
                ],
            )
            .await
        {
            Ok(Reply::RowsAffected(n)) => Ok(n > 0),
            Ok(Reply::Rows(rows)) => Ok(!rows.is_empty()),
            Err(err) => Err(self.classify(err)),
        }
    }

    /// One batch for all of `held` (see `renew_all_sql`), the leases bound as one JSON
    /// document.
    async fn renew_all(&self, held: &[Lease], lease: Duration) -> Result<Renewals, StoreError> {
        let millis = validate_batch(held, lease)?;
        for h in held {
            check_resource(&h.resource)?;
            check_candidate(&h.holder)?;
        }
        if held.is_empty() {
            return Ok(Renewals::default());
        }
        let (seconds, rest_ms) = split_lease(millis, lease)?;
        let json = held_json(held);
        let rows = match self
            .run(
                Want::Rows,
                &self.sql.renew_all,
                &[&seconds, &rest_ms, &json.as_str()],
            )
            .await
        {
            Ok(Reply::Rows(rows)) => rows,
            Ok(Reply::RowsAffected(_)) => Vec::new(),
            Err(err) => return Err(self.classify(err)),
        };
        let mut fresh = Vec::with_capacity(rows.len());
        for r in &rows {
            let (row, resource) = decode(r)
                .and_then(|row| Ok((row, column::<&str>(r, 6, "resource")?.to_owned())))
                .map_err(|source| StoreError::Decode {
                    table: self.table.to_string(),
                    source,
                })?;
            fresh.extend(row.live_lease(resource));
        }
        Ok(Renewals::sort(held, fresh))
    }

    async fn current(&self, resource: &str) -> Result<Option<LeaseRecord>, StoreError> {
        check_resource(resource)?;
        Ok(self
            .read_row(resource)
            .await?
            .map(|row| row.record(resource)))
    }
}
