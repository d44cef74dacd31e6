//! Leadership as the elector sees it: the state on the watch channel, and one term.

use crate::mutex::lock;
use std::fmt;
use std::sync::{Arc, Mutex};

use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::fencing::FencingToken;

/// What one elector believes about its resource, published on [`ElectorHandle::watch`](crate::ElectorHandle::watch).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Leadership {
    /// The elector has not heard from the store yet.
    Starting,
    /// Another candidate leads (`leader`, where the store said who), or nobody does.
    Follower {
        /// The current leader, where known.
        leader: Option<String>,
        /// The leader's payload, where it wrote one (see
        /// [`ElectorBuilder::payload`](crate::ElectorBuilder::payload)).
        payload: Option<String>,
    },
    /// This candidate leads: the term is valid until it is lost.
    Leader(LeaderTerm),
    /// The elector stopped for good: the store refused its configuration
    /// ([`StoreError::is_permanent`](crate::StoreError::is_permanent): a backend this build
    /// does not support, a refused name). It is logged at error level and
    /// [`health`](crate::ElectorHandle::health) reports it. A missing lease table is not such
    /// an error: it is logged at error level and retried.
    Failed(Arc<crate::error::StoreError>),
}

impl Leadership {
    /// Whether this is a leader state whose term is still current (see [`LeaderTerm::is_current`]).
    pub fn is_leader(&self) -> bool {
        matches!(self, Leadership::Leader(term) if term.is_current())
    }

    /// The term, if this is a leader state.
    pub fn term(&self) -> Option<&LeaderTerm> {
        match self {
            Leadership::Leader(term) => Some(term),
            _ => None,
        }
    }
}

impl PartialEq for Leadership {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Leadership::Starting, Leadership::Starting) => true,
            (
                Leadership::Follower {
                    leader: a,
                    payload: p,
                },
                Leadership::Follower {
                    leader: b,
                    payload: q,
                },
            ) => a == b && p == q,
            (Leadership::Leader(a), Leadership::Leader(b)) => a == b,
            (Leadership::Failed(a), Leadership::Failed(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// Why a term ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// A renew was denied: another candidate holds the lease.
    Denied,
    /// No renew succeeded before the local step-down deadline.
    Deadline,
    /// The store granted a *new* term instead of renewing this one (the lease had lapsed), or
    /// answered the renew with a lease no term may begin on (another token); that write is
    /// released, and the elector contends for a new token.
    Superseded,
    /// The elector was shut down (or its handle dropped).
    Shutdown,
    /// The elector was aborted without releasing.
    Aborted,
    /// The store refused the elector's configuration; the elector stopped (see
    /// [`Leadership::Failed`]).
    Failed,
    /// Handed over on purpose: an elector's [`step_down`](crate::ElectorHandle::step_down), or
    /// a shard set's handover to another member (rebalancing, a preference, a drain). Its work
    /// was told to stop (and got the grace period), then the lease was released.
    HandedOver,
    /// Its holder let it go: a lock guard or permit released or dropped.
    Released,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LossReason::Denied => "denied",
            LossReason::Deadline => "deadline",
            LossReason::Superseded => "superseded",
            LossReason::Shutdown => "shutdown",
            LossReason::Aborted => "aborted",
            LossReason::Failed => "failed",
            LossReason::HandedOver => "handed_over",
            LossReason::Released => "released",
        })
    }
}

struct TermState {
    token: FencingToken,
    resource: Arc<str>,
    candidate: Arc<str>,
    cancel: CancellationToken,
    /// Fired when leader work must stop at once: the lease no longer covers it.
    cut_off: CancellationToken,
    /// The local monotonic instant after which this term must not be trusted, moved forward
    /// by each successful renew.
    deadline: Mutex<Instant>,
    reason: Mutex<Option<LossReason>>,
    /// When the holder took the grant's answer as this term (see `clock`).
    began: Instant,
    /// When the holder decided the term was over (see `clock`).
    ended: Mutex<Option<Instant>>,
    /// The elector's store, where it can fence SeaORM transactions.
    fence: Option<crate::backend::SeaOrmLeaseStore>,
}

/// One leadership term of this candidate: from the store's grant until it is lost.
///
/// Cheap to clone; all clones see the same term. Pass [`token`](Self::token) with every write
/// the leader makes, and stop when [`lost`](Self::lost) completes.
#[derive(Clone)]
pub struct LeaderTerm {
    inner: Arc<TermState>,
}

/// What a log line needs: resource, candidate, token, the time left (or why it ended) and the
/// backend; never the store's connection or statements.
impl fmt::Debug for LeaderTerm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("LeaderTerm");
        d.field("resource", &&*self.inner.resource)
            .field("candidate", &&*self.inner.candidate)
            .field("token", &self.inner.token.get());
        match self.loss_reason() {
            Some(reason) => d.field("ended", &reason),
            None => d.field(
                "remaining",
                &self
                    .local_deadline()
                    .saturating_duration_since(crate::clock::now()),
            ),
        };
        if let Some(store) = &self.inner.fence {
            d.field("backend", &store.backend_name());
        }
        d.finish()
    }
}

impl LeaderTerm {
    pub(crate) fn new(
        token: FencingToken,
        resource: Arc<str>,
        candidate: Arc<str>,
        deadline: Instant,
        fence: Option<crate::backend::SeaOrmLeaseStore>,
    ) -> Self {
        Self {
            inner: Arc::new(TermState {
                token,
                resource,
                candidate,
                cancel: CancellationToken::new(),
                cut_off: CancellationToken::new(),
                deadline: Mutex::new(deadline),
                reason: Mutex::new(None),
                began: crate::clock::now(),
                ended: Mutex::new(None),
                fence,
            }),
        }
    }

    /// Fences `txn` with this term, through the elector's own store: the same as
    /// [`SeaOrmLeaseStore::fence`](crate::SeaOrmLeaseStore::fence)`(txn, &term)`, without
    /// keeping a second clone of the store around. Call it first in the transaction; on
    /// [`FenceError::Fenced`](crate::FenceError::Fenced), roll back.
    ///
    /// [`FenceError::Unsupported`](crate::FenceError::Unsupported) when the elector's store
    /// is not a [`SeaOrmLeaseStore`](crate::SeaOrmLeaseStore) (the in-memory store, say).
    pub async fn fence<C: sea_orm::ConnectionTrait>(
        &self,
        txn: &C,
    ) -> Result<(), crate::error::FenceError> {
        match &self.inner.fence {
            Some(store) => store.fence(txn, self).await,
            None => Err(crate::error::FenceError::Unsupported),
        }
    }

    /// The term's fencing token: strictly greater than every earlier term's.
    pub fn token(&self) -> FencingToken {
        self.inner.token
    }

    /// The resource led.
    pub fn resource(&self) -> &str {
        &self.inner.resource
    }

    /// This candidate's id.
    pub fn candidate(&self) -> &str {
        &self.inner.candidate
    }

    /// Completes when the term ends (denied, deadline, superseded, shutdown, handed over).
    ///
    /// Only on a shutdown (and, in a shard set, a graceful handover) is the work let go on
    /// after this, for the grace period, with the lease still renewed: on every other end the
    /// work's future is dropped in the same moment, so cleanup that must always run goes in a
    /// `Drop` guard, not after this future (see
    /// [`run_as_leader`](crate::ElectorHandle::run_as_leader)).
    pub fn lost(&self) -> WaitForCancellationFutureOwned {
        self.inner.cancel.clone().cancelled_owned()
    }

    /// Whether the term has been declared lost.
    pub fn is_lost(&self) -> bool {
        self.inner.cancel.is_cancelled()
    }

    /// Whether the term is still trustworthy right now: not lost, and its local step-down
    /// deadline has not passed. This is checked against the monotonic clock (counting time the
    /// host spent suspended, where the OS can: `CLOCK_BOOTTIME` on Linux) on every call, so a
    /// process that was paused or suspended past its deadline sees `false` at once, before the
    /// elector's loop has even run again.
    pub fn is_current(&self) -> bool {
        !self.is_lost() && crate::clock::now() < *lock(&self.inner.deadline)
    }

    /// Why the term ended, once it has.
    pub fn loss_reason(&self) -> Option<LossReason> {
        *lock(&self.inner.reason)
    }

    /// When this process began the term: the instant it took the grant's answer as a term,
    /// before anyone is told (a tokio instant, as [`deadline`](Self::deadline)).
    pub fn began_at(&self) -> Instant {
        crate::clock::timer(self.inner.began)
    }

    /// When this process ended the term, once it has: the instant it decided (a loss, a
    /// shutdown, a handover), before the work is told and before any release is sent (a
    /// tokio instant, as [`deadline`](Self::deadline)). A term can also be over with no end
    /// decided yet: its deadline passed (see [`is_current`](Self::is_current)).
    pub fn ended_at(&self) -> Option<Instant> {
        lock(&self.inner.ended).map(crate::clock::timer)
    }

    /// A cancellation token cancelled when the term ends. It is a child token: cancelling it
    /// yourself does not end the term.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.inner.cancel.child_token()
    }

    /// The local monotonic instant until which the term is trusted (moves with each renew),
    /// as a tokio instant: moved earlier by any time the host has spent suspended since the
    /// term was granted (where the OS counts it: `CLOCK_BOOTTIME` on Linux). A host suspend
    /// *during* a `tokio::time::sleep_until(term.deadline())` stops tokio's timers, so such a
    /// sleep can end after the term: bound work by [`lost`](Self::lost) or
    /// [`is_current`](Self::is_current), which see a resume at once (or within a renew
    /// interval, for `lost`).
    pub fn deadline(&self) -> Instant {
        crate::clock::timer(self.local_deadline())
    }

    /// The deadline as the crate judges it (see `clock`): tokio's time plus time suspended.
    pub(crate) fn local_deadline(&self) -> Instant {
        *lock(&self.inner.deadline)
    }

    pub(crate) fn extend(&self, deadline: Instant) {
        *lock(&self.inner.deadline) = deadline;
    }

    pub(crate) fn end(&self, reason: LossReason) {
        lock(&self.inner.reason).get_or_insert(reason);
        self.inner.cancel.cancel();
        // After the cancel: from this instant on `is_current` is false.
        lock(&self.inner.ended).get_or_insert_with(crate::clock::now);
    }

    /// Tells `run_as_leader` to drop this term's work now (after [`end`](Self::end)).
    pub(crate) fn cut_off(&self) {
        self.inner.cancel.cancel();
        lock(&self.inner.ended).get_or_insert_with(crate::clock::now);
        self.inner.cut_off.cancel();
    }

    /// Resolves when this term's work must stop at once.
    pub(crate) fn cut_off_signal(&self) -> WaitForCancellationFutureOwned {
        self.inner.cut_off.clone().cancelled_owned()
    }
}

/// What a fence checks of this term: `store.fence(&txn, &term)`.
impl<'a> From<&'a LeaderTerm> for crate::fencing::Term<'a> {
    fn from(term: &'a LeaderTerm) -> Self {
        crate::fencing::Term {
            resource: term.resource(),
            holder: term.candidate(),
            token: term.token(),
        }
    }
}

impl PartialEq for LeaderTerm {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}
