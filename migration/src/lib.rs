//! The versioned migrations that create the orion-beacon tables: the lease table
//! ([`CreateLeaseTable`]) and the membership table of shard sets ([`CreateMemberTable`]).
//!
//! Two ways in:
//!
//! 1. Run our own [`Migrator`] (what the `orion-beacon-migration up -u URL` command line of
//!    the `cli` feature does). It keeps its own tracking table, [`TRACKING_TABLE`], so it
//!    never collides with the application's `seaql_migrations`.
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
//!             // only for shard sets (many resources spread over nodes):
//!             Box::new(orion_beacon_migration::CreateMemberTable::new()),
//!         ]
//!     }
//! }
//! ```
//!
//! Choose exactly one path per database: `up` refuses a lease table that already exists
//! (applied through the other path, made by hand, or left by an interrupted run), saying which
//! path recorded it, if any, and
//! `down` refuses a table that still holds leases.
//!
//! The default features are empty (no command line, no driver): the migration runs on the
//! drivers of the application's own sea-orm. Features, named as sea-orm-migration's: `cli`
//! (the `orion-beacon-migration` binary), `sqlx-postgres`, `sqlx-mysql`, `sqlx-sqlite`,
//! `runtime-tokio-rustls`.
//!
//! The migration's name is fixed forever ([`CreateLeaseTable::NAME`]), so moving files around
//! never makes it run twice. A custom table name is supported with
//! [`CreateLeaseTable::with_table`]; its migration name carries the table name.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub use sea_orm_migration::prelude::*;

mod m20261129_000001_create_leases;
mod m20261201_000001_create_members;

pub use m20261129_000001_create_leases::CreateLeaseTable;
pub use m20261201_000001_create_members::CreateMemberTable;
pub use orion_beacon_entity::{
    validate_table_name, TableNameError, DEFAULT_MEMBER_TABLE, DEFAULT_TABLE,
};

/// The tracking table of our own [`Migrator`]: separate from the application's.
pub const TRACKING_TABLE: &str = "seaql_migrations_orionbeacon";

/// orion-beacon's own migrator, for the binary in this crate (feature `cli`). It creates the
/// default tables: the lease table (`orionbeacon_leases`), then the membership table of shard
/// sets (`orionbeacon_members`), each its own versioned migration.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(CreateLeaseTable::new()),
            Box::new(CreateMemberTable::new()),
        ]
    }

    fn migration_table_name() -> DynIden {
        Alias::new(TRACKING_TABLE).into_iden()
    }
}
