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
//! A release sends `pg_notify('orionbeacon_releases', '<table>/<resource>')` in the same
//! statement; it is delivered on commit. If the listening connection drops, the listener
//! reconnects with back-off; meanwhile followers simply poll, so a lost notification costs
//! one poll interval, never correctness.

use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use sea_orm::sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
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
        // A pool of its own with at most one connection, made like the application's.
        let options = (*db.get_postgres_connection_pool().connect_options()).clone();
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .connect_lazy_with(options);
        runtime.spawn(listen(
            pool,
            format!("{table}/"),
            Arc::downgrade(&hub),
            hub.stop.clone(),
        ));
        hub
    });
    Some(hub.tx.subscribe())
}

async fn listen(pool: PgPool, prefix: String, hub: Weak<ReleaseHub>, stop: CancellationToken) {
    listen_on(&pool, prefix, hub, stop).await;
    pool.close().await;
}

async fn listen_on(pool: &PgPool, prefix: String, hub: Weak<ReleaseHub>, stop: CancellationToken) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let connected = tokio::select! {
            _ = stop.cancelled() => return,
            listener = connect(pool) => listener,
        };
        let mut listener = match connected {
            Ok(listener) => listener,
            Err(err) => {
                tracing::warn!(error = %err, retry_in = ?backoff, "release listener could not LISTEN; followers poll meanwhile");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        tracing::debug!(channel = RELEASE_CHANNEL, "listening for lease releases");
        loop {
            let received = tokio::select! {
                _ = stop.cancelled() => return,
                received = listener.try_recv() => received,
            };
            match received {
                Ok(Some(notification)) => {
                    let Some(resource) = notification.payload().strip_prefix(prefix.as_str())
                    else {
                        continue; // another lease table
                    };
                    let Some(hub) = hub.upgrade() else { return };
                    let _ = hub.tx.send(Arc::from(resource));
                }
                // The connection was lost; the next call reconnects (and re-LISTENs).
                Ok(None) => tracing::debug!("release listener lost its connection; reconnecting"),
                Err(err) => {
                    tracing::warn!(error = %err, "release listener failed; starting over");
                    break;
                }
            }
        }
    }
}

async fn connect(pool: &PgPool) -> Result<PgListener, sea_orm::sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(RELEASE_CHANNEL).await?;
    Ok(listener)
}
