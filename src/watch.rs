//! Watching the state a running elector or shard-set node publishes.
//!
//! The loops publish through a [`tokio::sync::watch`] channel, whose sender waits for every
//! reader's borrow to end. A reader that held tokio's `Ref` across an `.await` would therefore
//! stop the loop itself: no renew, no step-down at the deadline, a `shutdown()` that never
//! returns. [`Watch`] hands out copies instead: every method takes the channel's read lock
//! only for the time of one clone (or one call of the caller's predicate), so no reader can
//! hold up the loop, whatever it does with the value.

use std::fmt;

use tokio::sync::watch;

/// A receiver of the state a running [`Elector`](crate::Elector) or
/// [`ShardSet`](crate::ShardSet) node publishes: the latest value and its changes, like
/// [`tokio::sync::watch::Receiver`], except that reads return copies, so nothing a reader does
/// can hold up the publishing loop.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use orion_beacon::{Elector, Leadership};
/// let handle = Elector::builder_in_memory().resource("watch-doc").build()?.start();
/// let mut state = handle.watch();
/// let leading = state.wait_for(|s| matches!(s, Leadership::Leader(_))).await?;
/// assert!(leading.is_leader());
/// // `leading` is a copy: keep it across awaits as long as you like.
/// handle.shutdown().await;
/// # Ok(()) }
/// ```
pub struct Watch<T> {
    inner: watch::Receiver<T>,
}

/// The loop that published the watched state has ended, and every change has been seen.
#[derive(Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the watched elector or shard-set node has stopped")]
#[non_exhaustive]
pub struct WatchClosed;

crate::error::debug_as_chain!(WatchClosed);

impl<T: Clone> Watch<T> {
    pub(crate) fn new(inner: watch::Receiver<T>) -> Self {
        Self { inner }
    }

    /// A copy of the latest value. Does not mark it seen.
    pub fn borrow(&self) -> T {
        self.inner.borrow().clone()
    }

    /// A copy of the latest value, marked seen: [`changed`](Self::changed) then waits for the
    /// next one.
    pub fn borrow_and_update(&mut self) -> T {
        self.inner.borrow_and_update().clone()
    }

    /// Whether a value not yet seen was published.
    pub fn has_changed(&self) -> Result<bool, WatchClosed> {
        self.inner.has_changed().map_err(|_| WatchClosed)
    }

    /// Marks the latest value seen.
    pub fn mark_unchanged(&mut self) {
        self.inner.mark_unchanged();
    }

    /// Waits for a value not yet seen (returns at once if there is one) and marks it seen;
    /// [`WatchClosed`] once the loop has ended and its last value was seen.
    pub async fn changed(&mut self) -> Result<(), WatchClosed> {
        self.inner.changed().await.map_err(|_| WatchClosed)
    }

    /// Waits until `f` holds for the latest value and returns a copy of it, marked seen. `f`
    /// looks at a copy, never under the channel's lock, so it may do anything (read another
    /// `Watch` of the same elector, call the handle).
    pub async fn wait_for(&mut self, mut f: impl FnMut(&T) -> bool) -> Result<T, WatchClosed> {
        loop {
            let value = self.borrow_and_update();
            if f(&value) {
                return Ok(value);
            }
            self.changed().await?;
        }
    }
}

impl<T> Clone for Watch<T> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<T: fmt::Debug> fmt::Debug for Watch<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watch")
            .field("latest", &*self.inner.borrow())
            .finish()
    }
}
