//! The decoding of lease rows: one row as every deciding statement returns it, and what it means
//! for the caller (a grant, a renew, a denial, a record).

use sea_orm::{DbErr, QueryResult};

use super::context::Context;
use super::statements::PAYLOAD_COLUMN;
use crate::error::StoreError;
use crate::lease::Lease;

/// The leases in rows of [`renewed_row`](super::statements::renewed_row); a row that is not live (a lease shorter than the
/// database's rounding) renews nothing.
pub(crate) fn renewed_leases(rows: &[QueryResult]) -> Result<Vec<Lease>, DbErr> {
    let mut leases = Vec::with_capacity(rows.len());
    for r in rows {
        let row = Row::decode(r)?;
        let resource: String = r.try_get_by_index(6)?;
        leases.extend(row.live_lease(resource));
    }
    Ok(leases)
}

pub(crate) use crate::store::support::LeaseRow as Row;

/// The row among `rows` (a read of one resource's row), decoded.
pub(crate) fn first_row(cx: &Context, rows: Vec<QueryResult>) -> Result<Option<Row>, StoreError> {
    rows.first()
        .map(Row::decode)
        .transpose()
        .map_err(|source| cx.decode_error(source))
}

/// Reading a [`Row`] from a sea-orm result.
pub(crate) trait Decode: Sized {
    /// The row of a lease statement (the payload by its column name).
    fn decode(row: &QueryResult) -> Result<Self, DbErr>;
}

impl Decode for Row {
    fn decode(row: &QueryResult) -> Result<Self, DbErr> {
        Ok(Self {
            holder: row.try_get_by_index(0)?,
            token: row.try_get_by_index(1)?,
            expires_at: row.try_get_by_index(2)?,
            acquired_at: row.try_get_by_index(3)?,
            renewed_at: row.try_get_by_index(4)?,
            remaining_millis: row.try_get_by_index(5)?,
            payload: row.try_get("", PAYLOAD_COLUMN)?,
        })
    }
}
