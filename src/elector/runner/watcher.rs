//! A candidate that watches but never campaigns (`ElectorBuilder::campaign(false)`): it reads
//! the lease instead of asking for it, so it follows the leader (and sees its payload) and
//! never leads, never takes an offer and never holds up anyone's term.

use super::*;

impl Runner {
    /// One look at the lease: waits for the next look, reads it, and follows whoever holds it
    /// live (nobody, if no one does). A read that fails is retried with the follower's
    /// back-off; one the store refuses for good stops the elector, as a refused acquire does.
    pub(super) async fn watch_step(
        &self,
        next_look: Instant,
        failures: u32,
        releases: &mut Option<ReleaseEvents>,
    ) -> Result<Decision, Stopped> {
        self.stoppable(self.wait_turn(next_look, releases)).await?;
        let retry = jittered(self.config.retry_interval, self.config.jitter);
        let sent = crate::clock::now();
        let until = later(sent, self.config.timing.lease);
        // A read has nothing to commit: a shutdown may cut it short.
        let read = self
            .stoppable(timeout_at(until, self.store.current(&self.config.resource)))
            .await?;
        let now = crate::clock::now();
        let answer: Answer = match read {
            Ok(Ok(record)) => {
                let live = record.filter(|r| r.live);
                // Right after the leader's lease ends, if that is sooner than the next look.
                let at = live
                    .as_ref()
                    .filter(|r| !r.remaining.is_zero())
                    .map(|r| later(now, r.remaining.saturating_add(LOOK_PAST_THE_END)))
                    .filter(|at| *at < later(now, retry))
                    .unwrap_or_else(|| later(now, retry));
                let denial = match live {
                    Some(r) => Denial {
                        resource: r.resource,
                        holder: Some(r.holder),
                        token: Some(r.token),
                        remaining: r.remaining,
                        expires_at: r.expires_at,
                        payload: r.payload,
                        stalled: None,
                    },
                    None => Denial::new(self.config.resource.to_string()),
                };
                let answer: Answer = Ok(Ok(LeaseOutcome::Denied(denial.clone())));
                self.probe.store_call(false, sent, &answer);
                return Ok(Decision {
                    next: Next::Follow { denial, at },
                    failures: 0,
                });
            }
            Ok(Err(error)) => Ok(Err(error)),
            Err(_) => Err(NoAnswer),
        };
        self.probe.store_call(false, sent, &answer);
        // A failed read decides as a failed attempt does: back-off, or a stop if permanent.
        let role = Role::Follower { retry, led: None };
        Ok(decide(answer, sent, now, &self.config, role, failures))
    }
}

/// How long past the leader's lease end (as the store reported it) a watcher looks again.
const LOOK_PAST_THE_END: Duration = Duration::from_millis(5);
