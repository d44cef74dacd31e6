use orion_beacon_entity::rate_limit::Column;
use orion_beacon_entity::{validate_table_name, TableNameError, DEFAULT_RATE_LIMIT_TABLE};
use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend};

use crate::m20261129_000001_create_leases::{
    applied_through, count_where, name_column, table_exists, take_over_from_own,
};

/// Creates the rate-limit table (`orionbeacon_rate_limits` by default): one row per key of a
/// cluster-wide rate limit (`orion_beacon::rate_limit`), created by the key's first call.
///
/// Columns: `limit_key` (the primary key, up to 255 characters, binary collation on
/// MySQL/MariaDB), `tat_us` (the key's theoretical arrival time), `permits` (granted so far),
/// `granted` (the last decision), `decided_us` (its time), `decision_id` (a random number its
/// caller chose, to know the row it reads back for its own). Times are whole microseconds
/// since the Unix epoch by the database clock, as 64-bit integers, the same on every backend.
///
/// A later migration than the others: `migrate up` adds it to a database that has them, and
/// `down` (one step) removes it again, leaving the rest alone.
#[derive(Debug, Clone)]
pub struct CreateRateLimitTable {
    table: String,
    name: String,
}

impl CreateRateLimitTable {
    /// The migration name for the default table. It never changes.
    pub const NAME: &'static str = "m20261206_000001_create_orionbeacon_rate_limits";

    /// The migration for the default table, `orionbeacon_rate_limits`.
    pub fn new() -> Self {
        Self {
            table: DEFAULT_RATE_LIMIT_TABLE.to_owned(),
            name: Self::NAME.to_owned(),
        }
    }

    /// The migration for a custom table name (validated: ASCII letters, digits and `_`).
    /// Its migration name is `m20261206_000001_create_orionbeacon_rate_limits_<table>`.
    pub fn with_table(table: impl Into<String>) -> Result<Self, TableNameError> {
        let table = table.into();
        validate_table_name(&table)?;
        if table == DEFAULT_RATE_LIMIT_TABLE {
            return Ok(Self::new());
        }
        let name = format!("{}_{table}", Self::NAME);
        Ok(Self { table, name })
    }

    /// The table this migration creates.
    pub fn table(&self) -> &str {
        &self.table
    }

    fn create_statement(&self, backend: DbBackend) -> TableCreateStatement {
        Table::create()
            .table(Alias::new(&self.table))
            .col(name_column(backend, Column::LimitKey))
            .col(ColumnDef::new(Column::TatUs).big_integer().not_null())
            .col(ColumnDef::new(Column::Permits).big_integer().not_null())
            .col(ColumnDef::new(Column::Granted).boolean().not_null())
            .col(ColumnDef::new(Column::DecidedUs).big_integer().not_null())
            .col(ColumnDef::new(Column::DecisionId).big_integer().not_null())
            .primary_key(Index::create().col(Column::LimitKey))
            .to_owned()
    }
}

impl Default for CreateRateLimitTable {
    fn default() -> Self {
        Self::new()
    }
}

impl MigrationName for CreateRateLimitTable {
    fn name(&self) -> &str {
        &self.name
    }
}

#[async_trait::async_trait]
impl MigrationTrait for CreateRateLimitTable {
    /// In a transaction on every backend, as the other tables' migrations.
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    /// Creates the table. One that orion-beacon's own migrator made is taken over, rows kept;
    /// any other that already exists is refused (its shape is unknown).
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if table_exists(manager, &self.table).await? {
            let applied = applied_through(manager, &self.name).await?;
            if take_over_from_own(manager, &applied, &self.name, &self.table).await? {
                return Ok(());
            }
            let how = if applied.is_empty() {
                "no migrator records it (made by hand, or left by an interrupted run): drop it \
                 and run `up` again"
                    .to_owned()
            } else {
                format!("recorded in {}", applied.join(" and "))
            };
            return Err(DbErr::Migration(format!(
                "the rate-limit table {} already exists: {how}. Apply CreateRateLimitTable \
                 through exactly one migrator.",
                self.table
            )));
        }
        let backend = manager.get_database_backend();
        manager.create_table(self.create_statement(backend)).await
    }

    /// Drops the table, but not while a key's limit is still in force (its theoretical arrival
    /// time ahead of the database's now): dropping it would hand those keys a fresh burst.
    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if !table_exists(manager, &self.table).await? {
            return Ok(());
        }
        let limited = limited_keys(manager.get_connection(), &self.table).await?;
        if limited > 0 {
            return Err(DbErr::Migration(format!(
                "refusing to drop {table}: {limited} rate-limit key(s) are still limited (their \
                 next permits are not due yet). Stop the callers first and wait out the \
                 quota's interval, then run `down` again. Nothing was dropped by this step.",
                table = self.table
            )));
        }
        manager
            .drop_table(Table::drop().table(Alias::new(&self.table)).to_owned())
            .await
    }
}

/// The keys of `table` whose theoretical arrival time is ahead of the database's now.
pub(crate) async fn limited_keys<C: ConnectionTrait>(conn: &C, table: &str) -> Result<i64, DbErr> {
    let now_us = match conn.get_database_backend() {
        DbBackend::MySql => "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))",
        DbBackend::Postgres => "CAST(EXTRACT(EPOCH FROM CURRENT_TIMESTAMP) * 1000000 AS BIGINT)",
        _ => "CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER) * 1000",
    };
    let ahead = Expr::col(Column::TatUs).gt(Expr::cust(now_us));
    count_where(conn, table, Some(ahead)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use sea_orm_migration::sea_orm::sea_query::{
        MysqlQueryBuilder, PostgresQueryBuilder, SqliteQueryBuilder,
    };

    #[test]
    fn names_are_fixed() {
        assert_eq!(
            CreateRateLimitTable::new().name(),
            "m20261206_000001_create_orionbeacon_rate_limits"
        );
        assert_eq!(
            CreateRateLimitTable::with_table("api_limits")
                .unwrap()
                .name(),
            "m20261206_000001_create_orionbeacon_rate_limits_api_limits"
        );
        assert!(CreateRateLimitTable::with_table("x; DROP TABLE y").is_err());
    }

    #[test]
    fn ddl_per_backend() {
        let m = CreateRateLimitTable::new();
        assert_eq!(
            m.create_statement(DbBackend::Postgres)
                .to_string(PostgresQueryBuilder),
            r#"CREATE TABLE "orionbeacon_rate_limits" ( "limit_key" varchar(255) NOT NULL, "tat_us" bigint NOT NULL, "permits" bigint NOT NULL, "granted" bool NOT NULL, "decided_us" bigint NOT NULL, "decision_id" bigint NOT NULL, PRIMARY KEY ("limit_key") )"#
        );
        assert_eq!(
            m.create_statement(DbBackend::Sqlite)
                .to_string(SqliteQueryBuilder),
            r#"CREATE TABLE "orionbeacon_rate_limits" ( "limit_key" varchar(255) NOT NULL, "tat_us" integer NOT NULL, "permits" integer NOT NULL, "granted" boolean NOT NULL, "decided_us" integer NOT NULL, "decision_id" integer NOT NULL, PRIMARY KEY ("limit_key") )"#
        );
        assert_eq!(
            m.create_statement(DbBackend::MySql).to_string(MysqlQueryBuilder),
            "CREATE TABLE `orionbeacon_rate_limits` ( `limit_key` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, `tat_us` bigint NOT NULL, `permits` bigint NOT NULL, `granted` bool NOT NULL, `decided_us` bigint NOT NULL, `decision_id` bigint NOT NULL, PRIMARY KEY (`limit_key`) )"
        );
    }
}
