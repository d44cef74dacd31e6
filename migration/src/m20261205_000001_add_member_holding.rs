use orion_beacon_entity::member::Column;
use orion_beacon_entity::{validate_table_name, TableNameError, DEFAULT_MEMBER_TABLE};
use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

use crate::m20261129_000001_create_leases::{applied_through, table_exists, take_over_from_own};
use crate::m20261203_000001_add_lease_payload::{bounded_ddl, column_exists};

/// Adds three columns to an existing membership table (`orionbeacon_members` by default), in
/// place: `leases_held` (bigint, nullable), how many of the set's leases the node leads at its
/// heartbeat, `set_hash` (bigint, nullable), a fingerprint of the node's list of resources, and
/// `counted_at` (the table's timestamp type, nullable), the heartbeat that wrote them: a
/// heartbeat that writes no counts (an older version's) leaves `counted_at` behind
/// `heartbeat_at`, and the counts are not read. Run it after
/// [`CreateMemberTable`](crate::CreateMemberTable).
///
/// With them, a shard-set node reads the set's leases only in rounds where the members' counts
/// say some resource may be free (or a member is late), instead of every round: a round's cost
/// then grows with what changes, not with resources x nodes. A store requires them: until this
/// has run, it refuses the membership table with `StoreError::OutdatedSchema` naming this step.
///
/// `down` (one step) removes the three columns; a running store then refuses the table the same
/// way at its next heartbeat.
#[derive(Debug, Clone)]
pub struct AddMemberHolding {
    table: String,
    name: String,
}

/// The columns, in the order they are added.
const COLUMNS: [&str; 3] = ["leases_held", "set_hash", "counted_at"];

impl AddMemberHolding {
    /// The migration name for the default table. It never changes.
    pub const NAME: &'static str = "m20261205_000001_add_orionbeacon_members_holding";

    /// The migration for the default table, `orionbeacon_members`.
    pub fn new() -> Self {
        Self {
            table: DEFAULT_MEMBER_TABLE.to_owned(),
            name: Self::NAME.to_owned(),
        }
    }

    /// The migration for a custom membership table (validated: ASCII letters, digits and
    /// `_`), the one [`CreateMemberTable::with_table`](crate::CreateMemberTable::with_table)
    /// made. Its migration name is `m20261205_000001_add_orionbeacon_members_holding_<table>`.
    pub fn with_table(table: impl Into<String>) -> Result<Self, TableNameError> {
        let table = table.into();
        validate_table_name(&table)?;
        if table == DEFAULT_MEMBER_TABLE {
            return Ok(Self::new());
        }
        let name = format!("{}_{table}", Self::NAME);
        Ok(Self { table, name })
    }

    /// The membership table this migration changes.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The `ALTER TABLE` of `up` for the columns `missing` names: one statement on PostgreSQL
    /// and MySQL, one per column on SQLite, which adds one at a time.
    fn add_statements(&self, backend: DbBackend, missing: [bool; 3]) -> Vec<TableAlterStatement> {
        let column = |c: Column| ColumnDef::new(c).big_integer().null().to_owned();
        let mut counted_at = ColumnDef::new(Column::CountedAt);
        match backend {
            // As the table's other times (see `CreateMemberTable`).
            DbBackend::MySql => counted_at.custom(Alias::new("DATETIME(6)")),
            _ => counted_at.timestamp_with_time_zone(),
        };
        counted_at.null();
        let columns: Vec<ColumnDef> = [
            column(Column::LeasesHeld),
            column(Column::SetHash),
            counted_at,
        ]
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

    /// The `ALTER TABLE`s of `down`, one per column, the last added first.
    fn drop_statements(&self) -> [(TableAlterStatement, &'static str); 3] {
        let drop = |c: Column| {
            Table::alter()
                .table(Alias::new(&self.table))
                .drop_column(c)
                .to_owned()
        };
        [
            (drop(Column::CountedAt), COLUMNS[2]),
            (drop(Column::SetHash), COLUMNS[1]),
            (drop(Column::LeasesHeld), COLUMNS[0]),
        ]
    }
}

impl Default for AddMemberHolding {
    fn default() -> Self {
        Self::new()
    }
}

impl MigrationName for AddMemberHolding {
    fn name(&self) -> &str {
        &self.name
    }
}

#[async_trait::async_trait]
impl MigrationTrait for AddMemberHolding {
    /// In a transaction on every backend, as [`CreateLeaseTable`](crate::CreateLeaseTable)'s
    /// (MySQL still commits each `ALTER TABLE` on its own).
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    /// Adds the columns. A table that already has all three is taken over when orion-beacon's own
    /// migrator (the command line) added them, and refused otherwise (their shape is unknown).
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if !table_exists(manager, &self.table).await? {
            return Err(DbErr::Migration(format!(
                "the membership table {} does not exist: run CreateMemberTable (for it) before \
                 AddMemberHolding",
                self.table
            )));
        }
        let conn = manager.get_connection();
        let present = [
            column_exists(conn, &self.table, COLUMNS[0]).await?,
            column_exists(conn, &self.table, COLUMNS[1]).await?,
            column_exists(conn, &self.table, COLUMNS[2]).await?,
        ];
        if present == [true, true, true] {
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
                "the membership table {} already has the columns leases_held, set_hash and \
                 counted_at: {how}. Apply AddMemberHolding through exactly one migrator.",
                self.table
            )));
        }
        if present.iter().any(|p| *p) {
            // Some of them: an interrupted run on SQLite (one statement per column), or by
            // hand. Adds the others.
            tracing::info!(table = %self.table, "adding the missing membership column");
        }
        let backend = manager.get_database_backend();
        for alter in self.add_statements(backend, present.map(|p| !p)) {
            bounded_ddl(conn, backend.build(&alter)).await?;
        }
        Ok(())
    }

    /// Removes the three columns; the members stay (a running store refuses the table from its
    /// next heartbeat on).
    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if !table_exists(manager, &self.table).await? {
            return Ok(());
        }
        let conn = manager.get_connection();
        let backend = manager.get_database_backend();
        for (alter, column) in self.drop_statements() {
            if column_exists(conn, &self.table, column).await? {
                bounded_ddl(conn, backend.build(&alter)).await?;
            }
        }
        Ok(())
    }
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
            AddMemberHolding::new().name(),
            "m20261205_000001_add_orionbeacon_members_holding"
        );
        assert_eq!(
            AddMemberHolding::with_table("shard_members")
                .unwrap()
                .name(),
            "m20261205_000001_add_orionbeacon_members_holding_shard_members"
        );
        assert_eq!(
            AddMemberHolding::with_table(DEFAULT_MEMBER_TABLE)
                .unwrap()
                .name(),
            AddMemberHolding::NAME
        );
        assert!(AddMemberHolding::with_table("x; DROP TABLE y").is_err());
    }

    #[test]
    fn ddl_per_backend() {
        let m = AddMemberHolding::new();
        let render = |backend: DbBackend, missing: [bool; 3]| -> Vec<String> {
            m.add_statements(backend, missing)
                .iter()
                .map(|s| match backend {
                    DbBackend::Postgres => s.to_string(PostgresQueryBuilder),
                    DbBackend::MySql => s.to_string(MysqlQueryBuilder),
                    _ => s.to_string(SqliteQueryBuilder),
                })
                .collect()
        };
        assert_eq!(
            render(DbBackend::Postgres, [true, true, true]),
            [
                r#"ALTER TABLE "orionbeacon_members" ADD COLUMN "leases_held" bigint NULL, ADD COLUMN "set_hash" bigint NULL, ADD COLUMN "counted_at" timestamp with time zone NULL"#
            ]
        );
        assert_eq!(
            render(DbBackend::MySql, [true, true, true]),
            [
                "ALTER TABLE `orionbeacon_members` ADD COLUMN `leases_held` bigint NULL, ADD COLUMN `set_hash` bigint NULL, ADD COLUMN `counted_at` DATETIME(6) NULL"
            ]
        );
        assert_eq!(
            render(DbBackend::Sqlite, [true, true, true]),
            [
                r#"ALTER TABLE "orionbeacon_members" ADD COLUMN "leases_held" integer NULL"#,
                r#"ALTER TABLE "orionbeacon_members" ADD COLUMN "set_hash" integer NULL"#,
                r#"ALTER TABLE "orionbeacon_members" ADD COLUMN "counted_at" timestamp_with_timezone_text NULL"#,
            ]
        );
        // Only what is missing (an interrupted run).
        assert_eq!(
            render(DbBackend::Sqlite, [false, true, false]),
            [r#"ALTER TABLE "orionbeacon_members" ADD COLUMN "set_hash" integer NULL"#]
        );
        let down: Vec<String> = m
            .drop_statements()
            .iter()
            .map(|(s, _)| s.to_string(PostgresQueryBuilder))
            .collect();
        assert_eq!(
            down,
            [
                r#"ALTER TABLE "orionbeacon_members" DROP COLUMN "counted_at""#,
                r#"ALTER TABLE "orionbeacon_members" DROP COLUMN "set_hash""#,
                r#"ALTER TABLE "orionbeacon_members" DROP COLUMN "leases_held""#,
            ]
        );
    }
}
