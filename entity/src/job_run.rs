//! The run record of a scheduled job: one per (job, slot) that a leader claimed, skipped or
//! that an operator marked.
#![allow(missing_docs)] // the derive macros generate the Column/ActiveModel items

use sea_orm::entity::prelude::*;

/// One run record. The table name here is the default (`orionbeacon_job_runs`).
///
/// A slot is finished exactly when `state` is `finished`: the mark is written in the same
/// fenced transaction as the job's own writes, by the term whose token is `finished_token`.
/// Times are the database clock's; `slot` is the scheduled time in milliseconds since the Unix
/// epoch (UTC), computed from the database clock.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "orionbeacon_job_runs")]
pub struct Model {
    /// The job's name (the first half of the primary key).
    #[sea_orm(
        primary_key,
        auto_increment = false,
        column_type = "String(StringLen::N(255))"
    )]
    pub job: String,
    /// The slot: its scheduled time, in milliseconds since the Unix epoch (UTC).
    #[sea_orm(primary_key, auto_increment = false)]
    pub slot: i64,
    /// `running`, `finished`, `failed` (to be retried), `given_up`, `skipped`, `rerun`
    /// (marked by an operator to run again), `queued` (a keyed job's key, submitted) or
    /// `claimed` (with spread runs: claimed by the leader, not yet taken by a node's runner).
    #[sea_orm(column_type = "String(StringLen::N(16))")]
    pub state: String,
    /// Attempts claimed so far.
    pub attempts: i32,
    /// The schedule the slot was computed from, as the job states it.
    #[sea_orm(column_type = "String(StringLen::N(255))")]
    pub schedule: String,
    /// The token of the term that claimed the latest attempt (or decided the skip); with spread
    /// runs, once a node's runner took it, its run hold's token.
    #[sea_orm(nullable)]
    pub claimed_token: Option<i64>,
    /// The candidate that claimed the latest attempt; with spread runs, once a node's runner
    /// took it, its run hold's holder (`<node>/<instance>-<n>`).
    #[sea_orm(column_type = "String(StringLen::N(255))", nullable)]
    pub claimed_by: Option<String>,
    /// When the latest attempt was claimed (database clock).
    #[sea_orm(nullable)]
    pub claimed_at: Option<DateTimeUtc>,
    /// The token of the term that finished the slot (or failed its latest attempt).
    #[sea_orm(nullable)]
    pub finished_token: Option<i64>,
    /// When the latest attempt ended (database clock).
    #[sea_orm(nullable)]
    pub finished_at: Option<DateTimeUtc>,
    /// How long the latest attempt took, in milliseconds (the runner's monotonic clock).
    #[sea_orm(nullable)]
    pub duration_ms: Option<i64>,
    /// The latest failed attempt's error (up to 1,024 bytes).
    #[sea_orm(column_type = "String(StringLen::N(1024))", nullable)]
    pub error: Option<String>,
    /// A keyed job's key (`JobsHandle::submit`), NULL for a scheduled slot; `slot` is then
    /// the key's digest, not a time. Added by the `AddJobRunKey` migration.
    #[sea_orm(column_type = "String(StringLen::N(255))", nullable)]
    pub run_key: Option<String>,
}

/// The run table has no relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
