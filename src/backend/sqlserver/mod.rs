//! SQL Server: [`SqlServerLeaseStore`], straight over TDS with `tiberius` (cargo feature
//! `sqlserver`).
//!
//! Open-source SeaORM and sea-query have no SQL Server backend, so this store talks to SQL Server
//! (2016 or later, or Azure SQL) directly: TDS 7.3 over rustls (no OpenSSL), tokio through
//! tokio-util's compat layer, and a pool of its own (deadpool; see [`SqlServerLeaseStore`] for
//! connecting, connection strings, encryption and the pool). The contract and the rules are those
//! of every other store (see [`LeaseStore`]); only the statements differ.
//!
//! # The table
//!
//! The table comes from the versioned T-SQL in
//! `sql/m20261129_000001_create_orionbeacon_leases.sqlserver.sql` of this crate (the same version name
//! as the SeaORM migration, which cannot run on SQL Server; this module includes that file:
//! [`MIGRATION_SQL`]): `IF OBJECT_ID(...) IS NULL CREATE TABLE ...` with `resource`/`holder` as
//! `nvarchar(255) COLLATE Latin1_General_100_BIN2` (names compare byte for byte, as on the other
//! backends), `fencing_token bigint` and `datetime2(7)` UTC times. Apply it with your own tools
//! ([`SqlServerLeaseStore::migration_sql`] gives it for a custom table), or call
//! [`SqlServerLeaseStore::migrate`], which sends exactly that text and is safe to run from several
//! processes at once.
//!
//! `OUTPUT` without `INTO` fails (error 334) on a table with enabled triggers: leave the lease
//! table without triggers.
//!
//! The membership table of shard sets ([`MembershipStore`]) comes the same way from
//! `sql/m20261201_000001_create_orionbeacon_members.sqlserver.sql` ([`MEMBER_MIGRATION_SQL`],
//! version [`MEMBER_MIGRATION_NAME`], the SeaORM `CreateMemberTable`'s): `shard_set` and `member`
//! as the lease table's names are, `draining bit`, `datetime2(7)` UTC times, primary key
//! `(shard_set, member)`. [`SqlServerLeaseStore::migrate_members`] sends it
//! ([`SqlServerLeaseStore::member_migration_sql`] gives it for a custom table); `migrate` creates
//! only the lease table.
//!
//! # The statements
//!
//! - acquire-or-renew is one statement after `DECLARE @now datetime2(7) = SYSUTCDATETIME();` (one
//!   database-clock reading per batch, so every comparison in it agrees): `MERGE <table> WITH
//!   (HOLDLOCK) AS t USING (SELECT @P1 AS resource, @P2 AS holder) AS s ON t.resource = s.resource
//!   WHEN MATCHED AND (t.holder = s.holder OR t.expires_at <= @now) THEN UPDATE ... WHEN NOT
//!   MATCHED THEN INSERT ... OUTPUT inserted....;`. `HOLDLOCK` (serializable) locks the key range,
//!   so two racers for a fresh resource cannot both take the `WHEN NOT MATCHED` branch; the lease
//!   filter sits in `WHEN MATCHED AND (...)`, never in `ON`, so a live lease of someone else
//!   matches and is left alone instead of falling through to an insert. No `OUTPUT` row means
//!   denied, and a plain read then reports the holder. Every value is an `@Pn` parameter.
//! - the acquire batch first locks the lease row's key range and then reads the clock again
//!   (`@written`), so a lease granted after a wait behind a fence still runs its full length from
//!   the grant.
//! - deadlocks (1205) and duplicate keys (2627, defensively) mean the statement had no effect:
//!   they are retried up to 5 times, then reported as the retryable [`StoreError::Conflict`].
//! - a membership heartbeat is one batch at one reading of the clock (`@now`): `MERGE <members>
//!   WITH (HOLDLOCK) AS t USING (SELECT @P1 AS shard_set, @P2 AS [member]) AS s ON t.shard_set =
//!   s.shard_set AND t.[member] = s.[member] WHEN MATCHED THEN UPDATE ... WHEN NOT MATCHED THEN
//!   INSERT ...;` then the `SELECT` of the set's live members (the caller among them). A leave
//!   deletes the member's live row, then the set's lapsed rows, and returns `@@ROWCOUNT` of the
//!   first `DELETE`. Names and the time to live are checked as on the other stores (and against
//!   `nvarchar(255)`, below) before any SQL runs.
//!
//! # Fenced writes
//!
//! There is no SeaORM transaction to fence here: run [`SqlServerLeaseStore::fence_sql`] (`SELECT 1
//! ... WITH (HOLDLOCK, ROWLOCK) WHERE <term is current>`) in your own transaction before your
//! writes. The rival's `MERGE` waits for its shared lock until your transaction ends. The fence is
//! not covered by the fencing tests, which need a server.
//!
//! # Names
//!
//! SQL Server counts `nvarchar(255)` in UTF-16 code units, so a resource or candidate name of more
//! than 255 code units (characters outside the Basic Multilingual Plane count twice) is refused
//! before any SQL runs.
//!
//! # Errors
//!
//! A missing table is [`StoreError::MissingTable`] (its message says how to migrate), a refused
//! connection string [`StoreError::InvalidConnectionString`], a conflict that outlasted the retries
//! [`StoreError::Conflict`], anything else from SQL Server [`StoreError::Database`]; each keeps
//! tiberius' error as its source.
//!
//! The module's parts: the store here, its T-SQL in `tsql`, its connection pool in `pool`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use orion_beacon_entity::{validate_table_name, DEFAULT_MEMBER_TABLE, DEFAULT_TABLE};
use sea_orm::DbErr;
use tiberius::error::Error as TdsError;
use tiberius::{Config, FromSql, ToSql};

use super::statements::{held_json, Row};
use crate::membership::{validate_heartbeat, validate_shard_set, Member, MembershipStore};
use crate::store::{
    validate_batch, validate_candidate, validate_request, validate_resource, MAX_NAME_LEN,
};
use crate::{Denial, Lease, LeaseOutcome, LeaseRecord, LeaseStore, Renewals, StoreError};

mod pool;
mod tsql;

use pool::{keeps_connection, Connection, Pool, DEFAULT_MAX_CONNECTIONS};
use tsql::{fence_sql, member_migration_sql, migration_sql, MemberStatements, Statements};
pub use tsql::{MEMBER_MIGRATION_NAME, MEMBER_MIGRATION_SQL, MIGRATION_NAME, MIGRATION_SQL};

/// How often a statement is tried when SQL Server picks it as a deadlock victim (1205) or
/// reports a duplicate key (2627). Either way the statement had no effect.
const ATTEMPTS: u32 = 5;

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

fn check_shard_set(shard_set: &str) -> Result<(), StoreError> {
    validate_shard_set(shard_set)?;
    match check_utf16_len(shard_set) {
        Some(reason) => Err(StoreError::InvalidShardSet {
            name: shard_set.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

/// Whether `code` means the statement lost a race and had no effect.
fn is_conflict(code: Option<u32>) -> bool {
    matches!(code, Some(code::DEADLOCK | code::DUPLICATE_KEY))
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
/// The store keeps a pool of its own (deadpool; 4 connections unless
/// [`with_max_connections`](Self::with_max_connections) says otherwise): every operation takes
/// one connection for its statement and gives it back. A connection that failed at the IO, TLS
/// or protocol level (or was interrupted by a cancelled call) is closed and replaced, never
/// reused. Clones share the pool.
#[derive(Debug, Clone)]
pub struct SqlServerLeaseStore {
    pool: Arc<Pool>,
    table: Arc<str>,
    sql: Arc<Statements>,
    member_table: Arc<str>,
    member_sql: Arc<MemberStatements>,
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
    /// certificate or password shows up here ([`StoreError::Database`]).
    pub async fn connect(ado_connection_string: &str) -> Result<Self, StoreError> {
        let store = Self::new(ado_connection_string)?;
        let conn = store
            .pool
            .get()
            .await
            .map_err(|e| StoreError::Database(e.into()))?;
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
            member_table: Arc::from(DEFAULT_MEMBER_TABLE),
            member_sql: Arc::new(MemberStatements::new(DEFAULT_MEMBER_TABLE)),
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

    /// The same store with shard sets' members ([`MembershipStore`]) in another table
    /// (validated like [`with_table`](Self::with_table)). Create it with
    /// [`migrate_members`](Self::migrate_members).
    pub fn with_member_table(mut self, table: impl AsRef<str>) -> Result<Self, StoreError> {
        let table = table.as_ref();
        validate_table_name(table)?;
        self.member_table = Arc::from(table);
        self.member_sql = Arc::new(MemberStatements::new(table));
        Ok(self)
    }

    /// The same store with a pool of its own of at most `max` connections (at least 1).
    pub fn with_max_connections(mut self, max: usize) -> Self {
        self.pool = Arc::new(Pool::new(self.pool.config().clone(), max));
        self
    }

    /// The lease table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The membership table's name (`orionbeacon_members` unless configured).
    pub fn member_table(&self) -> &str {
        &self.member_table
    }

    /// The versioned T-SQL ([`MIGRATION_SQL`], migration [`MIGRATION_NAME`]) for this store's
    /// table: what [`migrate`](Self::migrate) sends, for those who apply schema changes with
    /// their own tools.
    pub fn migration_sql(&self) -> String {
        migration_sql(&self.table)
    }

    /// The versioned T-SQL of the membership table ([`MEMBER_MIGRATION_SQL`], migration
    /// [`MEMBER_MIGRATION_NAME`]) for this store's membership table: what
    /// [`migrate_members`](Self::migrate_members) sends.
    pub fn member_migration_sql(&self) -> String {
        member_migration_sql(&self.member_table)
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
        self.create(&self.migration_sql())
            .await
            .map_err(|err| self.classify(err))
    }

    /// Creates the membership table of shard sets if it does not exist, as
    /// [`migrate`](Self::migrate) does the lease table (idempotent, safe to run from several
    /// processes at once): only needed for [`MembershipStore`].
    pub async fn migrate_members(&self) -> Result<(), StoreError> {
        self.create(&self.member_migration_sql())
            .await
            .map_err(|err| self.classify_members(err))
    }

    /// Sends an idempotent `IF OBJECT_ID(...) IS NULL CREATE TABLE` batch.
    async fn create(&self, sql: &str) -> Result<(), TdsError> {
        match self.run(Want::RowsAffected, sql, &[]).await {
            Ok(_) => Ok(()),
            // Another process created it between our check and our CREATE.
            Err(err) if err.code() == Some(code::OBJECT_EXISTS) => Ok(()),
            Err(err) => Err(err),
        }
    }

    /// Sends one batch on a pooled connection, again while SQL Server reports a deadlock or a
    /// duplicate key, at most [`ATTEMPTS`] times.
    async fn run(&self, want: Want, sql: &str, params: &[&dyn ToSql]) -> Result<Reply, TdsError> {
        let mut attempt = 1;
        loop {
            let mut conn = self.pool.get().await?;
            match send(conn.client()?, want, sql, params).await {
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
        classify_in(&self.table, err)
    }

    /// An error of a membership statement: a missing table is the membership table.
    fn classify_members(&self, err: TdsError) -> StoreError {
        classify_in(&self.member_table, err)
    }

    /// Runs a membership read (or the heartbeat, which ends with one) and decodes its members,
    /// in byte order of their ids whatever the server's collation says.
    async fn member_rows(
        &self,
        sql: &str,
        params: &[&dyn ToSql],
    ) -> Result<Vec<Member>, StoreError> {
        let rows = match self.run(Want::Rows, sql, params).await {
            Ok(Reply::Rows(rows)) => rows,
            Ok(Reply::RowsAffected(_)) => Vec::new(),
            Err(err) => return Err(self.classify_members(err)),
        };
        let mut members = rows
            .iter()
            .map(decode_member)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| StoreError::Decode {
                table: self.member_table.to_string(),
                source,
            })?;
        members.sort_by(|a, b| (&a.shard_set, &a.member).cmp(&(&b.shard_set, &b.member)));
        Ok(members)
    }
}

/// A SQL Server error of a statement on `table`.
fn classify_in(table: &str, err: TdsError) -> StoreError {
    match err.code() {
        Some(code::INVALID_OBJECT) => StoreError::MissingTable {
            table: table.to_owned(),
            source: err.into(),
        },
        code if is_conflict(code) => StoreError::Conflict { source: err.into() },
        _ => StoreError::Database(err.into()),
    }
}

/// A lease in whole seconds and the milliseconds left over (`DATEADD` takes an `int`, and 366
/// days of milliseconds do not fit one).
fn split_lease(millis: i64, lease: Duration) -> Result<(i32, i32), StoreError> {
    let too_long = || StoreError::InvalidLeaseDuration {
        duration: lease,
        reason: "must be at most 366 days",
    };
    let seconds = i32::try_from(millis / 1000).map_err(|_| too_long())?;
    let rest_ms = i32::try_from(millis % 1000).map_err(|_| too_long())?;
    Ok((seconds, rest_ms))
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

/// Decodes `shard_set, member, draining, joined_at, heartbeat_at, remaining_ms`.
fn decode_member(row: &tiberius::Row) -> Result<Member, DbErr> {
    let time = |idx, name| column::<chrono::NaiveDateTime>(row, idx, name).map(|t| t.and_utc());
    let remaining = column::<i64>(row, 5, "remaining_ms")?;
    let mut member = Member::new(
        column::<&str>(row, 0, "shard_set")?,
        column::<&str>(row, 1, "member")?,
        Duration::from_millis(u64::try_from(remaining).unwrap_or(0)),
    );
    member.draining = column::<bool>(row, 2, "draining")?;
    member.joined_at = Some(time(3, "joined_at")?);
    member.heartbeat_at = Some(time(4, "heartbeat_at")?);
    Ok(member)
}

/// The membership of shard sets in the store's membership table
/// ([`with_member_table`](SqlServerLeaseStore::with_member_table), created by
/// [`migrate_members`](SqlServerLeaseStore::migrate_members)); the statements are described in
/// the [module docs](self).
#[async_trait]
impl MembershipStore for SqlServerLeaseStore {
    async fn heartbeat(
        &self,
        shard_set: &str,
        member: &str,
        ttl: Duration,
        draining: bool,
    ) -> Result<Vec<Member>, StoreError> {
        let millis = validate_heartbeat(shard_set, member, ttl)?;
        check_shard_set(shard_set)?;
        check_candidate(member)?;
        let (seconds, rest_ms) = split_lease(millis, ttl)?;
        self.member_rows(
            &self.member_sql.heartbeat,
            &[&shard_set, &member, &seconds, &rest_ms, &draining],
        )
        .await
    }

    async fn leave(&self, shard_set: &str, member: &str) -> Result<bool, StoreError> {
        check_shard_set(shard_set)?;
        check_candidate(member)?;
        let rows = match self
            .run(Want::Rows, &self.member_sql.leave, &[&shard_set, &member])
            .await
        {
            Ok(Reply::Rows(rows)) => rows,
            Ok(Reply::RowsAffected(_)) => Vec::new(),
            Err(err) => return Err(self.classify_members(err)),
        };
        let removed = match rows.first() {
            Some(row) => column::<i32>(row, 0, "removed").map_err(|source| StoreError::Decode {
                table: self.member_table.to_string(),
                source,
            })?,
            None => 0,
        };
        Ok(removed > 0)
    }

    async fn members(&self, shard_set: &str) -> Result<Vec<Member>, StoreError> {
        check_shard_set(shard_set)?;
        self.member_rows(&self.member_sql.members, &[&shard_set])
            .await
    }
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
        let (seconds, rest_ms) = split_lease(millis, lease)?;
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

    /// One batch for all of `held` (see `renew_all_sql`), the leases bound as one JSON
    /// document.
    async fn renew_all(&self, held: &[Lease], lease: Duration) -> Result<Renewals, StoreError> {
        let millis = validate_batch(held, lease)?;
        for h in held {
            check_resource(&h.resource)?;
            check_candidate(&h.holder)?;
        }
        if held.is_empty() {
            return Ok(Renewals::default());
        }
        let (seconds, rest_ms) = split_lease(millis, lease)?;
        let json = held_json(held);
        let rows = match self
            .run(
                Want::Rows,
                &self.sql.renew_all,
                &[&seconds, &rest_ms, &json.as_str()],
            )
            .await
        {
            Ok(Reply::Rows(rows)) => rows,
            Ok(Reply::RowsAffected(_)) => Vec::new(),
            Err(err) => return Err(self.classify(err)),
        };
        let mut fresh = Vec::with_capacity(rows.len());
        for r in &rows {
            let (row, resource) = decode(r)
                .and_then(|row| Ok((row, column::<&str>(r, 6, "resource")?.to_owned())))
                .map_err(|source| StoreError::Decode {
                    table: self.table.to_string(),
                    source,
                })?;
            fresh.extend(row.live_lease(resource));
        }
        Ok(Renewals::sort(held, fresh))
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
    use pool::timed_out;
    use tsql::quoted;

    const SEED: &str =
        "Server=localhost;Database=app;User Id=sa;Password=secret;TrustServerCertificate=True";

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
    fn member_tables_are_validated_and_bracket_quoted() {
        let store = SqlServerLeaseStore::new(SEED).unwrap();
        assert_eq!(store.member_table(), DEFAULT_MEMBER_TABLE);
        assert_eq!(store.member_migration_sql(), MEMBER_MIGRATION_SQL);
        let store = store
            .with_table("shard_leases")
            .unwrap()
            .with_member_table("shard_members")
            .unwrap();
        assert_eq!(store.member_table(), "shard_members");
        // Each setting leaves the other table alone.
        assert_eq!(store.table(), "shard_leases");
        assert!(store.migration_sql().contains("[shard_leases]"));
        let sql = &store.member_sql;
        for sql in [&sql.heartbeat, &sql.members, &sql.leave] {
            assert!(sql.contains("[shard_members]"), "{sql}");
            assert!(!sql.contains("leases"), "{sql}");
        }
        assert!(sql
            .heartbeat
            .starts_with("DECLARE @now datetime2(7) = SYSUTCDATETIME(); MERGE [shard_members] WITH (HOLDLOCK) AS t "));
        let ddl = store.member_migration_sql();
        assert!(ddl.contains("CREATE TABLE [shard_members] ("), "{ddl}");
        assert!(ddl.contains("CONSTRAINT [PK_shard_members] PRIMARY KEY CLUSTERED"));
        for bad in ["", "x; DROP TABLE y", "a]b", "1x", &"t".repeat(64)] {
            let err = SqlServerLeaseStore::new(SEED)
                .unwrap()
                .with_member_table(bad)
                .unwrap_err();
            assert!(
                matches!(err, StoreError::InvalidTableName(_)),
                "{bad:?}: {err:?}"
            );
        }
    }

    #[test]
    fn shard_set_names_must_fit_nvarchar_255() {
        assert!(check_shard_set(&"é".repeat(255)).is_ok());
        assert!(matches!(
            check_shard_set(&"𝄞".repeat(128)),
            Err(StoreError::InvalidShardSet { .. })
        ));
        assert!(matches!(
            check_shard_set(" orders"),
            Err(StoreError::InvalidShardSet { .. })
        ));
        assert!(check_shard_set(&"𝄞".repeat(127)).is_ok());
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
            assert_eq!(store.pool.config().get_addr(), addr, "{ado}");
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
