//! Operator tools on the lease table: list every lease, and revoke one whatever its holder.
//!
//! Both use the per-backend [`Dialect`] (the database clock, remaining time) and decode rows
//! exactly like [`SeaOrmLeaseStore::current`](crate::LeaseStore::current), so `live` and
//! `remaining` are judged by the database clock.

use orion_beacon_entity::lease::Column;
use sea_orm::sea_query::{
    Alias, Expr, ExprTrait, LockType, Order, Query, SelectStatement, UpdateStatement,
};

use super::dialect::Dialect;
use super::row::{Decode as _, Row};
use super::statements::{self, returned_row, with_payload};
use super::store::SeaOrmLeaseStore;
use crate::store::validate_resource;
use crate::{error::StoreError, lease::LeaseRecord};

/// Every lease row with its remaining time, ordered by resource. The resource comes last so the
/// first six columns decode as a [`Row`].
pub(crate) fn list(d: &dyn Dialect, table: &Alias) -> SelectStatement {
    let mut exprs = returned_row(d);
    exprs.push(Expr::col(Column::Resource));
    Query::select()
        .exprs(with_payload(exprs))
        .from(table.clone())
        .order_by(Column::Resource, Order::Asc)
        .to_owned()
}

/// The row of `resource`, locked for the revoke that follows (`FOR UPDATE`; SQLite has no row
/// locks and takes its write lock first, see `revoke`).
pub(crate) fn revoke_read(d: &dyn Dialect, table: &Alias, resource: &str) -> SelectStatement {
    statements::current(d, table, resource)
        .lock(LockType::Update)
        .to_owned()
}

/// The operator's tombstone for a live lease, whoever holds it (see
/// [`statements::tombstone`]). The holder, the token and the other times stay, so the next
/// term's token is one higher.
pub(crate) fn revoke(d: &dyn Dialect, table: &Alias, resource: &str) -> UpdateStatement {
    Query::update()
        .table(table.clone())
        .value(Column::ExpiresAt, statements::tombstone(d))
        .and_where(Expr::col(Column::Resource).eq(resource))
        .and_where(Expr::col(Column::ExpiresAt).gt(d.now()))
        .to_owned()
}

impl SeaOrmLeaseStore {
    /// Every lease in the table, live or not, ordered by resource, with `live` and `remaining`
    /// judged by the database clock (as in [`current`](crate::LeaseStore::current)).
    pub async fn list(&self) -> Result<Vec<LeaseRecord>, StoreError> {
        let engine = self.engine()?;
        let cx = &engine.cx;
        let stmt = cx.build(&list(cx.dialect, &cx.table_iden()));
        let rows = engine.lease_rows(stmt).await?;
        rows.iter()
            .map(|r| {
                let row = Row::decode(r)?;
                let resource: String = r.try_get_by_index(6)?;
                Ok(row.record(&resource))
            })
            .collect::<Result<Vec<_>, sea_orm::DbErr>>()
            .map_err(|source| cx.decode_error(source))
    }

    /// An operator's revoke: ends the live lease of `resource` whoever holds it, by moving its
    /// expiry back to the database's time of the term's last renew (`renewed_at`, never later
    /// than the database's now): a tombstone, like a release. The holder, the token and the
    /// other times are kept, so whichever candidate asks next (a follower, or the old holder at
    /// its next renew) starts a new term with a token one higher; the old holder's next renew is
    /// not a renew, even one it sent before the revoke that waited for the row lock. Fenced
    /// writes of the old term are refused from then on.
    ///
    /// Returns the row as it was before the revoke (`live == false` means it had already
    /// expired and nothing changed), or `None` if the resource has no lease row.
    pub async fn revoke(&self, resource: &str) -> Result<Option<LeaseRecord>, StoreError> {
        validate_resource(resource)?;
        let engine = self.engine()?;
        engine.ready().await?;
        let cx = &engine.cx;
        let table = cx.table_iden();
        let read = cx.build(&revoke_read(cx.dialect, &table, resource));
        let update = cx.build(&revoke(cx.dialect, &table, resource));
        let row = engine.backend.revoke(cx, resource, read, update).await;
        let row = engine.lease_table(row)?;
        let Some(row) = row else {
            tracing::info!(resource, table = %self.table(), "revoke: no lease row; nothing changed");
            return Ok(None);
        };
        let record = Row::decode(&row)
            .map_err(|source| cx.decode_error(source))?
            .record(resource);
        if record.live {
            tracing::warn!(
                resource,
                table = %self.table(),
                holder = %record.holder,
                token = %record.token,
                remaining = ?record.remaining,
                "lease revoked by an operator: it has ended; the next term gets token {}",
                record.token.get().saturating_add(1)
            );
        } else {
            tracing::info!(
                resource,
                table = %self.table(),
                holder = %record.holder,
                token = %record.token,
                "revoke: the lease had already expired; nothing changed"
            );
        }
        Ok(Some(record))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{mysql::MySql, postgres::Postgres, sqlite::Sqlite};
    use sea_orm::sea_query::{MysqlQueryBuilder, PostgresQueryBuilder, SqliteQueryBuilder};

    fn table() -> Alias {
        Alias::new("orionbeacon_leases")
    }

    // sea-query drops clauses a backend lacks without a word: pin the exact SQL.
    #[test]
    fn list_sql_per_backend() {
        let (sql, values) = list(&Postgres, &table()).build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            r#"SELECT "holder", "fencing_token", "expires_at", "acquired_at", "renewed_at", CAST(FLOOR(EXTRACT(EPOCH FROM ("expires_at" - statement_timestamp())) * 1000) AS BIGINT), "resource", CASE WHEN payload_token = fencing_token THEN payload END AS current_payload FROM "orionbeacon_leases" ORDER BY "resource" ASC"#
        );
        assert!(values.0.is_empty());
        let (sql, _) = list(&Sqlite, &table()).build(SqliteQueryBuilder);
        assert_eq!(
            sql,
            r#"SELECT "holder", "fencing_token", "expires_at", "acquired_at", "renewed_at", CAST(ROUND((julianday("expires_at") - julianday('now')) * 86400000.0) AS INTEGER), "resource", CASE WHEN payload_token = fencing_token THEN payload END AS current_payload FROM "orionbeacon_leases" ORDER BY "resource" ASC"#
        );
        let (sql, _) = list(&MySql, &table()).build(MysqlQueryBuilder);
        assert_eq!(
            sql,
            r#"SELECT `holder`, `fencing_token`, `expires_at`, `acquired_at`, `renewed_at`, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), `expires_at`) DIV 1000, `resource`, CASE WHEN payload_token = fencing_token THEN payload END AS current_payload FROM `orionbeacon_leases` ORDER BY `resource` ASC"#
        );
    }

    #[test]
    fn revoke_sql_per_backend() {
        // PostgreSQL: read the row under FOR UPDATE, then tombstone it if live.
        let (sql, values) = revoke_read(&Postgres, &table(), "r").build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            r#"SELECT "holder", "fencing_token", "expires_at", "acquired_at", "renewed_at", CAST(FLOOR(EXTRACT(EPOCH FROM ("expires_at" - statement_timestamp())) * 1000) AS BIGINT), CASE WHEN payload_token = fencing_token THEN payload END AS current_payload FROM "orionbeacon_leases" WHERE "resource" = $1 FOR UPDATE"#
        );
        assert_eq!(values.0.len(), 1);
        let (sql, values) = revoke(&Postgres, &table(), "r").build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            r#"UPDATE "orionbeacon_leases" SET "expires_at" = (CASE WHEN ("renewed_at" < (statement_timestamp())) THEN "renewed_at" ELSE statement_timestamp() END) WHERE "resource" = $1 AND "expires_at" > (statement_timestamp())"#
        );
        assert_eq!(values.0.len(), 1, "no holder guard: {values:?}");

        // MySQL/MariaDB: the same, in UTC_TIMESTAMP(6).
        let (sql, _) = revoke_read(&MySql, &table(), "r").build(MysqlQueryBuilder);
        assert_eq!(
            sql,
            r#"SELECT `holder`, `fencing_token`, `expires_at`, `acquired_at`, `renewed_at`, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), `expires_at`) DIV 1000, CASE WHEN payload_token = fencing_token THEN payload END AS current_payload FROM `orionbeacon_leases` WHERE `resource` = ? FOR UPDATE"#
        );
        let (sql, _) = revoke(&MySql, &table(), "r").build(MysqlQueryBuilder);
        assert_eq!(
            sql,
            "UPDATE `orionbeacon_leases` SET `expires_at` = (CASE WHEN (`renewed_at` < (UTC_TIMESTAMP(6))) THEN `renewed_at` ELSE UTC_TIMESTAMP(6) END) WHERE `resource` = ? AND `expires_at` > (UTC_TIMESTAMP(6))"
        );

        // SQLite: no row locks (the builder drops FOR UPDATE); a no-op write takes the
        // database's write lock first.
        let (sql, _) = crate::backend::sqlite::statements::write_lock(
            &table(),
            Expr::col(Column::Resource).eq("r"),
        )
        .build(SqliteQueryBuilder);
        assert_eq!(
            sql,
            r#"UPDATE "orionbeacon_leases" SET "fencing_token" = "fencing_token" WHERE "resource" = ?"#
        );
        let (sql, _) = revoke_read(&Sqlite, &table(), "r").build(SqliteQueryBuilder);
        assert_eq!(
            sql,
            // (the trailing space is where the dropped lock clause would be)
            r#"SELECT "holder", "fencing_token", "expires_at", "acquired_at", "renewed_at", CAST(ROUND((julianday("expires_at") - julianday('now')) * 86400000.0) AS INTEGER), CASE WHEN payload_token = fencing_token THEN payload END AS current_payload FROM "orionbeacon_leases" WHERE "resource" = ? "#
        );
        let (sql, _) = revoke(&Sqlite, &table(), "r").build(SqliteQueryBuilder);
        assert_eq!(
            sql,
            r#"UPDATE "orionbeacon_leases" SET "expires_at" = (CASE WHEN ("renewed_at" < (strftime('%Y-%m-%d %H:%M:%f', 'now'))) THEN "renewed_at" ELSE strftime('%Y-%m-%d %H:%M:%f', 'now') END) WHERE "resource" = ? AND "expires_at" > (strftime('%Y-%m-%d %H:%M:%f', 'now'))"#
        );
    }
}
