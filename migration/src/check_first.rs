//! A migrator whose `down`, `reset` and `refresh` ask every step's refusal before any runs.

use sea_orm_migration::prelude::*;
use sea_orm_migration::{IntoSchemaManagerConnection, MigratorTraitSelf};

use crate::check_down;

/// Your `Migrator`, with [`check_down`] asked before every `down`, `reset` and `refresh`, so a
/// `sea-orm-cli migrate down -n 2` that one of orion-beacon's steps refuses rolls back nothing
/// rather than the steps before the refusal. Everything else (`up`, `status`, `fresh`, the
/// tracking table) is your migrator's own.
///
/// Use it in your migration crate's `main.rs`, where `sea-orm-cli` runs your migrator:
///
/// ```no_run
/// # use orion_beacon_migration::{CreateLeaseTable, MigrationTrait, MigratorTrait};
/// # pub struct Migrator;
/// # #[orion_beacon_migration::async_trait::async_trait]
/// # impl MigratorTrait for Migrator {
/// #     fn migrations() -> Vec<Box<dyn MigrationTrait>> { vec![Box::new(CreateLeaseTable::new())] }
/// # }
/// # async fn run_cli(_: impl orion_beacon_migration::MigratorTraitSelf) {}
/// # async fn main_() {
/// // migration/src/main.rs, in place of `cli::run_cli(migration::Migrator).await;`:
/// run_cli(orion_beacon_migration::CheckDown(Migrator)).await;
/// // (`run_cli` is `sea_orm_migration::cli::run_cli`, from sea-orm-migration's `cli` feature.)
/// # }
/// ```
///
/// The check only reads, and a writer racing it (an elector that starts between the check and
/// the step) is still refused by the step itself. `fresh` drops every table by design and is
/// not checked. On MySQL and MariaDB each DDL statement commits on its own, so the check is
/// the only way a `down` of several steps can refuse as a whole there; on PostgreSQL and SQLite
/// each step is a transaction, and the check makes the whole `down` one decision.
#[derive(Debug, Clone, Copy, Default)]
pub struct CheckDown<M>(pub M);

#[async_trait::async_trait]
impl<M> MigratorTraitSelf for CheckDown<M>
where
    M: MigratorTrait + Sync,
{
    fn migrations(&self) -> Vec<Box<dyn MigrationTrait>> {
        M::migrations()
    }

    fn migration_table_name(&self) -> DynIden {
        M::migration_table_name()
    }

    async fn refresh<'c, C>(&self, db: C) -> Result<(), DbErr>
    where
        C: IntoSchemaManagerConnection<'c>,
    {
        let db = db.into_database_executor();
        check_down::<M, _>(&db, None).await?;
        M::refresh(db).await
    }

    async fn reset<'c, C>(&self, db: C) -> Result<(), DbErr>
    where
        C: IntoSchemaManagerConnection<'c>,
    {
        let db = db.into_database_executor();
        check_down::<M, _>(&db, None).await?;
        M::reset(db).await
    }

    async fn down<'c, C>(&self, db: C, steps: Option<u32>) -> Result<(), DbErr>
    where
        C: IntoSchemaManagerConnection<'c>,
    {
        let db = db.into_database_executor();
        check_down::<M, _>(&db, steps).await?;
        M::down(db, steps).await
    }
}
