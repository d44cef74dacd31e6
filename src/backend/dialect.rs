//! The per-backend pieces of the lease statements: every backend's clock and value forms.

use sea_orm::sea_query::{Expr, Func};
use sea_orm::Value;

/// The per-backend pieces of the lease statements. Every time comes from the database clock.
pub(crate) trait Dialect: Sync {
    /// The database's "now", constant within one statement.
    fn now(&self) -> Expr;
    /// The end of a lease of `millis` milliseconds (bound as a parameter) granted when the row
    /// is written. That can be later than [`now`](Self::now) when the statement waited for a
    /// row lock (a fenced transaction holds one): a lease granted after a wait still lasts its
    /// full duration from the grant. Liveness is still judged at [`now`](Self::now), the
    /// statement's start, which only errs towards "still live".
    fn lease_end(&self, millis: i64) -> Expr;
    /// The bound value that carries a lease of `millis` milliseconds in
    /// [`lease_end`](Self::lease_end).
    fn lease_value(&self, millis: i64) -> Value;
    /// The smallest timestamp step after `ts` (1 µs, or 1 ms on SQLite).
    fn one_tick_after(&self, ts: Expr) -> Expr;
    /// Milliseconds from now until `expires` (negative once past), as a 64-bit integer.
    fn remaining_millis(&self, expires: Expr) -> Expr;
    /// A timestamp read from a lease column, as a bound value that compares equal to the
    /// stored one.
    fn stored_time(&self, t: chrono::DateTime<chrono::Utc>) -> Expr;
    /// Whether the backend locks rows (`FOR SHARE`, `FOR UPDATE`); SQLite locks the database
    /// instead.
    fn locks_rows(&self) -> bool {
        true
    }
    /// [`now`](Self::now) as whole microseconds since the Unix epoch, a 64-bit integer (the
    /// rate-limit table's clock columns).
    fn now_micros(&self) -> Expr;
    /// The larger of two timestamps.
    fn greatest(&self, a: Expr, b: Expr) -> Expr {
        Func::greatest([a, b]).into()
    }
}
