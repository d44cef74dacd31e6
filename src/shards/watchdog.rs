//! What runs beside a shard set node's loop: a watchdog per term that ends it at its local
//! deadline whatever the loop is doing, and the wait for release notifications.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tracing::warn;

use crate::clock::sleep_until;
use crate::hold::{LeaderTerm, LossReason};

/// The longest a watchdog sleeps before it looks at its term's deadline again.
const WATCHDOG_SLICE: Duration = Duration::from_secs(1);

/// Ends `term` when its local deadline passes without a renew moving it, whatever the loop is
/// doing (a round can wait on a slow database): work never runs past the lease. Tells the loop,
/// so the ended term leaves the published assignment at once.
pub(crate) async fn watchdog(term: LeaderTerm, lost: Arc<Notify>) {
    loop {
        // In slices: a host suspend stops tokio's timers, and the look after each slice sees
        // the deadline passed within a slice of the resume.
        let deadline = term
            .local_deadline()
            .min(crate::clock::now() + WATCHDOG_SLICE);
        tokio::select! {
            _ = term.cut_off_signal() => return,
            _ = sleep_until(deadline) => {}
        }
        if term.local_deadline() <= crate::clock::now() {
            warn!(resource = term.resource(), token = %term.token(), "no renew in time: the term ends");
            term.end(LossReason::Deadline);
            term.cut_off();
            lost.notify_one();
            return;
        }
    }
}

/// What the release notifications said next.
pub(crate) enum Released {
    /// `resource` was released.
    One(Arc<str>),
    /// Notifications were dropped (the channel overflowed): any resource may have been.
    Missed,
    /// The channel is closed: poll only from now on.
    Closed,
}

/// The next release notification; pending forever without a channel.
pub(crate) async fn recv(events: &mut Option<crate::store::ReleaseEvents>) -> Released {
    let Some(rx) = events.as_mut() else {
        return std::future::pending().await;
    };
    match rx.recv().await {
        Ok(resource) => Released::One(resource),
        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => Released::Missed,
        Err(tokio::sync::broadcast::error::RecvError::Closed) => Released::Closed,
    }
}
