//! A leader's renew in the store's batch (renewing together), and its own renew when the batch
//! found its row busy.

use super::*;

impl Runner {
    /// The renew in a batch with the other leaders of this process that share the store (see
    /// `together`).
    pub(super) async fn renew_together(
        &self,
        active: &Active,
        due: Instant,
        deadline: Instant,
        failures: u32,
    ) -> Result<Together, Stopped> {
        // Stopping, or past the deadline: nothing enters a batch (the step takes it up).
        if self.stop.abort.is_cancelled()
            || self.stop.shutdown.is_cancelled()
            || crate::clock::now() >= deadline
        {
            return Ok(Together::Alone);
        }
        let Some(renewer) = self.renewer.as_ref().filter(|_| self.config.renew_together) else {
            return Ok(Together::Alone);
        };
        let Some(mut ticket) = renewer.enter(
            &self.store,
            active.granted.clone(),
            (self.config.timing.lease, self.config.timing.renew_interval),
            due,
            deadline,
            true,
        ) else {
            return Ok(Together::Alone);
        };
        // The batch leaves at the latest at `due`; one that is held up (its task on a runtime
        // that is not driven, say) is waited for a moment, then this leader renews alone.
        let slack = DEPARTURE_SLACK.min(deadline.saturating_duration_since(due) / 4);
        let patience = later(due, slack).min(deadline);
        let departed = tokio::select! {
            biased;
            _ = self.stop.abort.cancelled() => return Err(Stopped::Abort),
            _ = self.stop.shutdown.cancelled() => Err(Stopped::Shutdown),
            _ = self.stop.step_down.asked.notified() => Err(Stopped::StepDown),
            departed = timeout_at(patience, ticket.departed()) => Ok(departed),
        };
        let departure = match departed {
            Ok(Ok(departure)) => departure,
            Ok(Err(_)) => {
                if ticket.withdraw() {
                    return Ok(Together::AskNow { lost: false });
                }
                // It left meanwhile: its answer decides this round.
                self.abortable(ticket.departed()).await?
            }
            Err(stopped) => {
                if ticket.withdraw() {
                    return Err(stopped);
                }
                // The batch left with it: its answer decides this round, and the stop is taken
                // up at the next step (a step-down asked again, as the wait took its notice).
                if stopped == Stopped::StepDown {
                    self.stop.step_down.asked.notify_one();
                }
                self.abortable(ticket.departed()).await?
            }
        };
        let Some(departure) = departure else {
            return Ok(Together::AskNow { lost: false });
        };
        let sent = departure.sent;
        let answer = match self
            .abortable(timeout_at(deadline, departure.reply()))
            .await?
        {
            Ok(Reply::Renewed(lease)) => Ok(Ok(LeaseOutcome::Renewed(lease))),
            Ok(Reply::Lost) => return Ok(Together::AskNow { lost: true }),
            Ok(Reply::Failed(what)) => Ok(Err(crate::error::StoreError::Database(
                sea_orm::DbErr::Custom(what).into(),
            ))),
            // Busy: its row was held locked (its own fenced transaction, say) for longer than
            // the batch waits for a row it left out. Its own acquire-or-renew, sent at once,
            // waits for the row as a renew alone does (up to its deadline), so renewing
            // together never answers a leader busy where renewing alone would have renewed it.
            Ok(Reply::Alone | Reply::Busy | Reply::Refused(_)) => {
                return Ok(Together::AskNow { lost: false })
            }
            Err(_) => Err(NoAnswer),
        };
        let role = Role::Leader {
            token: active.term.token(),
        };
        self.probe.store_call(true, sent, &answer);
        let now = crate::clock::now();
        Ok(Together::Decided(decide(
            answer,
            sent,
            now,
            &self.config,
            role,
            failures,
        )))
    }
}
