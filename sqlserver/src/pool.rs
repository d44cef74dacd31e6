//! The SQL Server store's connections: a `deadpool` pool of tiberius clients, and the rule for
//! which connections may go back to it.

use std::fmt;
use std::time::Duration;

use deadpool::managed::{self, Metrics, Object, PoolError, RecycleError, RecycleResult};
use tiberius::error::Error as TdsError;
use tiberius::{Client, Config, SqlBrowser};
use tokio::net::TcpStream;
use tokio_util::compat::{Compat, TokioAsyncWriteCompatExt};

/// Connections a store opens at most, unless told otherwise.
pub(super) const DEFAULT_MAX_CONNECTIONS: usize = 4;

/// Establishing the TCP connection (the TDS handshake has tiberius' own 15 s timeout).
const TCP_CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// A connection not taken for this long is closed rather than reused: servers, load balancers
/// and firewalls drop idle connections, and a lease store must not fail on a stale one.
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// Server errors of this severity or more close the connection.
const FATAL_SEVERITY: u8 = 20;

pub(super) type Connection = Client<Compat<TcpStream>>;

/// Opens tiberius clients for the pool, and retires idle ones.
struct Manager {
    config: Config,
}

impl managed::Manager for Manager {
    type Type = Connection;
    type Error = TdsError;

    async fn create(&self) -> Result<Connection, TdsError> {
        open(&self.config).await
    }

    // `last_used` counts from the connection's last checkout; operations are one batch each,
    // so that is about when it went idle.
    async fn recycle(&self, _conn: &mut Connection, metrics: &Metrics) -> RecycleResult<TdsError> {
        if metrics.last_used() >= IDLE_TIMEOUT {
            return Err(RecycleError::message("idle for too long"));
        }
        Ok(())
    }
}

/// At most `max` connections, each used by one operation at a time. A connection goes back
/// only through [`Pooled::give_back`]; dropped any other way (an error, a cancelled future), it
/// is closed.
pub(super) struct Pool {
    config: Config,
    /// deadpool refuses only settings we never make (timeouts without a runtime); should it
    /// refuse, every operation reports why.
    inner: Result<managed::Pool<Manager>, String>,
    max: usize,
}

impl fmt::Debug for Pool {
    // The config holds credentials: show where it points, nothing more.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("addr", &self.config.get_addr())
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// A pool of at most `max` connections (at least 1); nothing is opened yet.
    pub(super) fn new(config: Config, max: usize) -> Self {
        let max = max.max(1);
        let inner = managed::Pool::builder(Manager {
            config: config.clone(),
        })
        .max_size(max)
        .build()
        .map_err(|e| e.to_string());
        Self { config, inner, max }
    }

    /// The connection settings (a copy of the store's).
    pub(super) fn config(&self) -> &Config {
        &self.config
    }

    /// A connection: an idle one, or a new one while fewer than `max` are open.
    pub(super) async fn get(&self) -> Result<Pooled, TdsError> {
        let pool = self
            .inner
            .as_ref()
            .map_err(|e| TdsError::Protocol(format!("connection pool: {e}").into()))?;
        let object = pool.get().await.map_err(|e| match e {
            PoolError::Backend(e) => e,
            other => TdsError::Protocol(format!("connection pool: {other}").into()),
        })?;
        Ok(Pooled {
            object: Some(object),
        })
    }
}

/// A connection taken from the pool. Every use of the pool goes through this wrapper: deadpool
/// takes back whatever `Object` is dropped, so a connection left mid-response would otherwise
/// go to the next operation.
pub(super) struct Pooled {
    object: Option<Object<Manager>>,
}

impl Pooled {
    pub(super) fn client(&mut self) -> Result<&mut Connection, TdsError> {
        match self.object.as_mut() {
            Some(object) => Ok(&mut **object),
            None => Err(TdsError::Protocol("connection already given back".into())),
        }
    }

    /// Puts the connection back for the next operation: only after a complete response.
    pub(super) fn give_back(mut self) {
        drop(self.object.take()); // deadpool takes it back
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(object) = self.object.take() {
            // Not given back: the session may be mid-response. Close it instead.
            drop(Object::take(object));
        }
    }
}

/// Whether a connection may go back to the pool after `err`: only after an ordinary server
/// error (the response was complete and the session is intact). Anything at the IO, TLS or
/// protocol level, and fatal server errors, leave the connection in an unknown state.
pub(super) fn keeps_connection(err: &TdsError) -> bool {
    match err {
        TdsError::Server(token) => token.class() < FATAL_SEVERITY,
        _ => false,
    }
}

pub(super) fn timed_out(what: &str) -> TdsError {
    TdsError::Io {
        kind: std::io::ErrorKind::TimedOut,
        message: format!("{what} timed out"),
    }
}

/// Opens one connection: SQL Browser for a named instance, TCP otherwise, then the TDS login;
/// follows one routing redirect (Azure SQL's gateway).
async fn open(config: &Config) -> Result<Connection, TdsError> {
    let tcp = tokio::time::timeout(TCP_CONNECT_TIMEOUT, TcpStream::connect_named(config))
        .await
        .map_err(|_| timed_out("connecting to SQL Server"))??;
    tcp.set_nodelay(true)?;
    match Client::connect(config.clone(), tcp.compat_write()).await {
        Err(TdsError::Routing { host, port }) => {
            let mut routed = config.clone();
            routed.host(&host);
            routed.port(port);
            let tcp =
                tokio::time::timeout(TCP_CONNECT_TIMEOUT, TcpStream::connect(routed.get_addr()))
                    .await
                    .map_err(|_| timed_out("connecting to SQL Server"))??;
            tcp.set_nodelay(true)?;
            Client::connect(routed, tcp.compat_write()).await
        }
        other => other,
    }
}
