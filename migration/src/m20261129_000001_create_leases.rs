use orion_beacon_entity::lease::Column;
use orion_beacon_entity::{validate_table_name, TableNameError, DEFAULT_TABLE};
use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

/// Creates the lease table (`orionbeacon_leases` by default).
///
/// Columns: `resource` (primary key, up to 255 characters), `holder`, `fencing_token`
/// (bigint), `expires_at`, `acquired_at`, `renewed_at`. Timestamps are `timestamptz` on
/// PostgreSQL, `DATETIME(6)` in UTC on MySQL/MariaDB and millisecond text on SQLite; they are
/// only ever written by the database clock.
#[derive(Debug, Clone)]
pub struct CreateLeaseTable {
    table: String,
    name: String,
}

impl CreateLeaseTable {
    /// The migration name for the default table. It never changes.
    pub const NAME: &'static str = "m20261129_000001_create_orionbeacon_leases";

    /// The migration for the default table, `orionbeacon_leases`.
    pub fn new() -> Self {
        Self {
            table: DEFAULT_TABLE.to_owned(),
            name: Self::NAME.to_owned(),
        }
    }

    /// The migration for a custom table name (validated: ASCII letters, digits and `_`).
    /// Its migration name is `m20261129_000001_create_orionbeacon_leases_<table>`, so one
    /// application can create several lease tables.
    pub fn with_table(table: impl Into<String>) -> Result<Self, TableNameError> {
        let table = table.into();
        validate_table_name(&table)?;
        if table == DEFAULT_TABLE {
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
        let name = |col: Column| {
            let mut def = ColumnDef::new(col);
            match backend {
                // Binary collation: resource and holder names compare byte for byte, as on the
                // other backends (the default collation is case-insensitive).
                DbBackend::MySql => def.custom(Alias::new(
                    "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
                )),
                _ => def.string_len(255),
            };
            def.not_null();
            def
        };
        let mut resource = name(Column::Resource);
        resource.primary_key();
        let holder = name(Column::Holder);
        let ts = |col: Column| {
            let mut def = ColumnDef::new(col);
            match backend {
                // DATETIME(6) filled from UTC_TIMESTAMP(6): TIMESTAMP would follow the session
                // time zone and drop the fraction.
                DbBackend::MySql => def.custom(Alias::new("DATETIME(6)")),
                _ => def.timestamp_with_time_zone(),
            };
            def.not_null();
            def
        };
        Table::create()
            .table(Alias::new(&self.table))
            .if_not_exists()
            .col(resource)
            .col(holder)
            .col(
                ColumnDef::new(Column::FencingToken)
                    .big_integer()
                    .not_null(),
            )
            .col(ts(Column::ExpiresAt))
            .col(ts(Column::AcquiredAt))
            .col(ts(Column::RenewedAt))
            .to_owned()
    }
}

impl Default for CreateLeaseTable {
    fn default() -> Self {
        Self::new()
    }
}

impl MigrationName for CreateLeaseTable {
    fn name(&self) -> &str {
        &self.name
    }
}

#[async_trait::async_trait]
impl MigrationTrait for CreateLeaseTable {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        manager.create_table(self.create_statement(backend)).await
    }

    /// Drops the table, but only an empty one: its rows are live leases and the token
    /// history, and a table made again by `up` starts tokens at 1, below every token already
    /// written into fenced rows downstream. Delete the rows first to mean it.
    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let conn = manager.get_connection();
        if manager.get_database_backend() == DbBackend::Postgres {
            // The count and the drop see the same table: nobody writes a lease in between
            // (sea-orm-migration runs a PostgreSQL migration in one transaction).
            let lock = format!(
                "LOCK TABLE {} IN ACCESS EXCLUSIVE MODE",
                quoted_postgres(&self.table)
            );
            // Outside a transaction (a direct call, not through a migrator) there is nothing
            // to hold the lock in: count and drop as the other backends do.
            if let Err(e) = conn.execute_unprepared(&lock).await {
                if !is_missing_table(&e) && !has_sqlstate(&e, "25P01") {
                    return Err(e);
                }
            }
        }
        let count = Query::select()
            .expr(Expr::col(Asterisk).count())
            .from(Alias::new(&self.table))
            .to_owned();
        // The table the drop below would find, through the same name lookup (search path).
        let rows: i64 = match conn.query_one(&count).await {
            Ok(row) => row
                .map(|row| row.try_get_by_index::<i64>(0))
                .transpose()?
                .unwrap_or(0),
            Err(e) if is_missing_table(&e) => 0,
            Err(e) => return Err(e),
        };
        if rows > 0 {
            return Err(DbErr::Migration(format!(
                "refusing to drop {table}: it holds {rows} lease row(s), the live leases and \
                 the fencing-token history. Tokens of a table made again start at 1, below \
                 the tokens already in fenced rows, so those rows would accept stale writes. \
                 To drop it anyway, stop every elector, run `DELETE FROM {table}`, then run \
                 `down` again.",
                table = self.table
            )));
        }
        manager
            .drop_table(
                Table::drop()
                    .table(Alias::new(&self.table))
                    .if_exists()
                    .to_owned(),
            )
            .await
    }
}

/// `"name"` for PostgreSQL (the name is validated: letters, digits and `_` only).
fn quoted_postgres(name: &str) -> String {
    format!("\"{name}\"")
}

/// The database error behind `err`: its SQLSTATE and message.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
fn database_error(err: &DbErr) -> Option<(Option<String>, String)> {
    use sea_orm_migration::sea_orm::RuntimeErr;
    let (DbErr::Exec(RuntimeErr::SqlxError(e)) | DbErr::Query(RuntimeErr::SqlxError(e))) = err
    else {
        return None;
    };
    let db = e.as_database_error()?;
    Some((db.code().map(|c| c.into_owned()), db.message().to_owned()))
}

/// Without a driver there is no database error.
#[cfg(not(any(feature = "sqlite", feature = "postgres", feature = "mysql")))]
fn database_error(_err: &DbErr) -> Option<(Option<String>, String)> {
    None
}

fn has_sqlstate(err: &DbErr, state: &str) -> bool {
    database_error(err).is_some_and(|(code, _)| code.as_deref() == Some(state))
}

/// "No such table", by SQLSTATE (PostgreSQL `42P01`, MySQL/MariaDB `42S02`) or SQLite's
/// message (SQLite's messages are not translated).
fn is_missing_table(err: &DbErr) -> bool {
    has_sqlstate(err, "42P01")
        || has_sqlstate(err, "42S02")
        || database_error(err).is_some_and(|(_, message)| message.starts_with("no such table"))
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
            CreateLeaseTable::new().name(),
            "m20261129_000001_create_orionbeacon_leases"
        );
        let custom = CreateLeaseTable::with_table("shard_leases").unwrap();
        assert_eq!(
            custom.name(),
            "m20261129_000001_create_orionbeacon_leases_shard_leases"
        );
        assert_eq!(
            CreateLeaseTable::with_table(DEFAULT_TABLE).unwrap().name(),
            CreateLeaseTable::NAME
        );
        assert!(CreateLeaseTable::with_table("x; DROP TABLE y").is_err());
    }

    #[test]
    fn ddl_per_backend() {
        let m = CreateLeaseTable::new();
        assert_eq!(
            m.create_statement(DbBackend::Postgres)
                .to_string(PostgresQueryBuilder),
            r#"CREATE TABLE IF NOT EXISTS "orionbeacon_leases" ( "resource" varchar(255) NOT NULL PRIMARY KEY, "holder" varchar(255) NOT NULL, "fencing_token" bigint NOT NULL, "expires_at" timestamp with time zone NOT NULL, "acquired_at" timestamp with time zone NOT NULL, "renewed_at" timestamp with time zone NOT NULL )"#
        );
        // SQLite's INTEGER is 64-bit.
        assert_eq!(
            m.create_statement(DbBackend::Sqlite)
                .to_string(SqliteQueryBuilder),
            r#"CREATE TABLE IF NOT EXISTS "orionbeacon_leases" ( "resource" varchar(255) NOT NULL PRIMARY KEY, "holder" varchar(255) NOT NULL, "fencing_token" integer NOT NULL, "expires_at" timestamp_with_timezone_text NOT NULL, "acquired_at" timestamp_with_timezone_text NOT NULL, "renewed_at" timestamp_with_timezone_text NOT NULL )"#
        );
        assert_eq!(
            m.create_statement(DbBackend::MySql).to_string(MysqlQueryBuilder),
            "CREATE TABLE IF NOT EXISTS `orionbeacon_leases` ( `resource` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY, `holder` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, `fencing_token` bigint NOT NULL, `expires_at` DATETIME(6) NOT NULL, `acquired_at` DATETIME(6) NOT NULL, `renewed_at` DATETIME(6) NOT NULL )"
        );
    }
}
