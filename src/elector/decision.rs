//! What the elector's loop does after a store call: one pure function from the store's answer,
//! the call's timing and where the loop stood, to the next step. No clock, no runtime, no
//! randomness: every decision of the loop is testable with plain `#[test]`s.

use std::time::Duration;

use tokio::time::Instant;

use super::config::Config;
use crate::hold::LossReason;
use crate::{
    error::StoreError, fencing::FencingToken, lease::Denial, lease::Lease, lease::LeaseOutcome,
};

/// A follower told that the lease ends in `remaining` tries again this long after it.
const AFTER_EXPIRY: Duration = Duration::from_millis(15);
/// First back-off after a store error; doubles per consecutive error.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);

/// A store call given up before it answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct NoAnswer;

/// What one acquire-or-renew came back with.
pub(super) type Answer = Result<Result<LeaseOutcome, StoreError>, NoAnswer>;

/// Where the loop stood when it asked the store.
#[derive(Debug, Clone, Copy)]
pub(super) enum Role {
    /// Contending. `retry` is this attempt's regular retry interval with its jitter applied,
    /// drawn by the caller so that the decision stays deterministic; `led` is the token of the
    /// last term this elector began, which the next term's must exceed.
    Follower {
        retry: Duration,
        led: Option<FencingToken>,
    },
    /// Renewing the term of `token` (the last term this elector began).
    Leader { token: FencingToken },
}

impl Role {
    /// The token of the last term this elector began, if any.
    fn led(self) -> Option<FencingToken> {
        match self {
            Role::Follower { led, .. } => led,
            Role::Leader { token } => Some(token),
        }
    }

    /// The failure count after an answer that grants a lease: a follower's starts over, a
    /// leader's goes on into the new term (or into contending again).
    fn carried(self, failures: u32) -> u32 {
        match self {
            Role::Follower { .. } => 0,
            Role::Leader { .. } => failures,
        }
    }
}

/// The next step, with the count of store calls failed in a row that goes with it.
#[derive(Debug)]
pub(super) struct Decision {
    pub next: Next,
    pub failures: u32,
}

/// What the loop does next.
#[derive(Debug)]
pub(super) enum Next {
    /// Begin a term on this grant: a new term in the store (`Acquired`) whose token exceeds
    /// every term this elector began before. A term still running was superseded by it (ours
    /// had lapsed there) and ends first.
    Elect(Grant),
    /// The current term goes on, renewed by this grant.
    Extend(Grant),
    /// Another candidate holds the lease (or the store could not say who): follow it, and try
    /// again at `at`.
    Follow { denial: Denial, at: Instant },
    /// The current term is lost (to the leader named, where the store said): contend again at
    /// once.
    /// Why, and the leader that denied the renew (its id and payload) where the store said.
    Lose(LossReason, Option<String>, Option<String>),
    /// Try again at `at` (a follower's next attempt, a leader's next renew) after `setback`.
    Retry { at: Instant, setback: Setback },
    /// A live lease of this candidate that no term may begin on: a `Renewed` that is not the
    /// current term's renew (the write of an earlier term of this elector, say a renew held up
    /// past its deadline, or of a predecessor with the same id), an `Acquired` whose token does
    /// not exceed the last term's, or a grant with too little left to trust. Leading it would
    /// start a term with an old token, which fencing cannot tell from the earlier term's. A
    /// term still running ends first (superseded); then exactly this write is released and the
    /// elector contends again at once for the next token, or, if the release fails, at
    /// `lapsed`, when the lease has run out on its own.
    Release { lease: Lease, lapsed: Instant },
    /// The store refused the elector's configuration (`StoreError::is_permanent`): stop.
    Fail(StoreError),
}

/// A lease granted or renewed, with the local instants that follow from it.
#[derive(Debug, PartialEq)]
pub(super) struct Grant {
    pub lease: Lease,
    /// The term's local deadline (see [`local_deadline`]).
    pub deadline: Instant,
    /// When to renew.
    pub next_renew: Instant,
}

/// Why a store call led to nothing but a later try.
#[derive(Debug)]
pub(super) enum Setback {
    /// The store failed (not permanently); `wait` is the back-off before the next try.
    Error { error: StoreError, wait: Duration },
    /// The store did not answer in time.
    NoAnswer,
}

/// The loop's decision on `answer`, the store's reply to a call sent at `sent`, seen at `now`,
/// by an elector in `role` after `failures` failed calls in a row.
pub(super) fn decide(
    answer: Answer,
    sent: Instant,
    now: Instant,
    config: &Config,
    role: Role,
    failures: u32,
) -> Decision {
    let (next, failures) = match (role, answer) {
        (Role::Leader { token }, Ok(Ok(LeaseOutcome::Renewed(lease)))) if lease.token == token => {
            (Next::Extend(grant(lease, sent, config)), 0)
        }
        // Only a new term in the store has a new token; and it must be new to this elector.
        (role, Ok(Ok(LeaseOutcome::Acquired(lease))))
            if role.led().is_none_or(|led| lease.token > led) =>
        {
            let grant = grant(lease, sent, config);
            let next = if grant.deadline <= now {
                // Too little left to trust: not a term.
                release(grant.lease, now)
            } else {
                Next::Elect(grant)
            };
            (next, role.carried(failures))
        }
        (role, Ok(Ok(LeaseOutcome::Acquired(lease) | LeaseOutcome::Renewed(lease)))) => {
            (release(lease, now), role.carried(failures))
        }
        (Role::Follower { retry, .. }, Ok(Ok(LeaseOutcome::Denied(denial)))) => {
            let at = later(now, follower_wait(&denial, retry));
            (Next::Follow { denial, at }, 0)
        }
        (Role::Leader { .. }, Ok(Ok(LeaseOutcome::Denied(denial)))) => (
            Next::Lose(LossReason::Denied, denial.holder, denial.payload),
            failures,
        ),
        (_, Ok(Err(error))) if error.is_permanent() => (Next::Fail(error), failures),
        (role, Ok(Err(error))) => {
            let failures = failures.saturating_add(1);
            let cap = match role {
                Role::Follower { .. } => config.retry_interval,
                Role::Leader { .. } => config.timing.renew_interval,
            };
            let wait = backoff(failures, cap);
            let setback = Setback::Error { error, wait };
            let at = later(now, wait);
            (Next::Retry { at, setback }, failures)
        }
        (Role::Follower { .. }, Err(NoAnswer)) => {
            let failures = failures.saturating_add(1);
            let at = later(now, backoff(failures, config.retry_interval));
            let setback = Setback::NoAnswer;
            (Next::Retry { at, setback }, failures)
        }
        // The call was bounded by the term's deadline: no answer means it has passed.
        (Role::Leader { .. }, Err(NoAnswer)) => {
            (Next::Lose(LossReason::Deadline, None, None), failures)
        }
    };
    Decision { next, failures }
}

/// Release `lease`, or wait until it has lapsed: it ends at most `remaining` after the
/// statement began, which was before `now`.
fn release(lease: Lease, now: Instant) -> Next {
    let lapsed = later(now, lease.remaining.saturating_add(AFTER_EXPIRY));
    Next::Release { lease, lapsed }
}

fn grant(lease: Lease, sent: Instant, config: &Config) -> Grant {
    Grant {
        deadline: local_deadline(&lease, sent, config),
        next_renew: later(sent, config.timing.renew_interval),
        lease,
    }
}

/// The local deadline of a grant (the one rule every hold has, see
/// [`timing::local_deadline`](crate::hold::timing::local_deadline)).
pub(super) fn local_deadline(lease: &Lease, sent: Instant, config: &Config) -> Instant {
    config.timing.deadline(lease, sent)
}

/// Expiry-aware: a lease that ends before the next regular retry is retried right after it
/// ends, so a crashed leader is replaced one lease after its last renew.
fn follower_wait(denial: &Denial, regular: Duration) -> Duration {
    let at_expiry = denial.remaining.saturating_add(AFTER_EXPIRY);
    if !denial.remaining.is_zero() && at_expiry < regular {
        at_expiry
    } else {
        regular
    }
}

/// The wait after `failures` store errors in a row: doubling from [`FIRST_BACKOFF`], at most
/// `cap`.
pub(super) fn backoff(failures: u32, cap: Duration) -> Duration {
    let exp = failures.saturating_sub(1).min(16);
    FIRST_BACKOFF.saturating_mul(1 << exp).min(cap)
}

pub(super) use crate::hold::timing::later;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elector::config::Options;
    use crate::error::BackendError;

    const ME: FencingToken = FencingToken::new(7);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Lease 10 s, renew every 3 s, retry every 2 s, step down 1 s before the lease ends.
    fn config() -> Config {
        Options {
            resource: Some("r".into()),
            candidate: Some("me".into()),
            timing: crate::hold::timing::TimingOptions {
                lease: Some(ms(10_000)),
                renew_interval: Some(ms(3_000)),
                step_down_margin: Some(ms(1_000)),
                ..Default::default()
            },
            retry_interval: Some(ms(2_000)),
            ..Options::default()
        }
        .validate()
        .expect("valid options")
    }

    const FOLLOWER: Role = Role::Follower {
        retry: Duration::from_millis(2_100),
        led: None,
    };

    /// A follower whose last term had token `led`.
    fn led(led: i64) -> Role {
        Role::Follower {
            retry: ms(2_100),
            led: Some(FencingToken::new(led)),
        }
    }
    const LEADER: Role = Role::Leader { token: ME };

    fn lease(token: FencingToken, remaining: Duration) -> Lease {
        Lease::new("r", "me", token, remaining)
    }

    /// The grant of a whole lease (`lease`) sent at `sent`: the deadline 9 s later (lease minus
    /// margin), the renew 3 s later.
    fn whole(lease: Lease, sent: Instant) -> Grant {
        Grant {
            lease,
            deadline: sent + ms(9_000),
            next_renew: sent + ms(3_000),
        }
    }

    fn denial(holder: Option<&str>, remaining: Duration) -> Denial {
        let mut denial = Denial::new("r");
        denial.holder = holder.map(str::to_owned);
        denial.remaining = remaining;
        denial
    }

    fn retryable() -> StoreError {
        StoreError::Database(BackendError::SeaOrm(sea_orm::DbErr::Custom("down".into())))
    }

    /// `answer` to a call sent at `sent`, seen 20 ms later.
    fn decide_at(sent: Instant, answer: Answer, role: Role, failures: u32) -> Decision {
        decide(answer, sent, sent + ms(20), &config(), role, failures)
    }

    #[test]
    fn a_follower_granted_the_lease_is_elected_with_a_deadline_from_the_send() {
        let sent = Instant::now();
        // More than the lease asked for counts as the lease: the deadline never trusts more.
        for remaining in [ms(10_000), ms(60_000)] {
            let granted = lease(ME, remaining);
            let acquired = LeaseOutcome::Acquired(granted.clone());
            let decision = decide_at(sent, Ok(Ok(acquired)), FOLLOWER, 3);
            assert_eq!(decision.failures, 0);
            assert!(
                matches!(&decision.next, Next::Elect(grant) if *grant == whole(granted, sent)),
                "{:?}",
                decision.next
            );
        }
    }

    /// A follower's `Renewed` is a live lease of its own id that it does not lead: an earlier
    /// term of this elector (a renew that committed after the term ended at its deadline) or
    /// of a predecessor with the same id. Never a term (its token is an earlier term's): the
    /// write is released, and if that fails, left to lapse.
    #[test]
    fn a_follower_renewed_releases_that_write_instead_of_leading_it() {
        let sent = Instant::now();
        let now = sent + ms(20);
        for role in [FOLLOWER, led(7), led(3)] {
            let renewed = lease(ME, ms(10_000));
            let outcome = LeaseOutcome::Renewed(renewed.clone());
            let decision = decide_at(sent, Ok(Ok(outcome)), role, 3);
            assert_eq!(decision.failures, 0);
            assert!(
                matches!(&decision.next, Next::Release { lease, lapsed }
                    if *lease == renewed && *lapsed == now + ms(10_000) + AFTER_EXPIRY),
                "{role:?}: {:?}",
                decision.next
            );
        }
    }

    /// A new term in the store begins a term only if its token exceeds the last term this
    /// elector began (a store that hands out a token again, say after its row was deleted,
    /// gets that write released).
    #[test]
    fn a_follower_leads_only_a_token_above_its_last_terms() {
        let sent = Instant::now();
        for (last, elected) in [(6, true), (7, false), (9, false)] {
            let acquired = LeaseOutcome::Acquired(lease(ME, ms(10_000)));
            let decision = decide_at(sent, Ok(Ok(acquired)), led(last), 3);
            assert_eq!(decision.failures, 0);
            let as_expected = if elected {
                matches!(&decision.next, Next::Elect(grant) if grant.lease.token == ME)
            } else {
                matches!(&decision.next, Next::Release { lease, .. } if lease.token == ME)
            };
            assert!(as_expected, "after {last}: {:?}", decision.next);
        }
    }

    /// Too little left to trust is no term either: that write is released (a renew of it
    /// would be a `Renewed`, which begins no term) and the follower contends again at once.
    #[test]
    fn a_follower_granted_too_little_of_the_lease_releases_it() {
        let sent = Instant::now();
        let now = sent + ms(20);
        // (time left, too little?): the deadline is the send plus what is left minus the 1 s
        // margin; one at or before `now` is too late.
        for (remaining, short) in [(ms(1_000), true), (ms(1_020), true), (ms(1_021), false)] {
            let granted = LeaseOutcome::Acquired(lease(ME, remaining));
            let decision = decide_at(sent, Ok(Ok(granted)), FOLLOWER, 3);
            assert_eq!(decision.failures, 0);
            let as_expected = if short {
                matches!(
                    &decision.next,
                    Next::Release { lease, lapsed } if lease.token == ME && *lapsed == now + remaining + AFTER_EXPIRY
                )
            } else {
                matches!(decision.next, Next::Elect(_))
            };
            assert!(as_expected, "{remaining:?}: {:?}", decision.next);
        }
    }

    #[test]
    fn a_leader_renewed_on_its_token_extends_its_term() {
        let sent = Instant::now();
        let renewed = lease(ME, ms(10_000));
        let decision = decide_at(
            sent,
            Ok(Ok(LeaseOutcome::Renewed(renewed.clone()))),
            LEADER,
            1,
        );
        assert_eq!(decision.failures, 0);
        assert!(
            matches!(&decision.next, Next::Extend(grant) if *grant == whole(renewed, sent)),
            "{:?}",
            decision.next
        );
    }

    /// An `Acquired` with a new token means the store began a new term: ours lapsed there.
    #[test]
    fn a_leader_granted_a_new_term_begins_it_and_keeps_its_failure_count() {
        let sent = Instant::now();
        let acquired = LeaseOutcome::Acquired(lease(FencingToken::new(8), ms(10_000)));
        let decision = decide_at(sent, Ok(Ok(acquired)), LEADER, 2);
        assert_eq!(decision.failures, 2);
        assert!(
            matches!(&decision.next, Next::Elect(grant) if grant.deadline == sent + ms(9_000)),
            "{:?}",
            decision.next
        );
    }

    /// Whatever else a leader is granted ends its term and is released, never led: a
    /// `Renewed` with another token (not this term's renew), an `Acquired` whose token does not
    /// exceed this term's, and a new term with too little left to trust.
    #[test]
    fn a_leader_granted_what_it_must_not_lead_releases_it() {
        let sent = Instant::now();
        for outcome in [
            LeaseOutcome::Renewed(lease(FencingToken::new(8), ms(10_000))),
            LeaseOutcome::Renewed(lease(FencingToken::new(6), ms(10_000))),
            LeaseOutcome::Acquired(lease(ME, ms(10_000))),
            LeaseOutcome::Acquired(lease(FencingToken::new(6), ms(10_000))),
            LeaseOutcome::Acquired(lease(FencingToken::new(8), ms(1_000))),
        ] {
            let granted = outcome.lease().cloned();
            let decision = decide_at(sent, Ok(Ok(outcome)), LEADER, 2);
            assert_eq!(decision.failures, 2);
            assert!(
                matches!(&decision.next, Next::Release { lease, .. } if Some(lease) == granted.as_ref()),
                "{:?}",
                decision.next
            );
        }
    }

    #[test]
    fn a_denied_follower_follows_and_retries_right_after_a_short_lease_ends() {
        let sent = Instant::now();
        let now = sent + ms(20);
        for (holder, remaining, wait) in [
            // Ends before the regular retry: right after it ends.
            (Some("other"), ms(500), ms(515)),
            // Ends after it: the regular (jittered) retry.
            (Some("other"), ms(5_000), ms(2_100)),
            (Some("other"), ms(2_084), ms(2_099)),
            // Unknown time left: the regular retry.
            (None, Duration::ZERO, ms(2_100)),
            // No holder named: the same rule.
            (None, ms(100), ms(115)),
        ] {
            let denied = denial(holder, remaining);
            let decision = decide_at(
                sent,
                Ok(Ok(LeaseOutcome::Denied(denied.clone()))),
                FOLLOWER,
                4,
            );
            assert_eq!(decision.failures, 0);
            assert!(
                matches!(&decision.next, Next::Follow { denial, at } if *denial == denied && *at == now + wait),
                "{holder:?} {remaining:?}: {:?}",
                decision.next
            );
        }
    }

    #[test]
    fn a_denied_leader_loses_its_term_to_the_holder() {
        let sent = Instant::now();
        let decision = decide_at(
            sent,
            Ok(Ok(LeaseOutcome::Denied(denial(Some("other"), ms(5_000))))),
            LEADER,
            1,
        );
        assert_eq!(decision.failures, 1);
        assert!(
            matches!(&decision.next, Next::Lose(LossReason::Denied, Some(holder), _) if holder == "other"),
            "{:?}",
            decision.next
        );
        let decision = decide_at(
            sent,
            Ok(Ok(LeaseOutcome::Denied(denial(None, ms(5_000))))),
            LEADER,
            1,
        );
        assert!(
            matches!(decision.next, Next::Lose(LossReason::Denied, None, _)),
            "{:?}",
            decision.next
        );
    }

    #[test]
    fn a_permanent_error_stops_the_elector() {
        let sent = Instant::now();
        for role in [FOLLOWER, LEADER] {
            let decision = decide_at(sent, Ok(Err(StoreError::Disconnected)), role, 1);
            assert_eq!(decision.failures, 1);
            assert!(
                matches!(decision.next, Next::Fail(StoreError::Disconnected)),
                "{role:?}: {:?}",
                decision.next
            );
        }
    }

    #[test]
    fn other_errors_back_off_per_role() {
        let sent = Instant::now();
        let now = sent + ms(20);
        let missing_table = || StoreError::MissingTable {
            table: "leases".into(),
            source: BackendError::SeaOrm(sea_orm::DbErr::Custom("no such table".into())),
        };
        // (role, failures before, failures after, wait): doubling from 50 ms, capped by the
        // retry interval for a follower and the renew interval for a leader.
        for (role, before, after, wait) in [
            (FOLLOWER, 0, 1, ms(50)),
            (FOLLOWER, 2, 3, ms(200)),
            (FOLLOWER, 9, 10, ms(2_000)),
            (LEADER, 0, 1, ms(50)),
            (LEADER, 9, 10, ms(3_000)),
            (LEADER, u32::MAX, u32::MAX, ms(3_000)),
        ] {
            // A setup error (a missing table) is retried too, in case it clears up.
            for error in [retryable(), missing_table()] {
                let decision = decide_at(sent, Ok(Err(error)), role, before);
                assert_eq!(decision.failures, after, "{role:?} after {before}");
                assert!(
                    matches!(decision.next, Next::Retry { at, setback: Setback::Error { wait: w, .. } } if at == now + wait && w == wait),
                    "{role:?} after {before}: {:?}",
                    decision.next
                );
            }
        }
    }

    #[test]
    fn no_answer_backs_a_follower_off_and_ends_a_leaders_term() {
        let sent = Instant::now();
        let decision = decide_at(sent, Err(NoAnswer), FOLLOWER, 1);
        assert_eq!(decision.failures, 2);
        assert!(
            matches!(decision.next, Next::Retry { at, setback: Setback::NoAnswer } if at == sent + ms(20) + ms(100)),
            "{:?}",
            decision.next
        );
        let decision = decide_at(sent, Err(NoAnswer), LEADER, 1);
        assert_eq!(decision.failures, 1);
        assert!(
            matches!(decision.next, Next::Lose(LossReason::Deadline, None, None)),
            "{:?}",
            decision.next
        );
    }

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
