use orion_beacon_entity::member::Column;
use orion_beacon_entity::{validate_table_name, TableNameError, DEFAULT_MEMBER_TABLE};
use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend};

use crate::m20261129_000001_create_leases::{
    applied_through, count_where, name_column, table_exists, take_over_from_own, time_column,
};

/// Creates the membership table of shard sets (`orionbeacon_members` by default): one row per
/// live node of a shard set, written by its heartbeats.
///
/// Columns: `shard_set` and `member` (the primary key, up to 255 characters each, binary
/// collation on MySQL/MariaDB), `draining`, `joined_at`, `heartbeat_at`, `expires_at`.
/// Timestamps have the lease table's types and, like them, are only ever written by the
/// database clock.
///
/// A second, later migration: a database that already has the lease table gets it with
/// `migrate up`, and `down` (one step) removes it again, leaving the leases alone.
#[derive(Debug, Clone)]
pub struct CreateMemberTable {
    table: String,
    name: String,
}

impl CreateMemberTable {
    /// The migration name for the default table. It never changes.
    pub const NAME: &'static str = "m20261201_000001_create_orionbeacon_members";

    /// The migration for the default table, `orionbeacon_members`.
    pub fn new() -> Self {
        Self {
            table: DEFAULT_MEMBER_TABLE.to_owned(),
            name: Self::NAME.to_owned(),
        }
    }

    /// The migration for a custom table name (validated: ASCII letters, digits and `_`).
    /// Its migration name is `m20261201_000001_create_orionbeacon_members_<table>`.
    pub fn with_table(table: impl Into<String>) -> Result<Self, TableNameError> {
        let table = table.into();
        validate_table_name(&table)?;
        if table == DEFAULT_MEMBER_TABLE {
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
        let ts = |col: Column| time_column(backend, col);
        Table::create()
            .table(Alias::new(&self.table))
            .col(name(Column::ShardSet))
            .col(name(Column::Member))
            .col(ColumnDef::new(Column::Draining).boolean().not_null())
            .col(ts(Column::JoinedAt))
            .col(ts(Column::HeartbeatAt))
            .col(ts(Column::ExpiresAt))
            .primary_key(Index::create().col(Column::ShardSet).col(Column::Member))
            .to_owned()
    }
}

impl Default for CreateMemberTable {
    fn default() -> Self {
        Self::new()
    }
}

impl MigrationName for CreateMemberTable {
    fn name(&self) -> &str {
        &self.name
    }
}

#[async_trait::async_trait]
impl MigrationTrait for CreateMemberTable {
    /// In a transaction on every backend, as [`CreateLeaseTable`](crate::CreateLeaseTable)'s.
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    /// Creates the table. As for the lease table, one that orion-beacon's own migrator made is
    /// taken over, rows kept, and any other that already exists is refused (its shape is
    /// unknown).
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if table_exists(manager, &self.table).await? {
            let applied = applied_through(manager, &self.name).await?;
            if take_over_from_own(manager, &applied, &self.name, &self.table).await? {
                return Ok(());
            }
            let live = live_members(manager.get_connection(), &self.table).await?;
            let how = if applied.is_empty() && live > 0 {
                format!(
                    "no migrator records it, and {live} shard-set node(s) are live in it: stop \
                     them before you drop it. If this migration made it and its record was \
                     lost, record it instead: INSERT INTO seaql_migrations (version, \
                     applied_at) VALUES ('{}', 0)",
                    self.name
                )
            } else if applied.is_empty() {
                "no migrator records it (made by hand, or left by an interrupted run): drop it \
                 and run `up` again"
                    .to_owned()
            } else {
                format!("recorded in {}", applied.join(" and "))
            };
            return Err(DbErr::Migration(format!(
                "the membership table {} already exists: {how}. Apply CreateMemberTable \
                 through exactly one migrator.",
                self.table
            )));
        }
        let backend = manager.get_database_backend();
        manager.create_table(self.create_statement(backend)).await
    }

    /// Drops the table, but not while a shard-set node is live in it (a member row whose
    /// heartbeat has not expired): such nodes would report the missing table until stopped.
    /// Its rows are heartbeats only (no token history), so once every node has stopped (or its
    /// heartbeat has lapsed) it drops without asking.
    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if !table_exists(manager, &self.table).await? {
            return Ok(());
        }
        let live = live_members(manager.get_connection(), &self.table).await?;
        if live > 0 {
            return Err(DbErr::Migration(format!(
                "refusing to drop {table}: {live} shard-set node(s) are live in it (their \
                 heartbeats have not expired). Stop them first (or wait a lease), then run \
                 `down` again. Nothing was dropped by this step.",
                table = self.table
            )));
        }
        manager
            .drop_table(Table::drop().table(Alias::new(&self.table)).to_owned())
            .await
    }
}

/// The member rows of `table` whose heartbeat has not expired, by the database clock.
pub(crate) async fn live_members<C: ConnectionTrait>(conn: &C, table: &str) -> Result<i64, DbErr> {
    let now = match conn.get_database_backend() {
        DbBackend::MySql => "UTC_TIMESTAMP(6)",
        DbBackend::Postgres => "CURRENT_TIMESTAMP",
        _ => "strftime('%Y-%m-%d %H:%M:%f', 'now')",
    };
    let live = Expr::col(Column::ExpiresAt).gt(Expr::cust(now));
    count_where(conn, table, Some(live)).await
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
            CreateMemberTable::new().name(),
            "m20261201_000001_create_orionbeacon_members"
        );
        assert_eq!(
            CreateMemberTable::with_table("shard_members")
                .unwrap()
                .name(),
            "m20261201_000001_create_orionbeacon_members_shard_members"
        );
        assert!(CreateMemberTable::with_table("x; DROP TABLE y").is_err());
    }

    #[test]
    fn ddl_per_backend() {
        let m = CreateMemberTable::new();
        assert_eq!(
            m.create_statement(DbBackend::Postgres)
                .to_string(PostgresQueryBuilder),
            r#"CREATE TABLE "orionbeacon_members" ( "shard_set" varchar(255) NOT NULL, "member" varchar(255) NOT NULL, "draining" bool NOT NULL, "joined_at" timestamp with time zone NOT NULL, "heartbeat_at" timestamp with time zone NOT NULL, "expires_at" timestamp with time zone NOT NULL, PRIMARY KEY ("shard_set", "member") )"#
        );
        assert_eq!(
            m.create_statement(DbBackend::Sqlite)
                .to_string(SqliteQueryBuilder),
            r#"CREATE TABLE "orionbeacon_members" ( "shard_set" varchar(255) NOT NULL, "member" varchar(255) NOT NULL, "draining" boolean NOT NULL, "joined_at" timestamp_with_timezone_text NOT NULL, "heartbeat_at" timestamp_with_timezone_text NOT NULL, "expires_at" timestamp_with_timezone_text NOT NULL, PRIMARY KEY ("shard_set", "member") )"#
        );
        assert_eq!(
            m.create_statement(DbBackend::MySql).to_string(MysqlQueryBuilder),
            "CREATE TABLE `orionbeacon_members` ( `shard_set` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, `member` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, `draining` bool NOT NULL, `joined_at` DATETIME(6) NOT NULL, `heartbeat_at` DATETIME(6) NOT NULL, `expires_at` DATETIME(6) NOT NULL, PRIMARY KEY (`shard_set`, `member`) )"
        );
    }
}
