//! Shared test support: database connections, isolation, the conformance suite.
#![allow(dead_code)]

pub mod conformance;
pub mod election;
pub mod sql;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

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

/// Small deterministic PRNG (xorshift64*), so randomized tests can print and replay a seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }
    pub fn seed_from_time() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(42)
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Which server backend a test wants, with its URL variable and default.
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
    fn default_url(self) -> &'static str {
        match self {
            Server::Postgres => "postgres://postgres@127.0.0.1:5432/test",
            Server::MySql => "mysql://root@127.0.0.1:3306/test",
        }
    }
    fn name(self) -> &'static str {
        match self {
            Server::Postgres => "postgres",
            Server::MySql => "mysql",
        }
    }

    pub fn url(self) -> String {
        std::env::var(self.url_var()).unwrap_or_else(|_| self.default_url().to_owned())
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

    /// Connects, or fails the test with a message naming the variable to set.
    pub async fn connect(self, max_connections: u32) -> sea_orm::DatabaseConnection {
        let url = self.url();
        let mut options = sea_orm::ConnectOptions::new(url.clone());
        options
            .max_connections(max_connections)
            .min_connections(0)
            .acquire_timeout(std::time::Duration::from_secs(10))
            .sqlx_logging(false);
        match sea_orm::Database::connect(options).await {
            Ok(db) => db,
            Err(e) => panic!(
                "cannot reach the {} test database at {url}: {e}\n\
                 start it, point {} at one, or opt out with ORION_BEACON_SKIP={}",
                self.name(),
                self.url_var(),
                self.name()
            ),
        }
    }
}

/// Runs the lease-table migration (the real one) for `table` on `db`.
pub async fn migrate(db: &sea_orm::DatabaseConnection, table: &str) {
    use orion_beacon_migration::{CreateLeaseTable, MigrationTrait, SchemaManager};
    let migration = CreateLeaseTable::with_table(table).expect("valid table name");
    migration
        .up(&SchemaManager::new(db))
        .await
        .expect("migration up");
}

/// Drops `table` with the migration's `down`.
pub async fn drop_table(db: &sea_orm::DatabaseConnection, table: &str) {
    use orion_beacon_migration::{CreateLeaseTable, MigrationTrait, SchemaManager};
    let migration = CreateLeaseTable::with_table(table).expect("valid table name");
    migration
        .down(&SchemaManager::new(db))
        .await
        .expect("migration down");
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
