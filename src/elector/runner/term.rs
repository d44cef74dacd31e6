//! A term's beginning and end: the leader's state, the notices, the metrics.

use super::*;

impl Runner {
    pub(super) fn begin_term(&self, grant: Grant) -> Active {
        let term = LeaderTerm::new(
            grant.lease.token,
            self.config.resource.clone(),
            self.config.candidate.clone(),
            grant.deadline,
            self.fence.clone(),
        );
        info!(token = %grant.lease.token, "elected");
        self.state.send_replace(Leadership::Leader(term.clone()));
        self.probe.elected();
        Active {
            term,
            next_renew: grant.next_renew,
            granted: grant.lease,
        }
    }

    pub(super) fn end_term(
        &self,
        term: &LeaderTerm,
        reason: LossReason,
        leader: Option<String>,
        payload: Option<String>,
    ) {
        // Publish the step-down first, then fire `lost`: nobody who reacts to `lost` can still
        // read a leader state from the channel.
        // A store's report can be stale; whoever denied us, it was not us. An open offer (a
        // planned handover) has no leader yet.
        let leader = leader
            .filter(|holder| **holder != *self.config.candidate)
            .filter(|holder| crate::lease::offered_to(holder).is_none());
        let payload = leader.as_ref().and(payload);
        self.state
            .send_replace(Leadership::Follower { leader, payload });
        term.end(reason);
        if !matches!(reason, LossReason::Shutdown | LossReason::HandedOver) {
            // The lease no longer covers the term: its work stops now, not after a grace.
            term.cut_off();
        }
        self.probe.lost(reason);
        match reason {
            LossReason::Shutdown | LossReason::HandedOver => {
                info!(token = %term.token(), reason = %reason, "leadership ended")
            }
            _ => warn!(token = %term.token(), reason = %reason, "leadership lost"),
        }
    }
}
