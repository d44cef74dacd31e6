//! PostgreSQL: `statement_timestamp()` is the clock.
//!
//! `now()` is the start of the *transaction*; `statement_timestamp()` is the start of the
//! statement, so a lease statement run inside a caller's long transaction still judges liveness at
//! the moment it runs, and every use within one statement agrees. A granted lease runs from the
//! moment its row is written (`clock_timestamp()`), so an acquire that waited for a row lock (behind
//! a fenced transaction, say) still gets its full lease.
//!
//! # Acquire-or-renew
//!
//! One statement, `INSERT ... ON CONFLICT (resource) DO UPDATE SET ... WHERE holder = $me OR
//! expires_at <= now RETURNING ...` (the shape PostgreSQL shares with SQLite), where `CASE` on the
//! old row gives the token rule. The primary key turns the first-insert race into the conditional
//! update. When the `WHERE` is false nothing is returned, so the statement is wrapped in a CTE
//! whose fallback branch returns the row that denied us: a denial is one round trip too. That
//! report is a hint only: it comes from the statement's snapshot, so during a race it may be stale
//! or missing, and a flag column tells a grant from a report.
//!
//! The statement also returns `transaction_timestamp()`, and a second, one-row statement on the
//! same connection reads it again: a new (autocommit) transaction has a later start, an abandoned
//! transaction the same one. That is the check that the grant committed on its own (see the
//! `backend` module), so an acquire or renew costs two round trips. Serialization failures and
//! deadlocks (`40001`, `40P01`) mean the statement had no effect and are retried (see the `backend`
//! module).
//!
//! # Release notifications
//!
//! A release also sends `pg_notify('orionbeacon_releases', '<table>@<table OID>/<resource>')` in the same
//! statement (delivered on commit), which wakes followers at once instead of at their next poll
//! (a graceful handover in about 10 ms; see `docs/performance.md`). The store `LISTEN`s on one
//! connection of its own, made with the pool's connect options and never taken from the
//! application's pool (a `LISTEN` holds its connection for good, so taking it from the pool would
//! starve a pool of one connection): one extra server connection per store and lease table while any
//! clone of the store lives. If that connection drops, the listener reconnects with back-off;
//! meanwhile followers simply poll, so a lost notification costs one poll interval, never
//! correctness. [`SeaOrmLeaseStore::with_release_notifications`](crate::SeaOrmLeaseStore::with_release_notifications)`(false)` turns it off (followers
//! then notice a release at their next retry).
//!
//! # Behind PgBouncer
//!
//! In transaction pooling, build the store with
//! [`SeaOrmLeaseStore::with_transaction_pooling`](crate::SeaOrmLeaseStore::with_transaction_pooling)`(true)`; what that costs and what PgBouncer needs
//! configured are in `docs/topologies.md`. Session pooling needs nothing.

// Without the cargo feature the statements are still built (and tested), never sent.
#![cfg_attr(not(feature = "postgres"), allow(dead_code))]

use sea_orm::sea_query::Expr;
use sea_orm::Value;

use super::dialect::Dialect;

#[cfg(feature = "postgres")]
pub(crate) mod backend;
#[cfg(feature = "postgres")]
mod checked;
#[cfg(feature = "postgres")]
pub(crate) mod errors;
#[cfg(feature = "postgres")]
pub(crate) mod notify;
pub(crate) mod statements;
pub(crate) mod takeover;

pub(crate) struct Postgres;

impl Dialect for Postgres {
    // `EXTRACT` answers a numeric with the timestamp's 6 decimals: exact.
    fn now_micros(&self) -> Expr {
        Expr::cust("CAST(EXTRACT(EPOCH FROM statement_timestamp()) * 1000000 AS BIGINT)")
    }

    fn now(&self) -> Expr {
        Expr::cust("statement_timestamp()")
    }

    // `clock_timestamp()` is read when the row is written, after any row-lock wait.
    fn lease_end(&self, millis: i64) -> Expr {
        Expr::cust_with_values(
            "clock_timestamp() + $1 * INTERVAL '1 millisecond'",
            [self.lease_value(millis)],
        )
    }

    fn lease_value(&self, millis: i64) -> Value {
        Value::from(millis)
    }

    fn one_tick_after(&self, ts: Expr) -> Expr {
        Expr::cust_with_exprs("$1 + INTERVAL '1 microsecond'", [ts])
    }

    fn stored_time(&self, t: chrono::DateTime<chrono::Utc>) -> Expr {
        Expr::val(t)
    }

    fn remaining_millis(&self, expires: Expr) -> Expr {
        Expr::cust_with_exprs(
            "CAST(FLOOR(EXTRACT(EPOCH FROM ($1 - statement_timestamp())) * 1000) AS BIGINT)",
            [expires],
        )
    }
}
