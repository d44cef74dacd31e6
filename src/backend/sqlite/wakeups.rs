//! SQLite wake-ups: a release in any process on the same file wakes this process's waiters at
//! once, instead of at their next poll.
//!
//! SQLite has no notification channel, but every commit writes the database's files (the
//! `-wal` file in WAL mode, the file itself or its `-journal` otherwise). The store watches the
//! file's directory (`notify`: inotify on Linux, kqueue on the BSDs and macOS,
//! ReadDirectoryChangesW on Windows) and, after a change, reads which leases are live on a
//! connection of its own; a lease that was live at its previous look and is not any more
//! (released, revoked, or lapsed) is announced to the subscribers, as PostgreSQL's
//! notifications are. It is only a wake-up: the waiter then asks the store as at any poll, and
//! a missed change (a file system without change events, a network file system, an error)
//! costs one poll interval, never correctness.
//!
//! Cost: one read of the live leases (`resource` of every live row) per burst of writes to the
//! file (a burst ends after [`SETTLE`] without writes, or after [`MOST`]), while any clone of
//! the store lives and something has subscribed; one extra connection (a file handle) and one
//! watch on the directory. A release wakes the waiters a few milliseconds after its commit.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use notify::{EventKind, RecursiveMode, Watcher};
use sea_orm::sea_query::{Alias, Expr, ExprTrait, Query, SqliteQueryBuilder};
use sea_orm::sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use sea_orm::{DatabaseConnection, DatabaseConnectionType};
use tokio::sync::{broadcast, Notify};
use tokio_util::sync::CancellationToken;

use super::Sqlite;
use crate::backend::dialect::Dialect;
use crate::store::ReleaseEvents;

/// How long the files must stay unchanged before the live leases are read. A commit is
/// visible to readers only once its last page is written and the WAL index updated, a moment
/// after the first write the watcher hears of; a read at the first write would miss it.
pub(crate) const SETTLE: Duration = Duration::from_millis(2);
/// The longest a burst of writes holds the read back: a file written without pause is still
/// read this often.
pub(crate) const MOST: Duration = Duration::from_millis(20);

/// The fan-out point, shared by the clones of one store. Dropping the last clone stops the
/// watcher and closes its connection.
#[derive(Debug)]
pub(crate) struct WakeHub {
    tx: broadcast::Sender<Arc<str>>,
    stop: CancellationToken,
}

impl Drop for WakeHub {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The hub of one store, made on the first subscription (`None`: this store has none, e.g.
/// an in-memory database, or the directory could not be watched).
pub(crate) type HubCell = Arc<OnceLock<Option<Arc<WakeHub>>>>;

/// Subscribes to wake-ups for `table`, starting the watcher on first use. `None` for a
/// connection that is no SQLite file pool, or outside a tokio runtime.
pub(crate) fn subscribe(
    cell: &HubCell,
    db: &DatabaseConnection,
    table: &Arc<str>,
) -> Option<ReleaseEvents> {
    if !matches!(
        db.inner,
        DatabaseConnectionType::SqlxSqlitePoolConnection(_)
    ) {
        return None;
    }
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    let hub = cell.get_or_init(|| {
        let options = (*db.get_sqlite_connection_pool().connect_options()).clone();
        start(&runtime, options, table)
    });
    Some(hub.as_ref()?.tx.subscribe())
}

/// The file a connection opens, if it is a file (not an in-memory database).
fn database_file(options: &SqliteConnectOptions) -> Option<PathBuf> {
    std::fs::canonicalize(options.get_filename())
        .ok()
        .filter(|p| p.is_file())
}

/// Whether `path` is one of the files a commit to `file` writes.
fn written_by_commits(path: &Path, file: &Path) -> bool {
    let (Some(dir), Some(name)) = (file.parent(), file.file_name()) else {
        return false;
    };
    if path.parent() != Some(dir) {
        return false;
    }
    let Some(changed) = path.file_name() else {
        return false;
    };
    let name = name.to_string_lossy();
    let changed = changed.to_string_lossy();
    changed == name || changed == format!("{name}-wal") || changed == format!("{name}-journal")
}

fn start(
    runtime: &tokio::runtime::Handle,
    options: SqliteConnectOptions,
    table: &Arc<str>,
) -> Option<Arc<WakeHub>> {
    let file = database_file(&options)?;
    let dir = file.parent()?.to_path_buf();
    let changed = Arc::new(Notify::new());
    let seen = changed.clone();
    let watched = file.clone();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else { return };
        if matches!(event.kind, EventKind::Access(_)) {
            return;
        }
        if event.paths.iter().any(|p| written_by_commits(p, &watched)) {
            seen.notify_one();
        }
    })
    .map_err(|error| tracing::debug!(%error, "no SQLite wake-ups: cannot watch files"))
    .ok()?;
    if let Err(error) = watcher.watch(&dir, RecursiveMode::NonRecursive) {
        tracing::debug!(%error, dir = %dir.display(), "no SQLite wake-ups: cannot watch the directory");
        return None;
    }
    let hub = Arc::new(WakeHub {
        tx: broadcast::channel(256).0,
        stop: CancellationToken::new(),
    });
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .connect_lazy_with(options);
    runtime.spawn(watch(
        watcher,
        pool,
        live_query(table),
        Arc::downgrade(&hub),
        hub.stop.clone(),
        changed,
    ));
    Some(hub)
}

/// The resources whose lease is live now, by the database clock.
fn live_query(table: &str) -> String {
    Query::select()
        .column(orion_beacon_entity::lease::Column::Resource)
        .from(Alias::new(table))
        .and_where(Expr::col(orion_beacon_entity::lease::Column::ExpiresAt).gt(Sqlite.now()))
        .to_string(SqliteQueryBuilder)
}

async fn live(pool: &SqlitePool, query: &str) -> Result<HashSet<String>, sea_orm::sqlx::Error> {
    // The text is ours (a validated, quoted table name, no values).
    let query = sea_orm::sqlx::AssertSqlSafe(query.to_owned());
    let rows: Vec<String> = sea_orm::sqlx::query_scalar(query).fetch_all(pool).await?;
    Ok(rows.into_iter().collect())
}

async fn watch(
    _watcher: notify::RecommendedWatcher,
    pool: SqlitePool,
    query: String,
    hub: Weak<WakeHub>,
    stop: CancellationToken,
    changed: Arc<Notify>,
) {
    let mut was_live = live(&pool, &query).await.unwrap_or_default();
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => break,
            () = changed.notified() => {}
        }
        // The burst's end: SETTLE without a change, or MOST after its start.
        let most = tokio::time::Instant::now() + MOST;
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => return pool.close().await,
                () = tokio::time::sleep(SETTLE) => break,
                () = changed.notified() => {
                    if tokio::time::Instant::now() >= most {
                        break;
                    }
                }
            }
        }
        let Some(hub) = hub.upgrade() else { break };
        match live(&pool, &query).await {
            Ok(now_live) => {
                for ended in was_live.difference(&now_live) {
                    // Nobody listening is fine: waiters poll anyway.
                    let _ = hub.tx.send(Arc::from(ended.as_str()));
                }
                was_live = now_live;
            }
            Err(error) => {
                tracing::debug!(%error, "SQLite wake-ups: reading the live leases failed; waiters poll")
            }
        }
    }
    pool.close().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_files_a_commit_writes() {
        let file = Path::new("/data/app.db");
        for (path, written) in [
            ("/data/app.db", true),
            ("/data/app.db-wal", true),
            ("/data/app.db-journal", true),
            ("/data/app.db-shm", false),
            ("/data/other.db-wal", false),
            ("/elsewhere/app.db-wal", false),
        ] {
            assert_eq!(written_by_commits(Path::new(path), file), written, "{path}");
        }
    }

    #[test]
    fn the_live_read() {
        assert_eq!(
            live_query("orionbeacon_leases"),
            r#"SELECT "resource" FROM "orionbeacon_leases" WHERE "expires_at" > (strftime('%Y-%m-%d %H:%M:%f', 'now'))"#
        );
    }
}
