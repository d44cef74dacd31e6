//! SQL Server for [orion-beacon](orion_beacon): [`SqlServerLeaseStore`], straight over TDS with
//! `tiberius`.
//!
//! Open-source SeaORM and sea-query have no SQL Server backend, so this store talks to SQL Server
//! (2016 or later, or Azure SQL) directly: TDS 7.3 over rustls (no OpenSSL), tokio through
//! tokio-util's compat layer, and a pool of its own (deadpool; see [`SqlServerLeaseStore`] for
//! connecting, connection strings, encryption and the pool). The contract and the rules are those
//! of every other store (see [`LeaseStore`](orion_beacon::LeaseStore)); only the statements differ.
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
//! The payload columns (`payload nvarchar(1024)`, `payload_token bigint`, both nullable) come
//! from a second versioned file, `sql/m20261203_000001_add_orionbeacon_leases_payload.sqlserver.sql`
//! ([`PAYLOAD_MIGRATION_SQL`], version [`PAYLOAD_MIGRATION_NAME`], the SeaORM
//! `AddLeasePayload`'s), which adds them to an existing table in place;
//! [`SqlServerLeaseStore::migrate`] sends it after the table's own. Without them the store works
//! without payloads, as the SeaORM store does.
//!
//! `OUTPUT` without `INTO` fails (error 334) on a table with enabled triggers: leave the lease
//! table without triggers.
//!
//! The membership table of shard sets ([`MembershipStore`](orion_beacon::MembershipStore)) comes the same
//! way from `sql/m20261201_000001_create_orionbeacon_members.sqlserver.sql`
//! ([`MEMBER_MIGRATION_SQL`], version [`MEMBER_MIGRATION_NAME`], the SeaORM `CreateMemberTable`'s):
//! `shard_set` and `member` as the lease table's names are, `draining bit`, `datetime2(7)` UTC
//! times, primary key `(shard_set, member)`. [`SqlServerLeaseStore::migrate_members`] sends it
//! ([`SqlServerLeaseStore::member_migration_sql`] gives it for a custom table); `migrate` creates
//! only the lease table. `migrate_members` then adds the members' counts
//! (`sql/m20261205_000001_add_orionbeacon_members_holding.sqlserver.sql`,
//! [`HOLDING_MIGRATION_SQL`], version [`HOLDING_MIGRATION_NAME`], the SeaORM
//! `AddMemberHolding`'s): with them a shard-set node skips its look at the set's leases while the
//! members' counts say nothing can be free; without them it looks every round.
//! Last it adds the candidate rank (`candidate_rank bigint NULL`;
//! `sql/m20261207_000001_add_orionbeacon_members_rank.sqlserver.sql`, [`RANK_MIGRATION_SQL`],
//! version [`RANK_MIGRATION_NAME`], the SeaORM `AddMemberRank`'s), where ranked electors
//! (`ElectorBuilder::rank`, through
//! [`LeaseStore::membership`](orion_beacon::LeaseStore::membership)) keep their candidacy: only
//! they need it, and on a table without it their candidate calls are refused with
//! [`StoreError::OutdatedSchema`] naming `AddMemberRank` while shard sets go on.
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
//! - a rate-limit decision ([`RateLimitStore`](orion_beacon::RateLimitStore)) is one batch at
//!   one reading of the clock (`@now`, whole microseconds since the Unix epoch):
//!   `MERGE <rate limits> WITH (HOLDLOCK)` keyed on `limit_key`, every assignment a `CASE` on
//!   the key's stored arrival time, the row it left in `OUTPUT`. Its table comes from
//!   `sql/m20261206_000001_create_orionbeacon_rate_limits.sqlserver.sql`
//!   ([`RATE_LIMIT_MIGRATION_SQL`], version [`RATE_LIMIT_MIGRATION_NAME`]), sent by
//!   [`SqlServerLeaseStore::migrate_rate_limits`].
//! - deadlocks (1205) and duplicate keys (2627, defensively) mean the statement had no effect:
//!   they are retried up to 5 times, then reported as the retryable [`StoreError::Conflict`].
//! - a membership heartbeat is one batch at one reading of the clock (`@now`): `MERGE <members>
//!   WITH (HOLDLOCK) AS t USING (SELECT @P1 AS shard_set, @P2 AS [member]) AS s ON t.shard_set =
//!   s.shard_set AND t.[member] = s.[member] WHEN MATCHED THEN UPDATE ... WHEN NOT MATCHED THEN
//!   INSERT ...;` then the `SELECT` of the set's live members (the caller among them). A leave
//!   deletes the member's live row, then the set's lapsed rows, and returns `@@ROWCOUNT` of the
//!   first `DELETE`. Names and the time to live are checked as on the other stores (and against
//!   `nvarchar(255)`, below) before any SQL runs.
//! - a ranked election's candidate heartbeat is the same `MERGE` and read at one reading of the
//!   clock, on rows kept under the election's own name (`" =<lease table>/<resource>"`, which no
//!   shard set's name can be) with the rank in `candidate_rank` (the read: the rows that have
//!   one, with how long each has been live since its `joined_at`); a candidate leaves with the
//!   member leave's batch.
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
//! The module's parts: the store and its options here, running a batch (retries, errors) in
//! `exec`, the UTF-16 name checks in `names`, the lease operations in `lease`, the membership
//! operations in `membership`, the migrations in `migrate`, the lease statements' T-SQL in
//! `tsql` and the membership statements' in `member_tsql`, the connection pool in `pool`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::sync::Arc;

use orion_beacon_entity::{
    validate_table_name, DEFAULT_MEMBER_TABLE, DEFAULT_RATE_LIMIT_TABLE, DEFAULT_TABLE,
};
use tiberius::Config;

use orion_beacon::StoreError;

mod exec;
mod lease;
mod member_tsql;
mod membership;
mod migrate;
mod names;
mod pool;
mod rate_limit;
mod tsql;

use member_tsql::MemberStatements;
pub use member_tsql::{
    HOLDING_MIGRATION_NAME, HOLDING_MIGRATION_SQL, MEMBER_MIGRATION_NAME, MEMBER_MIGRATION_SQL,
    RANK_MIGRATION_NAME, RANK_MIGRATION_SQL,
};
use pool::{Pool, DEFAULT_MAX_CONNECTIONS};
pub use rate_limit::{RATE_LIMIT_MIGRATION_NAME, RATE_LIMIT_MIGRATION_SQL};
use tsql::{fence_sql, Statements};
pub use tsql::{MIGRATION_NAME, MIGRATION_SQL, PAYLOAD_MIGRATION_NAME, PAYLOAD_MIGRATION_SQL};

/// A [`LeaseStore`](orion_beacon::LeaseStore) in a table of a SQL Server database (2016 or later, or
/// Azure SQL), over TDS with `tiberius`.
///
/// Built from an ADO.NET connection string, parsed by tiberius' own parser:
///
/// ```no_run
/// # async fn f() -> Result<(), orion_beacon::StoreError> {
/// use std::time::Duration;
/// use orion_beacon::LeaseStore;
/// use orion_beacon_sqlserver::SqlServerLeaseStore;
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
#[derive(Clone)]
pub struct SqlServerLeaseStore {
    pool: Arc<Pool>,
    table: Arc<str>,
    sql: Arc<Statements>,
    /// Set once the lease table was found to have this version's columns (see `ready`).
    schema_checked: Arc<tokio::sync::OnceCell<()>>,
    member_table: Arc<str>,
    member_sql: Arc<MemberStatements>,
    /// The same for the membership table.
    member_schema_checked: Arc<tokio::sync::OnceCell<()>>,
    /// The same for the membership table's candidate rank (ranked electors only).
    candidate_schema_checked: Arc<tokio::sync::OnceCell<()>>,
    rate_table: Arc<str>,
}

/// The backend and the tables; never the pool (its config holds the password) or the T-SQL.
impl std::fmt::Debug for SqlServerLeaseStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlServerLeaseStore")
            .field("backend", &"SQL Server")
            .field("table", &self.table)
            .field("member_table", &self.member_table)
            .field("rate_limit_table", &self.rate_table)
            .finish_non_exhaustive()
    }
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
            .map_err(|source| StoreError::InvalidConnectionString {
                expected: "ADO.NET, e.g. `Server=localhost;Database=app;User Id=sa;Password=...;TrustServerCertificate=True`",
                source: Box::new(source),
            })?;
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
            .map_err(|e| StoreError::Database(exec::driver_error(e)))?;
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
            schema_checked: Arc::default(),
            member_table: Arc::from(DEFAULT_MEMBER_TABLE),
            member_sql: Arc::new(MemberStatements::new(DEFAULT_MEMBER_TABLE)),
            member_schema_checked: Arc::default(),
            candidate_schema_checked: Arc::default(),
            rate_table: Arc::from(DEFAULT_RATE_LIMIT_TABLE),
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
        self.schema_checked = Arc::default();
        Ok(self)
    }

    /// The same store with shard sets' members ([`MembershipStore`](orion_beacon::MembershipStore)) in
    /// another table (validated like [`with_table`](Self::with_table)). Create it with
    /// [`migrate_members`](Self::migrate_members).
    pub fn with_member_table(mut self, table: impl AsRef<str>) -> Result<Self, StoreError> {
        let table = table.as_ref();
        validate_table_name(table)?;
        self.member_table = Arc::from(table);
        self.member_sql = Arc::new(MemberStatements::new(table));
        self.member_schema_checked = Arc::default();
        self.candidate_schema_checked = Arc::default();
        Ok(self)
    }

    /// The same store with rate-limit keys ([`RateLimitStore`](orion_beacon::RateLimitStore)) in
    /// another table (validated like [`with_table`](Self::with_table)). Create it with
    /// [`migrate_rate_limits`](Self::migrate_rate_limits).
    pub fn with_rate_limit_table(mut self, table: impl AsRef<str>) -> Result<Self, StoreError> {
        let table = table.as_ref();
        validate_table_name(table)?;
        self.rate_table = Arc::from(table);
        Ok(self)
    }

    /// The rate-limit table's name (`orionbeacon_rate_limits` unless configured).
    pub fn rate_limit_table(&self) -> &str {
        &self.rate_table
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

    /// The T-SQL of the transactional fence, to run inside your own transaction on the lease
    /// database (`BEGIN TRAN` on your tiberius client) before your writes, with `@P1` the
    /// resource, `@P2` the holder and `@P3` the token (`i64`). It returns one row while the term
    /// is current and then holds a shared lock on the lease row until your transaction ends, so
    /// no rival can take over before your writes commit; no row means fenced: roll back.
    pub fn fence_sql(&self) -> String {
        fence_sql(&self.table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tsql::quoted;

    pub(super) const SEED: &str =
        "Server=localhost;Database=app;User Id=sa;Password=secret;TrustServerCertificate=True";

    #[test]
    fn custom_tables_are_validated_and_bracket_quoted() {
        let store = SqlServerLeaseStore::new(SEED)
            .unwrap()
            .with_table("shard_leases")
            .unwrap();
        assert_eq!(store.table(), "shard_leases");
        for sql in [
            &store.sql.upsert,
            &store.sql.release,
            &store.sql.current,
            &store.sql.renew_all,
            &store.sql.payload_probe,
        ] {
            assert!(sql.contains("[shard_leases]"), "{sql}");
            assert!(!sql.contains("orionbeacon_leases"), "{sql}");
        }
        assert!(store
            .sql
            .upsert
            .contains("MERGE [shard_leases] WITH (HOLDLOCK) AS t "));
        assert!(store.sql.current.contains(" FROM [shard_leases] WHERE "));
        assert!(store
            .payload_migration_sql()
            .contains("ALTER TABLE [shard_leases] ADD payload"));
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
    fn member_tables_are_validated_and_bracket_quoted() {
        let store = SqlServerLeaseStore::new(SEED).unwrap();
        assert_eq!(store.member_table(), DEFAULT_MEMBER_TABLE);
        assert_eq!(store.member_migration_sql(), MEMBER_MIGRATION_SQL);
        assert_eq!(store.rank_migration_sql(), RANK_MIGRATION_SQL);
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
        for sql in [
            &sql.heartbeat,
            &sql.members,
            &sql.leave,
            &sql.candidate_heartbeat,
            &sql.candidates,
            &sql.rank_probe,
        ] {
            assert!(sql.contains("[shard_members]"), "{sql}");
            assert!(!sql.contains("_leases"), "{sql}");
        }
        assert!(sql
            .heartbeat
            .starts_with("DECLARE @now datetime2(7) = SYSUTCDATETIME(); MERGE [shard_members] WITH (HOLDLOCK) AS t "));
        assert!(store
            .rank_migration_sql()
            .contains("ALTER TABLE [shard_members] ADD candidate_rank bigint NULL;"));
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
}

// The README's code compiles as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
