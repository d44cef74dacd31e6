//! Connections to the database under test, opened the same way by the candidates and the
//! harness: short timeouts, so a dead server shows as an error instead of a hang.

use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseConnection};

use crate::Error;

/// A pool of at most `max` connections (SQLite with the crate's recommended options).
pub async fn connect(url: &str, max: u32) -> Result<DatabaseConnection, Error> {
    let mut options = if url.starts_with("sqlite:") {
        orion_beacon::backend::sqlite::connect_options(url)
    } else {
        sea_orm::ConnectOptions::new(url)
    };
    options
        .max_connections(max)
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(2))
        .sqlx_logging(false);
    Ok(sea_orm::Database::connect(options).await?)
}

/// SQLite in rollback-journal mode (SQLite's own default) with a short busy timeout.
pub async fn connect_rollback_journal(
    url: &str,
    max: u32,
    busy_timeout: Duration,
) -> Result<DatabaseConnection, Error> {
    use sea_orm::sqlx::sqlite::SqliteJournalMode;
    let mut options = sea_orm::ConnectOptions::new(url);
    options
        .max_connections(max)
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(2))
        .sqlx_logging(false)
        .map_sqlx_sqlite_opts(move |o| {
            o.journal_mode(SqliteJournalMode::Delete)
                .busy_timeout(busy_timeout)
                .create_if_missing(true)
        });
    Ok(sea_orm::Database::connect(options).await?)
}

/// Whether the server at `url` answers a query within a few seconds.
pub async fn db_answers(url: &str) -> bool {
    match tokio::time::timeout(Duration::from_secs(3), connect(url, 1)).await {
        Ok(Ok(db)) => db.execute_unprepared("SELECT 1").await.is_ok(),
        _ => false,
    }
}
