//! A store's backend and what its code is given, made once per store (and shared by its
//! clones).

use crate::mutex::lock;
use sea_orm::{QueryResult, Statement};

use super::context::Context;
use super::driver::LeaseBackend;
use super::errors::Kind;
use super::gate::Gate;
use super::prepared::Prepared;
use super::row::Row;
use super::statements;
use crate::error::StoreError;
use crate::lease::LeaseOutcome;

/// The migration step that gave the lease table its last columns (`payload`, `payload_token`).
pub(crate) const LEASE_TABLE_LAST_STEP: &str = "AddLeasePayload";
/// The same for the membership table (`leases_held`, `set_hash`, `counted_at`).
pub(crate) const MEMBER_TABLE_LAST_STEP: &str = "AddMemberHolding";
/// The step that gives the membership table its candidate rank (`candidate_rank`), which only
/// ranked electors need.
pub(crate) const MEMBER_RANK_STEP: &str = "AddMemberRank";

/// The store's attempts to acquire leases the process does not hold: at most `slots` at once,
/// and one at a time per lease (the others of that lease wait their turn without a slot), so
/// that many waiters for one busy lease do not keep every other lease's attempt waiting.
pub(crate) struct Attempts {
    slots: std::sync::Arc<tokio::sync::Semaphore>,
    turns: std::sync::Mutex<TurnMap>,
}

type TurnMap = std::collections::HashMap<(String, String), std::sync::Arc<tokio::sync::Mutex<()>>>;

/// What an acquire may do (see [`Engine::attempt`]).
pub(crate) enum Attempt {
    /// Be sent, holding this slot (if any) until its answer.
    Go(Option<Slot>),
    /// Nothing: a try while another attempt of the process has the lease's turn.
    Busy,
}

/// An attempt's turn on its lease and its slot, for as long as it is held.
pub(crate) struct Slot {
    _turn: tokio::sync::OwnedMutexGuard<()>,
    _slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Attempts {
    /// At most `slots` attempts at once (at least one).
    pub(crate) fn new(slots: usize) -> Self {
        Self {
            slots: std::sync::Arc::new(tokio::sync::Semaphore::new(slots.max(1))),
            turns: std::sync::Mutex::new(TurnMap::new()),
        }
    }

    /// The turn of an attempt on `resource` of `table`, then a slot; cancel-safe (a caller
    /// that stops waiting leaves both queues). `None` for a try (`once`) while another attempt
    /// of the lease has the turn.
    async fn slot(&self, table: &str, resource: &str, once: bool) -> Option<Slot> {
        let turn = {
            let mut turns = lock(&self.turns);
            if turns.len() > 1024 {
                // Leases nobody is attempting now.
                turns.retain(|_, turn| std::sync::Arc::strong_count(turn) > 1);
            }
            std::sync::Arc::clone(
                turns
                    .entry((table.to_owned(), resource.to_owned()))
                    .or_default(),
            )
        };
        let turn = if once {
            turn.try_lock_owned().ok()?
        } else {
            turn.lock_owned().await
        };
        // The semaphore is never closed.
        let slot = std::sync::Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .ok();
        Some(Slot {
            _turn: turn,
            _slot: slot,
        })
    }
}

/// What the store's answers say this process holds, by (lease table, resource, candidate).
pub(crate) type Held = std::sync::Mutex<std::collections::HashSet<(String, String, String)>>;

pub(crate) struct Engine {
    pub(crate) cx: Context,
    pub(crate) backend: Box<dyn LeaseBackend>,
    /// The takeovers asked for by dropped acquires (see `takeover`): one at a time per store.
    pub(crate) takeovers: std::sync::Arc<Gate>,
    /// The leaders of this process renewing together (see `hold::renewer`).
    pub(crate) renewer: crate::hold::renewer::Renewer,
    /// Attempts to acquire a lease this process does not hold, at most one fewer at once than
    /// the store's own sessions (`None` where it has fewer than two of its own), so that
    /// attempts never occupy every session: a renew or a release, which takes no slot, waits
    /// at most for one statement to end. Shared by the store's clones and the stores derived
    /// from it with as many sessions.
    pub(crate) attempts: Option<std::sync::Arc<Attempts>>,
    /// The (lease table, resource, candidate) triples the store's answers last said this
    /// process holds: an `acquire_or_renew` of one of them is a renew, and takes no slot.
    pub(crate) held: std::sync::Arc<Held>,
    /// The backend's wake-ups, if it has them (see `wakeups`).
    pub(crate) wakeups: Option<super::wakeups::Wakeups>,
}

impl Engine {
    /// A slot for an acquire of `resource` by `candidate`: `Go(None)` (none needed) for a renew
    /// of what this process holds, or where attempts are not limited. Waits for a slot, queued
    /// behind the other attempts; a caller that gives up leaves the queue, nothing sent (a
    /// task that runs the acquire for a caller says when the caller is gone: `ForCaller`); a
    /// try (`ForCaller::once`) is `Busy` at once while another attempt of the lease has its turn.
    pub(crate) async fn attempt(
        &self,
        resource: &str,
        candidate: &str,
    ) -> Result<Attempt, StoreError> {
        let through = || {
            let _ = crate::store::FOR_CALLER.try_with(|c| {
                c.sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                lock(&c.let_through).get_or_insert_with(crate::clock::now);
            });
        };
        let Some(attempts) = self.attempts.as_ref() else {
            through();
            return Ok(Attempt::Go(None));
        };
        if self.holds(resource, candidate) {
            through();
            return Ok(Attempt::Go(None));
        }
        let once = crate::store::FOR_CALLER
            .try_with(|c| c.once)
            .unwrap_or(false);
        let slot = attempts.slot(self.cx.table(), resource, once);
        let Ok(mut gone) = crate::store::FOR_CALLER.try_with(|c| c.gone.clone()) else {
            return Ok(slot.await.map_or(Attempt::Busy, |s| Attempt::Go(Some(s))));
        };
        // A caller already gone sends nothing, even with a slot free.
        tokio::select! {
            biased;
            () = async { while gone.changed().await.is_ok() {} } => {
                let _ = crate::store::FOR_CALLER.try_with(|c| {
                    c.gave_up.store(true, std::sync::atomic::Ordering::SeqCst);
                });
                Err(StoreError::Conflict {
                    source: sea_orm::DbErr::Custom(
                        "the caller gave up while the acquire waited for one of the store's \
                         attempt slots; nothing was sent"
                            .to_owned(),
                    )
                    .into(),
                })
            }
            slot = slot => match slot {
                Some(slot) => {
                    through();
                    Ok(Attempt::Go(Some(slot)))
                }
                None => Ok(Attempt::Busy),
            }
        }
    }

    fn holds(&self, resource: &str, candidate: &str) -> bool {
        let held = lock(&self.held);
        held.contains(&self.key(resource, candidate))
    }

    fn key(&self, resource: &str, candidate: &str) -> (String, String, String) {
        (
            self.cx.table().to_owned(),
            resource.to_owned(),
            candidate.to_owned(),
        )
    }

    fn note(&self, resource: &str, candidate: &str, holds: bool) {
        let mut held = lock(&self.held);
        let key = self.key(resource, candidate);
        if holds {
            held.insert(key);
        } else {
            held.remove(&key);
        }
    }

    /// Runs `answer`, an acquire of `resource` by `candidate`, once it has a slot among the
    /// store's attempts (see [`attempt`](Self::attempt); unpolled, it has sent nothing), and
    /// notes what the answer says this process holds.
    pub(crate) async fn attempted(
        &self,
        resource: &str,
        candidate: &str,
        answer: impl std::future::Future<Output = Result<LeaseOutcome, StoreError>>,
    ) -> Result<LeaseOutcome, StoreError> {
        // Waits for a slot only where the process does not hold the lease (a renew never
        // queues behind attempts), and holds it until the answer.
        let _slot = match self.attempt(resource, candidate).await? {
            Attempt::Go(slot) => slot,
            // A try while another acquire of this process asks for the lease: that one gets
            // it if it is free; this one is denied, nothing sent.
            Attempt::Busy => return Ok(LeaseOutcome::Denied(crate::lease::Denial::new(resource))),
        };
        let outcome = self.lease_table(answer.await)?;
        let holds = matches!(
            outcome,
            LeaseOutcome::Acquired(_) | LeaseOutcome::Renewed(_)
        );
        self.note(resource, candidate, holds);
        if let Some(follows) = self.following() {
            follows.answered(&self.cx, resource, candidate, &outcome);
        }
        Ok(outcome)
    }

    /// `candidate` holds `resource` for `remaining` (an answer of this store said so).
    pub(crate) fn holding(&self, resource: &str, candidate: &str, remaining: std::time::Duration) {
        self.note(resource, candidate, true);
        if let Some(follows) = self.following() {
            follows.holding(&self.cx, resource, candidate, remaining);
        }
    }

    /// `candidate`'s hold of `resource` ended (released, offered, lost).
    pub(crate) fn ended(&self, resource: &str, candidate: &str) {
        self.note(resource, candidate, false);
        if let Some(follows) = self.following() {
            follows.ended(&self.cx, resource, candidate);
        }
    }

    fn following(&self) -> Option<&dyn super::wakeups::FollowsLeases> {
        self.wakeups.as_ref()?.following()
    }

    /// A receiver of the table's releases, where the backend has wake-ups.
    pub(crate) fn release_events(&self) -> Option<crate::store::ReleaseEvents> {
        self.wakeups.as_ref()?.subscribe(&self.cx)
    }

    /// A waiter of this process waits for a release of `resources` until `until`: watched
    /// while the guard lives, where the wake-ups follow leases.
    pub(crate) fn waiting(
        &self,
        resources: &[std::sync::Arc<str>],
        until: tokio::time::Instant,
    ) -> Option<Box<dyn Send>> {
        self.following()?.waiting(&self.cx, resources, until)
    }

    /// A statement that reads or releases, read to the end on a checked connection.
    pub(crate) async fn plain(&self, stmt: Statement) -> Result<Vec<QueryResult>, StoreError> {
        self.backend.rows(&self.cx, stmt).await
    }

    /// A statement that changes rows: how many, on a checked connection.
    pub(crate) async fn counted(&self, stmt: Statement) -> Result<u64, StoreError> {
        self.backend.count(&self.cx, stmt).await
    }

    /// [`plain`](Self::plain) for a statement on the lease table, once its schema is known to
    /// be this version's ([`ready`](Self::ready)).
    pub(crate) async fn lease_rows(&self, stmt: Statement) -> Result<Vec<QueryResult>, StoreError> {
        self.ready().await?;
        self.lease_table(self.plain(stmt).await)
    }

    /// [`counted`](Self::counted) for a statement on the lease table, the same way.
    pub(crate) async fn lease_count(&self, stmt: Statement) -> Result<u64, StoreError> {
        self.ready().await?;
        self.lease_table(self.counted(stmt).await)
    }

    /// The acquire-or-renew statement of this backend, rendered once.
    pub(crate) fn acquire_prepared(&self) -> Result<&Prepared, StoreError> {
        self.backend.acquire_prepared(&self.cx)
    }

    /// Checks, once per store and table, that the lease table has every column this version's
    /// migrations give it (one read that names the last step's columns and returns nothing):
    /// a table made by an earlier version is refused with [`StoreError::OutdatedSchema`]
    /// naming the step, before anything else is sent. A refusal is not remembered: the next
    /// call looks again, so the migration can run while the application does.
    pub(crate) async fn ready(&self) -> Result<(), StoreError> {
        self.cx
            .schema_checked
            .get_or_try_init(|| async {
                let probe = self
                    .cx
                    .build(&statements::payload_probe(&self.cx.table_iden()));
                let found = self.backend.rows(&self.cx, probe).await;
                self.lease_table(found).map(|_| ())
            })
            .await
            .copied()
    }

    #[cfg(feature = "jobs")]
    /// Whether `err` says a table the statement named does not exist.
    pub(crate) fn missing_table(&self, err: &sea_orm::DbErr) -> bool {
        self.cx.kind(err) == Kind::MissingTable
    }

    #[cfg(feature = "jobs")]
    /// Whether the server refused the statement for what it is: a table or column not there,
    /// a grant missing, a form it does not run (SQLSTATE classes `42` and `0A` on PostgreSQL
    /// and MySQL/MariaDB). Anything else (no answer, a timeout, a conflict, a server going
    /// read-only or shutting down) is the moment's, and may go well the next time.
    pub(crate) fn refused_statement(&self, err: &sea_orm::DbErr) -> bool {
        if matches!(self.cx.kind(err), Kind::MissingTable | Kind::UnknownColumn) {
            return true;
        }
        #[cfg(sqlx_driver)]
        {
            // SQLite's codes are numbers of at most four digits: never a five-character class.
            super::errors::database_error(err)
                .and_then(|e| e.code())
                .is_some_and(|code| {
                    code.len() == 5 && (code.starts_with("42") || code.starts_with("0A"))
                })
        }
        #[cfg(not(sqlx_driver))]
        {
            false
        }
    }

    /// Whether `err`, a database error, says a column the statement named does not exist.
    pub(crate) fn unknown_column_in(&self, err: &crate::error::BackendError) -> bool {
        matches!(err, crate::error::BackendError::SeaOrm(e) if self.cx.kind(e) == Kind::UnknownColumn)
    }

    /// `result` of a statement on the lease table; an unknown column there means the table
    /// lost the columns of its last migration step (it was undone by hand), said as such.
    pub(crate) fn lease_table<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        match result {
            Err(StoreError::Database(source)) if self.unknown_column_in(&source) => {
                tracing::warn!(
                    table = %self.cx.table(),
                    error = %source,
                    "the lease table lacks columns this version needs"
                );
                Err(StoreError::OutdatedSchema {
                    table: self.cx.table().to_owned(),
                    migration: LEASE_TABLE_LAST_STEP,
                    source,
                })
            }
            other => other,
        }
    }

    /// The release statement of this backend, rendered once.
    pub(crate) fn release_prepared(&self) -> Result<&Prepared, StoreError> {
        self.cx.cached(&self.cx.prepared.release, |r, c, _| {
            Ok(self.backend.release_statement(&self.cx, r, c))
        })
    }

    /// Runs a release statement: whether it released a lease.
    pub(crate) async fn run_release(&self, stmt: Statement) -> Result<bool, StoreError> {
        if self.backend.release_returns_rows() {
            Ok(!self.lease_rows(stmt).await?.is_empty())
        } else {
            Ok(self.lease_count(stmt).await? > 0)
        }
    }

    /// The stored row of `resource`, read with a plain statement.
    pub(crate) async fn read_row(&self, resource: &str) -> Result<Option<Row>, StoreError> {
        self.ready().await?;
        self.lease_table(self.backend.read_row(&self.cx, resource).await)
    }
}
