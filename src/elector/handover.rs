//! A planned handover to a named successor: what the leader's call answers, and how the
//! leader learns whether the successor took the lease it offered.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::{debug, info};

use crate::{fencing::FencingToken, store::LeaseStore};

/// How a [`hand_over_to`](crate::ElectorHandle::hand_over_to) (or a step-down) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Handover {
    /// The successor took the offer: its term has this token, higher than the leader's (it
    /// leads on its renew right after the take).
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

/// How often the leader reads the lease while its offer is open: every [`LOOK_FIRST`] for the
/// first [`LOOK_STEADY`] (a live successor is woken at once and takes the lease within a few
/// milliseconds, so the answer comes within about a look of that), then twice as long each
/// time, up to [`LOOK_MOST`]. About a dozen cheap reads for a handover.
const LOOK_FIRST: Duration = Duration::from_millis(4);
const LOOK_STEADY: Duration = Duration::from_millis(60);
const LOOK_MOST: Duration = Duration::from_millis(250);
/// How long past an open offer's end (as the store reported it) the last read comes: the
/// local clock may run fast against the database's.
const PAST_THE_END: Duration = Duration::from_millis(50);
/// How long past the offer's end a read of the lease may take before it counts as failed.
const READ_MOST: Duration = Duration::from_secs(5);

/// Reads `resource` until `to` holds it (taken, with its token) or the offer's `until` has
/// passed (then the offer's end as the store reports it decides), and tells `done`. Bounded by
/// the offer's window (at most a lease) and one more read.
pub(super) async fn await_taker(
    store: Arc<dyn LeaseStore>,
    resource: Arc<str>,
    to: Arc<str>,
    until: Instant,
    done: oneshot::Sender<Handover>,
) {
    let mut pause = LOOK_FIRST;
    let steady_until = crate::clock::now().checked_add(LOOK_STEADY);
    let mut overtime = false;
    let taken = loop {
        let last = crate::clock::now() >= until;
        let mut next = crate::clock::now()
            .checked_add(pause)
            .unwrap_or(until)
            .min(until);
        // Each read bounded, so that a hung one cannot keep the answer (and a ranked leader's
        // next automatic handover, which waits for it) from coming.
        let read_until = crate::hold::timing::later(until.max(crate::clock::now()), READ_MOST);
        let read = match crate::clock::timeout_at(read_until, store.current(&resource)).await {
            Ok(read) => read.map_err(|e| e.to_string()),
            Err(_) => Err("no answer in time".to_owned()),
        };
        match read {
            Ok(Some(record)) if record.live && record.holder == *to => break Some(record.token),
            // Still open.
            Ok(Some(record)) if record.live && record.offered_to() == Some(&to) => {
                if last {
                    if overtime {
                        break None;
                    }
                    // Our clock says it is over, the store's does not: one more read after
                    // the end the store reports.
                    overtime = true;
                    let now = crate::clock::now();
                    next = now
                        .checked_add(record.remaining.saturating_add(PAST_THE_END))
                        .unwrap_or(now);
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
        crate::clock::sleep_until(next).await;
        if steady_until.is_none_or(|steady| crate::clock::now() >= steady) {
            pause = (pause * 2).min(LOOK_MOST);
        }
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
