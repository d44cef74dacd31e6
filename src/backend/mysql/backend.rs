//! The MySQL and MariaDB backend: the upsert form detected once per store (`RETURNING` on
//! MariaDB 10.5+, a transaction on MySQL), every statement checked to run outside any
//! abandoned transaction (`checked`), Galera detected for the fence, and the takeover that ends
//! a stalled holder's connection.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sea_orm::sea_query::SelectStatement;
use sea_orm::sqlx::{MySql as MySqlDb, MySqlPool};
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseConnectionType, DbBackend, DbErr, QueryResult,
    Statement, TransactionTrait,
};

use super::checked::{self, Transaction};
use super::errors::{self, error_number, UNKNOWN_SYSTEM_VARIABLE};
use super::statements::IN_TRANSACTION_COLUMN;
use super::takeover::{blockers, still_there, transactions_now, KILL_WITHIN};
use super::wakeups::HubCell;
use super::{statements, MySql, MySqlUpsert};
use crate::backend::context::Context;
use crate::backend::dialect::Dialect;
use crate::backend::driver::{Derived, LeaseBackend, RawConn, Taken, Takeover};
use crate::backend::errors::Classifier;
use crate::backend::row::{Decode as _, Row};
use crate::backend::sessions::{Begin, Checked, Source};
use crate::backend::sessions::{OwnPool, Setup};
use crate::backend::statements as shared;
use crate::backend::term_checks::statement_check;
use crate::error::FenceError;
use crate::fencing::Term;
use crate::{error::StoreError, lease::LeaseOutcome};

mod transaction;
use transaction::committed_as_read;

mod galera;

mod batch;

mod upsert;

mod source;

/// The MySQL/MariaDB backend of one store.
pub(crate) struct MySqlBackend {
    /// The application's pool, where the store can take one connection and check it; `None`
    /// for connections it cannot (SeaORM's mock and proxy connections).
    pool: Option<MySqlPool>,
    /// The store's own sessions for its lease statements (`sessions`); `None` when told to
    /// use the application's pool.
    own: Option<OwnPool<sea_orm::sqlx::MySql>>,
    /// Which upsert form the server takes, detected once (or set).
    upsert: Arc<tokio::sync::OnceCell<MySqlUpsert>>,
    /// Whether the server is a Galera cluster node, detected once.
    galera: Arc<tokio::sync::OnceCell<bool>>,
    /// Wake-ups through named locks (see `wakeups`); `None` with notifications off.
    wakeups: Option<HubCell>,
}

/// How the store's own sessions are made like the application's (see `sessions`): the
/// settings that bear on its statements, copied; autocommit on whatever the server's default
/// (`autocommit = 0`, or an `init_connect`), so each statement commits when it ends.
const OWN_SESSIONS: Setup<MySqlDb> = Setup {
    read: |conn| {
        Box::pin(async move {
            sea_orm::sqlx::query_as::<_, (String, String)>(
                "SHOW SESSION VARIABLES WHERE Variable_name IN ('sql_mode', 'tx_isolation', \
                 'transaction_isolation', 'innodb_lock_wait_timeout', 'wsrep_sync_wait')",
            )
            .fetch_all(conn)
            .await
        })
    },
    apply: |conn, settings| {
        Box::pin(async move {
            sea_orm::sqlx::raw_sql("SET SESSION autocommit = 1")
                .execute(&mut *conn)
                .await?;
            for (name, value) in settings {
                // The statement for each name we read; the value bound, never spliced in.
                let sql = match name.as_str() {
                    "sql_mode" => "SET SESSION sql_mode = ?",
                    "tx_isolation" => "SET SESSION tx_isolation = ?",
                    "transaction_isolation" => "SET SESSION transaction_isolation = ?",
                    "innodb_lock_wait_timeout" => {
                        "SET SESSION innodb_lock_wait_timeout = CAST(? AS UNSIGNED)"
                    }
                    "wsrep_sync_wait" => "SET SESSION wsrep_sync_wait = CAST(? AS UNSIGNED)",
                    _ => continue,
                };
                // A server that refuses one (a proxy's other server, another version) keeps
                // its own value: the session still works, in autocommit.
                if let Err(error) = sea_orm::sqlx::query(sql)
                    .bind(value.as_str())
                    .execute(&mut *conn)
                    .await
                {
                    if !matches!(error, sea_orm::sqlx::Error::Database(_)) {
                        return Err(error);
                    }
                    tracing::warn!(
                        %error,
                        setting = %name,
                        "a session of the store's own refused the application's setting"
                    );
                }
            }
            Ok(())
        })
    },
};

const GALERA_QUESTION: &str = "SELECT CAST(@@GLOBAL.wsrep_on AS SIGNED)";

impl MySqlBackend {
    /// Whether a lease of `millis` the batch left out is renewed with a wait in the server's
    /// lock queue ([`statements::Busy::Wait`]): on a server known to take `SET STATEMENT`
    /// (the `RETURNING` form), for leases whose fifth is at least the server's one second.
    fn solo_waits_on_server(&self, millis: i64) -> bool {
        let second = i64::try_from(statements::LOCK_WAIT_SECONDS * 1000).unwrap_or(i64::MAX);
        self.upsert.get() == Some(&MySqlUpsert::Returning) && millis / 5 >= second
    }

    pub(crate) fn new(
        db: &DatabaseConnection,
        upsert: Option<MySqlUpsert>,
        notifications: bool,
        lease_connections: usize,
    ) -> Self {
        let pool = match &db.inner {
            DatabaseConnectionType::SqlxMySqlPoolConnection(_) => {
                Some(db.get_mysql_connection_pool().clone())
            }
            _ => None,
        };
        let own = pool
            .as_ref()
            .and_then(|pool| OwnPool::new(pool, lease_connections, OWN_SESSIONS));
        Self {
            pool,
            own,
            upsert: Arc::new(tokio::sync::OnceCell::new_with(upsert)),
            galera: Arc::default(),
            wakeups: notifications.then(HubCell::default),
        }
    }
}

#[async_trait]
impl LeaseBackend for MySqlBackend {
    fn name(&self) -> &'static str {
        "MySQL"
    }

    fn dialect(&self) -> &'static dyn Dialect {
        &MySql
    }

    fn db_backend(&self) -> DbBackend {
        DbBackend::MySql
    }

    fn classifier(&self) -> Classifier {
        errors::kind
    }

    fn derived(&self, derived: Derived) -> Box<dyn LeaseBackend> {
        // The wake-ups name one table's leases.
        let wakeups = match (&self.wakeups, derived.notifications) {
            (_, false) => None,
            (Some(cell), true) if !derived.table_changed => Some(cell.clone()),
            (_, true) => Some(HubCell::default()),
        };
        let own = OwnPool::derived(
            self.own.as_ref(),
            self.pool.as_ref(),
            derived.lease_connections,
            OWN_SESSIONS,
        );
        Box::new(Self {
            pool: self.pool.clone(),
            own,
            upsert: Arc::clone(&self.upsert),
            galera: Arc::clone(&self.galera),
            wakeups,
        })
    }

    /// Wake-ups through the holders' named locks (see `wakeups`), off on a Galera node.
    fn wakeups(&self) -> Option<crate::backend::wakeups::Wakeups> {
        let cell = self.wakeups.clone()?;
        Some(crate::backend::wakeups::Wakeups::Following(Arc::new(
            super::wakeups::NamedLocks::new(cell, Arc::clone(&self.galera)),
        )))
    }

    fn acquire_statement(
        &self,
        cx: &Context,
        resource: &str,
        candidate: &str,
        millis: i64,
        payload: Option<&str>,
    ) -> Result<Statement, DbErr> {
        statements::upsert_returning(&cx.table_iden(), resource, candidate, millis, payload)
    }

    /// The row after the upsert is the outcome, whoever holds the lease.
    async fn acquire_or_renew(
        &self,
        cx: &Context,
        resource: &str,
        candidate: &str,
        millis: i64,
        payload: Option<&str>,
    ) -> Result<LeaseOutcome, StoreError> {
        let rows = self
            .upsert(cx, resource, candidate, millis, payload)
            .await?;
        // Galera is known from the first grant on, whatever the upsert form (also one set with
        // `with_mysql_upsert`): the statement-level fence refuses to run there, and `fenced_by`
        // cannot ask the server. A failed look is not cached and does not fail the grant; the
        // next grant looks again.
        if self.galera.get().is_none() {
            match self.galera_on_pool(cx).await {
                Ok(true) => {
                    // Named locks stay on their node: no wake-ups.
                    if let Some(w) = &self.wakeups {
                        w.turn_off();
                    }
                }
                Ok(false) => {}
                Err(error) => {
                    tracing::debug!(%error, "Galera detection deferred to the next grant");
                }
            }
        }
        let Some(row) = cx.single_row(&rows)? else {
            // The upsert always leaves a row, and a transaction reads its own writes: no row,
            // the same after the COMMIT (see `committed_as_read`), means the transaction was
            // rolled back under the statements (seen on Galera, the Transaction form). Not a
            // grant, and retryable.
            tracing::warn!(
                table = cx.table(),
                resource,
                "the upserted lease row was not there to read in its own transaction (rolled \
                 back under it); not a grant"
            );
            return Err(StoreError::Conflict {
                source: DbErr::RecordNotFound(
                    "the upserted lease row, in its own transaction: the transaction was rolled \
                     back under it (a Galera brute-force abort?)"
                        .to_owned(),
                )
                .into(),
            });
        };
        let decoded = Row::decode(row).map_err(|source| cx.decode_error(source))?;
        Ok(decoded.outcome(resource, candidate))
    }

    /// The batch renew and the read of what it renewed, in one transaction; the rows once it
    /// has committed.
    /// Not here: electors renew lease by lease on MySQL/MariaDB, one statement each, where a
    /// batch is a transaction of several round trips.
    fn batches_renewals(&self) -> bool {
        false
    }

    async fn renew_all(
        &self,
        cx: &Context,
        json: String,
        millis: i64,
    ) -> Result<Vec<QueryResult>, StoreError> {
        self.renew_batch(cx, json, millis, statements::Busy::Skip)
            .await
    }

    /// The locking read, the update and the read of what it renewed; the update sent names
    /// only the rows the locking read returned.
    fn renew_statements(
        &self,
        cx: &Context,
        json: String,
        millis: i64,
    ) -> Result<Vec<Statement>, DbErr> {
        let table = cx.table_iden();
        Ok(vec![
            statements::lock_batch(&table, json.clone(), statements::Busy::Skip)?,
            statements::renew_all(&table, json.clone(), millis)?,
            DbBackend::MySql.build(&statements::renewed(&table, json)),
        ])
    }

    fn own_sessions(&self) -> usize {
        self.own.as_ref().map_or(0, OwnPool::max)
    }

    fn solo_wait(&self, millis: i64) -> Duration {
        if self.solo_waits_on_server(millis) {
            Duration::from_secs(statements::LOCK_WAIT_SECONDS)
        } else {
            crate::backend::first_wait(millis)
        }
    }

    /// One lease the batch left out. MariaDB (the `RETURNING` form, whose server has
    /// `SET STATEMENT`) with a lease of 5 s or more: its row waited for at most
    /// [`statements::LOCK_WAIT_SECONDS`] in the server's lock queue, as a single renew's upsert
    /// waits (the server counts whole seconds, too long for a shorter lease). Otherwise
    /// `NOWAIT`, asked again every 20 ms for the first wait (a fifth of the lease, at most
    /// 200 ms); then the row's error.
    async fn renew_bounded(
        &self,
        cx: &Context,
        json: String,
        millis: i64,
    ) -> Result<Vec<QueryResult>, StoreError> {
        if self.solo_waits_on_server(millis) {
            return self
                .renew_batch(cx, json, millis, statements::Busy::Wait)
                .await;
        }
        let bound = crate::backend::first_wait(millis);
        let started = crate::clock::now();
        loop {
            let answer = self
                .renew_batch(cx, json.clone(), millis, statements::Busy::Fail)
                .await;
            match answer {
                Err(err)
                    if crate::backend::errors::db_err_in(&err).is_some_and(errors::row_busy)
                        && started.elapsed() < bound =>
                {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                answer => return answer,
            }
        }
    }

    async fn rows(&self, cx: &Context, stmt: Statement) -> Result<Vec<QueryResult>, StoreError> {
        self.rows_from(cx, self.source(), stmt).await
    }

    async fn count(&self, cx: &Context, stmt: Statement) -> Result<u64, StoreError> {
        self.count_from(cx, self.source(), stmt).await
    }

    /// MariaDB: the upsert with `RETURNING`, one statement committed on its own (checked as
    /// the acquire's is: read to the end, outside any transaction). MySQL (no `RETURNING`): the
    /// upsert and the read of the row it left in one transaction of the store's own, begun as
    /// the revoke's is. On a Galera cluster (Percona XtraDB Cluster) the row is read again once
    /// the `COMMIT` returned, and a decision is reported only when that read still shows it: a
    /// node can roll a transaction back under its statements with the `COMMIT` answering OK
    /// (see `committed_as_read`). A decision another caller made in between makes that a
    /// conflict too, its permit (if any) unreported: fewer permits, never more.
    async fn rate_decision(
        &self,
        cx: &Context,
        decision: &crate::backend::rate_limits::RateDecision<'_>,
    ) -> Result<Vec<QueryResult>, StoreError> {
        use crate::backend::rate_limits::{decode, not_ours, MARIADB_IN_TRANSACTION_COLUMN};
        if self.form(cx).await? == MySqlUpsert::Returning {
            let stmt = decision.mariadb_returning()?;
            return match self.source() {
                Some(source) => {
                    cx.autocommitted(|| {
                        checked::deciding(source, &stmt, MARIADB_IN_TRANSACTION_COLUMN)
                    })
                    .await
                }
                None => cx.read_to_end(stmt).await,
            };
        }
        let galera = self.galera_on_pool(cx).await?;
        let (upsert, read) = (decision.upsert(cx)?, decision.read(cx));
        let (rows, after) = match self.source() {
            None => cx.upsert_then_read(&upsert, &read, galera).await?,
            Some(source) => {
                cx.autocommitted(|| async {
                    let Some(mut txn) = Transaction::begin(source, Begin::ReadWrite).await? else {
                        return Ok(Checked::InAbandonedTransaction);
                    };
                    txn.execute(&upsert).await?;
                    let rows = txn.rows(&read).await?;
                    let after = if galera {
                        Some(txn.commit_then_rows(&read).await?)
                    } else {
                        txn.commit().await?;
                        None
                    };
                    Ok(Checked::Committed((rows, after)))
                })
                .await?
            }
        };
        let Some(after) = after else {
            return Ok(rows);
        };
        let committed = after
            .first()
            .map(decode)
            .transpose()
            .map_err(|e| cx.decode_error(e))?;
        match committed {
            Some((.., id)) if id == decision.id => Ok(rows),
            _ => Err(not_ours(decision.key())),
        }
    }

    /// MariaDB's form, or, once the server is known to need it (MySQL 8, or
    /// `with_mysql_upsert`), the transaction form's upsert and read (on Galera, the read again
    /// after the `COMMIT`).
    fn rate_statements(
        &self,
        cx: &Context,
        decision: &crate::backend::rate_limits::RateDecision<'_>,
    ) -> Result<Vec<Statement>, StoreError> {
        Ok(match self.upsert.get() {
            Some(MySqlUpsert::Transaction) => vec![decision.upsert(cx)?, decision.read(cx)],
            _ => vec![decision.mariadb_returning()?],
        })
    }

    /// On a pooled connection checked to be outside any transaction: a connection inside an
    /// abandoned one is closed rather than have its `BEGIN` commit that transaction, and a call
    /// dropped before `COMMIT` closes the connection rather than hand it back mid-transaction.
    async fn revoke(
        &self,
        cx: &Context,
        _resource: &str,
        read: Statement,
        update: Statement,
    ) -> Result<Option<QueryResult>, StoreError> {
        let Some(source) = self.source() else {
            return cx.revoke_in(None, &read, &update).await;
        };
        cx.autocommitted(|| async {
            let Some(mut txn) = Transaction::begin(source, Begin::ReadWrite).await? else {
                return Ok(Checked::InAbandonedTransaction);
            };
            let row = txn.rows(&read).await?.into_iter().next();
            if row.is_some() {
                txn.execute(&update).await?;
            }
            txn.commit().await?;
            Ok(Checked::Committed(row))
        })
        .await
    }

    /// `SELECT ... FOR UPDATE`; on a Galera node a write of the lease row and its undoing.
    async fn fence(
        &self,
        cx: &Context,
        conn: &dyn RawConn,
        term: &Term<'_>,
    ) -> Result<bool, StoreError> {
        let (d, table) = (cx.dialect, cx.table_iden());
        if self.is_galera(cx, conn).await? {
            let touched = conn
                .execute(&statements::galera_touch(d, &table, term))
                .await
                .map_err(|e| cx.classify(e))?
                .rows_affected()
                == 1;
            if touched {
                conn.execute(&statements::galera_untouch(&table, term))
                    .await
                    .map_err(|e| cx.classify(e))?;
            }
            return Ok(touched);
        }
        let stmt = statements::locking_check(d, &table, term);
        // Read to the end, like every statement that decides something.
        let rows = conn.query_all(&stmt).await.map_err(|e| cx.classify(e))?;
        Ok(!rows.is_empty())
    }

    fn statement_fence(
        &self,
        cx: &Context,
        term: &Term<'_>,
    ) -> Result<SelectStatement, FenceError> {
        match self.galera.get() {
            Some(true) => Err(FenceError::StatementFenceOnGalera),
            None => Err(FenceError::TopologyUnknown),
            Some(false) => Ok(statement_check(cx.dialect, &cx.table_iden(), term)),
        }
    }

    async fn refuses_statement_fence(
        &self,
        cx: &Context,
        conn: &dyn RawConn,
    ) -> Result<bool, StoreError> {
        self.is_galera(cx, conn).await
    }

    fn durability_question(&self) -> (&'static str, &'static [&'static str]) {
        (
            "SELECT CAST(@@GLOBAL.innodb_flush_log_at_trx_commit AS CHAR) AS a",
            &["innodb_flush_log_at_trx_commit"],
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

    async fn end_lapsed_holders(
        &self,
        cx: &Context,
        resource: &str,
        waited: Duration,
    ) -> Result<Taken, StoreError> {
        let waited_ms = i64::try_from(waited.as_millis()).unwrap_or(i64::MAX);
        let stmt = cx.build(&blockers(
            cx.dialect,
            &cx.table_iden(),
            cx.table(),
            resource,
            waited_ms,
        ));
        // This runs while the acquire it serves still waits on one of the store's sessions: an
        // idle one if there is one at once, else the application's pool (checked), never a
        // wait behind the store's other calls.
        let shared = match (&self.own, &self.pool) {
            (Some(own), Some(pool)) => Some(Source::IdleOwnOrShared(own, pool)),
            _ => self.source(),
        };
        // The kill goes out within KILL_WITHIN of the look that saw the blocker stalled.
        let looked = tokio::time::Instant::now();
        let mut seen = Vec::new();
        for row in self.rows_from(cx, shared, stmt).await? {
            let thread: u64 = row
                .try_get_by_index(0)
                .map_err(|source| cx.decode_error(source))?;
            let trx: String = row
                .try_get_by_index(1)
                .map_err(|source| cx.decode_error(source))?;
            seen.push((thread, trx));
        }
        if seen.is_empty() {
            return Ok(Taken::default());
        }
        // The INNODB_* tables may be a stale cache: only a connection still in the transaction
        // they name (so still holding the row) is ended.
        let status = Statement::from_string(DbBackend::MySql, "SHOW ENGINE INNODB STATUS");
        let text: String = match self.status_from(cx, shared, status).await? {
            Some(text) => text,
            None => return Ok(Taken::default()),
        };
        let now = transactions_now(&text);
        let mut ended = 0;
        for (id, trx) in seen {
            if now.get(&id) != Some(&trx) {
                tracing::debug!(
                    resource,
                    "a lapsed holder's transaction seen in a stale lock snapshot has ended"
                );
                continue;
            }
            // The blocker was seen stalled at the look: a kill sent much later could find the
            // connection back at work for a newer term. Look again instead.
            if looked.elapsed() > KILL_WITHIN {
                tracing::debug!(
                    resource,
                    "a lapsed holder's session was seen too long ago to end"
                );
                break;
            }
            // An id the server just gave us, as a number: no quoting to get wrong.
            let kill = Statement::from_string(DbBackend::MySql, format!("KILL CONNECTION {id}"));
            // Gone already (unknown thread id) is what we wanted; a refusal of a thread that
            // is still there is reported. Waiting for a pool connection counts too: a kill not
            // sent within the window is not sent.
            let left = KILL_WITHIN.saturating_sub(looked.elapsed());
            let Ok(killed) = tokio::time::timeout(left, self.count_from(cx, shared, kill)).await
            else {
                break;
            };
            match killed {
                Ok(_) => ended += 1,
                Err(e) => {
                    let still = cx.build(&still_there(id));
                    if !self.rows_from(cx, shared, still).await?.is_empty() {
                        return Err(e);
                    }
                }
            }
        }
        Ok(Taken {
            ended,
            unseen: None,
        })
    }
}
