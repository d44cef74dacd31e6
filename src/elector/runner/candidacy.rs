//! A ranked candidate's turn at its candidacy: the heartbeat, and a leader's handover to a
//! live candidate ranking higher (see `elector::preference`).

use super::*;

use super::super::preference::Ranking;

impl Runner {
    /// Heartbeats the candidacy if due, bounded by `until` (a leader's next renew: the
    /// heartbeat never holds it up), and publishes what it found. A leader (`term_end`: its
    /// local deadline) that then sees a candidate to prefer asks for the handover to it;
    /// `true` if it did (the caller ends the round as for a step-down asked).
    pub(super) async fn candidacy_round(
        &self,
        ranking: &Ranking,
        term_end: Option<Instant>,
        until: Instant,
    ) -> Result<bool, Stopped> {
        let leading = term_end.is_some();
        let now = crate::clock::now();
        ranking.settle(now);
        if !ranking.beat_due(now, leading) {
            return Ok(false);
        }
        // Too little time before the renew for a round trip: the next round beats (a statement
        // cut short would cost the renew a connection), unless beats are overdue by half an
        // interval (renews this slow would otherwise skip every one).
        if until.saturating_duration_since(now) < ranking.every / 4 && !ranking.overdue(now) {
            return Ok(false);
        }
        ranking.beaten(now);
        let (resource, candidate) = (&self.config.resource, &self.config.candidate);
        let members = &ranking.members;
        let rejoin = ranking.take_rejoin();
        // A leader's candidacy never outlives its term: should it crash, or its renews fail
        // while its heartbeats go through, the next leader does not see it live.
        let ttl = term_end.map_or(ranking.ttl, |end| {
            ranking
                .ttl
                .min(end.saturating_duration_since(now))
                .max(crate::store::MIN_LEASE)
        });
        let call = async {
            if rejoin {
                // A new candidacy: its live time counts from this heartbeat.
                members.candidate_leave(resource, candidate).await?;
            }
            members
                .candidate_heartbeat(resource, candidate, ttl, ranking.rank)
                .await
        };
        // Run to its end (bounded by `until`) even when a stop is asked: a heartbeat dropped
        // mid-statement could commit after the leave that follows and list a candidate gone.
        let answer = self.abortable(timeout_at(until, call)).await;
        ranking.beat_done(crate::clock::now());
        if rejoin && !matches!(answer, Ok(Ok(Ok(_)))) {
            ranking.rejoin();
        }
        match answer? {
            Ok(Ok(candidates)) => ranking.publish(Ok(candidates)),
            Ok(Err(err)) => {
                if err.is_retryable() {
                    warn!(error = %err, "candidacy heartbeat failed");
                } else {
                    error!(error = %err, "candidacy heartbeat failed");
                }
                ranking.publish(Err(crate::error::chain(&err)));
            }
            Err(_) => {
                debug!("candidacy heartbeat cut short by the next renew");
                ranking.publish(Err("the heartbeat did not answer in time".to_owned()));
            }
        }
        if !leading || ranking.handing_over() {
            return Ok(false);
        }
        let Some(to) = ranking.choose(&self.config.candidate, crate::clock::now()) else {
            return Ok(false);
        };
        let (done, answer) = tokio::sync::oneshot::channel();
        let request = StepDown {
            stay_out: ranking.window,
            to: Some(Arc::from(to.as_str())),
            done,
        };
        if !self.stop.step_down.ask_unless_pending(request) {
            return Ok(false);
        }
        // The request's wake-up is for the loop's next wait; the caller ends the round now, so
        // it is taken here (left, it would cut the next wait short for nothing).
        self.step_down_asked().await;
        info!(successor = %to, rank = ranking.rank, "a candidate ranking higher is live: handing over");
        ranking.asked(to, answer);
        Ok(true)
    }

    /// A leader's step-down: its stay-out (until `until`, made longer by the caller if the
    /// lease is left to lapse) begins, and the candidacy is left before the lease is offered or
    /// released (the caller runs this beside the work's winding down), so that the next leader
    /// does not see a higher rank that is staying out and offer it the lease back; it begins
    /// afresh after the stay-out. The leave is bounded by `bound` (the term's deadline).
    pub(super) async fn rest_candidacy(&self, until: Instant, bound: Instant) {
        if let Some(ranking) = &self.ranking {
            ranking.rest_until(until);
            self.leave_candidacy(Some(bound)).await;
        }
    }

    /// Leaves the candidacy (a graceful stop, a stay-out), so that no leader hands over to a
    /// candidate that is gone; bounded by a renew interval and by `bound` (a leader's term
    /// deadline: the lease is released only after this). A failure is logged; the row lapses.
    pub(super) async fn leave_candidacy(&self, bound: Option<Instant>) {
        let Some(ranking) = &self.ranking else {
            return;
        };
        let call = ranking
            .members
            .candidate_leave(&self.config.resource, &self.config.candidate);
        let until = later(crate::clock::now(), self.config.timing.renew_interval);
        let until = bound.map_or(until, |bound| until.min(bound));
        match timeout_at(until, call).await {
            Ok(Ok(_)) => debug!("left the candidacy"),
            Ok(Err(err)) => warn!(error = %err, "leaving the candidacy failed; it lapses"),
            Err(_) => warn!("leaving the candidacy timed out; it lapses"),
        }
    }
}
