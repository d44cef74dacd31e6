//! SQLite: times are millisecond text written by `strftime` only.
//!
//! Text written from Rust (RFC 3339, `T` separator, offsets) and text written by SQL sort
//! differently, so every lease time is produced by `strftime('%Y-%m-%d %H:%M:%f', ...)` and
//! compared as text in that one format. `'now'` is fixed for the whole statement.
//!
//! # Acquire-or-renew
//!
//! The same one-statement upsert as PostgreSQL (`INSERT ... ON CONFLICT (resource) DO UPDATE SET
//! ... WHERE holder = $me OR expires_at <= now RETURNING ...`, see [`postgres`](super::postgres)).
//! When it grants nothing, the store reads the row once (in-process) to report the holder: a hint
//! only, which during a race may be stale or missing. SQLite sends the `RETURNING` rows before it
//! commits, and a commit that cannot get its lock rolls the statement back, so the statement is
//! read to its end before its row counts (see the `backend` module). A busy file (`BUSY`) means the
//! statement had no effect and is retried.
//!
//! # Several processes on one file
//!
//! Open the file with [`connect_options`] (WAL journal, 5 s busy timeout, file created if missing)
//! when several processes share it. In SQLite's default rollback-journal mode a commit needs every
//! reader gone: a lease statement that cannot commit within the busy timeout is rolled back and
//! reported as a retryable [`StoreError::Conflict`](crate::StoreError::Conflict). The store warns
//! once when the file is not in WAL mode.
//!
//! # Wake-ups
//!
//! A release (or revoke) in any process on the same file wakes this process's waiting electors
//! and locks at once: the store watches the file's directory and, after each burst of writes,
//! reads which leases stopped being live (see the `wakeups` module in the source for the
//! cost). Like PostgreSQL's notifications it is only a wake-up, and it is off with
//! [`with_release_notifications(false)`](crate::SeaOrmLeaseStore::with_release_notifications).
//! An in-memory database has none.
//!
//! # Fenced writes
//!
//! SQLite has no row locks, so the fence is a no-op `UPDATE` of the lease row, which takes the
//! database's write lock: every other writer, the rival's acquire included, waits for your commit.
//! Call `fence` first in the transaction.
//!
//! # The clock
//!
//! SQLite's clock is the host's wall clock, read inside each process, so processes on one host
//! cannot disagree about it. The flip side is a known limit: a *step* of the host's wall clock (a
//! manual change, an NTP jump) moves every SQLite lease at once; fenced writes stay safe (the fence
//! uses the same clock and the higher token), but believed leadership can overlap for up to one
//! lease. Use a server database where that matters.

use sea_orm::sea_query::Expr;
use sea_orm::Value;

use super::dialect::Dialect;

pub(crate) mod backend;
pub(crate) mod errors;
pub(crate) mod statements;
#[cfg(feature = "sqlite")]
pub(crate) mod wakeups;

pub(crate) struct Sqlite;

/// The one timestamp format (UTC, milliseconds).
const NOW: &str = "strftime('%Y-%m-%d %H:%M:%f', 'now')";

impl Dialect for Sqlite {
    // SQLite's clock has whole milliseconds; `now` is one value within a statement.
    fn now_micros(&self) -> Expr {
        Expr::cust("CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER) * 1000")
    }

    fn now(&self) -> Expr {
        Expr::cust(NOW)
    }

    // SQLite takes its lock before the statement reads the clock: no wait to account for.
    fn lease_end(&self, millis: i64) -> Expr {
        Expr::cust_with_values(
            "strftime('%Y-%m-%d %H:%M:%f', 'now', ?)",
            [self.lease_value(millis)],
        )
    }

    // An exact "+S.mmm seconds" modifier: no floating point on the way.
    fn lease_value(&self, millis: i64) -> Value {
        Value::from(format!("+{}.{:03} seconds", millis / 1000, millis % 1000))
    }

    fn locks_rows(&self) -> bool {
        false
    }

    fn one_tick_after(&self, ts: Expr) -> Expr {
        Expr::cust_with_exprs("strftime('%Y-%m-%d %H:%M:%f', ?, '+0.001 seconds')", [ts])
    }

    // The text `strftime('%Y-%m-%d %H:%M:%f')` wrote.
    fn stored_time(&self, t: chrono::DateTime<chrono::Utc>) -> Expr {
        Expr::val(stored_text(t))
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

/// `t` as `strftime('%Y-%m-%d %H:%M:%f')` writes it (what chrono's `%Y-%m-%d %H:%M:%S%.3f`
/// gives for the years SQLite's date functions know, 0000-9999), written out by hand: chrono's
/// formatter adds some 15 kB to every build, SQLite's used or not.
fn stored_text(t: chrono::DateTime<chrono::Utc>) -> String {
    use chrono::{Datelike, Timelike};
    // A leap second (chrono's nanoseconds past 999,999,999) is second 60, as chrono writes it;
    // SQLite never writes one, so none is read back.
    let leap = u32::from(t.nanosecond() >= 1_000_000_000);
    let millis = t.nanosecond() % 1_000_000_000 / 1_000_000;
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{millis:03}",
        t.year(),
        t.month(),
        t.day(),
        t.hour(),
        t.minute(),
        t.second() + leap
    )
}

#[cfg(test)]
mod stored_text_tests {
    use chrono::{NaiveDate, TimeZone, Utc};

    #[test]
    fn the_text_is_what_chrono_writes_for_sqlite_s_format() {
        let days = [(2026, 12, 6), (1, 1, 1), (9999, 12, 31), (2024, 2, 29)];
        let times = [(0, 0, 0), (17, 3, 9), (23, 59, 59)];
        // The last is a leap second's (chrono only allows it at :59).
        let nanos = [
            0,
            1,
            999_999,
            1_000_000,
            123_456_789,
            999_999_999,
            1_500_000_000,
        ];
        let mut seen = 0;
        for (y, mo, d) in days {
            for (h, mi, sec) in times {
                for n in nanos {
                    let Some(t) = NaiveDate::from_ymd_opt(y, mo, d)
                        .and_then(|day| day.and_hms_nano_opt(h, mi, sec, n))
                    else {
                        continue;
                    };
                    let t = Utc.from_utc_datetime(&t);
                    assert_eq!(
                        super::stored_text(t),
                        t.format("%Y-%m-%d %H:%M:%S%.3f").to_string()
                    );
                    seen += 1;
                }
            }
        }
        assert!(seen >= 4 * 3 * 6 + 4, "{seen} times compared");
    }
}
