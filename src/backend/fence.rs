//! Fenced writes: a leader's database writes commit only while its term is current.
//!
//! The lease row lives in the same database as the application's data, so a write can be made
//! conditional on the term in the same transaction, or even the same statement:
//!
//! - **Transactional fence** ([`SeaOrmLeaseStore::fence`]): inside the application's
//!   transaction, check that the lease row still has this holder, this token and an expiry after
//!   the database's now, and lock it so that no rival can take the lease over until the
//!   transaction ends, or until the term lapses (then a rival that waits ends the transaction's
//!   session: see `takeover`). PostgreSQL: `SELECT ... FOR SHARE`, with a shared advisory lock
//!   as the marker a takeover finds the session by; MySQL/MariaDB: `SELECT ... FOR UPDATE` (so
//!   the transaction has an id a takeover can find); SQLite: a no-op `UPDATE` of the lease row,
//!   which takes SQLite's write lock (all writers, rivals included, wait for the transaction,
//!   however long it stalls). On a **Galera** cluster row locks do not
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
use sea_orm::sea_query::{Alias, Expr, ExprTrait, Query, SelectStatement};
use sea_orm::{ConnectionTrait, StatementBuilder};

use super::errors::classify;
#[cfg(feature = "mysql")]
use super::mysql;
use super::sqlite;
use super::store::SeaOrmLeaseStore;
#[cfg(feature = "postgres")]
use super::takeover;
use super::{Dialect, Form};
use crate::store::{validate_candidate, validate_resource};
use crate::{FencingToken, StoreError};

// The term a fence checks is defined next to `FencingToken`, and the elector converts its
// `LeaderTerm` into it: the backend needs no elector types. Its database checks are below.
pub use crate::fencing::Term;

/// Why a fenced write was refused.
#[derive(thiserror::Error)]
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
    /// The statement-level fence ([`SeaOrmLeaseStore::fenced_by`],
    /// [`SeaOrmLeaseStore::execute_fenced`]) on a Galera cluster: its check only reads the lease
    /// row, and neither a shared lock nor a read is replicated or certified, so a stale write
    /// could commit on another node after a takeover. Use the transactional fence
    /// ([`SeaOrmLeaseStore::fence`]), which writes the lease row there.
    #[error("the statement-level fence cannot fence on a Galera cluster (a shared lock does not replicate): write inside a transaction fenced with fence(&txn, term) instead")]
    StatementFenceOnGalera,
    /// [`SeaOrmLeaseStore::fenced_by`] on MySQL/MariaDB by a store that has not yet learnt
    /// whether the server is a Galera node (it does at its first grant, fence or
    /// `execute_fenced`), where the statement-level fence must not be used.
    #[error("the statement-level fence needs to know whether this MySQL/MariaDB server is a Galera node: call it after the store's first grant (or use execute_fenced, or fence(&txn, term))")]
    TopologyUnknown,
    /// [`LeaderTerm::fence`](crate::LeaderTerm::fence) on a term whose elector's store cannot
    /// fence SeaORM transactions (it is not a [`SeaOrmLeaseStore`]).
    #[error("this term's elector does not run on a SeaOrmLeaseStore, so it cannot fence a SeaORM transaction")]
    Unsupported,
}

impl std::fmt::Debug for FenceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        crate::error::debug_chain(f, "FenceError", self)
    }
}

impl FenceError {
    /// Whether this is [`FenceError::Fenced`]: the caller is not the leader (any more).
    pub fn is_fenced(&self) -> bool {
        matches!(self, FenceError::Fenced { .. })
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
    pub(crate) fn current(&self, d: &dyn Dialect) -> Expr {
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

/// The subquery of [`SeaOrmLeaseStore::fenced_by`]: [`statement_check`], on PostgreSQL with the
/// marker a takeover past a stalled holder finds its session by (see `takeover`).
pub(crate) fn statement_fence(
    form: Form,
    table: &Alias,
    table_name: &str,
    term: &Term<'_>,
) -> SelectStatement {
    #[allow(unused_mut)] // a build without PostgreSQL
    let mut check = statement_check(form.dialect(), table, term);
    #[cfg(feature = "postgres")]
    if form == Form::Postgres {
        // Never gating the fence: the marker is taken, whatever it answers.
        check.and_where(
            takeover::postgres_marker(table_name, term.resource, term.token.get()).is_not_null(),
        );
    }
    #[cfg(not(feature = "postgres"))]
    let _ = table_name;
    check
}

/// The transactional fence's check on a backend with row locks, which a takeover past a
/// stalled holder can find (see `takeover`): PostgreSQL, [`share_locked_check`] with the
/// session's marker; MySQL/MariaDB, the row locked `FOR UPDATE`, so that the transaction has
/// an id (a read-only one shows none).
pub(crate) fn locking_check(
    form: Form,
    table: &Alias,
    table_name: &str,
    term: &Term<'_>,
) -> SelectStatement {
    let d = form.dialect();
    #[allow(unused_mut)] // a build without PostgreSQL and MySQL
    let mut check = share_locked_check(d, table, term);
    #[cfg(not(feature = "postgres"))]
    let _ = table_name;
    match form {
        #[cfg(feature = "postgres")]
        Form::Postgres => {
            check.expr(takeover::postgres_marker(
                table_name,
                term.resource,
                term.token.get(),
            ));
        }
        #[cfg(feature = "mysql")]
        Form::MySql => {
            check.lock_exclusive();
        }
        _ => {}
    }
    check
}

/// The subquery of the statement-level fence: [`share_locked_check`], except where the
/// backend has no row locks (SQLite: one statement runs under the write lock already).
pub(crate) fn statement_check(d: &dyn Dialect, table: &Alias, term: &Term<'_>) -> SelectStatement {
    if d.locks_rows() {
        return share_locked_check(d, table, term);
    }
    Query::select()
        .expr(Expr::val(1))
        .from(table.clone())
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
    /// End it before the term's lease lapses: on PostgreSQL and MariaDB a rival that asks for
    /// the lapsed lease ends a transaction still open then, which then never commits (see
    /// docs/elector.md, "A holder stalled inside a fenced transaction").
    pub async fn fence<'a, C: ConnectionTrait>(
        &self,
        txn: &C,
        term: impl Into<Term<'a>>,
    ) -> Result<(), FenceError> {
        let term = term.into();
        term.validate()?;
        let form = self.form()?;
        let d = form.dialect();
        let table = self.table_iden();
        let held = match form {
            Form::Sqlite => {
                let stmt = sqlite::statements::write_lock(&table, term.current(d));
                let done = txn
                    .execute(&stmt)
                    .await
                    .map_err(|e| classify(e, self.table()))?;
                done.rows_affected() == 1
            }
            #[cfg(feature = "mysql")]
            Form::MySql if mysql::store::is_galera(self, txn).await? => {
                let touched = txn
                    .execute(&mysql::statements::galera_touch(d, &table, &term))
                    .await
                    .map_err(|e| classify(e, self.table()))?
                    .rows_affected()
                    == 1;
                if touched {
                    txn.execute(&mysql::statements::galera_untouch(&table, &term))
                        .await
                        .map_err(|e| classify(e, self.table()))?;
                }
                touched
            }
            #[allow(unreachable_patterns)] // a build with SQLite alone
            _ => {
                let stmt = locking_check(form, &table, self.table(), &term);
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
    ///
    /// On MySQL/MariaDB the store must know whether the server is a Galera node first, which it
    /// learns at its first grant (or fence, or `execute_fenced`): before that this is
    /// [`FenceError::TopologyUnknown`], and on a Galera node
    /// [`FenceError::StatementFenceOnGalera`]. [`execute_fenced`](Self::execute_fenced) asks the
    /// server itself; a statement you run with your own `execute` is not checked again.
    pub fn fenced_by<'a>(&self, term: impl Into<Term<'a>>) -> Result<Expr, FenceError> {
        let term = term.into();
        term.validate()?;
        let d = self.dialect()?;
        match (self.form()?, self.galera.get()) {
            (_, Some(true)) => return Err(FenceError::StatementFenceOnGalera),
            #[cfg(feature = "mysql")]
            (Form::MySql, None) => return Err(FenceError::TopologyUnknown),
            _ => {}
        }
        let _ = d;
        Ok(Expr::exists(statement_fence(
            self.form()?,
            &self.table_iden(),
            self.table(),
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
        #[cfg(feature = "mysql")]
        if matches!(self.form()?, Form::MySql) && mysql::store::is_galera(self, conn).await? {
            return Err(FenceError::StatementFenceOnGalera);
        }
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
pub(crate) mod tests {
    use super::*;
    use crate::backend::sqlite::Sqlite;
    use sea_orm::sea_query::{MysqlQueryBuilder, PostgresQueryBuilder, SqliteQueryBuilder};

    /// The term the statement tests of every backend fence with.
    pub(crate) fn term() -> Term<'static> {
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
        let update = |form: Form| {
            Query::update()
                .table(Alias::new("jobs"))
                .value(Alias::new("owner_token"), 7i64)
                .and_where(Expr::col(Alias::new("id")).eq(1))
                .and_where(Expr::exists(statement_fence(
                    form,
                    &t,
                    "orionbeacon_leases",
                    &term(),
                )))
                .to_owned()
        };
        let (sql, values) = update(Form::Postgres).build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            r#"UPDATE "jobs" SET "owner_token" = $1 WHERE "id" = $2 AND EXISTS(SELECT $3 FROM "orionbeacon_leases" WHERE "resource" = $4 AND "holder" = $5 AND "fencing_token" = $6 AND "expires_at" > (statement_timestamp()) AND pg_try_advisory_xact_lock_shared($7) IS NOT NULL FOR SHARE)"#
        );
        assert_eq!(values.0.len(), 7);
        let (sql, _) = update(Form::MySql).build(MysqlQueryBuilder);
        assert_eq!(
            sql,
            "UPDATE `jobs` SET `owner_token` = ? WHERE `id` = ? AND EXISTS(SELECT ? FROM `orionbeacon_leases` WHERE `resource` = ? AND `holder` = ? AND `fencing_token` = ? AND `expires_at` > (UTC_TIMESTAMP(6)) LOCK IN SHARE MODE)"
        );
        let (sql, _) = update(Form::Sqlite).build(SqliteQueryBuilder);
        assert_eq!(
            sql,
            r#"UPDATE "jobs" SET "owner_token" = ? WHERE "id" = ? AND EXISTS(SELECT ? FROM "orionbeacon_leases" WHERE "resource" = ? AND "holder" = ? AND "fencing_token" = ? AND "expires_at" > (strftime('%Y-%m-%d %H:%M:%f', 'now')))"#
        );
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
        let (sql, values) = locking_check(Form::Postgres, &t, "orionbeacon_leases", &term())
            .build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            r#"SELECT $1, pg_try_advisory_xact_lock_shared($2) FROM "orionbeacon_leases" WHERE "resource" = $3 AND "holder" = $4 AND "fencing_token" = $5 AND "expires_at" > (statement_timestamp()) FOR SHARE"#
        );
        assert_eq!(values.0.len(), 5);
        let (sql, _) =
            locking_check(Form::MySql, &t, "orionbeacon_leases", &term()).build(MysqlQueryBuilder);
        assert_eq!(
            sql,
            "SELECT ? FROM `orionbeacon_leases` WHERE `resource` = ? AND `holder` = ? AND `fencing_token` = ? AND `expires_at` > (UTC_TIMESTAMP(6)) FOR UPDATE"
        );
        let (sql, _) =
            sqlite::statements::write_lock(&t, term().current(&Sqlite)).build(SqliteQueryBuilder);
        assert_eq!(
            sql,
            r#"UPDATE "orionbeacon_leases" SET "fencing_token" = "fencing_token" WHERE "resource" = ? AND "holder" = ? AND "fencing_token" = ? AND "expires_at" > (strftime('%Y-%m-%d %H:%M:%f', 'now'))"#
        );
    }
}
