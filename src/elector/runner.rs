//! The elector's loop: contend as a follower, renew as a leader, step down in time.
//!
//! Each turn waits, asks the store, and hands the answer to [`decide`], which says what comes
//! next; the loop carries that out (terms, the watch channel, logs, metrics).

use crate::mutex::lock;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, watch, RwLock};
use tokio::time::{timeout, Instant};

use crate::clock::{sleep_until, timeout_at};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn, Instrument};

use super::config::Config;
use super::decision::{
    backoff, decide, later, local_deadline, Answer, Decision, Grant, Next, NoAnswer, Role, Setback,
};
use super::handover::Handover;
use super::health::Probe;
use crate::hold::renewer::Reply;
use crate::hold::{LeaderTerm, Leadership, LossReason};
use crate::random::jittered;
use crate::store::ReleaseEvents;
use crate::{
    fencing::FencingToken, lease::Denial, lease::Lease, lease::LeaseOutcome, store::LeaseStore,
};

mod release;

mod watcher;

mod step_down;

mod follower;

mod together;

mod term;

mod candidacy;

/// How long dropped leader work gets to let go of the work gate before shutdown gives up on it.
const UNWIND: Duration = Duration::from_millis(100);

/// How the loop was asked to stop, or to step down.
#[derive(Debug, Clone)]
pub(crate) struct Stop {
    /// Graceful: end the work, release, stop.
    pub shutdown: CancellationToken,
    /// Abrupt: as if the process died (no waiting for work, no release).
    pub abort: CancellationToken,
    /// A step-down asked for (see [`StepDown`]).
    pub step_down: Arc<StepDownRequests>,
}

/// `ElectorHandle::step_down` calls waiting for the loop: the latest one counts.
#[derive(Debug, Default)]
pub(crate) struct StepDownRequests {
    /// Whether the loop has ended (no request is taken up any more), and the request waiting.
    pending: std::sync::Mutex<(bool, Option<StepDown>)>,
    asked: tokio::sync::Notify,
}

/// One step-down: end the term as a shutdown does, release (or offer the lease to `to`), stay
/// out of the contest for `stay_out`, then contend again; `done` hears how it ended.
#[derive(Debug)]
pub(crate) struct StepDown {
    pub stay_out: Duration,
    /// A handover to this successor: the lease is offered to it for `stay_out`.
    pub to: Option<Arc<str>>,
    pub done: tokio::sync::oneshot::Sender<Handover>,
}

/// What came of an offer.
enum Offered {
    Yes,
    /// The store no longer holds the term.
    TermGone,
    /// The store failed or cannot offer (the term may still be ours).
    Failed,
}

/// How a leader's step-down left its lease.
enum LeftLease {
    Released,
    /// Offered to the successor named.
    Offered,
    /// Neither: it lapses on its own.
    Kept,
}

impl StepDownRequests {
    pub(crate) fn ask(&self, request: StepDown) {
        let mut pending = lock(&self.pending);
        if pending.0 {
            // The loop has ended: dropped here, the caller hears `false` at once.
            return;
        }
        // An earlier request not yet taken up is dropped: its caller hears `false` (it did
        // not end a term itself).
        pending.1 = Some(request);
        drop(pending);
        self.asked.notify_one();
    }

    /// [`ask`](Self::ask), but only if no request is waiting (a caller's own step-down wins
    /// over an automatic one); whether it was asked.
    pub(crate) fn ask_unless_pending(&self, request: StepDown) -> bool {
        let mut pending = lock(&self.pending);
        if pending.0 || pending.1.is_some() {
            return false;
        }
        pending.1 = Some(request);
        drop(pending);
        self.asked.notify_one();
        true
    }

    fn take(&self) -> Option<StepDown> {
        lock(&self.pending).1.take()
    }

    /// The loop has ended: a waiting request and every later one hear `false`.
    fn close(&self) {
        let mut pending = lock(&self.pending);
        pending.0 = true;
        pending.1 = None;
    }
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
    pub fence: Option<crate::backend::SeaOrmLeaseStore>,
    /// The store's renewer, when the elector was built on a `SeaOrmLeaseStore` itself (see
    /// `hold::renewer`): with `renew_together`, its renews go out with the store's other holds.
    pub renewer: Option<crate::hold::renewer::Renewer>,
    /// A ranked candidate's candidacy (see `preference`).
    pub ranking: Option<Arc<super::preference::Ranking>>,
}

impl Drop for Runner {
    fn drop(&mut self) {
        // However the loop ended (a panic included), no step-down waits for it.
        self.stop.step_down.close();
    }
}

struct Active {
    term: LeaderTerm,
    next_renew: Instant,
    /// The last grant of this term the store answered: the write a release on shutdown ends.
    granted: Lease,
}

/// What a renew in a batch came to (see `Runner::renew_together`).
enum Together {
    /// The batch answered: this is the round's decision.
    Decided(Decision),
    /// The elector asks on its own, at once: the batch left without it, was held up, or
    /// failed for good; or (`lost`) it committed without renewing this term's lease, which
    /// then ends unless the elector's own answer renews it or begins a new term.
    AskNow { lost: bool },
    /// No batch: the elector renews on its own at its time.
    Alone,
}

use crate::hold::renewer::DEPARTURE_SLACK;

/// Why a turn of the loop ended early: a stop was requested (see [`Stop`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stopped {
    /// Graceful: end the work, release, stop.
    Shutdown,
    /// Abrupt: no waiting for work, no release.
    Abort,
    /// Not a stop: end the term gracefully, release, and stay out for a while.
    StepDown,
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
        let mut next_attempt = crate::clock::now();
        let mut failures: u32 = 0;
        // The token of the last term begun: every later term's must exceed it.
        let mut led: Option<FencingToken> = None;
        // Whether the last step was a release that found its write gone (see `release_unled`).
        let mut gone_before = false;
        let mut releases = self.store.release_events();
        // Until when a step-down keeps this candidate out of the contest.
        let mut out_until: Option<Instant> = None;
        let (stopped_by, failure) = loop {
            let step = match active.as_ref() {
                None => {
                    let staying_out = out_until.is_some_and(|until| crate::clock::now() < until);
                    // Staying out: no release notification (ours, say) brings the attempt
                    // forward.
                    let mut none = None;
                    let events = if staying_out {
                        &mut none
                    } else {
                        &mut releases
                    };
                    if self.config.campaign {
                        self.follower_step(next_attempt, failures, led, events)
                            .await
                    } else {
                        self.watch_step(next_attempt, failures, events).await
                    }
                }
                Some(a) => self.leader_step(a, failures).await,
            };
            let decision = match step {
                Ok(decision) => decision,
                Err(Stopped::Shutdown) => break (LossReason::Shutdown, None),
                Err(Stopped::Abort) => break (LossReason::Aborted, None),
                Err(Stopped::StepDown) => {
                    let Some(request) = self.stop.step_down.take() else {
                        continue;
                    };
                    if active.is_none() && (request.to.is_some() || !self.config.campaign) {
                        // A handover asked of a follower: nothing to hand over, no stay-out. A
                        // watcher never contends, so it has nothing to stay out of either (and
                        // staying out would stop its reads).
                        let _ = request.done.send(Handover::NotLeader);
                        continue;
                    }
                    let mut until = later(crate::clock::now(), request.stay_out);
                    let answer = match active.take() {
                        Some(mut a) => {
                            let to = request.to.as_deref();
                            let left = match self
                                .hand_over(&mut a, &mut failures, to, request.stay_out)
                                .await
                            {
                                Ok(left) => left,
                                Err(_) => {
                                    let _ = request.done.send(Handover::Ended);
                                    break (LossReason::Aborted, None);
                                }
                            };
                            until = later(crate::clock::now(), request.stay_out);
                            match left {
                                LeftLease::Released => Some(Handover::Ended),
                                LeftLease::Offered => None,
                                LeftLease::Kept => {
                                    // Left to lapse (its work may still run): coming back
                                    // before then would find it ours and release it under
                                    // that work.
                                    until = until
                                        .max(later(crate::clock::now(), self.config.timing.lease));
                                    Some(Handover::Ended)
                                }
                            }
                        }
                        None => Some(Handover::NotLeader),
                    };
                    info!(stay_out = ?request.stay_out, successor = ?request.to, ?answer, "stepped down");
                    if let Some(ranking) = &self.ranking {
                        // No candidate while staying out (a leader's step-down left its
                        // candidacy before it offered or released; a follower's leaves now),
                        // and a new candidacy after.
                        ranking.rest_until(until);
                        if answer == Some(Handover::NotLeader) {
                            self.leave_candidacy(None).await;
                        }
                    }
                    self.probe.staying_out(until);
                    out_until = Some(until);
                    next_attempt = until;
                    match (answer, request.to) {
                        (Some(answer), _) => {
                            let _ = request.done.send(answer);
                        }
                        // Offered: the answer comes once the successor took it, or not.
                        (None, Some(to)) => {
                            tokio::spawn(
                                super::handover::await_taker(
                                    Arc::clone(&self.store),
                                    self.config.resource.clone(),
                                    to,
                                    until,
                                    request.done,
                                )
                                .in_current_span(),
                            );
                        }
                        (None, None) => {
                            let _ = request.done.send(Handover::Ended);
                        }
                    }
                    continue;
                }
            };
            failures = decision.failures;
            let gone = std::mem::take(&mut gone_before);
            match decision.next {
                Next::Elect(grant) => {
                    if let Some(a) = active.take() {
                        self.end_term(&a.term, LossReason::Superseded, None, None);
                    }
                    if let Some(ranking) = &self.ranking {
                        // A new leader looks at the candidates at once.
                        ranking.beat_now();
                    }
                    led = Some(grant.lease.token);
                    active = Some(self.begin_term(grant));
                }
                Next::Extend(grant) => {
                    if let Some(a) = active.as_mut() {
                        a.term.extend(grant.deadline);
                        a.next_renew = grant.next_renew;
                        debug!(token = %grant.lease.token, remaining = ?grant.lease.remaining, "renewed");
                        a.granted = grant.lease;
                    }
                }
                Next::Follow { denial, at } => {
                    self.follow(&denial);
                    next_attempt = at;
                }
                Next::Lose(reason, leader, payload) => {
                    if let Some(a) = active.take() {
                        self.end_term(&a.term, reason, leader, payload);
                        if let Some(ranking) = &self.ranking {
                            // A term lost (not handed over): the candidacy begins afresh, so
                            // a successor that takes the lease but cannot keep it is not
                            // handed it again before `prefer_after`.
                            ranking.rejoin();
                        }
                    }
                    next_attempt = crate::clock::now();
                }
                Next::Retry { at, setback } => match active.as_mut() {
                    Some(a) => {
                        if let Setback::Error { error, wait } = &setback {
                            log_store_error(error, failures, *wait, "store error while renewing");
                        }
                        a.next_renew = at;
                    }
                    None => {
                        self.follower_setback(&setback, failures);
                        next_attempt = at;
                    }
                },
                Next::Release { lease, lapsed } => {
                    match active.take() {
                        Some(a) => self.end_term(&a.term, LossReason::Superseded, None, None),
                        None => self.note_follower_without_answer(),
                    }
                    (next_attempt, gone_before) =
                        match self.release_unled(&lease, lapsed, gone).await {
                            Ok(next) => next,
                            Err(_) => break (LossReason::Aborted, None),
                        };
                }
                Next::Fail(err) => break (LossReason::Failed, Some(err)),
            }
        };
        // No step-down is taken up from here on (a shutdown's drain does not look for one).
        self.stop.step_down.close();
        if let Some(mut a) = active.take() {
            self.end_term(&a.term, stopped_by, None, None);
            if stopped_by == LossReason::Shutdown {
                // The work was told (`lost`); the lease stays ours while it winds down. The
                // candidacy is left meanwhile, before the release: the next leader must not see
                // this candidate, gone, as one to hand over to.
                let bound = a.term.local_deadline();
                let (holds_lease, ()) = tokio::join!(
                    self.drain(&mut a, &mut failures),
                    self.leave_candidacy(Some(bound))
                );
                if holds_lease && self.config.release_on_shutdown {
                    self.release(&a.granted).await;
                }
            } else {
                a.term.cut_off();
            }
        } else {
            if stopped_by == LossReason::Shutdown {
                self.leave_candidacy(None).await;
            }
            self.state.send_replace(Leadership::Follower {
                leader: None,
                payload: None,
            });
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

    /// One follower attempt: waits for the next attempt time, then tries to acquire.
    async fn follower_step(
        &self,
        next_attempt: Instant,
        failures: u32,
        led: Option<FencingToken>,
        releases: &mut Option<ReleaseEvents>,
    ) -> Result<Decision, Stopped> {
        match &self.ranking {
            None => {
                self.stoppable(self.wait_turn(next_attempt, releases))
                    .await?;
            }
            // The candidacy beats every renew interval while the follower waits for its turn.
            Some(ranking) => loop {
                // A heartbeat takes at most half a renew interval.
                let until = later(crate::clock::now(), self.config.timing.renew_interval / 2);
                self.candidacy_round(ranking, None, until).await?;
                let wake = next_attempt.min(ranking.next_beat());
                let woken = self.stoppable(self.wait_turn(wake, releases)).await?;
                if woken || crate::clock::now() >= next_attempt {
                    break;
                }
            },
        }
        let role = Role::Follower {
            retry: jittered(self.config.retry_interval, self.config.jitter),
            led,
        };
        let sent = crate::clock::now();
        let decision = self
            .ask_and_decide(role, sent, later(sent, self.config.timing.lease), failures)
            .await?;
        // A lease offered to this candidate (a planned handover): take it.
        if let Next::Follow { denial, .. } = &decision.next {
            if denial.offered_to() == Some(&*self.config.candidate) {
                if let Some(token) = denial.token {
                    return self.take_offer(token, led, failures, decision).await;
                }
            }
        }
        Ok(decision)
    }

    /// One leader round: waits for the renew time (or the deadline), then renews, bounded by
    /// the deadline.
    async fn leader_step(&self, active: &Active, failures: u32) -> Result<Decision, Stopped> {
        let deadline = active.term.local_deadline();
        let due = active.next_renew.min(deadline);
        if let Some(ranking) = &self.ranking {
            // In the slack before the renew, never past it.
            if self.candidacy_round(ranking, Some(deadline), due).await? {
                return Err(Stopped::StepDown);
            }
        }
        let role = Role::Leader {
            token: active.term.token(),
        };
        let lost = match self.renew_together(active, due, deadline, failures).await? {
            Together::Decided(decision) => return Ok(decision),
            Together::AskNow { lost } => {
                // Nothing is in flight: a stop asked meanwhile is taken up before asking (a
                // term the batch found lost ends either way).
                let stopped = if self.stop.abort.is_cancelled() {
                    Some(Stopped::Abort)
                } else if self.stop.shutdown.is_cancelled() {
                    Some(Stopped::Shutdown)
                // Taking a step-down's notice only where the term goes on: after a loss the
                // follower's turn takes it up.
                } else if !lost && self.step_down_asked().await {
                    Some(Stopped::StepDown)
                } else {
                    None
                };
                if let Some(stopped) = stopped {
                    if lost {
                        let next = Next::Lose(LossReason::Superseded, None, None);
                        return Ok(Decision { next, failures });
                    }
                    return Err(stopped);
                }
                lost
            }
            Together::Alone => {
                self.stoppable(sleep_until(due)).await?;
                false
            }
        };
        if crate::clock::now() >= deadline {
            let next = Next::Lose(LossReason::Deadline, None, None);
            return Ok(Decision { next, failures });
        }
        let mut decision = self
            .ask_and_decide(role, crate::clock::now(), deadline, failures)
            .await?;
        // The batch said the term is gone: an error now does not keep it going.
        if lost && matches!(decision.next, Next::Retry { .. }) {
            decision.next = Next::Lose(LossReason::Superseded, None, None);
        }
        Ok(decision)
    }

    /// Whether a step-down was asked and not yet taken up (its notice is taken now).
    async fn step_down_asked(&self) -> bool {
        let mut asked = std::pin::pin!(self.stop.step_down.asked.notified());
        std::future::poll_fn(|cx| {
            std::task::Poll::Ready(std::future::Future::poll(asked.as_mut(), cx).is_ready())
        })
        .await
    }

    /// Asks the store (the call sent at `sent`, given up at `until`), reports the round trip,
    /// and decides what the answer means for an elector in `role`.
    async fn ask_and_decide(
        &self,
        role: Role,
        sent: Instant,
        until: Instant,
        failures: u32,
    ) -> Result<Decision, Stopped> {
        let answer = self.ask_store(until).await?;
        let leading = matches!(role, Role::Leader { .. });
        self.probe.store_call(leading, sent, &answer);
        let now = crate::clock::now();
        Ok(decide(answer, sent, now, &self.config, role, failures))
    }

    /// One acquire-or-renew, given up at `until` (a leader's deadline, a follower's lease).
    async fn ask_store(&self, until: Instant) -> Result<Answer, Stopped> {
        let call = self.store.acquire_or_renew_with(
            &self.config.resource,
            &self.config.candidate,
            self.config.timing.lease,
            self.config.payload.as_deref(),
        );
        let answer = self.abortable(timeout_at(until, call)).await?;
        Ok(answer.map_err(|_| NoAnswer))
    }

    /// Waits until `next_attempt`, or less if the store says our resource was just released
    /// (`true`).
    async fn wait_turn(&self, next_attempt: Instant, releases: &mut Option<ReleaseEvents>) -> bool {
        let Some(events) = releases.as_mut() else {
            sleep_until(next_attempt).await;
            return false;
        };
        // Where the store's wake-ups need to know what is waited for (MySQL's named locks).
        let _waiting = self.fence.as_ref().and_then(|store| {
            store.waiting(std::slice::from_ref(&self.config.resource), next_attempt)
        });
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
            _ = sleep_until(next_attempt) => false,
            _ = released => {
                debug!("woken by a release notification");
                true
            }
        }
    }

    /// Runs a store call to its end unless aborted. A shutdown does not cut a call short: a
    /// statement cancelled on our side may still commit on the server, after the release that
    /// follows, and leave a live lease nobody renews. The calls are bounded by their timeouts.
    async fn abortable<F: std::future::Future>(&self, fut: F) -> Result<F::Output, Stopped> {
        tokio::select! {
            biased;
            _ = self.stop.abort.cancelled() => Err(Stopped::Abort),
            out = fut => Ok(out),
        }
    }

    /// Runs `fut` unless a stop (or a step-down) is requested first.
    async fn stoppable<F: std::future::Future>(&self, fut: F) -> Result<F::Output, Stopped> {
        tokio::select! {
            biased;
            _ = self.stop.abort.cancelled() => Err(Stopped::Abort),
            _ = self.stop.shutdown.cancelled() => Err(Stopped::Shutdown),
            _ = self.stop.step_down.asked.notified() => Err(Stopped::StepDown),
            out = fut => Ok(out),
        }
    }
}

/// A store error: at warn when retrying may help (a database error, a conflict), at error when
/// it is likely a setup problem (a missing table, an unreadable row), which is retried anyway
/// in case it clears up (a migration still running, a restore).
fn log_store_error(err: &crate::error::StoreError, failures: u32, retry_in: Duration, what: &str) {
    if err.is_retryable() {
        warn!(error = %err, failures, ?retry_in, "{what}");
    } else {
        error!(error = %err, failures, ?retry_in, "{what}");
    }
}
