//! SQLite wake-ups: a release in any process on the same file wakes this process's waiters
//! within milliseconds, instead of at their next poll.
//!
//! SQLite has no notification channel, but every commit writes the database's files (the
//! `-wal` file in WAL mode, the file itself and its `-journal` otherwise). The store watches
//! the file's directory (`notify`: inotify on Linux, FSEvents on macOS, ReadDirectoryChangesW
//! on Windows; only Linux is tested) and, after a burst of writes, waits until a commit is
//! visible on a connection of its own (`PRAGMA data_version` changes: a commit is visible only
//! after its last page, its sync and the WAL index, none of which the watcher hears of), then
//! reads the leases that are live or were written since its previous read; it keeps looking
//! at growing gaps until the burst is quiet ([`VISIBLE_WITHIN`]), as the burst's last commit
//! may become visible after an earlier one was read. A lease that was
//! live at the previous read and is not any more, or that was written since and is not live
//! now (a short hold), is announced to the subscribers, as PostgreSQL's notifications are. It
//! is only a wake-up: the waiter then asks the store as at any poll, and a missed change (a
//! file system without change events, a network file system, kqueue-only platforms, an
//! error) costs one poll interval, never correctness. A lease that lapses is announced at the
//! file's next write, not when it lapses (waiters know the holder's expiry from their denial).
//!
//! Cost: while any clone of the store lives and something is subscribed, one inotify (or
//! equivalent) watch and notify's thread, one connection (a file handle, sqlx's worker
//! thread), and per burst of writes to the file (a burst ends after [`SETTLE`] without writes,
//! or after [`MOST`]) about ten `PRAGMA data_version` over half a second and one read
//! (`resource` of the live rows and of those written since the last read) per commit seen, at
//! most [`READS_PER_WINDOW`] in any [`READ_WINDOW`]. Every write counts, the application's own
//! to other tables included.

use crate::mutex::lock;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use notify::{EventKind, RecursiveMode, Watcher};
use sea_orm::sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use sea_orm::sqlx::AssertSqlSafe;
use sea_orm::{DatabaseConnection, DatabaseConnectionType};
use tokio::sync::{broadcast, Notify};
use tokio_util::sync::CancellationToken;

use crate::store::ReleaseEvents;

/// How long the files must stay unchanged before the watcher looks: a commit writes several
/// pages in a row.
pub(crate) const SETTLE: Duration = Duration::from_millis(2);
/// The longest a burst of writes holds the look back: a file written without pause is still
/// looked at this often.
pub(crate) const MOST: Duration = Duration::from_millis(20);
/// The most reads of the leases in any [`READ_WINDOW`]: on average one every 10 ms, and a
/// release right after another read is still read at once.
pub(crate) const READS_PER_WINDOW: usize = 4;
pub(crate) const READ_WINDOW: Duration = Duration::from_millis(40);
/// The pause after a failed look.
const AFTER_A_FAILURE: Duration = Duration::from_millis(10);
/// After a burst, the gaps between the watcher's looks at `data_version`, until one whole run
/// of them shows no new commit. A commit's write event comes before the commit is visible (its
/// sync and the WAL index come after) and no event comes after it, so a burst is followed until
/// it is quiet: a commit seen, or a new burst, starts the run over (the burst's next commit may
/// still be in its sync). Growing gaps keep the lag within about the sync's own time.
const VISIBLE_WITHIN: [Duration; 10] = [
    Duration::ZERO,
    Duration::from_millis(1),
    Duration::from_millis(2),
    Duration::from_millis(4),
    Duration::from_millis(8),
    Duration::from_millis(16),
    Duration::from_millis(32),
    Duration::from_millis(64),
    Duration::from_millis(128),
    Duration::from_millis(256),
];
/// How far back the first read looks for leases written and ended (a release between a
/// subscriber's denial and the watcher's start).
const FIRST_LOOK_BACK: &str = "-5 seconds";

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

#[derive(Debug, Default)]
enum State {
    /// Not tried yet, or tried when the file did not exist (a lazy connection): tried again at
    /// the next subscription.
    #[default]
    Untried,
    Running(Arc<WakeHub>),
    /// No wake-ups for this store (an in-memory database, a directory that cannot be watched).
    Off,
}

/// The watcher of one store and table, started on the first subscription.
#[derive(Debug, Clone, Default)]
pub(crate) struct HubCell(Arc<Mutex<State>>);

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
    let mut state = lock(&cell.0);
    match &*state {
        State::Running(hub) => return Some(hub.tx.subscribe()),
        State::Off => return None,
        State::Untried => {}
    }
    let options = db.get_sqlite_connection_pool().connect_options();
    match start(&runtime, options.get_filename(), table) {
        Started::Running(hub, first) => {
            *state = State::Running(hub);
            Some(first)
        }
        Started::NotYet => None,
        Started::Off => {
            *state = State::Off;
            None
        }
    }
}

enum Started {
    /// The hub, and the first subscription (made before the watcher's first read, which only
    /// runs while someone is subscribed).
    Running(Arc<WakeHub>, ReleaseEvents),
    /// The file does not exist (yet).
    NotYet,
    Off,
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

/// Whether an event may be a commit to `file`: a change to one of its files, or an event that
/// says events were lost (a rescan, an error).
fn may_be_a_commit(event: &notify::Result<notify::Event>, file: &Path) -> bool {
    match event {
        Err(_) => true,
        Ok(event) if event.need_rescan() || event.paths.is_empty() => true,
        Ok(event) if matches!(event.kind, EventKind::Access(_)) => false,
        Ok(event) => event.paths.iter().any(|p| written_by_commits(p, file)),
    }
}

fn start(runtime: &tokio::runtime::Handle, filename: &Path, table: &Arc<str>) -> Started {
    let Ok(file) = std::fs::canonicalize(filename) else {
        return Started::NotYet;
    };
    if !file.is_file() {
        return Started::Off;
    }
    let Some(dir) = file.parent().map(Path::to_path_buf) else {
        return Started::Off;
    };
    let changed = Arc::new(Notify::new());
    let seen = changed.clone();
    let watched = file.clone();
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if may_be_a_commit(&event, &watched) {
            seen.notify_one();
        }
    });
    let mut watcher = match watcher {
        Ok(watcher) => watcher,
        Err(error) => {
            tracing::warn!(%error, "no SQLite wake-ups: cannot watch files; waiters poll");
            return Started::Off;
        }
    };
    if let Err(error) = watcher.watch(&dir, RecursiveMode::NonRecursive) {
        tracing::warn!(%error, dir = %dir.display(), "no SQLite wake-ups: cannot watch the directory; waiters poll");
        return Started::Off;
    }
    let hub = Arc::new(WakeHub {
        tx: broadcast::channel(256).0,
        stop: CancellationToken::new(),
    });
    let first = hub.tx.subscribe();
    runtime.spawn(watch(
        watcher,
        reader(&file),
        Reads::new(table),
        Arc::downgrade(&hub),
        hub.stop.clone(),
        changed,
    ));
    Started::Running(hub, first)
}

/// The watcher's own connection: options of its own, not the application's (whose locking
/// mode, file creation, `optimize` on close or hooks must not apply to it), on the file
/// resolved once; kept open, so that `data_version` compares reads of one connection.
fn reader(file: &Path) -> SqlitePool {
    let options = SqliteConnectOptions::new()
        .filename(file)
        .create_if_missing(false)
        .busy_timeout(Duration::from_millis(500));
    SqlitePoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_lazy_with(options)
}

/// The watcher's statements for one table.
struct Reads {
    /// The database's now, and that now less [`FIRST_LOOK_BACK`].
    now: String,
    /// The leases live at `?1` (a now), and those written since `?2` (the previous now),
    /// each with whether it is live, and its holder.
    leases: String,
}

impl Reads {
    fn new(table: &str) -> Self {
        Self {
            now: format!(
                "SELECT strftime('%Y-%m-%d %H:%M:%f', 'now'), strftime('%Y-%m-%d %H:%M:%f', 'now', '{FIRST_LOOK_BACK}')"
            ),
            // The table name is validated (letters, digits, `_`).
            leases: format!(
                "SELECT \"resource\", \"expires_at\" > ?1, \"holder\" FROM \"{table}\" WHERE \"expires_at\" > ?1 OR \"renewed_at\" >= ?2"
            ),
        }
    }
}

/// What the watcher knew at its previous read.
#[derive(Default)]
struct Seen {
    /// The live leases and their holders.
    live: HashMap<String, String>,
    /// The database's now at that read.
    at: Option<String>,
    /// `data_version` then.
    version: Option<i64>,
}

async fn data_version(pool: &SqlitePool) -> Result<i64, sea_orm::sqlx::Error> {
    sea_orm::sqlx::query_scalar("PRAGMA data_version")
        .fetch_one(pool)
        .await
}

/// Reads the leases and returns those that stopped being live since `seen` (updating it), and
/// those that became an offer to a successor since (the one offered looks at once): a live row
/// whose holder is an offer's (see `LeaseStore::offer`) and was not at the previous read.
async fn ended(
    pool: &SqlitePool,
    reads: &Reads,
    seen: &mut Seen,
) -> Result<Vec<String>, sea_orm::sqlx::Error> {
    let (now, back): (String, String) = sea_orm::sqlx::query_as(AssertSqlSafe(reads.now.clone()))
        .fetch_one(pool)
        .await?;
    let since = seen.at.clone().unwrap_or(back);
    let rows: Vec<(String, bool, String)> =
        sea_orm::sqlx::query_as(AssertSqlSafe(reads.leases.clone()))
            .bind(&now)
            .bind(&since)
            .fetch_all(pool)
            .await?;
    let mut live = HashMap::with_capacity(rows.len());
    let mut ended: Vec<String> = Vec::new();
    for (resource, is_live, holder) in rows {
        let offered = crate::lease::offered_to(&holder).is_some()
            && seen.live.get(&resource) != Some(&holder);
        if is_live && offered {
            ended.push(resource.clone());
        }
        if is_live {
            live.insert(resource, holder);
        } else {
            // Written since the previous read and not live now: a short hold, released.
            ended.push(resource);
        }
    }
    ended.extend(
        seen.live
            .keys()
            .filter(|resource| !live.contains_key(*resource))
            .cloned(),
    );
    ended.sort_unstable();
    ended.dedup();
    seen.live = live;
    seen.at = Some(now);
    Ok(ended)
}

/// Waits for the end of the burst a write event began: [`SETTLE`] without another event, or
/// [`MOST`] after it began. `false` if the watcher is told to stop meanwhile.
async fn settled(changed: &Notify, stop: &CancellationToken) -> bool {
    let most = tokio::time::Instant::now() + MOST;
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => return false,
            () = tokio::time::sleep(SETTLE) => return true,
            () = changed.notified() => {
                if tokio::time::Instant::now() >= most {
                    return true;
                }
            }
        }
    }
}

/// Whether anyone is subscribed to the hub (`None`: the hub is gone).
fn subscribed(hub: &Weak<WakeHub>) -> Option<bool> {
    hub.upgrade().map(|hub| hub.tx.receiver_count() > 0)
}

async fn watch(
    _watcher: notify::RecommendedWatcher,
    pool: SqlitePool,
    reads: Reads,
    hub: Weak<WakeHub>,
    stop: CancellationToken,
    changed: Arc<Notify>,
) {
    let mut seen = Seen::default();
    let mut failures = 0u32;
    // When the leases were last read, the latest READS_PER_WINDOW times.
    let mut reads_at: std::collections::VecDeque<tokio::time::Instant> =
        std::collections::VecDeque::with_capacity(READS_PER_WINDOW);
    // The first read: also what was written and ended just before the watcher started.
    let mut due = true;
    loop {
        if !due {
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                () = changed.notified() => {}
            }
            if !settled(&changed, &stop).await {
                break;
            }
        }
        due = false;
        match subscribed(&hub) {
            None => break,
            Some(false) => continue, // nobody waits
            Some(true) => {}
        }
        // The burst, followed until a whole run of VISIBLE_WITHIN shows no new commit (see
        // there), or until nobody waits any more; each commit's ended leases are announced as
        // soon as they are read. A new burst meanwhile is looked at once it settles, so a file
        // written without pause is looked at every MOST.
        let look = async {
            let mut step = 0;
            while let Some(wait) = VISIBLE_WITHIN.get(step) {
                step += 1;
                tokio::select! {
                    biased;
                    () = changed.notified() => {
                        if !settled(&changed, &stop).await {
                            break;
                        }
                        step = 0;
                    }
                    () = tokio::time::sleep(*wait) => {}
                }
                let version = data_version(&pool).await?;
                if seen.version == Some(version) {
                    continue;
                }
                if reads_at.len() == READS_PER_WINDOW {
                    if let Some(oldest) = reads_at.pop_front() {
                        tokio::time::sleep_until(oldest + READ_WINDOW).await;
                    }
                }
                reads_at.push_back(tokio::time::Instant::now());
                let ended = ended(&pool, &reads, &mut seen).await?;
                // Read before the leases: a commit in between shows as a change next time.
                seen.version = Some(version);
                let Some(hub) = hub.upgrade() else { break };
                for resource in ended {
                    // Nobody listening is fine: waiters poll anyway.
                    let _ = hub.tx.send(Arc::from(resource.as_str()));
                }
                if hub.tx.receiver_count() == 0 {
                    break;
                }
                step = 0;
            }
            Ok::<_, sea_orm::sqlx::Error>(())
        };
        let looked = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            looked = look => looked,
        };
        match looked {
            Ok(()) => failures = 0,
            Err(error) => {
                // The connection may be a new one: its `data_version` says nothing about the
                // old one's.
                seen.version = None;
                failures += 1;
                // Look again at once (the failed look may have taken the burst's event), up
                // to three times in a row; then at the next write.
                due = failures < 3;
                if failures == 3 {
                    tracing::warn!(%error, "SQLite wake-ups: reading the leases keeps failing; waiters poll");
                } else {
                    tracing::debug!(%error, "SQLite wake-ups: reading the leases failed; waiters poll");
                }
                tokio::select! {
                    biased;
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(AFTER_A_FAILURE) => {}
                }
            }
        }
    }
    pool.close().await;
}

/// The file's changes as the engine holds them (see `backend::wakeups`).
pub(crate) struct FileChanges(pub(crate) HubCell);

impl crate::backend::wakeups::ReleaseSource for FileChanges {
    fn subscribe(
        &self,
        cx: &crate::backend::context::Context,
    ) -> Option<crate::store::ReleaseEvents> {
        subscribe(&self.0, &cx.db, &cx.table)
    }
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
        // Lost events count as a change.
        let lost = notify::Event::new(EventKind::Other).set_flag(notify::event::Flag::Rescan);
        assert!(may_be_a_commit(&Ok(lost), file));
        assert!(may_be_a_commit(
            &Err(notify::Error::generic("overflow")),
            file
        ));
        let open = notify::Event::new(EventKind::Access(notify::event::AccessKind::Open(
            notify::event::AccessMode::Any,
        )))
        .add_path(std::path::PathBuf::from("/data/app.db-wal"));
        assert!(!may_be_a_commit(&Ok(open), file));
    }

    #[test]
    fn the_reads() {
        let reads = Reads::new("orionbeacon_leases");
        assert_eq!(
            reads.leases,
            r#"SELECT "resource", "expires_at" > ?1, "holder" FROM "orionbeacon_leases" WHERE "expires_at" > ?1 OR "renewed_at" >= ?2"#
        );
        assert_eq!(
            reads.now,
            "SELECT strftime('%Y-%m-%d %H:%M:%f', 'now'), strftime('%Y-%m-%d %H:%M:%f', 'now', '-5 seconds')"
        );
    }
}
