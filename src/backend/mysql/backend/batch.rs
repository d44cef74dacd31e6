//! The batch renew of every lease this store holds: one statement where the server can, else
//! one transaction of the store's own.

use super::*;

impl MySqlBackend {
    /// The batch renew in one transaction: its live rows locked ([`statements::lock_batch`],
    /// `busy` saying what a row another transaction holds does), the rows locked renewed, and
    /// the read of what it renewed; the rows once it has committed. REPEATABLE READ whatever
    /// the session's level (READ COMMITTED refuses writes where the binary log is
    /// statement-based): the rows it renews stay locked to the end, so no other renew can
    /// write one before the read, which would report it as renewed by this call. A row its
    /// condition rejects (lapsed, another term's) stays locked as long, too: a few
    /// milliseconds, since nothing in the transaction waits. A row it would not wait for (or
    /// waited for in vain) rolls the transaction back cleanly and is the error.
    pub(super) async fn renew_batch(
        &self,
        cx: &Context,
        json: String,
        millis: i64,
        busy: statements::Busy,
    ) -> Result<Vec<QueryResult>, StoreError> {
        let table = cx.table_iden();
        let lock = statements::lock_batch(&table, json, busy)
            .map_err(|e| StoreError::Database(e.into()))?;
        // The keys the lock read returned, as the batch's JSON document (`None`: no row).
        let locked = |rows: &[QueryResult]| -> Result<Option<String>, DbErr> {
            let keys = rows
                .iter()
                .map(|r| {
                    Ok(serde_json::json!({
                        "r": r.try_get_by_index::<String>(0)?,
                        "h": r.try_get_by_index::<String>(1)?,
                        "t": r.try_get_by_index::<i64>(2)?,
                    }))
                })
                .collect::<Result<Vec<_>, DbErr>>()?;
            Ok((!keys.is_empty()).then(|| serde_json::Value::Array(keys).to_string()))
        };
        let statements = |json: String| -> Result<(Statement, Statement), DbErr> {
            let update = statements::renew_all(&table, json.clone(), millis)?;
            let read = DbBackend::MySql.build(&statements::renewed(&table, json));
            Ok((update, read))
        };
        if let Some(source) = self.source() {
            let (rows, after) = cx
                .autocommitted(|| async {
                    let Some(mut txn) = Transaction::begin(source, Begin::RepeatableRead).await?
                    else {
                        return Ok(Checked::InAbandonedTransaction);
                    };
                    let keys = match txn.rows(&lock).await {
                        Ok(keys) => keys,
                        Err(err) if errors::row_busy(&err) => {
                            txn.rollback().await?;
                            return Err(err);
                        }
                        Err(err) => return Err(err),
                    };
                    let Some(json) = locked(&keys)? else {
                        txn.commit().await?;
                        return Ok(Checked::Committed((Vec::new(), Vec::new())));
                    };
                    let (update, read) = statements(json)?;
                    txn.execute(&update).await?;
                    // The update holds the rows' locks until commit: this reads what it left.
                    let rows = txn.rows(&read).await?;
                    // Nothing is reported before the commit is known, and what it left is
                    // read again.
                    let after = txn.commit_then_rows(&read).await?;
                    Ok(Checked::Committed((rows, after)))
                })
                .await?;
            return committed_as_read(cx, rows, &after);
        }
        let (rows, after) = cx
            .with_retry(|| async {
                let txn = cx
                    .db
                    .begin_with_config(Some(sea_orm::IsolationLevel::RepeatableRead), None)
                    .await?;
                let keys = txn.query_all_raw(lock.clone()).await?;
                let Some(json) = locked(&keys)? else {
                    txn.commit().await?;
                    return Ok((Vec::new(), Vec::new()));
                };
                let (update, read) = statements(json)?;
                txn.execute_raw(update).await?;
                let rows = txn.query_all_raw(read.clone()).await?;
                txn.commit().await?;
                let after = cx.db.query_all_raw(read).await?;
                Ok((rows, after))
            })
            .await?;
        committed_as_read(cx, rows, &after)
    }
}
