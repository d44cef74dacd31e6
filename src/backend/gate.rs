//! One takeover at a time per store, and none for a while after the server refused one (see
//! `takeover`).

use crate::mutex::lock;
use std::time::Duration;

/// How long after the server refused a takeover (no privileges, MySQL 8) dropped acquires do
/// not ask again.
const REFUSED_BACKOFF: Duration = Duration::from_secs(30);

/// The takeovers dropped acquires asked for: at most one at a time per store (a shard set's
/// round gives up on many acquires at once when the database is slow, and a takeover per
/// resource would take the pool's connections from the batched renew), and none for a while
/// after the server refused one.
#[derive(Default)]
pub(crate) struct Gate(std::sync::Mutex<GateState>);

#[derive(Default)]
struct GateState {
    in_flight: Option<String>,
    refused_until: Option<tokio::time::Instant>,
    /// The server's last refusal, as said.
    refusal: Option<String>,
    /// Whether a refusal was warned about (once per store).
    warned: bool,
    /// The last look that found a blocker whose state the server hides, and why: that
    /// resource's holder is not ended (others still are: no back-off).
    unseen: Option<(String, tokio::time::Instant)>,
}

/// How long a look that could not see a blocker's state is told in denials.
const UNSEEN_TOLD_FOR: Duration = Duration::from_secs(5);

impl Gate {
    fn state(&self) -> std::sync::MutexGuard<'_, GateState> {
        // Nothing in it can be left half-changed by a panic: use it as it is.
        lock(&self.0)
    }

    /// Whether a takeover of `resource` may start now; if so, it is in flight until
    /// [`finish`](Self::finish).
    pub(crate) fn start(&self, resource: &str) -> bool {
        let mut st = self.state();
        if st
            .refused_until
            .is_some_and(|until| tokio::time::Instant::now() < until)
        {
            return false;
        }
        if st.in_flight.is_some() {
            return false;
        }
        st.in_flight = Some(resource.to_owned());
        true
    }

    /// Whether the server refused a takeover within the backoff.
    pub(crate) fn refused(&self) -> bool {
        self.state()
            .refused_until
            .is_some_and(|until| tokio::time::Instant::now() < until)
    }

    /// The server refused a takeover (`why`): none for the backoff.
    pub(crate) fn refuse(&self, why: String) {
        let mut st = self.state();
        st.refused_until = Some(tokio::time::Instant::now() + REFUSED_BACKOFF);
        st.refusal = Some(why);
    }

    /// A look found a blocker whose state the server hides from this role (`why`).
    pub(crate) fn unseen(&self, why: String) {
        self.state().unseen = Some((why, tokio::time::Instant::now()));
    }

    /// Whether this is the store's first refusal (to warn about once).
    pub(crate) fn first_refusal(&self) -> bool {
        !std::mem::replace(&mut self.state().warned, true)
    }

    /// Why a lapsed holder's session was not ended: the server's refusal within the backoff,
    /// else that no session the store may end blocked the wait.
    pub(crate) fn why_not_ended(&self) -> String {
        let st = self.state();
        let refused = st
            .refused_until
            .is_some_and(|until| tokio::time::Instant::now() < until);
        let unseen = st
            .unseen
            .as_ref()
            .filter(|(_, at)| at.elapsed() < UNSEEN_TOLD_FOR)
            .map(|(why, _)| why.clone());
        let refusal = match (&st.refusal, refused) {
            (Some(why), true) => Some(why.clone()),
            _ => unseen,
        };
        match refusal {
            Some(why) => format!(
                "the lease lapsed but its holder's session still holds the row locked, and the \
                 server refused to end it: {why} (PostgreSQL needs the same role, or \
                 pg_signal_backend and pg_read_all_stats; MariaDB the PROCESS privilege, and \
                 CONNECTION ADMIN for other users' sessions)"
            ),
            None => "the lease lapsed but a session still holds the row locked that the store \
                  does not end (not a stalled fenced transaction of the lapsed term)"
                .to_owned(),
        }
    }

    pub(crate) fn finish(&self, resource: &str) {
        let mut st = self.state();
        if st.in_flight.as_deref() == Some(resource) {
            st.in_flight = None;
        }
    }
}
