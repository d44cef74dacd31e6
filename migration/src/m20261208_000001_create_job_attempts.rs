use orion_beacon_entity::job_attempt::Column;
use orion_beacon_entity::{
    job_attempt_table, validate_table_name, TableNameError, DEFAULT_JOB_RUN_TABLE,
};
use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

use crate::m20261129_000001_create_leases::{
    applied_through, name_column, table_exists, take_over_from_own,
};
use crate::m20261204_000001_create_job_runs::{text_of, time_of};

/// Creates the attempt-history table of a job-run table: `<runs>_attempts`
/// ([`job_attempt_table`](crate::job_attempt_table)), `orionbeacon_job_runs_attempts` for the
/// default `orionbeacon_job_runs`. Run it after
/// [`CreateJobRunTable`](crate::CreateJobRunTable).
///
/// One row per earlier attempt of a slot, written in the fenced transaction that claims the
/// slot's next attempt; the latest attempt stays the run record. Columns: `job`, `slot` and
/// `attempt` are the primary key; `state`, `claimed_token`, `claimed_by`, `claimed_at`,
/// `finished_token`, `finished_at`, `duration_ms`, `error` (as the run record's), and
/// `recorded_at`. Rows go after their run record when ended records are pruned (best effort, in
/// a transaction of their own).
///
/// Only the history needs it: until it has run, a scheduler keeps just the latest attempt of
/// each slot, as before, says so in its log and asks again each minute. `down` (one step) drops it:
/// it is a history, nothing a job's exactly-once rests on.
#[derive(Debug, Clone)]
pub struct CreateJobAttemptTable {
    runs: String,
    table: String,
    name: String,
}

impl CreateJobAttemptTable {
    /// The migration name for the default tables. It never changes.
    pub const NAME: &'static str = "m20261208_000001_create_orionbeacon_job_attempts";

    /// The migration for the default run table's history, `orionbeacon_job_runs_attempts`.
    pub fn new() -> Self {
        Self {
            runs: DEFAULT_JOB_RUN_TABLE.to_owned(),
            table: job_attempt_table(DEFAULT_JOB_RUN_TABLE),
            name: Self::NAME.to_owned(),
        }
    }

    /// The migration for the history of a custom job-run table (validated: ASCII letters,
    /// digits and `_`), the one
    /// [`CreateJobRunTable::with_table`](crate::CreateJobRunTable::with_table) made. Its
    /// migration name is `m20261208_000001_create_orionbeacon_job_attempts_<runs>`.
    pub fn with_table(runs: impl Into<String>) -> Result<Self, TableNameError> {
        let runs = runs.into();
        validate_table_name(&runs)?;
        if runs == DEFAULT_JOB_RUN_TABLE {
            return Ok(Self::new());
        }
        let name = format!("{}_{runs}", Self::NAME);
        let table = job_attempt_table(&runs);
        Ok(Self { runs, table, name })
    }

    /// The job-run table whose history this is.
    pub fn runs_table(&self) -> &str {
        &self.runs
    }

    /// The table this migration creates.
    pub fn table(&self) -> &str {
        &self.table
    }

    fn create_statement(&self, backend: DbBackend) -> TableCreateStatement {
        // As the run table's columns (see `CreateJobRunTable`).
        let ts = |col: Column| time_of(backend, col);
        let text = |col: Column, len: u32| text_of(backend, col, len);
        Table::create()
            .table(Alias::new(&self.table))
            .col(name_column(backend, Column::Job))
            .col(ColumnDef::new(Column::Slot).big_integer().not_null())
            .col(ColumnDef::new(Column::Attempt).integer().not_null())
            .col(text(Column::State, 16).not_null())
            .col(ColumnDef::new(Column::ClaimedToken).big_integer().null())
            .col(text(Column::ClaimedBy, 255).null())
            .col(ts(Column::ClaimedAt).null())
            .col(ColumnDef::new(Column::FinishedToken).big_integer().null())
            .col(ts(Column::FinishedAt).null())
            .col(ColumnDef::new(Column::DurationMs).big_integer().null())
            .col(text(Column::Error, 1024).null())
            .col(ts(Column::RecordedAt).not_null())
            .primary_key(
                Index::create()
                    .col(Column::Job)
                    .col(Column::Slot)
                    .col(Column::Attempt),
            )
            .to_owned()
    }
}

impl Default for CreateJobAttemptTable {
    fn default() -> Self {
        Self::new()
    }
}

impl MigrationName for CreateJobAttemptTable {
    fn name(&self) -> &str {
        &self.name
    }
}

#[async_trait::async_trait]
impl MigrationTrait for CreateJobAttemptTable {
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
                "the job-attempt table {} already exists: {how}. Apply CreateJobAttemptTable \
                 through exactly one migrator.",
                self.table
            )));
        }
        let backend = manager.get_database_backend();
        manager.create_table(self.create_statement(backend)).await
    }

    /// Drops the table (the earlier attempts' history goes with it; the run records keep each
    /// slot's latest).
    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if !table_exists(manager, &self.table).await? {
            return Ok(());
        }
        manager
            .drop_table(Table::drop().table(Alias::new(&self.table)).to_owned())
            .await
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
        let m = CreateJobAttemptTable::new();
        assert_eq!(m.name(), "m20261208_000001_create_orionbeacon_job_attempts");
        assert_eq!(m.table(), "orionbeacon_job_runs_attempts");
        let custom = CreateJobAttemptTable::with_table("runs").unwrap();
        assert_eq!(
            custom.name(),
            "m20261208_000001_create_orionbeacon_job_attempts_runs"
        );
        assert_eq!(custom.table(), "runs_attempts");
        assert!(CreateJobAttemptTable::with_table("x; DROP TABLE y").is_err());
    }

    #[test]
    fn ddl_per_backend() {
        let m = CreateJobAttemptTable::new();
        assert_eq!(
            m.create_statement(DbBackend::Postgres)
                .to_string(PostgresQueryBuilder),
            r#"CREATE TABLE "orionbeacon_job_runs_attempts" ( "job" varchar(255) NOT NULL, "slot" bigint NOT NULL, "attempt" integer NOT NULL, "state" varchar(16) NOT NULL, "claimed_token" bigint NULL, "claimed_by" varchar(255) NULL, "claimed_at" timestamp with time zone NULL, "finished_token" bigint NULL, "finished_at" timestamp with time zone NULL, "duration_ms" bigint NULL, "error" varchar(1024) NULL, "recorded_at" timestamp with time zone NOT NULL, PRIMARY KEY ("job", "slot", "attempt") )"#
        );
        assert_eq!(
            m.create_statement(DbBackend::Sqlite)
                .to_string(SqliteQueryBuilder),
            r#"CREATE TABLE "orionbeacon_job_runs_attempts" ( "job" varchar(255) NOT NULL, "slot" integer NOT NULL, "attempt" integer NOT NULL, "state" varchar(16) NOT NULL, "claimed_token" integer NULL, "claimed_by" varchar(255) NULL, "claimed_at" timestamp_with_timezone_text NULL, "finished_token" integer NULL, "finished_at" timestamp_with_timezone_text NULL, "duration_ms" integer NULL, "error" varchar(1024) NULL, "recorded_at" timestamp_with_timezone_text NOT NULL, PRIMARY KEY ("job", "slot", "attempt") )"#
        );
        assert_eq!(
            m.create_statement(DbBackend::MySql).to_string(MysqlQueryBuilder),
            "CREATE TABLE `orionbeacon_job_runs_attempts` ( `job` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, `slot` bigint NOT NULL, `attempt` int NOT NULL, `state` VARCHAR(16) CHARACTER SET utf8mb4 NOT NULL, `claimed_token` bigint NULL, `claimed_by` VARCHAR(255) CHARACTER SET utf8mb4 NULL, `claimed_at` DATETIME(6) NULL, `finished_token` bigint NULL, `finished_at` DATETIME(6) NULL, `duration_ms` bigint NULL, `error` VARCHAR(1024) CHARACTER SET utf8mb4 NULL, `recorded_at` DATETIME(6) NOT NULL, PRIMARY KEY (`job`, `slot`, `attempt`) )"
        );
    }
}
