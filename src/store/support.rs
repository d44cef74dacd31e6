//! What a store implemented outside this crate shares with ours (the SQL Server store,
//! `orion-beacon-sqlserver`, is one): the lease row every deciding statement returns and the
//! answers it means, and the batch renew's JSON form. The input rules are in [`store`](super).

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::fencing::FencingToken;
use crate::lease::{Denial, Lease, LeaseOutcome, LeaseRecord};

/// The name of the column that carries the row's payload in every lease statement's rows: the
/// last one.
pub const PAYLOAD_COLUMN: &str = "current_payload";

/// The leases of a batch as one JSON document, bound as a single parameter:
/// `[{"r": resource, "h": holder, "t": token}, ...]`.
pub fn held_json(held: &[Lease]) -> String {
    let rows: Vec<serde_json::Value> = held
        .iter()
        .map(|l| serde_json::json!({"r": l.resource, "h": l.holder, "t": l.token.get()}))
        .collect();
    serde_json::Value::Array(rows).to_string()
}

/// A lease row as every deciding statement returns it (holder, token, expiry, acquired,
/// renewed, the milliseconds left by the database clock, and the payload), and what it means
/// for the caller: a grant, a renew, a denial, a record.
#[derive(Debug, Clone)]
pub struct LeaseRow {
    /// The row's holder (an offer's marker included).
    pub holder: String,
    /// The row's fencing token.
    pub token: i64,
    /// When the lease ends, by the database clock.
    pub expires_at: DateTime<Utc>,
    /// When the current term began.
    pub acquired_at: DateTime<Utc>,
    /// The term's last renew (`acquired_at` for a new term).
    pub renewed_at: DateTime<Utc>,
    /// `expires_at` minus the database's now, in milliseconds (0 or less: not live).
    pub remaining_millis: i64,
    /// The current term's payload (`None` when the term wrote none).
    pub payload: Option<String>,
}

impl LeaseRow {
    /// Liveness by the database clock: the expiry is still ahead of the database's now.
    pub fn live(&self) -> bool {
        self.remaining_millis > 0
    }

    fn remaining(&self) -> Duration {
        Duration::from_millis(u64::try_from(self.remaining_millis).unwrap_or(0))
    }

    /// The lease this row is for its holder, if it is live (a renewed row of a batch).
    pub fn live_lease(self, resource: String) -> Option<Lease> {
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
    pub fn outcome(self, resource: &str, candidate: &str) -> LeaseOutcome {
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

    /// The denial this row means for a caller that is not its holder.
    pub fn denial(self, resource: &str) -> Denial {
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
    pub fn denial_for(self, resource: &str, candidate: &str) -> Denial {
        let mut denial = self.denial(resource);
        if denial.holder.as_deref() == Some(candidate) {
            denial.holder = None;
            denial.remaining = Duration::ZERO;
            denial.payload = None;
        }
        denial
    }

    /// The row as an operator's record (`list`, `show`).
    pub fn record(self, resource: &str) -> LeaseRecord {
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

    fn row(holder: &str, remaining_millis: i64) -> LeaseRow {
        let t = DateTime::<Utc>::UNIX_EPOCH;
        LeaseRow {
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
