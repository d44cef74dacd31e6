//! PostgreSQL release notifications: `LISTEN` on one connection of its own per store, fanned
//! out to every elector of the process that uses the store.
//!
//! The listening connection is made from the application pool's connect options but is not
//! one of its connections: a `LISTEN` holds its connection for good, and taking it from the
//! application's pool would starve that pool (with one connection, nobody could renew). The
//! cost is one extra server connection per store (per lease table) while any clone of the
//! store lives; [`SeaOrmLeaseStore::with_release_notifications`](crate::SeaOrmLeaseStore::with_release_notifications)
//! turns it off.
//!
//! A release sends `pg_notify('orionbeacon_releases', '<table>@<table OID>/<resource>')` in
//! the same statement; it is delivered on commit. The listener learns its table's OID on the
//! application's pool (whose sessions resolve the name as the store's statements do, through
//! their `search_path`), so two tenants' tables of one name in two schemas never wake each
//! other's followers. If the listening connection drops, the listener
//! reconnects with back-off; meanwhile followers simply poll, so a lost notification costs
//! one poll interval, never correctness.
//!
//! A listening connection only reads, so one the network left half-open (a partition that
//! outlasted the server's retransmissions, the server's session ended meanwhile) would never
//! hear of it: no FIN arrives, nothing is sent that could be answered with a reset, and the
//! driver sets no TCP keepalive. After [`PROBE_IDLE`] without a notification the listener
//! sends `SELECT 1` and gives it [`PROBE_TIMEOUT`]; a connection that fails it is dropped and a
//! new one listens, from a fresh pool, so the old connection's return (which waits on the dead
//! socket) cannot hold the new one up.

use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use sea_orm::sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use sea_orm::{DatabaseConnection, DatabaseConnectionType};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::statements::RELEASE_CHANNEL;
use crate::store::ReleaseEvents;

/// The fan-out point, shared by the clones of one store. Dropping the last clone stops the
/// listener (and gives its connection back to the pool).
#[derive(Debug)]
pub(crate) struct ReleaseHub {
    tx: broadcast::Sender<Arc<str>>,
    stop: CancellationToken,
}

impl Drop for ReleaseHub {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub(crate) type HubCell = Arc<OnceLock<Arc<ReleaseHub>>>;

/// Subscribes to release notifications for `table`, starting the listener on first use.
/// `None` when the connection is not a PostgreSQL pool or there is no tokio runtime.
pub(crate) fn subscribe(
    cell: &HubCell,
    db: &DatabaseConnection,
    table: &Arc<str>,
) -> Option<ReleaseEvents> {
    if !matches!(
        db.inner,
        DatabaseConnectionType::SqlxPostgresPoolConnection(_)
    ) {
        return None;
    }
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    let hub = cell.get_or_init(|| {
        let hub = Arc::new(ReleaseHub {
            tx: broadcast::channel(256).0,
            stop: CancellationToken::new(),
        });
        let app = db.get_postgres_connection_pool().clone();
        let options = (*app.connect_options()).clone();
        runtime.spawn(listen(
            options,
            app,
            Arc::clone(table),
            Arc::downgrade(&hub),
            hub.stop.clone(),
        ));
        hub
    });
    Some(hub.tx.subscribe())
}

/// How long the listener waits for a notification before it checks its connection.
pub(crate) const PROBE_IDLE: Duration = Duration::from_secs(10);
/// How long that check may take before the connection counts as dead.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the listener waits for a connection (a partition makes the connect hang).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The listener's own pool: at most one connection, made like the application's.
fn listener_pool(options: &PgConnectOptions) -> PgPool {
    PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect_lazy_with(options.clone())
}

/// The OID of `table` as the application's sessions resolve it, on one of its connections
/// (back to the pool only after a complete read; closed otherwise).
async fn table_oid(app: &PgPool, table: &str) -> Result<Option<i64>, sea_orm::sqlx::Error> {
    let conn = app.acquire().await?;
    let mut conn = crate::backend::sessions::Checkout::shared(conn);
    let conn_ref = conn
        .conn()
        .map_err(|e| sea_orm::sqlx::Error::Protocol(e.to_string()))?;
    let oid: Option<i64> =
        sea_orm::sqlx::query_scalar("SELECT CAST(CAST(to_regclass($1) AS oid) AS bigint)")
            .bind(format!("\"{table}\""))
            .fetch_one(conn_ref)
            .await?;
    conn.clean = true;
    Ok(oid)
}

/// The payload prefix of `table`'s releases, once its OID is known (asked again with back-off
/// until the table exists); `None` once stopped.
async fn prefix_of(app: &PgPool, table: &str, stop: &CancellationToken) -> Option<String> {
    let mut backoff = Duration::from_millis(100);
    loop {
        match table_oid(app, table).await {
            Ok(Some(oid)) => return Some(format!("{table}@{oid}/")),
            Ok(None) => tracing::debug!(table, "release listener waits for its table to exist"),
            Err(error) => tracing::debug!(%error, "release listener could not look up its table"),
        }
        tokio::select! {
            _ = stop.cancelled() => return None,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

async fn listen(
    options: PgConnectOptions,
    app: PgPool,
    table: Arc<str>,
    hub: Weak<ReleaseHub>,
    stop: CancellationToken,
) {
    let mut pool = listener_pool(&options);
    loop {
        // Looked up again whenever the listener starts over (the table may have been made
        // anew, with another OID).
        let Some(prefix) = prefix_of(&app, &table, &stop).await else {
            break;
        };
        match listen_on(&pool, &prefix, &hub, &stop).await {
            Ended::Stopped => break,
            Ended::Dead => {
                // The old pool closes in the background: its connection's return waits on
                // the dead socket until the OS gives up on it.
                let old = std::mem::replace(&mut pool, listener_pool(&options));
                tokio::spawn(async move { old.close().await });
            }
        }
    }
    pool.close().await;
}

/// Why [`listen_on`] returned.
enum Ended {
    /// The hub is gone or the store was dropped.
    Stopped,
    /// The connection failed its probe, or failed.
    Dead,
}

async fn listen_on(
    pool: &PgPool,
    prefix: &str,
    hub: &Weak<ReleaseHub>,
    stop: &CancellationToken,
) -> Ended {
    let mut backoff = Duration::from_millis(100);
    loop {
        let connected = tokio::select! {
            _ = stop.cancelled() => return Ended::Stopped,
            listener = connect(pool) => listener,
        };
        let mut listener = match connected {
            Ok(listener) => listener,
            Err(err) => {
                tracing::warn!(error = %err, retry_in = ?backoff, "release listener could not LISTEN; followers poll meanwhile");
                tokio::select! {
                    _ = stop.cancelled() => return Ended::Stopped,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        tracing::debug!(channel = RELEASE_CHANNEL, "listening for lease releases");
        loop {
            // `try_recv` is cancel-safe: a message is consumed only once read whole.
            let received = tokio::select! {
                _ = stop.cancelled() => return Ended::Stopped,
                received = listener.try_recv() => received,
                _ = tokio::time::sleep(PROBE_IDLE) => {
                    let answered = tokio::select! {
                        _ = stop.cancelled() => return Ended::Stopped,
                        answered = probe(&mut listener) => answered,
                    };
                    if answered {
                        continue;
                    }
                    tracing::warn!(timeout = ?PROBE_TIMEOUT, "release listener's connection did not answer; listening on a new one, followers poll meanwhile");
                    return Ended::Dead;
                }
            };
            match received {
                Ok(Some(notification)) => {
                    let Some(resource) = notification.payload().strip_prefix(prefix) else {
                        continue; // another lease table
                    };
                    let Some(hub) = hub.upgrade() else {
                        return Ended::Stopped;
                    };
                    let _ = hub.tx.send(Arc::from(resource));
                }
                // The connection was lost; the next call reconnects (and re-LISTENs).
                Ok(None) => tracing::debug!("release listener lost its connection; reconnecting"),
                Err(err) => {
                    tracing::warn!(error = %err, "release listener failed; starting over");
                    return Ended::Dead;
                }
            }
        }
    }
}

/// Whether the listening connection still answers a statement within [`PROBE_TIMEOUT`].
async fn probe(listener: &mut PgListener) -> bool {
    let select = sea_orm::sqlx::query("SELECT 1").execute(&mut *listener);
    matches!(tokio::time::timeout(PROBE_TIMEOUT, select).await, Ok(Ok(_)))
}

async fn connect(pool: &PgPool) -> Result<PgListener, sea_orm::sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(RELEASE_CHANNEL).await?;
    Ok(listener)
}

/// The notifications as the engine holds them (see `backend::wakeups`).
pub(crate) struct Notifications(pub(crate) HubCell);

impl crate::backend::wakeups::ReleaseSource for Notifications {
    fn subscribe(
        &self,
        cx: &crate::backend::context::Context,
    ) -> Option<crate::store::ReleaseEvents> {
        subscribe(&self.0, &cx.db, &cx.table)
    }
}
