//! What scheduling a job can fail with.

use crate::{error::ErrorKind, error::FenceError, error::StoreError};

/// Why a job could not be set up, a slot not claimed or a run not marked.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum JobError {
    /// A cron expression that does not parse (five fields, or six with seconds first), or
    /// that never matches.
    #[error("cron expression {expression:?} is not valid: {reason}")]
    InvalidCron {
        /// The expression as given.
        expression: String,
        /// What is wrong with it.
        reason: String,
        /// The cron parser's own error, where it gave one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// A time zone the IANA database does not know.
    #[error("time zone {0:?} is not an IANA time zone name (e.g. \"Europe/Berlin\", \"UTC\")")]
    UnknownTimeZone(String),
    /// A fixed interval of zero, under a second, not in whole milliseconds or over a year.
    #[error("interval {0:?} is not a whole number of milliseconds from 1 s to 366 days")]
    InvalidInterval(std::time::Duration),
    /// A job name the lease table's rules refuse (1 to 255 characters, no control characters,
    /// no white space at either end).
    #[error("job name {name:?} {reason}")]
    InvalidName {
        /// The refused name.
        name: String,
        /// Why.
        reason: &'static str,
    },
    /// Two jobs of one scheduler with the same name.
    #[error("job {0:?} is added twice")]
    DuplicateJob(String),
    /// An option out of its documented bounds.
    #[error("{option} {value} is out of bounds ({bounds})")]
    InvalidOption {
        /// The option.
        option: &'static str,
        /// The value given.
        value: String,
        /// What is accepted.
        bounds: &'static str,
    },
    /// The run's term (the leader's, or with spread runs the run's own hold), or a capped
    /// run's permit, is no longer current: nothing this attempt wrote in its fenced
    /// transaction commits, and the slot is claimed again by the leader.
    #[error(
        "the term that runs {job:?} slot {slot}, or its run's cap permit, is no longer current"
    )]
    Superseded {
        /// The job.
        job: String,
        /// The slot (milliseconds since the Unix epoch).
        slot: i64,
    },
    /// The run record no longer says this attempt runs: the slot was finished, given up or
    /// marked by an operator meanwhile. The transaction was rolled back.
    #[error("{job:?} slot {slot} is no longer this attempt's to finish")]
    NotClaimed {
        /// The job.
        job: String,
        /// The slot (milliseconds since the Unix epoch).
        slot: i64,
    },
    /// [`JobRun::commit`](crate::jobs::JobRun::commit) called twice for one attempt.
    #[error("this attempt of {job:?} slot {slot} already committed")]
    AlreadyCommitted {
        /// The job.
        job: String,
        /// The slot (milliseconds since the Unix epoch).
        slot: i64,
    },
    /// The run table does not exist in the lease database: its migration has not run.
    #[error("the job run table {table:?} does not exist: add `orion_beacon_migration::CreateJobRunTable{}` to your application's Migrator and run it (e.g. `sea-orm-cli migrate up`)", hint(table))]
    MissingRunTable {
        /// The run table looked for.
        table: String,
        /// The database's error.
        #[source]
        source: crate::error::BackendError,
    },
    /// [`JobsHandle::submit`](crate::jobs::JobsHandle::submit) named a job that is not a keyed
    /// job of this scheduler.
    #[error("{job:?} is not a keyed job of this scheduler (see `Job::keyed`)")]
    NotKeyed {
        /// The job named.
        job: String,
    },
    /// A key that cannot be recorded (empty, over 255 bytes, a control character).
    #[error("key {key:?} {reason}: a key is 1 to 255 bytes without control characters")]
    InvalidKey {
        /// The key (its first 64 characters).
        key: String,
        /// Why.
        reason: &'static str,
    },
    /// The key's record slot holds another key (two keys whose SHA-256 digests share their
    /// first 63 bits): this key was not recorded and does not run. Submit it under another
    /// key (a prefix will do).
    #[error("key {key:?} of {job:?} shares its record with key {recorded:?}; it was not recorded")]
    KeyCollision {
        /// The job.
        job: String,
        /// The key submitted.
        key: String,
        /// The key recorded in its place.
        recorded: Option<String>,
    },
    /// The scheduler's elector options were refused.
    #[error(transparent)]
    Config(crate::hold::timing::ConfigError),
    /// A cap's permit could not be asked for ([`Job::cap`](super::Job::cap)).
    #[error("a job cap's permit: {0}")]
    Cap(#[source] crate::locks::LockError),
    /// With spread runs, a run's own hold could not be asked for
    /// ([`JobsBuilder::spread_runs`](super::JobsBuilder::spread_runs)).
    #[error("a job run's hold: {0}")]
    RunHold(#[source] crate::locks::LockError),
    /// The fence could not be checked.
    #[error(transparent)]
    Fence(FenceError),
    /// The lease store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A statement on the run table (or the job's own, through `?`) failed.
    #[error("database error: {0}")]
    Database(#[from] sea_orm::DbErr),
}

impl From<FenceError> for JobError {
    fn from(e: FenceError) -> Self {
        match e {
            FenceError::Store(s) => JobError::Store(s),
            other => JobError::Fence(other),
        }
    }
}

impl JobError {
    /// The kind of failure, for logs and metrics.
    pub fn kind(&self) -> ErrorKind {
        match self {
            JobError::InvalidCron { .. }
            | JobError::UnknownTimeZone(_)
            | JobError::InvalidInterval(_)
            | JobError::InvalidName { .. }
            | JobError::DuplicateJob(_)
            | JobError::InvalidOption { .. }
            | JobError::NotKeyed { .. }
            | JobError::InvalidKey { .. }
            | JobError::AlreadyCommitted { .. } => ErrorKind::InvalidInput,
            JobError::KeyCollision { .. } => ErrorKind::Conflict,
            JobError::Config(_) => ErrorKind::InvalidInput,
            JobError::Superseded { .. } => ErrorKind::Lost,
            JobError::NotClaimed { .. } => ErrorKind::Conflict,
            JobError::Fence(e) if e.is_fenced() => ErrorKind::Lost,
            JobError::Fence(_) => ErrorKind::Unsupported,
            JobError::Store(e) => e.kind(),
            JobError::Cap(e) | JobError::RunHold(e) => e.kind(),
            JobError::MissingRunTable { .. } => ErrorKind::MissingTable,
            JobError::Database(_) => ErrorKind::Database,
        }
    }
}

/// The migration's constructor for `table`.
fn hint(table: &str) -> String {
    if table == orion_beacon_entity::DEFAULT_JOB_RUN_TABLE {
        "::new()".to_owned()
    } else {
        format!("::with_table(\"{table}\")?")
    }
}

crate::error::debug_as_chain!(JobError);
