//! Fenced writes: a leader's database writes commit only while its term is current.
//!
//! The lease row lives in the same database as the application's data, so a write can be made
//! conditional on the term in the same transaction, or even the same statement:
//!
//! - **Transactional fence** ([`SeaOrmLeaseStore::fence`]): inside the application's
//!   transaction, check that the lease row still has this holder, this token and an expiry after
//!   the database's now, and lock it so that no rival can take the lease over until the
//!   transaction ends. PostgreSQL: `SELECT ... FOR SHARE`; MySQL/MariaDB: `SELECT ... LOCK IN
//!   SHARE MODE`; SQLite: a no-op `UPDATE` of the lease row, which takes SQLite's write lock (all
//!   writers, rivals included, wait for the transaction). On a **Galera** cluster row locks do not
//!   reach the other nodes and reads are not certified, so the fence *writes* the lease row
//!   instead (its expiry one microsecond later, then back: no net change): the transaction's
//!   write set then carries the row, and if a rival took the lease over on another node first,
//!   certification aborts the fenced transaction at commit.
//! - **Statement-level fence** ([`SeaOrmLeaseStore::fenced_by`]): an `EXISTS (...)` condition
//!   on the lease row (locked the same way) that an `UPDATE ... WHERE` or `INSERT ... SELECT ...
//!   WHERE` carries, so a stale term's write affects no rows; [`SeaOrmLeaseStore::execute_fenced`]
//!   runs such a statement and turns "no rows because the term is stale" into
//!   [`FenceError::Fenced`].

use orion_beacon_entity::lease::Column;
use sea_orm::sea_query::{Alias, Expr, ExprTrait, Query, SelectStatement, UpdateStatement};
use sea_orm::{ConnectionTrait, DbBackend, StatementBuilder};

use super::errors::classify;
use super::store::SeaOrmLeaseStore;
use super::Dialect;
use crate::store::{validate_candidate, validate_resource};
use crate::{FencingToken, LeaderTerm, StoreError};

/// Why a fenced write was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// The term is no longer current in the lease table (another holder, a newer token, or the
    /// lease expired by the database clock): roll back, the write must not happen.
    #[error("fenced: {holder:?} no longer holds {resource:?} with token {token}")]
    Fenced {
        /// The resource.
        resource: String,
        /// The candidate whose term was checked.
        holder: String,
        /// The token that was checked.
        token: FencingToken,
    },
    /// The check itself failed (database error, missing table, bad input).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// [`LeaderTerm::fence`] on a term whose elector's store cannot fence SeaORM transactions
    /// (it is not a [`SeaOrmLeaseStore`]).
    #[error("this term's elector does not run on a SeaOrmLeaseStore, so it cannot fence a SeaORM transaction")]
    Unsupported,
}

impl FenceError {
    /// Whether this is [`FenceError::Fenced`]: the caller is not the leader (any more).
    pub fn is_fenced(&self) -> bool {
        matches!(self, FenceError::Fenced { .. })
    }
}

/// What a fence checks: one term of one holder on one resource.
#[derive(Debug, Clone, Copy)]
pub struct Term<'a> {
    /// The resource.
    pub resource: &'a str,
    /// The holder.
    pub holder: &'a str,
    /// The term's token.
    pub token: FencingToken,
}

impl<'a> From<&'a LeaderTerm> for Term<'a> {
    fn from(term: &'a LeaderTerm) -> Self {
        Term {
            resource: term.resource(),
            holder: term.candidate(),
            token: term.token(),
        }
    }
}

impl Term<'_> {
    fn validate(&self) -> Result<(), StoreError> {
        validate_resource(self.resource)?;
        validate_candidate(self.holder)
    }

    fn fenced(&self) -> FenceError {
        FenceError::Fenced {
            resource: self.resource.to_owned(),
            holder: self.holder.to_owned(),
            token: self.token,
        }
    }

    /// The lease row is this term's and live by the database clock.
    fn current(&self, d: &dyn Dialect) -> Expr {
        Expr::col(Column::Resource)
            .eq(self.resource)
            .and(Expr::col(Column::Holder).eq(self.holder))
            .and(Expr::col(Column::FencingToken).eq(self.token.get()))
            .and(Expr::col(Column::ExpiresAt).gt(d.now()))
    }
}

/// `SELECT 1 FROM leases WHERE <term is current> FOR SHARE` (the lock phrase per backend; SQLite
/// has none and serializes writers instead).
pub(crate) fn share_locked_check(
    d: &dyn Dialect,
    table: &Alias,
    term: &Term<'_>,
) -> SelectStatement {
    Query::select()
        .expr(Expr::val(1))
        .from(table.clone())
        .and_where(term.current(d))
        .lock_shared()
        .to_owned()
}

/// The subquery of the statement-level fence: [`share_locked_check`], except on SQLite, where
/// one statement runs under the write lock already and `FOR SHARE` does not exist.
pub(crate) fn statement_check(
    d: &dyn Dialect,
    backend: DbBackend,
    table: &Alias,
    term: &Term<'_>,
) -> SelectStatement {
    match backend {
        DbBackend::Sqlite => Query::select()
            .expr(Expr::val(1))
            .from(table.clone())
            .and_where(term.current(d))
            .to_owned(),
        _ => share_locked_check(d, table, term),
    }
}

/// Galera: the check as a write of the lease row, the expiry one microsecond later (the lease
/// only ever looks longer to a dirty reader, never shorter). [`galera_untouch`] puts it back
/// in the same transaction; the row's key stays in the write set either way, so certification
/// orders this transaction against any rival's acquire on another node.
pub(crate) fn galera_touch(d: &dyn Dialect, table: &Alias, term: &Term<'_>) -> UpdateStatement {
    Query::update()
        .table(table.clone())
        .value(
            Column::ExpiresAt,
            Expr::cust_with_exprs("? + INTERVAL 1 MICROSECOND", [Expr::col(Column::ExpiresAt)]),
        )
        .and_where(term.current(d))
        .to_owned()
}

/// Galera: undoes [`galera_touch`] on the row this transaction holds locked.
pub(crate) fn galera_untouch(table: &Alias, term: &Term<'_>) -> UpdateStatement {
    Query::update()
        .table(table.clone())
        .value(
            Column::ExpiresAt,
            Expr::cust_with_exprs("? - INTERVAL 1 MICROSECOND", [Expr::col(Column::ExpiresAt)]),
        )
        .and_where(Expr::col(Column::Resource).eq(term.resource))
        .and_where(Expr::col(Column::Holder).eq(term.holder))
        .and_where(Expr::col(Column::FencingToken).eq(term.token.get()))
        .to_owned()
}

/// SQLite: a no-op write of the lease row, so the check holds SQLite's write lock.
pub(crate) fn write_locked_check(
    d: &dyn Dialect,
    table: &Alias,
    term: &Term<'_>,
) -> UpdateStatement {
    Query::update()
        .table(table.clone())
        .value(Column::FencingToken, Expr::col(Column::FencingToken))
        .and_where(term.current(d))
        .to_owned()
}

impl SeaOrmLeaseStore {
    /// Inside the caller's transaction on the lease database, checks that `term` is still
    /// current (same holder, same token, expiry after the database's now) and locks the lease
    /// row so that no rival can take over until the transaction ends. On
    /// [`FenceError::Fenced`], roll back.
    ///
    /// Call it first in the transaction (on SQLite it takes the write lock; a transaction that
    /// read before may then fail with a busy error instead). Keep fenced transactions short:
    /// while one is open, the lease cannot change hands, and the holder's own renews wait too.
    pub async fn fence<'a, C: ConnectionTrait>(
        &self,
        txn: &C,
        term: impl Into<Term<'a>>,
    ) -> Result<(), FenceError> {
        let term = term.into();
        term.validate()?;
        let d = self.dialect()?;
        let table = self.table_iden();
        let held = match txn.get_database_backend() {
            DbBackend::Sqlite => {
                let stmt = write_locked_check(d, &table, &term);
                let done = txn
                    .execute(&stmt)
                    .await
                    .map_err(|e| classify(e, self.table()))?;
                done.rows_affected() == 1
            }
            DbBackend::MySql if self.is_galera(txn).await? => {
                let touched = txn
                    .execute(&galera_touch(d, &table, &term))
                    .await
                    .map_err(|e| classify(e, self.table()))?
                    .rows_affected()
                    == 1;
                if touched {
                    txn.execute(&galera_untouch(&table, &term))
                        .await
                        .map_err(|e| classify(e, self.table()))?;
                }
                touched
            }
            _ => {
                let stmt = share_locked_check(d, &table, &term);
                // Read to the end, like every statement that decides something.
                !txn.query_all(&stmt)
                    .await
                    .map_err(|e| classify(e, self.table()))?
                    .is_empty()
            }
        };
        if held {
            Ok(())
        } else {
            Err(term.fenced())
        }
    }

    /// A condition for a single fenced statement: `EXISTS (SELECT 1 FROM <lease table> WHERE
    /// <term is current> FOR SHARE)`. Add it to an `UPDATE ... WHERE` or an `INSERT ... SELECT
    /// ... WHERE`; the statement then affects no rows for a stale term. Run it with
    /// [`execute_fenced`](Self::execute_fenced) to be told which.
    pub fn fenced_by<'a>(&self, term: impl Into<Term<'a>>) -> Result<Expr, FenceError> {
        let term = term.into();
        term.validate()?;
        let d = self.dialect()?;
        let backend = self.connection().get_database_backend();
        Ok(Expr::exists(statement_check(
            d,
            backend,
            &self.table_iden(),
            &term,
        )))
    }

    /// Runs a statement that carries [`fenced_by`](Self::fenced_by) and returns the rows it
    /// affected. If it affected none and the term is no longer current, that is
    /// [`FenceError::Fenced`]; if the term is current, `Ok(0)` (the statement's own conditions
    /// matched nothing).
    pub async fn execute_fenced<'a, C: ConnectionTrait, S: StatementBuilder + Sync>(
        &self,
        conn: &C,
        stmt: &S,
        term: impl Into<Term<'a>>,
    ) -> Result<u64, FenceError> {
        let term = term.into();
        term.validate()?;
        let rows = conn
            .execute(stmt)
            .await
            .map_err(|e| classify(e, self.table()))?
            .rows_affected();
        if rows > 0 {
            return Ok(rows);
        }
        let d = self.dialect()?;
        let check = Query::select()
            .expr(Expr::val(1))
            .from(self.table_iden())
            .and_where(term.current(d))
            .to_owned();
        let rows = conn
            .query_all(&check)
            .await
            .map_err(|e| classify(e, self.table()))?;
        if rows.is_empty() {
            Err(term.fenced())
        } else {
            Ok(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{mysql::MySql, postgres::Postgres, sqlite::Sqlite};
    use sea_orm::sea_query::{MysqlQueryBuilder, PostgresQueryBuilder, SqliteQueryBuilder};

    fn term() -> Term<'static> {
        Term {
            resource: "r",
            holder: "me",
            token: FencingToken::new(7),
        }
    }

    // The statement-level fence inside a caller's UPDATE: the lock clause must survive.
    #[test]
    fn fenced_by_sql_per_backend() {
        let t = Alias::new("orionbeacon_leases");
        let update = |backend: DbBackend, d: &dyn Dialect| {
            Query::update()
                .table(Alias::new("jobs"))
                .value(Alias::new("owner_token"), 7i64)
                .and_where(Expr::col(Alias::new("id")).eq(1))
                .and_where(Expr::exists(statement_check(d, backend, &t, &term())))
                .to_owned()
        };
        let (sql, values) = update(DbBackend::Postgres, &Postgres).build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            r#"UPDATE "jobs" SET "owner_token" = $1 WHERE "id" = $2 AND EXISTS(SELECT $3 FROM "orionbeacon_leases" WHERE "resource" = $4 AND "holder" = $5 AND "fencing_token" = $6 AND "expires_at" > (statement_timestamp()) FOR SHARE)"#
        );
        assert_eq!(values.0.len(), 6);
        let (sql, _) = update(DbBackend::MySql, &MySql).build(MysqlQueryBuilder);
        assert_eq!(
            sql,
            "UPDATE `jobs` SET `owner_token` = ? WHERE `id` = ? AND EXISTS(SELECT ? FROM `orionbeacon_leases` WHERE `resource` = ? AND `holder` = ? AND `fencing_token` = ? AND `expires_at` > (UTC_TIMESTAMP(6)) LOCK IN SHARE MODE)"
        );
        let (sql, _) = update(DbBackend::Sqlite, &Sqlite).build(SqliteQueryBuilder);
        assert_eq!(
            sql,
            r#"UPDATE "jobs" SET "owner_token" = ? WHERE "id" = ? AND EXISTS(SELECT ? FROM "orionbeacon_leases" WHERE "resource" = ? AND "holder" = ? AND "fencing_token" = ? AND "expires_at" > (strftime('%Y-%m-%d %H:%M:%f', 'now')))"#
        );
    }

    #[test]
    fn galera_fence_writes_the_row_and_puts_it_back() {
        let t = Alias::new("orionbeacon_leases");
        let (sql, values) = galera_touch(&MySql, &t, &term()).build(MysqlQueryBuilder);
        assert_eq!(
            sql,
            "UPDATE `orionbeacon_leases` SET `expires_at` = `expires_at` + INTERVAL 1 MICROSECOND WHERE `resource` = ? AND `holder` = ? AND `fencing_token` = ? AND `expires_at` > (UTC_TIMESTAMP(6))"
        );
        assert_eq!(values.0.len(), 3);
        let (sql, values) = galera_untouch(&t, &term()).build(MysqlQueryBuilder);
        assert_eq!(
            sql,
            "UPDATE `orionbeacon_leases` SET `expires_at` = `expires_at` - INTERVAL 1 MICROSECOND WHERE `resource` = ? AND `holder` = ? AND `fencing_token` = ?"
        );
        assert_eq!(values.0.len(), 3);
    }

    #[test]
    fn only_a_stale_term_is_fenced() {
        assert!(term().fenced().is_fenced());
        let failed = FenceError::Store(StoreError::InvalidResource {
            name: String::new(),
            reason: "empty",
        });
        assert!(
            !failed.is_fenced(),
            "a failed check is not a verdict on the term"
        );
    }

    #[test]
    fn fence_sql_per_backend() {
        let t = Alias::new("orionbeacon_leases");
        let (sql, values) = share_locked_check(&Postgres, &t, &term()).build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            r#"SELECT $1 FROM "orionbeacon_leases" WHERE "resource" = $2 AND "holder" = $3 AND "fencing_token" = $4 AND "expires_at" > (statement_timestamp()) FOR SHARE"#
        );
        assert_eq!(values.0.len(), 4);
        let (sql, _) = share_locked_check(&MySql, &t, &term()).build(MysqlQueryBuilder);
        assert_eq!(
            sql,
            "SELECT ? FROM `orionbeacon_leases` WHERE `resource` = ? AND `holder` = ? AND `fencing_token` = ? AND `expires_at` > (UTC_TIMESTAMP(6)) LOCK IN SHARE MODE"
        );
        let (sql, _) = write_locked_check(&Sqlite, &t, &term()).build(SqliteQueryBuilder);
        assert_eq!(
            sql,
            r#"UPDATE "orionbeacon_leases" SET "fencing_token" = "fencing_token" WHERE "resource" = ? AND "holder" = ? AND "fencing_token" = ? AND "expires_at" > (strftime('%Y-%m-%d %H:%M:%f', 'now'))"#
        );
    }
}
