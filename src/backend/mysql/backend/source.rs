//! Where the store's statements take their connection, and one statement run there, read to
//! the end.

use super::*;

impl MySqlBackend {
    /// Where the store's statements take their connection: its own sessions, or the
    /// application's pool (checked); `None` for connections without a pool.
    pub(super) fn source(&self) -> Option<Source<'_, MySqlDb>> {
        match (&self.own, &self.pool) {
            (Some(own), _) => Some(Source::Own(own)),
            (None, Some(pool)) => Some(Source::Shared(pool)),
            (None, None) => None,
        }
    }

    /// One statement, read to the end, on a connection of `source`.
    pub(super) async fn rows_from(
        &self,
        cx: &Context,
        source: Option<Source<'_, MySqlDb>>,
        stmt: Statement,
    ) -> Result<Vec<QueryResult>, StoreError> {
        match source {
            Some(source) => cx.autocommitted(|| checked::rows(source, &stmt)).await,
            None => cx.read_to_end(stmt).await,
        }
    }

    /// One statement that changes rows, on a connection of `source`: how many it changed.
    pub(super) async fn count_from(
        &self,
        cx: &Context,
        source: Option<Source<'_, MySqlDb>>,
        stmt: Statement,
    ) -> Result<u64, StoreError> {
        match source {
            Some(source) => cx.autocommitted(|| checked::count(source, &stmt)).await,
            None => cx.execute(stmt).await,
        }
    }

    /// The text of `SHOW ENGINE INNODB STATUS` (sent as text: not every server prepares it),
    /// on a connection of `source`; `None` without a pool.
    pub(super) async fn status_from(
        &self,
        cx: &Context,
        source: Option<Source<'_, MySqlDb>>,
        stmt: Statement,
    ) -> Result<Option<String>, StoreError> {
        let Some(source) = source else {
            return Ok(None);
        };
        let text = cx
            .autocommitted(|| checked::text_column(source, &stmt.sql, 2))
            .await?;
        Ok(text)
    }
}
