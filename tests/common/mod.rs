//! Shared test support: database connections (private server instances by default, see
//! `Server`), isolation, the conformance suite, the store test double (`double`).
#![allow(dead_code)]

#[macro_use]
pub mod conformance;
pub mod double;
#[macro_use]
pub mod election;
#[cfg(feature = "jobs")]
pub mod job_caps;
#[cfg(feature = "jobs")]
pub mod job_keys;
#[cfg(feature = "jobs")]
pub mod job_spread;
#[cfg(feature = "jobs")]
#[macro_use]
pub mod jobs;
/// Without the `jobs` feature the job suite is nothing.
#[cfg(not(feature = "jobs"))]
#[macro_export]
macro_rules! job_suite {
    ($($t:tt)*) => {};
}
#[macro_use]
pub mod locks;
pub mod partition;
#[macro_use]
pub mod rates;
pub mod ranks;
#[macro_use]
pub mod shards;
#[macro_use]
pub mod sql;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// How much sooner than asked a timed wait may end when measured on tokio's (monotonic) clock:
/// the library judges its deadlines by the monotonic clock plus the time the host spent
/// suspended (`CLOCK_BOOTTIME` over `CLOCK_MONOTONIC`, counted in whole milliseconds), and on a
/// VM that gap can grow by a millisecond or two while a test waits (seen: a 400 ms timeout
/// measured 399.4 ms).
pub const SUSPEND_SLACK: std::time::Duration = std::time::Duration::from_millis(3);

/// A name no other test (or earlier run) uses: tests share databases, so every test works on
/// its own table or resource.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}_{}_{}_{nanos:x}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A seeded generator (`fastrand`'s), so randomized tests can print and replay a seed.
pub struct Rng(fastrand::Rng);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(fastrand::Rng::with_seed(seed))
    }
    pub fn seed_from_time() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(42)
    }
    pub fn next(&mut self) -> u64 {
        self.0.u64(..)
    }
    /// Uniform in `0..n`; `n` must not be 0.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.u64(..n)
    }
}

/// Which server backend a test wants. Without its URL variable, a test binary uses a private
/// instance of its own (`orion-beacon-testkit`: started on first use from the installed server
/// binaries, on a free port, stopped and removed when the binary exits).
#[derive(Debug, Clone, Copy)]
pub enum Server {
    Postgres,
    MySql,
}

impl Server {
    pub fn url_var(self) -> &'static str {
        match self {
            Server::Postgres => "ORION_BEACON_PG_URL",
            Server::MySql => "ORION_BEACON_MYSQL_URL",
        }
    }
    fn name(self) -> &'static str {
        match self {
            Server::Postgres => "postgres",
            Server::MySql => "mysql",
        }
    }

    /// True when the URL variable names an external server.
    pub fn external(self) -> bool {
        std::env::var(self.url_var()).is_ok_and(|u| !u.trim().is_empty())
    }

    /// The server the (non-destructive) tests use: the URL variable's when set, else this test
    /// binary's private instance.
    pub fn url(self) -> String {
        match std::env::var(self.url_var()) {
            Ok(url) if !url.trim().is_empty() => url,
            _ => self.private_url(),
        }
    }

    /// This test binary's private instance, whatever the URL variable says: for tests that
    /// stop, restart or kill the server or change server-wide settings.
    pub fn private_url(self) -> String {
        match self {
            Server::Postgres => orion_beacon_testkit::Postgres::shared().url(),
            Server::MySql => orion_beacon_testkit::MariaDb::shared().url(),
        }
    }

    /// True when the run opted out of this backend with `ORION_BEACON_SKIP=postgres,mysql`.
    /// Such a test prints one line saying it did not run.
    pub fn skipped(self) -> bool {
        let skip = std::env::var("ORION_BEACON_SKIP").unwrap_or_default();
        let skipped = skip
            .split(',')
            .any(|s| s.trim().eq_ignore_ascii_case(self.name()));
        if skipped {
            eprintln!(
                "SKIPPED: {} tests did not run (ORION_BEACON_SKIP={skip})",
                self.name()
            );
        }
        skipped
    }

    /// Connects, or fails the test with a message saying what to check.
    pub async fn connect(self, max_connections: u32) -> sea_orm::DatabaseConnection {
        let url = self.url();
        match try_connect(&url, max_connections).await {
            Ok(db) => db,
            Err(e) if self.external() => panic!(
                "cannot reach the {} test database at {url} ({} is set): {e}\n\
                 start it, unset the variable to use a private instance, or opt out with \
                 ORION_BEACON_SKIP={}",
                self.name(),
                self.url_var(),
                self.name()
            ),
            Err(e) => panic!(
                "cannot reach this test binary's private {} instance at {url}: {e} \
                 (its log is in the instance directory printed by `testkit:` above)",
                self.name()
            ),
        }
    }
}

async fn try_connect(
    url: &str,
    max_connections: u32,
) -> Result<sea_orm::DatabaseConnection, sea_orm::DbErr> {
    let mut options = sea_orm::ConnectOptions::new(url.to_owned());
    options
        .max_connections(max_connections)
        .min_connections(0)
        .acquire_timeout(std::time::Duration::from_secs(10))
        .sqlx_logging(false);
    sea_orm::Database::connect(options).await
}

/// Connects to any server URL (e.g. a private instance with its own settings), or fails the
/// test saying which.
pub async fn connect_url(url: &str, max_connections: u32) -> sea_orm::DatabaseConnection {
    try_connect(url, max_connections)
        .await
        .unwrap_or_else(|e| panic!("cannot reach {url}: {e}"))
}

/// The membership table a test's lease table `table` goes with.
pub fn member_table(table: &str) -> String {
    format!("{table}_m")
}

/// The rate-limit table a test's lease table `table` goes with.
pub fn rate_table(table: &str) -> String {
    format!("{table}_r")
}

/// Runs the migrations (the real ones) for the lease table `table`, its membership table
/// ([`member_table`]) and its rate-limit table ([`rate_table`]) on `db`.
pub async fn migrate(db: &sea_orm::DatabaseConnection, table: &str) {
    use orion_beacon_migration::{
        AddLeasePayload, AddMemberHolding, AddMemberRank, CreateLeaseTable, CreateMemberTable,
        CreateRateLimitTable, MigrationTrait, SchemaManager,
    };
    let migration = CreateLeaseTable::with_table(table).expect("valid table name");
    migration
        .up(&SchemaManager::new(db))
        .await
        .expect("migration up");
    AddLeasePayload::with_table(table)
        .expect("valid table name")
        .up(&SchemaManager::new(db))
        .await
        .expect("payload migration up");
    CreateMemberTable::with_table(member_table(table))
        .expect("valid table name")
        .up(&SchemaManager::new(db))
        .await
        .expect("membership migration up");
    AddMemberHolding::with_table(member_table(table))
        .expect("valid table name")
        .up(&SchemaManager::new(db))
        .await
        .expect("membership counts migration up");
    AddMemberRank::with_table(member_table(table))
        .expect("valid table name")
        .up(&SchemaManager::new(db))
        .await
        .expect("membership rank migration up");
    CreateRateLimitTable::with_table(rate_table(table))
        .expect("valid table name")
        .up(&SchemaManager::new(db))
        .await
        .expect("rate-limit migration up");
}

/// Drops `table` and its membership table with the migrations' `down`, after deleting their
/// rows (`down` refuses a table that holds leases, or a live member). A test's dropped lock
/// guards release in the background: on SQLite in rollback-journal mode such a write can meet
/// the `DROP` (`database is locked`, returned at once when a reader would have to wait for a
/// writer), so each step is tried again for a few seconds.
pub async fn drop_table(db: &sea_orm::DatabaseConnection, table: &str) {
    use orion_beacon_migration::{
        CreateLeaseTable, CreateMemberTable, CreateRateLimitTable, MigrationTrait, SchemaManager,
    };
    use sea_orm::sea_query::{Alias, Query};
    use sea_orm::ConnectionTrait;
    async fn again<F, Fut>(what: &str, mut step: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<(), sea_orm::DbErr>>,
    {
        for attempt in 0.. {
            match step().await {
                Ok(()) => return,
                Err(e) if attempt < 50 && e.to_string().contains("database is locked") => {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(e) => panic!("{what}: {e:?}"),
            }
        }
    }
    let migration = CreateLeaseTable::with_table(table).expect("valid table name");
    let members = member_table(table);
    let schema = SchemaManager::new(db);
    // A statement a test cut off may still commit a grant after the delete (the server ran it
    // on): then `down` refuses the row, and the rows are deleted again.
    for attempt in 0.. {
        again("delete the test's lease rows", || async {
            db.execute(&Query::delete().from_table(Alias::new(table)).to_owned())
                .await
                .map(|_| ())
        })
        .await;
        match migration.down(&schema).await {
            Err(e) if attempt < 50 && e.to_string().contains("lease row(s)") => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(e) if attempt < 50 && e.to_string().contains("database is locked") => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(e) => panic!("migration down: {e:?}"),
            Ok(()) => break,
        }
    }
    // `down` refuses a membership table in which a node is live: the test's members go first.
    again("delete the test's members", || async {
        db.execute(&Query::delete().from_table(Alias::new(&members)).to_owned())
            .await
            .map(|_| ())
    })
    .await;
    let member_migration =
        CreateMemberTable::with_table(members.clone()).expect("valid table name");
    again("membership migration down", || {
        member_migration.down(&schema)
    })
    .await;
    // `down` refuses a rate-limit table whose keys are still limited: the rows go first.
    let rates = rate_table(table);
    again("delete the test's rate-limit keys", || async {
        db.execute(&Query::delete().from_table(Alias::new(&rates)).to_owned())
            .await
            .map(|_| ())
    })
    .await;
    let rate_migration = CreateRateLimitTable::with_table(rates.clone()).expect("valid table name");
    again("rate-limit migration down", || rate_migration.down(&schema)).await;
}

/// Connects to a SQLite file with the options the README recommends.
#[cfg(feature = "sqlite")]
pub async fn connect_sqlite(
    path: &std::path::Path,
    max_connections: u32,
) -> sea_orm::DatabaseConnection {
    let mut options =
        orion_beacon::backend::sqlite::connect_options(format!("sqlite://{}", path.display()));
    options
        .max_connections(max_connections)
        .min_connections(0)
        .sqlx_logging(false);
    sea_orm::Database::connect(options)
        .await
        .expect("open sqlite file")
}
