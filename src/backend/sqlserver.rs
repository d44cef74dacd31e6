//! SQL Server: [`SqlServerLeaseStore`], straight over TDS with `tiberius`.
//!
//! Open-source SeaORM and sea-query have no SQL Server backend, so this store talks to SQL Server
//! directly: TDS 7.3 over rustls (no OpenSSL), tokio through tokio-util's compat layer, and a
//! small pool of its own. The contract and the rules are those of every other store (see
//! [`LeaseStore`]); only the statements differ:
//!
//! - acquire-or-renew is one `MERGE ... WITH (HOLDLOCK) ... OUTPUT inserted....;`. `HOLDLOCK`
//!   (serializable) locks the key range, so two racers for a fresh resource cannot both take
//!   the `WHEN NOT MATCHED` branch; the lease filter sits in `WHEN MATCHED AND (...)`, never in
//!   `ON`, so a live lease of someone else matches and is left alone instead of falling through
//!   to an insert. No `OUTPUT` row means denied, and a plain read then reports the holder.
//! - every time comes from the database clock: one `DECLARE @now datetime2(7) =
//!   SYSUTCDATETIME()` opens each batch, so every comparison in it agrees; the acquire batch
//!   first locks the lease row's key range and then reads the clock again (`@written`), so a
//!   lease granted after a wait behind a fence still runs its full length from the grant;
//! - deadlocks (1205) and duplicate keys (2627, defensively) mean the statement had no effect:
//!   they are retried a few times, then reported as [`StoreError::SqlServerConflict`].
//!
//! `OUTPUT` without `INTO` fails (error 334) on a table with enabled triggers: leave the lease
//! table without triggers.
//!
//! The table comes from the versioned T-SQL in
//! `migration/sql/m20261129_000001_create_orionbeacon_leases.sqlserver.sql` (this module
//! includes that file: [`MIGRATION_SQL`]), applied by hand or by
//! [`SqlServerLeaseStore::migrate`].

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use orion_beacon_entity::{validate_table_name, DEFAULT_TABLE};
use sea_orm::DbErr;
use tiberius::error::Error as TdsError;
use tiberius::{Client, Config, FromSql, SqlBrowser, ToSql};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio_util::compat::{Compat, TokioAsyncWriteCompatExt};

use super::statements::Row;
use crate::store::{validate_candidate, validate_request, validate_resource, MAX_NAME_LEN};
use crate::{Denial, Lease, LeaseOutcome, LeaseRecord, LeaseStore, StoreError};

/// The version name of the lease-table migration, the same as the SeaORM migration's.
pub const MIGRATION_NAME: &str = "m20261129_000001_create_orionbeacon_leases";

/// The versioned, idempotent T-SQL that creates the default lease table
/// (`migration/sql/m20261129_000001_create_orionbeacon_leases.sqlserver.sql`, next to the
/// SeaORM migration; this crate ships an identical copy in `sql/` so it builds when packaged).
/// [`SqlServerLeaseStore::migration_sql`] gives it for the store's own table.
pub const MIGRATION_SQL: &str =
    include_str!("../../sql/m20261129_000001_create_orionbeacon_leases.sqlserver.sql");

/// How often a statement is tried when SQL Server picks it as a deadlock victim (1205) or
/// reports a duplicate key (2627). Either way the statement had no effect.
const ATTEMPTS: u32 = 5;

/// Connections a store opens at most, unless told otherwise.
const DEFAULT_MAX_CONNECTIONS: usize = 4;

/// Establishing the TCP connection (the TDS handshake has tiberius' own 15 s timeout).
const TCP_CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// An idle connection older than this is closed rather than reused: servers, load balancers and
/// firewalls drop idle connections, and a lease store must not fail on a stale one.
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// Server errors of this severity or more close the connection.
const FATAL_SEVERITY: u8 = 20;

/// SQL Server error numbers the store treats specially.
mod code {
    /// Invalid object name: the lease table does not exist.
    pub const INVALID_OBJECT: u32 = 208;
    /// Chosen as the deadlock victim; the transaction was rolled back.
    pub const DEADLOCK: u32 = 1205;
    /// Violation of a primary key constraint.
    pub const DUPLICATE_KEY: u32 = 2627;
    /// There is already an object of that name (a concurrent `migrate`).
    pub const OBJECT_EXISTS: u32 = 2714;
}

type Connection = Client<Compat<TcpStream>>;

/// A table name, bracket-quoted (the name is validated first, so it never holds a `]`; one is
/// doubled anyway, as T-SQL quoting demands).
fn quoted(table: &str) -> String {
    format!("[{}]", table.replace(']', "]]"))
}

/// The one-statement acquire-or-renew (after the `@now` declaration). Parameters: `@P1` the
/// resource, `@P2` the candidate, `@P3` whole seconds and `@P4` the remaining milliseconds of
/// the lease (`DATEADD` takes an `int`, and 366 days of milliseconds do not fit one).
///
/// - no row: insert with token 1, `acquired_at = renewed_at = now`;
/// - row expired (whoever held it): new term, token + 1, `acquired_at = renewed_at = now`;
/// - row live and held by the candidate: renew, token and `acquired_at` kept, `renewed_at` at
///   least one tick (100 ns) after `acquired_at`, so `acquired_at = renewed_at` holds exactly
///   for new terms;
/// - row live and held by another: no branch applies, nothing changes, no row is output.
///
/// `SET` expressions read the row as it was before the statement. The remaining time is
/// counted in nanoseconds (exact for `datetime2(7)`) and divided down to whole milliseconds;
/// `DATEDIFF_BIG(MILLISECOND, ...)` would count millisecond boundaries crossed, which rounds
/// up as often as down.
fn upsert_sql(table: &str) -> String {
    let t = quoted(table);
    let expiry = "DATEADD(MILLISECOND, @P4, DATEADD(SECOND, @P3, @written))";
    let tick_after_acquired = "DATEADD(NANOSECOND, 100, t.acquired_at)";
    format!(
        "SET XACT_ABORT ON; \
         DECLARE @now datetime2(7) = SYSUTCDATETIME(); \
         DECLARE @locked int; \
         BEGIN TRANSACTION; \
         SELECT @locked = COUNT(*) FROM {t} WITH (UPDLOCK, HOLDLOCK) WHERE resource = @P1; \
         DECLARE @written datetime2(7) = SYSUTCDATETIME(); \
         MERGE {t} WITH (HOLDLOCK) AS t \
         USING (SELECT @P1 AS resource, @P2 AS holder) AS s \
         ON t.resource = s.resource \
         WHEN MATCHED AND (t.holder = s.holder OR t.expires_at <= @now) THEN UPDATE SET \
         t.fencing_token = CASE WHEN t.expires_at <= @now THEN t.fencing_token + 1 ELSE t.fencing_token END, \
         t.acquired_at = CASE WHEN t.expires_at <= @now THEN @now ELSE t.acquired_at END, \
         t.renewed_at = CASE WHEN t.expires_at <= @now THEN @now \
         WHEN @now > {tick_after_acquired} THEN @now ELSE {tick_after_acquired} END, \
         t.holder = s.holder, \
         t.expires_at = {expiry} \
         WHEN NOT MATCHED THEN INSERT (resource, holder, fencing_token, expires_at, acquired_at, renewed_at) \
         VALUES (s.resource, s.holder, 1, {expiry}, @now, @now) \
         OUTPUT inserted.holder, inserted.fencing_token, inserted.expires_at, inserted.acquired_at, \
         inserted.renewed_at, {remaining} AS remaining_ms; \
         COMMIT TRANSACTION;",
        remaining = remaining_ms("inserted.expires_at"),
    )
}

/// Whole milliseconds from `@now` until `expires` (truncated; negative once past).
fn remaining_ms(expires: &str) -> String {
    format!("DATEDIFF_BIG(NANOSECOND, @now, {expires}) / 1000000")
}

/// The guarded release: a tombstone only for the live lease of the candidate. The expiry moves
/// back to the term's last renew (never later than now), so a renew already in flight, which
/// started after that renew, sees the lease ended instead of extending it. Parameters: `@P1`
/// the resource, `@P2` the candidate.
fn release_sql(table: &str) -> String {
    format!(
        "DECLARE @now datetime2(7) = SYSUTCDATETIME(); \
         UPDATE {t} SET expires_at = CASE WHEN renewed_at < @now THEN renewed_at ELSE @now END \
         WHERE resource = @P1 AND holder = @P2 AND expires_at > @now;",
        t = quoted(table),
    )
}

/// The release of one exact write: [`release_sql`], only while the row still carries the
/// token and the expiry the holder was last granted. Parameters: `@P1` the resource, `@P2`
/// the holder, `@P3` the token, `@P4` the expiry (`datetime2`, as read from the row).
fn release_write_sql(table: &str) -> String {
    format!(
        "DECLARE @now datetime2(7) = SYSUTCDATETIME(); \
         UPDATE {t} SET expires_at = CASE WHEN renewed_at < @now THEN renewed_at ELSE @now END \
         WHERE resource = @P1 AND holder = @P2 AND fencing_token = @P3 AND expires_at = @P4 \
         AND expires_at > @now;",
        t = quoted(table),
    )
}

/// The transactional fence: one row while the term is current, and a shared lock on the lease
/// row held to the end of the caller's transaction (`HOLDLOCK`), so a rival's `MERGE` waits.
/// Parameters: `@P1` the resource, `@P2` the holder, `@P3` the token.
fn fence_sql(table: &str) -> String {
    format!(
        "SELECT 1 AS held FROM {t} WITH (HOLDLOCK, ROWLOCK) \
         WHERE resource = @P1 AND holder = @P2 AND fencing_token = @P3 AND expires_at > SYSUTCDATETIME();",
        t = quoted(table),
    )
}

/// The stored row of a resource with its remaining time. Parameter: `@P1` the resource.
fn current_sql(table: &str) -> String {
    format!(
        "DECLARE @now datetime2(7) = SYSUTCDATETIME(); \
         SELECT holder, fencing_token, expires_at, acquired_at, renewed_at, {remaining} AS remaining_ms \
         FROM {t} WHERE resource = @P1;",
        remaining = remaining_ms("expires_at"),
        t = quoted(table),
    )
}

/// [`MIGRATION_SQL`] for `table`: the bracket-quoted table name and its primary key's name are
/// the only places the default name is changed.
fn migration_sql(table: &str) -> String {
    MIGRATION_SQL
        .replace(&quoted(DEFAULT_TABLE), &quoted(table))
        .replace(
            &quoted(&format!("PK_{DEFAULT_TABLE}")),
            &quoted(&format!("PK_{table}")),
        )
}

/// SQL Server counts `nvarchar(255)` in UTF-16 code units: a character outside the Basic
/// Multilingual Plane takes two. Refuse names that would not fit before any SQL runs.
fn check_utf16_len(name: &str) -> Option<&'static str> {
    (name.encode_utf16().count() > MAX_NAME_LEN)
        .then_some("must be at most 255 UTF-16 code units on SQL Server (characters outside the Basic Multilingual Plane count twice)")
}

fn check_resource(resource: &str) -> Result<(), StoreError> {
    validate_resource(resource)?;
    match check_utf16_len(resource) {
        Some(reason) => Err(StoreError::InvalidResource {
            name: resource.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

fn check_candidate(candidate: &str) -> Result<(), StoreError> {
    validate_candidate(candidate)?;
    match check_utf16_len(candidate) {
        Some(reason) => Err(StoreError::InvalidCandidate {
            name: candidate.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

/// Whether a connection may go back to the pool after `err`: only after an ordinary server
/// error (the response was complete and the session is intact). Anything at the IO, TLS or
/// protocol level, and fatal server errors, leave the connection in an unknown state.
fn keeps_connection(err: &TdsError) -> bool {
    match err {
        TdsError::Server(token) => token.class() < FATAL_SEVERITY,
        _ => false,
    }
}

/// Whether `code` means the statement lost a race and had no effect.
fn is_conflict(code: Option<u32>) -> bool {
    matches!(code, Some(code::DEADLOCK | code::DUPLICATE_KEY))
}

fn timed_out(what: &str) -> TdsError {
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

struct Idle {
    client: Connection,
    since: Instant,
}

/// A small pool: at most `max` connections, each used by one operation at a time. A connection
/// goes back only through [`Pooled::give_back`]; dropped any other way (an error, a cancelled
/// future), it is closed.
struct Pool {
    config: Config,
    max: usize,
    slots: Semaphore,
    idle: Mutex<Vec<Idle>>,
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
    fn new(config: Config, max: usize) -> Self {
        let max = max.max(1);
        Self {
            config,
            max,
            slots: Semaphore::new(max),
            idle: Mutex::new(Vec::new()),
        }
    }

    fn take_idle(&self) -> Option<Connection> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(conn) = idle.pop() {
            if conn.since.elapsed() < IDLE_TIMEOUT {
                return Some(conn.client);
            }
        }
        None
    }

    async fn get(&self) -> Result<Pooled<'_>, TdsError> {
        let permit = self
            .slots
            .acquire()
            .await
            .map_err(|_| TdsError::Protocol("the connection pool was closed".into()))?;
        let client = match self.take_idle() {
            Some(client) => client,
            None => open(&self.config).await?,
        };
        Ok(Pooled {
            pool: self,
            client,
            _permit: permit,
        })
    }
}

struct Pooled<'a> {
    pool: &'a Pool,
    client: Connection,
    _permit: tokio::sync::SemaphorePermit<'a>,
}

impl Pooled<'_> {
    fn give_back(self) {
        let mut idle = self.pool.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.push(Idle {
            client: self.client,
            since: Instant::now(),
        });
    }
}

#[derive(Debug, Clone, Copy)]
enum Want {
    Rows,
    RowsAffected,
}

enum Reply {
    Rows(Vec<tiberius::Row>),
    RowsAffected(u64),
}

async fn send(
    client: &mut Connection,
    want: Want,
    sql: &str,
    params: &[&dyn ToSql],
) -> Result<Reply, TdsError> {
    match want {
        Want::Rows => {
            // Drains the whole response, so the connection is clean for the next operation.
            let results = client.query(sql, params).await?.into_results().await?;
            Ok(Reply::Rows(results.into_iter().flatten().collect()))
        }
        Want::RowsAffected => Ok(Reply::RowsAffected(
            client.execute(sql, params).await?.total(),
        )),
    }
}

/// The statements of one table.
#[derive(Debug)]
struct Statements {
    upsert: String,
    release: String,
    release_write: String,
    current: String,
}

impl Statements {
    fn new(table: &str) -> Self {
        Self {
            upsert: upsert_sql(table),
            release: release_sql(table),
            release_write: release_write_sql(table),
            current: current_sql(table),
        }
    }
}

/// A [`LeaseStore`] in a table of a SQL Server database (2016 or later, or Azure SQL), over
/// TDS with `tiberius` (cargo feature `sqlserver`).
///
/// Built from an ADO.NET connection string, parsed by tiberius' own parser:
///
/// ```no_run
/// # async fn f() -> Result<(), orion_beacon::StoreError> {
/// use std::time::Duration;
/// use orion_beacon::{LeaseStore, SqlServerLeaseStore};
///
/// let store = SqlServerLeaseStore::connect(
///     "Server=localhost;Database=app;User Id=sa;Password=secret;TrustServerCertificate=True",
/// )
/// .await?;
/// store.migrate().await?; // idempotent: creates the lease table if it is missing
/// let outcome = store
///     .acquire_or_renew("nightly-report", "node-a", Duration::from_secs(15))
///     .await?;
/// # Ok(()) }
/// ```
///
/// The store keeps a small pool of its own (4 connections unless
/// [`with_max_connections`](Self::with_max_connections) says otherwise): every operation takes
/// one connection for its statement and gives it back. A connection that failed at the IO, TLS
/// or protocol level (or was interrupted by a cancelled call) is closed and replaced, never
/// reused. Clones share the pool.
#[derive(Debug, Clone)]
pub struct SqlServerLeaseStore {
    pool: Arc<Pool>,
    table: Arc<str>,
    sql: Arc<Statements>,
}

impl SqlServerLeaseStore {
    /// A store for the database an ADO.NET connection string names (e.g.
    /// `Server=localhost;Database=app;User Id=sa;Password=secret;TrustServerCertificate=True`),
    /// on the default table, `orionbeacon_leases`. Nothing is opened yet: the first operation
    /// connects. A string tiberius refuses is [`StoreError::InvalidConnectionString`].
    ///
    /// Encryption is required unless the string says `Encrypt=false`; the server certificate is
    /// checked against the system's roots unless `TrustServerCertificate=True` (or
    /// `TrustServerCertificateCA=<file>`).
    pub fn new(ado_connection_string: &str) -> Result<Self, StoreError> {
        let config = Config::from_ado_string(ado_connection_string)
            .map_err(|source| StoreError::InvalidConnectionString { source })?;
        Ok(Self::from_config(config))
    }

    /// Like [`new`](Self::new), and opens one connection right away, so a wrong address,
    /// certificate or password shows up here ([`StoreError::SqlServer`]).
    pub async fn connect(ado_connection_string: &str) -> Result<Self, StoreError> {
        let store = Self::new(ado_connection_string)?;
        let conn = store.pool.get().await.map_err(StoreError::SqlServer)?;
        conn.give_back();
        Ok(store)
    }

    /// A store from a tiberius [`Config`] built in code (for passwords an ADO.NET string cannot
    /// carry, say), on the default table.
    pub fn from_config(config: Config) -> Self {
        Self {
            pool: Arc::new(Pool::new(config, DEFAULT_MAX_CONNECTIONS)),
            table: Arc::from(DEFAULT_TABLE),
            sql: Arc::new(Statements::new(DEFAULT_TABLE)),
        }
    }

    /// The same store on another table (validated: ASCII letters, digits and `_`, at most 63
    /// characters; bracket-quoted in every statement). Create it with
    /// [`migrate`](Self::migrate).
    pub fn with_table(mut self, table: impl AsRef<str>) -> Result<Self, StoreError> {
        let table = table.as_ref();
        validate_table_name(table)?;
        self.table = Arc::from(table);
        self.sql = Arc::new(Statements::new(table));
        Ok(self)
    }

    /// The same store with a pool of its own of at most `max` connections (at least 1).
    pub fn with_max_connections(mut self, max: usize) -> Self {
        self.pool = Arc::new(Pool::new(self.pool.config.clone(), max));
        self
    }

    /// The lease table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The versioned T-SQL ([`MIGRATION_SQL`], migration [`MIGRATION_NAME`]) for this store's
    /// table: what [`migrate`](Self::migrate) sends, for those who apply schema changes with
    /// their own tools.
    pub fn migration_sql(&self) -> String {
        migration_sql(&self.table)
    }

    /// The T-SQL of the transactional fence, to run inside your own transaction on the lease
    /// database (`BEGIN TRAN` on your tiberius client) before your writes, with `@P1` the
    /// resource, `@P2` the holder and `@P3` the token (`i64`). It returns one row while the term
    /// is current and then holds a shared lock on the lease row until your transaction ends, so
    /// no rival can take over before your writes commit; no row means fenced: roll back.
    pub fn fence_sql(&self) -> String {
        fence_sql(&self.table)
    }

    /// Creates the lease table if it does not exist (`IF OBJECT_ID(...) IS NULL CREATE TABLE
    /// ...`): idempotent, and safe to run from several processes at once. An existing table is
    /// left as it is.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        match self
            .run(Want::RowsAffected, &self.migration_sql(), &[])
            .await
        {
            Ok(_) => Ok(()),
            // Another process created it between our check and our CREATE.
            Err(err) if err.code() == Some(code::OBJECT_EXISTS) => Ok(()),
            Err(err) => Err(self.classify(err)),
        }
    }

    /// Sends one batch on a pooled connection, again while SQL Server reports a deadlock or a
    /// duplicate key, at most [`ATTEMPTS`] times.
    async fn run(&self, want: Want, sql: &str, params: &[&dyn ToSql]) -> Result<Reply, TdsError> {
        let mut attempt = 1;
        loop {
            let mut conn = self.pool.get().await?;
            match send(&mut conn.client, want, sql, params).await {
                Ok(reply) => {
                    conn.give_back();
                    return Ok(reply);
                }
                Err(err) => {
                    if keeps_connection(&err) {
                        conn.give_back();
                    } else {
                        tracing::debug!(table = %self.table, error = %err, "closing a SQL Server connection that failed");
                        drop(conn);
                    }
                    if attempt < ATTEMPTS && is_conflict(err.code()) {
                        tracing::debug!(table = %self.table, attempt, error = %err, "lease statement conflicted; retrying");
                        tokio::time::sleep(backoff(attempt)).await;
                        attempt += 1;
                        continue;
                    }
                    return Err(err);
                }
            }
        }
    }

    async fn rows(&self, sql: &str, params: &[&dyn ToSql]) -> Result<Vec<Row>, StoreError> {
        match self.run(Want::Rows, sql, params).await {
            Ok(Reply::Rows(rows)) => {
                rows.iter()
                    .map(decode)
                    .collect::<Result<_, _>>()
                    .map_err(|source| StoreError::Decode {
                        table: self.table.to_string(),
                        source,
                    })
            }
            Ok(Reply::RowsAffected(_)) => Ok(Vec::new()),
            Err(err) => Err(self.classify(err)),
        }
    }

    async fn read_row(&self, resource: &str) -> Result<Option<Row>, StoreError> {
        Ok(self
            .rows(&self.sql.current, &[&resource])
            .await?
            .into_iter()
            .next())
    }

    fn classify(&self, err: TdsError) -> StoreError {
        match err.code() {
            Some(code::INVALID_OBJECT) => StoreError::SqlServerMissingTable {
                table: self.table.to_string(),
                source: err,
            },
            code if is_conflict(code) => StoreError::SqlServerConflict { source: err },
            _ => StoreError::SqlServer(err),
        }
    }
}

/// 5 ms, 10 ms, ... plus up to 5 ms of jitter, so racers that collided do not collide again.
fn backoff(attempt: u32) -> Duration {
    let jitter = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::from(d.subsec_nanos() % 5_000))
        .unwrap_or(0);
    Duration::from_millis(5 * u64::from(attempt)) + Duration::from_micros(jitter)
}

fn column<'a, T: FromSql<'a>>(row: &'a tiberius::Row, idx: usize, name: &str) -> Result<T, DbErr> {
    match row.try_get::<T, _>(idx) {
        Ok(Some(value)) => Ok(value),
        Ok(None) => Err(DbErr::Type(format!("SQL Server column {name} is NULL"))),
        Err(e) => Err(DbErr::Type(format!("SQL Server column {name}: {e}"))),
    }
}

/// Decodes `holder, fencing_token, expires_at, acquired_at, renewed_at, remaining_ms`.
fn decode(row: &tiberius::Row) -> Result<Row, DbErr> {
    let time = |idx, name| column::<chrono::NaiveDateTime>(row, idx, name).map(|t| t.and_utc());
    Ok(Row {
        holder: column::<&str>(row, 0, "holder")?.to_owned(),
        token: column::<i64>(row, 1, "fencing_token")?,
        expires_at: time(2, "expires_at")?,
        acquired_at: time(3, "acquired_at")?,
        renewed_at: time(4, "renewed_at")?,
        remaining_millis: column::<i64>(row, 5, "remaining_ms")?,
    })
}

#[async_trait]
impl LeaseStore for SqlServerLeaseStore {
    async fn acquire_or_renew(
        &self,
        resource: &str,
        candidate: &str,
        lease: Duration,
    ) -> Result<LeaseOutcome, StoreError> {
        let millis = validate_request(resource, candidate, lease)?;
        check_resource(resource)?;
        check_candidate(candidate)?;
        let too_long = || StoreError::InvalidLeaseDuration {
            duration: lease,
            reason: "must be at most 366 days",
        };
        let seconds = i32::try_from(millis / 1000).map_err(|_| too_long())?;
        let rest_ms = i32::try_from(millis % 1000).map_err(|_| too_long())?;
        let returned = self
            .rows(
                &self.sql.upsert,
                &[&resource, &candidate, &seconds, &rest_ms],
            )
            .await?;
        let mut returned = returned.into_iter();
        match (returned.next(), returned.next()) {
            // Several rows for one statement: trust none of them.
            (Some(_), Some(_)) => Ok(LeaseOutcome::Denied(Denial::new(resource))),
            (Some(row), None) => Ok(row.outcome(resource, candidate)),
            // Denied: the MERGE changed nothing. Say who holds the lease with a plain read; the
            // read is only a report (the holder may change between the two statements).
            (None, _) => Ok(LeaseOutcome::Denied(
                match self.read_row(resource).await? {
                    Some(row) => row.denial_for(resource, candidate),
                    None => Denial::new(resource),
                },
            )),
        }
    }

    async fn release(&self, resource: &str, candidate: &str) -> Result<bool, StoreError> {
        check_resource(resource)?;
        check_candidate(candidate)?;
        match self
            .run(
                Want::RowsAffected,
                &self.sql.release,
                &[&resource, &candidate],
            )
            .await
        {
            Ok(Reply::RowsAffected(n)) => Ok(n > 0),
            Ok(Reply::Rows(rows)) => Ok(!rows.is_empty()),
            Err(err) => Err(self.classify(err)),
        }
    }

    async fn release_lease(&self, lease: &Lease) -> Result<bool, StoreError> {
        check_resource(&lease.resource)?;
        check_candidate(&lease.holder)?;
        let Some(expires_at) = lease.expires_at else {
            return Ok(false);
        };
        let (expires_at, token) = (expires_at.naive_utc(), lease.token.get());
        match self
            .run(
                Want::RowsAffected,
                &self.sql.release_write,
                &[
                    &lease.resource.as_str(),
                    &lease.holder.as_str(),
                    &token,
                    &expires_at,
                ],
            )
            .await
        {
            Ok(Reply::RowsAffected(n)) => Ok(n > 0),
            Ok(Reply::Rows(rows)) => Ok(!rows.is_empty()),
            Err(err) => Err(self.classify(err)),
        }
    }

    async fn current(&self, resource: &str) -> Result<Option<LeaseRecord>, StoreError> {
        check_resource(resource)?;
        Ok(self
            .read_row(resource)
            .await?
            .map(|row| row.record(resource)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: &str =
        "Server=localhost;Database=app;User Id=sa;Password=secret;TrustServerCertificate=True";

    // The statements are plain text: pin every character of them.
    #[test]
    fn upsert_is_one_merge_with_holdlock_and_output() {
        assert_eq!(
            upsert_sql(DEFAULT_TABLE),
            concat!(
                "SET XACT_ABORT ON; ",
                "DECLARE @now datetime2(7) = SYSUTCDATETIME(); ",
                "DECLARE @locked int; ",
                "BEGIN TRANSACTION; ",
                "SELECT @locked = COUNT(*) FROM [orionbeacon_leases] WITH (UPDLOCK, HOLDLOCK) WHERE resource = @P1; ",
                "DECLARE @written datetime2(7) = SYSUTCDATETIME(); ",
                "MERGE [orionbeacon_leases] WITH (HOLDLOCK) AS t ",
                "USING (SELECT @P1 AS resource, @P2 AS holder) AS s ",
                "ON t.resource = s.resource ",
                "WHEN MATCHED AND (t.holder = s.holder OR t.expires_at <= @now) THEN UPDATE SET ",
                "t.fencing_token = CASE WHEN t.expires_at <= @now THEN t.fencing_token + 1 ELSE t.fencing_token END, ",
                "t.acquired_at = CASE WHEN t.expires_at <= @now THEN @now ELSE t.acquired_at END, ",
                "t.renewed_at = CASE WHEN t.expires_at <= @now THEN @now ",
                "WHEN @now > DATEADD(NANOSECOND, 100, t.acquired_at) THEN @now ELSE DATEADD(NANOSECOND, 100, t.acquired_at) END, ",
                "t.holder = s.holder, ",
                "t.expires_at = DATEADD(MILLISECOND, @P4, DATEADD(SECOND, @P3, @written)) ",
                "WHEN NOT MATCHED THEN INSERT (resource, holder, fencing_token, expires_at, acquired_at, renewed_at) ",
                "VALUES (s.resource, s.holder, 1, DATEADD(MILLISECOND, @P4, DATEADD(SECOND, @P3, @written)), @now, @now) ",
                "OUTPUT inserted.holder, inserted.fencing_token, inserted.expires_at, inserted.acquired_at, ",
                "inserted.renewed_at, DATEDIFF_BIG(NANOSECOND, @now, inserted.expires_at) / 1000000 AS remaining_ms; ",
                "COMMIT TRANSACTION;",
            )
        );
    }

    #[test]
    fn upsert_respects_the_known_pitfalls() {
        let sql = upsert_sql(DEFAULT_TABLE);
        // One MERGE, serializable on the key range, terminated.
        assert_eq!(sql.matches("MERGE ").count(), 1);
        assert!(sql.contains("MERGE [orionbeacon_leases] WITH (HOLDLOCK) AS t "));
        assert!(sql.ends_with(';'));
        // The lease filter is in WHEN MATCHED AND, never in ON.
        let on = &sql[sql.find(" ON ").unwrap()..sql.find(" WHEN MATCHED").unwrap()];
        assert_eq!(on, " ON t.resource = s.resource");
        assert!(sql.contains(
            "WHEN MATCHED AND (t.holder = s.holder OR t.expires_at <= @now) THEN UPDATE"
        ));
        // The clock is read twice per batch: liveness at the start (`@now`), the lease's end
        // after the row's key range is locked (`@written`), as the only later read.
        assert_eq!(sql.matches("SYSUTCDATETIME()").count(), 2);
        let lock = sql.find("WITH (UPDLOCK, HOLDLOCK)").unwrap();
        let written = sql.find("DECLARE @written").unwrap();
        assert!(lock < written && written < sql.find("MERGE ").unwrap());
        assert!(!sql.contains("DATEADD(SECOND, @P3, @now)"), "{sql}");
        // One transaction, rolled back whole on any error.
        assert!(
            sql.starts_with("SET XACT_ABORT ON; DECLARE @now datetime2(7) = SYSUTCDATETIME(); ")
        );
        assert!(sql.ends_with(" COMMIT TRANSACTION;"));
        // No output row means denied: OUTPUT sits on the MERGE itself.
        assert!(sql.contains(" OUTPUT inserted.holder,"));
    }

    fn params(sql: &str) -> Vec<&str> {
        let mut found: Vec<&str> = sql
            .match_indices("@P")
            .map(|(i, _)| {
                let digits = sql[i + 2..]
                    .find(|c: char| !c.is_ascii_digit())
                    .map_or(sql.len(), |end| i + 2 + end);
                &sql[i..digits]
            })
            .collect();
        found.sort_unstable();
        found.dedup();
        found
    }

    #[test]
    fn values_are_parameters_only() {
        let store = SqlServerLeaseStore::new(SEED).unwrap();
        for (sql, expected) in [
            (&store.sql.upsert, vec!["@P1", "@P2", "@P3", "@P4"]),
            (&store.sql.release, vec!["@P1", "@P2"]),
            (&store.sql.release_write, vec!["@P1", "@P2", "@P3", "@P4"]),
            (&store.sql.current, vec!["@P1"]),
        ] {
            assert_eq!(params(sql), expected, "{sql}");
            assert!(!sql.contains('\''), "no string literals: {sql}");
            assert!(
                !sql.contains('"'),
                "no quoted identifiers or literals: {sql}"
            );
            assert!(sql.ends_with(';'), "{sql}");
        }
    }

    #[test]
    fn fence_text() {
        assert_eq!(
            fence_sql(DEFAULT_TABLE),
            "SELECT 1 AS held FROM [orionbeacon_leases] WITH (HOLDLOCK, ROWLOCK) \
             WHERE resource = @P1 AND holder = @P2 AND fencing_token = @P3 AND expires_at > SYSUTCDATETIME();"
        );
    }

    #[test]
    fn release_and_current_text() {
        assert_eq!(
            release_sql(DEFAULT_TABLE),
            "DECLARE @now datetime2(7) = SYSUTCDATETIME(); \
             UPDATE [orionbeacon_leases] SET expires_at = CASE WHEN renewed_at < @now THEN renewed_at ELSE @now END \
             WHERE resource = @P1 AND holder = @P2 AND expires_at > @now;"
        );
        assert_eq!(
            release_write_sql(DEFAULT_TABLE),
            "DECLARE @now datetime2(7) = SYSUTCDATETIME(); \
             UPDATE [orionbeacon_leases] SET expires_at = CASE WHEN renewed_at < @now THEN renewed_at ELSE @now END \
             WHERE resource = @P1 AND holder = @P2 AND fencing_token = @P3 AND expires_at = @P4 \
             AND expires_at > @now;"
        );
        assert_eq!(
            current_sql(DEFAULT_TABLE),
            "DECLARE @now datetime2(7) = SYSUTCDATETIME(); \
             SELECT holder, fencing_token, expires_at, acquired_at, renewed_at, \
             DATEDIFF_BIG(NANOSECOND, @now, expires_at) / 1000000 AS remaining_ms \
             FROM [orionbeacon_leases] WHERE resource = @P1;"
        );
    }

    #[test]
    fn custom_tables_are_validated_and_bracket_quoted() {
        let store = SqlServerLeaseStore::new(SEED)
            .unwrap()
            .with_table("shard_leases")
            .unwrap();
        assert_eq!(store.table(), "shard_leases");
        for sql in [&store.sql.upsert, &store.sql.release, &store.sql.current] {
            assert!(sql.contains("[shard_leases]"), "{sql}");
            assert!(!sql.contains("orionbeacon_leases"), "{sql}");
        }
        assert!(store
            .sql
            .upsert
            .contains("MERGE [shard_leases] WITH (HOLDLOCK) AS t "));
        assert!(store.sql.current.contains(" FROM [shard_leases] WHERE "));
        assert!(store.sql.release.contains("UPDATE [shard_leases] SET "));
        for bad in [
            "",
            "x; DROP TABLE y",
            "a]b",
            "a[b",
            "a\"b",
            "1x",
            &"t".repeat(64),
        ] {
            let err = SqlServerLeaseStore::new(SEED)
                .unwrap()
                .with_table(bad)
                .unwrap_err();
            assert!(
                matches!(err, StoreError::InvalidTableName(_)),
                "{bad:?}: {err:?}"
            );
        }
        assert_eq!(quoted("a]b"), "[a]]b]");
    }

    #[test]
    fn migration_is_the_shipped_file_and_idempotent() {
        let store = SqlServerLeaseStore::new(SEED).unwrap();
        assert_eq!(store.migration_sql(), MIGRATION_SQL);
        assert!(MIGRATION_SQL.contains(MIGRATION_NAME));
        assert!(MIGRATION_SQL
            .contains("IF OBJECT_ID(N'[orionbeacon_leases]', N'U') IS NULL\nCREATE TABLE [orionbeacon_leases] ("));
        for column in [
            "resource nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL",
            "holder nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL",
            "fencing_token bigint NOT NULL",
            "expires_at datetime2(7) NOT NULL",
            "acquired_at datetime2(7) NOT NULL",
            "renewed_at datetime2(7) NOT NULL",
            "CONSTRAINT [PK_orionbeacon_leases] PRIMARY KEY CLUSTERED (resource)",
        ] {
            assert!(MIGRATION_SQL.contains(column), "{column}");
        }
        assert!(
            !MIGRATION_SQL.contains("\nGO"),
            "one batch, no client separators"
        );

        let custom = store.with_table("shard_leases").unwrap().migration_sql();
        assert!(custom.contains(
            "IF OBJECT_ID(N'[shard_leases]', N'U') IS NULL\nCREATE TABLE [shard_leases] ("
        ));
        assert!(custom.contains("CONSTRAINT [PK_shard_leases] PRIMARY KEY CLUSTERED (resource)"));
        assert!(!custom.contains("[orionbeacon_leases]"));
        assert!(!custom.contains("[PK_orionbeacon_leases]"));
    }

    #[test]
    fn seed_connection_strings_parse() {
        for (ado, addr) in [
            (SEED, "localhost:1433"),
            (
                "Server=tcp:localhost,1433;Database=app;User Id=sa;Password=secret;TrustServerCertificate=True",
                "localhost:1433",
            ),
            (
                "server=db.internal,14330;database=app;uid=sa;pwd=secret;encrypt=true",
                "db.internal:14330",
            ),
            (
                "Server=localhost;Database=app;User Id=sa;Password='p@ss;word=42';TrustServerCertificate=yes",
                "localhost:1433",
            ),
        ] {
            let store = SqlServerLeaseStore::new(ado).unwrap_or_else(|e| panic!("{ado}: {e:?}"));
            assert_eq!(store.pool.config.get_addr(), addr, "{ado}");
            assert_eq!(store.table(), DEFAULT_TABLE);
            let debug = format!("{store:?}");
            assert!(!debug.contains("secret") && !debug.contains("p@ss"), "{debug}");
        }
        let config = Config::from_ado_string(SEED).unwrap();
        let shown = format!("{config:?}");
        assert!(shown.contains("\"app\""), "database parsed: {shown}");
    }

    #[test]
    fn bad_connection_strings_are_typed_errors() {
        for bad in [
            "Server=localhost,notaport;Database=app",
            "Server=localhost;Encrypt=perhaps",
            "Server=localhost;TrustServerCertificate=maybe",
            "Server=localhost;TrustServerCertificate=True;TrustServerCertificateCA=/ca.pem",
        ] {
            let err = SqlServerLeaseStore::new(bad).unwrap_err();
            assert!(
                matches!(err, StoreError::InvalidConnectionString { .. }),
                "{bad}: {err:?}"
            );
            assert!(std::error::Error::source(&err).is_some());
        }
    }

    #[test]
    fn names_must_fit_nvarchar_255() {
        assert!(check_resource(&"é".repeat(255)).is_ok());
        // 255 characters, 510 UTF-16 code units.
        let wide = "𝄞".repeat(255);
        assert!(validate_resource(&wide).is_ok());
        assert!(matches!(
            check_resource(&wide),
            Err(StoreError::InvalidResource { .. })
        ));
        assert!(matches!(
            check_candidate(&"𝄞".repeat(128)),
            Err(StoreError::InvalidCandidate { .. })
        ));
        assert!(check_candidate(&"𝄞".repeat(127)).is_ok());
    }

    #[test]
    fn only_intact_connections_go_back_to_the_pool() {
        assert!(!keeps_connection(&TdsError::Io {
            kind: std::io::ErrorKind::ConnectionReset,
            message: "reset".into(),
        }));
        assert!(!keeps_connection(&TdsError::Protocol("desync".into())));
        assert!(!keeps_connection(&TdsError::Tls("bad cert".into())));
        assert!(!keeps_connection(&timed_out("x")));
        assert!(is_conflict(Some(1205)) && is_conflict(Some(2627)));
        assert!(!is_conflict(Some(208)) && !is_conflict(None));
    }

    #[test]
    fn backoff_is_bounded() {
        for attempt in 1..ATTEMPTS {
            let d = backoff(attempt);
            assert!(d >= Duration::from_millis(5 * u64::from(attempt)));
            assert!(d < Duration::from_millis(5 * u64::from(attempt) + 5));
        }
    }
}
