//! SQLite's own statements: the batch renew's rows from JSON, and the no-op write that takes the database's write lock, where other
//! backends lock a row (SQLite has no row locks, and `FOR SHARE`/`FOR UPDATE` do not exist).

use orion_beacon_entity::lease::Column;
use sea_orm::sea_query::{Alias, Expr, Query, UpdateStatement};

use crate::backend::dialect::Dialect;
use crate::backend::statements::{renew_held, renewed_row, with_payload};

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

/// The rows of a batch renew, from its JSON document (see `held_json`).
pub(crate) fn held(json: String) -> Expr {
    Expr::cust_with_values(
        r#"SELECT json_extract("value", '$.r'), json_extract("value", '$.h'), json_extract("value", '$.t') FROM json_each(?)"#,
        [json],
    )
}

/// The batch renew, returning each renewed row (see `renewed_row`).
pub(crate) fn renew_all(
    d: &dyn Dialect,
    table: &Alias,
    json: String,
    millis: i64,
) -> UpdateStatement {
    renew_held(d, table, held(json), millis)
        .returning(Query::returning().exprs(with_payload(renewed_row(d))))
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sqlite::Sqlite;
    use sea_orm::sea_query::SqliteQueryBuilder;

    // One statement for the whole batch, its leases in one bound JSON document.
    #[test]
    fn batch_renew_is_one_update_from_json() {
        let (sql, values) = renew_all(
            &Sqlite,
            &Alias::new("orionbeacon_leases"),
            "[]".to_owned(),
            1500,
        )
        .build(SqliteQueryBuilder);
        assert_eq!(
            sql,
            r#"UPDATE "orionbeacon_leases" SET "expires_at" = MAX(strftime('%Y-%m-%d %H:%M:%f', 'now', ?), strftime('%Y-%m-%d %H:%M:%f', "expires_at", '+0.001 seconds')), "renewed_at" = MAX(strftime('%Y-%m-%d %H:%M:%f', 'now'), strftime('%Y-%m-%d %H:%M:%f', "acquired_at", '+0.001 seconds')) WHERE ("orionbeacon_leases"."resource", "orionbeacon_leases"."holder", "orionbeacon_leases"."fencing_token") IN (SELECT json_extract("value", '$.r'), json_extract("value", '$.h'), json_extract("value", '$.t') FROM json_each(?)) AND "orionbeacon_leases"."expires_at" > (strftime('%Y-%m-%d %H:%M:%f', 'now')) RETURNING "holder", "fencing_token", "expires_at", "acquired_at", "renewed_at", CAST(ROUND((julianday("expires_at") - julianday('now')) * 86400000.0) AS INTEGER), "resource", CASE WHEN payload_token = fencing_token THEN payload END AS current_payload"#
        );
        assert_eq!(values.0.len(), 2, "{values:?}");
    }
}
