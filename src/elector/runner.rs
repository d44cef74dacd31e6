//! The elector's loop: contend as a follower, renew as a leader, step down in time.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, watch, RwLock};
use tokio::time::error::Elapsed;
use tokio::time::{sleep_until, timeout, timeout_at, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn, Instrument};

use super::config::Config;
use super::health::Probe;
use super::random::jittered;
use super::term::{LeaderTerm, Leadership, LossReason};
use crate::store::ReleaseEvents;
use crate::{Denial, Lease, LeaseOutcome, LeaseStore};

/// A follower told that the lease ends in `remaining` tries again this long after it.
const AFTER_EXPIRY: Duration = Duration::from_millis(15);
/// First back-off after a store error; doubles per consecutive error.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// How long dropped leader work gets to let go of the work gate before shutdown gives up on it.
const UNWIND: Duration = Duration::from_millis(100);

/// `t + d`, checked: the options are bounded (see `MAX_INTERVAL`), so this never saturates in
/// practice, but no option value can make the loop panic.
fn later(t: Instant, d: Duration) -> Instant {
    t.checked_add(d)
        .or_else(|| t.checked_add(super::config::MAX_INTERVAL))
        .unwrap_or(t)
}

/// How the loop was asked to stop.
#[derive(Debug, Clone)]
pub(crate) struct Stop {
    /// Graceful: end the work, release, stop.
    pub shutdown: CancellationToken,
    /// Abrupt: as if the process died (no waiting for work, no release).
    pub abort: CancellationToken,
}

pub(crate) struct Runner {
    pub store: Arc<dyn LeaseStore>,
    pub config: Arc<Config>,
    pub state: watch::Sender<Leadership>,
    pub stop: Stop,
    /// Leader work holds a read guard while it runs; shutdown takes the write lock to wait
    /// for it.
    pub work_gate: Arc<RwLock<()>>,
    /// Health and metrics: store round trips and term changes.
    pub probe: Probe,
    /// The store again, where it can fence SeaORM transactions (see `LeaderTerm::fence`).
    pub fence: Option<crate::SeaOrmLeaseStore>,
}

struct Active {
    term: LeaderTerm,
    next_renew: Instant,
    /// The last grant of this term the store answered: the write a release on shutdown ends.
    granted: Lease,
}

enum Step<T> {
    Done(T),
    Shutdown,
    Abort,
}

impl Runner {
    pub(crate) async fn run(self) {
        let span = tracing::info_span!(
            "elector",
            resource = %self.config.resource,
            candidate = %self.config.candidate,
        );
        self.run_inner().instrument(span).await
    }

    async fn run_inner(self) {
        let mut active: Option<Active> = None;
        let mut next_attempt = Instant::now();
        let mut failures: u32 = 0;
        let mut releases = self.store.release_events();
        let (stopped_by, failure) = loop {
            let step = match active.as_mut() {
                None => {
                    self.follower_step(&mut next_attempt, &mut failures, &mut active, &mut releases)
                        .await
                }
                Some(a) => self.leader_step(a, &mut failures).await,
            };
            match step {
                Step::Done(LeaderNext::Stay) => {}
                Step::Done(LeaderNext::Lost(reason, leader)) => {
                    if let Some(a) = active.take() {
                        self.end_term(&a.term, reason, leader);
                    }
                    next_attempt = Instant::now();
                }
                Step::Done(LeaderNext::Replace(lease, sent)) => {
                    if let Some(a) = active.take() {
                        self.end_term(&a.term, LossReason::Superseded, None);
                    }
                    active = self.begin_term(&lease, sent);
                    if active.is_none() {
                        next_attempt = Instant::now();
                    }
                }
                Step::Done(LeaderNext::Failed(err)) => break (LossReason::Failed, Some(err)),
                Step::Shutdown => break (LossReason::Shutdown, None),
                Step::Abort => break (LossReason::Aborted, None),
            }
        };
        if let Some(mut a) = active.take() {
            self.end_term(&a.term, stopped_by, None);
            if stopped_by == LossReason::Shutdown {
                // The work was told (`lost`); the lease stays ours while it winds down.
                let holds_lease = self.drain(&mut a, &mut failures).await;
                if holds_lease && self.config.release_on_shutdown {
                    self.release(&a.granted).await;
                }
            } else {
                a.term.cut_off();
            }
        } else {
            self.state
                .send_replace(Leadership::Follower { leader: None });
        }
        match failure {
            Some(err) => {
                error!(
                    error = %err,
                    "elector stopped: the store refused its configuration"
                );
                self.probe.failed();
                self.state.send_replace(Leadership::Failed(Arc::new(err)));
            }
            None => info!(reason = %stopped_by, "elector stopped"),
        }
    }

    /// One follower attempt: wait for the next attempt time, then try to acquire.
    async fn follower_step(
        &self,
        next_attempt: &mut Instant,
        failures: &mut u32,
        active: &mut Option<Active>,
        releases: &mut Option<ReleaseEvents>,
    ) -> Step<LeaderNext> {
        match self
            .stoppable(self.wait_turn(*next_attempt, releases))
            .await
        {
            Step::Done(()) => {}
            Step::Shutdown => return Step::Shutdown,
            Step::Abort => return Step::Abort,
        }
        let sent = Instant::now();
        let result = match self.ask_store(later(sent, self.config.lease)).await {
            Step::Done(result) => result,
            Step::Shutdown => return Step::Shutdown,
            Step::Abort => return Step::Abort,
        };
        self.probe.store_call(false, sent, &result);
        match result {
            Ok(Ok(LeaseOutcome::Acquired(lease) | LeaseOutcome::Renewed(lease))) => {
                *failures = 0;
                *active = self.begin_term(&lease, sent);
                if active.is_none() {
                    *next_attempt = Instant::now();
                }
            }
            Ok(Ok(LeaseOutcome::Denied(denial))) => {
                *failures = 0;
                self.follow(&denial);
                *next_attempt = later(Instant::now(), self.follower_wait(&denial));
            }
            Ok(Err(err)) if err.is_permanent() => return Step::Done(LeaderNext::Failed(err)),
            Ok(Err(err)) => {
                *failures += 1;
                let wait = backoff(*failures, self.config.retry_interval);
                log_store_error(&err, *failures, wait, "store error while contending");
                self.note_follower_without_answer();
                *next_attempt = later(Instant::now(), wait);
            }
            Err(_) => {
                *failures += 1;
                warn!(after = ?self.config.lease, "store did not answer while contending");
                self.note_follower_without_answer();
                *next_attempt = later(
                    Instant::now(),
                    backoff(*failures, self.config.retry_interval),
                );
            }
        }
        Step::Done(LeaderNext::Stay)
    }

    /// One leader round: wait for the renew time (or the deadline), then renew, bounded by
    /// the deadline.
    async fn leader_step(&self, active: &mut Active, failures: &mut u32) -> Step<LeaderNext> {
        let deadline = active.term.deadline();
        match self
            .stoppable(sleep_until(active.next_renew.min(deadline)))
            .await
        {
            Step::Done(()) => {}
            Step::Shutdown => return Step::Shutdown,
            Step::Abort => return Step::Abort,
        }
        if Instant::now() >= deadline {
            return Step::Done(LeaderNext::Lost(LossReason::Deadline, None));
        }
        let sent = Instant::now();
        let result = match self.ask_store(deadline).await {
            Step::Done(result) => result,
            Step::Shutdown => return Step::Shutdown,
            Step::Abort => return Step::Abort,
        };
        self.probe.store_call(true, sent, &result);
        match result {
            Ok(Ok(LeaseOutcome::Renewed(lease))) if lease.token == active.term.token() => {
                *failures = 0;
                active.term.extend(self.local_deadline(&lease, sent));
                active.next_renew = later(sent, self.config.renew_interval);
                debug!(token = %lease.token, remaining = ?lease.remaining, "renewed");
                active.granted = lease;
                Step::Done(LeaderNext::Stay)
            }
            Ok(Ok(LeaseOutcome::Acquired(lease) | LeaseOutcome::Renewed(lease))) => {
                // The store started a new term: ours lapsed there. End it before the new one.
                Step::Done(LeaderNext::Replace(lease, sent))
            }
            Ok(Ok(LeaseOutcome::Denied(denial))) => {
                Step::Done(LeaderNext::Lost(LossReason::Denied, denial.holder))
            }
            Ok(Err(err)) if err.is_permanent() => Step::Done(LeaderNext::Failed(err)),
            Ok(Err(err)) => {
                *failures += 1;
                let wait = backoff(*failures, self.config.renew_interval);
                log_store_error(&err, *failures, wait, "store error while renewing");
                active.next_renew = later(Instant::now(), wait);
                Step::Done(LeaderNext::Stay)
            }
            Err(_) => Step::Done(LeaderNext::Lost(LossReason::Deadline, None)),
        }
    }

    /// One acquire-or-renew, given up at `until` (a leader's deadline, a follower's lease).
    async fn ask_store(
        &self,
        until: Instant,
    ) -> Step<Result<Result<LeaseOutcome, crate::StoreError>, Elapsed>> {
        let call = self.store.acquire_or_renew(
            &self.config.resource,
            &self.config.candidate,
            self.config.lease,
        );
        self.abortable(timeout_at(until, call)).await
    }

    /// Waits until `next_attempt`, or less if the store says our resource was just released.
    async fn wait_turn(&self, next_attempt: Instant, releases: &mut Option<ReleaseEvents>) {
        let Some(events) = releases.as_mut() else {
            return sleep_until(next_attempt).await;
        };
        let released = async {
            loop {
                match events.recv().await {
                    Ok(resource) if *resource == *self.config.resource => return,
                    Ok(_) => {}
                    // Missed some: ours may be among them, so try now.
                    Err(broadcast::error::RecvError::Lagged(_)) => return,
                    // No more notifications: polling only from here on.
                    Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
                }
            }
        };
        tokio::select! {
            _ = sleep_until(next_attempt) => {}
            _ = released => debug!("woken by a release notification"),
        }
    }

    /// Runs a store call to its end unless aborted. A shutdown does not cut a call short: a
    /// statement cancelled on our side may still commit on the server, after the release that
    /// follows, and leave a live lease nobody renews. The calls are bounded by their timeouts.
    async fn abortable<F: std::future::Future>(&self, fut: F) -> Step<F::Output> {
        tokio::select! {
            biased;
            _ = self.stop.abort.cancelled() => Step::Abort,
            out = fut => Step::Done(out),
        }
    }

    /// Runs `fut` unless a stop is requested first.
    async fn stoppable<F: std::future::Future>(&self, fut: F) -> Step<F::Output> {
        tokio::select! {
            biased;
            _ = self.stop.abort.cancelled() => Step::Abort,
            _ = self.stop.shutdown.cancelled() => Step::Shutdown,
            out = fut => Step::Done(out),
        }
    }

    /// The local deadline of a grant: the send instant plus the lease time the store said was
    /// left, minus the margin. The store measured from a moment after `sent`, so this is
    /// earlier than the store's expiry by at least the margin.
    fn local_deadline(&self, lease: &Lease, sent: Instant) -> Instant {
        let granted = lease.remaining.min(self.config.lease);
        later(sent, granted.saturating_sub(self.config.step_down_margin))
    }

    fn begin_term(&self, lease: &Lease, sent: Instant) -> Option<Active> {
        let deadline = self.local_deadline(lease, sent);
        if deadline <= Instant::now() {
            // Too little of the lease is left to trust; the next attempt renews it in full.
            return None;
        }
        let term = LeaderTerm::new(
            lease.token,
            self.config.resource.clone(),
            self.config.candidate.clone(),
            deadline,
            self.fence.clone(),
        );
        info!(token = %lease.token, "elected");
        self.state.send_replace(Leadership::Leader(term.clone()));
        self.probe.elected();
        Some(Active {
            term,
            next_renew: later(sent, self.config.renew_interval),
            granted: lease.clone(),
        })
    }

    fn end_term(&self, term: &LeaderTerm, reason: LossReason, leader: Option<String>) {
        // Publish the step-down first, then fire `lost`: nobody who reacts to `lost` can still
        // read a leader state from the channel.
        self.state.send_replace(Leadership::Follower { leader });
        term.end(reason);
        if reason != LossReason::Shutdown {
            // The lease no longer covers the term: its work stops now, not after a grace.
            term.cut_off();
        }
        self.probe.lost(reason);
        match reason {
            LossReason::Shutdown => {
                info!(token = %term.token(), reason = %reason, "leadership ended")
            }
            _ => warn!(token = %term.token(), reason = %reason, "leadership lost"),
        }
    }

    fn follow(&self, denial: &Denial) {
        // A store's report can be stale; whoever denied us, it was not us.
        let leader = denial
            .holder
            .clone()
            .filter(|holder| **holder != *self.config.candidate);
        let next = Leadership::Follower { leader };
        self.state.send_if_modified(|state| {
            if *state == next {
                false
            } else {
                *state = next.clone();
                true
            }
        });
    }

    fn note_follower_without_answer(&self) {
        self.state.send_if_modified(|state| {
            if matches!(state, Leadership::Starting) {
                *state = Leadership::Follower { leader: None };
                true
            } else {
                false
            }
        });
    }

    /// Expiry-aware: a lease that ends before the next regular retry is retried right after it
    /// ends, so a crashed leader is replaced one lease after its last renew.
    fn follower_wait(&self, denial: &Denial) -> Duration {
        let regular = jittered(self.config.retry_interval, self.config.jitter);
        let at_expiry = denial.remaining.saturating_add(AFTER_EXPIRY);
        if !denial.remaining.is_zero() && at_expiry < regular {
            at_expiry
        } else {
            regular
        }
    }

    /// Shutdown of a leader: keeps renewing the lease while the term's work winds down, for
    /// at most the grace period, then cuts the work off. Returns whether the lease is still
    /// ours and the work has stopped, i.e. whether releasing it is safe.
    ///
    /// The work never runs past the lease: if a renew is refused or the local deadline comes,
    /// the work is cut off at once; if the work does not stop when cut off, the lease is left
    /// to lapse on its own rather than released under it.
    async fn drain(&self, active: &mut Active, failures: &mut u32) -> bool {
        let grace_end = later(Instant::now(), self.config.grace_period);
        loop {
            let deadline = active.term.deadline();
            if Instant::now() >= deadline {
                active.term.cut_off();
                warn!("the lease ran out while leader work was winding down; work dropped");
                return false;
            }
            tokio::select! {
                biased;
                _ = self.stop.abort.cancelled() => {
                    active.term.cut_off();
                    return false;
                }
                _ = self.work_gate.write() => return true,
                _ = sleep_until(grace_end) => {
                    active.term.cut_off();
                    warn!(grace = ?self.config.grace_period, "leader work did not finish within the grace period; dropped");
                    // A dropped future lets go at once; give it a moment to unwind.
                    if timeout(UNWIND, self.work_gate.write()).await.is_ok() {
                        return true;
                    }
                    warn!("leader work did not stop when dropped; not releasing, the lease will lapse");
                    return false;
                }
                _ = sleep_until(active.next_renew.min(deadline)) => {}
            }
            if Instant::now() >= deadline {
                continue;
            }
            let sent = Instant::now();
            let result = match self.ask_store(deadline).await {
                Step::Done(result) => result,
                _ => {
                    active.term.cut_off();
                    return false;
                }
            };
            self.probe.store_call(true, sent, &result);
            match result {
                Ok(Ok(LeaseOutcome::Renewed(lease))) if lease.token == active.term.token() => {
                    *failures = 0;
                    active.term.extend(self.local_deadline(&lease, sent));
                    active.next_renew = later(sent, self.config.renew_interval);
                    debug!(token = %lease.token, "renewed while leader work winds down");
                    active.granted = lease;
                }
                Ok(Err(err)) => {
                    *failures += 1;
                    let wait = backoff(*failures, self.config.renew_interval);
                    log_store_error(&err, *failures, wait, "store error while renewing");
                    active.next_renew = later(Instant::now(), wait);
                }
                // Denied, a new term, or no answer before the deadline: the lease is gone.
                _ => {
                    active.term.cut_off();
                    warn!("the lease was lost while leader work was winding down; work dropped");
                    return false;
                }
            }
        }
    }

    /// Releases the write `granted` came from, and nothing later: a release that is delayed
    /// can never end a renew made since, even by a new elector that reuses our candidate id.
    async fn release(&self, granted: &Lease) {
        let call = self.store.release_lease(granted);
        match timeout(self.config.lease, call).await {
            Ok(Ok(true)) => info!("released the lease"),
            // The row no longer holds our last known write: renewed since (by a new elector
            // with our id, or by a renew whose answer we never got), taken, or expired.
            Ok(Ok(false)) => info!(
                "not released: the store no longer holds the last write this elector saw; \
                 the lease lapses on its own"
            ),
            Ok(Err(err)) => warn!(error = %err, "release failed; the lease will lapse on its own"),
            Err(_) => warn!("release timed out; the lease will lapse on its own"),
        }
    }
}

enum LeaderNext {
    Stay,
    Lost(LossReason, Option<String>),
    Replace(Lease, Instant),
    /// An error of the program's configuration (`StoreError::is_permanent`): stop.
    Failed(crate::StoreError),
}

/// A store error: at warn when retrying may help (a database error, a conflict), at error when
/// it is likely a setup problem (a missing table, an unreadable row), which is retried anyway
/// in case it clears up (a migration still running, a restore).
fn log_store_error(err: &crate::StoreError, failures: u32, retry_in: Duration, what: &str) {
    if err.is_retryable() {
        warn!(error = %err, failures, ?retry_in, "{what}");
    } else {
        error!(error = %err, failures, ?retry_in, "{what}");
    }
}

fn backoff(failures: u32, cap: Duration) -> Duration {
    let exp = failures.saturating_sub(1).min(16);
    FIRST_BACKOFF.saturating_mul(1 << exp).min(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_cap() {
        let cap = Duration::from_secs(1);
        assert_eq!(backoff(1, cap), Duration::from_millis(50));
        assert_eq!(backoff(2, cap), Duration::from_millis(100));
        assert_eq!(backoff(5, cap), Duration::from_millis(800));
        assert_eq!(backoff(6, cap), cap);
        assert_eq!(backoff(u32::MAX, cap), cap);
    }
}
