//! The input rules every store enforces before any SQL runs (names, durations, payloads,
//! batches, offers), and what a store is told about the caller an acquire runs for.

use std::time::Duration;

use super::{MAX_LEASE, MAX_NAME_LEN, MAX_PAYLOAD_LEN, MIN_LEASE};
use crate::error::StoreError;
use crate::lease::Lease;

fn name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("must not be empty")
    } else if name.chars().count() > MAX_NAME_LEN {
        Some("must be at most 255 characters")
    } else if name.chars().any(char::is_control) {
        Some("must not contain control characters")
    } else if name.starts_with(char::is_whitespace) || name.ends_with(char::is_whitespace) {
        // Some collations ignore trailing spaces: "a" and "a " must never be one holder.
        Some("must not start or end with white space")
    } else {
        None
    }
}

/// Checks a resource name: 1 to 255 characters, no control characters, no leading or trailing
/// white space.
pub fn validate_resource(name: &str) -> Result<(), StoreError> {
    match name_problem(name) {
        Some(reason) => Err(StoreError::InvalidResource {
            name: name.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

/// Checks a candidate id (same rules as [`validate_resource`]).
pub fn validate_candidate(name: &str) -> Result<(), StoreError> {
    match name_problem(name) {
        Some(reason) => Err(StoreError::InvalidCandidate {
            name: name.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

/// Checks a lease payload: at most [`MAX_PAYLOAD_LEN`] bytes of UTF-8, no NUL character (which
/// PostgreSQL's text cannot hold).
pub fn validate_payload(payload: &str) -> Result<(), StoreError> {
    let invalid = |reason| StoreError::InvalidPayload {
        len: payload.len(),
        reason,
    };
    if payload.len() > MAX_PAYLOAD_LEN {
        return Err(invalid("must be at most 1024 bytes"));
    }
    if payload.contains('\0') {
        return Err(invalid("must not contain a NUL character"));
    }
    Ok(())
}

/// Checks a lease duration and returns it in whole milliseconds, the precision every store
/// works in.
pub fn lease_millis(lease: Duration) -> Result<i64, StoreError> {
    let invalid = |reason| StoreError::InvalidLeaseDuration {
        duration: lease,
        reason,
    };
    if lease < MIN_LEASE {
        return Err(invalid("must be at least 1 ms"));
    }
    if lease > MAX_LEASE {
        return Err(invalid("must be at most 366 days"));
    }
    i64::try_from(lease.as_millis()).map_err(|_| invalid("must be at most 366 days"))
}

/// Checks a batch for [`LeaseStore::renew_all`](super::LeaseStore::renew_all): every name, the duration, and no resource
/// twice (one statement cannot renew a resource for two terms). Returns the duration in
/// milliseconds.
pub fn validate_batch(held: &[Lease], lease: Duration) -> Result<i64, StoreError> {
    let millis = lease_millis(lease)?;
    let mut seen = std::collections::HashSet::with_capacity(held.len());
    for h in held {
        validate_resource(&h.resource)?;
        validate_candidate(&h.holder)?;
        if !seen.insert(h.resource.as_str()) {
            return Err(StoreError::InvalidResource {
                name: h.resource.clone(),
                reason: "appears more than once in the batch",
            });
        }
    }
    Ok(millis)
}

/// What a task that runs an acquire for a caller (a lock's attempt, on a task of its own so
/// that a dropped caller cannot cut its statement short) tells the store, and learns from it.
pub(crate) struct ForCaller {
    /// Changes to closed when the caller is gone: an acquire still queued for one of the
    /// store's attempt slots then leaves the queue, nothing sent.
    pub(crate) gone: tokio::sync::watch::Receiver<()>,
    /// Counts the acquires the store let through to be sent for the call (a wrapper may try
    /// more than once).
    pub(crate) sent: std::sync::Arc<std::sync::atomic::AtomicU32>,
    /// Set by the store when it gave an acquire up that way.
    pub(crate) gave_up: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// A try (`try_acquire`): it never waits behind this process's other attempts of the same
    /// lease; while one is in flight the store answers a denial naming no holder, nothing sent.
    pub(crate) once: bool,
    /// When the store first let an acquire of the call through to be sent (after any wait for
    /// an attempt slot): a grant's local deadline counts from here, not from before that wait.
    /// This holds while every statement of the call goes through that acquire (as the
    /// store's own and the documented wrappers' do): a wrapper that granted through another
    /// path first would make the deadline too late by the wait.
    pub(crate) let_through: std::sync::Arc<std::sync::Mutex<Option<tokio::time::Instant>>>,
}

impl ForCaller {
    /// Whether the call certainly holds nothing: the store gave an acquire up unsent, and let
    /// none through.
    pub(crate) fn sent_nothing(
        sent: &std::sync::atomic::AtomicU32,
        gave_up: &std::sync::atomic::AtomicBool,
    ) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        gave_up.load(SeqCst) && sent.load(SeqCst) == 0
    }
}

tokio::task_local! {
    /// The caller an acquire runs for, where a task says (see [`ForCaller`]).
    pub(crate) static FOR_CALLER: ForCaller;

    /// When the caller of a batch renew gives up on its answer (the crate's clock, see
    /// `clock`): the renews of the leases the batch left out end in time for the batch's own
    /// renewals to reach it.
    pub(crate) static ANSWER_BY: tokio::time::Instant;
}

/// `renew` (a batch renew) for a caller that gives up at `until`, and gives up then.
pub(crate) async fn renew_by<T>(
    until: tokio::time::Instant,
    renew: impl std::future::Future<Output = T>,
) -> Result<T, tokio::time::error::Elapsed> {
    crate::clock::timeout_at(until, ANSWER_BY.scope(until, renew)).await
}

/// Checks a request's resource, candidate and lease; the lease in milliseconds.
pub fn validate_request(
    resource: &str,
    candidate: &str,
    lease: Duration,
) -> Result<i64, StoreError> {
    validate_resource(resource)?;
    validate_candidate(candidate)?;
    lease_millis(lease)
}

/// The longest candidate id an [`offer`](super::LeaseStore::offer) can name: the offer's holder is
/// the id behind a two-character marker, in a column of [`MAX_NAME_LEN`] characters.
pub const MAX_OFFER_TARGET_LEN: usize = MAX_NAME_LEN - 2;

pub use crate::lease::offer_holder;

/// Checks a candidate id an offer names: a valid id, short enough for the marker.
pub fn validate_offer_target(to: &str) -> Result<(), StoreError> {
    validate_candidate(to)?;
    if to.chars().count() > MAX_OFFER_TARGET_LEN {
        return Err(StoreError::InvalidCandidate {
            name: to.to_owned(),
            reason: "must be at most 253 characters to be offered a lease",
        });
    }
    Ok(())
}

/// Checks an [`offer`](super::LeaseStore::offer)'s input; the offer window in milliseconds.
pub fn validate_offer(lease: &Lease, to: &str, within: Duration) -> Result<i64, StoreError> {
    validate_resource(&lease.resource)?;
    validate_candidate(&lease.holder)?;
    validate_offer_target(to)?;
    if to == lease.holder {
        return Err(StoreError::InvalidCandidate {
            name: to.to_owned(),
            reason: "an offer names another candidate than the holder",
        });
    }
    lease_millis(within)
}

/// Checks a [`take_offer`](super::LeaseStore::take_offer)'s input; the lease in milliseconds.
pub fn validate_take(resource: &str, candidate: &str, lease: Duration) -> Result<i64, StoreError> {
    let millis = validate_request(resource, candidate, lease)?;
    validate_offer_target(candidate)?;
    Ok(millis)
}
