use orion_beacon_entity::job_run::Column;
use orion_beacon_entity::{validate_table_name, TableNameError, DEFAULT_JOB_RUN_TABLE};
use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend};

use crate::m20261129_000001_create_leases::{
    applied_through, count_where, table_exists, take_over_from_own,
};
use crate::m20261203_000001_add_lease_payload::{bounded_ddl, column_exists};

/// Adds one column to an existing job-run table (`orionbeacon_job_runs` by default), in place:
/// `run_key` (up to 255 characters, nullable), the key of a keyed job's record
/// (`Job::keyed`, `JobsHandle::submit`); scheduled slots leave it NULL. Run it after
/// [`CreateJobRunTable`](crate::CreateJobRunTable).
///
/// Only keyed jobs need it: until it has run, a submit is refused, and a scheduler with a keyed
/// job fails its looks, with `StoreError::OutdatedSchema` naming this step; schedulers without
/// keyed jobs go on as before.
///
/// `down` (one step) removes the column, and is refused while a record carries a key: those
/// records are what keeps each key from running twice, and without their keys queued ones
/// would never run. Delete a retired keyed job's records first.
#[derive(Debug, Clone)]
pub struct AddJobRunKey {
    table: String,
    name: String,
}

/// The column this step adds.
const COLUMN: &str = "run_key";

impl AddJobRunKey {
    /// The migration name for the default table. It never changes.
    pub const NAME: &'static str = "m20261207_000002_add_orionbeacon_job_runs_key";

    /// The migration for the default table, `orionbeacon_job_runs`.
    pub fn new() -> Self {
        Self {
            table: DEFAULT_JOB_RUN_TABLE.to_owned(),
            name: Self::NAME.to_owned(),
        }
    }

    /// The migration for a custom job-run table (validated: ASCII letters, digits and `_`),
    /// the one [`CreateJobRunTable::with_table`](crate::CreateJobRunTable::with_table) made. Its migration name is `m20261207_000002_add_orionbeacon_job_runs_key_<table>`.
    pub fn with_table(table: impl Into<String>) -> Result<Self, TableNameError> {
        let table = table.into();
        validate_table_name(&table)?;
        if table == DEFAULT_JOB_RUN_TABLE {
            return Ok(Self::new());
        }
        let name = format!("{}_{table}", Self::NAME);
        Ok(Self { table, name })
    }

    /// The job-run table this migration changes.
    pub fn table(&self) -> &str {
        &self.table
    }

    fn add_statement(&self, backend: DbBackend) -> TableAlterStatement {
        let mut key = ColumnDef::new(Column::RunKey);
        match backend {
            // As the table's other text (see `CreateJobRunTable`): any Unicode.
            DbBackend::MySql => key.custom(Alias::new("VARCHAR(255) CHARACTER SET utf8mb4")),
            _ => key.string_len(255),
        };
        key.null();
        Table::alter()
            .table(Alias::new(&self.table))
            .add_column(key)
            .to_owned()
    }

    fn drop_statement(&self) -> TableAlterStatement {
        Table::alter()
            .table(Alias::new(&self.table))
            .drop_column(Column::RunKey)
            .to_owned()
    }
}

impl Default for AddJobRunKey {
    fn default() -> Self {
        Self::new()
    }
}

impl MigrationName for AddJobRunKey {
    fn name(&self) -> &str {
        &self.name
    }
}

#[async_trait::async_trait]
impl MigrationTrait for AddJobRunKey {
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
                "the job-run table {} does not exist: run CreateJobRunTable (for it) before \
                 AddJobRunKey",
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
                "the job-run table {} already has the column run_key: {how}. Apply \
                 AddJobRunKey through exactly one migrator.",
                self.table
            )));
        }
        let backend = manager.get_database_backend();
        bounded_ddl(conn, backend.build(&self.add_statement(backend))).await
    }

    /// Removes the column, unless a record carries a key (see the type's documentation).
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
        if column_exists(conn, &self.table, COLUMN).await? {
            let backend = manager.get_database_backend();
            bounded_ddl(conn, backend.build(&self.drop_statement())).await?;
        }
        Ok(())
    }
}

/// Why `down` must not drop the key column of `table` now, if it must not: records carry keys.
pub(crate) async fn refusal<C: ConnectionTrait>(
    conn: &C,
    table: &str,
) -> Result<Option<String>, DbErr> {
    if !column_exists(conn, table, COLUMN).await? {
        return Ok(None);
    }
    let keyed = count_where(conn, table, Some(Expr::col(Column::RunKey).is_not_null())).await?;
    Ok((keyed > 0).then(|| {
        format!(
            "refusing to drop the key column of {table}: {keyed} record(s) carry a keyed job's \
             key, which keeps each key from running twice (and a queued key without it would \
             never run). Delete the records of keyed jobs you retired first, then run `down` \
             again."
        )
    }))
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
            AddJobRunKey::new().name(),
            "m20261207_000002_add_orionbeacon_job_runs_key"
        );
        assert_eq!(
            AddJobRunKey::with_table("job_runs_b").unwrap().name(),
            "m20261207_000002_add_orionbeacon_job_runs_key_job_runs_b"
        );
        assert_eq!(
            AddJobRunKey::with_table(DEFAULT_JOB_RUN_TABLE)
                .unwrap()
                .name(),
            AddJobRunKey::NAME
        );
        assert!(AddJobRunKey::with_table("x; DROP TABLE y").is_err());
    }

    #[test]
    fn ddl_per_backend() {
        let m = AddJobRunKey::new();
        assert_eq!(
            m.add_statement(DbBackend::Postgres)
                .to_string(PostgresQueryBuilder),
            r#"ALTER TABLE "orionbeacon_job_runs" ADD COLUMN "run_key" varchar(255) NULL"#
        );
        assert_eq!(
            m.add_statement(DbBackend::MySql).to_string(MysqlQueryBuilder),
            "ALTER TABLE `orionbeacon_job_runs` ADD COLUMN `run_key` VARCHAR(255) CHARACTER SET utf8mb4 NULL"
        );
        assert_eq!(
            m.add_statement(DbBackend::Sqlite)
                .to_string(SqliteQueryBuilder),
            r#"ALTER TABLE "orionbeacon_job_runs" ADD COLUMN "run_key" varchar(255) NULL"#
        );
        assert_eq!(
            m.drop_statement().to_string(PostgresQueryBuilder),
            r#"ALTER TABLE "orionbeacon_job_runs" DROP COLUMN "run_key""#
        );
    }
}
