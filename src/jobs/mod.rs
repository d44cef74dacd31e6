//! Scheduled jobs that run exactly once per slot, across a cluster, even when leadership
//! changes in the middle of a run (the `jobs` feature).
//!
//! A [`Jobs`] scheduler is one elector (one renew loop, however many jobs) whose leader runs
//! every job's slots. Each slot is claimed in a run record (table `orionbeacon_job_runs`, from
//! the `CreateJobRunTable` migration) inside a fenced transaction, and the job's own writes
//! and the slot's "finished" mark commit together in another ([`JobRun::begin`],
//! [`JobRun::commit`]):
//!
//! - **exactly once per slot** for the writes the job makes in that transaction: a slot whose
//!   writes committed is never run again, and a leader that lost its term (paused, cut off)
//!   commits nothing;
//! - **at least once** for everything else: an attempt that fails or crashes before its commit
//!   is run again by the leader of the time, with back-off, up to
//!   [`max_attempts`](Job::max_attempts), then given up (an operator can mark a slot to run
//!   again or give it up: [`mark`], or `orion-beacon jobs rerun|give-up`).
//!
//! Slots come from the database clock, never a node's ([`Schedule`]); missed slots and slots
//! that come due while one runs follow [`MissedSlots`] and [`Overlap`]. See the jobs guide
//! (docs/jobs.md) for the guarantee, the policies and the figures.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use orion_beacon::jobs::{Job, Jobs, Schedule};
//! use orion_beacon::SeaOrmLeaseStore;
//!
//! # async fn app(db: sea_orm::DatabaseConnection) -> Result<(), Box<dyn std::error::Error>> {
//! let jobs = Jobs::builder(SeaOrmLeaseStore::new(db))
//!     .job(Job::new(
//!         "nightly-report",
//!         Schedule::cron("0 2 * * *", "Europe/Berlin")?,
//!         |run| async move {
//!             let txn = run.begin().await?; // fenced by the term that claimed the slot
//!             // ... the report's rows, written with `&txn` ...
//!             run.commit(txn).await?; // the rows and the "finished" mark, together
//!             Ok(())
//!         },
//!     ))
//!     .build()?
//!     .start();
//! # jobs.shutdown().await;
//! # Ok(()) }
//! ```

mod error;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
mod metrics_hook;
mod plan;
mod records;
mod run;
mod runner;
mod schedule;
mod spread;
mod staleness;

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseConnection};

pub use error::JobError;
pub use run::JobRun;
pub use schedule::{MissedSlots, Overlap, Schedule, MAX_INTERVAL, MIN_INTERVAL};
pub use staleness::StaleJob;

use crate::backend::SeaOrmLeaseStore;
use crate::elector::{Elector, ElectorBuilder, ElectorHandle};
pub use orion_beacon_entity::DEFAULT_JOB_RUN_TABLE;

mod job;
pub use job::Job;

/// The resource a scheduler's elector leads by default.
pub const DEFAULT_RESOURCE: &str = "orion-beacon/jobs";
/// The most slots [`MissedSlots::RunAll`] catches up at once.
pub const MAX_CATCH_UP: usize = 10_000;
/// The most runs of one job at once that [`Job::max_running`] accepts.
pub const MAX_RUNNING: usize = 10_000;
/// How a cap group's semaphore is named: this, then the group ([`Job::cap_group`]).
pub const CAP_GROUP_PREFIX: &str = "orion-beacon/job-group/";
/// The longest cap group name, in characters.
pub const MAX_GROUP_LEN: usize = 200;
/// The most bytes of a key ([`JobsHandle::submit`]).
pub const MAX_KEY_LEN: usize = 255;
/// The most attempts per slot that can be configured.
pub const MAX_ATTEMPTS: u32 = 1_000;
/// The shortest starting deadline: how late a look at the run table can come after a slot's
/// time on a busy node (a timer's wake-up, the reads before the decision). A shorter deadline
/// would refuse slots for the scheduler's own lateness, not for a missed slot.
pub const MIN_STARTING_DEADLINE: Duration = Duration::from_secs(1);
/// The longest starting deadline, back-off and poll interval.
pub const MAX_WAIT: Duration = Duration::from_secs(366 * 24 * 3600);

pub use crate::error::BoxError;

/// Builds a [`Jobs`] scheduler: `Jobs::builder(store).job(...).build()?`.
#[must_use]
pub struct JobsBuilder {
    store: SeaOrmLeaseStore,
    elector: ElectorBuilder,
    resource: String,
    table: String,
    poll: Duration,
    keep_finished: Option<Duration>,
    spread: Option<usize>,
    jobs: Vec<Job>,
}

impl JobsBuilder {
    /// Adds a job.
    pub fn job(mut self, job: Job) -> Self {
        self.jobs.push(job);
        self
    }

    /// The resource whose leader runs the jobs. Default [`DEFAULT_RESOURCE`]. One resource is
    /// one job set: services with different jobs need a resource each (their schedulers then
    /// run independently; give their jobs different names). The leader publishes its job set
    /// in the lease's payload (where the table has the payload columns), and a node whose jobs
    /// differ warns and says so in [`JobsHandle::health`].
    pub fn resource(mut self, resource: impl Into<String>) -> Self {
        self.resource = resource.into();
        self
    }

    /// This node's candidate id (the elector's).
    pub fn candidate_id(mut self, id: impl Into<String>) -> Self {
        self.elector = self.elector.candidate_id(id);
        self
    }

    /// The elector's lease (see [`ElectorBuilder::lease_duration`]).
    pub fn lease_duration(mut self, lease: Duration) -> Self {
        self.elector = self.elector.lease_duration(lease);
        self
    }

    /// The elector's renew interval.
    pub fn renew_interval(mut self, interval: Duration) -> Self {
        self.elector = self.elector.renew_interval(interval);
        self
    }

    /// The elector's retry interval (how soon a follower tries again).
    pub fn retry_interval(mut self, interval: Duration) -> Self {
        self.elector = self.elector.retry_interval(interval);
        self
    }

    /// Whether the elector's renews go out with the store's other holds (see
    /// [`ElectorBuilder::renew_together`]). Default true.
    pub fn renew_together(mut self, together: bool) -> Self {
        self.elector = self.elector.renew_together(together);
        self
    }

    /// How long running slots may take to finish after [`JobsHandle::shutdown`] (the
    /// elector's [`grace_period`](ElectorBuilder::grace_period): it keeps the lease renewed
    /// meanwhile); a run still going then is dropped and run again by the next leader. Default
    /// 5 s. Give it the longest run you want a deploy to wait for.
    pub fn grace_period(mut self, grace: Duration) -> Self {
        self.elector = self.elector.grace_period(grace);
        self
    }

    /// The run table (created by `CreateJobRunTable::with_table`). Default
    /// [`DEFAULT_JOB_RUN_TABLE`]. Its attempt history, where every attempt but a slot's latest
    /// is kept, is [`job_attempt_table`](crate::entity::job_attempt_table) of it (created by
    /// `CreateJobAttemptTable::with_table` of the same name); without it only the latest is
    /// kept.
    pub fn runs_table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// How often the leader looks at the run table even when no slot is due (for slots to
    /// retry and operators' marks). Default 5 s; 10 ms to [`MAX_WAIT`].
    pub fn poll_interval(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// Keeps the run records of ended slots (`finished`, `skipped`, `given_up`) for `keep`
    /// after their slot's time, then the leader deletes them: at most 500 every half `keep`
    /// (at least once a minute), only this scheduler's jobs' (and their earlier names'). Each
    /// name's newest record and its newest finished one always stay: the scheduler goes on from
    /// the newest, so no pruned slot ever runs again. Records still open (running, failed and
    /// to be retried, marked to rerun) are never deleted. Best effort: a failed batch is logged
    /// and tried again. Default: kept forever; 1 s to [`MAX_WAIT`].
    pub fn keep_finished_for(mut self, keep: Duration) -> Self {
        self.keep_finished = Some(keep);
        self
    }

    /// Spreads the runs over the scheduler's nodes: the leader plans and claims every start
    /// as before, and any node of the scheduler (the leader's too) runs it, this node at most
    /// `per_node` at once (0: this node runs none; it plans when it leads). Default: off, the
    /// leader runs every run itself.
    ///
    /// Each run holds a hold of its own: a permit of its job's run semaphore
    /// (`<resource>/run/<job>#<n>`, one permit per run the job may have at once: one, or under
    /// [`Overlap::Allow`] its [`max_running`](Job::max_running), at most 1,024), renewed by the
    /// store's one renewer with this scheduler's lease timing. The run's term
    /// ([`JobRun::term`]) is that hold: its token fences the run's writes and its end, exactly
    /// as a leader's term does, and a runner that dies, pauses or is cut off commits nothing
    /// once its hold lapsed; the leader then claims the slot again (an attempt spent, with
    /// back-off) and the next runner's token on that permit is higher. A node's runner looks
    /// for claimed starts when its node's leader claims them, and otherwise every poll interval
    /// (at most a second apart); a capped job's runner takes the cap's permit before the run:
    /// a start without a free permit waits, claimed, and later slots follow the job's overlap
    /// policy. Give every node of a scheduler the same setting: a leader that does not spread
    /// runs claimed starts itself (after their back-off), and a node that does not spread runs
    /// none. 0 to [`MAX_RUNNING`].
    pub fn spread_runs(mut self, per_node: usize) -> Self {
        self.spread = Some(per_node);
        self
    }

    /// Validates every job and option: nothing runs before this succeeds.
    pub fn build(self) -> Result<Jobs, JobError> {
        validate_runs_table("runs_table", &self.table)?;
        if !(Duration::from_millis(10)..=MAX_WAIT).contains(&self.poll) {
            return Err(JobError::InvalidOption {
                option: "poll_interval",
                value: format!("{:?}", self.poll),
                bounds: "10 ms to 366 days",
            });
        }
        if let Some(keep) = self.keep_finished {
            if !(Duration::from_secs(1)..=MAX_WAIT).contains(&keep) {
                return Err(JobError::InvalidOption {
                    option: "keep_finished_for",
                    value: format!("{keep:?}"),
                    bounds: "1 s to 366 days",
                });
            }
        }
        if let Some(per_node) = self.spread {
            if per_node > MAX_RUNNING {
                return Err(JobError::InvalidOption {
                    option: "spread_runs",
                    value: per_node.to_string(),
                    bounds: "0 to 10,000 runs per node",
                });
            }
        }
        let mut names = HashSet::new();
        let mut jobs = Vec::with_capacity(self.jobs.len());
        let mut parsed = schedule::Parsed::new();
        for mut job in self.jobs {
            let policy = job.policy()?;
            job.schedule.share(&mut parsed);
            if !names.insert(job.name.clone()) {
                return Err(JobError::DuplicateJob(job.name));
            }
            jobs.push(runner::Registered::new(job, policy));
        }
        let resource = self.resource.clone();
        // An earlier name belongs to one job, and to no job of this scheduler now.
        for reg in &jobs {
            for old in &reg.job.renamed_from {
                if !names.insert(old.clone()) {
                    return Err(JobError::DuplicateJob(old.clone()));
                }
            }
        }
        let job_set = job_set(&jobs);
        let elector = self
            .elector
            .resource(self.resource)
            // The leader's job set, for the other nodes to compare with theirs.
            .payload(job_set.clone())
            .build()
            .map_err(JobError::Config)?;
        holds(
            &self.store,
            &elector,
            (&resource, self.spread.is_some()),
            &mut jobs,
        )?;
        // Half a renew interval: how long a look's updates may go on holding the lease row.
        let claim_budget = elector.renew_interval() / 2;
        let freshness = staleness::Freshness::new(
            jobs.iter()
                .map(|reg| (reg.name.clone(), reg.job.stale_after))
                .collect(),
        );
        Ok(Jobs {
            elector,
            shared: Arc::new(runner::Shared {
                store: self.store,
                attempts_table: orion_beacon_entity::job_attempt_table(&self.table).into(),
                table: self.table.into(),
                poll: self.poll,
                keep_finished_ms: self
                    .keep_finished
                    .map(|k| i64::try_from(k.as_millis()).unwrap_or(i64::MAX)),
                claim_budget,
                jobs,
                problem: std::sync::Mutex::new(None),
                job_set,
                other_job_set: std::sync::Mutex::new(None),
                freshness,
                wake: tokio::sync::Notify::new(),
                spread: self.spread,
                runner_wake: tokio::sync::Notify::new(),
                runner_problem: std::sync::Mutex::new(None),
                waiting: std::sync::Mutex::new(None),
                aborted: std::sync::atomic::AtomicBool::new(false),
            }),
        })
    }
}

/// Gives each capped job its semaphore ([`Job::cap`]) and, with spread runs, each job its run
/// semaphore ([`JobsBuilder::spread_runs`]): one [`Locks`](crate::locks::Locks) per scheduler,
/// holding permits as this node's candidate with the elector's lease, renew interval and
/// step-down margin (a permit lapses when a term would), renewed by the store's one renewer
/// with the term.
fn holds(
    store: &SeaOrmLeaseStore,
    elector: &Elector,
    (resource, spread): (&str, bool),
    jobs: &mut [runner::Registered],
) -> Result<(), JobError> {
    for reg in jobs.iter_mut() {
        let name = format!("{resource}/run/{}", reg.name);
        let last = format!("{name}#{}", crate::locks::MAX_PERMITS - 1);
        reg.run_semaphore = crate::store::validate_resource(&last)
            .is_ok()
            .then_some(name);
    }
    if !spread && jobs.iter().all(|reg| reg.job.cap.is_none()) {
        return Ok(());
    }
    let timing = elector.timing();
    let locks = crate::locks::Locks::builder(store.clone())
        .owner(elector.candidate_id())
        .lease_duration(timing.lease)
        .renew_interval(timing.renew_interval)
        .step_down_margin(timing.step_down_margin)
        .build()
        .map_err(JobError::Config)?;
    for reg in jobs {
        if spread {
            // One hold per run the job may have at once.
            let runs = if reg.policy.overlap == Overlap::Allow {
                u32::try_from(reg.policy.max_running)
                    .unwrap_or(u32::MAX)
                    .min(crate::locks::MAX_PERMITS)
            } else {
                1
            };
            // Every permit a node may hold must be one the leader can read.
            let Some(name) = reg.run_semaphore.clone() else {
                return Err(JobError::InvalidOption {
                    option: "spread_runs",
                    value: format!("the run semaphore of {:?} under {resource:?}", reg.name),
                    bounds: "a run semaphore name within the resource rules: a shorter job \
                             name or resource",
                });
            };
            let semaphore =
                locks
                    .semaphore(name.clone(), runs)
                    .map_err(|e| JobError::InvalidOption {
                        option: "spread_runs",
                        value: format!("the run semaphore {name:?} ({e})"),
                        bounds: "a semaphore name within the resource rules: a shorter job name \
                             or resource",
                    })?;
            reg.run_hold = Some(semaphore);
        }
        let Some(cap) = &reg.job.cap else { continue };
        let name = cap.semaphore(resource, &reg.name);
        let semaphore =
            locks
                .semaphore(name.clone(), cap.permits)
                .map_err(|e| JobError::InvalidOption {
                    option: "cap",
                    value: format!("the semaphore {name:?} ({e})"),
                    bounds: "a semaphore name within the resource rules: a shorter job name or \
                         resource, or a cap group",
                })?;
        reg.cap = Some(semaphore);
    }
    Ok(())
}

/// A scheduler: one elector whose leader runs every job's slots. [`start`](Self::start) it.
pub struct Jobs {
    elector: Elector,
    shared: Arc<runner::Shared>,
}

impl Jobs {
    /// A builder over `store`; the run table lives in the same database, so the job's writes
    /// and its slot's mark commit in one transaction.
    pub fn builder(store: SeaOrmLeaseStore) -> JobsBuilder {
        JobsBuilder {
            elector: Elector::builder(store.clone()),
            store,
            resource: DEFAULT_RESOURCE.to_owned(),
            table: DEFAULT_JOB_RUN_TABLE.to_owned(),
            poll: Duration::from_secs(5),
            keep_finished: None,
            spread: None,
            jobs: Vec::new(),
        }
    }

    /// Starts the elector; while this node leads, it runs the jobs (with spread runs, its
    /// runner runs claimed starts whoever leads).
    pub fn start(self) -> JobsHandle {
        let grace = self.elector.timing().grace_period;
        let elector = self.elector.start();
        let shared = self.shared;
        let for_terms = shared.clone();
        let work = elector.run_as_leader(move |term| runner::lead(for_terms.clone(), term));
        tokio::spawn(compare_job_sets(elector.watch(), shared.clone()));
        let stop = tokio_util::sync::CancellationToken::new();
        let runner = match shared.spread {
            Some(per_node) if per_node > 0 => Some(tokio::spawn(spread::run(
                shared.clone(),
                per_node,
                stop.clone(),
            ))),
            _ => None,
        };
        JobsHandle {
            elector,
            work,
            shared,
            runner_abort: runner.as_ref().map(tokio::task::JoinHandle::abort_handle),
            runner: std::sync::Mutex::new(runner),
            stop,
            grace,
        }
    }
}

/// How a scheduler's leader's lease payload starts: its job set (a digest of the job names,
/// then how many, then the names as a JSON array, as many as fit in a payload), what
/// `orion-beacon jobs` and `show` find a job's scheduler by.
pub const JOB_SET_PREFIX: &str = "orion-beacon jobs ";

/// The job set as the leader publishes it: a digest of the job names (FNV-1a, stable across
/// builds and platforms), then, for people and the command line, how many and the names as a
/// JSON array of strings (as many as fit; a name has no control characters, so only `"` and
/// `\` need escaping): `orion-beacon jobs 0123456789abcdef (2 jobs) ["cleanup","report"]`.
fn job_set(jobs: &[runner::Registered]) -> String {
    let mut names: Vec<&str> = jobs.iter().map(|j| &*j.name).collect();
    names.sort_unstable();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for name in &names {
        for byte in name.bytes().chain([0]) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    let mut text = format!("{JOB_SET_PREFIX}{hash:016x} ({} jobs) [", names.len());
    for (i, name) in names.iter().enumerate() {
        let quoted = format!("\"{}\"", name.replace('\\', "\\\\").replace('"', "\\\""));
        // Room for this name, its comma and the closing bracket.
        if text.len() + quoted.len() + 2 > crate::store::MAX_PAYLOAD_LEN {
            break;
        }
        if i > 0 {
            text.push(',');
        }
        text.push_str(&quoted);
    }
    text.push(']');
    text
}

/// The digest part of a published job set.
fn job_set_digest(payload: &str) -> Option<&str> {
    payload.strip_prefix(JOB_SET_PREFIX)?.split(' ').next()
}

/// Follows the scheduler's elector: while another node leads with a different job set, warns
/// (once per leader and set) and says so in [`JobsHandle::health`]: this node's jobs that the
/// leader lacks do not run until a node that has them leads.
async fn compare_job_sets(
    mut watch: crate::watch::Watch<crate::hold::Leadership>,
    shared: Arc<runner::Shared>,
) {
    let ours = job_set_digest(&shared.job_set).map(str::to_owned);
    let mut warned: Option<(String, String)> = None;
    loop {
        let state = watch.borrow_and_update();
        let other = match &state {
            crate::hold::Leadership::Follower {
                leader: Some(leader),
                payload: Some(payload),
            } if matches!(job_set_digest(payload), Some(theirs) if Some(theirs) != ours.as_deref()) => {
                Some((leader.clone(), payload.clone()))
            }
            _ => None,
        };
        match &other {
            Some((leader, theirs)) => {
                if warned.as_ref() != Some(&(leader.clone(), theirs.clone())) {
                    tracing::warn!(
                        %leader,
                        leader_jobs = %theirs,
                        our_jobs = %shared.job_set,
                        "the scheduler's leader runs another job set: jobs it lacks do not run \
                         until a node that has them leads (during a rolling deploy this ends \
                         with it; otherwise give each job set a resource of its own)"
                    );
                }
                *crate::mutex::lock(&shared.other_job_set) = Some(format!(
                    "{leader} leads with {theirs}; this node has {}",
                    shared.job_set
                ));
            }
            None => *crate::mutex::lock(&shared.other_job_set) = None,
        }
        warned = other;
        if watch.changed().await.is_err() {
            return;
        }
    }
}

/// A running scheduler. Keep it for as long as the jobs should run: dropping it stops the
/// scheduler as [`shutdown`](Self::shutdown) does (its elector's handle is dropped with it),
/// without waiting.
pub struct JobsHandle {
    elector: ElectorHandle,
    work: tokio::task::JoinHandle<()>,
    shared: Arc<runner::Shared>,
    /// With spread runs, this node's runner (taken by the first shutdown, drop or abort), and
    /// what aborts it whoever took it.
    runner: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    runner_abort: Option<tokio::task::AbortHandle>,
    /// Stops the runner taking runs.
    stop: tokio_util::sync::CancellationToken,
    /// How long the runner's runs may take to finish after a shutdown.
    grace: Duration,
}

impl Drop for JobsHandle {
    fn drop(&mut self) {
        // As a shutdown, without waiting: the runner takes nothing more, its runs get the
        // grace period.
        let _ = self.stop_runner();
    }
}

impl JobsHandle {
    /// Stops this node's runner taking runs, and bounds its runs by the grace period on a task
    /// of its own (a caller that stops waiting for a shutdown leaves nothing unbounded): that
    /// task, to wait for. `None` when there is no runner (or it was stopped already).
    fn stop_runner(&self) -> Option<tokio::task::JoinHandle<()>> {
        self.stop.cancel();
        let mut runner = crate::mutex::lock(&self.runner).take()?;
        let grace = self.grace;
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => Some(rt.spawn(async move {
                if tokio::time::timeout(grace, &mut runner).await.is_err() {
                    tracing::warn!(
                        "runs still going after the grace period are dropped; the leader runs \
                         them again"
                    );
                    runner.abort();
                }
            })),
            Err(_) => {
                runner.abort();
                None
            }
        }
    }
}

/// The answer to [`JobsHandle::health`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobsHealth {
    /// The elector is healthy and, on the leader, the last look at the run table succeeded
    /// in full (a look that could not read the keyed jobs' records still ran the slots).
    pub healthy: bool,
    /// The scheduler's elector's health.
    pub elector: crate::hold::health::Health,
    /// Why the leader's last look at the run table failed, while it does (its error and
    /// sources): a missing run table, a refused statement; or why it could not read the
    /// keyed jobs' records (`keyed jobs: ...`, a table without `AddJobRunKey`'s column). With
    /// [spread runs](JobsBuilder::spread_runs), on any node, also why this node's runner's
    /// last look failed (`taking claimed runs: ...`).
    pub scheduling: Option<String>,
    /// Set while another node leads the scheduler's resource with a different set of jobs:
    /// this node's jobs that the leader lacks do not run meanwhile. (It leaves `healthy` as
    /// it is: a rolling deploy that adds a job shows it for a while.)
    pub other_job_set: Option<String>,
    /// On the leader: the jobs with no finished slot for longer than their
    /// [`stale_after`](Job::stale_after) (empty on a follower, which does not know; ask the
    /// leader, the metrics or `orion-beacon jobs check`). It leaves `healthy` as it is: a job
    /// that does not run is the job's problem, not this node's.
    pub stale: Vec<StaleJob>,
    /// On the leader, with [spread runs](JobsBuilder::spread_runs): the starts it claimed that
    /// no node's runner has taken for longer than ten poll intervals (at least 5 s): every
    /// node at `spread_runs(0)`, their runners down, or every runner full with long runs.
    /// `None` on a follower, and when none waits that long. It leaves `healthy` as it is: a
    /// backlog is the job set's problem, not this node's.
    pub waiting: Option<WaitingStarts>,
}

/// Starts claimed for the nodes' runners and not taken for too long, in
/// [`JobsHealth::waiting`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct WaitingStarts {
    /// How many wait longer than `limit`.
    pub count: usize,
    /// How long the oldest has waited (database clock).
    #[cfg_attr(
        feature = "serde",
        serde(rename = "oldest_ms", serialize_with = "crate::lease::millis")
    )]
    pub oldest: Duration,
    /// The limit: ten poll intervals, at least 5 s.
    #[cfg_attr(
        feature = "serde",
        serde(rename = "limit_ms", serialize_with = "crate::lease::millis")
    )]
    pub limit: Duration,
}

impl std::fmt::Display for WaitingStarts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} claimed start(s) not taken by any node's runner for over {:?} (the oldest for \
             {:?}): no runner takes them (every node at spread_runs(0), runners down, or all \
             full)",
            self.count, self.limit, self.oldest
        )
    }
}

impl std::fmt::Display for JobsHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.scheduling {
            Some(problem) if self.elector.healthy => {
                write!(
                    f,
                    "UNHEALTHY: {}; job scheduling fails: {problem}",
                    self.elector
                )
            }
            Some(problem) => write!(f, "{}; job scheduling fails: {problem}", self.elector),
            None => self.elector.fmt(f),
        }?;
        if let Some(other) = &self.other_job_set {
            write!(f, "; another job set leads: {other}")?;
        }
        for stale in &self.stale {
            write!(f, "; STALE {stale}")?;
        }
        if let Some(waiting) = &self.waiting {
            write!(f, "; WAITING {waiting}")?;
        }
        Ok(())
    }
}

impl JobsHandle {
    /// The scheduler's elector: whether this node leads, its term, its health.
    pub fn elector(&self) -> &ElectorHandle {
        &self.elector
    }

    /// For a readiness or liveness probe: the elector's health, and why the leader's last
    /// look at the run table failed while it does (a missing run table names its migration).
    pub fn health(&self) -> JobsHealth {
        let elector = self.elector.health();
        let leading = crate::mutex::lock(&self.shared.problem).clone();
        let running = crate::mutex::lock(&self.shared.runner_problem)
            .clone()
            .map(|p| format!("taking claimed runs: {p}"));
        let scheduling = match (leading, running) {
            (Some(a), Some(b)) => Some(format!("{a}; {b}")),
            (a, b) => a.or(b),
        };
        let other_job_set = crate::mutex::lock(&self.shared.other_job_set).clone();
        JobsHealth {
            healthy: elector.healthy && scheduling.is_none(),
            elector,
            scheduling,
            other_job_set,
            stale: self.shared.freshness.stale(),
            waiting: crate::mutex::lock(&self.shared.waiting).clone(),
        }
    }

    /// Stops the scheduler: nothing new is claimed, running slots get the elector's grace
    /// period to finish (then they are dropped, and run again by the next leader), the lease is
    /// released and another node takes over at once.
    pub async fn shutdown(&self) {
        // With spread runs, this node's runner takes nothing more and its runs get the grace
        // period, beside the leader's own end.
        let stopping = self.stop_runner();
        let runs = async {
            if let Some(stopping) = stopping {
                let _ = stopping.await;
            }
        };
        tokio::join!(self.elector.shutdown(), runs);
        self.work.abort();
    }

    /// Stops at once, as a crash would: runs are dropped (their open transactions roll back),
    /// nothing is released; another node takes over when the lease lapses.
    pub async fn abort(&self) {
        // The runs' cap permits and holds lapse, as a crashed process's would.
        self.shared
            .aborted
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.stop.cancel();
        drop(crate::mutex::lock(&self.runner).take());
        if let Some(runner) = &self.runner_abort {
            runner.abort();
        }
        self.work.abort();
        self.elector.abort().await;
    }
}

/// The answer to [`JobsHandle::submit`]: the key's record, and whether this submit made it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Submission {
    /// True when this submit recorded the key; false when the key had a record already (its
    /// run, queued, running, finished or given up, is that record's: a key never runs twice).
    pub created: bool,
    /// The key's record as it is now (`state` `queued` until the leader claims it).
    pub record: orion_beacon_entity::job_run::Model,
}

impl JobsHandle {
    /// Submits `key` to the keyed job `job` ([`Job::keyed`]) and returns at once: the leader
    /// runs it (from any node of the scheduler) exactly once for the writes its run makes in
    /// [`JobRun::begin`]'s transaction, at least once otherwise, with the job's retries and
    /// back-off. A key that has a record already is answered with that record
    /// ([`Submission::created`] false), never run again: submit from as many nodes, as often,
    /// as you like. A key submitted on the leader starts at once; on another node, at the
    /// leader's next look (within [`poll_interval`](JobsBuilder::poll_interval)).
    ///
    /// A key is 1 to [`MAX_KEY_LEN`] bytes without control characters; refused before any SQL
    /// runs, as a job that is not a keyed job of this scheduler is. Records are kept as slots'
    /// are ([`keep_finished_for`](JobsBuilder::keep_finished_for) prunes ended ones by when
    /// they ended): a key whose record was pruned runs again if it is submitted again.
    pub async fn submit(&self, job: &str, key: &str) -> Result<Submission, JobError> {
        let shared = &self.shared;
        if !shared
            .jobs
            .iter()
            .any(|reg| &*reg.name == job && reg.job.is_keyed())
        {
            return Err(JobError::NotKeyed {
                job: job.to_owned(),
            });
        }
        validate_key(key)?;
        let slot = records::key_slot(key);
        let engine = shared.store.engine()?;
        let backend = shared.store.connection().get_database_backend();
        let insert = records::submit(backend, &shared.table, job, slot, key)?;
        let mut tries = 0;
        let created = loop {
            tries += 1;
            // Autocommitted, on a checked connection: answered means committed.
            match engine.counted(insert.clone()).await {
                Ok(rows) => break rows > 0,
                // Two submits of one key under a stricter isolation than the default: the
                // loser's statement had no effect, and the next sees the winner's record.
                Err(crate::error::StoreError::Conflict { .. }) if tries < 3 => continue,
                Err(e) => return Err(self.key_error(e)),
            }
        };
        let row = engine
            .plain(backend.build(&records::one(&shared.table, job, slot)))
            .await
            .map_err(|e| self.key_error(e))?
            .into_iter()
            .next()
            .ok_or_else(|| {
                JobError::Database(sea_orm::DbErr::RecordNotFound(format!(
                    "the record of key {key:?} of job {job:?}"
                )))
            })?;
        let record =
            <orion_beacon_entity::job_run::Model as sea_orm::FromQueryResult>::from_query_result(
                &row, "",
            )?;
        if record.run_key.as_deref() != Some(key) {
            return Err(JobError::KeyCollision {
                job: job.to_owned(),
                key: key.to_owned(),
                recorded: record.run_key,
            });
        }
        if created {
            shared.wake.notify_one();
            tracing::debug!(%job, key, slot, "key submitted");
        }
        Ok(Submission { created, record })
    }

    /// A submit's store error, as a job error: the run table missing, or without its key.
    fn key_error(&self, err: crate::error::StoreError) -> JobError {
        match err {
            crate::error::StoreError::MissingTable { source, .. } => JobError::MissingRunTable {
                table: self.shared.table.to_string(),
                source,
            },
            other => runner::keyed_error(&self.shared, JobError::Store(other)),
        }
    }
}

/// The slot a keyed job's record of `key` is kept under (the first 63 bits of the key's
/// SHA-256): what [`mark`] takes for a key.
pub fn key_slot(key: &str) -> i64 {
    records::key_slot(key)
}

/// Checks a key as [`JobsHandle::submit`] does (1 to [`MAX_KEY_LEN`] bytes, no control
/// characters): [`JobError::InvalidKey`] otherwise.
pub fn validate_key(key: &str) -> Result<(), JobError> {
    let reason = if key.is_empty() {
        "is empty"
    } else if key.len() > MAX_KEY_LEN {
        "is longer than 255 bytes"
    } else if key.chars().any(char::is_control) {
        "has a control character"
    } else {
        return Ok(());
    };
    Err(JobError::InvalidKey {
        key: key.chars().take(64).collect(),
        reason,
    })
}

/// An operator's mark on a slot's record: what `orion-beacon jobs rerun|give-up` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mark {
    /// Run the slot again (any record but a running one). A finished slot runs again: its
    /// writes are made a second time.
    Rerun,
    /// Give the slot up: never run it again (any record but a finished one). A running
    /// attempt's commit is then refused and its fenced writes roll back.
    GiveUp,
}

/// Marks `job`'s slot `slot` (milliseconds since the Unix epoch) in the run table `table` of
/// `db`; whether a record was changed.
pub async fn mark(
    db: &DatabaseConnection,
    table: &str,
    job: &str,
    slot: i64,
    mark: Mark,
) -> Result<bool, JobError> {
    validate_runs_table("table", table)?;
    let to = match mark {
        Mark::Rerun => plan::State::Rerun,
        Mark::GiveUp => plan::State::GivenUp,
    };
    // In a transaction of its own, begun whole and committed before the answer: a mark
    // answered `true` has committed (a lone statement on a pooled connection left inside a
    // transaction would join it and never commit).
    let txn = crate::backend::begin_whole(db).await?;
    let rows = match txn.execute(&records::mark(table, job, slot, to)).await {
        Ok(done) => done.rows_affected(),
        Err(e) => {
            let _ = txn.rollback().await;
            return Err(e.into());
        }
    };
    txn.commit().await?;
    Ok(rows > 0)
}

/// A run table's name, checked as the lease table's is (the option named for the error).
fn validate_runs_table(option: &'static str, table: &str) -> Result<(), JobError> {
    orion_beacon_entity::validate_table_name(table).map_err(|e| JobError::InvalidOption {
        option,
        value: format!("{table:?} ({e})"),
        bounds: "1 to 63 ASCII letters, digits and '_', not starting with a digit",
    })
}

#[cfg(test)]
mod tests;
