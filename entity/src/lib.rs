//! The orion-beacon lease row as a SeaORM entity.
//!
//! Every resource that orion-beacon elects a leader for is one row of the lease table
//! (`orionbeacon_leases` unless configured otherwise). The row is written only by the
//! `orion-beacon` store's atomic statements; this crate lets anyone *read* it with plain SeaORM:
//!
//! ```no_run
//! use orion_beacon_entity::lease;
//! use sea_orm::{DatabaseConnection, EntityTrait};
//!
//! # async fn who_leads(db: &DatabaseConnection) -> Result<(), sea_orm::DbErr> {
//! if let Some(row) = lease::Entity::find_by_id("nightly-report").one(db).await? {
//!     println!("{} holds term {} until {}", row.holder, row.fencing_token, row.expires_at);
//! }
//! # Ok(()) }
//! ```
//!
//! Nodes that share resources with a shard set heartbeat into the membership table
//! (`orionbeacon_members`), whose rows are [`member::Model`] (with the columns of the
//! `AddMemberHolding` migration).
//!
//! Scheduled jobs record each slot they run in the job-run table (`orionbeacon_job_runs`),
//! whose rows are [`job_run::Model`]; the attempts before a slot's latest are kept in the
//! attempt-history table (`orionbeacon_job_runs_attempts`), whose rows are [`job_attempt::Model`].
//!
//! Rate limits keep one row per key in the rate-limit table (`orionbeacon_rate_limits`),
//! whose rows are [`rate_limit::Model`].
//!
//! Whether a lease is *live* must be judged against the database clock (compare `expires_at`
//! with the database's `now`), never against the reader's wall clock.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod job_attempt;
pub mod job_run;
pub mod lease;
pub mod member;
pub mod rate_limit;
mod table;

pub use table::{
    job_attempt_table, validate_table_name, TableNameError, DEFAULT_JOB_ATTEMPT_TABLE,
    DEFAULT_JOB_RUN_TABLE, DEFAULT_MEMBER_TABLE, DEFAULT_RATE_LIMIT_TABLE, DEFAULT_TABLE,
    MAX_TABLE_NAME_LEN,
};
