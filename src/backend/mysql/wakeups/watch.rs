//! The watchers: a connection per waited-for lease that waits on its holder's name.

use super::signals::{bounded, timed_out};
use super::*;

/// Waits for `resource`'s holder to let go of its name, then tells the waiters.
pub(super) async fn watch_task(
    hub: Weak<Hub>,
    resource: Arc<str>,
    task: u64,
    pool: MySqlPool,
    stop: CancellationToken,
) {
    let Some((table, mut usable)) = hub
        .upgrade()
        .map(|h| (Arc::clone(&h.table), h.usable.subscribe()))
    else {
        return;
    };
    // The named-lock check first (bounded: it gives its answer within its own timeouts).
    let checked = tokio::select! {
        () = stop.cancelled() => None,
        answer = usable.wait_for(|u| *u != Usable::Unknown) => answer.ok().map(|u| *u),
    };
    // Still waited for (the check may have taken a while): only then a connection.
    let wanted = hub
        .upgrade()
        .and_then(|h| h.watched_until(&resource, task))
        .is_some();
    if checked != Some(Usable::Yes) || !wanted {
        if let Some(hub) = hub.upgrade() {
            hub.unwatch(&resource, task);
        }
        return;
    }
    let mut conn = match tokio::select! {
        () = stop.cancelled() => None,
        conn = pool.acquire() => conn.ok(),
    } {
        Some(conn) => conn,
        None => {
            if let Some(hub) = hub.upgrade() {
                hub.unwatch(&resource, task);
            }
            return;
        }
    };
    let body = watch_on(&mut conn, &hub, &resource, task, &table);
    let ended = tokio::select! {
        () = stop.cancelled() => Err(None),
        ended = body => ended,
    };
    if let Some(hub) = hub.upgrade() {
        hub.unwatch(&resource, task);
    }
    match ended {
        // Back to the pool only after a complete answer.
        Ok(released) => {
            drop(conn);
            if released {
                if let Some(hub) = hub.upgrade() {
                    tracing::trace!(%resource, "woken by the holder's named lock");
                    let _ = hub.tx.send(resource);
                }
            }
        }
        Err(error) => {
            if let Some(error) = error {
                tracing::debug!(%error, %resource, "MySQL wake-up watch failed; the waiter polls");
            }
            // Cut off mid-statement (or failed): closed, not handed back.
            drop(conn.detach());
        }
    }
}

/// The watch itself: whether the holder let go (`Ok(true)`), or the watch ended without (the
/// lease's time is up, nobody holds the name).
async fn watch_on(
    conn: &mut MySqlConnection,
    hub: &Weak<Hub>,
    resource: &Arc<str>,
    task: u64,
    table: &str,
) -> Result<bool, Option<sea_orm::sqlx::Error>> {
    let mut unheld = 0;
    let mut watchers = 0;
    // Whether this watch saw a holder's signal connection hold the name yet.
    let mut signalled = false;
    loop {
        let Some(until) = hub.upgrade().and_then(|h| h.watched_until(resource, task)) else {
            return Ok(false);
        };
        // Who holds the name, and whether that session is a holder's signal connection (it
        // holds its own signal name) or another watcher letting go of it a moment later.
        let sql = format!(
            "SELECT CAST(o AS SIGNED), CAST(IS_USED_LOCK(CONCAT('{SIGNAL_PREFIX}', o)) AS SIGNED) \
             FROM (SELECT IS_USED_LOCK({NAME}) AS o) AS owner"
        );
        let row = bounded(
            sea_orm::sqlx::query(sea_orm::sqlx::AssertSqlSafe(sql))
                .bind(table)
                .bind(&**resource)
                .fetch_one(&mut *conn),
        )
        .await
        .map_err(Some)?;
        let owner: Option<i64> = row.try_get(0).map_err(Some)?;
        let signal: Option<i64> = row.try_get(1).map_err(Some)?;
        match owner {
            // Free before any signal was seen: possibly released since the waiter's denial
            // (the name may also have passed through another watcher's hands meanwhile).
            None if !signalled && hub.upgrade().is_some_and(|h| h.free_since_denial(resource)) => {
                tracing::trace!(%resource, "the name is free since the denial: waking the waiters once");
                return Ok(true);
            }
            None => {
                // Nothing signals this lease (yet): look a few more times, then poll.
                let Some(pause) = UNHELD_LOOKS.get(unheld) else {
                    return Ok(false);
                };
                unheld += 1;
                tokio::time::sleep(*pause).await;
                continue;
            }
            Some(o) if signal != Some(o) => {
                // Another watcher's moment: look again shortly.
                watchers += 1;
                if watchers > WATCHER_LOOKS {
                    return Ok(false);
                }
                tokio::time::sleep(WATCHER_PAUSE).await;
                continue;
            }
            Some(_) => signalled = true,
        }
        let left = until.saturating_duration_since(crate::clock::now());
        // Whole seconds (every server version takes them), at least one, at most a chunk.
        let secs = left.as_secs().saturating_add(1).min(LONGEST_WAIT_SECS);
        let sql = format!("SELECT CAST(GET_LOCK({NAME}, ?) AS SIGNED)");
        let wait = sea_orm::sqlx::query(sea_orm::sqlx::AssertSqlSafe(sql))
            .bind(table)
            .bind(&**resource)
            .bind(i64::try_from(secs).unwrap_or(i64::MAX))
            .fetch_one(&mut *conn);
        let limit = Duration::from_secs(secs).saturating_add(STATEMENT_TIMEOUT);
        let got: Option<i64> = match tokio::time::timeout(limit, wait).await {
            Ok(row) => row.and_then(|row| row.try_get(0)).map_err(Some)?,
            Err(_) => return Err(Some(timed_out())),
        };
        match got {
            Some(1) => {
                // Ours for a moment: let go at once, so the next holder can take it.
                let sql = format!("SELECT CAST(RELEASE_LOCK({NAME}) AS SIGNED)");
                bounded(
                    sea_orm::sqlx::query(sea_orm::sqlx::AssertSqlSafe(sql))
                        .bind(table)
                        .bind(&**resource)
                        .fetch_one(&mut *conn),
                )
                .await
                .map_err(Some)?;
                return Ok(true);
            }
            // Timed out: wait again while the watch lasts.
            Some(_) => {
                unheld = 0;
                watchers = 0;
            }
            // An error the server reports as NULL (the session killed, say).
            None => return Ok(false),
        }
    }
}
