//! The process-local lease store.

use crate::mutex::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio::time::Instant;

use crate::membership::{
    validate_candidate_heartbeat, validate_heartbeat, validate_shard_set, Candidate, Holding,
    Member, MembershipStore,
};
use crate::store::{
    offer_holder, validate_batch, validate_candidate, validate_offer, validate_payload,
    validate_request, validate_resource, validate_take,
};
use crate::{
    error::StoreError, fencing::FencingToken, lease::Denial, lease::Lease, lease::LeaseOutcome,
    lease::LeaseRecord, lease::Renewals, store::LeaseStore,
};

#[derive(Debug, Clone)]
struct Membership {
    expires: Instant,
    draining: bool,
    holding: Option<Holding>,
    /// When the current membership began (a row that had lapsed begins a new one).
    joined: Instant,
    /// A ranked candidate's rank (candidates are kept under `stored_candidates` names).
    rank: Option<i64>,
}

#[derive(Debug, Clone)]
struct Slot {
    holder: String,
    token: i64,
    expires: Instant,
    /// The payload the term's latest grant or renew wrote.
    payload: Option<String>,
}

/// The least a renew moves a term's expiry on, as the database stores do by one step of their
/// column (1 µs on PostgreSQL and MariaDB).
const TICK: Duration = Duration::from_micros(1);

impl Slot {
    /// Renews the term: a whole `lease` from `now`, and at least [`TICK`] after the expiry it
    /// replaces (two renews at one instant, or one asking for a shorter lease, would otherwise
    /// write an expiry that names an earlier write). Returns the remaining time.
    fn renew(&mut self, now: Instant, lease: Duration) -> Duration {
        self.expires = (now + lease).max(self.expires + TICK);
        self.expires - now
    }
}

/// A [`LeaseStore`] in this process's memory: one leader per resource among the electors that
/// share it (clones share the same leases), not across processes.
///
/// Its clock is [`tokio::time::Instant`], so tests can pause and advance time. Expiries are
/// reported on that clock too, mapped onto the wall time at which the store was created (so
/// they identify a write exactly, as [`LeaseStore::release_lease`] needs: a renew ends at
/// least 1 µs after the write it replaces, so no two writes of a term share an expiry,
/// not even two at one instant of paused time); `acquired_at` and `renewed_at` are `None`.
#[derive(Clone)]
pub struct InMemoryLeaseStore {
    slots: Arc<Mutex<HashMap<String, Slot>>>,
    /// Shard set members by (shard set, member).
    members: Arc<Mutex<HashMap<(String, String), Membership>>>,
    /// Rate-limit keys: (TAT, permits granted), in µs on the store's clock.
    rates: Arc<Mutex<HashMap<String, (i64, i64)>>>,
    released: tokio::sync::broadcast::Sender<Arc<str>>,
    origin: (Instant, DateTime<Utc>),
}

/// What a log needs: how many leases and members the store holds, never their contents (a
/// store with thousands of shards would print every one of them with each term).
impl std::fmt::Debug for InMemoryLeaseStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let count = |len: Result<usize, ()>| len.map_or("?".to_owned(), |n| n.to_string());
        f.debug_struct("InMemoryLeaseStore")
            .field("backend", &"memory")
            .field(
                "resources",
                &format_args!(
                    "{}",
                    count(self.slots.try_lock().map(|s| s.len()).map_err(drop))
                ),
            )
            .field(
                "members",
                &format_args!(
                    "{}",
                    count(self.members.try_lock().map(|m| m.len()).map_err(drop))
                ),
            )
            .finish_non_exhaustive()
    }
}

impl Default for InMemoryLeaseStore {
    fn default() -> Self {
        Self {
            slots: Arc::default(),
            members: Arc::default(),
            rates: Arc::default(),
            released: tokio::sync::broadcast::channel(64).0,
            origin: (Instant::now(), Utc::now()),
        }
    }
}

impl InMemoryLeaseStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// `at` on the store's wall-clock axis: exact, so equal instants give equal timestamps.
    fn wall(&self, at: Instant) -> Option<DateTime<Utc>> {
        let (origin, wall) = self.origin;
        if at >= origin {
            wall.checked_add_signed(chrono::TimeDelta::from_std(at - origin).ok()?)
        } else {
            wall.checked_sub_signed(chrono::TimeDelta::from_std(origin - at).ok()?)
        }
    }

    fn members_of(&self, shard_set: &str, now: Instant) -> Vec<Member> {
        let members = lock(&self.members);
        let mut live: Vec<Member> = members
            .iter()
            .filter(|((set, _), m)| set == shard_set && m.expires > now)
            .map(|((set, id), m)| {
                let mut member = Member::new(set, id, m.expires - now);
                member.draining = m.draining;
                member.holding = m.holding;
                member
            })
            .collect();
        live.sort_by(|a, b| a.member.cmp(&b.member));
        live
    }

    fn beat(
        &self,
        shard_set: &str,
        member: &str,
        ttl: Duration,
        draining: bool,
        holding: Option<Holding>,
    ) -> Result<Vec<Member>, StoreError> {
        let millis = validate_heartbeat(shard_set, member, ttl)?;
        let now = Instant::now();
        self.write_member(shard_set, member, millis, now, |m| {
            m.draining = draining;
            m.holding = holding;
        });
        Ok(self.members_of(shard_set, now))
    }

    /// Writes the row of `member` of the (stored) set `set`, live for `millis` from `now`:
    /// its membership goes on if it was live, else begins now.
    fn write_member(
        &self,
        set: &str,
        member: &str,
        millis: i64,
        now: Instant,
        fill: impl FnOnce(&mut Membership),
    ) {
        let expires = now + Duration::from_millis(millis.unsigned_abs());
        let mut members = lock(&self.members);
        let row = members
            .entry((set.to_owned(), member.to_owned()))
            .or_insert(Membership {
                expires: now,
                draining: false,
                holding: None,
                joined: now,
                rank: None,
            });
        if row.expires <= now {
            row.joined = now;
        }
        row.expires = expires;
        fill(row);
    }

    /// Removes the row of `member` under the stored name `stored` (a shard set's or an
    /// election's) and the lapsed rows under it: whether the row was live.
    fn remove(&self, stored: &str, member: &str) -> bool {
        let now = Instant::now();
        let mut members = lock(&self.members);
        let was_live = members
            .remove(&(stored.to_owned(), member.to_owned()))
            .is_some_and(|m| m.expires > now);
        members.retain(|(set, _), m| set != stored || m.expires > now);
        was_live
    }

    fn candidates_of(&self, stored: &str, now: Instant) -> Vec<Candidate> {
        let members = lock(&self.members);
        let mut live: Vec<Candidate> = members
            .iter()
            .filter(|((set, _), m)| set == stored && m.expires > now)
            .filter_map(|((_, id), m)| {
                Some(Candidate::new(id, m.rank?, now - m.joined, m.expires - now))
            })
            .collect();
        live.sort_by(|a, b| a.candidate.cmp(&b.candidate));
        live
    }

    fn slots(&self) -> MutexGuard<'_, HashMap<String, Slot>> {
        lock(&self.slots)
    }
}

#[async_trait]
impl crate::rate_limit::RateLimitStore for InMemoryLeaseStore {
    /// The GCRA decision on the store's clock ([`Instant`], so paused time moves it), in µs
    /// on its wall-clock axis.
    async fn take_permit(
        &self,
        key: &str,
        quota: &crate::rate_limit::Quota,
    ) -> Result<crate::rate_limit::RateOutcome, StoreError> {
        crate::rate_limit::validate_key(key)?;
        let (origin, wall) = self.origin;
        let since = i64::try_from(Instant::now().saturating_duration_since(origin).as_micros())
            .unwrap_or(i64::MAX);
        let now = wall.timestamp_micros().saturating_add(since);
        let mut rates = lock(&self.rates);
        let stored = rates.get(key).copied();
        let (granted, tat) = crate::rate_limit::decide(stored.map(|s| s.0), now, quota);
        let permits = stored.map_or(0, |s| s.1) + i64::from(granted);
        rates.insert(key.to_owned(), (tat, permits));
        drop(rates);
        crate::rate_limit::outcome(key, quota, granted, permits, tat - now, now)
    }
}

#[async_trait]
impl MembershipStore for InMemoryLeaseStore {
    async fn heartbeat(
        &self,
        shard_set: &str,
        member: &str,
        ttl: Duration,
        draining: bool,
    ) -> Result<Vec<Member>, StoreError> {
        self.beat(shard_set, member, ttl, draining, None)
    }

    async fn heartbeat_holding(
        &self,
        shard_set: &str,
        member: &str,
        ttl: Duration,
        draining: bool,
        holding: Holding,
    ) -> Result<Vec<Member>, StoreError> {
        self.beat(shard_set, member, ttl, draining, Some(holding))
    }

    async fn leave(&self, shard_set: &str, member: &str) -> Result<bool, StoreError> {
        validate_shard_set(shard_set)?;
        validate_candidate(member)?;
        Ok(self.remove(shard_set, member))
    }

    async fn members(&self, shard_set: &str) -> Result<Vec<Member>, StoreError> {
        validate_shard_set(shard_set)?;
        Ok(self.members_of(shard_set, Instant::now()))
    }

    async fn candidate_heartbeat(
        &self,
        resource: &str,
        candidate: &str,
        ttl: Duration,
        rank: i64,
    ) -> Result<Vec<Candidate>, StoreError> {
        let (stored, millis) = validate_candidate_heartbeat(resource, candidate, ttl, "")?;
        let now = Instant::now();
        self.write_member(&stored, candidate, millis, now, |m| m.rank = Some(rank));
        Ok(self.candidates_of(&stored, now))
    }

    async fn candidate_leave(&self, resource: &str, candidate: &str) -> Result<bool, StoreError> {
        let stored = crate::membership::stored_candidates(resource, "")?;
        validate_candidate(candidate)?;
        Ok(self.remove(&stored, candidate))
    }

    async fn candidates(&self, resource: &str) -> Result<Vec<Candidate>, StoreError> {
        let stored = crate::membership::stored_candidates(resource, "")?;
        Ok(self.candidates_of(&stored, Instant::now()))
    }
}

#[async_trait]
impl LeaseStore for InMemoryLeaseStore {
    async fn acquire_or_renew(
        &self,
        resource: &str,
        candidate: &str,
        lease: Duration,
    ) -> Result<LeaseOutcome, StoreError> {
        self.acquire_or_renew_with(resource, candidate, lease, None)
            .await
    }

    async fn acquire_or_renew_with(
        &self,
        resource: &str,
        candidate: &str,
        lease: Duration,
        payload: Option<&str>,
    ) -> Result<LeaseOutcome, StoreError> {
        let millis = validate_request(resource, candidate, lease)?;
        if let Some(payload) = payload {
            validate_payload(payload)?;
        }
        let lease = Duration::from_millis(millis.unsigned_abs());
        let now = Instant::now();
        let mut slots = self.slots();
        let granted = |token: i64, remaining: Duration| Lease {
            resource: resource.to_owned(),
            holder: candidate.to_owned(),
            token: FencingToken::new(token),
            remaining,
            expires_at: self.wall(now + remaining),
            acquired_at: None,
            payload: payload.map(str::to_owned),
        };
        match slots.get_mut(resource) {
            None => {
                slots.insert(
                    resource.to_owned(),
                    Slot {
                        holder: candidate.to_owned(),
                        token: 1,
                        expires: now + lease,
                        payload: payload.map(str::to_owned),
                    },
                );
                Ok(LeaseOutcome::Acquired(granted(1, lease)))
            }
            Some(slot) if slot.expires <= now => {
                slot.holder = candidate.to_owned();
                slot.token += 1;
                slot.expires = now + lease;
                slot.payload = payload.map(str::to_owned);
                Ok(LeaseOutcome::Acquired(granted(slot.token, lease)))
            }
            Some(slot) if slot.holder == candidate => {
                let remaining = slot.renew(now, lease);
                slot.payload = payload.map(str::to_owned);
                Ok(LeaseOutcome::Renewed(granted(slot.token, remaining)))
            }
            Some(slot) => Ok(LeaseOutcome::Denied(Denial {
                resource: resource.to_owned(),
                holder: Some(slot.holder.clone()),
                token: Some(FencingToken::new(slot.token)),
                remaining: slot.expires.saturating_duration_since(now),
                expires_at: self.wall(slot.expires),
                payload: slot.payload.clone(),
                stalled: None,
            })),
        }
    }

    async fn release(&self, resource: &str, candidate: &str) -> Result<bool, StoreError> {
        validate_resource(resource)?;
        validate_candidate(candidate)?;
        let now = Instant::now();
        match self.slots().get_mut(resource) {
            Some(slot) if slot.holder == candidate && slot.expires > now => {
                slot.expires = now;
                // Nobody listening is fine: followers poll anyway.
                let _ = self.released.send(Arc::from(resource));
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn release_lease(&self, lease: &Lease) -> Result<bool, StoreError> {
        validate_resource(&lease.resource)?;
        validate_candidate(&lease.holder)?;
        let now = Instant::now();
        match self.slots().get_mut(&lease.resource) {
            Some(slot)
                if slot.holder == lease.holder
                    && slot.token == lease.token.get()
                    && lease.expires_at.is_some()
                    && self.wall(slot.expires) == lease.expires_at
                    && slot.expires > now =>
            {
                slot.expires = now;
                let _ = self.released.send(Arc::from(lease.resource.as_str()));
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn offer(&self, lease: &Lease, to: &str, within: Duration) -> Result<bool, StoreError> {
        let millis = validate_offer(lease, to, within)?;
        // Whole milliseconds, as the database stores bind it.
        let within = Duration::from_millis(millis.unsigned_abs());
        let now = Instant::now();
        match self.slots().get_mut(&lease.resource) {
            Some(slot)
                if slot.holder == lease.holder
                    && slot.token == lease.token.get()
                    && slot.expires > now =>
            {
                slot.token = slot.token.checked_add(1).ok_or(StoreError::Unsupported {
                    operation: "a token past i64::MAX",
                })?;
                slot.holder = offer_holder(to);
                slot.expires = now + within;
                slot.payload = None;
                // The holder's waiters (the one offered among them) look at once.
                let _ = self.released.send(Arc::from(lease.resource.as_str()));
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn take_offer(
        &self,
        resource: &str,
        candidate: &str,
        token: FencingToken,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        validate_take(resource, candidate, lease)?;
        let now = Instant::now();
        match self.slots().get_mut(resource) {
            Some(slot)
                if slot.holder == offer_holder(candidate)
                    && slot.token == token.get()
                    && slot.expires > now =>
            {
                slot.holder = candidate.to_owned();
                slot.renew(now, lease);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn current(&self, resource: &str) -> Result<Option<LeaseRecord>, StoreError> {
        validate_resource(resource)?;
        let now = Instant::now();
        Ok(self.slots().get(resource).map(|slot| LeaseRecord {
            resource: resource.to_owned(),
            holder: slot.holder.clone(),
            token: FencingToken::new(slot.token),
            live: slot.expires > now,
            remaining: slot.expires.saturating_duration_since(now),
            expires_at: self.wall(slot.expires),
            acquired_at: None,
            renewed_at: None,
            payload: slot.payload.clone(),
        }))
    }

    async fn renew_all(&self, held: &[Lease], lease: Duration) -> Result<Renewals, StoreError> {
        let millis = validate_batch(held, lease)?;
        let lease = Duration::from_millis(millis.unsigned_abs());
        let now = Instant::now();
        let mut slots = self.slots();
        let mut fresh = Vec::with_capacity(held.len());
        for h in held {
            match slots.get_mut(&h.resource) {
                Some(slot)
                    if slot.holder == h.holder
                        && slot.token == h.token.get()
                        && slot.expires > now =>
                {
                    let remaining = slot.renew(now, lease);
                    fresh.push(Lease {
                        remaining,
                        expires_at: self.wall(slot.expires),
                        payload: slot.payload.clone(),
                        ..h.clone()
                    });
                }
                _ => {}
            }
        }
        Ok(Renewals::sort(held, fresh))
    }

    fn release_events(&self) -> Option<crate::store::ReleaseEvents> {
        Some(self.released.subscribe())
    }

    fn membership(&self) -> Option<Arc<dyn MembershipStore>> {
        Some(Arc::new(self.clone()))
    }
}
