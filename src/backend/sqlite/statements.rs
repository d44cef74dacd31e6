//! SQLite's own statement: the no-op write that takes the database's write lock, where other
//! backends lock a row (SQLite has no row locks, and `FOR SHARE`/`FOR UPDATE` do not exist).

use orion_beacon_entity::lease::Column;
use sea_orm::sea_query::{Alias, Expr, Query, UpdateStatement};

/// A no-op write of the lease rows `condition` picks: SQLite's write lock is held from here to
/// the end of the transaction, so every other writer (a rival's acquire included) waits. It
/// affects (and counts) the rows `condition` picks, changing nothing in them.
pub(crate) fn write_lock(table: &Alias, condition: Expr) -> UpdateStatement {
    Query::update()
        .table(table.clone())
        .value(Column::FencingToken, Expr::col(Column::FencingToken))
        .and_where(condition)
        .to_owned()
}
