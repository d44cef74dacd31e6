use orion_beacon_entity::lease::Column;
use orion_beacon_entity::{validate_table_name, TableNameError, DEFAULT_TABLE};
use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend, Statement};

use crate::m20261129_000001_create_leases::{applied_through, table_exists, take_over_from_own};

/// Adds the payload columns to an existing lease table (`orionbeacon_leases` by default), in
/// place: every row and token stays. Run it after [`CreateLeaseTable`](crate::CreateLeaseTable).
///
/// Columns: `payload` (up to 1,024 characters, nullable; binary collation on MySQL/MariaDB) and
/// `payload_token` (bigint, nullable), the token of the term that wrote the payload, so that a
/// term that writes none never shows an earlier term's. Until this has run, a store keeps
/// working on the table without payloads, and refuses requests that carry one.
///
/// `down` (one step) removes the two columns and nothing else: the leases and their tokens stay.
#[derive(Debug, Clone)]
pub struct AddLeasePayload {
    table: String,
    name: String,
}

impl AddLeasePayload {
    /// The migration name for the default table. It never changes.
    pub const NAME: &'static str = "m20261203_000001_add_orionbeacon_leases_payload";

    /// The migration for the default table, `orionbeacon_leases`.
    pub fn new() -> Self {
        Self {
            table: DEFAULT_TABLE.to_owned(),
            name: Self::NAME.to_owned(),
        }
    }

    /// The migration for a custom lease table (validated: ASCII letters, digits and `_`), the
    /// one [`CreateLeaseTable::with_table`](crate::CreateLeaseTable::with_table) made. Its
    /// migration name is `m20261203_000001_add_orionbeacon_leases_payload_<table>`.
    pub fn with_table(table: impl Into<String>) -> Result<Self, TableNameError> {
        let table = table.into();
        validate_table_name(&table)?;
        if table == DEFAULT_TABLE {
            return Ok(Self::new());
        }
        let name = format!("{}_{table}", Self::NAME);
        Ok(Self { table, name })
    }

    /// The lease table this migration changes.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The two `ALTER TABLE`s of `up` (SQLite adds one column per statement).
    fn add_statements(&self, backend: DbBackend) -> [TableAlterStatement; 2] {
        let mut payload = ColumnDef::new(Column::Payload);
        match backend {
            // Binary collation, as the name columns: stored and compared byte for byte.
            DbBackend::MySql => payload.custom(Alias::new(
                "VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
            )),
            _ => payload.string_len(1024),
        };
        payload.null();
        let mut token = ColumnDef::new(Column::PayloadToken);
        token.big_integer().null();
        let table = Alias::new(&self.table);
        [
            Table::alter()
                .table(table.clone())
                .add_column(payload)
                .to_owned(),
            Table::alter().table(table).add_column(token).to_owned(),
        ]
    }

    /// The two `ALTER TABLE`s of `down`.
    fn drop_statements(&self) -> [TableAlterStatement; 2] {
        let table = Alias::new(&self.table);
        [
            Table::alter()
                .table(table.clone())
                .drop_column(Column::PayloadToken)
                .to_owned(),
            Table::alter()
                .table(table)
                .drop_column(Column::Payload)
                .to_owned(),
        ]
    }
}

impl Default for AddLeasePayload {
    fn default() -> Self {
        Self::new()
    }
}

impl MigrationName for AddLeasePayload {
    fn name(&self) -> &str {
        &self.name
    }
}

#[async_trait::async_trait]
impl MigrationTrait for AddLeasePayload {
    /// In a transaction on every backend, as [`CreateLeaseTable`](crate::CreateLeaseTable)'s
    /// (MySQL still commits each `ALTER TABLE` on its own).
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    /// Adds the columns. A table that already has them is taken over when orion-beacon's own
    /// migrator (the command line) added them, and refused otherwise (their shape is unknown).
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if !table_exists(manager, &self.table).await? {
            return Err(DbErr::Migration(format!(
                "the lease table {} does not exist: run CreateLeaseTable (for it) before \
                 AddLeasePayload",
                self.table
            )));
        }
        let conn = manager.get_connection();
        let present = [
            column_exists(conn, &self.table, "payload").await?,
            column_exists(conn, &self.table, "payload_token").await?,
        ];
        if present.iter().any(|p| *p) {
            let applied = applied_through(manager, &self.name).await?;
            if present == [true, true]
                && take_over_from_own(manager, &applied, &self.name, &self.table).await?
            {
                return Ok(());
            }
            let how = if applied.is_empty() {
                "no migrator records them (added by hand, or by an interrupted run): drop them \
                 and run `up` again"
                    .to_owned()
            } else {
                format!("recorded in {}", applied.join(" and "))
            };
            return Err(DbErr::Migration(format!(
                "the lease table {} already has a payload column: {how}. Apply \
                 AddLeasePayload through exactly one migrator.",
                self.table
            )));
        }
        let backend = manager.get_database_backend();
        for alter in self.add_statements(backend) {
            manager.alter_table(alter).await?;
        }
        Ok(())
    }

    /// Removes the two columns; the leases and their tokens stay. A running store notices at
    /// its next statement and goes on without payloads.
    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if !table_exists(manager, &self.table).await? {
            return Ok(());
        }
        let conn = manager.get_connection();
        let [token, payload] = self.drop_statements();
        if column_exists(conn, &self.table, "payload_token").await? {
            manager.alter_table(token).await?;
        }
        if column_exists(conn, &self.table, "payload").await? {
            manager.alter_table(payload).await?;
        }
        Ok(())
    }
}

/// Whether `table` (where an unqualified name resolves) has a column named `column`.
pub(crate) async fn column_exists<C: ConnectionTrait>(
    conn: &C,
    table: &str,
    column: &str,
) -> Result<bool, DbErr> {
    let backend = conn.get_database_backend();
    let sql = match backend {
        DbBackend::Postgres => {
            "SELECT COUNT(*) FROM information_schema.columns \
             WHERE table_schema = current_schema() AND table_name = $1 AND column_name = $2"
        }
        DbBackend::MySql => {
            "SELECT COUNT(*) FROM information_schema.columns \
             WHERE table_schema = DATABASE() AND table_name = ? AND column_name = ?"
        }
        _ => "SELECT COUNT(*) FROM pragma_table_info(?) WHERE name = ?",
    };
    let stmt = Statement::from_sql_and_values(backend, sql, [table.into(), column.into()]);
    let count: i64 = conn
        .query_one_raw(stmt)
        .await?
        .map(|row| row.try_get_by_index::<i64>(0))
        .transpose()?
        .unwrap_or(0);
    Ok(count > 0)
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
            AddLeasePayload::new().name(),
            "m20261203_000001_add_orionbeacon_leases_payload"
        );
        assert_eq!(
            AddLeasePayload::with_table("shard_leases").unwrap().name(),
            "m20261203_000001_add_orionbeacon_leases_payload_shard_leases"
        );
        assert_eq!(
            AddLeasePayload::with_table(DEFAULT_TABLE).unwrap().name(),
            AddLeasePayload::NAME
        );
        assert!(AddLeasePayload::with_table("x; DROP TABLE y").is_err());
    }

    #[test]
    fn ddl_per_backend() {
        let m = AddLeasePayload::new();
        let pg: Vec<String> = m
            .add_statements(DbBackend::Postgres)
            .iter()
            .map(|s| s.to_string(PostgresQueryBuilder))
            .collect();
        assert_eq!(
            pg,
            [
                r#"ALTER TABLE "orionbeacon_leases" ADD COLUMN "payload" varchar(1024) NULL"#,
                r#"ALTER TABLE "orionbeacon_leases" ADD COLUMN "payload_token" bigint NULL"#,
            ]
        );
        let sqlite: Vec<String> = m
            .add_statements(DbBackend::Sqlite)
            .iter()
            .map(|s| s.to_string(SqliteQueryBuilder))
            .collect();
        assert_eq!(
            sqlite,
            [
                r#"ALTER TABLE "orionbeacon_leases" ADD COLUMN "payload" varchar(1024) NULL"#,
                r#"ALTER TABLE "orionbeacon_leases" ADD COLUMN "payload_token" integer NULL"#,
            ]
        );
        let mysql: Vec<String> = m
            .add_statements(DbBackend::MySql)
            .iter()
            .map(|s| s.to_string(MysqlQueryBuilder))
            .collect();
        assert_eq!(
            mysql,
            [
                "ALTER TABLE `orionbeacon_leases` ADD COLUMN `payload` VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL",
                "ALTER TABLE `orionbeacon_leases` ADD COLUMN `payload_token` bigint NULL",
            ]
        );
        let down: Vec<String> = m
            .drop_statements()
            .iter()
            .map(|s| s.to_string(PostgresQueryBuilder))
            .collect();
        assert_eq!(
            down,
            [
                r#"ALTER TABLE "orionbeacon_leases" DROP COLUMN "payload_token""#,
                r#"ALTER TABLE "orionbeacon_leases" DROP COLUMN "payload""#,
            ]
        );
    }
}
