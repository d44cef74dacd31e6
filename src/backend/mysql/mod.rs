//! MySQL and MariaDB: `UTC_TIMESTAMP(6)` is the clock, `DATETIME(6)` the column type.
//!
//! `NOW()` and `TIMESTAMP` follow the session time zone, so lease times are `DATETIME(6)` filled
//! from `UTC_TIMESTAMP(6)`. A granted lease runs from the moment its row is written (`SYSDATE(6)`,
//! converted to UTC), so an acquire that waited for a row lock (behind a fenced transaction, say)
//! still gets its full lease. Names use the `utf8mb4_bin` collation: the default collation is
//! case-insensitive, and `Node-A` must not renew `node-a`'s lease.
//!
//! # Acquire-or-renew
//!
//! sea-query's MySQL builder silently drops `ON CONFLICT ... WHERE` and `RETURNING`: a
//! PostgreSQL-shaped upsert run here would overwrite a live lease (lease stealing). So this backend
//! builds its own `INSERT ... ON DUPLICATE KEY UPDATE`, where every assignment is a `CASE` on the
//! old row.
//!
//! The assignments give the same row under any `sql_mode`. By default MySQL and MariaDB run them
//! left to right, each seeing the columns already updated; with MariaDB's `SIMULTANEOUS_ASSIGNMENT`
//! `sql_mode` flag (part of `sql_mode=ORACLE`) every one reads the old row. So `renewed_at`,
//! `acquired_at`, `fencing_token` and `holder` come first and read only columns assigned after them
//! (old values either way), and `expires_at` comes last with a condition (`holder = me OR
//! expires_at <= now`) that is true for a new term or a renew whether `holder` is already the new
//! one (the candidate exactly when granted) or still the old one (then the old row's "held by the
//! candidate, or expired" decides).
//!
//! Affected-row counts are never used to tell outcomes apart (sqlx sets `CLIENT_FOUND_ROWS`).
//!
//! Two ways to read the result, chosen per server with `SELECT VERSION()`, asked once per store
//! ([`SeaOrmLeaseStore::with_mysql_upsert`](crate::SeaOrmLeaseStore::with_mysql_upsert) overrides it, for proxies that
//! hide the version):
//!
//! - MariaDB 10.5+ ([`MySqlUpsert::Returning`]): the statement ends in `RETURNING`, which gives the
//!   final row in every case (granted, renewed, or the unchanged row of the holder that denied us),
//!   so even a denial is one round trip and names the holder exactly. The `RETURNING` list ends in
//!   `@@in_transaction`, the check that the grant committed on its own (see the `backend` module).
//! - MySQL 8.0+ ([`MySqlUpsert::Transaction`], no `RETURNING`): one transaction, the upsert then a
//!   read of the row it locked, then an explicit commit (so no autocommit check is needed).
//!
//! # Fenced writes
//!
//! The fence takes an InnoDB exclusive lock on the lease row (`SELECT ... FOR UPDATE`, see
//! [`fence`](super::fence)): a rival's upsert waits for your commit, as on PostgreSQL, until the
//! term lapses; then the rival ends your session (`INNODB_LOCK_WAITS`, `KILL CONNECTION`: the
//! `PROCESS` privilege). Exclusive, because a read-only transaction has no id the server shows.
//! The statement-level fence keeps a shared lock: the statement it guards writes, so its
//! transaction has an id.
//!
//! # Galera
//!
//! On a Galera cluster node (`@@wsrep_on`, detected once per store) the fence writes the lease row
//! instead of locking it, and each node judges leases by its own clock: see [`fence`](super::fence)
//! and `docs/topologies.md` for what that means and what to configure.
//!
//! # Wake-ups
//!
//! MySQL and MariaDB have no notification channel, so a holder signals with a named lock: while a
//! store holds a lease it keeps `GET_LOCK('orionbeacon/<sha1 of database, table, resource>')` on
//! one connection of its own, and lets go of it once the lease's release has committed. A denied
//! elector or lock waiter in another process waits on that name (`GET_LOCK` with a timeout, on a
//! small pool of the store's own, at most 8 waits per store) and tries the store the moment it is
//! free: a graceful handover takes milliseconds instead of a poll. It is only a wake-up: the lease
//! row decides every grant, and a lost wake-up costs one poll. The store checks once that a name
//! taken on one of its connections is seen from another; on Galera (where named locks stay on
//! their node) and behind proxies that spread a client's sessions it is off and waiters poll.
//! [`SeaOrmLeaseStore::with_release_notifications`](crate::SeaOrmLeaseStore::with_release_notifications)
//! turns it off.
//!
//! The batch renew ([`LeaseStore::renew_all`](crate::LeaseStore::renew_all)) joins the batch's
//! rows from one JSON document with `JSON_TABLE` (MariaDB 10.6+, MySQL 8.0), then reads what it
//! renewed in the same transaction, and reports it after the commit.

// Without the cargo feature the statements are still built (and tested), never sent.
#![cfg_attr(not(feature = "mysql"), allow(dead_code))]

use sea_orm::sea_query::Expr;
use sea_orm::Value;

use super::dialect::Dialect;

#[cfg(feature = "mysql")]
pub(crate) mod backend;
#[cfg(feature = "mysql")]
mod checked;
#[cfg(feature = "mysql")]
pub(crate) mod errors;
pub(crate) mod statements;
pub(crate) mod takeover;
#[cfg(feature = "mysql")]
pub(crate) mod wakeups;

pub(crate) struct MySql;

impl Dialect for MySql {
    fn now_micros(&self) -> Expr {
        Expr::cust("TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))")
    }

    fn now(&self) -> Expr {
        // Evaluated once per statement; UTC regardless of the session time zone.
        Expr::cust("UTC_TIMESTAMP(6)")
    }

    // `SYSDATE(6)` is read when the row is written, after any row-lock wait, but in the
    // session's time zone; the statement's constant UTC offset turns it into UTC.
    fn lease_end(&self, millis: i64) -> Expr {
        Expr::cust_with_values(
            "SYSDATE(6) + INTERVAL TIMESTAMPDIFF(MICROSECOND, NOW(6), UTC_TIMESTAMP(6)) MICROSECOND + INTERVAL ? MICROSECOND",
            [self.lease_value(millis)],
        )
    }

    // In microseconds.
    fn lease_value(&self, millis: i64) -> Value {
        Value::from(millis.saturating_mul(1000))
    }

    fn one_tick_after(&self, ts: Expr) -> Expr {
        Expr::cust_with_exprs("? + INTERVAL 1 MICROSECOND", [ts])
    }

    // `DATETIME(6)` holds UTC without a zone: compare with the naive UTC value.
    fn stored_time(&self, t: chrono::DateTime<chrono::Utc>) -> Expr {
        Expr::val(t.naive_utc())
    }

    fn remaining_millis(&self, expires: Expr) -> Expr {
        Expr::cust_with_exprs(
            "TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), ?) DIV 1000",
            [expires],
        )
    }
}

/// How the result of the MySQL upsert is read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MySqlUpsert {
    /// `INSERT ... ON DUPLICATE KEY UPDATE ... RETURNING` (MariaDB 10.5 and later).
    Returning,
    /// A transaction: the upsert, then a read of the row before commit (MySQL).
    Transaction,
}

impl MySqlUpsert {
    /// The form a server supports, from its `SELECT VERSION()` answer.
    pub fn for_version(version: &str) -> Self {
        let Some(idx) = version.find("MariaDB") else {
            return MySqlUpsert::Transaction;
        };
        // "10.11.6-MariaDB-0+deb12u1", or "5.5.5-10.11.6-MariaDB" through some proxies.
        let numbers = version[..idx].trim_start_matches("5.5.5-");
        let mut parts = numbers
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|p| p.parse::<u32>().ok());
        match (parts.next(), parts.next()) {
            (Some(major), Some(minor)) if (major, minor) >= (10, 5) => MySqlUpsert::Returning,
            _ => MySqlUpsert::Transaction,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_detection() {
        assert_eq!(
            MySqlUpsert::for_version("10.11.19-MariaDB-0+deb12u1"),
            MySqlUpsert::Returning
        );
        assert_eq!(
            MySqlUpsert::for_version("10.5.0-MariaDB"),
            MySqlUpsert::Returning
        );
        assert_eq!(
            MySqlUpsert::for_version("5.5.5-10.6.12-MariaDB-log"),
            MySqlUpsert::Returning
        );
        assert_eq!(
            MySqlUpsert::for_version("10.4.32-MariaDB"),
            MySqlUpsert::Transaction
        );
        assert_eq!(MySqlUpsert::for_version("8.0.36"), MySqlUpsert::Transaction);
        assert_eq!(
            MySqlUpsert::for_version("8.4.0-commercial"),
            MySqlUpsert::Transaction
        );
        assert_eq!(MySqlUpsert::for_version(""), MySqlUpsert::Transaction);
    }
}
