//! The versioned migration that creates the orion-beacon lease table.
//!
//! Two ways in:
//!
//! 1. Run our own [`Migrator`] (what `sea-orm-cli migrate up -d migration` and
//!    `cargo run -p orion-beacon-migration -- up -u URL` do). It keeps its own tracking table,
//!    [`TRACKING_TABLE`], so it never collides with the application's `seaql_migrations`.
//! 2. Add [`CreateLeaseTable`] to the application's own `Migrator::migrations()`:
//!
//! ```
//! use orion_beacon_migration::CreateLeaseTable;
//! use sea_orm_migration::prelude::*;
//!
//! pub struct AppMigrator;
//!
//! #[async_trait::async_trait]
//! impl MigratorTrait for AppMigrator {
//!     fn migrations() -> Vec<Box<dyn MigrationTrait>> {
//!         vec![
//!             // ... the application's own migrations ...
//!             Box::new(CreateLeaseTable::new()),
//!         ]
//!     }
//! }
//! ```
//!
//! The migration's name is fixed forever ([`CreateLeaseTable::NAME`]), so moving files around
//! never makes it run twice. A custom table name is supported with
//! [`CreateLeaseTable::with_table`]; its migration name carries the table name.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub use sea_orm_migration::prelude::*;

mod m20261129_000001_create_leases;

pub use m20261129_000001_create_leases::CreateLeaseTable;
pub use orion_beacon_entity::{validate_table_name, TableNameError, DEFAULT_TABLE};

/// The tracking table of our own [`Migrator`]: separate from the application's.
pub const TRACKING_TABLE: &str = "seaql_migrations_orionbeacon";

/// orion-beacon's own migrator, for `sea-orm-cli migrate -d migration` and the binary in this
/// crate. It creates the default table (`orionbeacon_leases`).
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![Box::new(CreateLeaseTable::new())]
    }

    fn migration_table_name() -> DynIden {
        Alias::new(TRACKING_TABLE).into_iden()
    }
}
