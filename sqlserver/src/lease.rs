//! The [`LeaseStore`] operations: acquire-or-renew (the `MERGE`, then a plain read on a denial),
//! the releases, the batch renew and the read, with the lease rows they decode.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sea_orm::DbErr;
use tiberius::ToSql;

use super::exec::{column, split_lease, Reply, Want};
use super::names::{check_candidate, check_resource};
use super::SqlServerLeaseStore;
use orion_beacon::store::support::LeaseRow as Row;
use orion_beacon::store::support::{held_json, PAYLOAD_COLUMN};
use orion_beacon::store::{
    offer_holder, validate_batch, validate_offer, validate_payload, validate_request, validate_take,
};
use orion_beacon::store::{Denial, LeaseOutcome, Renewals};
use orion_beacon::{FencingToken, Lease, LeaseRecord, LeaseStore, MembershipStore, StoreError};

impl SqlServerLeaseStore {
    /// The raw rows of a lease statement, once the table is known to be this version's.
    async fn raw_rows(
        &self,
        sql: &str,
        params: &[&dyn ToSql],
    ) -> Result<Vec<tiberius::Row>, StoreError> {
        self.ready().await?;
        match self.run(Want::Rows, sql, params).await {
            Ok(Reply::Rows(rows)) => Ok(rows),
            Ok(Reply::RowsAffected(_)) => Ok(Vec::new()),
            Err(err) => Err(self.classify(err)),
        }
    }

    async fn rows(&self, sql: &str, params: &[&dyn ToSql]) -> Result<Vec<Row>, StoreError> {
        self.raw_rows(sql, params)
            .await?
            .iter()
            .map(decode)
            .collect::<Result<_, _>>()
            .map_err(|source| StoreError::Decode {
                table: self.table.to_string(),
                source,
            })
    }

    /// Whether an `UPDATE` changed a row.
    async fn changed(&self, sql: &str, params: &[&dyn ToSql]) -> Result<bool, StoreError> {
        self.ready().await?;
        match self.run(Want::RowsAffected, sql, params).await {
            Ok(Reply::RowsAffected(n)) => Ok(n > 0),
            Ok(Reply::Rows(rows)) => Ok(!rows.is_empty()),
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

/// Decodes `holder, fencing_token, expires_at, acquired_at, renewed_at, remaining_ms` and
/// `current_payload` (by name).
fn decode(row: &tiberius::Row) -> Result<Row, DbErr> {
    let time = |idx, name| column::<chrono::NaiveDateTime>(row, idx, name).map(|t| t.and_utc());
    let payload = row
        .try_get::<&str, _>(PAYLOAD_COLUMN)
        .map_err(|e| DbErr::Type(format!("SQL Server column {PAYLOAD_COLUMN}: {e}")))?
        .map(str::to_owned);
    Ok(Row {
        holder: column::<&str>(row, 0, "holder")?.to_owned(),
        token: column::<i64>(row, 1, "fencing_token")?,
        expires_at: time(2, "expires_at")?,
        acquired_at: time(3, "acquired_at")?,
        renewed_at: time(4, "renewed_at")?,
        remaining_millis: column::<i64>(row, 5, "remaining_ms")?,
        payload,
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
        self.acquire_or_renew_with(resource, candidate, lease, None)
            .await
    }

    /// The payload is `@P5` of the same `MERGE`.
    async fn acquire_or_renew_with(
        &self,
        resource: &str,
        candidate: &str,
        lease: Duration,
        payload: Option<&str>,
    ) -> Result<LeaseOutcome, StoreError> {
        let millis = validate_request(resource, candidate, lease)?;
        if let Some(payload) = payload {
            validate_payload(payload)?;
        }
        check_resource(resource)?;
        check_candidate(candidate)?;
        let (seconds, rest_ms) = split_lease(millis, lease)?;
        let returned = self
            .rows(
                &self.sql.upsert,
                &[&resource, &candidate, &seconds, &rest_ms, &payload],
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
        self.changed(&self.sql.release, &[&resource, &candidate])
            .await
    }

    async fn release_lease(&self, lease: &Lease) -> Result<bool, StoreError> {
        check_resource(&lease.resource)?;
        check_candidate(&lease.holder)?;
        let Some(expires_at) = lease.expires_at else {
            return Ok(false);
        };
        let (expires_at, token) = (expires_at.naive_utc(), lease.token.get());
        self.changed(
            &self.sql.release_write,
            &[
                &lease.resource.as_str(),
                &lease.holder.as_str(),
                &token,
                &expires_at,
            ],
        )
        .await
    }

    async fn offer(&self, lease: &Lease, to: &str, within: Duration) -> Result<bool, StoreError> {
        let millis = validate_offer(lease, to, within)?;
        check_resource(&lease.resource)?;
        check_candidate(&lease.holder)?;
        check_candidate(to)?;
        let (seconds, rest_ms) = split_lease(millis, within)?;
        let marker = offer_holder(to);
        let token = lease.token.get();
        self.changed(
            &self.sql.offer,
            &[
                &lease.resource.as_str(),
                &lease.holder.as_str(),
                &token,
                &marker.as_str(),
                &seconds,
                &rest_ms,
            ],
        )
        .await
    }

    async fn take_offer(
        &self,
        resource: &str,
        candidate: &str,
        token: FencingToken,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let millis = validate_take(resource, candidate, lease)?;
        check_resource(resource)?;
        check_candidate(candidate)?;
        let (seconds, rest_ms) = split_lease(millis, lease)?;
        let marker = offer_holder(candidate);
        let token = token.get();
        self.changed(
            &self.sql.take_offer,
            &[
                &resource,
                &marker.as_str(),
                &token,
                &candidate,
                &seconds,
                &rest_ms,
            ],
        )
        .await
    }

    /// One batch for all of `held` (see `renew_all_sql`), the leases bound as one JSON
    /// document. Unlike the SeaORM store's batch, this one locks its rows (`UPDLOCK,
    /// HOLDLOCK`) and waits for a row another transaction holds (a holder's own fenced
    /// transaction) with the rest of the batch behind it, and it answers no lease as
    /// [`unanswered`](orion_beacon::store::Renewals::unanswered): keep fenced transactions on SQL Server
    /// short, and fence with one lease per transaction.
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
        let rows = self
            .raw_rows(&self.sql.renew_all, &[&seconds, &rest_ms, &json.as_str()])
            .await?;
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

    /// This store's membership table, where ranked electors keep their candidacy: a clone,
    /// sharing the pool and the schema checks.
    fn membership(&self) -> Option<Arc<dyn MembershipStore>> {
        Some(Arc::new(self.clone()))
    }
}
