//! What the store answers: leases, denials and stored records.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::fencing::FencingToken;

/// A lease this candidate holds, as the store just granted or renewed it.
///
/// With the `serde` feature it serializes with `remaining` as `remaining_ms` (milliseconds) and
/// times as RFC 3339.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
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
    #[cfg_attr(
        feature = "serde",
        serde(rename = "remaining_ms", serialize_with = "millis")
    )]
    pub remaining: Duration,
    /// The expiry in the database's clock; with the lease's holder and token it names the write
    /// that granted it (see [`LeaseStore::release_lease`](crate::LeaseStore::release_lease)).
    /// The in-memory store reports it on its own clock, anchored at the store's creation.
    pub expires_at: Option<DateTime<Utc>>,
    /// When this term began, in the database's clock (`None` for the in-memory store).
    pub acquired_at: Option<DateTime<Utc>>,
    /// The payload the statement that granted or renewed this lease wrote (see
    /// [`LeaseStore::acquire_or_renew_with`](crate::LeaseStore::acquire_or_renew_with)), as
    /// stored; `None` when it wrote none.
    pub payload: Option<String>,
}

/// Someone else holds a live lease.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Denial {
    /// The resource asked for.
    pub resource: String,
    /// Who holds it, where the store can say (see the store's notes on races).
    pub holder: Option<String>,
    /// The holder's token, where known.
    pub token: Option<FencingToken>,
    /// Lease time the holder has left, judged by the store's clock (zero if unknown).
    #[cfg_attr(
        feature = "serde",
        serde(rename = "remaining_ms", serialize_with = "millis")
    )]
    pub remaining: Duration,
    /// The holder's expiry in the database's clock, where known.
    pub expires_at: Option<DateTime<Utc>>,
    /// The payload the holder wrote with its latest grant or renew of this term (its address,
    /// a version), where it wrote one. Never a payload of an earlier term: a term that wrote
    /// none shows `None`.
    pub payload: Option<String>,
    /// Set when the holder's lease has lapsed by the database clock but its session still
    /// holds the lease row locked (a fenced transaction of a holder stopped, cut off or stuck
    /// in a long statement) and the store did not end that session within the acquire's
    /// bound: why (the server refused it, naming the privilege it lacks, or the lock is not one
    /// the store may end). The resource stays held until that transaction ends; ask again
    /// later, as for any denial. (Left out of the `serde` form when `None`.)
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub stalled: Option<String>,
}

/// The answer to [`LeaseStore::acquire_or_renew`](crate::LeaseStore::acquire_or_renew).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(tag = "outcome", rename_all = "snake_case"))]
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
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
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
    #[cfg_attr(
        feature = "serde",
        serde(rename = "remaining_ms", serialize_with = "millis")
    )]
    pub remaining: Duration,
    /// The expiry in the database's clock (the in-memory store's own clock for that store).
    pub expires_at: Option<DateTime<Utc>>,
    /// When the term began (`None` for the in-memory store).
    pub acquired_at: Option<DateTime<Utc>>,
    /// When the term was last acquired or renewed (`None` for the in-memory store).
    pub renewed_at: Option<DateTime<Utc>>,
    /// The payload of the current (or last) term, as its latest grant or renew wrote it; `None`
    /// when that wrote none (or the table has no payload column yet).
    pub payload: Option<String>,
}

impl Lease {
    /// A lease of `holder` on `resource` with `token` and `remaining` time, no database times:
    /// for [`LeaseStore`](crate::LeaseStore) implementations (set the other fields as known).
    pub fn new(
        resource: impl Into<String>,
        holder: impl Into<String>,
        token: FencingToken,
        remaining: Duration,
    ) -> Self {
        Self {
            resource: resource.into(),
            holder: holder.into(),
            token,
            remaining,
            expires_at: None,
            acquired_at: None,
            payload: None,
        }
    }
}

impl Denial {
    /// A denial on `resource` whose holder the store cannot name (set the fields it knows).
    pub fn new(resource: impl Into<String>) -> Self {
        Self {
            resource: resource.into(),
            holder: None,
            token: None,
            remaining: Duration::ZERO,
            expires_at: None,
            payload: None,
            stalled: None,
        }
    }

    /// The candidate the holder's term was offered to, when the lease is an open offer (see
    /// [`LeaseStore::offer`](crate::LeaseStore::offer)): only that candidate can take it.
    pub fn offered_to(&self) -> Option<&str> {
        offered_to(self.holder.as_deref()?)
    }
}

impl LeaseRecord {
    /// The candidate this lease was offered to, when it is an offer (see
    /// [`LeaseStore::offer`](crate::LeaseStore::offer)): open while [`live`](Self::live), lapsed
    /// otherwise.
    pub fn offered_to(&self) -> Option<&str> {
        offered_to(&self.holder)
    }

    /// A stored lease of `holder` on `resource` with `token`, not live, no database times (set
    /// the fields as known).
    pub fn new(
        resource: impl Into<String>,
        holder: impl Into<String>,
        token: FencingToken,
    ) -> Self {
        Self {
            resource: resource.into(),
            holder: holder.into(),
            token,
            live: false,
            remaining: Duration::ZERO,
            expires_at: None,
            acquired_at: None,
            renewed_at: None,
            payload: None,
        }
    }
}

/// A duration as whole milliseconds (saturating), for `serde`.
#[cfg(feature = "serde")]
pub(crate) fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// An optional duration as whole milliseconds, for `serde`.
#[cfg(feature = "serde")]
pub(crate) fn opt_millis<S: serde::Serializer>(
    d: &Option<Duration>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => millis(d, s),
        None => s.serialize_none(),
    }
}

/// What [`LeaseStore::renew_all`](crate::LeaseStore::renew_all) did with the leases it was
/// given, each in the order given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Renewals {
    /// The leases renewed: the same terms (holder, token), with the new remaining time and
    /// expiry.
    pub renewed: Vec<Lease>,
    /// The leases not renewed, as they were given: expired, released, revoked or taken over.
    /// Their terms have ended; the other leases' terms are not affected.
    pub lost: Vec<Lease>,
    /// The leases neither renewed nor known lost this time, as they were given: their row was
    /// held locked by another transaction (a holder's own fenced transaction, a stuck
    /// statement) for longer than their renew alone waited for it, their renew failed, or
    /// the batch's time for such leases ran out first. Their terms go on until their local
    /// deadlines; ask again.
    pub unanswered: Vec<Lease>,
}

impl Renewals {
    /// Sorts `held` into renewed and lost: a lease is renewed when `fresh` has a lease of the
    /// same resource, holder and token (the store's answer for it), and lost otherwise.
    pub fn sort(held: &[Lease], fresh: Vec<Lease>) -> Self {
        let mut fresh: std::collections::HashMap<(String, String, i64), Lease> = fresh
            .into_iter()
            .map(|f| ((f.resource.clone(), f.holder.clone(), f.token.get()), f))
            .collect();
        let mut out = Renewals::default();
        for lease in held {
            let key = (
                lease.resource.clone(),
                lease.holder.clone(),
                lease.token.get(),
            );
            match fresh.remove(&key) {
                Some(renewed) => out.renewed.push(renewed),
                None => out.lost.push(lease.clone()),
            }
        }
        out
    }
}

/// What an offer's holder starts with (two characters): a white space no candidate id can start
/// with (see `store::validate_candidate`), then an arrow.
pub const OFFER_MARKER: &str = " \u{2192}";

/// The holder an offer to `to` is stored under.
pub fn offer_holder(to: &str) -> String {
    format!("{OFFER_MARKER}{to}")
}

/// The candidate an offer's holder names, if `holder` is one.
pub(crate) fn offered_to(holder: &str) -> Option<&str> {
    holder.strip_prefix(OFFER_MARKER)
}
