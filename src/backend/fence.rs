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

use sea_orm::sea_query::Expr;
use sea_orm::{ConnectionTrait, StatementBuilder};

use super::driver::{Conn, RawConn};
use super::store::SeaOrmLeaseStore;
use super::term_checks::current_check;
use crate::error::StoreError;
use crate::store::{validate_candidate, validate_resource};

pub use crate::error::FenceError;
// The term a fence checks is defined next to `FencingToken`, and the elector converts its
// `LeaderTerm` into it: the backend needs no elector types.
pub use crate::fencing::Term;

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
        let engine = self.engine()?;
        let held = engine.backend.fence(&engine.cx, &Conn(txn), &term).await?;
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
        let engine = self.engine()?;
        Ok(Expr::exists(
            engine.backend.statement_fence(&engine.cx, &term)?,
        ))
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
        let engine = self.engine()?;
        let cx = &engine.cx;
        if engine
            .backend
            .refuses_statement_fence(cx, &Conn(conn))
            .await?
        {
            return Err(FenceError::StatementFenceOnGalera);
        }
        let rows = conn
            .execute(stmt)
            .await
            .map_err(|e| cx.classify(e))?
            .rows_affected();
        if rows > 0 {
            return Ok(rows);
        }
        let check = current_check(cx.dialect, &cx.table_iden(), &term);
        let rows = Conn(conn)
            .query_all(&check)
            .await
            .map_err(|e| cx.classify(e))?;
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

    #[test]
    fn only_a_stale_term_is_fenced() {
        assert!(crate::backend::statements::tests::term()
            .fenced()
            .is_fenced());
        let failed = FenceError::Store(StoreError::InvalidResource {
            name: String::new(),
            reason: "empty",
        });
        assert!(
            !failed.is_fenced(),
            "a failed check is not a verdict on the term"
        );
    }
}
