//! A job: its name, schedule, closure and policies (missed slots, overlap, retries), checked
//! into the plan's policy when the scheduler is built.

use super::*;

type Work =
    Arc<dyn Fn(JobRun) -> Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>> + Send + Sync>;

/// One named job: a schedule, its policies and the closure that runs a slot.
#[must_use]
pub struct Job {
    pub(crate) name: String,
    pub(crate) schedule: Schedule,
    pub(crate) missed: MissedSlots,
    pub(crate) overlap: Overlap,
    pub(crate) starting_deadline: Duration,
    pub(crate) max_catch_up: usize,
    pub(crate) max_attempts: u32,
    pub(crate) backoff: (Duration, Duration),
    pub(crate) renamed_from: Vec<String>,
    pub(crate) stale_after: Option<Duration>,
    pub(crate) max_running: Option<usize>,
    pub(crate) cap: Option<Cap>,
    pub(crate) work: Work,
}

/// A cluster-wide cap on a job's runs: the permits of a semaphore on the lease table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cap {
    /// The group whose permits the job shares, if it names one (else the job's own).
    pub group: Option<String>,
    pub permits: u32,
}

impl Cap {
    /// The semaphore's name: the group's, shared by every scheduler on the lease table, or the
    /// job's own under its scheduler's resource.
    pub(crate) fn semaphore(&self, resource: &str, job: &str) -> String {
        match &self.group {
            Some(group) => format!("{CAP_GROUP_PREFIX}{group}"),
            None => format!("{resource}/cap/{job}"),
        }
    }
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("name", &self.name)
            .field("schedule", &self.schedule)
            .field("missed", &self.missed)
            .field("overlap", &self.overlap)
            .finish_non_exhaustive()
    }
}

impl Job {
    /// A job named `name` (1 to 255 characters, checked by [`JobsBuilder::build`]) that runs
    /// `work` for each slot of `schedule`. `work` gets the slot's [`JobRun`]; an `Err` (or a
    /// panic) fails the attempt, which is retried.
    ///
    /// The closure's future ends in a [`BoxError`], so `?` takes any error (a `DbErr`, a
    /// [`JobError`], your own) and `Ok(())` needs no annotation:
    /// `|run| async move { let txn = run.begin().await?; /* ... */ run.commit(txn).await?; Ok(()) }`.
    pub fn new<F, Fut>(name: impl Into<String>, schedule: Schedule, work: F) -> Self
    where
        F: Fn(JobRun) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        let work: Work = Arc::new(move |run| Box::pin(work(run)));
        Self {
            name: name.into(),
            schedule,
            missed: MissedSlots::default(),
            overlap: Overlap::default(),
            starting_deadline: Duration::from_secs(60),
            max_catch_up: 100,
            max_attempts: 5,
            backoff: (Duration::from_secs(1), Duration::from_secs(300)),
            renamed_from: Vec::new(),
            stale_after: None,
            max_running: None,
            cap: None,
            work,
        }
    }

    /// A keyed job named `name`: it has no schedule; each key submitted to it
    /// ([`JobsHandle::submit`]) runs `work` exactly once across the cluster, for the writes
    /// made in [`JobRun::begin`]'s transaction (at least once otherwise), with the same
    /// retries, back-off, give-up and operator marks as a slot. [`JobRun::key`] names the key.
    ///
    /// Keys run one at a time by default, oldest submit first; `.overlap(Overlap::Allow)`
    /// runs them side by side, at most [`max_running`](Self::max_running) at once. The
    /// missed-slot options, the starting deadline and earlier names do not apply (an earlier
    /// name is refused by [`JobsBuilder::build`]). Needs the `AddJobRunKey` migration.
    pub fn keyed<F, Fut>(name: impl Into<String>, work: F) -> Self
    where
        F: Fn(JobRun) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        Self::new(name, Schedule::keyed(), work).overlap(Overlap::Queue)
    }

    /// Whether this job is keyed ([`Job::keyed`]).
    pub fn is_keyed(&self) -> bool {
        self.schedule.is_keyed()
    }

    /// Under [`Overlap::Allow`], at most `runs` of this job's runs at once on the leader
    /// (slots, or a keyed job's keys); the rest wait for one to end (a keyed job's keys in
    /// the order they were submitted, a schedule's missed slots by the missed-slot policy).
    /// Default: no limit; 1 to [`MAX_RUNNING`].
    pub fn max_running(mut self, runs: usize) -> Self {
        self.max_running = Some(runs);
        self
    }

    /// At most `permits` runs of this job at once across the cluster, whichever node runs them
    /// and through every change of leader: each run holds a permit of the job's semaphore on
    /// the lease table (`<resource>/cap/<job>#0` to `#permits-1`, see
    /// [`Semaphore`](crate::locks::Semaphore)), renewed with the scheduler's lease by its
    /// renewer, and every fenced transaction of the run ([`JobRun::begin`], its commit, its
    /// end) is fenced by the permit as well as by the term: a run whose permit lapsed (its
    /// node paused or cut off) commits nothing, and its work is stopped. A start that finds no
    /// free permit waits for one (looked for again within half a second), except a new slot
    /// of a job under [`Overlap::Skip`] (and not [`MissedSlots::RunAll`]), which is skipped.
    /// 1 to [`MAX_PERMITS`](crate::locks::MAX_PERMITS); [`max_running`](Self::max_running)
    /// still bounds the leader's own runs under [`Overlap::Allow`]. Default: no cap.
    pub fn cap(mut self, permits: u32) -> Self {
        self.cap = Some(Cap {
            group: None,
            permits,
        });
        self
    }

    /// As [`cap`](Self::cap), with the permits of the named group: every job naming `group`,
    /// in any scheduler on the same lease table, shares its `permits` (the semaphore
    /// `orion-beacon/job-group/<group>`). Give every job of a group the same `permits` (while
    /// they differ, the largest bounds the runs, as for any semaphore). A group name follows
    /// the resource rules, at most 200 characters.
    pub fn cap_group(mut self, group: impl Into<String>, permits: u32) -> Self {
        self.cap = Some(Cap {
            group: Some(group.into()),
            permits,
        });
        self
    }

    /// What happens to slots missed while no leader ran them. Default
    /// [`MissedSlots::RunLatest`].
    pub fn missed_slots(mut self, policy: MissedSlots) -> Self {
        self.missed = policy;
        self
    }

    /// What happens to a slot that comes due while an earlier one runs. Default
    /// [`Overlap::Skip`].
    pub fn overlap(mut self, policy: Overlap) -> Self {
        self.overlap = policy;
        self
    }

    /// How late after its time a slot still starts under [`MissedSlots::Skip`], and for a
    /// slot before the job was first seen by the leader (a new job's first slot after that
    /// runs however late). Default 60 s; [`MIN_STARTING_DEADLINE`] to [`MAX_WAIT`].
    pub fn starting_deadline(mut self, deadline: Duration) -> Self {
        self.starting_deadline = deadline;
        self
    }

    /// How many missed slots [`MissedSlots::RunAll`] runs at most (the newest). Default 100;
    /// 1 to [`MAX_CATCH_UP`].
    pub fn max_catch_up(mut self, slots: usize) -> Self {
        self.max_catch_up = slots;
        self
    }

    /// Attempts per slot before it is given up. Default 5; 1 to [`MAX_ATTEMPTS`].
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// The wait before a failed or crashed slot's next attempt, measured from the previous
    /// attempt's claim: `first`, doubling per attempt, at most `max`. Default 1 s and 5
    /// minutes; each at most [`MAX_WAIT`], `first` not above `max`.
    pub fn retry_backoff(mut self, first: Duration, max: Duration) -> Self {
        self.backoff = (first, max);
        self
    }

    /// An earlier name of this job, whose run records still count as this job's history: its
    /// newest recorded slot is where this job goes on from, so a slot finished under the old
    /// name never runs again under the new one. Call it once per earlier name; keep it for as
    /// long as a node that runs the old name may lead. Retries the old name still owed are
    /// not taken over: let them finish, or give them up, before the rename.
    pub fn renamed_from(mut self, old_name: impl Into<String>) -> Self {
        self.renamed_from.push(old_name.into());
        self
    }

    /// How stale is too stale: when no slot of this job has finished for longer than `limit`
    /// (by the database clock), the leader's [`JobsHandle::health`] lists it in
    /// [`stale`](JobsHealth::stale). `orion-beacon jobs check --stale-after` tells the same
    /// from the run table alone, and the metric `orion_beacon_job_last_finished_age_seconds`
    /// (feature `metrics`) carries the age of every job. A job that never finished counts from the leader's first look at it. Give it
    /// more than the schedule's interval plus the longest run and its retries. Default: no
    /// limit; 1 s to [`MAX_WAIT`].
    pub fn stale_after(mut self, limit: Duration) -> Self {
        self.stale_after = Some(limit);
        self
    }

    /// The job's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(super) fn policy(&self) -> Result<plan::Policy, JobError> {
        crate::store::validate_resource(&self.name).map_err(|_| JobError::InvalidName {
            name: self.name.clone(),
            reason: "must be 1 to 255 characters, without control characters or white space \
                     at either end",
        })?;
        let ms = |option: &'static str, d: Duration| {
            if d > MAX_WAIT {
                return Err(JobError::InvalidOption {
                    option,
                    value: format!("{d:?}"),
                    bounds: "at most 366 days",
                });
            }
            Ok(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        };
        if self.starting_deadline < MIN_STARTING_DEADLINE {
            return Err(JobError::InvalidOption {
                option: "starting_deadline",
                value: format!("{:?}", self.starting_deadline),
                bounds: "at least 1 s: the scheduler's own look can come that late after a \
                         slot's time on a busy node",
            });
        }
        if !(1..=MAX_CATCH_UP).contains(&self.max_catch_up) {
            return Err(JobError::InvalidOption {
                option: "max_catch_up",
                value: self.max_catch_up.to_string(),
                bounds: "1 to 10,000",
            });
        }
        if !(1..=MAX_ATTEMPTS).contains(&self.max_attempts) {
            return Err(JobError::InvalidOption {
                option: "max_attempts",
                value: self.max_attempts.to_string(),
                bounds: "1 to 1,000",
            });
        }
        if self.schedule.describe().len() > 255 {
            return Err(JobError::InvalidOption {
                option: "schedule",
                value: self.schedule.describe(),
                bounds: "at most 255 bytes as recorded",
            });
        }
        for old in &self.renamed_from {
            crate::store::validate_resource(old).map_err(|_| JobError::InvalidName {
                name: old.clone(),
                reason: "(an earlier name) must be 1 to 255 characters, without control \
                         characters or white space at either end",
            })?;
        }
        if let Some(limit) = self.stale_after {
            if !(Duration::from_secs(1)..=MAX_WAIT).contains(&limit) {
                return Err(JobError::InvalidOption {
                    option: "stale_after",
                    value: format!("{limit:?}"),
                    bounds: "1 s to 366 days",
                });
            }
        }
        if let Some(runs) = self.max_running {
            if !(1..=MAX_RUNNING).contains(&runs) {
                return Err(JobError::InvalidOption {
                    option: "max_running",
                    value: runs.to_string(),
                    bounds: "1 to 10,000",
                });
            }
        }
        if let Some(cap) = &self.cap {
            if !(1..=crate::locks::MAX_PERMITS).contains(&cap.permits) {
                return Err(JobError::InvalidOption {
                    option: "cap",
                    value: cap.permits.to_string(),
                    bounds: "1 to 1,024 permits",
                });
            }
            if let Some(group) = &cap.group {
                if group.chars().count() > MAX_GROUP_LEN
                    || crate::store::validate_resource(group).is_err()
                {
                    return Err(JobError::InvalidOption {
                        option: "cap_group",
                        value: format!("{group:?}"),
                        bounds: "1 to 200 characters, without control characters or white \
                                 space at either end",
                    });
                }
            }
        }
        if self.is_keyed() && !self.renamed_from.is_empty() {
            return Err(JobError::InvalidOption {
                option: "renamed_from",
                value: format!("{:?} on the keyed job {:?}", self.renamed_from, self.name),
                bounds: "none on a keyed job (its keys are recorded under its name only)",
            });
        }
        let (first, max) = self.backoff;
        if first > max {
            return Err(JobError::InvalidOption {
                option: "retry_backoff",
                value: format!("{first:?} > {max:?}"),
                bounds: "first at most max",
            });
        }
        Ok(plan::Policy {
            missed: self.missed,
            overlap: self.overlap,
            starting_deadline_ms: ms("starting_deadline", self.starting_deadline)?,
            max_catch_up: self.max_catch_up,
            max_attempts: self.max_attempts as i32,
            backoff_first_ms: ms("retry_backoff", first)?,
            backoff_max_ms: ms("retry_backoff", max)?,
            max_running: self.max_running.unwrap_or(usize::MAX),
        })
    }
}
