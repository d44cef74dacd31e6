use orion_beacon_entity::lease::Column;
use orion_beacon_entity::{validate_table_name, TableNameError, DEFAULT_TABLE};
use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend, Statement, TransactionTrait};
use sea_orm_migration::SchemaManagerConnection;

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
        let name = |col: Column| name_column(backend, col);
        let mut resource = name(Column::Resource);
        resource.primary_key();
        let holder = name(Column::Holder);
        let ts = |col: Column| time_column(backend, col);
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
    /// In a transaction on every backend (sea-orm-migration's default has one only on
    /// PostgreSQL): a take-over's removal of the other migrator's record and this migrator's
    /// record of it then commit together (MySQL still commits DDL on its own).
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    /// Creates the table. A table that orion-beacon's own migrator (the command line) made is
    /// taken over, rows kept: that migrator's record goes, and the migrator running this
    /// records it. Any other table that already exists is an error, not a silent no-op: the
    /// application's `Migrator` may record it (then orion-beacon's own migrator must not run
    /// here), or it was made by hand or left by an interrupted run, and its shape is unknown
    /// (a case-insensitive collation or a time zone-dependent timestamp would break the lease
    /// rules without an error).
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if table_exists(manager, &self.table).await? {
            let applied = applied_through(manager, &self.name).await?;
            if take_over_from_own(manager, &applied, &self.name, &self.table).await? {
                return Ok(());
            }
            let rows = row_count(manager.get_connection(), &self.table).await?;
            return Err(DbErr::Migration(already_exists(
                &self.table,
                &self.name,
                &applied,
                rows,
            )));
        }
        let backend = manager.get_database_backend();
        manager.create_table(self.create_statement(backend)).await
    }

    /// Drops the table, but only an empty one: its rows are live leases and the token
    /// history, and a table made again by `up` starts tokens at 1, below every token already
    /// written into fenced rows downstream. Delete the rows first to mean it. Also refused
    /// while both migration paths record this migration (see `up`).
    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let applied = applied_through(manager, &self.name).await?;
        if applied.len() > 1 {
            return Err(DbErr::Migration(format!(
                "refusing to drop {table}: the migration `{name}` is recorded in both {tables}, \
                 so the two migrators disagree about it. Keep exactly one path: delete the \
                 record from the tracking table you no longer use, then run `down` from the \
                 other.",
                table = self.table,
                name = self.name,
                tables = applied.join(" and "),
            )));
        }
        if !table_exists(manager, &self.table).await? {
            return Ok(()); // nothing to drop
        }
        let backend = manager.get_database_backend();
        match manager.get_connection() {
            // Outside a transaction (sea-orm-migration's default on SQLite, and on PostgreSQL
            // when told so): make one, so the count and the drop see the same table (under
            // PostgreSQL's lock; on SQLite a lease written after the count makes the drop fail
            // as busy). MySQL's DDL commits on its own; stop the electors first there.
            SchemaManagerConnection::Connection(db)
                if matches!(backend, DbBackend::Postgres | DbBackend::Sqlite) =>
            {
                let txn = db.begin().await?;
                self.drop_if_empty(&txn, backend).await?;
                txn.commit().await
            }
            conn => self.drop_if_empty(conn, backend).await,
        }
    }
}

impl CreateLeaseTable {
    /// Counts the rows and drops the table if there are none. On PostgreSQL the table is
    /// locked first (inside the caller's transaction), so no lease is written in between.
    async fn drop_if_empty<C: ConnectionTrait>(
        &self,
        conn: &C,
        backend: DbBackend,
    ) -> Result<(), DbErr> {
        if backend == DbBackend::Postgres {
            let lock = format!(
                "LOCK TABLE {} IN ACCESS EXCLUSIVE MODE",
                quoted_postgres(&self.table)
            );
            conn.execute_unprepared(&lock).await?;
        }
        let rows = row_count(conn, &self.table).await?;
        if rows > 0 {
            return Err(DbErr::Migration(format!(
                "refusing to drop {table}: it holds {rows} lease row(s), the live leases and \
                 the fencing-token history. Tokens of a table made again start at 1, below \
                 the tokens already in fenced rows, so those rows would accept stale writes. \
                 To drop it anyway, stop every elector, run `DELETE FROM {table}`, then run \
                 `down` again. (sea-orm-migration commits each migration on its own, so the \
                 steps of this `down` before this one stay rolled back, the membership table's \
                 among them if it was one: `up` applies them again.)",
                table = self.table
            )));
        }
        conn.execute(&Table::drop().table(Alias::new(&self.table)).to_owned())
            .await
            .map(|_| ())
    }
}

/// A name column (up to 255 characters, not null), for the lease and membership tables.
pub(crate) fn name_column(backend: DbBackend, col: impl IntoIden) -> ColumnDef {
    let mut def = ColumnDef::new(col);
    match backend {
        // Binary collation: names compare byte for byte, as on the other backends (the default
        // collation is case-insensitive).
        DbBackend::MySql => def.custom(Alias::new(
            "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
        )),
        _ => def.string_len(255),
    };
    def.not_null();
    def
}

/// A timestamp column written only by the database clock (not null).
pub(crate) fn time_column(backend: DbBackend, col: impl IntoIden) -> ColumnDef {
    let mut def = ColumnDef::new(col);
    match backend {
        // DATETIME(6) filled from UTC_TIMESTAMP(6): TIMESTAMP would follow the session time
        // zone and drop the fraction.
        DbBackend::MySql => def.custom(Alias::new("DATETIME(6)")),
        _ => def.timestamp_with_time_zone(),
    };
    def.not_null();
    def
}

/// The rows of `table`.
pub(crate) async fn row_count<C: ConnectionTrait>(conn: &C, table: &str) -> Result<i64, DbErr> {
    count_where(conn, table, None).await
}

/// `SELECT COUNT(*) FROM table [WHERE condition]`, read as a number.
pub(crate) async fn count_where<C: ConnectionTrait>(
    conn: &C,
    table: &str,
    condition: Option<SimpleExpr>,
) -> Result<i64, DbErr> {
    let mut count = Query::select();
    count
        .expr(Expr::col(Asterisk).count())
        .from(Alias::new(table));
    if let Some(condition) = condition {
        count.and_where(condition);
    }
    Ok(conn
        .query_one(&count)
        .await?
        .map(|row| row.try_get_by_index::<i64>(0))
        .transpose()?
        .unwrap_or(0))
}

/// Whether `table` exists where an unqualified name resolves (the current schema or
/// database), asked in plain SQL: `SchemaManager::has_table` needs sea-orm-migration's driver
/// features, which an application's migration crate need not enable.
pub(crate) async fn table_exists(manager: &SchemaManager<'_>, table: &str) -> Result<bool, DbErr> {
    table_exists_on(manager.get_connection(), table).await
}

/// [`table_exists`] on any connection.
pub(crate) async fn table_exists_on<C: ConnectionTrait>(
    conn: &C,
    table: &str,
) -> Result<bool, DbErr> {
    let backend = conn.get_database_backend();
    let sql = match backend {
        DbBackend::Postgres => {
            "SELECT COUNT(*) FROM information_schema.tables \
             WHERE table_schema = current_schema() AND table_name = $1 \
             AND table_type = 'BASE TABLE'"
        }
        DbBackend::MySql => {
            "SELECT COUNT(*) FROM information_schema.tables \
             WHERE table_schema = DATABASE() AND table_name = ? \
             AND table_type = 'BASE TABLE'"
        }
        _ => "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?",
    };
    let stmt = Statement::from_sql_and_values(backend, sql, [table.into()]);
    let count: i64 = conn
        .query_one_raw(stmt)
        .await?
        .map(|row| row.try_get_by_index::<i64>(0))
        .transpose()?
        .unwrap_or(0);
    Ok(count > 0)
}

/// The tracking tables (of the two paths, by their default names) that record `name`.
pub(crate) async fn applied_through(
    manager: &SchemaManager<'_>,
    name: &str,
) -> Result<Vec<&'static str>, DbErr> {
    applied_through_on(manager.get_connection(), name).await
}

/// [`applied_through`] on any connection.
pub(crate) async fn applied_through_on<C: ConnectionTrait>(
    conn: &C,
    name: &str,
) -> Result<Vec<&'static str>, DbErr> {
    let mut found = Vec::new();
    for tracking in [crate::TRACKING_TABLE, APP_TRACKING_TABLE] {
        if !table_exists_on(conn, tracking).await? {
            continue;
        }
        let recorded = Expr::col(Alias::new("version")).eq(name);
        if count_where(conn, tracking, Some(recorded)).await? > 0 {
            found.push(tracking);
        }
    }
    Ok(found)
}

/// Whether only orion-beacon's own migrator records `name`: then the migrator running `up` now
/// (another one: ours would not run an applied migration) takes the table over. The table's
/// shape is known (this migration made it), its rows stay, and our record goes, in the same
/// transaction as the new record where the backend has one (PostgreSQL), so the two
/// migrators never both record it.
pub(crate) async fn take_over_from_own(
    manager: &SchemaManager<'_>,
    applied: &[&str],
    name: &str,
    table: &str,
) -> Result<bool, DbErr> {
    if !matches!(applied, [one] if *one == crate::TRACKING_TABLE) {
        return Ok(false);
    }
    let forget = Query::delete()
        .from_table(Alias::new(crate::TRACKING_TABLE))
        .and_where(Expr::col(Alias::new("version")).eq(name))
        .to_owned();
    manager.get_connection().execute(&forget).await?;
    tracing::info!(
        migration = name,
        table,
        "taken over from orion-beacon-migration's own history ({}): the table and its rows are \
         kept, and this migrator records it from now on",
        crate::TRACKING_TABLE
    );
    Ok(true)
}

/// sea-orm-migration's default tracking table: the application's `Migrator` path.
pub(crate) const APP_TRACKING_TABLE: &str = "seaql_migrations";

fn already_exists(table: &str, name: &str, applied: &[&str], rows: i64) -> String {
    let how = match applied {
        [] if rows > 0 => format!(
            "no migrator records it, and it holds {rows} lease row(s): do not drop it (its \
             fencing tokens protect your fenced rows). If this migration made it and its record \
             was lost, record it in your migrator's tracking table: INSERT INTO seaql_migrations \
             (version, applied_at) VALUES ('{name}', 0)"
        ),
        [] => "no migrator records it and it is empty (made by hand or by another tool, or \
               left by an interrupted run of this migration); drop it and run `up` again"
            .to_owned(),
        [one] => format!(
            "it was created by your application's Migrator (recorded in `{one}`), so \
             orion-beacon's own migrator must not run on this database: your Migrator \
             manages it"
        ),
        _ => format!(
            "both migrators record it ({}); delete its record from `{}`",
            applied.join(", "),
            crate::TRACKING_TABLE
        ),
    };
    format!("the lease table {table} already exists: {how}.")
}

fn quoted_postgres(name: &str) -> String {
    format!("\"{name}\"")
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
