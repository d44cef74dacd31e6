//! The backend trait: what each backend's folder implements, once, for the store to call
//! without asking which backend it is on (like sqlx's `AnyConnectionBackend`). A store picks
//! its backend once, from its connection (`store.rs`); each implementation owns its statements,
//! its checks of pooled connections, its fence, its takeover and its error codes.

use std::time::Duration;

use async_trait::async_trait;
use sea_orm::sea_query::{SelectStatement, UpdateStatement};
use sea_orm::{ConnectionTrait, DbBackend, DbErr, ExecResult, QueryResult, Statement};

use super::context::Context;
use super::dialect::Dialect;
use super::errors::Classifier;
use super::prepared::{Prepared, PAYLOAD};
use super::row::{first_row, Row};
use super::statements;
use crate::error::FenceError;
use crate::fencing::Term;
use crate::{error::StoreError, lease::LeaseOutcome};

/// How a backend ends the session of a lapsed term that holds the lease row locked (see
/// `takeover`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)] // which variants a build makes depends on the backends it compiles
pub(crate) enum Takeover {
    /// No sessions to end (SQLite).
    None,
    /// While the acquire waits, since the server names a blocker only of a waiting statement
    /// (PostgreSQL, MySQL, MariaDB).
    WhileWaiting,
}

/// What a takeover's look did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Taken {
    /// How many sessions it ended.
    pub(crate) ended: u64,
    /// A lapsed term's session blocked the wait, but the server hides what it is doing from
    /// this role, so the store cannot tell it is stalled: which privilege would show it.
    pub(crate) unseen: Option<&'static str>,
}

/// What a builder call changed on a store whose backend exists already.
#[derive(Debug, Clone, Copy)]
#[allow(dead_code)] // only PostgreSQL's backend reads them
pub(crate) struct Derived {
    /// PostgreSQL: the connection goes through a transaction-pooling proxy.
    pub(crate) transaction_pooling: bool,
    /// Whether release events may listen for notifications.
    pub(crate) notifications: bool,
    /// The lease table changed (statements and listeners made for the old one go).
    pub(crate) table_changed: bool,
    /// PostgreSQL, MySQL/MariaDB: the most sessions of its own the store opens for its lease
    /// statements (0: it uses the application's pool, checked).
    pub(crate) lease_connections: usize,
}

/// One backend of [`SeaOrmLeaseStore`](crate::SeaOrmLeaseStore).
#[async_trait]
pub(crate) trait LeaseBackend: Send + Sync + 'static {
    /// `"PostgreSQL"`, `"MySQL"`, `"SQLite"`.
    fn name(&self) -> &'static str;
    /// The backend's clock and value forms.
    fn dialect(&self) -> &'static dyn Dialect;
    /// SeaORM's name for the backend.
    fn db_backend(&self) -> DbBackend;
    /// How the backend sorts its driver's errors.
    fn classifier(&self) -> Classifier;

    /// The same backend for a store a builder derived from this one: what it detected (and its
    /// release listener, unless the table changed) shared with it, its settings `derived`.
    fn derived(&self, derived: Derived) -> Box<dyn LeaseBackend>;

    /// The acquire-or-renew statement (for MySQL/MariaDB, the `RETURNING` form), for
    /// [`Prepared`](super::prepared::Prepared) to render once.
    fn acquire_statement(
        &self,
        cx: &Context,
        resource: &str,
        candidate: &str,
        millis: i64,
        payload: Option<&str>,
    ) -> Result<Statement, DbErr>;

    /// [`acquire_statement`](Self::acquire_statement), rendered once per store (bind the
    /// payload with [`Prepared::bind_with`]).
    fn acquire_prepared<'c>(&self, cx: &'c Context) -> Result<&'c Prepared, StoreError> {
        cx.cached(&cx.prepared.acquire, |r, c, m| {
            self.acquire_statement(cx, r, c, m, Some(PAYLOAD))
        })
    }

    /// The release of `resource` by `candidate` (placeholders, rendered once).
    fn release_statement(&self, cx: &Context, resource: &str, candidate: &str) -> Statement {
        cx.build(&statements::release(
            cx.dialect,
            &cx.table_iden(),
            resource,
            candidate,
        ))
    }

    /// The release of one exact lease, from its write.
    fn release_lease_statement(&self, cx: &Context, update: UpdateStatement) -> Statement {
        cx.build(&update)
    }

    /// Whether a release statement answers with a row per released lease (rather than a
    /// count of changed rows).
    fn release_returns_rows(&self) -> bool {
        false
    }

    /// One acquire-or-renew, read to the end and known to have committed; a grant writes
    /// `payload` (`None` clears it).
    async fn acquire_or_renew(
        &self,
        cx: &Context,
        resource: &str,
        candidate: &str,
        millis: i64,
        payload: Option<&str>,
    ) -> Result<LeaseOutcome, StoreError>;

    /// The batch renew of the leases in `json`: the rows it renewed,
    /// once committed. Where the backend locks rows, it never waits for one: a row another
    /// transaction holds (a holder's own fenced transaction) is left out, and renewed on its
    /// own by [`renew_bounded`](Self::renew_bounded); and it never locks a row that is not
    /// one of the batch's.
    async fn renew_all(
        &self,
        cx: &Context,
        json: String,
        millis: i64,
    ) -> Result<Vec<QueryResult>, StoreError>;

    /// The statements [`renew_all`](Self::renew_all) sends for the batch `json`, in order: for
    /// `EXPLAIN`, audits and tests.
    fn renew_statements(
        &self,
        cx: &Context,
        json: String,
        millis: i64,
    ) -> Result<Vec<Statement>, DbErr>;

    /// How many sessions of its own the store may open for its lease statements (0: it uses
    /// the application's pool).
    fn own_sessions(&self) -> usize {
        0
    }

    /// The longest a [`renew_bounded`](Self::renew_bounded) for a lease of `millis` waits for
    /// its row.
    fn solo_wait(&self, _millis: i64) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    /// The renew of one lease the batch left out (`json` names one): its wait for the row
    /// bounded as a single renew's upsert's is ([`solo_wait`](Self::solo_wait)), then the
    /// server's error. The default is the
    /// batch itself (SQLite: one write lock, which a single renew waits for too).
    async fn renew_bounded(
        &self,
        cx: &Context,
        json: String,
        millis: i64,
    ) -> Result<Vec<QueryResult>, StoreError> {
        self.renew_all(cx, json, millis).await
    }

    /// Whether electors may renew in batches here (see `hold::renewer`): only where a
    /// batch's wait for a locked row is bounded.
    fn batches_renewals(&self) -> bool {
        true
    }

    /// A statement that reads or releases (not one that grants), read to the end, on a
    /// connection checked to be outside any abandoned transaction where the backend has
    /// sessions.
    async fn rows(&self, cx: &Context, stmt: Statement) -> Result<Vec<QueryResult>, StoreError> {
        cx.read_to_end(stmt).await
    }

    /// The stored row of `resource`, read with a plain statement sent as [`rows`](Self::rows)
    /// sends one (on the backend's own checked sessions).
    async fn read_row(&self, cx: &Context, resource: &str) -> Result<Option<Row>, StoreError> {
        first_row(cx, self.rows(cx, cx.current_statement(resource)?).await?)
    }

    /// A statement that changes rows (not one that grants): how many, checked as
    /// [`rows`](Self::rows).
    async fn count(&self, cx: &Context, stmt: Statement) -> Result<u64, StoreError> {
        cx.execute(stmt).await
    }

    /// A rate-limit decision (see `rate_limits`): the row it left, read to the end and known
    /// to have committed. By default the upsert with `RETURNING`, as [`rows`](Self::rows)
    /// sends a statement.
    async fn rate_decision(
        &self,
        cx: &Context,
        decision: &super::rate_limits::RateDecision<'_>,
    ) -> Result<Vec<QueryResult>, StoreError> {
        self.rows(cx, decision.returning(cx)?).await
    }

    /// The statements [`rate_decision`](Self::rate_decision) sends, in order.
    fn rate_statements(
        &self,
        cx: &Context,
        decision: &super::rate_limits::RateDecision<'_>,
    ) -> Result<Vec<Statement>, StoreError> {
        Ok(vec![decision.returning(cx)?])
    }

    /// The revoke's read and update in one transaction: the row before the revoke.
    async fn revoke(
        &self,
        cx: &Context,
        _resource: &str,
        read: Statement,
        update: Statement,
    ) -> Result<Option<QueryResult>, StoreError> {
        cx.revoke_in(None, &read, &update).await
    }

    /// The backend's wake-ups, where it has them and they can work on this connection (see
    /// `wakeups`); made when the backend is chosen or derived.
    fn wakeups(&self) -> Option<super::wakeups::Wakeups>;

    /// The transactional fence inside the caller's transaction: whether `term` is current
    /// (and its lease row now held against a takeover until the transaction ends).
    async fn fence(
        &self,
        cx: &Context,
        conn: &dyn RawConn,
        term: &Term<'_>,
    ) -> Result<bool, StoreError>;

    /// The subquery of the statement-level fence, or why this store cannot give one.
    fn statement_fence(&self, cx: &Context, term: &Term<'_>)
        -> Result<SelectStatement, FenceError>;

    /// Whether the statement-level fence must not run on `conn` (a Galera node), asked on it.
    async fn refuses_statement_fence(
        &self,
        _cx: &Context,
        _conn: &dyn RawConn,
    ) -> Result<bool, StoreError> {
        Ok(false)
    }

    /// The read of the server's durability settings, and the settings it returns in order.
    fn durability_question(&self) -> (&'static str, &'static [&'static str]);

    /// How a stalled holder's session is ended.
    fn takeover(&self) -> Takeover {
        Takeover::None
    }

    /// Whether the statement behind `err` gave up waiting for a lock.
    fn lock_wait_ran_out(&self, _err: &DbErr) -> bool {
        false
    }

    /// Whether a takeover failed because the server will not do it for this role.
    fn takeover_refused(&self, _err: &DbErr) -> bool {
        false
    }

    /// Ends the session that blocks a wait on `resource`'s row for a lapsed term, if it has
    /// been stalled (idle in its transaction, or in one statement) at least `waited`, the time
    /// the acquire's statement has waited; how many it ended.
    async fn end_lapsed_holders(
        &self,
        _cx: &Context,
        _resource: &str,
        _waited: Duration,
    ) -> Result<Taken, StoreError> {
        Ok(Taken::default())
    }
}

/// The caller's connection or transaction, as a backend's fence uses it. SeaORM's
/// `ConnectionTrait` has generic methods, so it cannot be called through `dyn`: these forward to
/// them (not to the `_raw` forms, which a restricted connection refuses).
#[async_trait]
pub(crate) trait RawConn: Sync {
    /// A statement that changes rows.
    async fn execute(&self, stmt: &UpdateStatement) -> Result<ExecResult, DbErr>;
    /// A read, to the end.
    async fn query_all(&self, stmt: &SelectStatement) -> Result<Vec<QueryResult>, DbErr>;
    /// A question of the server's (MySQL's Galera look), sent as it is.
    #[allow(dead_code)] // a build without MySQL asks none
    async fn query_one_raw(&self, stmt: Statement) -> Result<Option<QueryResult>, DbErr>;
}

/// Any SeaORM connection as a [`RawConn`].
pub(crate) struct Conn<'c, C>(pub(crate) &'c C);

#[async_trait]
impl<C: ConnectionTrait> RawConn for Conn<'_, C> {
    async fn execute(&self, stmt: &UpdateStatement) -> Result<ExecResult, DbErr> {
        self.0.execute(stmt).await
    }
    async fn query_all(&self, stmt: &SelectStatement) -> Result<Vec<QueryResult>, DbErr> {
        self.0.query_all(stmt).await
    }
    async fn query_one_raw(&self, stmt: Statement) -> Result<Option<QueryResult>, DbErr> {
        self.0.query_one_raw(stmt).await
    }
}
