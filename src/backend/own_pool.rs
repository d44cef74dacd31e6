//! The store's own connections (PostgreSQL, MySQL/MariaDB): a few sessions it opens with the
//! application pool's connect options and that no other code ever gets.
//!
//! A connection of the application's pool may come back inside a transaction somebody
//! abandoned (see `checkout`), so every statement the store sends there is checked, which
//! costs a second statement (or round trip) per call, and sqlx's pool pings each connection it
//! takes back, one more message. On a connection of its own the store knows the state: only
//! the store's code runs on it, each run goes back only after a complete, checked answer (and
//! its own transactions only after `COMMIT`), and every other way out closes the connection
//! (the server rolls back what it was in). So a lease statement there is one statement, one
//! round trip, and nothing is pinged on return: a connection idle for a while is pinged before
//! its next use (a dead one is replaced, not failed on), one idle for longer is closed.
//!
//! What it costs: up to `max` more server connections per store (four unless configured;
//! opened on demand, so a process with one elector uses one), shared by the store's clones and
//! the stores derived from it. When one breaks (a restart, a partition, a killed session) the
//! call on it fails like any call on a broken pooled connection, that connection is closed, and
//! the next call opens a new one.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use deadpool::managed::{self, Metrics, Object, PoolError, RecycleError, RecycleResult};
use sea_orm::sqlx::{self, ConnectOptions, Connection, Database};
use sea_orm::DbErr;

use super::checkout::query_err;
use super::MAX_LEASE_CONNECTIONS;

/// A connection unused this long is pinged before it is used again: servers, proxies and
/// firewalls drop idle sessions, and a lease call should not be the one that finds out.
const PING_AFTER_IDLE: Duration = Duration::from_secs(30);

/// A connection unused this long is closed instead of reused.
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// The longest wait for a connection when the application's pool sets none.
const DEFAULT_WAIT: Duration = Duration::from_secs(30);

/// Opens sessions with the application pool's connect options.
pub(crate) struct Manager<DB: Database> {
    options: <DB::Connection as Connection>::Options,
    /// Run once on each new session (MySQL: autocommit on, whatever the server's default).
    init: Option<Init<DB>>,
}

/// What a new session is sent before its first use.
pub(crate) type Init<DB> =
    for<'a> fn(
        &'a mut <DB as Database>::Connection,
    ) -> Pin<Box<dyn Future<Output = Result<(), sqlx::Error>> + Send + 'a>>;

impl<DB: Database> managed::Manager for Manager<DB> {
    type Type = DB::Connection;
    type Error = sqlx::Error;

    async fn create(&self) -> Result<DB::Connection, sqlx::Error> {
        let mut conn = self.options.connect().await?;
        if let Some(init) = self.init {
            init(&mut conn).await?;
        }
        Ok(conn)
    }

    // `last_used` counts from the connection's last checkout; a run holds it for one
    // statement (or one short transaction), so that is about when it went idle.
    async fn recycle(
        &self,
        conn: &mut DB::Connection,
        metrics: &Metrics,
    ) -> RecycleResult<sqlx::Error> {
        let idle = metrics.last_used();
        if idle >= IDLE_TIMEOUT {
            return Err(RecycleError::message("idle for too long"));
        }
        if idle >= PING_AFTER_IDLE {
            conn.ping().await?;
        }
        Ok(())
    }
}

/// At most `max` sessions of the store's own, each used by one run at a time. A session goes
/// back only from a [`Checkout`](super::checkout::Checkout) marked clean; dropped any other
/// way, it is closed.
pub(crate) struct OwnPool<DB: Database> {
    inner: managed::Pool<Manager<DB>>,
    /// How long a run waits for a session (the application pool's acquire timeout).
    wait: Duration,
    max: usize,
}

impl<DB: Database> Clone for OwnPool<DB> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            wait: self.wait,
            max: self.max,
        }
    }
}

// The connect options hold credentials: nothing of them.
impl<DB: Database> fmt::Debug for OwnPool<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnPool")
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

impl<DB: Database> OwnPool<DB> {
    /// At most `max` sessions made like `shared`'s (connect options only: not its
    /// `after_connect` hooks), each sent `init` once; `None` for `max == 0` (the store then
    /// uses the application's pool, checked). Nothing is opened yet.
    pub(crate) fn new(shared: &sqlx::Pool<DB>, max: usize, init: Option<Init<DB>>) -> Option<Self> {
        if max == 0 {
            return None;
        }
        let max = max.min(MAX_LEASE_CONNECTIONS);
        let options = (*shared.connect_options()).clone();
        let wait = shared.options().get_acquire_timeout();
        let wait = if wait.is_zero() { DEFAULT_WAIT } else { wait };
        // deadpool refuses only timeouts without a runtime, which are not set here.
        let inner = managed::Pool::builder(Manager::<DB> { options, init })
            .max_size(max)
            .build()
            .ok()?;
        Some(Self { inner, wait, max })
    }

    /// The most sessions this pool opens.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// A session: an idle one, or a new one while fewer than `max` are open; waits at most
    /// the application pool's acquire timeout (for a free one, and for a new one to connect).
    pub(crate) async fn get(&self) -> Result<Object<Manager<DB>>, DbErr> {
        match tokio::time::timeout(self.wait, self.inner.get()).await {
            Ok(Ok(object)) => Ok(object),
            Ok(Err(PoolError::Backend(err))) => Err(query_err(err)),
            Ok(Err(other)) => Err(DbErr::Custom(format!(
                "the store's own connections: {other}"
            ))),
            Err(_) => Err(query_err(sqlx::Error::PoolTimedOut)),
        }
    }
}
