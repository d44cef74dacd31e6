//! The PostgreSQL backend: every deciding statement checked to have committed on its own
//! (`checked`), or, behind a transaction-pooling proxy, sent unnamed in a transaction of its
//! own; release notifications; the fence's session marker and the takeover that finds it.

use async_trait::async_trait;
use sea_orm::sea_query::{SelectStatement, UpdateStatement};
use sea_orm::sqlx::PgPool;
use sea_orm::{
    DatabaseConnection, DatabaseConnectionType, DbBackend, DbErr, QueryResult, Statement,
};

use super::checked::{self, Pool, Transaction};
use super::notify::{self, HubCell};
use super::statements::{RENEW_TRANSACTION_START_COLUMN, TRANSACTION_START_COLUMN};
use super::{errors, statements, takeover, Postgres};
use crate::backend::context::Context;
use crate::backend::dialect::Dialect;
use crate::backend::driver::{Derived, LeaseBackend, RawConn, Taken, Takeover};
use crate::backend::errors::Classifier;
use crate::backend::row::{Decode as _, Row};
use crate::backend::sessions::{Begin, Checked};
use crate::backend::sessions::{OwnPool, Setup};
use crate::error::FenceError;
use crate::fencing::Term;
use crate::{error::StoreError, lease::Denial, lease::LeaseOutcome};

/// How the store's own sessions are made like the application's (see `sessions`): its
/// `search_path` (SeaORM's `set_schema_search_path` sets it in an `after_connect` hook), so an
/// unqualified table name means the same table on both.
const OWN_SESSIONS: Setup<sea_orm::sqlx::Postgres> = Setup {
    // One simple-protocol message, checked like every read on the application's pool: a
    // connection inside a transaction somebody left (whose `SET LOCAL` would be read) fails the
    // read, and is closed.
    read: |conn| {
        Box::pin(async move {
            use sea_orm::sqlx::Row;
            let rows = sea_orm::sqlx::raw_sql(
                "SELECT current_setting('search_path'), \
                 transaction_timestamp() = statement_timestamp()",
            )
            .fetch_all(conn)
            .await?;
            let row = rows.last().ok_or(sea_orm::sqlx::Error::RowNotFound)?;
            let outside: bool = row.try_get(1)?;
            if !outside {
                return Err(sea_orm::sqlx::Error::Protocol(
                    "the connection read for the search_path was inside a transaction".into(),
                ));
            }
            Ok(vec![("search_path".to_owned(), row.try_get(0)?)])
        })
    },
    apply: |conn, settings| {
        Box::pin(async move {
            for (name, value) in settings {
                sea_orm::sqlx::query("SELECT set_config($1, $2, false)")
                    .bind(name.as_str())
                    .bind(value.as_str())
                    .execute(&mut *conn)
                    .await?;
            }
            Ok(())
        })
    },
};

/// The PostgreSQL backend of one store.
pub(crate) struct PgBackend {
    /// The application's pool, where the store can take one connection and check it; `None`
    /// for connections it cannot (SeaORM's mock and proxy connections).
    pool: Option<PgPool>,
    /// The store's own sessions for its lease statements (`sessions`); `None` when told to
    /// use the application's pool.
    own: Option<OwnPool<sea_orm::sqlx::Postgres>>,
    /// The connection goes through a transaction-pooling proxy.
    transaction_pooling: bool,
    /// Whether release events may listen for notifications.
    notifications: bool,
    /// The release listener, started on first subscription.
    releases: HubCell,
}

impl PgBackend {
    pub(crate) fn new(
        db: &DatabaseConnection,
        transaction_pooling: bool,
        notifications: bool,
        lease_connections: usize,
    ) -> Self {
        let pool = match &db.inner {
            DatabaseConnectionType::SqlxPostgresPoolConnection(_) => {
                Some(db.get_postgres_connection_pool().clone())
            }
            _ => None,
        };
        let own = pool
            .as_ref()
            .and_then(|pool| OwnPool::new(pool, lease_connections, OWN_SESSIONS));
        Self {
            pool,
            own,
            transaction_pooling,
            notifications,
            releases: HubCell::default(),
        }
    }

    fn checked(&self) -> Option<Pool<'_>> {
        self.pool.as_ref().map(|pool| Pool {
            pool,
            own: self.own.as_ref(),
            transaction_pooling: self.transaction_pooling,
        })
    }

    /// Runs a deciding statement, read to the end, known to have committed on its own (its
    /// rows carry `transaction_timestamp()` at `start_column`).
    async fn deciding(
        &self,
        cx: &Context,
        stmt: Statement,
        start_column: usize,
    ) -> Result<Vec<QueryResult>, StoreError> {
        let Some(pool) = self.checked() else {
            return cx.read_to_end(stmt).await;
        };
        if self.transaction_pooling {
            return cx
                .autocommitted(|| checked::in_transaction(pool.pool, &stmt))
                .await;
        }
        cx.autocommitted(|| checked::deciding(pool.source(), &stmt, start_column))
            .await
    }
}

#[async_trait]
impl LeaseBackend for PgBackend {
    fn name(&self) -> &'static str {
        "PostgreSQL"
    }

    fn dialect(&self) -> &'static dyn Dialect {
        &Postgres
    }

    fn db_backend(&self) -> DbBackend {
        DbBackend::Postgres
    }

    fn classifier(&self) -> Classifier {
        errors::kind
    }

    fn derived(&self, derived: Derived) -> Box<dyn LeaseBackend> {
        let own = OwnPool::derived(
            self.own.as_ref(),
            self.pool.as_ref(),
            derived.lease_connections,
            OWN_SESSIONS,
        );
        Box::new(Self {
            pool: self.pool.clone(),
            own,
            transaction_pooling: derived.transaction_pooling,
            notifications: derived.notifications,
            // A listener filters by table name.
            releases: if derived.table_changed {
                HubCell::default()
            } else {
                self.releases.clone()
            },
        })
    }

    fn acquire_statement(
        &self,
        cx: &Context,
        resource: &str,
        candidate: &str,
        millis: i64,
        payload: Option<&str>,
    ) -> Result<Statement, DbErr> {
        statements::upsert_reporting(
            cx.dialect,
            &cx.table_iden(),
            resource,
            candidate,
            millis,
            payload,
        )
        .map(|q| cx.build(&q))
    }

    // The release and the wake-up of the followers (`pg_notify`), in one statement.
    fn release_statement(&self, cx: &Context, resource: &str, candidate: &str) -> Statement {
        cx.build(&statements::release_notifying(
            cx.dialect,
            &cx.table_iden(),
            cx.table(),
            resource,
            candidate,
        ))
    }

    fn release_lease_statement(&self, cx: &Context, update: UpdateStatement) -> Statement {
        cx.build(&statements::notifying(update, cx.table()))
    }

    // The notifying form returns one row per released lease.
    fn release_returns_rows(&self) -> bool {
        true
    }

    /// Acquire-or-renew in one round trip whatever the outcome: the upsert, or the row that
    /// denied it (see `upsert_reporting`).
    async fn acquire_or_renew(
        &self,
        cx: &Context,
        resource: &str,
        candidate: &str,
        millis: i64,
        payload: Option<&str>,
    ) -> Result<LeaseOutcome, StoreError> {
        let stmt = self
            .acquire_prepared(cx)?
            .bind_with(resource, candidate, millis, payload);
        let rows = self.deciding(cx, stmt, TRANSACTION_START_COLUMN).await?;
        // No row: a first insert raced ours and is not in our snapshot.
        let Some(row) = cx.single_row(&rows)? else {
            return Ok(LeaseOutcome::Denied(Denial::new(resource)));
        };
        let granted: bool = row
            .try_get_by_index(6)
            .map_err(|source| cx.decode_error(source))?;
        let decoded = Row::decode(row).map_err(|source| cx.decode_error(source))?;
        Ok(if granted {
            decoded.outcome(resource, candidate)
        } else {
            // The report comes from the statement's snapshot: it can even name us.
            LeaseOutcome::Denied(decoded.denial_for(resource, candidate))
        })
    }

    async fn renew_all(
        &self,
        cx: &Context,
        json: String,
        millis: i64,
    ) -> Result<Vec<QueryResult>, StoreError> {
        let update = statements::renew_all(cx.dialect, &cx.table_iden(), json, millis);
        self.deciding(cx, cx.build(&update), RENEW_TRANSACTION_START_COLUMN)
            .await
    }

    fn renew_statements(
        &self,
        cx: &Context,
        json: String,
        millis: i64,
    ) -> Result<Vec<Statement>, DbErr> {
        let update = statements::renew_all(cx.dialect, &cx.table_iden(), json, millis);
        Ok(vec![cx.build(&update)])
    }

    fn own_sessions(&self) -> usize {
        if self.transaction_pooling {
            return 0; // every statement goes through the application's pool
        }
        self.own.as_ref().map_or(0, OwnPool::max)
    }

    fn solo_wait(&self, millis: i64) -> std::time::Duration {
        crate::backend::first_wait(millis)
    }

    async fn renew_bounded(
        &self,
        cx: &Context,
        json: String,
        millis: i64,
    ) -> Result<Vec<QueryResult>, StoreError> {
        let update = statements::renew_bounded(cx.dialect, &cx.table_iden(), json, millis);
        self.deciding(cx, cx.build(&update), RENEW_TRANSACTION_START_COLUMN)
            .await
    }

    async fn rows(&self, cx: &Context, stmt: Statement) -> Result<Vec<QueryResult>, StoreError> {
        match self.checked() {
            None => cx.read_to_end(stmt).await,
            Some(pool) => cx.autocommitted(|| pool.checked_rows(&stmt)).await,
        }
    }

    async fn count(&self, cx: &Context, stmt: Statement) -> Result<u64, StoreError> {
        match self.checked() {
            Some(pool) => cx.autocommitted(|| pool.checked_count(&stmt)).await,
            None => cx.execute(stmt).await,
        }
    }

    /// On a pooled connection checked to be outside any transaction: a connection inside an
    /// abandoned one is closed rather than have its `BEGIN` join that transaction, and a call
    /// dropped before `COMMIT` closes the connection rather than hand it back mid-transaction.
    async fn revoke(
        &self,
        cx: &Context,
        _resource: &str,
        read: Statement,
        update: Statement,
    ) -> Result<Option<QueryResult>, StoreError> {
        let Some(pool) = self.checked() else {
            return cx.revoke_in(None, &read, &update).await;
        };
        cx.autocommitted(|| async {
            let Some(mut txn) = Transaction::begin(pool, Begin::ReadWrite).await? else {
                return Ok(Checked::InAbandonedTransaction);
            };
            let row = txn.read_all(&read).await?.into_iter().next();
            if row.is_some() {
                txn.execute(&update).await?;
            }
            txn.commit().await?;
            Ok(Checked::Committed(row))
        })
        .await
    }

    /// Release notifications (`LISTEN`), off behind a transaction-pooling proxy.
    fn wakeups(&self) -> Option<crate::backend::wakeups::Wakeups> {
        if !self.notifications || self.transaction_pooling {
            return None;
        }
        Some(crate::backend::wakeups::Wakeups::Events(
            std::sync::Arc::new(notify::Notifications(self.releases.clone())),
        ))
    }

    /// `SELECT ... FOR SHARE`, with the session's marker (see `takeover`).
    async fn fence(
        &self,
        cx: &Context,
        conn: &dyn RawConn,
        term: &Term<'_>,
    ) -> Result<bool, StoreError> {
        let stmt = takeover::locking_check(cx.dialect, &cx.table_iden(), term);
        // Read to the end, like every statement that decides something.
        let rows = conn.query_all(&stmt).await.map_err(|e| cx.classify(e))?;
        Ok(!rows.is_empty())
    }

    fn statement_fence(
        &self,
        cx: &Context,
        term: &Term<'_>,
    ) -> Result<SelectStatement, FenceError> {
        Ok(takeover::statement_fence(
            cx.dialect,
            &cx.table_iden(),
            term,
        ))
    }

    fn durability_question(&self) -> (&'static str, &'static [&'static str]) {
        (
            "SELECT current_setting('fsync') AS a, current_setting('synchronous_commit') AS b",
            &["fsync", "synchronous_commit"],
        )
    }

    fn takeover(&self) -> Takeover {
        Takeover::WhileWaiting
    }

    fn lock_wait_ran_out(&self, err: &DbErr) -> bool {
        crate::backend::errors::sqlx_error(err).is_some_and(errors::lock_wait_ran_out)
    }

    fn takeover_refused(&self, err: &DbErr) -> bool {
        errors::refusal(err)
    }

    /// One statement (see `takeover`), on an idle session of the store's own if one is free at
    /// once, else on the application's pool (checked): it runs while the acquire it serves
    /// waits on one of the store's sessions, and must not queue behind the store's other calls.
    async fn end_lapsed_holders(
        &self,
        cx: &Context,
        resource: &str,
        waited: std::time::Duration,
    ) -> Result<Taken, StoreError> {
        let idle_ms = i64::try_from(waited.as_millis()).unwrap_or(i64::MAX);
        let stmt = cx.build(&takeover::takeover(
            cx.dialect,
            &cx.table_iden(),
            resource,
            idle_ms,
        ));
        let rows = match self.checked() {
            Some(pool) => cx.autocommitted(|| pool.rows_beside(&stmt)).await?,
            None => cx.read_to_end(stmt).await?,
        };
        let mut taken = Taken::default();
        for row in rows {
            let signalled: bool = row
                .try_get_by_index(0)
                .map_err(|source| cx.decode_error(source))?;
            let hidden: bool = row
                .try_get_by_index(1)
                .map_err(|source| cx.decode_error(source))?;
            taken.ended += u64::from(signalled);
            if hidden {
                taken.unseen = Some(
                    "pg_read_all_stats (the server hides another role's session state), and \
                     pg_signal_backend to end it",
                );
            }
        }
        Ok(taken)
    }
}
