use orion_beacon_entity::member::Column;
use orion_beacon_entity::{validate_table_name, TableNameError, DEFAULT_MEMBER_TABLE};
use sea_orm_migration::prelude::*;

use crate::m20261129_000001_create_leases::{applied_through, table_exists, take_over_from_own};
use crate::m20261203_000001_add_lease_payload::{bounded_ddl, column_exists};

/// Adds one column to an existing membership table (`orionbeacon_members` by default), in
/// place: `candidate_rank` (bigint, nullable), the rank a ranked election's candidate
/// heartbeats with (`ElectorBuilder::rank`); shard-set members leave it NULL. Run it after
/// [`AddMemberHolding`](crate::AddMemberHolding).
///
/// Only ranked electors need it: until it has run, a ranked elector's store refuses the
/// membership table with `StoreError::OutdatedSchema` naming this step (the elector's
/// [`Health`] says so and it goes on as an unranked candidate would), while shard sets go on
/// as before.
///
/// `down` (one step) removes the column; ranked electors then meet the same refusal.
///
/// [`Health`]: https://docs.rs/orion-beacon/latest/orion_beacon/struct.Health.html
#[derive(Debug, Clone)]
pub struct AddMemberRank {
    table: String,
    name: String,
}

/// The column this step adds.
const COLUMN: &str = "candidate_rank";

impl AddMemberRank {
    /// The migration name for the default table. It never changes.
    pub const NAME: &'static str = "m20261207_000001_add_orionbeacon_members_rank";

    /// The migration for the default table, `orionbeacon_members`.
    pub fn new() -> Self {
        Self {
            table: DEFAULT_MEMBER_TABLE.to_owned(),
            name: Self::NAME.to_owned(),
        }
    }

    /// The migration for a custom membership table (validated: ASCII letters, digits and
    /// `_`), the one [`CreateMemberTable::with_table`](crate::CreateMemberTable::with_table)
    /// made. Its migration name is `m20261207_000001_add_orionbeacon_members_rank_<table>`.
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

    fn add_statement(&self) -> TableAlterStatement {
        Table::alter()
            .table(Alias::new(&self.table))
            .add_column(
                ColumnDef::new(Column::CandidateRank)
                    .big_integer()
                    .null()
                    .to_owned(),
            )
            .to_owned()
    }

    fn drop_statement(&self) -> TableAlterStatement {
        Table::alter()
            .table(Alias::new(&self.table))
            .drop_column(Column::CandidateRank)
            .to_owned()
    }
}

impl Default for AddMemberRank {
    fn default() -> Self {
        Self::new()
    }
}

impl MigrationName for AddMemberRank {
    fn name(&self) -> &str {
        &self.name
    }
}

#[async_trait::async_trait]
impl MigrationTrait for AddMemberRank {
    /// In a transaction on every backend, as [`CreateLeaseTable`](crate::CreateLeaseTable)'s
    /// (MySQL still commits its `ALTER TABLE` on its own).
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    /// Adds the column. A table that already has it is taken over when orion-beacon's own
    /// migrator (the command line) added it, and refused otherwise (its shape is unknown).
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if !table_exists(manager, &self.table).await? {
            return Err(DbErr::Migration(format!(
                "the membership table {} does not exist: run CreateMemberTable (for it) before \
                 AddMemberRank",
                self.table
            )));
        }
        let conn = manager.get_connection();
        if column_exists(conn, &self.table, COLUMN).await? {
            let applied = applied_through(manager, &self.name).await?;
            if take_over_from_own(manager, &applied, &self.name, &self.table).await? {
                return Ok(());
            }
            let how = if applied.is_empty() {
                "no migrator records it (added by hand, or by an interrupted run): drop it and \
                 run `up` again"
                    .to_owned()
            } else {
                format!("recorded in {}", applied.join(" and "))
            };
            return Err(DbErr::Migration(format!(
                "the membership table {} already has the column candidate_rank: {how}. Apply \
                 AddMemberRank through exactly one migrator.",
                self.table
            )));
        }
        let backend = manager.get_database_backend();
        bounded_ddl(conn, backend.build(&self.add_statement())).await
    }

    /// Removes the column; the members stay (a ranked elector's store refuses the table from
    /// its next candidate heartbeat on).
    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if !table_exists(manager, &self.table).await? {
            return Ok(());
        }
        let conn = manager.get_connection();
        if column_exists(conn, &self.table, COLUMN).await? {
            let backend = manager.get_database_backend();
            bounded_ddl(conn, backend.build(&self.drop_statement())).await?;
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
            AddMemberRank::new().name(),
            "m20261207_000001_add_orionbeacon_members_rank"
        );
        assert_eq!(
            AddMemberRank::with_table("shard_members").unwrap().name(),
            "m20261207_000001_add_orionbeacon_members_rank_shard_members"
        );
        assert_eq!(
            AddMemberRank::with_table(DEFAULT_MEMBER_TABLE)
                .unwrap()
                .name(),
            AddMemberRank::NAME
        );
        assert!(AddMemberRank::with_table("x; DROP TABLE y").is_err());
    }

    #[test]
    fn ddl_per_backend() {
        let m = AddMemberRank::new();
        assert_eq!(
            m.add_statement().to_string(PostgresQueryBuilder),
            r#"ALTER TABLE "orionbeacon_members" ADD COLUMN "candidate_rank" bigint NULL"#
        );
        assert_eq!(
            m.add_statement().to_string(MysqlQueryBuilder),
            "ALTER TABLE `orionbeacon_members` ADD COLUMN `candidate_rank` bigint NULL"
        );
        assert_eq!(
            m.add_statement().to_string(SqliteQueryBuilder),
            r#"ALTER TABLE "orionbeacon_members" ADD COLUMN "candidate_rank" integer NULL"#
        );
        assert_eq!(
            m.drop_statement().to_string(PostgresQueryBuilder),
            r#"ALTER TABLE "orionbeacon_members" DROP COLUMN "candidate_rank""#
        );
    }
}
