//! PostgreSQL: `statement_timestamp()` is the clock.
//!
//! `now()` is the start of the *transaction*; `statement_timestamp()` is the start of the
//! statement, so a lease statement run inside a caller's long transaction still judges
//! liveness at the moment it runs, and every use within one statement agrees.

use sea_orm::sea_query::Expr;

use super::Dialect;

#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) struct Postgres;

impl Dialect for Postgres {
    fn now(&self) -> Expr {
        Expr::cust("statement_timestamp()")
    }

    // `clock_timestamp()` is read when the row is written, after any row-lock wait.
    fn lease_end(&self, millis: i64) -> Expr {
        Expr::cust_with_values(
            "clock_timestamp() + $1 * INTERVAL '1 millisecond'",
            [millis],
        )
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
