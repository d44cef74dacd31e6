//! The store's own transactions on MySQL/MariaDB: a write then a read on a pooled connection
//! checked to be outside any transaction, answered only once the `COMMIT` succeeded.

use super::*;

/// `write` then `read` in a transaction of the store's own, on a pooled connection checked to
/// be outside any transaction (see `sessions`): the rows of `read` once `COMMIT` succeeded. A
/// call dropped anywhere before closes the connection (the server rolls back) instead of
/// handing it back to the pool mid-transaction, which SeaORM's `begin()` cannot promise.
pub(super) async fn in_transaction(
    cx: &Context,
    source: Source<'_, MySqlDb>,
    begin: Begin,
    write: &Statement,
    read: &Statement,
) -> Result<Vec<QueryResult>, StoreError> {
    let (rows, after) = cx
        .autocommitted(|| async {
            let Some(mut txn) = Transaction::begin(source, begin).await? else {
                return Ok(Checked::InAbandonedTransaction);
            };
            txn.execute(write).await?;
            // The write holds the rows' locks until commit: this reads what it left.
            let rows = txn.rows(read).await?;
            // Nothing is reported before the commit is known, and what it left is read again.
            let after = txn.commit_then_rows(read).await?;
            Ok(Checked::Committed((rows, after)))
        })
        .await?;
    committed_as_read(cx, rows, &after)
}

/// `rows`, read inside the transaction, once `after` (the same read once the `COMMIT` returned)
/// shows the same writes; otherwise a retryable conflict, neither a grant nor a renew.
///
/// A `COMMIT` that answers OK is not proof on Galera: a brute-force abort by a replicated
/// write-set can roll a transaction back between its statements without the statements or
/// the `COMMIT` after it reporting an error (seen on MariaDB 10.11: the read inside found no
/// row after the upsert, and the `COMMIT` succeeded). The read inside would then report a
/// write that never committed, such as a new term with the token a rival now holds. The same
/// holder, token and expiry after the commit mean the rows reported are committed ones: either
/// this transaction's writes, or (when it was rolled back before its read, which then ran on
/// its own) the rows as they were, whose expiry and time left are then reported truly, so a
/// caller's deadline still comes from the committed expiry.
pub(super) fn committed_as_read(
    cx: &Context,
    rows: Vec<QueryResult>,
    after: &[QueryResult],
) -> Result<Vec<QueryResult>, StoreError> {
    let inside = writes(&rows).map_err(|e| cx.decode_error(e))?;
    let committed = writes(after).map_err(|e| cx.decode_error(e))?;
    if inside == committed {
        return Ok(rows);
    }
    tracing::warn!(
        table = cx.table(),
        read_inside = inside.len(),
        read_after = committed.len(),
        "the rows after COMMIT differ from the rows read inside the transaction (rolled back \
         under it, e.g. a Galera brute-force abort); not a grant"
    );
    Err(StoreError::Conflict {
        source: DbErr::Custom(
            "the lease rows after COMMIT differ from those read inside the transaction: it was \
             rolled back under it (a Galera brute-force abort?)"
                .to_owned(),
        )
        .into(),
    })
}

/// The writes rows of `returned_row` (and `renewed_row`, with the resource last) name: holder,
/// token, expiry and resource, sorted; the time left is left out, it moves.
pub(super) fn writes(rows: &[QueryResult]) -> Result<Vec<WriteKey>, DbErr> {
    let mut out = rows
        .iter()
        .map(|row| {
            Ok((
                row.try_get_by_index(0)?,
                row.try_get_by_index(1)?,
                row.try_get_by_index(2)?,
                row.try_get_by_index::<String>(6).ok(),
            ))
        })
        .collect::<Result<Vec<WriteKey>, DbErr>>()?;
    out.sort();
    Ok(out)
}

type WriteKey = (String, i64, chrono::DateTime<chrono::Utc>, Option<String>);
