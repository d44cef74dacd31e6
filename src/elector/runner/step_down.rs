//! A step-down and a named handover: the term ends, then the lease is offered to the successor
//! (or released), and an offer made to this candidate is taken.

use super::*;

impl Runner {
    /// A step-down of a leader: the term ends as on a shutdown (its work gets the grace period
    /// while the lease is kept renewed), then the lease is offered to `to` for `within` (a
    /// handover to a named successor) or, without one or when the store cannot offer, released,
    /// so another candidate takes over at once. How the lease was left (`Kept`: the work did not
    /// stop, or the lease was lost meanwhile; it lapses on its own); `Err` only on an abort
    /// meanwhile.
    pub(super) async fn hand_over(
        &self,
        active: &mut Active,
        failures: &mut u32,
        to: Option<&str>,
        within: Duration,
    ) -> Result<LeftLease, Stopped> {
        self.end_term(&active.term, LossReason::HandedOver, None, None);
        // The candidacy is left while the work winds down, before the lease is offered or
        // released (see `rest_candidacy`).
        let bound = active.term.local_deadline();
        let (holds_lease, ()) = tokio::join!(
            self.drain(active, failures),
            self.rest_candidacy(later(crate::clock::now(), within), bound)
        );
        if self.stop.abort.is_cancelled() {
            return Err(Stopped::Abort);
        }
        if !holds_lease {
            return Ok(LeftLease::Kept);
        }
        if let Some(to) = to {
            match self.offer(&active.granted, to, within).await {
                Offered::Yes => return Ok(LeftLease::Offered),
                Offered::TermGone => return Ok(LeftLease::Kept),
                // Not offered, the term still ours: released as by a step-down.
                Offered::Failed => {}
            }
        }
        Ok(if self.release(&active.granted).await {
            LeftLease::Released
        } else {
            LeftLease::Kept
        })
    }

    /// Offers the lease of `granted` to `to` for `within` (see `LeaseStore::offer`).
    pub(super) async fn offer(&self, granted: &Lease, to: &str, within: Duration) -> Offered {
        let call = self.store.offer(granted, to, within);
        match timeout(self.config.timing.lease, call).await {
            Ok(Ok(true)) => {
                info!(successor = to, ?within, "offered the lease");
                Offered::Yes
            }
            Ok(Ok(false)) => {
                info!("not offered: the store no longer holds this term; it lapses on its own");
                Offered::TermGone
            }
            Ok(Err(err)) => {
                warn!(error = %err, "offer failed; releasing the lease instead");
                Offered::Failed
            }
            Err(_) => {
                warn!("offer timed out; releasing the lease instead");
                Offered::Failed
            }
        }
    }

    /// Takes the lease offered to this candidate with `token` (a denial named the offer), then
    /// renews it: a `Renewed` of exactly that term, after our own take, begins the term as an
    /// `Acquired` would. Any other turn of events decides as `fallback` (the denial) did.
    pub(super) async fn take_offer(
        &self,
        token: FencingToken,
        led: Option<FencingToken>,
        failures: u32,
        fallback: Decision,
    ) -> Result<Decision, Stopped> {
        // Never a term whose token does not exceed the last one led.
        if led.is_some_and(|led| token <= led) {
            return Ok(fallback);
        }
        let lease = self.config.timing.lease;
        let sent = crate::clock::now();
        let call =
            self.store
                .take_offer(&self.config.resource, &self.config.candidate, token, lease);
        match self.abortable(timeout_at(later(sent, lease), call)).await? {
            Ok(Ok(true)) => info!(%token, "took the lease offered to this candidate"),
            Ok(Ok(false)) => {
                debug!(%token, "the offer was no longer open");
                return Ok(fallback);
            }
            Ok(Err(err)) => {
                warn!(error = %err, "taking the offered lease failed");
                return Ok(fallback);
            }
            Err(_) => {
                warn!("taking the offered lease timed out");
                return Ok(fallback);
            }
        }
        let role = Role::Follower {
            retry: jittered(self.config.retry_interval, self.config.jitter),
            led,
        };
        let sent = crate::clock::now();
        let answer = match self.ask_store(later(sent, lease)).await? {
            Ok(Ok(LeaseOutcome::Renewed(renewed))) if renewed.token == token => {
                Ok(Ok(LeaseOutcome::Acquired(renewed)))
            }
            other => other,
        };
        self.probe.store_call(false, sent, &answer);
        let now = crate::clock::now();
        Ok(decide(answer, sent, now, &self.config, role, failures))
    }
}
