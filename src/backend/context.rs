//! What every backend's code gets from the store: the application's connection, the tables, the
//! statements rendered once, the retry of conflicts and the reading of rows. Nothing here knows
//! a backend; the backend is asked for its clock ([`Dialect`]) and its error codes once, when the
//! store is made.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sea_orm::sea_query::Alias;
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DbBackend, DbErr, QueryResult, Statement,
    StatementBuilder, TransactionTrait,
};

use super::dialect::Dialect;
use super::errors::{classify, Classifier, Kind};
use super::prepared::Prepared;
use crate::error::StoreError;

/// How often a statement is tried when the database reports a conflict with a concurrent
/// transaction (serialization failure, deadlock, busy SQLite file). Such a failure means the
/// statement had no effect, so trying again is safe.
pub(crate) const ATTEMPTS: u32 = 3;

/// The store's connection and tables, as its backend's code uses them.
pub(crate) struct Context {
    pub(crate) db: DatabaseConnection,
    pub(crate) table: Arc<str>,
    /// The membership table of shard sets.
    pub(crate) member_table: Arc<str>,
    /// The rate-limit table.
    pub(crate) rate_table: Arc<str>,
    /// The backend's clock and value forms.
    pub(crate) dialect: &'static dyn Dialect,
    /// SeaORM's name for the backend, to render statements with.
    pub(crate) db_backend: DbBackend,
    kind: Classifier,
    /// The statements, rendered once for this backend and table.
    pub(crate) prepared: PreparedCache,
    /// Whether the server's durability settings were looked at (once per store).
    pub(crate) durability_checked: Arc<tokio::sync::OnceCell<()>>,
    /// Set once the lease table was found to have every column this version's migrations
    /// give it (see `Engine::ready`).
    pub(crate) schema_checked: tokio::sync::OnceCell<()>,
    /// The same for the membership table.
    pub(crate) member_schema_checked: tokio::sync::OnceCell<()>,
    /// The same for the membership table's candidate rank (ranked electors only).
    pub(crate) candidate_schema_checked: tokio::sync::OnceCell<()>,
}

/// The store's statements, each rendered on first use.
#[derive(Debug, Default)]
pub(crate) struct PreparedCache {
    pub(crate) acquire: OnceLock<Prepared>,
    pub(crate) release: OnceLock<Prepared>,
    pub(crate) current: OnceLock<Prepared>,
}

impl Context {
    pub(crate) fn new(
        db: DatabaseConnection,
        table: Arc<str>,
        member_table: Arc<str>,
        dialect: &'static dyn Dialect,
        db_backend: DbBackend,
        kind: Classifier,
        durability_checked: Arc<tokio::sync::OnceCell<()>>,
    ) -> Self {
        Self {
            db,
            table,
            member_table,
            rate_table: Arc::from(orion_beacon_entity::DEFAULT_RATE_LIMIT_TABLE),
            dialect,
            db_backend,
            kind,
            prepared: PreparedCache::default(),
            durability_checked,
            schema_checked: tokio::sync::OnceCell::new(),
            member_schema_checked: tokio::sync::OnceCell::new(),
            candidate_schema_checked: tokio::sync::OnceCell::new(),
        }
    }

    pub(crate) fn table(&self) -> &str {
        &self.table
    }

    pub(crate) fn table_iden(&self) -> Alias {
        Alias::new(&*self.table)
    }

    /// `stmt`, rendered for this backend.
    pub(crate) fn build<S: StatementBuilder>(&self, stmt: &S) -> Statement {
        self.db_backend.build(stmt)
    }

    /// How the backend treats `err`.
    pub(crate) fn kind(&self, err: &DbErr) -> Kind {
        (self.kind)(err)
    }

    /// The store's error for a database error on the lease table.
    pub(crate) fn classify(&self, err: DbErr) -> StoreError {
        let kind = self.kind(&err);
        classify(err, kind, &self.table)
    }

    /// Runs `op` again while the database reports a conflict, at most [`ATTEMPTS`] times.
    pub(crate) async fn with_retry<T, F, Fut>(&self, mut op: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, DbErr>>,
    {
        let mut attempt = 1;
        loop {
            match op().await {
                Ok(value) => return Ok(value),
                Err(err) if attempt < ATTEMPTS && self.kind(&err) == Kind::Conflict => {
                    tracing::debug!(table = %self.table, attempt, error = %err, "lease statement conflicted; retrying");
                    tokio::time::sleep(Duration::from_millis(5 * u64::from(attempt))).await;
                    attempt += 1;
                }
                Err(err) => return Err(self.classify(err)),
            }
        }
    }

    /// Runs a statement as SeaORM runs any statement, read to the end (for backends without
    /// further checks: SQLite, and connections SeaORM fakes; the others check their
    /// connection first, see `sessions`).
    ///
    /// A driver that stops after the first row never sees what the statement did afterwards:
    /// SQLite sends `RETURNING` rows before it commits (and a commit that cannot get its lock
    /// rolls the statement back), PostgreSQL reports commit-time errors after the rows, and a
    /// Galera node sends rows before certification. Only a statement read to its end, without
    /// an error, has committed.
    pub(crate) async fn read_to_end(
        &self,
        stmt: Statement,
    ) -> Result<Vec<QueryResult>, StoreError> {
        self.with_retry(|| self.db.query_all_raw(stmt.clone()))
            .await
    }

    /// Runs a statement that changes rows as SeaORM runs any statement: how many it changed.
    pub(crate) async fn execute(&self, stmt: Statement) -> Result<u64, StoreError> {
        self.with_retry(|| self.db.execute_raw(stmt.clone()))
            .await
            .map(|r| r.rows_affected())
    }

    /// A row of the lease table that could not be read back.
    pub(crate) fn decode_error(&self, source: DbErr) -> StoreError {
        StoreError::Decode {
            table: self.table.to_string(),
            source,
        }
    }

    /// The one row a deciding statement returned, or `None`. Several rows for one statement
    /// mean a Galera node re-ran the upsert after a failed certification and sent the rows of
    /// both attempts. Trust none of them: it is no grant, and not a denial either (a leader
    /// keeps its term to its deadline and asks again); if the re-run did grant us the lease,
    /// the next attempt renews it.
    pub(crate) fn single_row<'r>(
        &self,
        rows: &'r [QueryResult],
    ) -> Result<Option<&'r QueryResult>, StoreError> {
        match rows {
            [] => Ok(None),
            [row] => Ok(Some(row)),
            [..] => {
                tracing::warn!(
                    table = %self.table,
                    rows = rows.len(),
                    "the lease statement returned several rows (a server-side retry?); not a grant"
                );
                Err(StoreError::Conflict {
                    source: DbErr::Custom(format!(
                        "the lease statement returned {} rows (a server-side retry after a \
                         certification conflict); none of them is trusted",
                        rows.len()
                    ))
                    .into(),
                })
            }
        }
    }

    /// The cached statement in `cell`, rendering it with `build` the first time.
    pub(crate) fn cached<'c>(
        &self,
        cell: &'c OnceLock<Prepared>,
        build: impl Fn(&str, &str, i64) -> Result<Statement, DbErr>,
    ) -> Result<&'c Prepared, StoreError> {
        if let Some(prepared) = cell.get() {
            return Ok(prepared);
        }
        let prepared =
            Prepared::new(self.dialect, build).map_err(|e| StoreError::Database(e.into()))?;
        Ok(cell.get_or_init(|| prepared))
    }

    /// The read of `resource`'s row, rendered once.
    pub(crate) fn current_statement(&self, resource: &str) -> Result<Statement, StoreError> {
        let table = self.table_iden();
        Ok(self
            .cached(&self.prepared.current, |r, _, _| {
                Ok(self.build(&super::statements::current(self.dialect, &table, r)))
            })?
            .bind(resource, "", 0))
    }

    /// The revoke's transaction through SeaORM (SQLite, and connections that are no sqlx
    /// pool): the row before the revoke. `lock` first, where the backend has no row locks.
    pub(crate) async fn revoke_in(
        &self,
        lock: Option<&Statement>,
        read: &Statement,
        update: &Statement,
    ) -> Result<Option<QueryResult>, StoreError> {
        self.with_retry(|| async {
            let txn = self.db.begin().await?;
            if let Some(lock) = lock {
                txn.execute_raw(lock.clone()).await?;
            }
            let row = txn.query_one_raw(read.clone()).await?;
            if row.is_some() {
                txn.execute_raw(update.clone()).await?;
            }
            txn.commit().await?;
            Ok(row)
        })
        .await
    }

    /// An upsert and the read of the row it left, in one transaction through SeaORM
    /// (connections that are no sqlx pool): the rows once committed, and with `reread` the
    /// same read after the commit.
    #[allow(dead_code)] // only MySQL's backend sends one
    pub(crate) async fn upsert_then_read(
        &self,
        upsert: &Statement,
        read: &Statement,
        reread: bool,
    ) -> Result<(Vec<QueryResult>, Option<Vec<QueryResult>>), StoreError> {
        self.with_retry(|| async {
            let txn = self.db.begin().await?;
            txn.execute_raw(upsert.clone()).await?;
            let rows = txn.query_all_raw(read.clone()).await?;
            txn.commit().await?;
            let after = if reread {
                Some(self.db.query_all_raw(read.clone()).await?)
            } else {
                None
            };
            Ok((rows, after))
        })
        .await
    }

    /// Runs a checked statement, again on another connection when the one it got was inside
    /// an abandoned transaction, at most [`ATTEMPTS`] times in all.
    #[cfg(checked_pool)]
    pub(crate) async fn autocommitted<T, F, Fut>(&self, mut run: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<super::sessions::Checked<T>, DbErr>>,
    {
        use super::sessions::Checked;
        for attempt in 1..=ATTEMPTS {
            match self.with_retry(&mut run).await? {
                Checked::Committed(rows) => return Ok(rows),
                Checked::InAbandonedTransaction => tracing::warn!(
                    table = %self.table(),
                    attempt,
                    "a pooled connection was inside a transaction (one nobody finished, e.g. a \
                     future dropped during `begin()`, or a session with autocommit off); closed \
                     it (the server rolls that transaction back), nothing the store sent on it \
                     counts, trying another"
                ),
            }
        }
        Err(StoreError::Conflict {
            source: DbErr::Custom(
                "every pooled connection tried was inside an abandoned transaction".to_owned(),
            )
            .into(),
        })
    }
}

#[cfg(all(test, sqlx_driver))]
mod tests {
    use std::borrow::Cow;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use sea_orm::sqlx::error::{DatabaseError, ErrorKind};
    use sea_orm::{DatabaseConnection, DbErr, RuntimeErr};

    use super::{Context, ATTEMPTS};
    use crate::backend::errors::{Classifier, Kind};
    use crate::error::StoreError;

    /// A database error with a SQLSTATE of our choosing.
    #[derive(Debug)]
    struct Coded(&'static str);
    impl std::fmt::Display for Coded {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "error {}", self.0)
        }
    }
    impl std::error::Error for Coded {}
    impl DatabaseError for Coded {
        fn message(&self) -> &str {
            "injected"
        }
        fn code(&self) -> Option<Cow<'_, str>> {
            Some(Cow::Borrowed(self.0))
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> ErrorKind {
            ErrorKind::Other
        }
    }

    fn err(code: &'static str) -> DbErr {
        DbErr::Exec(RuntimeErr::SqlxError(Arc::new(
            sea_orm::sqlx::Error::Database(Box::new(Coded(code))),
        )))
    }

    /// `code` for the first `failures` calls, then success; returns the result and the calls.
    async fn run(
        kind: Classifier,
        code: &'static str,
        failures: u32,
    ) -> (Result<u32, StoreError>, u32) {
        let cx = Context::new(
            DatabaseConnection::default(),
            Arc::from("t"),
            Arc::from("m"),
            &crate::backend::sqlite::Sqlite,
            sea_orm::DbBackend::Sqlite,
            kind,
            Arc::default(),
        );
        let calls = AtomicU32::new(0);
        let result = cx
            .with_retry(|| {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                async move {
                    if n <= failures {
                        Err(err(code))
                    } else {
                        Ok(n)
                    }
                }
            })
            .await;
        (result, calls.load(Ordering::SeqCst))
    }

    /// A backend's classifier in miniature: `"busy"` is a conflict, anything else is not.
    /// (Each backend's own codes are tested in its folder's `errors.rs`.)
    fn busy_is_a_conflict(err: &DbErr) -> Kind {
        match crate::backend::errors::database_error(err).and_then(|e| e.code()) {
            Some(code) if code == "busy" => Kind::Conflict,
            _ => Kind::Other,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn conflicts_are_retried_up_to_the_limit_and_nothing_else_is() {
        assert_eq!(ATTEMPTS, 3);
        let classifier: Classifier = busy_is_a_conflict;
        // A conflict: tried again, at most three times in all.
        let (result, calls) = run(classifier, "busy", 2).await;
        assert_eq!((result.ok(), calls), (Some(3), 3));
        let (result, calls) = run(classifier, "busy", 3).await;
        assert!(
            matches!(result, Err(StoreError::Conflict { .. })),
            "{result:?}"
        );
        assert_eq!(calls, 3);
        // Any other error: reported at once.
        let (result, calls) = run(classifier, "other", 1).await;
        assert!(matches!(result, Err(StoreError::Database(_))), "{result:?}");
        assert_eq!(calls, 1);
    }
}
