//! Mutexes whose data stays usable after a panic elsewhere poisoned them: nothing here is left
//! half-changed by a panic, and poison must never take a store or an elector down.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// `m`'s guard, also after a panic elsewhere poisoned it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
