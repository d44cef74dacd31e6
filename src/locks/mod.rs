//! Distributed locks and counting semaphores on the lease table, with a fencing token per hold.
//!
//! A [`Locks`] serves one store: every lock and permit it holds is a lease row, renewed in the
//! background by **one** [`renew_all`](crate::LeaseStore::renew_all) per round however many
//! are held, and trusted by the same local-deadline rule as an elector's term (so a paused or
//! cut-off process stops holding before the database can give the lock to anyone else). A
//! [`Lock`] has one holder at a time; a [`Semaphore`] of N permits has at most N, each permit
//! its own lease with its own token.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use orion_beacon::locks::Locks;
//!
//! let locks = Locks::new(orion_beacon::InMemoryLeaseStore::new())?; // or a SeaOrmLeaseStore
//! let report = locks.lock("nightly-report")?;
//! let guard = report.acquire(Duration::from_secs(10)).await?;
//! // ... work, fencing its writes with guard.fence(&txn) or guard.token() ...
//! assert!(report.try_acquire().await?.is_none(), "one holder at a time");
//! guard.release().await?;
//!
//! let exports = locks.semaphore("exports", 4)?; // at most four at once
//! let permit = exports.acquire(Duration::from_secs(10)).await?;
//! # drop(permit);
//! # Ok(()) }
//! ```
//!
//! **No re-entrancy.** Each acquire is a holder of its own (its own candidate id and, once
//! granted, its own token), so a second acquire of a lock the same process holds waits or fails
//! like anyone else's: a token per holder is what makes a fenced write name exactly one hold.
//!
//! **Waiting.** [`Lock::acquire`] and [`Semaphore::acquire`] ask again when a release
//! notification names the lock (PostgreSQL, SQLite), otherwise at the retry interval or right after the
//! holder's lease ends, whichever is sooner, until the timeout. There is no queue: when a lock
//! comes free, whichever waiter asks first gets it.
//!
//! **Semaphores' permits** are the lease rows `name#0` to `name#N-1`. An acquire reads them in
//! one statement and tries the free ones in a random order. Changing N for a running
//! semaphore: a handle with more permits uses more rows at once, so while handles with
//! different N run, the largest N bounds the holders; a smaller N takes effect as the holders
//! of the higher permits release them.
//!
//! Lock names follow the resource rules ([`validate_resource`](crate::store::validate_resource()))
//! and share the lease table with electors and shard sets: a lock named like an elector's
//! resource is that resource.

mod error;
mod guard;
mod holder;
mod rwlock;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use error::LockError;
pub use guard::LockGuard;
#[cfg(feature = "jobs")]
pub(crate) use holder::is_hold_holder;
use holder::{Attempt, Config, Holder};
pub use rwlock::{RwLock, WriteGuard};

use crate::hold::timing::{
    check_interval, timing_setter, ConfigError, TimingDefaults, TimingOptions, MAX_INTERVAL,
};
use crate::hold::{default_candidate_id, LeaderTerm, LossReason};
use crate::store::validate_resource;
use crate::{error::StoreError, lease::Denial, store::LeaseStore};

/// The default lease of a lock or permit (15 s, as an elector's).
pub const DEFAULT_LOCK_LEASE: Duration = Duration::from_secs(15);
/// The default renew interval (5 s).
pub const DEFAULT_LOCK_RENEW_INTERVAL: Duration = Duration::from_secs(5);
/// The default interval at which a waiting acquire asks again (250 ms), when no release
/// notification or lease end comes sooner.
pub const DEFAULT_LOCK_RETRY_INTERVAL: Duration = Duration::from_millis(250);
/// The most permits a semaphore has.
pub const MAX_PERMITS: u32 = 1024;

/// The locks and semaphores of one process on one store. Cheap to clone; clones share the
/// holds and their renewer. The renewer runs on the tokio runtime from the first acquire until
/// the last `Locks`, [`Lock`], [`Semaphore`] and [`LockGuard`] of it is dropped.
#[derive(Clone)]
pub struct Locks {
    holder: Arc<Holder>,
}

impl std::fmt::Debug for Locks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.holder.config;
        f.debug_struct("Locks")
            .field("owner", &&*c.owner)
            .field("lease", &c.timing.lease)
            .field("held", &self.holder.held_count())
            .finish_non_exhaustive()
    }
}

impl Locks {
    /// Locks on `store` with the default options.
    pub fn new<S: LeaseStore + 'static>(store: S) -> Result<Self, ConfigError> {
        Self::builder(store).build()
    }

    /// Locks on `store`, options to follow.
    pub fn builder<S: LeaseStore + 'static>(store: S) -> LocksBuilder {
        LocksBuilder {
            renewer: crate::hold::renewer::Renewer::of(&store),
            store: Arc::new(store),
            owner: None,
            timing: TimingOptions::default(),
            retry_interval: None,
            payload: None,
        }
    }

    /// The lock `name`: refused before any SQL when the name breaks the resource rules.
    pub fn lock(&self, name: impl Into<String>) -> Result<Lock, LockError> {
        let name = name.into();
        validate_resource(&name)?;
        Ok(Lock {
            holder: self.holder.clone(),
            name: Arc::from(name),
        })
    }

    /// The counting semaphore `name` of `permits` permits (1 to [`MAX_PERMITS`]).
    pub fn semaphore(&self, name: impl Into<String>, permits: u32) -> Result<Semaphore, LockError> {
        let name = name.into();
        if permits == 0 || permits > MAX_PERMITS {
            return Err(LockError::Permits {
                permits,
                max: MAX_PERMITS,
            });
        }
        validate_resource(&name)?;
        let resources: Vec<Arc<str>> = (0..permits)
            .map(|i| Arc::from(format!("{name}#{i}")))
            .collect();
        for r in &resources {
            validate_resource(r)?;
        }
        Ok(Semaphore {
            holder: self.holder.clone(),
            name: Arc::from(name),
            resources: resources.into(),
        })
    }

    /// The reader-writer lock `name`: many readers (at most `read_slots`, 1 to
    /// [`MAX_PERMITS`]) or one writer. Its rows are `name#r0` ... and `name#w` (see
    /// [`RwLock`]); refused before any SQL when a name breaks the resource rules.
    pub fn rw_lock(&self, name: impl Into<String>, read_slots: u32) -> Result<RwLock, LockError> {
        RwLock::new(self.holder.clone(), name.into(), read_slots)
    }

    /// How many locks and permits this process holds through these locks now.
    pub fn held(&self) -> usize {
        self.holder.held_count()
    }
}

/// Options of [`Locks`]; [`build`](Self::build) checks them.
#[must_use]
pub struct LocksBuilder {
    store: Arc<dyn LeaseStore>,
    renewer: crate::hold::renewer::Renewer,
    owner: Option<String>,
    /// The lease, the renew interval and the step-down margin (no grace period: a lock's
    /// work is the caller's, not ours to wait for).
    timing: TimingOptions,
    retry_interval: Option<Duration>,
    payload: Option<String>,
}

impl std::fmt::Debug for LocksBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocksBuilder")
            .field("owner", &self.owner)
            .field("timing", &self.timing)
            .field("retry_interval", &self.retry_interval)
            .finish_non_exhaustive()
    }
}

impl LocksBuilder {
    /// This process's name in the lease rows (each hold is `owner/<random>-<n>`); 1 to 200
    /// characters.
    /// Default: host name, process id and a random part, as an elector's candidate id.
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    timing_setter!(
        /// How long a hold lasts without a renew (default [`DEFAULT_LOCK_LEASE`]).
        lease_duration(lease) => timing.lease
    );

    timing_setter!(
        /// How often the holds are renewed, all in one statement (default
        /// [`DEFAULT_LOCK_RENEW_INTERVAL`]); twice it must fit in the lease less the margin.
        renew_interval(interval) => timing.renew_interval
    );

    /// How often a waiting acquire asks again when nothing wakes it sooner (default
    /// [`DEFAULT_LOCK_RETRY_INTERVAL`]).
    pub fn retry_interval(mut self, interval: Duration) -> Self {
        self.retry_interval = Some(interval);
        self
    }

    timing_setter!(
        /// How long before the lease's end a hold stops counting as held (default a tenth of the
        /// lease), as an elector's.
        step_down_margin(margin) => timing.step_down_margin
    );

    /// A payload written into every hold's lease by the statement that grants it (this
    /// process's address, say; at most [`MAX_PAYLOAD_LEN`](crate::store::MAX_PAYLOAD_LEN)
    /// bytes): waiters that time out get it in [`LockError::Timeout`], and
    /// [`LeaseStore::current`] shows it. The lease table needs its payload columns (the
    /// `AddLeasePayload` migration). Default: none.
    pub fn payload(mut self, payload: impl Into<String>) -> Self {
        self.payload = Some(payload.into());
        self
    }

    /// Checks the options (the elector's rules: no zero or overlong duration, a margin in its
    /// bounds, room for a retried renew) and makes the locks.
    pub fn build(self) -> Result<Locks, ConfigError> {
        let owner = self.owner.unwrap_or_else(default_candidate_id);
        if owner.chars().count() > 200 {
            return Err(ConfigError::Invalid(StoreError::InvalidCandidate {
                name: owner,
                reason: "must be at most 200 characters for a lock owner",
            }));
        }
        crate::store::validate_candidate(&owner)?;
        crate::store::validate_candidate(&format!("{owner}/{:016x}-{}", u64::MAX, u64::MAX))?;
        let retry_interval = self.retry_interval.unwrap_or(DEFAULT_LOCK_RETRY_INTERVAL);
        check_interval("retry_interval", retry_interval)?;
        let timing = self.timing.check(TimingDefaults {
            lease: DEFAULT_LOCK_LEASE,
            renew: ("renew_interval", DEFAULT_LOCK_RENEW_INTERVAL),
            grace_period: Duration::ZERO,
        })?;
        if let Some(payload) = &self.payload {
            crate::store::validate_payload(payload)?;
        }
        self.store.validate()?;
        let fence = self.store.sea_orm_store().cloned();
        let config = Config {
            payload: self.payload.map(Arc::from),
            owner: Arc::from(owner),
            timing,
            retry_interval,
        };
        Ok(Locks {
            holder: Arc::new(Holder::new(self.store, self.renewer, fence, config)),
        })
    }
}

/// A named lock: one holder at a time, each hold with its own fencing token.
#[derive(Clone)]
pub struct Lock {
    holder: Arc<Holder>,
    name: Arc<str>,
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock").field("name", &&*self.name).finish()
    }
}

impl Lock {
    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Takes the lock if it is free now; `None` if someone holds it, or another acquire of this
    /// process is asking for it at this moment (it gets the lock if it is free), or, rarely,
    /// when the grant answered too late to be trusted (it is released, and the next try may
    /// succeed).
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>, LockError> {
        need_runtime()?;
        let candidate = self.holder.candidate();
        match self.holder.attempt(&self.name, &candidate, true).await? {
            Attempt::Granted(term) => Ok(Some(self.guard(term))),
            Attempt::Denied(_) => Ok(None),
        }
    }

    /// Takes the lock, waiting up to `timeout` for it ([`LockError::Timeout`] then).
    pub async fn acquire(&self, timeout: Duration) -> Result<LockGuard, LockError> {
        let resources = [self.name.clone()];
        let (term, waited) = wait_for(
            &self.holder,
            &self.name,
            &resources,
            None,
            Some(&resources[0]),
            timeout,
        )
        .await?;
        Ok(self
            .guard(term)
            .contended(waited.then(|| resources[0].clone())))
    }

    /// Runs `work` while holding the lock (waiting up to `timeout` for it) and releases it
    /// after. If the lock is lost first, `work`'s future is dropped at that moment and the
    /// answer is [`LockError::Lost`]. `work` gets the hold's term, to fence its writes with.
    pub async fn with_lock<F, Fut, T>(&self, timeout: Duration, work: F) -> Result<T, LockError>
    where
        F: FnOnce(LeaderTerm) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.acquire(timeout).await?;
        scoped(guard, work).await
    }

    fn guard(&self, term: LeaderTerm) -> LockGuard {
        LockGuard::new(term, self.name.clone(), None, self.holder.clone())
    }
}

/// A counting semaphore: at most N holders at once, each permit its own lease and token.
#[derive(Clone)]
pub struct Semaphore {
    holder: Arc<Holder>,
    name: Arc<str>,
    resources: Arc<[Arc<str>]>,
}

impl std::fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &&*self.name)
            .field("permits", &self.resources.len())
            .finish()
    }
}

impl Semaphore {
    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many permits it has.
    pub fn permits(&self) -> u32 {
        u32::try_from(self.resources.len()).unwrap_or(MAX_PERMITS)
    }

    /// Takes a free permit if there is one now; `None` if all are held or being asked for by
    /// other acquires of this process (or, rarely, as for [`Lock::try_acquire`]).
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>, LockError> {
        need_runtime()?;
        let candidate = self.holder.candidate();
        match try_any(&self.holder, &self.resources, None, &candidate, true).await? {
            Attempt::Granted(term) => Ok(Some(self.guard(term))),
            Attempt::Denied(_) => Ok(None),
        }
    }

    /// Takes a permit, waiting up to `timeout` for one ([`LockError::Timeout`] then).
    pub async fn acquire(&self, timeout: Duration) -> Result<LockGuard, LockError> {
        let (term, waited) = wait_for(
            &self.holder,
            &self.name,
            &self.resources,
            None,
            Some(&self.resources[0]),
            timeout,
        )
        .await?;
        Ok(self
            .guard(term)
            .contended(waited.then(|| self.resources[0].clone())))
    }

    /// Runs `work` while holding a permit, as [`Lock::with_lock`] does.
    pub async fn with_permit<F, Fut, T>(&self, timeout: Duration, work: F) -> Result<T, LockError>
    where
        F: FnOnce(LeaderTerm) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.acquire(timeout).await?;
        scoped(guard, work).await
    }

    fn guard(&self, term: LeaderTerm) -> LockGuard {
        let permit = term
            .resource()
            .rsplit_once('#')
            .and_then(|(_, n)| n.parse().ok());
        LockGuard::new(term, self.name.clone(), permit, self.holder.clone())
    }
}

/// Runs `work` under `guard` until it returns or the hold is lost, then releases.
async fn scoped<F, Fut, T>(guard: LockGuard, work: F) -> Result<T, LockError>
where
    F: FnOnce(LeaderTerm) -> Fut,
    Fut: Future<Output = T>,
{
    let lost = guard.lost();
    let out = tokio::select! {
        biased;
        () = lost => None,
        out = work(guard.term().clone()) => Some(out),
    };
    match out {
        Some(out) => {
            // The work is done: its answer stands even if the release fails (the lease then
            // lapses).
            if let Err(err) = guard.release().await {
                tracing::warn!(error = %err, "releasing a lock after its work failed; it lapses");
            }
            Ok(out)
        }
        None => Err(LockError::Lost {
            name: guard.name().to_owned(),
            reason: guard.term().loss_reason().unwrap_or(LossReason::Denied),
        }),
    }
}

/// Locks take, renew and wait on tokio: refused outside a runtime, before any SQL.
fn need_runtime() -> Result<(), LockError> {
    tokio::runtime::Handle::try_current()
        .map(|_| ())
        .map_err(|_| LockError::NoRuntime)
}

/// One try at each of `resources` that looks free (all of them for one), in a random order.
/// With a `gate` (a reader-writer lock's writer row), nothing is tried while the gate is live:
/// the answer is then a denial naming the gate's holder.
async fn try_any(
    holder: &Arc<Holder>,
    resources: &[Arc<str>],
    gate: Option<&Arc<str>>,
    candidate: &Arc<str>,
    once: bool,
) -> Result<Attempt, StoreError> {
    if let ([only], None) = (resources, gate) {
        return holder.attempt(only, candidate, once).await;
    }
    let names: Vec<String> = resources
        .iter()
        .chain(gate)
        .map(|r| r.to_string())
        .collect();
    let mut records = holder.store.current_all(&names).await?;
    let denial = |r: &crate::lease::LeaseRecord| Denial {
        resource: r.resource.clone(),
        holder: Some(r.holder.clone()),
        token: Some(r.token),
        remaining: r.remaining,
        expires_at: r.expires_at,
        payload: r.payload.clone(),
        stalled: None,
    };
    if let Some(gate) = gate {
        if let Some(i) = records.iter().position(|r| *r.resource == **gate) {
            let gated = records.swap_remove(i);
            if gated.live {
                return Ok(Attempt::Denied(Some(denial(&gated))));
            }
        }
    }
    // The permit whose lease ends first, to wait for when none is free.
    let mut last: Option<Denial> = records
        .iter()
        .filter(|r| r.live)
        .min_by_key(|r| r.remaining)
        .map(denial);
    let live: HashSet<String> = records
        .into_iter()
        .filter(|r| r.live)
        .map(|r| r.resource)
        .collect();
    let mut free: Vec<&Arc<str>> = resources.iter().filter(|r| !live.contains(&***r)).collect();
    // Fisher-Yates: waiters spread over the free permits instead of all racing for the first.
    for i in (1..free.len()).rev() {
        let j = usize::try_from(crate::random::random_u64() % (i as u64 + 1)).unwrap_or(0);
        free.swap(i, j);
    }
    for resource in free {
        match holder.attempt(resource, candidate, once).await? {
            Attempt::Granted(term) => return Ok(Attempt::Granted(term)),
            // The denial whose lease ends first, to wait for.
            Attempt::Denied(Some(denial)) => {
                if last.as_ref().is_none_or(|l| denial.remaining < l.remaining) {
                    last = Some(denial);
                }
            }
            // Being released under this candidate id: the caller takes another.
            Attempt::Denied(None) => return Ok(Attempt::Denied(None)),
        }
    }
    Ok(Attempt::Denied(last))
}

/// Tries `resources` until one is granted or `timeout` passes; woken by release notifications
/// for them where the store has them, by the holder's lease end, or at the retry interval.
/// The term, and whether it had to wait for it: denied by another process's hold first.
/// `yield_key`: the key this process yields under after a contended hold (see
/// `Holder::yielded`), `None` for a wait that must not yield (a writer collecting its slots).
async fn wait_for(
    holder: &Arc<Holder>,
    name: &Arc<str>,
    resources: &[Arc<str>],
    gate: Option<&Arc<str>>,
    yield_key: Option<&Arc<str>>,
    timeout: Duration,
) -> Result<(LeaderTerm, bool), LockError> {
    need_runtime()?;
    if timeout > MAX_INTERVAL {
        return Err(LockError::TimeoutTooLong {
            timeout,
            max: MAX_INTERVAL,
        });
    }
    let started = crate::clock::now();
    let give_up = started.checked_add(timeout).unwrap_or(started);
    let mut events = holder.store.release_events();
    // What a release notification may name for this wait: the resources, and the gate.
    let watched: Vec<Arc<str>> = resources.iter().chain(gate).cloned().collect();
    let mut candidate = holder.candidate();
    let mut last_holder: Option<(String, Option<String>)> = None;
    let mut last_error: Option<StoreError>;
    let mut waited = false;
    // This process let go of a contended hold of this lock a moment ago: the waiters get one
    // retry interval to take it before this acquire competes with them (see `Holder::yielded`),
    // unless that would leave this acquire no attempt before its timeout.
    if let Some(until) = yield_key
        .and_then(|key| holder.yielding(key))
        .filter(|until| *until < give_up)
    {
        crate::clock::sleep_until(until).await;
    }
    let timed_out =
        |now: tokio::time::Instant,
         last_error: Option<StoreError>,
         last_holder: Option<(String, Option<String>)>| match last_error {
            Some(err) => LockError::from(err),
            None => {
                let (holder, payload) = last_holder.map_or((None, None), |(h, p)| (Some(h), p));
                LockError::Timeout {
                    name: name.to_string(),
                    waited: now.saturating_duration_since(started),
                    holder,
                    payload,
                }
            }
        };
    loop {
        // Bounded by the timeout: a hung store must not hold the caller past it (an attempt
        // cut off here releases whatever it is granted).
        let attempt =
            crate::clock::timeout_at(give_up, try_any(holder, resources, gate, &candidate, false))
                .await
                .unwrap_or(Ok(Attempt::Denied(None)));
        let soonest = match attempt {
            Ok(Attempt::Granted(term)) => return Ok((term, waited)),
            Ok(Attempt::Denied(None)) => {
                candidate = holder.candidate();
                last_error = None;
                None
            }
            Ok(Attempt::Denied(Some(denial))) => {
                if let Some(h) = denial.holder {
                    // Only another process's hold is contention to yield for later.
                    waited |= !holder.is_ours(&h);
                    last_holder = Some((h, denial.payload));
                }
                last_error = None;
                Some(denial.remaining)
            }
            Err(err) if err.is_permanent() => return Err(err.into()),
            Err(err) => {
                // The attempt may have been granted unseen: it is released under its candidate
                // id in the background, and the next attempt is a holder of its own.
                candidate = holder.candidate();
                last_error = Some(err);
                None
            }
        };
        let now = crate::clock::now();
        if now >= give_up {
            return Err(timed_out(now, last_error, last_holder));
        }
        // Right after the holder's lease ends, if that is sooner than the retry interval.
        let mut wait = holder.config.retry_interval;
        if let Some(ends_in) = soonest.filter(|d| !d.is_zero()) {
            wait = wait.min(ends_in.saturating_add(Duration::from_millis(5)));
        }
        let at = now.checked_add(wait).unwrap_or(give_up).min(give_up);
        let sleep = crate::clock::sleep_until(at);
        let mut closed = false;
        if let Some(rx) = events.as_mut() {
            // Where the store's wake-ups need to know what is waited for (MySQL's named locks).
            let _waiting = holder
                .store
                .sea_orm_store()
                .and_then(|store| store.waiting(&watched, at));
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    () = &mut sleep => break,
                    event = rx.recv() => match event {
                        Ok(released) if watched.iter().any(|r| **r == *released) => break,
                        Ok(_) => {}
                        // Missed some: one of them may have been ours.
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                            closed = true;
                            break;
                        }
                    },
                }
            }
        } else {
            sleep.await;
        }
        if closed {
            events = None;
        }
        // Out of time while waiting: no attempt that could only be cut off (and granted to
        // nobody, then released again).
        let now = crate::clock::now();
        if now >= give_up {
            return Err(timed_out(now, last_error, last_holder));
        }
    }
}
