//! SQLite: times are millisecond text written by `strftime` only.
//!
//! Text written from Rust (RFC 3339, `T` separator, offsets) and text written by SQL sort
//! differently, so every lease time is produced by `strftime('%Y-%m-%d %H:%M:%f', ...)` and
//! compared as text in that one format. `'now'` is fixed for the whole statement.

use sea_orm::sea_query::Expr;

use super::Dialect;

pub(crate) struct Sqlite;

/// The one timestamp format (UTC, milliseconds).
const NOW: &str = "strftime('%Y-%m-%d %H:%M:%f', 'now')";

impl Dialect for Sqlite {
    fn now(&self) -> Expr {
        Expr::cust(NOW)
    }

    // SQLite takes its lock before the statement reads the clock: no wait to account for.
    fn lease_end(&self, millis: i64) -> Expr {
        // An exact "+S.mmm seconds" modifier: no floating point on the way.
        let modifier = super::prepared::sqlite_modifier(millis);
        Expr::cust_with_values("strftime('%Y-%m-%d %H:%M:%f', 'now', ?)", [modifier])
    }

    fn one_tick_after(&self, ts: Expr) -> Expr {
        Expr::cust_with_exprs("strftime('%Y-%m-%d %H:%M:%f', ?, '+0.001 seconds')", [ts])
    }

    // The text `strftime('%Y-%m-%d %H:%M:%f')` wrote.
    fn stored_time(&self, t: chrono::DateTime<chrono::Utc>) -> Expr {
        Expr::val(t.format("%Y-%m-%d %H:%M:%S%.3f").to_string())
    }

    fn remaining_millis(&self, expires: Expr) -> Expr {
        Expr::cust_with_exprs(
            "CAST(ROUND((julianday(?) - julianday('now')) * 86400000.0) AS INTEGER)",
            [expires],
        )
    }
}

/// Connection options for a SQLite file shared by several processes: WAL journal (readers do
/// not block the writer), a 5 s busy timeout (a writer waits for the lock instead of failing),
/// and the file created if missing.
///
/// ```no_run
/// # async fn f() -> Result<(), sea_orm::DbErr> {
/// let db = sea_orm::Database::connect(orion_beacon::backend::sqlite::connect_options(
///     "sqlite:///var/lib/app/leases.db",
/// ))
/// .await?;
/// # Ok(()) }
/// ```
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub fn connect_options(url: impl Into<String>) -> sea_orm::ConnectOptions {
    use sea_orm::sqlx::sqlite::SqliteJournalMode;
    let mut options = sea_orm::ConnectOptions::new(url);
    options.map_sqlx_sqlite_opts(|o| {
        o.journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(std::time::Duration::from_secs(5))
            .create_if_missing(true)
    });
    options
}
