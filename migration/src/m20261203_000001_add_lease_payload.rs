use orion_beacon_entity::lease::Column;
use orion_beacon_entity::{validate_table_name, TableNameError, DEFAULT_TABLE};
use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend, Statement};

use crate::m20261129_000001_create_leases::{
    applied_through, count_where, table_exists, take_over_from_own,
};

/// Adds the payload columns to an existing lease table (`orionbeacon_leases` by default), in
/// place: every row and token stays. Run it after [`CreateLeaseTable`](crate::CreateLeaseTable).
///
/// Columns: `payload` (up to 1,024 characters, nullable; binary collation on MySQL/MariaDB) and
/// `payload_token` (bigint, nullable), the token of the term that wrote the payload, so that a
/// term that writes none never shows an earlier term's. A store requires them: until this has
/// run, it refuses the table with `StoreError::OutdatedSchema` naming this step.
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

    /// The `ALTER TABLE` of `up` for the columns `missing` names (`[payload, payload_token]`):
    /// one statement on PostgreSQL and MySQL, so that MySQL's auto-committed DDL never leaves
    /// one column without the other; one per column on SQLite, which adds one at a time.
    fn add_statements(&self, backend: DbBackend, missing: [bool; 2]) -> Vec<TableAlterStatement> {
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
        let columns: Vec<ColumnDef> = [payload, token]
            .into_iter()
            .zip(missing)
            .filter_map(|(column, missing)| missing.then_some(column))
            .collect();
        let alter = || Table::alter().table(Alias::new(&self.table)).to_owned();
        if backend == DbBackend::Sqlite {
            return columns
                .into_iter()
                .map(|column| alter().add_column(column).to_owned())
                .collect();
        }
        let mut one = alter();
        for column in columns {
            one.add_column(column);
        }
        vec![one]
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
        if present == [true, true] {
            let applied = applied_through(manager, &self.name).await?;
            if take_over_from_own(manager, &applied, &self.name, &self.table).await? {
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
        if present.iter().any(|p| *p) {
            // One of the two: an interrupted run on SQLite (one statement per column), or by
            // hand. Added the other.
            tracing::info!(table = %self.table, "adding the missing payload column");
        }
        let backend = manager.get_database_backend();
        let missing = present.map(|p| !p);
        for alter in self.add_statements(backend, missing) {
            bounded_ddl(conn, backend.build(&alter)).await?;
        }
        Ok(())
    }

    /// Removes the two columns; the leases and their tokens stay. Refused while a live lease
    /// carries a payload (its holder was configured with one). A running store refuses the
    /// table from its next statement on (`StoreError::OutdatedSchema`), writing nothing.
    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if !table_exists(manager, &self.table).await? {
            return Ok(());
        }
        let conn = manager.get_connection();
        if let Some(why) = refusal(conn, &self.table).await? {
            return Err(DbErr::Migration(format!(
                "{why} Nothing was dropped by this step."
            )));
        }
        let backend = manager.get_database_backend();
        let [token, payload] = self.drop_statements();
        if column_exists(conn, &self.table, "payload_token").await? {
            bounded_ddl(conn, backend.build(&token)).await?;
        }
        if column_exists(conn, &self.table, "payload").await? {
            bounded_ddl(conn, backend.build(&payload)).await?;
        }
        Ok(())
    }
}

/// How long the migration's `ALTER TABLE` waits for the table's lock (PostgreSQL's
/// `lock_timeout`, MariaDB's `lock_wait_timeout`, whole seconds) before it fails: while it
/// waits, every lease statement queues behind it, so a fenced transaction that stays open must
/// not stall the leaders for longer. Run it again later when it fails.
pub const DDL_LOCK_WAIT_SECONDS: u64 = 2;

/// Sends one DDL statement, its wait for the table's lock bounded where the server can
/// ([`DDL_LOCK_WAIT_SECONDS`]; MySQL waits its own `lock_wait_timeout`).
pub(crate) async fn bounded_ddl<C: ConnectionTrait>(conn: &C, ddl: Statement) -> Result<(), DbErr> {
    let sql = match conn.get_database_backend() {
        DbBackend::Postgres => {
            // Ends with the migration's transaction (every migration here runs in one).
            conn.execute_unprepared(&format!(
                "SET LOCAL lock_timeout = '{DDL_LOCK_WAIT_SECONDS}s'"
            ))
            .await?;
            ddl.sql
        }
        DbBackend::MySql if is_mariadb(conn).await? => format!(
            "SET STATEMENT lock_wait_timeout = {DDL_LOCK_WAIT_SECONDS} FOR {}",
            ddl.sql
        ),
        _ => ddl.sql,
    };
    conn.execute_unprepared(&sql).await.map(|_| ())
}

async fn is_mariadb<C: ConnectionTrait>(conn: &C) -> Result<bool, DbErr> {
    let stmt = Statement::from_string(DbBackend::MySql, "SELECT VERSION()");
    let version: String = conn
        .query_one_raw(stmt)
        .await?
        .map(|row| row.try_get_by_index::<String>(0))
        .transpose()?
        .unwrap_or_default();
    Ok(version.to_ascii_lowercase().contains("mariadb"))
}

/// Why `down` must not drop `table`'s payload columns now, if it must not: a live lease that
/// carries a payload.
pub(crate) async fn refusal<C: ConnectionTrait>(
    conn: &C,
    table: &str,
) -> Result<Option<String>, DbErr> {
    if !column_exists(conn, table, "payload").await?
        || !column_exists(conn, table, "payload_token").await?
    {
        return Ok(None);
    }
    let now = match conn.get_database_backend() {
        DbBackend::MySql => "UTC_TIMESTAMP(6)",
        DbBackend::Postgres => "CURRENT_TIMESTAMP",
        _ => "strftime('%Y-%m-%d %H:%M:%f', 'now')",
    };
    let carried = Expr::col(Column::ExpiresAt)
        .gt(Expr::cust(now))
        .and(Expr::col(Column::Payload).is_not_null())
        .and(Expr::col(Column::PayloadToken).equals(Column::FencingToken));
    let live = count_where(conn, table, Some(carried)).await?;
    Ok((live > 0).then(|| {
        format!(
            "refusing to drop the payload columns of {table}: {live} live lease(s) carry a \
             payload, and their holders would fail every acquire without the columns. Stop them \
             (or restart them without a payload, or wait a lease), then run `down` again."
        )
    }))
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
            .add_statements(DbBackend::Postgres, [true, true])
            .iter()
            .map(|s| s.to_string(PostgresQueryBuilder))
            .collect();
        assert_eq!(
            pg,
            [
                r#"ALTER TABLE "orionbeacon_leases" ADD COLUMN "payload" varchar(1024) NULL, ADD COLUMN "payload_token" bigint NULL"#,
            ]
        );
        // Only what is missing (an interrupted run).
        let rest: Vec<String> = m
            .add_statements(DbBackend::Sqlite, [false, true])
            .iter()
            .map(|s| s.to_string(SqliteQueryBuilder))
            .collect();
        assert_eq!(
            rest,
            [r#"ALTER TABLE "orionbeacon_leases" ADD COLUMN "payload_token" integer NULL"#]
        );
        let sqlite: Vec<String> = m
            .add_statements(DbBackend::Sqlite, [true, true])
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
            .add_statements(DbBackend::MySql, [true, true])
            .iter()
            .map(|s| s.to_string(MysqlQueryBuilder))
            .collect();
        assert_eq!(
            mysql,
            [
                "ALTER TABLE `orionbeacon_leases` ADD COLUMN `payload` VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, ADD COLUMN `payload_token` bigint NULL",
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
