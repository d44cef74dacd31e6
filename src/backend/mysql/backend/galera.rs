//! Whether the server is a Galera cluster node, asked once per store (on the application's
//! pool, or on the connection a statement already holds).

use super::*;

impl MySqlBackend {
    /// [`is_galera`](Self::is_galera), asked on a checked pooled connection (the store's own
    /// look, at its first grant).
    pub(super) async fn galera_on_pool(&self, cx: &Context) -> Result<bool, StoreError> {
        let galera = self
            .galera
            .get_or_try_init(|| async {
                let stmt = Statement::from_string(DbBackend::MySql, GALERA_QUESTION);
                let on = match self.rows(cx, stmt).await {
                    Ok(rows) => {
                        rows.first()
                            .map(|r| r.try_get_by_index::<i64>(0))
                            .transpose()
                            .map_err(|e| StoreError::Database(e.into()))?
                            .unwrap_or(0)
                            != 0
                    }
                    Err(StoreError::Database(crate::error::BackendError::SeaOrm(e)))
                        if error_number(&e) == Some(UNKNOWN_SYSTEM_VARIABLE) =>
                    {
                        false
                    }
                    Err(e) => return Err(e),
                };
                tracing::debug!(galera = on, "MySQL replication detected");
                Ok::<_, StoreError>(on)
            })
            .await?;
        Ok(*galera)
    }

    /// Whether the server replicates with Galera (`@@GLOBAL.wsrep_on`), where row locks stay
    /// on their node and the fence must write instead. Servers without the variable (MySQL)
    /// are not. Asked on `conn` (the caller's transaction: no second pooled connection is
    /// needed, and a proxy cannot send the question elsewhere), once per store.
    pub(super) async fn is_galera(
        &self,
        cx: &Context,
        conn: &dyn RawConn,
    ) -> Result<bool, StoreError> {
        let galera = self
            .galera
            .get_or_try_init(|| async {
                let stmt = Statement::from_string(DbBackend::MySql, GALERA_QUESTION);
                let on = match conn.query_one_raw(stmt).await {
                    Ok(row) => {
                        row.map(|r| r.try_get_by_index::<i64>(0))
                            .transpose()
                            .map_err(|e| StoreError::Database(e.into()))?
                            .unwrap_or(0)
                            != 0
                    }
                    // MySQL, or a MariaDB built without wsrep: no such variable. Any other
                    // error is not an answer (and is not cached): try again next time.
                    Err(e) if error_number(&e) == Some(UNKNOWN_SYSTEM_VARIABLE) => false,
                    Err(e) => return Err(cx.classify(e)),
                };
                tracing::debug!(galera = on, "MySQL replication detected");
                Ok::<_, StoreError>(on)
            })
            .await?;
        Ok(*galera)
    }
}
