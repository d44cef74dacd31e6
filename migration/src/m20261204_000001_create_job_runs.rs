use orion_beacon_entity::job_run::Column;
use orion_beacon_entity::{validate_table_name, TableNameError, DEFAULT_JOB_RUN_TABLE};
use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend};

use crate::m20261129_000001_create_leases::{
    applied_through, count_where, name_column, table_exists, take_over_from_own,
};

/// Creates the run-record table of scheduled jobs (`orionbeacon_job_runs` by default): one
/// row per (job, slot) that a leader claimed, skipped or that an operator marked.
///
/// Columns: `job` (up to 255 characters, binary collation on MySQL/MariaDB) and `slot` (the
/// scheduled time in milliseconds since the Unix epoch) are the primary key; `state`,
/// `attempts`, `schedule`, `claimed_token`, `claimed_by`, `claimed_at`, `finished_token`,
/// `finished_at`, `duration_ms`, `error`. Timestamps have the lease table's types and are
/// written by the database clock.
///
/// A later migration of its own: a database with the lease table gets it with `migrate up`,
/// and `down` (one step) removes it again, but not while it holds a finished run (those rows
/// are what keeps a finished slot from running again).
#[derive(Debug, Clone)]
pub struct CreateJobRunTable {
    table: String,
    name: String,
}

impl CreateJobRunTable {
    /// The migration name for the default table. It never changes.
    pub const NAME: &'static str = "m20261204_000001_create_orionbeacon_job_runs";

    /// The migration for the default table, `orionbeacon_job_runs`.
    pub fn new() -> Self {
        Self {
            table: DEFAULT_JOB_RUN_TABLE.to_owned(),
            name: Self::NAME.to_owned(),
        }
    }

    /// The migration for a custom table name (validated: ASCII letters, digits and `_`).
    /// Its migration name is `m20261204_000001_create_orionbeacon_job_runs_<table>`.
    pub fn with_table(table: impl Into<String>) -> Result<Self, TableNameError> {
        let table = table.into();
        validate_table_name(&table)?;
        if table == DEFAULT_JOB_RUN_TABLE {
            return Ok(Self::new());
        }
        let name = format!("{}_{table}", Self::NAME);
        Ok(Self { table, name })
    }

    /// The table this migration creates.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The index the scheduler finds open records by (`state`, then `job`): its look at the
    /// table costs the open records, not every slot ever run.
    fn state_index(&self) -> IndexCreateStatement {
        let mut name = self.table.clone();
        name.truncate(63 - "_state".len());
        Index::create()
            .name(format!("{name}_state"))
            .table(Alias::new(&self.table))
            .col(Column::State)
            .col(Column::Job)
            .to_owned()
    }

    fn create_statement(&self, backend: DbBackend) -> TableCreateStatement {
        let ts = |col: Column| {
            let mut def = time_of(backend, col);
            def.null();
            def
        };
        let text = |col: Column, len: u32| text_of(backend, col, len);
        Table::create()
            .table(Alias::new(&self.table))
            .col(name_column(backend, Column::Job))
            .col(ColumnDef::new(Column::Slot).big_integer().not_null())
            .col(text(Column::State, 16).not_null())
            .col(ColumnDef::new(Column::Attempts).integer().not_null())
            .col(text(Column::Schedule, 255).not_null())
            .col(ColumnDef::new(Column::ClaimedToken).big_integer().null())
            .col(text(Column::ClaimedBy, 255).null())
            .col(ts(Column::ClaimedAt))
            .col(ColumnDef::new(Column::FinishedToken).big_integer().null())
            .col(ts(Column::FinishedAt))
            .col(ColumnDef::new(Column::DurationMs).big_integer().null())
            .col(text(Column::Error, 1024).null())
            .primary_key(Index::create().col(Column::Job).col(Column::Slot))
            .to_owned()
    }
}

impl Default for CreateJobRunTable {
    fn default() -> Self {
        Self::new()
    }
}

impl MigrationName for CreateJobRunTable {
    fn name(&self) -> &str {
        &self.name
    }
}

#[async_trait::async_trait]
impl MigrationTrait for CreateJobRunTable {
    /// In a transaction on every backend, as [`CreateLeaseTable`](crate::CreateLeaseTable)'s.
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    /// Creates the table. One that orion-beacon's own migrator made is taken over, rows kept,
    /// and any other that already exists is refused (its shape is unknown).
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if table_exists(manager, &self.table).await? {
            let applied = applied_through(manager, &self.name).await?;
            if take_over_from_own(manager, &applied, &self.name, &self.table).await? {
                return Ok(());
            }
            let how = if applied.is_empty() {
                "no migrator records it (made by hand, or left by an interrupted run)".to_owned()
            } else {
                format!("recorded in {}", applied.join(" and "))
            };
            return Err(DbErr::Migration(format!(
                "the job-run table {} already exists: {how}. Apply CreateJobRunTable through \
                 exactly one migrator.",
                self.table
            )));
        }
        let backend = manager.get_database_backend();
        manager.create_table(self.create_statement(backend)).await?;
        manager.create_index(self.state_index()).await
    }

    /// Drops the table, but not while it records a finished run: without those rows a finished
    /// slot would run again. Delete them yourself first if that is what you want.
    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if !table_exists(manager, &self.table).await? {
            return Ok(());
        }
        let finished = finished_runs(manager.get_connection(), &self.table).await?;
        if finished > 0 {
            return Err(DbErr::Migration(format!(
                "refusing to drop {table}: it records {finished} finished run(s), which keep \
                 their slots from running again. Delete them first if the jobs may run those \
                 slots again, then run `down` again. Nothing was dropped by this step.",
                table = self.table
            )));
        }
        manager
            .drop_table(Table::drop().table(Alias::new(&self.table)).to_owned())
            .await
    }
}

/// A timestamp column of the run records (and their history), written by the database clock:
/// the lease table's types (nullability left to the caller).
pub(crate) fn time_of(backend: DbBackend, col: impl IntoIden) -> ColumnDef {
    let mut def = ColumnDef::new(col);
    match backend {
        DbBackend::MySql => def.custom(Alias::new("DATETIME(6)")),
        _ => def.timestamp_with_time_zone(),
    };
    def
}

/// A text column of the run records (and their history) of up to `len` characters.
pub(crate) fn text_of(backend: DbBackend, col: impl IntoIden, len: u32) -> ColumnDef {
    let mut def = ColumnDef::new(col);
    match backend {
        // Whatever the server's default character set: holder names and error text are any
        // Unicode.
        DbBackend::MySql => def.custom(Alias::new(format!("VARCHAR({len}) CHARACTER SET utf8mb4"))),
        _ => def.string_len(len),
    };
    def
}

/// The finished runs recorded in `table`.
pub(crate) async fn finished_runs<C: ConnectionTrait>(conn: &C, table: &str) -> Result<i64, DbErr> {
    count_where(conn, table, Some(Expr::col(Column::State).eq("finished"))).await
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
            CreateJobRunTable::new().name(),
            "m20261204_000001_create_orionbeacon_job_runs"
        );
        assert_eq!(
            CreateJobRunTable::with_table("runs").unwrap().name(),
            "m20261204_000001_create_orionbeacon_job_runs_runs"
        );
        assert!(CreateJobRunTable::with_table("x; DROP TABLE y").is_err());
    }

    #[test]
    fn the_state_index() {
        assert_eq!(
            CreateJobRunTable::new()
                .state_index()
                .to_string(PostgresQueryBuilder),
            r#"CREATE INDEX "orionbeacon_job_runs_state" ON "orionbeacon_job_runs" ("state", "job")"#
        );
    }

    #[test]
    fn ddl_per_backend() {
        let m = CreateJobRunTable::new();
        assert_eq!(
            m.create_statement(DbBackend::Postgres)
                .to_string(PostgresQueryBuilder),
            r#"CREATE TABLE "orionbeacon_job_runs" ( "job" varchar(255) NOT NULL, "slot" bigint NOT NULL, "state" varchar(16) NOT NULL, "attempts" integer NOT NULL, "schedule" varchar(255) NOT NULL, "claimed_token" bigint NULL, "claimed_by" varchar(255) NULL, "claimed_at" timestamp with time zone NULL, "finished_token" bigint NULL, "finished_at" timestamp with time zone NULL, "duration_ms" bigint NULL, "error" varchar(1024) NULL, PRIMARY KEY ("job", "slot") )"#
        );
        assert_eq!(
            m.create_statement(DbBackend::Sqlite)
                .to_string(SqliteQueryBuilder),
            r#"CREATE TABLE "orionbeacon_job_runs" ( "job" varchar(255) NOT NULL, "slot" integer NOT NULL, "state" varchar(16) NOT NULL, "attempts" integer NOT NULL, "schedule" varchar(255) NOT NULL, "claimed_token" integer NULL, "claimed_by" varchar(255) NULL, "claimed_at" timestamp_with_timezone_text NULL, "finished_token" integer NULL, "finished_at" timestamp_with_timezone_text NULL, "duration_ms" integer NULL, "error" varchar(1024) NULL, PRIMARY KEY ("job", "slot") )"#
        );
        assert_eq!(
            m.create_statement(DbBackend::MySql).to_string(MysqlQueryBuilder),
            "CREATE TABLE `orionbeacon_job_runs` ( `job` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, `slot` bigint NOT NULL, `state` VARCHAR(16) CHARACTER SET utf8mb4 NOT NULL, `attempts` int NOT NULL, `schedule` VARCHAR(255) CHARACTER SET utf8mb4 NOT NULL, `claimed_token` bigint NULL, `claimed_by` VARCHAR(255) CHARACTER SET utf8mb4 NULL, `claimed_at` DATETIME(6) NULL, `finished_token` bigint NULL, `finished_at` DATETIME(6) NULL, `duration_ms` bigint NULL, `error` VARCHAR(1024) CHARACTER SET utf8mb4 NULL, PRIMARY KEY (`job`, `slot`) )"
        );
    }
}
