//! A store's backend and what its code is given, made once per store (and shared by its
//! clones).

use sea_orm::{QueryResult, Statement};

use super::context::Context;
use super::driver::LeaseBackend;
use super::gate::Gate;
use super::prepared::Prepared;
use super::row::Row;
use crate::StoreError;

pub(crate) struct Engine {
    pub(crate) cx: Context,
    pub(crate) backend: Box<dyn LeaseBackend>,
    /// The takeovers asked for by dropped acquires (see `takeover`): one at a time per store.
    pub(crate) takeovers: std::sync::Arc<Gate>,
}

impl Engine {
    /// A statement that reads or releases, read to the end on a checked connection.
    pub(crate) async fn plain(&self, stmt: Statement) -> Result<Vec<QueryResult>, StoreError> {
        self.backend.rows(&self.cx, stmt).await
    }

    /// A statement that changes rows: how many, on a checked connection.
    pub(crate) async fn counted(&self, stmt: Statement) -> Result<u64, StoreError> {
        self.backend.count(&self.cx, stmt).await
    }

    /// The acquire-or-renew statement of this backend, rendered once.
    pub(crate) fn acquire_prepared(&self) -> Result<&Prepared, StoreError> {
        self.backend.acquire_prepared(&self.cx)
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
            Ok(!self.plain(stmt).await?.is_empty())
        } else {
            Ok(self.counted(stmt).await? > 0)
        }
    }

    /// The stored row of `resource`, read with a plain statement.
    pub(crate) async fn read_row(&self, resource: &str) -> Result<Option<Row>, StoreError> {
        let stmt = self.cx.current_statement(resource)?;
        let row = self.plain(stmt).await?.into_iter().next();
        row.map(|r| Row::decode(&r))
            .transpose()
            .map_err(|source| self.cx.decode_error(source))
    }
}
