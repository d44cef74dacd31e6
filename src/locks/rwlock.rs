//! Reader-writer locks: a policy on the lease rows a [`Locks`](super::Locks) already holds.
//!
//! A reader-writer lock `name` of `R` read slots is `R + 1` lease rows: the read slots
//! `name#r0` ... `name#r{R-1}` and the writer's gate `name#w`. A reader holds one free slot;
//! a writer holds the gate and then every slot. Exclusion is the rows' own: no slot has two
//! holders, so while a writer holds all of them no reader holds any, and two writers cannot
//! both hold them all. The gate only orders writers among themselves and keeps readers out
//! while a writer collects the slots (a reader asks for a slot only while the gate is free),
//! so that a steady stream of readers cannot starve a writer: once a writer holds the gate it
//! waits for at most the readers already holding slots.
//!
//! A read hold's token is its slot's; a write hold's is the highest of its slots' tokens. A
//! writer took each slot after every earlier hold of it, so its token exceeds every earlier
//! reader's and writer's: a downstream row that remembers the highest token that wrote it
//! refuses a stale reader's (or writer's) write once a later writer wrote.
//!
//! Every handle of one name must have the same number of read slots: a writer takes only the
//! slots its handle has, so a reader of a handle with more could hold one the writer never took.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use super::guard::LockGuard;
use super::holder::{Attempt, Holder};
use super::{need_runtime, try_any, wait_for, LockError, MAX_PERMITS};
use crate::error::StoreError;
use crate::fencing::FencingToken;
use crate::hold::LeaderTerm;
use crate::store::validate_resource;

/// How many read slots a writer asks for at once (one statement each): a few, so that one
/// writer does not take every attempt session of its store.
pub(crate) const AT_ONCE: usize = 4;

/// The read slot a row is (`name#r3`: 3); `None` for the gate, which sorts first.
fn slot_number(resource: &str) -> Option<u32> {
    resource.rsplit_once("#r").and_then(|(_, n)| n.parse().ok())
}

/// A part's slot number (see [`slot_number`]).
fn slot_of(part: &LockGuard) -> Option<u32> {
    slot_number(part.resource())
}

/// A reader-writer lock: many readers (up to its read slots) or one writer, each hold with a
/// fencing token of its own. Made by [`Locks::rw_lock`](super::Locks::rw_lock).
#[derive(Clone)]
pub struct RwLock {
    pub(super) holder: Arc<Holder>,
    pub(super) name: Arc<str>,
    /// The read slots' rows, `name#r0` ...
    pub(super) slots: Arc<[Arc<str>]>,
    /// The writer's gate row, `name#w`.
    pub(super) gate: Arc<str>,
}

impl std::fmt::Debug for RwLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RwLock")
            .field("name", &&*self.name)
            .field("read_slots", &self.slots.len())
            .finish()
    }
}

impl RwLock {
    /// `name` with `slots` read slots, its names checked before any SQL.
    pub(super) fn new(holder: Arc<Holder>, name: String, slots: u32) -> Result<Self, LockError> {
        if slots == 0 || slots > MAX_PERMITS {
            return Err(LockError::Permits {
                permits: slots,
                max: MAX_PERMITS,
            });
        }
        validate_resource(&name)?;
        let rows: Vec<Arc<str>> = (0..slots)
            .map(|i| Arc::from(format!("{name}#r{i}")))
            .collect();
        for r in &rows {
            validate_resource(r)?;
        }
        let gate: Arc<str> = Arc::from(format!("{name}#w"));
        validate_resource(&gate)?;
        Ok(Self {
            holder,
            name: Arc::from(name),
            slots: rows.into(),
            gate,
        })
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many readers may hold it at once.
    pub fn read_slots(&self) -> u32 {
        u32::try_from(self.slots.len()).unwrap_or(MAX_PERMITS)
    }

    /// A read hold if one is to be had now: `None` while a writer holds or waits for the lock
    /// (its gate is held), when every read slot is held, or (rarely) as for
    /// [`Lock::try_acquire`](super::Lock::try_acquire).
    pub async fn try_read(&self) -> Result<Option<LockGuard>, LockError> {
        need_runtime()?;
        let candidate = self.holder.candidate();
        match try_any(
            &self.holder,
            &self.slots,
            Some(&self.gate),
            &candidate,
            true,
        )
        .await?
        {
            Attempt::Granted(term) => Ok(Some(self.read_guard(term))),
            Attempt::Denied(_) => Ok(None),
        }
    }

    /// A read hold, waiting up to `timeout` for one ([`LockError::Timeout`] then). It waits
    /// while a writer holds or waits for the lock.
    pub async fn read(&self, timeout: Duration) -> Result<LockGuard, LockError> {
        let (term, waited) = wait_for(
            &self.holder,
            &self.name,
            &self.slots,
            Some(&self.gate),
            Some(&self.slots[0]),
            timeout,
        )
        .await?;
        Ok(self
            .read_guard(term)
            .contended(waited.then(|| self.slots[0].clone())))
    }

    /// The write hold if it is to be had now: `None` when the gate or a read slot is held
    /// (seen by one read of them all, so nothing is taken then), or when one of them was taken
    /// meanwhile (what was taken is released before the answer). The gate is asked for first,
    /// then the free slots, four at a time.
    pub async fn try_write(&self) -> Result<Option<WriteGuard>, LockError> {
        need_runtime()?;
        let rows: Vec<String> = self.rows().map(|r| r.to_string()).collect();
        if self
            .holder
            .store
            .current_all(&rows)
            .await?
            .iter()
            .any(|r| r.live)
        {
            return Ok(None);
        }
        let candidate = self.holder.candidate();
        let gate = match self.holder.attempt(&self.gate, &candidate, true).await? {
            Attempt::Granted(term) => self.part(term),
            Attempt::Denied(_) => return Ok(None),
        };
        let mut parts = vec![gate];
        let (taken, left) = match self.take_free(&self.slots, false).await {
            Ok(answer) => answer,
            Err(err) => {
                release_all(parts).await;
                return Err(err.into());
            }
        };
        parts.extend(taken);
        if !left.is_empty() {
            release_all(parts).await;
            return Ok(None);
        }
        let guard = WriteGuard::new(self.name.clone(), parts);
        if guard.is_held() {
            Ok(Some(guard))
        } else {
            // A row taken first ended before the last was taken.
            guard.release().await?;
            Ok(None)
        }
    }

    /// The write hold, waiting up to `timeout` ([`LockError::Timeout`] then, and whatever was
    /// taken let go of, in the background): first the gate (from then on no new reader gets
    /// in); then the free read slots, four at a time; then each slot still held, one after the
    /// other, as its reader lets go. Should a row already taken be lost meanwhile (its renews failed), it lets go of all
    /// of them and starts again.
    pub async fn write(&self, timeout: Duration) -> Result<WriteGuard, LockError> {
        need_runtime()?;
        let started = crate::clock::now();
        let give_up = started.checked_add(timeout).unwrap_or(started);
        let timed_out = |err: LockError| match err {
            LockError::Timeout {
                name,
                holder,
                payload,
                ..
            } => LockError::Timeout {
                name,
                waited: crate::clock::now().saturating_duration_since(started),
                holder,
                payload,
            },
            other => other,
        };
        'again: loop {
            let left = give_up.saturating_duration_since(crate::clock::now());
            let gate = [self.gate.clone()];
            // The gate's wait yields as a lock's does.
            let (term, waited) = wait_for(
                &self.holder,
                &self.name,
                &gate,
                None,
                Some(&self.gate),
                left,
            )
            .await
            .map_err(timed_out)?;
            let mut parts = vec![self.part(term).contended(waited.then(|| self.gate.clone()))];
            // The slots free now, a few at a time, by the timeout (a try cut off releases what
            // it was granted); an error leaves them to the waits below.
            let held =
                match crate::clock::timeout_at(give_up, self.take_free(&self.slots, true)).await {
                    Ok(Ok((taken, held))) => {
                        parts.extend(taken);
                        held
                    }
                    Ok(Err(_)) => self.slots.to_vec(),
                    Err(_) => {
                        drop(parts);
                        return Err(LockError::Timeout {
                            name: self.name.to_string(),
                            waited: crate::clock::now().saturating_duration_since(started),
                            holder: None,
                            payload: None,
                        });
                    }
                };
            // Then each slot still held, as its reader lets go (never yielding: the gate is held
            // meanwhile), ready to start again should a row already taken be lost.
            for row in &held {
                let left = give_up.saturating_duration_since(crate::clock::now());
                let rows = [row.clone()];
                let waited = wait_for(&self.holder, &self.name, &rows, None, None, left);
                let lost = first_lost(&parts);
                let got = tokio::select! {
                    got = waited => got,
                    () = lost => {
                        // Released in the background: the wait starts again at once.
                        drop(parts);
                        continue 'again;
                    }
                };
                match got {
                    Ok((term, _)) => parts.push(self.part(term)),
                    Err(err) => {
                        // Let go of in the background: the answer comes by the timeout.
                        drop(parts);
                        return Err(timed_out(err));
                    }
                }
            }
            // In slot order: `fence` locks the rows in that order.
            parts[1..].sort_by_key(slot_of);
            let guard = WriteGuard::new(self.name.clone(), parts);
            if guard.is_held() {
                return Ok(guard);
            }
            drop(guard);
            if crate::clock::now() >= give_up {
                return Err(LockError::Timeout {
                    name: self.name.to_string(),
                    waited: crate::clock::now().saturating_duration_since(started),
                    holder: None,
                    payload: None,
                });
            }
        }
    }

    /// One try at each of `rows` (with `read`: each that a read of them shows free), [`AT_ONCE`]
    /// at a time, stopping after the first round with a denial: the rows taken, and those not
    /// taken (held, denied, or not tried). An error lets go of what was taken (in the
    /// background).
    async fn take_free(
        &self,
        rows: &[Arc<str>],
        read: bool,
    ) -> Result<(Vec<LockGuard>, Vec<Arc<str>>), StoreError> {
        let live: std::collections::HashSet<String> = if read {
            let names: Vec<String> = rows.iter().map(|r| r.to_string()).collect();
            self.holder
                .store
                .current_all(&names)
                .await?
                .into_iter()
                .filter(|r| r.live)
                .map(|r| r.resource)
                .collect()
        } else {
            Default::default()
        };
        let (mut taken, mut left) = (Vec::new(), Vec::new());
        let free: Vec<&Arc<str>> = rows
            .iter()
            .filter(|r| {
                let held = live.contains(&***r);
                if held {
                    left.push((*r).clone());
                }
                !held
            })
            .collect();
        let mut next = 0;
        while next < free.len() {
            let chunk = &free[next..free.len().min(next + AT_ONCE)];
            next += chunk.len();
            let tries = chunk.iter().map(|row| async move {
                let candidate = self.holder.candidate();
                let answer = self.holder.attempt(row, &candidate, true).await?;
                Ok::<_, StoreError>(match answer {
                    Attempt::Granted(term) => Ok(self.part(term)),
                    Attempt::Denied(_) => Err((*row).clone()),
                })
            });
            let mut denied = false;
            for answer in join_all(tries.collect()).await {
                match answer? {
                    Ok(part) => taken.push(part),
                    Err(row) => {
                        left.push(row);
                        denied = true;
                    }
                }
            }
            if denied {
                // Taken meanwhile: the rest is for the waits.
                left.extend(free[next..].iter().map(|r| (*r).clone()));
                break;
            }
        }
        Ok((taken, left))
    }

    /// The gate, then the read slots in order.
    fn rows(&self) -> impl Iterator<Item = &Arc<str>> {
        std::iter::once(&self.gate).chain(self.slots.iter())
    }

    fn read_guard(&self, term: LeaderTerm) -> LockGuard {
        let slot = slot_number(term.resource());
        LockGuard::new(term, self.name.clone(), slot, self.holder.clone())
    }

    fn part(&self, term: LeaderTerm) -> LockGuard {
        LockGuard::new(term, self.name.clone(), None, self.holder.clone())
    }
}

/// The write hold of a [`RwLock`]: its gate and every read slot, renewed with this process's
/// other holds. Dropping it releases them all in the background; [`release`](Self::release)
/// waits for the releases.
#[must_use = "the write hold is released when the guard is dropped"]
pub struct WriteGuard {
    name: Arc<str>,
    /// The gate first, then the read slots in order.
    parts: Vec<LockGuard>,
    token: FencingToken,
}

impl std::fmt::Debug for WriteGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteGuard")
            .field("name", &&*self.name)
            .field("token", &self.token)
            .field("rows", &self.parts.len())
            .finish()
    }
}

impl WriteGuard {
    fn new(name: Arc<str>, parts: Vec<LockGuard>) -> Self {
        // The highest token of the read slots: each was taken after every earlier hold of it.
        let token = parts
            .iter()
            .skip(1)
            .map(LockGuard::token)
            .max()
            .unwrap_or_else(|| parts.first().map_or(FencingToken::new(0), LockGuard::token));
        Self { name, parts, token }
    }

    /// This write hold's fencing token: strictly greater than every earlier read or write
    /// hold's token of the same lock.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether every row of the hold is still held right now (see [`LockGuard::is_held`]).
    pub fn is_held(&self) -> bool {
        self.parts.iter().all(LockGuard::is_held)
    }

    /// Completes when any row of the hold is lost (or released): the write hold is over then.
    /// Each call makes a new future; one that completed must not be polled again.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        first_lost(&self.parts)
    }

    /// The terms of the hold's read slots, in slot order. A statement-level fence
    /// ([`SeaOrmLeaseStore::fenced_by`](crate::SeaOrmLeaseStore::fenced_by)) of a write must
    /// name every one of them.
    pub fn terms(&self) -> impl Iterator<Item = &LeaderTerm> {
        self.parts.iter().skip(1).map(LockGuard::term)
    }

    /// Fences `txn` with the write hold: every read slot's row checked and locked, in slot
    /// order (one statement each), as [`LockGuard::fence`] does for one; on
    /// [`FenceError::Fenced`](crate::FenceError::Fenced), roll back.
    pub async fn fence<C: sea_orm::ConnectionTrait>(
        &self,
        txn: &C,
    ) -> Result<(), crate::error::FenceError> {
        for term in self.terms() {
            term.fence(txn).await?;
        }
        Ok(())
    }

    /// Releases the write hold now, all its rows at once: `true` when the store released every
    /// one of them. It counts as released from this call on, whatever the store answers (an
    /// error leaves the rows it names to lapse).
    pub async fn release(mut self) -> Result<bool, LockError> {
        let parts = std::mem::take(&mut self.parts);
        let mut all = true;
        let mut failed = None;
        for answer in join_all(parts.into_iter().map(LockGuard::release).collect()).await {
            match answer {
                Ok(released) => all &= released,
                Err(err) => failed = Some(err),
            }
        }
        match failed {
            Some(err) => Err(err),
            None => Ok(all),
        }
    }
}

/// Completes when any of `parts` is lost (never, for none).
fn first_lost(parts: &[LockGuard]) -> impl Future<Output = ()> + Send + 'static {
    let mut each: Vec<Pin<Box<dyn Future<Output = ()> + Send>>> = parts
        .iter()
        .map(|p| Box::pin(p.lost()) as Pin<Box<dyn Future<Output = ()> + Send>>)
        .collect();
    std::future::poll_fn(move |cx| {
        // Every one is polled, so each registers the waker.
        let mut done = false;
        for f in each.iter_mut() {
            done |= f.as_mut().poll(cx).is_ready();
        }
        if done {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
}

/// Releases `parts` at once and waits for the answers (each release runs on a task of its own
/// where there is a runtime, so a caller that stops waiting does not stop them).
async fn release_all(parts: Vec<LockGuard>) {
    for answer in join_all(parts.into_iter().map(LockGuard::release).collect()).await {
        if let Err(err) = answer {
            tracing::debug!(error = %err, "releasing a reader-writer lock row failed; it lapses");
        }
    }
}

/// Every future of `futures` to its end, polled together; their answers in order.
async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut each: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = each.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, slot) in each.iter_mut().zip(out.iter_mut()) {
            if slot.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *slot = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}
