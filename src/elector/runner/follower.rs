//! What a follower learns from an answer: whom it follows, and how a setback is logged.

use super::*;

impl Runner {
    pub(super) fn follow(&self, denial: &Denial) {
        // A store's report can be stale; whoever denied us, it was not us.
        // An open offer (a planned handover) has no leader yet.
        let leader = denial
            .holder
            .clone()
            .filter(|holder| **holder != *self.config.candidate)
            .filter(|_| denial.offered_to().is_none());
        let payload = leader.as_ref().and(denial.payload.clone());
        let next = Leadership::Follower { leader, payload };
        self.state.send_if_modified(|state| {
            if *state == next {
                false
            } else {
                *state = next.clone();
                true
            }
        });
    }

    pub(super) fn note_follower_without_answer(&self) {
        self.state.send_if_modified(|state| {
            if matches!(state, Leadership::Starting) {
                *state = Leadership::Follower {
                    leader: None,
                    payload: None,
                };
                true
            } else {
                false
            }
        });
    }

    /// A follower's attempt that led only to a later one: says why, and leaves `Starting` (the
    /// store was asked).
    pub(super) fn follower_setback(&self, setback: &Setback, failures: u32) {
        match setback {
            Setback::Error { error, wait } => {
                log_store_error(error, failures, *wait, "store error while contending")
            }
            Setback::NoAnswer => {
                warn!(after = ?self.config.timing.lease, "store did not answer while contending")
            }
        }
        self.note_follower_without_answer();
    }
}
