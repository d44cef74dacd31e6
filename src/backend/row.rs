//! The decoding of lease rows: one row as every deciding statement returns it, and what it means
//! for the caller (a grant, a renew, a denial, a record).

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::{DbErr, QueryResult};

use super::statements::{Shape, PAYLOAD_COLUMN};
use crate::{
    fencing::FencingToken, lease::Denial, lease::Lease, lease::LeaseOutcome, lease::LeaseRecord,
};

/// The leases in rows of [`renewed_row`](super::statements::renewed_row); a row that is not live (a lease shorter than the
/// database's rounding) renews nothing.
pub(crate) fn renewed_leases(rows: &[QueryResult], shape: Shape) -> Result<Vec<Lease>, DbErr> {
    let mut leases = Vec::with_capacity(rows.len());
    for r in rows {
        let row = Row::decode(r, shape)?;
        let resource: String = r.try_get_by_index(6)?;
        leases.extend(row.live_lease(resource));
    }
    Ok(leases)
}

/// A decoded lease row.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub holder: String,
    pub token: i64,
    pub expires_at: DateTime<Utc>,
    pub acquired_at: DateTime<Utc>,
    pub renewed_at: DateTime<Utc>,
    pub remaining_millis: i64,
    /// The current term's payload (`None` for a table of [`Shape::Plain`]).
    pub payload: Option<String>,
}

impl Row {
    /// The row of a statement for a table of `shape` (the payload, if any, by its column name).
    pub(crate) fn decode(row: &QueryResult, shape: Shape) -> Result<Self, DbErr> {
        let payload = match shape {
            Shape::Plain => None,
            Shape::Payload => row.try_get("", PAYLOAD_COLUMN)?,
        };
        Ok(Self {
            holder: row.try_get_by_index(0)?,
            token: row.try_get_by_index(1)?,
            expires_at: row.try_get_by_index(2)?,
            acquired_at: row.try_get_by_index(3)?,
            renewed_at: row.try_get_by_index(4)?,
            remaining_millis: row.try_get_by_index(5)?,
            payload,
        })
    }

    /// Liveness by the database clock: the expiry is still ahead of the database's now.
    pub(crate) fn live(&self) -> bool {
        self.remaining_millis > 0
    }

    fn remaining(&self) -> Duration {
        Duration::from_millis(u64::try_from(self.remaining_millis).unwrap_or(0))
    }

    /// The lease this row is for its holder, if it is live (a renewed row of a batch).
    pub(crate) fn live_lease(self, resource: String) -> Option<Lease> {
        self.live().then(|| Lease {
            resource,
            token: FencingToken::new(self.token),
            remaining: self.remaining(),
            expires_at: Some(self.expires_at),
            acquired_at: Some(self.acquired_at),
            holder: self.holder,
            payload: self.payload,
        })
    }

    /// The outcome this row means for `candidate`, when it is the row after the upsert.
    pub(crate) fn outcome(self, resource: &str, candidate: &str) -> LeaseOutcome {
        if self.holder != candidate {
            return LeaseOutcome::Denied(self.denial(resource));
        }
        if !self.live() {
            // The row names us but is not live by the database clock: whatever wrote it, it is
            // no lease to lead on (a correct statement never leaves this behind).
            tracing::warn!(
                resource,
                token = self.token,
                remaining_ms = self.remaining_millis,
                "the lease row names this candidate but is not live; not a grant"
            );
            return LeaseOutcome::Denied(self.denial_for(resource, candidate));
        }
        let new_term = self.acquired_at == self.renewed_at;
        let lease = Lease {
            resource: resource.to_owned(),
            token: FencingToken::new(self.token),
            remaining: self.remaining(),
            expires_at: Some(self.expires_at),
            acquired_at: Some(self.acquired_at),
            holder: self.holder,
            payload: self.payload,
        };
        if new_term {
            LeaseOutcome::Acquired(lease)
        } else {
            LeaseOutcome::Renewed(lease)
        }
    }

    pub(crate) fn denial(self, resource: &str) -> Denial {
        Denial {
            resource: resource.to_owned(),
            token: Some(FencingToken::new(self.token)),
            remaining: self.remaining(),
            expires_at: Some(self.expires_at),
            holder: Some(self.holder),
            payload: self.payload,
            stalled: None,
        }
    }

    /// The denial report for `candidate`: never names the candidate itself as the holder (a
    /// stale snapshot or an expired row of its own can), since it would then follow itself.
    pub(crate) fn denial_for(self, resource: &str, candidate: &str) -> Denial {
        let mut denial = self.denial(resource);
        if denial.holder.as_deref() == Some(candidate) {
            denial.holder = None;
            denial.remaining = Duration::ZERO;
            denial.payload = None;
        }
        denial
    }

    pub(crate) fn record(self, resource: &str) -> LeaseRecord {
        LeaseRecord {
            resource: resource.to_owned(),
            live: self.live(),
            token: FencingToken::new(self.token),
            remaining: self.remaining(),
            expires_at: Some(self.expires_at),
            acquired_at: Some(self.acquired_at),
            renewed_at: Some(self.renewed_at),
            holder: self.holder,
            payload: self.payload,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(holder: &str, remaining_millis: i64) -> Row {
        let t = DateTime::<Utc>::UNIX_EPOCH;
        Row {
            holder: holder.to_owned(),
            token: 3,
            expires_at: t,
            acquired_at: t,
            renewed_at: t,
            remaining_millis,
            payload: None,
        }
    }

    #[test]
    fn a_report_never_names_the_caller() {
        let d = row("me", 500).denial_for("r", "me");
        assert_eq!((d.holder, d.remaining), (None, Duration::ZERO));
        let d = row("other", 500).denial_for("r", "me");
        assert_eq!(d.holder.as_deref(), Some("other"));
        assert_eq!(d.remaining, Duration::from_millis(500));
    }

    #[test]
    fn a_row_that_names_the_caller_but_is_not_live_is_no_grant() {
        assert!(matches!(
            row("me", 0).outcome("r", "me"),
            LeaseOutcome::Denied(Denial { holder: None, .. })
        ));
        assert!(matches!(
            row("me", 1).outcome("r", "me"),
            LeaseOutcome::Acquired(_)
        ));
    }
}
