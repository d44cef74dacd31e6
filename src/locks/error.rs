//! What a lock or a semaphore can fail with.

use std::time::Duration;

use crate::hold::LossReason;
use crate::{error::ErrorKind, error::StoreError};

/// Why a lock or a permit was not had, or was lost before its work returned.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// [`acquire`](crate::locks::Lock::acquire) waited its whole timeout and the lock (every
    /// permit, for a semaphore) stayed held by others.
    #[error(
        "lock {name:?} was not free within {waited:?}{}",
        holder.as_ref().map(|h| format!(" (held by {h:?})")).unwrap_or_default()
    )]
    Timeout {
        /// The lock or semaphore.
        name: String,
        /// How long the call waited.
        waited: Duration,
        /// The last holder the store named, where it could.
        holder: Option<String>,
        /// That holder's payload, where it wrote one (see
        /// [`LocksBuilder::payload`](crate::locks::LocksBuilder::payload)).
        payload: Option<String>,
    },
    /// The scoped forms ([`Lock::with_lock`](crate::locks::Lock::with_lock),
    /// [`Semaphore::with_permit`](crate::locks::Semaphore::with_permit)): the lock was lost
    /// before the closure's work returned, and that work was dropped.
    #[error("lock {name:?} was lost ({reason}) before its work returned; the work was dropped")]
    Lost {
        /// The lock or semaphore.
        name: String,
        /// Why the lock ended.
        reason: LossReason,
    },
    /// A semaphore asked for with no permits, or more than
    /// [`MAX_PERMITS`](crate::locks::MAX_PERMITS).
    #[error("a semaphore has 1 to {max} permits, not {permits}")]
    Permits {
        /// The permits asked for.
        permits: u32,
        /// The most a semaphore has.
        max: u32,
    },
    /// A timeout longer than [`MAX_INTERVAL`](crate::hold::timing::MAX_INTERVAL).
    #[error("a lock timeout of {timeout:?} is too long: at most {max:?}")]
    TimeoutTooLong {
        /// The timeout given.
        timeout: Duration,
        /// The longest accepted.
        max: Duration,
    },
    /// An acquire called outside a tokio runtime: locks are renewed, waited for and released
    /// on tokio tasks and timers.
    #[error(
        "locks need a tokio runtime (with its time driver): the acquire was called outside one"
    )]
    NoRuntime,
    /// The store refused the name (see [`crate::store::validate_resource`])
    /// or failed; with [`acquire`](crate::locks::Lock::acquire), the last of its errors when
    /// the timeout ran out.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl LockError {
    /// What kind of failure this is: [`ErrorKind::TimedOut`], [`ErrorKind::Lost`],
    /// [`ErrorKind::InvalidInput`] for bad permits or timeouts or no runtime, the store error's own kind.
    pub fn kind(&self) -> ErrorKind {
        match self {
            LockError::Timeout { .. } => ErrorKind::TimedOut,
            LockError::Lost { .. } => ErrorKind::Lost,
            LockError::Permits { .. } | LockError::TimeoutTooLong { .. } | LockError::NoRuntime => {
                ErrorKind::InvalidInput
            }
            LockError::Store(err) => err.kind(),
        }
    }
}

crate::error::debug_as_chain!(LockError);
