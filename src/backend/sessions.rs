//! Statements that are known to have run outside any abandoned transaction: what every backend
//! with sessions shares (the checked connection, what a run found); each backend's own checks
//! are in its folder (`checked.rs`).
//!
//! A statement sent alone runs in autocommit mode: it commits when it ends, and only then is
//! its effect real. That breaks if the pooled connection it runs on is still inside a
//! transaction somebody abandoned: the statement then joins that transaction, its rows come
//! back, and nothing commits (a later rollback, or a killed connection, undoes a "grant" while
//! another candidate is granted the same token; a "release" keeps the lease row locked, so a
//! rival's acquire waits and the release never happens; a read answers from the abandoned
//! transaction's snapshot). sqlx 0.9 leaves connections in that state: a future dropped while
//! `begin()` waits for its `BEGIN` returns the connection to the pool inside the transaction
//! the `BEGIN` opened (on MySQL/MariaDB and PostgreSQL), and any application code sharing the
//! pool can drop such a future (a timeout, a `select!`, or leader work dropped when its term
//! ends). A transaction begun on such a connection is no better: PostgreSQL's `BEGIN` only
//! warns and the statements join the old transaction (whose work the `COMMIT` then commits),
//! MySQL's `BEGIN` commits the old transaction first.
//!
//! So on these backends the store sends its statements on sessions of its own (below),
//! which no other code gets and which go back only clean: there a statement is sent alone. Where
//! it uses the application's pool (`with_lease_connections(0)`, or a transaction-pooling proxy),
//! every statement runs on one connection the store takes from the pool and checks:
//! - Grants (acquire-or-renew; PostgreSQL's batched renew), in the same round trip or right
//!   after: MariaDB's `RETURNING` list ends in `@@in_transaction` (0 in autocommit); PostgreSQL's
//!   statement returns `transaction_timestamp()`, and a second statement on the same connection
//!   reads it again: a new (autocommit) transaction has a later start, the same abandoned
//!   transaction the same one.
//! - Every other single statement (releases, membership writes, reads), before it is sent, in
//!   one round trip of its own: MariaDB `@@in_transaction = 0 AND @@autocommit = 1`;
//!   PostgreSQL `transaction_timestamp() = statement_timestamp()` as a simple-protocol query
//!   (one message: a transaction begun by it starts at that message's statement time, an older
//!   one earlier). Nothing but the store uses the connection between the check and the
//!   statement, which then runs in a transaction of its own that commits when it ends.
//! - The store's own transactions (MariaDB's batched renew, the MySQL upsert form, the revoke,
//!   and every statement behind a transaction-pooling proxy), in the round trip that begins
//!   them: MariaDB `SET TRANSACTION ...; START TRANSACTION` (`SET TRANSACTION` is refused with
//!   error 1568 inside a transaction, and the `START` is then not run); PostgreSQL `BEGIN;
//!   SELECT transaction_timestamp() = statement_timestamp()`. The rows count once `COMMIT`
//!   succeeded.
//!
//! A connection found inside a transaction (or an aborted one, PostgreSQL `25P02`) is closed
//! (the server rolls the transaction back, which also frees the rows it locked) and the call is
//! tried again on another one; nothing it returned is used. So is a connection whose run did not
//! finish (an error, or the call dropped by a timeout): it never goes back to the pool
//! half-checked or inside a transaction of ours. SQLite needs none of this: sqlx's SQLite driver
//! rolls back a cancelled `BEGIN`, and SeaORM's transactions roll back when dropped.
//!
//! # The store's own sessions
//!
//! The store's own connections (PostgreSQL, MySQL/MariaDB): a few sessions it opens with the
//! application pool's connect options and that no other code ever gets.
//!
//! A connection of the application's pool may come back inside a transaction somebody
//! abandoned (above), so every statement the store sends there is checked, which
//! costs a second statement (or round trip) per call, and sqlx's pool pings each connection it
//! takes back, one more message. On a connection of its own the store knows the state: only
//! the store's code runs on it, each run goes back only after a complete, checked answer (and
//! its own transactions only after `COMMIT`), and every other way out closes the connection
//! (the server rolls back what it was in). So a lease statement there is one statement, one
//! round trip, and nothing is pinged on return. A session unused for 30 s, and every session
//! after one was closed uncleanly (an error, a dropped call: a server restart shows that way),
//! is pinged before its next use (a dead one is replaced, not failed on); one unused for 5
//! minutes is not reused. New sessions copy those of the application's session settings that
//! bear on the store's statements (PostgreSQL `search_path`; MySQL/MariaDB `sql_mode`, the
//! isolation level, `innodb_lock_wait_timeout`, Galera's `wsrep_sync_wait`), read once from
//! one of its sessions (outside any transaction), so those an `after_connect` hook set hold on
//! them too; no other setting is copied. The first session briefly takes one of the
//! application's connections for that read.
//!
//! What it costs: up to `max` more server connections per store (four unless configured;
//! opened on demand, so a process with one elector uses one), shared by the store's clones and
//! the stores derived from it. When one breaks (a restart, a partition, a killed session) the
//! call on it fails, that session is closed, the others are pinged before their next use, and
//! the next call opens a new one where needed.

use super::MAX_LEASE_CONNECTIONS;
use deadpool::managed::{self, Metrics, Object, PoolError, RecycleError, RecycleResult};
use sea_orm::sqlx::{self, ConnectOptions, Connection, Database};
use sea_orm::{DbErr, QueryResult, RuntimeErr, Statement};
use sea_query_sqlx::SqlxValues;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What one checked run found.
pub(crate) enum Checked<T = Vec<QueryResult>> {
    /// The statement ran outside any abandoned transaction and has committed: this is its
    /// outcome.
    Committed(T),
    /// The connection was inside an abandoned transaction: it was closed (the server rolls
    /// back), and nothing the statement did or returned counts.
    InAbandonedTransaction,
}

pub(crate) fn query_err(err: sqlx::Error) -> DbErr {
    DbErr::Query(RuntimeErr::SqlxError(err.into()))
}

pub(crate) fn values(stmt: &Statement) -> SqlxValues {
    SqlxValues(stmt.values.clone().unwrap_or(sea_orm::Values(Vec::new())))
}

/// Where a run takes its connection.
pub(crate) enum Source<'a, DB: sqlx::Database> {
    /// The application's pool: checked before (or with) every statement.
    Shared(&'a sqlx::Pool<DB>),
    /// The store's own sessions: no other code ever ran on them.
    Own(&'a OwnPool<DB>),
    /// An idle session of the store's own if one is free at once, else the application's
    /// pool (checked): for a statement that must not queue behind the store's other calls.
    IdleOwnOrShared(&'a OwnPool<DB>, &'a sqlx::Pool<DB>),
}

impl<DB: sqlx::Database> Clone for Source<'_, DB> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<DB: sqlx::Database> Copy for Source<'_, DB> {}

/// The connection a run holds.
enum Held<DB: sqlx::Database> {
    Shared(sqlx::pool::PoolConnection<DB>),
    Own(Object<Manager<DB>>),
}

/// A connection that goes back to its pool only if the run finished and found it clean. On
/// every other path (an error, a transaction found, or the caller's future dropped half way,
/// e.g. by a timeout) it is closed instead: the server then rolls back whatever transaction it
/// was in, and frees any lease row lock that transaction held, instead of handing the
/// connection to the next user of the pool.
pub(crate) struct Checkout<DB: sqlx::Database> {
    conn: Option<Held<DB>>,
    /// Set once the run finished and found the connection outside any transaction.
    pub(crate) clean: bool,
    /// One of the store's own sessions: outside any transaction whenever it is handed out
    /// (it comes back only clean), so it needs no check.
    pub(crate) own: bool,
}

impl<DB: sqlx::Database> Checkout<DB> {
    /// A connection already taken from the application's pool.
    pub(crate) fn shared(conn: sqlx::pool::PoolConnection<DB>) -> Self {
        Self {
            conn: Some(Held::Shared(conn)),
            clean: false,
            own: false,
        }
    }

    pub(crate) async fn from(source: Source<'_, DB>) -> Result<Self, DbErr> {
        let (conn, own) = match source {
            Source::Shared(pool) => (
                Held::Shared(pool.acquire().await.map_err(query_err)?),
                false,
            ),
            Source::Own(pool) => (Held::Own(pool.get().await?), true),
            Source::IdleOwnOrShared(own, shared) => match own.get_idle().await {
                Some(object) => (Held::Own(object), true),
                None => (
                    Held::Shared(shared.acquire().await.map_err(query_err)?),
                    false,
                ),
            },
        };
        Ok(Self {
            conn: Some(conn),
            clean: false,
            own,
        })
    }

    pub(crate) fn conn(&mut self) -> Result<&mut DB::Connection, DbErr> {
        match self.conn.as_mut() {
            Some(Held::Shared(conn)) => Ok(&mut **conn),
            Some(Held::Own(object)) => Ok(&mut object.conn),
            None => Err(DbErr::Custom("connection already given back".to_owned())),
        }
    }
}

impl<DB: sqlx::Database> Drop for Checkout<DB> {
    fn drop(&mut self) {
        match self.conn.take() {
            Some(Held::Shared(mut conn)) if !self.clean => conn.close_on_drop(),
            // Out of the pool for good: dropping the session closes its socket. The others
            // are pinged before their next use (this may have been a restart).
            Some(Held::Own(object)) if !self.clean => {
                if let Some(pool) = Object::pool(&object) {
                    pool.manager().closed_unclean();
                }
                drop(Object::take(object));
            }
            _ => {} // clean: back to its pool
        }
    }
}

/// How a transaction of the store's begins.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Begin {
    /// The session's isolation level (a transaction that writes).
    ReadWrite,
    /// REPEATABLE READ whatever the session's level.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    RepeatableRead,
}

// The store's own sessions.

/// A connection unused this long is pinged before it is used again: servers, proxies and
/// firewalls drop idle sessions, and a lease call should not be the one that finds out.
const PING_AFTER_IDLE: Duration = Duration::from_secs(30);

/// A connection unused this long is closed instead of reused.
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// The longest wait for a ping's answer before a session is given up.
const PING_TIMEOUT: Duration = Duration::from_secs(2);

/// The longest wait for a connection when the application's pool sets none.
const DEFAULT_WAIT: Duration = Duration::from_secs(30);

/// A future of a session setup step.
pub(crate) type Step<'a, T> = Pin<Box<dyn Future<Output = Result<T, sqlx::Error>> + Send + 'a>>;

/// Session settings, as (name, value) pairs.
pub(crate) type Settings = Vec<(String, String)>;

/// How a backend makes a new session of ours like the application's: the settings it reads on
/// one of the application's sessions (once per pool, e.g. a `search_path` an `after_connect`
/// hook set), and how a new session gets them (and anything else it must have).
pub(crate) struct Setup<DB: Database> {
    /// Reads the settings to copy, on one of the application's sessions.
    pub(crate) read: for<'a> fn(&'a mut DB::Connection) -> Step<'a, Settings>,
    /// Gives a new session of ours those settings.
    pub(crate) apply: for<'a> fn(&'a mut DB::Connection, &'a Settings) -> Step<'a, ()>,
}

impl<DB: Database> Clone for Setup<DB> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<DB: Database> Copy for Setup<DB> {}

/// One session of ours, and the last [`Manager::suspect`] count it was known alive at.
pub(crate) struct Session<DB: Database> {
    pub(crate) conn: DB::Connection,
    seen: u64,
}

/// Opens sessions with the application pool's connect options and settings.
pub(crate) struct Manager<DB: Database> {
    options: <DB::Connection as Connection>::Options,
    shared: sqlx::Pool<DB>,
    setup: Setup<DB>,
    /// The application's session settings, read once (again after a new session refused them).
    settings: std::sync::Mutex<Option<Settings>>,
    /// Sessions closed after a run that did not end cleanly (an error, a dropped call): every
    /// session made or last checked before the latest is pinged before its next use, so a
    /// server restart costs one failed call, not one per session.
    suspect: AtomicU64,
}

impl<DB: Database> Manager<DB> {
    /// A session was closed after a run that did not end cleanly.
    pub(crate) fn closed_unclean(&self) {
        self.suspect.fetch_add(1, Ordering::Relaxed);
    }
}

impl<DB: Database> managed::Manager for Manager<DB> {
    type Type = Session<DB>;
    type Error = DbErr;

    async fn create(&self) -> Result<Session<DB>, DbErr> {
        let seen = self.suspect.load(Ordering::Relaxed);
        let settings = match self.settings.lock().ok().and_then(|s| s.clone()) {
            Some(settings) => settings,
            None => {
                // The application's connection goes back only after a complete read (one
                // inside a transaction somebody left fails it); otherwise, a dropped call
                // included, it is closed.
                let app = self.shared.acquire().await.map_err(query_err)?;
                let mut app = Checkout::shared(app);
                let read = (self.setup.read)(app.conn()?).await.map_err(query_err)?;
                app.clean = true;
                read
            }
        };
        let mut conn = self.options.connect().await.map_err(query_err)?;
        // Settings a new session refuses are read again next time (a proxy may have sent the
        // read and this session to different servers).
        let applied = (self.setup.apply)(&mut conn, &settings).await;
        if let Ok(mut cached) = self.settings.lock() {
            *cached = applied.is_ok().then_some(settings);
        }
        applied.map_err(query_err)?;
        Ok(Session { conn, seen })
    }

    // `last_used` counts from the session's last checkout; a run holds it for one statement
    // (or one short transaction), so that is about when it went idle.
    async fn recycle(&self, session: &mut Session<DB>, metrics: &Metrics) -> RecycleResult<DbErr> {
        let idle = metrics.last_used();
        if idle >= IDLE_TIMEOUT {
            return Err(RecycleError::message("unused for too long"));
        }
        let suspect = self.suspect.load(Ordering::Relaxed);
        if idle >= PING_AFTER_IDLE || session.seen < suspect {
            match tokio::time::timeout(PING_TIMEOUT, session.conn.ping()).await {
                Ok(Ok(())) => session.seen = suspect,
                Ok(Err(err)) => return Err(query_err(err).into()),
                Err(_) => return Err(RecycleError::message("no answer to a ping")),
            }
        }
        Ok(())
    }
}

/// At most `max` sessions of the store's own, each used by one run at a time. A session goes
/// back only from a [`Checkout`](super::sessions::Checkout) marked clean; dropped any other
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
    /// At most `max` sessions made like `shared`'s (its connect options, and the settings
    /// `setup` copies from one of its sessions); `None` for `max == 0` (the store then uses the
    /// application's pool, checked). Nothing is opened yet.
    pub(crate) fn new(shared: &sqlx::Pool<DB>, max: usize, setup: Setup<DB>) -> Option<Self> {
        if max == 0 {
            return None;
        }
        let max = max.min(MAX_LEASE_CONNECTIONS);
        let options = (*shared.connect_options()).clone();
        let wait = shared.options().get_acquire_timeout();
        let wait = if wait.is_zero() { DEFAULT_WAIT } else { wait };
        // deadpool refuses only timeouts without a runtime, which are not set here.
        let manager = Manager::<DB> {
            options,
            shared: shared.clone(),
            setup,
            settings: std::sync::Mutex::new(None),
            suspect: AtomicU64::new(0),
        };
        let inner = managed::Pool::builder(manager).max_size(max).build().ok()?;
        Some(Self { inner, wait, max })
    }

    /// A derived store's sessions: `old` itself (the same sessions) unless their number
    /// changed, else new ones made like `shared`'s.
    pub(crate) fn derived(
        old: Option<&Self>,
        shared: Option<&sqlx::Pool<DB>>,
        max: usize,
        setup: Setup<DB>,
    ) -> Option<Self> {
        match old {
            Some(old) if old.max == max => Some(old.clone()),
            _ => shared.and_then(|pool| Self::new(pool, max, setup)),
        }
    }

    /// The most sessions it opens.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// An idle session if there is one at once (nothing opened, nothing waited for).
    pub(crate) async fn get_idle(&self) -> Option<Object<Manager<DB>>> {
        // tokio polls the inner future before the timer: a free idle session is taken.
        match tokio::time::timeout(Duration::ZERO, self.inner.get()).await {
            Ok(Ok(object)) => Some(object),
            _ => None,
        }
    }

    /// A session: an idle one, or a new one while fewer than `max` are open; waits at most
    /// the application pool's acquire timeout (for a free one, and for a new one to connect).
    pub(crate) async fn get(&self) -> Result<Object<Manager<DB>>, DbErr> {
        match tokio::time::timeout(self.wait, self.inner.get()).await {
            Ok(Ok(object)) => Ok(object),
            Ok(Err(PoolError::Backend(err))) => Err(err),
            Ok(Err(other)) => Err(DbErr::Custom(format!(
                "the store's own connections: {other}"
            ))),
            Err(_) => Err(query_err(sqlx::Error::PoolTimedOut)),
        }
    }
}
