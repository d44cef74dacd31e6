//! What the store answers: leases, denials and stored records.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::FencingToken;

/// A lease this candidate holds, as the store just granted or renewed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The resource led.
    pub resource: String,
    /// The holder: the candidate that asked.
    pub holder: String,
    /// The term's fencing token.
    pub token: FencingToken,
    /// Lease time left, computed by the store's own clock in the same statement and measured
    /// from the moment the statement began, which is after the caller sent it. So a *local
    /// monotonic* instant taken before the call, plus this, is a deadline that never outlasts
    /// the lease in the store. For a fresh grant or renew it is the whole lease duration, or a
    /// little more when the statement waited for a row lock (the lease runs from when the row
    /// was written). Never compare the timestamps below with a local clock.
    pub remaining: Duration,
    /// The expiry in the database's clock; with the lease's holder and token it names the write
    /// that granted it (see [`LeaseStore::release_lease`](crate::LeaseStore::release_lease)).
    /// The in-memory store reports it on its own clock, anchored at the store's creation.
    pub expires_at: Option<DateTime<Utc>>,
    /// When this term began, in the database's clock (`None` for the in-memory store).
    pub acquired_at: Option<DateTime<Utc>>,
}

/// Someone else holds a live lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    /// The resource asked for.
    pub resource: String,
    /// Who holds it, where the store can say (see the store's notes on races).
    pub holder: Option<String>,
    /// The holder's token, where known.
    pub token: Option<FencingToken>,
    /// Lease time the holder has left, judged by the store's clock (zero if unknown).
    pub remaining: Duration,
    /// The holder's expiry in the database's clock, where known.
    pub expires_at: Option<DateTime<Utc>>,
}

/// The answer to [`LeaseStore::acquire_or_renew`](crate::LeaseStore::acquire_or_renew).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseOutcome {
    /// A new term began for this candidate: the token advanced.
    Acquired(Lease),
    /// This candidate already held a live lease: its expiry moved, the token did not.
    Renewed(Lease),
    /// Another candidate holds a live lease: nothing changed.
    Denied(Denial),
}

impl LeaseOutcome {
    /// The lease, if this candidate holds one now.
    pub fn lease(&self) -> Option<&Lease> {
        match self {
            LeaseOutcome::Acquired(lease) | LeaseOutcome::Renewed(lease) => Some(lease),
            LeaseOutcome::Denied(_) => None,
        }
    }

    /// The token, if this candidate holds the lease now.
    pub fn token(&self) -> Option<FencingToken> {
        self.lease().map(|lease| lease.token)
    }

    /// Whether this candidate holds the lease now.
    pub fn is_held(&self) -> bool {
        self.lease().is_some()
    }
}

/// A lease row as stored, with liveness judged by the store's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// The resource.
    pub resource: String,
    /// The current or last holder.
    pub holder: String,
    /// The current or last term's token.
    pub token: FencingToken,
    /// Whether the lease is live now (by the store's clock). A released lease is not.
    pub live: bool,
    /// Lease time left (zero when not live).
    pub remaining: Duration,
    /// The expiry in the database's clock (the in-memory store's own clock for that store).
    pub expires_at: Option<DateTime<Utc>>,
    /// When the term began (`None` for the in-memory store).
    pub acquired_at: Option<DateTime<Utc>>,
    /// When the term was last acquired or renewed (`None` for the in-memory store).
    pub renewed_at: Option<DateTime<Utc>>,
}
