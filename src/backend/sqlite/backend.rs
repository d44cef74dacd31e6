//! The SQLite backend: the upsert read to the end (SQLite sends `RETURNING` rows before it
//! commits), a plain read to report a denial, the write-lock fence, and a warning for a file in
//! rollback-journal mode.

use async_trait::async_trait;
use sea_orm::sea_query::{Expr, ExprTrait, SelectStatement};
use sea_orm::{ConnectionTrait, DbBackend, DbErr, QueryResult, Statement};

use super::{errors, statements, Sqlite};
use crate::backend::context::Context;
use crate::backend::dialect::Dialect;
use crate::backend::driver::{Derived, LeaseBackend, RawConn};
use crate::backend::errors::Classifier;
use crate::backend::row::{Decode as _, Row};
use crate::backend::statements as shared;
use crate::backend::term_checks::statement_check;
use crate::error::FenceError;
use crate::fencing::Term;
use crate::{error::StoreError, lease::Denial, lease::LeaseOutcome};

/// The SQLite backend of one store.
pub(crate) struct SqliteBackend {
    /// Whether the journal mode was looked at (once per store).
    journal_checked: std::sync::Arc<tokio::sync::OnceCell<()>>,
    /// Whether release events may watch the file.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    notifications: bool,
    /// The file watcher, made on the first subscription.
    #[cfg(feature = "sqlite")]
    wakeups: super::wakeups::HubCell,
}

impl SqliteBackend {
    pub(crate) fn new(notifications: bool) -> Self {
        Self {
            journal_checked: Default::default(),
            notifications,
            #[cfg(feature = "sqlite")]
            wakeups: Default::default(),
        }
    }
}

impl SqliteBackend {
    /// Warns (once per store) when the file is not in WAL mode. In SQLite's default rollback
    /// journal a commit waits for every reader to finish, and a reader that holds the file
    /// past the busy timeout makes lease statements fail; with several processes on one file,
    /// open it with [`connect_options`](super::connect_options) (WAL, a 5 s busy timeout).
    async fn check_journal(&self, cx: &Context) {
        let _ = self
            .journal_checked
            .get_or_try_init(|| async {
                let stmt = Statement::from_string(DbBackend::Sqlite, "PRAGMA journal_mode");
                let mode = match cx.db.query_one_raw(stmt).await {
                    Ok(Some(row)) => row.try_get_by_index::<String>(0).unwrap_or_default(),
                    // Not looked at: asked again with the next statement (the lease statement
                    // reports any error of its own).
                    _ => return Err(()),
                };
                // `memory`: an in-memory database, one process; `wal`/`wal2`: fine.
                if !mode.eq_ignore_ascii_case("memory")
                    && !mode.to_ascii_lowercase().starts_with("wal")
                {
                    tracing::warn!(
                        journal_mode = %mode,
                        table = %cx.table(),
                        "SQLite file in rollback-journal mode: commits wait for every reader, \
                         and lease statements fail while a reader holds the file past the busy \
                         timeout; open it in WAL mode \
                         (orion_beacon::backend::sqlite::connect_options does)"
                    );
                }
                Ok(())
            })
            .await;
    }
}

#[async_trait]
impl LeaseBackend for SqliteBackend {
    fn name(&self) -> &'static str {
        "SQLite"
    }

    fn dialect(&self) -> &'static dyn Dialect {
        &Sqlite
    }

    fn db_backend(&self) -> DbBackend {
        DbBackend::Sqlite
    }

    fn classifier(&self) -> Classifier {
        errors::kind
    }

    fn derived(&self, derived: Derived) -> Box<dyn LeaseBackend> {
        Box::new(Self {
            journal_checked: self.journal_checked.clone(),
            notifications: derived.notifications,
            // The watcher reads one table's leases.
            #[cfg(feature = "sqlite")]
            wakeups: if derived.table_changed {
                Default::default()
            } else {
                self.wakeups.clone()
            },
        })
    }

    /// Wake-ups from the database file's changes (see `wakeups`; with the `sqlite` feature).
    fn wakeups(&self) -> Option<crate::backend::wakeups::Wakeups> {
        #[cfg(feature = "sqlite")]
        if self.notifications {
            return Some(crate::backend::wakeups::Wakeups::Events(
                std::sync::Arc::new(super::wakeups::FileChanges(self.wakeups.clone())),
            ));
        }
        None
    }

    fn acquire_statement(
        &self,
        cx: &Context,
        resource: &str,
        candidate: &str,
        millis: i64,
        payload: Option<&str>,
    ) -> Result<Statement, DbErr> {
        shared::upsert(
            cx.dialect,
            &cx.table_iden(),
            resource,
            candidate,
            millis,
            payload,
        )
        .map(|q| cx.build(&q))
    }

    /// One statement; no row means denied.
    async fn acquire_or_renew(
        &self,
        cx: &Context,
        resource: &str,
        candidate: &str,
        millis: i64,
        payload: Option<&str>,
    ) -> Result<LeaseOutcome, StoreError> {
        self.check_journal(cx).await;
        let stmt = self
            .acquire_prepared(cx)?
            .bind_with(resource, candidate, millis, payload);
        let rows = cx.read_to_end(stmt).await?;
        let Some(row) = cx.single_row(&rows)? else {
            // Denied, the statement changed nothing. Say who holds the lease with a plain
            // read; it is only a report (the holder may change between the two).
            let report = match self.read_row(cx, resource).await? {
                Some(row) => row.denial_for(resource, candidate),
                None => Denial::new(resource),
            };
            return Ok(LeaseOutcome::Denied(report));
        };
        let decoded = Row::decode(row).map_err(|source| cx.decode_error(source))?;
        Ok(decoded.outcome(resource, candidate))
    }

    /// `RETURNING` rows, read to the end (SQLite sends them before it commits).
    async fn renew_all(
        &self,
        cx: &Context,
        json: String,
        millis: i64,
    ) -> Result<Vec<QueryResult>, StoreError> {
        self.check_journal(cx).await;
        let update = statements::renew_all(cx.dialect, &cx.table_iden(), json, millis);
        cx.read_to_end(cx.build(&update)).await
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

    /// SQLite has no row locks: a no-op write of the row takes the database's write lock
    /// first, so no writer can slip in between the read and the revoke.
    async fn revoke(
        &self,
        cx: &Context,
        resource: &str,
        read: Statement,
        update: Statement,
    ) -> Result<Option<QueryResult>, StoreError> {
        let lock = cx.build(&statements::write_lock(
            &cx.table_iden(),
            Expr::col(orion_beacon_entity::lease::Column::Resource).eq(resource),
        ));
        cx.revoke_in(Some(&lock), &read, &update).await
    }

    /// A no-op `UPDATE` of the lease row, which takes SQLite's write lock.
    async fn fence(
        &self,
        cx: &Context,
        conn: &dyn RawConn,
        term: &Term<'_>,
    ) -> Result<bool, StoreError> {
        let stmt = statements::write_lock(&cx.table_iden(), term.current(cx.dialect));
        let done = conn.execute(&stmt).await.map_err(|e| cx.classify(e))?;
        Ok(done.rows_affected() == 1)
    }

    fn statement_fence(
        &self,
        cx: &Context,
        term: &Term<'_>,
    ) -> Result<SelectStatement, FenceError> {
        Ok(statement_check(cx.dialect, &cx.table_iden(), term))
    }

    fn durability_question(&self) -> (&'static str, &'static [&'static str]) {
        (
            "SELECT CAST(synchronous AS TEXT) AS a FROM pragma_synchronous",
            &["synchronous"],
        )
    }
}
