//! A planned handover to a named successor: what the leader's call answers, and how the
//! leader learns whether the successor took the lease it offered.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::{debug, info};

use crate::{FencingToken, LeaseStore};

/// How a [`hand_over_to`](crate::ElectorHandle::hand_over_to) (or a step-down) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Handover {
    /// The successor took the lease: its term has this token, higher than the leader's.
    Taken {
        /// The successor's term's token.
        token: FencingToken,
    },
    /// The lease was offered, but the successor did not take it in the time given (it is not
    /// a live follower of this resource): the offer lapsed, and the lease goes to whichever
    /// candidate asks first, with a higher token still.
    NotTaken,
    /// The term ended, but nothing was offered: the lease was lost meanwhile, the work did not
    /// stop within the grace period, or the store failed; the lease lapses on its own. For a
    /// step-down: the term ended (released, or left to lapse).
    Ended,
    /// This candidate did not lead (or the elector had stopped): nothing happened.
    NotLeader,
}

/// How often the leader reads the lease while its offer is open.
const LOOK_EVERY: Duration = Duration::from_millis(20);

/// Reads `resource` until `to` holds it (taken, with its token) or the offer's `until` has
/// passed (then one last read decides), and tells `done`.
pub(super) async fn await_taker(
    store: Arc<dyn LeaseStore>,
    resource: Arc<str>,
    to: Arc<str>,
    until: Instant,
    done: oneshot::Sender<Handover>,
) {
    let taken = loop {
        let last = crate::clock::now() >= until;
        match store.current(&resource).await {
            Ok(Some(record)) if record.live && record.holder == *to => break Some(record.token),
            // Still open: look again until the offer's time is up.
            Ok(Some(record)) if record.live && record.offered_to() == Some(&to) => {
                if last {
                    break None;
                }
            }
            // Lapsed, revoked or taken by another candidate after it lapsed.
            Ok(_) => break None,
            Err(error) if !last => {
                debug!(%error, "reading the offered lease failed; looking again");
            }
            Err(_) => break None,
        }
        if done.is_closed() {
            return;
        }
        let next = crate::clock::now()
            .checked_add(LOOK_EVERY)
            .unwrap_or(until)
            .min(until);
        crate::clock::sleep_until(next).await;
    };
    let outcome = match taken {
        Some(token) => {
            info!(successor = %to, %token, "handed over");
            Handover::Taken { token }
        }
        None => {
            info!(successor = %to, "the successor did not take the lease; it lapsed to the contest");
            Handover::NotTaken
        }
    };
    let _ = done.send(outcome);
}
