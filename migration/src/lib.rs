//! The versioned migrations that create the orion-beacon tables: the lease table
//! ([`CreateLeaseTable`]), for shard sets the membership table ([`CreateMemberTable`]), and
//! for rate limits the rate-limit table ([`CreateRateLimitTable`]).
//!
//! Add them to your application's own `Migrator` in one line, [`migrations`] (every step, in
//! order, for the default tables; `sea-orm-cli migrate up` then runs them with your own
//! migrations), so no step can be left out or put out of order:
//!
//! ```
//! use sea_orm_migration::prelude::*;
//!
//! pub struct AppMigrator;
//!
//! #[async_trait::async_trait]
//! impl MigratorTrait for AppMigrator {
//!     fn migrations() -> Vec<Box<dyn MigrationTrait>> {
//!         let mut steps: Vec<Box<dyn MigrationTrait>> = vec![
//!             // ... the application's own migrations ...
//!         ];
//!         steps.extend(orion_beacon_migration::migrations());
//!         steps
//!     }
//! }
//! ```
//!
//! Tables of other names take the steps one by one, in the same order, each
//! `with_table(...)`: [`CreateLeaseTable`], [`CreateMemberTable`], [`AddLeasePayload`],
//! [`CreateJobRunTable`], [`AddMemberHolding`], [`CreateRateLimitTable`],
//! [`AddMemberRank`], [`AddJobRunKey`], [`CreateJobAttemptTable`].
//!
//! An application without a sea-orm-migration `Migrator` can run ours instead, with the
//! `orion-beacon-migration` command line (feature `cli`: `up`, `down`, `status`). It keeps its
//! own tracking table, [`TRACKING_TABLE`], apart from the application's `seaql_migrations`. A
//! database it migrated moves to the application's `Migrator` by itself: that migrator's `up`
//! finds the table recorded only in [`TRACKING_TABLE`], takes the record over and keeps every
//! row and token (each migration moves on its own, so a `Migrator` that carries only
//! `CreateLeaseTable` leaves the membership table to the command line). Any other table that
//! already exists is refused by `up`, which says which path recorded it, if any.
//!
//! `down` refuses a lease table that still holds rows (their tokens protect fenced rows) and a
//! membership table in which a node is live. sea-orm-migration commits each migration of a
//! `down` on its own, so a `down -n 2` refused at the lease table has already dropped the
//! membership table (`up` brings it back). [`CheckDown`] around your migrator (in your migration
//! crate's `main.rs`: `cli::run_cli(CheckDown(Migrator))`) asks every step's refusal first and
//! refuses the whole `down`, as the command line's `down` does; [`check_down`] is that check on
//! its own.
//!
//! The default features are empty (no command line, no driver): the migrations run on the
//! drivers of the application's own sea-orm. The command line's drivers are features named as
//! orion-beacon's: `postgres`, `mysql`, `sqlite`, `tls-rustls`.
//!
//! The migrations' names are fixed forever ([`CreateLeaseTable::NAME`],
//! [`CreateMemberTable::NAME`]), so moving files around never makes them run twice. Custom
//! table names: [`CreateLeaseTable::with_table`]; the migration name carries the table name.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub use sea_orm_migration::prelude::*;

mod check_down;
mod check_first;
mod m20261129_000001_create_leases;
mod m20261201_000001_create_members;
mod m20261203_000001_add_lease_payload;
mod m20261204_000001_create_job_runs;
mod m20261205_000001_add_member_holding;
mod m20261206_000001_create_rate_limits;
mod m20261207_000001_add_member_rank;
mod m20261207_000002_add_job_run_key;
mod m20261208_000001_create_job_attempts;

pub use check_down::check_down;
pub use check_first::CheckDown;
pub use sea_orm_migration::MigratorTraitSelf;

pub use m20261129_000001_create_leases::CreateLeaseTable;
pub use m20261201_000001_create_members::CreateMemberTable;
pub use m20261203_000001_add_lease_payload::AddLeasePayload;
pub use m20261204_000001_create_job_runs::CreateJobRunTable;
pub use m20261205_000001_add_member_holding::AddMemberHolding;
pub use m20261206_000001_create_rate_limits::CreateRateLimitTable;
pub use m20261207_000001_add_member_rank::AddMemberRank;
pub use m20261207_000002_add_job_run_key::AddJobRunKey;
pub use m20261208_000001_create_job_attempts::CreateJobAttemptTable;
pub use orion_beacon_entity::{
    job_attempt_table, validate_table_name, TableNameError, DEFAULT_JOB_ATTEMPT_TABLE,
    DEFAULT_JOB_RUN_TABLE, DEFAULT_MEMBER_TABLE, DEFAULT_RATE_LIMIT_TABLE, DEFAULT_TABLE,
};

/// The tracking table of our own [`Migrator`]: separate from the application's.
pub const TRACKING_TABLE: &str = "seaql_migrations_orionbeacon";

/// orion-beacon's own migrator, for the binary in this crate (feature `cli`). It creates the
/// default tables: the lease table (`orionbeacon_leases`), then the membership table of shard
/// sets (`orionbeacon_members`), the payload columns and the run records of scheduled jobs
/// (`orionbeacon_job_runs`) and the members' counts, each its own versioned migration.
pub struct Migrator;

/// Every migration of orion-beacon's default tables, in the order they must run: the lease
/// table, the membership table of shard sets, the lease payload columns, the run records of
/// scheduled jobs and the members' counts, then the later steps (rate limits, ranks, keys, the
/// jobs' attempt history). Append them to your `Migrator`'s list
/// (`steps.extend(orion_beacon_migration::migrations())`); a table an app does not use costs an
/// empty table, and a step added in a later version comes with the upgrade.
pub fn migrations() -> Vec<Box<dyn MigrationTrait>> {
    vec![
        Box::new(CreateLeaseTable::new()),
        Box::new(CreateMemberTable::new()),
        Box::new(AddLeasePayload::new()),
        Box::new(CreateJobRunTable::new()),
        Box::new(AddMemberHolding::new()),
        Box::new(CreateRateLimitTable::new()),
        Box::new(AddMemberRank::new()),
        Box::new(AddJobRunKey::new()),
        Box::new(CreateJobAttemptTable::new()),
    ]
}

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        migrations()
    }

    fn migration_table_name() -> DynIden {
        Alias::new(TRACKING_TABLE).into_iden()
    }
}
