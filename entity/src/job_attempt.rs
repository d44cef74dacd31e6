//! An earlier attempt of a job's slot: the attempt-history table keeps every attempt but the
//! latest, which is the run record itself ([`crate::job_run`]).
#![allow(missing_docs)] // the derive macros generate the Column/ActiveModel items

use sea_orm::entity::prelude::*;

/// One earlier attempt. The table name here is the default (`orionbeacon_job_runs_attempts`, the
/// history of `orionbeacon_job_runs`; another run table's is
/// [`job_attempt_table`](crate::job_attempt_table)).
///
/// A row is written when the scheduler claims the slot's next attempt, in the same fenced
/// transaction (and kept only if that claim is): a copy of the run record as that claim found
/// it. So the history holds the attempts claimed before the latest, which is the run record.
/// An attempt an operator ended by a mark before it wrote an end (given up while it ran, or
/// claimed for spread runners and never taken), then marked to run again, is kept with no end. A scheduler that cannot write the table (not migrated,
/// not granted) keeps only the latest, says so in its log and asks again each minute. Times
/// are the database clock's.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "orionbeacon_job_runs_attempts")]
pub struct Model {
    /// The job's name.
    #[sea_orm(
        primary_key,
        auto_increment = false,
        column_type = "String(StringLen::N(255))"
    )]
    pub job: String,
    /// The slot (as the run record's: a time in milliseconds since the Unix epoch, or a keyed
    /// job's key digest).
    #[sea_orm(primary_key, auto_increment = false)]
    pub slot: i64,
    /// The attempt's number (1 for the first).
    #[sea_orm(primary_key, auto_increment = false)]
    pub attempt: i32,
    /// How the attempt ended, as its record said when the next one was claimed: `failed`,
    /// `running` (its runner was lost before it wrote an end: killed, paused or cut off past
    /// its term) or `rerun` (an operator marked the slot to run again; `error` tells a failed
    /// attempt from a finished one; no end at all, one marked before it wrote one: given up while
    /// it ran, or claimed for spread runners and never taken).
    #[sea_orm(column_type = "String(StringLen::N(16))")]
    pub state: String,
    /// The token of the term (or, with spread runs, the run hold) the attempt ran under.
    #[sea_orm(nullable)]
    pub claimed_token: Option<i64>,
    /// Who ran it: the candidate, or with spread runs the run hold's holder.
    #[sea_orm(column_type = "String(StringLen::N(255))", nullable)]
    pub claimed_by: Option<String>,
    /// When it was claimed (or taken by a node's runner).
    #[sea_orm(nullable)]
    pub claimed_at: Option<DateTimeUtc>,
    /// The token that wrote its end, if it wrote one.
    #[sea_orm(nullable)]
    pub finished_token: Option<i64>,
    /// When it ended, if it wrote an end.
    #[sea_orm(nullable)]
    pub finished_at: Option<DateTimeUtc>,
    /// How long it took, in milliseconds, if it wrote an end.
    #[sea_orm(nullable)]
    pub duration_ms: Option<i64>,
    /// Its error, if it failed (up to 1,024 bytes).
    #[sea_orm(column_type = "String(StringLen::N(1024))", nullable)]
    pub error: Option<String>,
    /// When the next attempt was claimed and this row written.
    pub recorded_at: DateTimeUtc,
}

/// The attempt-history table has no relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
