//! The acquire-or-renew upsert in the server's form (`RETURNING` on MariaDB, a transaction of
//! the store's own for MySQL), and which form a server takes.

use super::transaction::in_transaction;
use super::*;

impl MySqlBackend {
    /// The rows after the upsert, read to the end, in the server's form.
    pub(super) async fn upsert(
        &self,
        cx: &Context,
        resource: &str,
        candidate: &str,
        millis: i64,
        payload: Option<&str>,
    ) -> Result<Vec<QueryResult>, StoreError> {
        let table = cx.table_iden();
        match self.form(cx).await? {
            MySqlUpsert::Returning => {
                let stmt = self
                    .acquire_prepared(cx)?
                    .bind_with(resource, candidate, millis, payload);
                self.deciding(cx, stmt).await
            }
            MySqlUpsert::Transaction => {
                let upsert = statements::upsert(&table, resource, candidate, millis, payload)
                    .map_err(|e| StoreError::Database(e.into()))?;
                let read = shared::current(&MySql, &table, resource);
                if let Some(source) = self.source() {
                    let (upsert, read) = (
                        DbBackend::MySql.build(&upsert),
                        DbBackend::MySql.build(&read),
                    );
                    return in_transaction(cx, source, Begin::ReadWrite, &upsert, &read).await;
                }
                let (rows, after) = cx
                    .with_retry(|| async {
                        let txn = cx.db.begin().await?;
                        txn.execute(&upsert).await?;
                        // The upsert holds the row's lock until commit: this reads what it left.
                        let rows = txn.query_all(&read).await?;
                        // Nothing is reported before the commit is known.
                        txn.commit().await?;
                        let after = cx.db.query_all(&read).await?;
                        Ok((rows, after))
                    })
                    .await?;
                committed_as_read(cx, rows, &after)
            }
        }
    }

    /// Runs the MariaDB form, read to the end, known to have committed on its own.
    pub(super) async fn deciding(
        &self,
        cx: &Context,
        stmt: Statement,
    ) -> Result<Vec<QueryResult>, StoreError> {
        match self.source() {
            Some(source) => {
                cx.autocommitted(|| checked::deciding(source, &stmt, IN_TRANSACTION_COLUMN))
                    .await
            }
            None => cx.read_to_end(stmt).await,
        }
    }

    /// The upsert form of the server, from `SELECT VERSION()`, once per store (unless set with
    /// `with_mysql_upsert`).
    pub(super) async fn form(&self, cx: &Context) -> Result<MySqlUpsert, StoreError> {
        let form = self
            .upsert
            .get_or_try_init(|| async {
                let version = self
                    .rows(
                        cx,
                        Statement::from_string(DbBackend::MySql, "SELECT VERSION()"),
                    )
                    .await?
                    .into_iter()
                    .next()
                    .map(|row| row.try_get_by_index::<String>(0))
                    .transpose()
                    .map_err(|e| StoreError::Database(e.into()))?
                    .unwrap_or_default();
                let form = MySqlUpsert::for_version(&version);
                tracing::debug!(%version, ?form, "MySQL upsert form chosen");
                Ok::<_, StoreError>(form)
            })
            .await?;
        Ok(*form)
    }
}
