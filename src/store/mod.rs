//! The lease-store contract, and the input rules every store enforces.

use std::time::Duration;

/// The attribute [`LeaseStore`] and [`MembershipStore`](crate::MembershipStore) are written
/// with, for implementations (the same version as ours).
pub use async_trait::async_trait;

mod rules;
pub mod support;

pub use rules::*;

// The values a store's methods take and answer, for implementations and direct callers.
pub use crate::lease::{Denial, LeaseOutcome, Renewals};
use crate::{error::StoreError, fencing::FencingToken, lease::Lease, lease::LeaseRecord};

/// The longest resource name or candidate id, in characters (the columns are 255 wide).
pub const MAX_NAME_LEN: usize = 255;

/// The longest payload a lease carries, in bytes of UTF-8 (see
/// [`LeaseStore::acquire_or_renew_with`]).
pub const MAX_PAYLOAD_LEN: usize = 1024;

/// The shortest lease a store accepts. Shorter leases are truncated to whole milliseconds
/// first, so anything under 1 ms is refused.
pub const MIN_LEASE: Duration = Duration::from_millis(1);

/// The longest lease a store accepts (366 days): anything longer is a bug, not a lease.
pub const MAX_LEASE: Duration = Duration::from_secs(366 * 24 * 3600);

/// A place where leases live, shared by every candidate that contends for a resource.
///
/// Implementations decide acquire-or-renew atomically: two candidates can never both be granted
/// a live lease on one resource, and each new term's fencing token is strictly greater than the
/// last (a renew keeps it). Liveness is judged by the store's own clock (the database's), never
/// the caller's.
///
/// ```
/// use std::time::Duration;
///
/// use orion_beacon::store::LeaseOutcome;
/// use orion_beacon::{LeaseStore, SeaOrmLeaseStore};
/// use orion_beacon_migration::{Migrator, MigratorTrait};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let url = format!("sqlite://{}", dir.path().join("app.db").display());
/// // Your app's connection (here a SQLite file; WAL and a busy timeout for several processes).
/// let db = sea_orm::Database::connect(orion_beacon::backend::sqlite::connect_options(url)).await?;
///
/// // Create the lease table (or add `CreateLeaseTable` to your own Migrator).
/// Migrator::up(&db, None).await?;
///
/// let store = SeaOrmLeaseStore::new(db);
/// let lease = Duration::from_secs(15);
/// match store.acquire_or_renew("nightly-report", "node-a", lease).await? {
///     LeaseOutcome::Acquired(l) => println!("node-a leads, token {}", l.token),
///     LeaseOutcome::Renewed(l) => println!("node-a still leads, token {}", l.token),
///     LeaseOutcome::Denied(d) => println!("{:?} leads for {:?} more", d.holder, d.remaining),
/// }
///
/// // Someone else is denied and told who leads.
/// let other = store.acquire_or_renew("nightly-report", "node-b", lease).await?;
/// assert!(matches!(other, LeaseOutcome::Denied(ref d) if d.holder.as_deref() == Some("node-a")));
///
/// // Hand over: a release tombstones the lease but keeps its token...
/// assert!(store.release("nightly-report", "node-a").await?);
/// // ...so the next term's token is strictly higher.
/// let next = store.acquire_or_renew("nightly-report", "node-b", lease).await?;
/// assert_eq!(next.token().map(|t| t.get()), Some(2));
/// # Ok(()) }
/// ```
///
/// # The rules
///
/// Every store (the in-memory one and each database backend) follows these rules, and passes the
/// same conformance suite for them:
///
/// | situation | result | token |
/// | --- | --- | --- |
/// | no row, or the row's lease expired by the **database clock** | `Acquired`: the caller holds a new term | previous + 1 (1 for a new row) |
/// | the caller holds a live lease | `Renewed`: expiry := db-now + lease | unchanged |
/// | the caller's own lease already expired | `Acquired`: a new term, not a renew | previous + 1 |
/// | another candidate holds a live lease | `Denied`: nothing changes; the holder, its token and its remaining time are reported | unchanged |
/// | `release` by the live holder | `true`: expiry := the term's last renew, never later than db-now (a tombstone; the row and its token stay) | kept, so the next term is + 1, even after the row sat idle |
/// | `release` by anyone else, or of an expired lease | `false`: nothing changes | unchanged |
/// | 16+ candidates on separate connections race for a fresh (or lapsed) resource | exactly one `Acquired`, the rest `Denied`, no duplicate-key error | 1 (or + 1) |
///
/// An outcome is only reported for a statement that committed: every deciding statement is read
/// to its end, a commit that fails is a retryable [`StoreError::Conflict`], never a grant, and a
/// statement that returns several rows (a server-side retry) is a retryable
/// [`StoreError::Conflict`] too, neither a grant nor a denial. Why each
/// database needs this is in the rustdoc of [`crate::backend`].
///
/// # Clocks
///
/// - Liveness is judged by the database clock at the statement's start, which only errs towards
///   "still live"; callers never compare a database timestamp with a local clock.
/// - A granted lease runs from the moment its row is written, so an acquire that waited for a
///   row lock (e.g. behind a fenced transaction) still gets its full lease.
/// - A grant's time left, [`Lease::remaining`], comes from the database in the same statement;
///   see there for turning it into a local deadline.
///
/// # Input
///
/// Bad input gets a typed [`StoreError`] before any SQL runs: empty or over-long (more than
/// [`MAX_NAME_LEN`], 255 characters) resource and candidate names, names with control characters
/// or leading/trailing white space, leases under [`MIN_LEASE`] (1 ms) or over [`MAX_LEASE`] (366
/// days), bad table names.
///
/// # Implementing it
///
/// The methods are `async fn`s through [`async_trait`](crate::store::async_trait) (re-exported here,
/// so the versions match): rustdoc shows their desugared signatures, with boxed futures and
/// lifetimes, but an implementation writes plain `async fn`s under the same attribute. Four
/// methods are required; the batch ones ([`renew_all`](Self::renew_all),
/// [`current_all`](Self::current_all)) have defaults that work on any store, statement by
/// statement (a wrapper that forwards them keeps the inner store's one statement per batch).
/// A wrapper that counts acquires:
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::time::Duration;
///
/// use orion_beacon::store::{async_trait, LeaseOutcome};
/// use orion_beacon::{Lease, LeaseRecord, LeaseStore, StoreError};
///
/// struct Counted<S> {
///     inner: S,
///     asked: AtomicU64,
/// }
///
/// #[async_trait]
/// impl<S: LeaseStore> LeaseStore for Counted<S> {
///     async fn acquire_or_renew(
///         &self,
///         resource: &str,
///         candidate: &str,
///         lease: Duration,
///     ) -> Result<LeaseOutcome, StoreError> {
///         self.asked.fetch_add(1, Ordering::Relaxed);
///         self.inner.acquire_or_renew(resource, candidate, lease).await
///     }
///     async fn release(&self, resource: &str, candidate: &str) -> Result<bool, StoreError> {
///         self.inner.release(resource, candidate).await
///     }
///     async fn release_lease(&self, lease: &Lease) -> Result<bool, StoreError> {
///         self.inner.release_lease(lease).await
///     }
///     async fn current(&self, resource: &str) -> Result<Option<LeaseRecord>, StoreError> {
///         self.inner.current(resource).await
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), StoreError> {
/// let store = Counted { inner: orion_beacon::InMemoryLeaseStore::new(), asked: AtomicU64::new(0) };
/// store.acquire_or_renew("nightly-report", "node-a", Duration::from_secs(15)).await?;
/// assert_eq!(store.asked.load(Ordering::Relaxed), 1);
/// # Ok(()) }
/// ```
///
/// A wrapper must pass [`acquire_or_renew_with`](Self::acquire_or_renew_with),
/// [`offer`](Self::offer), [`take_offer`](Self::take_offer),
/// [`release_events`](Self::release_events), [`validate`](Self::validate) and
/// [`sea_orm_store`](Self::sea_orm_store) on too if the store it wraps has them (without the
/// first, an elector or locks configured with a payload fail with
/// [`StoreError::Unsupported`] on their first acquire; without the offers, a handover to a named
/// successor releases the lease instead; without `sea_orm_store`, waiters on MySQL/MariaDB cannot
/// tell the store what they wait for and poll) (here the defaults: no release notifications,
/// nothing to validate, no fencing of SeaORM transactions by the terms of an elector over it).
#[async_trait]
pub trait LeaseStore: Send + Sync {
    /// Takes the lease if nobody holds a live one (a new term: [`LeaseOutcome::Acquired`], token
    /// + 1), extends it if `candidate` already holds it live ([`LeaseOutcome::Renewed`], same
    /// token), or reports who holds it ([`LeaseOutcome::Denied`], nothing changed). A candidate
    /// whose own lease already expired gets a new term, not a renew.
    ///
    /// A renew never moves the expiry back: it runs a whole `lease` from the write, or ends
    /// just past the expiry it replaces (one step of the store's clock) when that is later, so
    /// every write of a term has an expiry of its own (see
    /// [`release_lease`](Self::release_lease)) and a shorter `lease` does not shorten a live
    /// one. The same holds for [`renew_all`](Self::renew_all).
    async fn acquire_or_renew(
        &self,
        resource: &str,
        candidate: &str,
        lease: Duration,
    ) -> Result<LeaseOutcome, StoreError>;

    /// [`acquire_or_renew`](Self::acquire_or_renew) that also writes `payload` (its address, a
    /// version; at most [`MAX_PAYLOAD_LEN`] bytes, no NUL character) into the lease, in the same
    /// statement that grants or renews it. Each grant or renew writes the payload it is given:
    /// `None` (and plain [`acquire_or_renew`](Self::acquire_or_renew)) clears it. A denial
    /// changes nothing and reports the holder's payload in [`Denial::payload`](crate::store::Denial::payload);
    /// [`current`](Self::current) shows it too. A payload belongs to the term that wrote it: a
    /// later term that wrote none shows `None`, never the earlier term's. A batch renew
    /// ([`renew_all`](Self::renew_all)) keeps the payload as it is.
    ///
    /// A payload that is too long or holds a NUL is refused with
    /// [`StoreError::InvalidPayload`] before any SQL runs.
    ///
    /// The default, for stores that keep no payloads, forwards a `None` payload to
    /// [`acquire_or_renew`](Self::acquire_or_renew) and refuses any other with
    /// [`StoreError::Unsupported`] (after the input checks).
    async fn acquire_or_renew_with(
        &self,
        resource: &str,
        candidate: &str,
        lease: Duration,
        payload: Option<&str>,
    ) -> Result<LeaseOutcome, StoreError> {
        match payload {
            None => self.acquire_or_renew(resource, candidate, lease).await,
            Some(payload) => {
                validate_request(resource, candidate, lease)?;
                validate_payload(payload)?;
                Err(StoreError::Unsupported {
                    operation: "payloads",
                })
            }
        }
    }

    /// Ends `candidate`'s live lease on `resource` (a tombstone: the row and its token are kept,
    /// so the next term advances past it). Returns `true` if this call released a live lease the
    /// candidate held; `false` (and nothing changes) otherwise.
    ///
    /// The database stores move the expiry back to the term's last renew (`renewed_at`), never
    /// later than the database's now, not merely to now (the in-memory store, whose calls apply
    /// at once, sets it to now). Liveness is judged at a statement's start, and a renew of the
    /// holder that was already in flight (say one the elector gave up waiting for) started after
    /// that last renew, so it sees the lease ended and at most starts a new term with a higher
    /// token; it can never extend the released term. An operator's revoke ends a lease the same
    /// way.
    async fn release(&self, resource: &str, candidate: &str) -> Result<bool, StoreError>;

    /// Ends the term `lease` belongs to, but only if the store still holds the very write
    /// that `lease` reports: same holder, same token and the same expiry (to the store clock's
    /// resolution; no two writes of a term share an expiry, see
    /// [`acquire_or_renew`](Self::acquire_or_renew)). Otherwise nothing changes and the answer
    /// is `false`.
    ///
    /// This is the release an elector sends on shutdown. Unlike [`release`](Self::release),
    /// which ends whatever live lease the holder has, a release that arrives late (it waited
    /// for a row lock, in the network, or its sender was killed right after sending it) can
    /// never end a later renew, not even one by a new process that reuses the candidate id.
    /// The tombstone is the same as [`release`](Self::release)'s: the token is kept.
    async fn release_lease(&self, lease: &Lease) -> Result<bool, StoreError>;

    /// Offers the resource of `lease` to the candidate `to` (a planned handover to a named
    /// successor): if the store still holds `lease`'s term (same holder and token, live), that
    /// term ends and a new one begins, its token one higher, held *for* `to` until `within`
    /// from the write. Only `to` can take it ([`take_offer`](Self::take_offer)); every other
    /// candidate is denied until it is taken or lapses (the denial's holder is the offer's
    /// marker, see [`Denial::offered_to`](crate::store::Denial::offered_to)). An offer nobody takes
    /// lapses like any lease, after `within`, and the next grant's token is higher still.
    /// Whether the offer was made (`false`: the term had ended already, nothing changed).
    ///
    /// Names and `within` (1 ms to 366 days) are checked before any SQL; `to` must name another
    /// candidate, of at most [`MAX_OFFER_TARGET_LEN`] characters. The default is
    /// [`StoreError::Unsupported`], after those checks.
    async fn offer(&self, lease: &Lease, to: &str, within: Duration) -> Result<bool, StoreError> {
        validate_offer(lease, to, within)?;
        Err(StoreError::Unsupported { operation: "offer" })
    }

    /// Takes an offer made to `candidate` (see [`offer`](Self::offer)) whose term has `token`:
    /// if it is still open, `candidate` holds that term for `lease` from now. Whether it did.
    /// Its holder then renews with [`acquire_or_renew`](Self::acquire_or_renew), which answers
    /// [`LeaseOutcome::Renewed`] with `token`: the elector leads on that answer only after its
    /// own take succeeded (a `Renewed` it did not take begins no term).
    ///
    /// Checked like [`offer`](Self::offer); the default is [`StoreError::Unsupported`].
    async fn take_offer(
        &self,
        resource: &str,
        candidate: &str,
        token: FencingToken,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        validate_take(resource, candidate, lease)?;
        let _ = token;
        Err(StoreError::Unsupported {
            operation: "take_offer",
        })
    }

    /// Renews many leases at once, each only while the store still holds it as given: the same
    /// holder, the same token (term) and live by the store's clock, keeping its payload. It
    /// starts no term (but see the default below): a lease that lapsed, was released, revoked
    /// or taken over is reported [`lost`](Renewals::lost) and only its term ends. The holders
    /// may differ.
    ///
    /// The database stores do it in one batch statement per call (whatever the number of
    /// leases), judged by the database clock, and report a renew only once it has committed;
    /// a lease the batch leaves out (its row held by another transaction) is renewed on its
    /// own after it (see [`SeaOrmLeaseStore`](crate::SeaOrmLeaseStore)'s `renew_all`), and one
    /// still not known then is [`unanswered`](Renewals::unanswered). Bad input (an invalid name or duration, a resource given twice) is refused
    /// before any SQL runs; an empty `held` is no statement at all.
    ///
    /// The default (for stores without a batch statement, such as a wrapper that forwards only
    /// the required methods) renews lease by lease, each only as given: it reads the lease
    /// ([`current`](Self::current)) and renews it ([`acquire_or_renew`](Self::acquire_or_renew))
    /// only while that read shows it live with the same holder and token. A lease that lapses
    /// between the read and the renew comes back as a new term nobody asked for: that term is
    /// released at once (its token is spent; a caller that stops waiting right then leaves
    /// it to lapse) and the lease reported lost. The payload is passed on as the read showed
    /// it. One lease after the other: two statements each, with no time bound of its own. A transient error leaves a lease
    /// [`unanswered`](Renewals::unanswered); a permanent one is returned.
    async fn renew_all(&self, held: &[Lease], lease: Duration) -> Result<Renewals, StoreError> {
        validate_batch(held, lease)?;
        let mut out = Renewals::default();
        for given in held {
            let answer = async {
                let record = self.current(&given.resource).await?.filter(|record| {
                    record.live && record.holder == given.holder && record.token == given.token
                });
                let Some(record) = record else {
                    return Ok::<_, StoreError>(None);
                };
                // The term's payload kept: a renew writes the payload it is given.
                match self
                    .acquire_or_renew_with(
                        &given.resource,
                        &given.holder,
                        lease,
                        record.payload.as_deref(),
                    )
                    .await?
                {
                    LeaseOutcome::Renewed(renewed) if renewed.token == given.token => {
                        Ok(Some(renewed))
                    }
                    LeaseOutcome::Acquired(unasked) => {
                        // Lapsed since the read: not this term. Nobody asked for the new one.
                        // (A caller that stops waiting here leaves it to lapse.)
                        if let Err(error) = self.release_lease(&unasked).await {
                            tracing::warn!(resource = %unasked.resource, token = %unasked.token, %error, "a term the lease-by-lease renew started by accident could not be released; it lapses with its lease");
                        }
                        Ok(None)
                    }
                    _ => Ok(None),
                }
            };
            match answer.await {
                Ok(Some(renewed)) => out.renewed.push(renewed),
                Ok(None) => out.lost.push(given.clone()),
                Err(error) if error.is_permanent() => return Err(error),
                Err(_) => out.unanswered.push(given.clone()),
            }
        }
        Ok(out)
    }

    /// The stored lease of `resource`, live or not, or `None` if it was never acquired: the row
    /// as stored, with `live` and `remaining` judged by the store's clock (the database stores
    /// round down to whole milliseconds: a lease with under 1 ms left reads as not live).
    async fn current(&self, resource: &str) -> Result<Option<LeaseRecord>, StoreError>;

    /// The stored leases of `resources` (live or not; a resource never acquired has none), as
    /// [`current`](Self::current) reports each, in no particular order. Bad names are refused
    /// before any SQL runs.
    ///
    /// The database stores read them with one statement per 1,000 resources; the default asks
    /// [`current`](Self::current) once per resource.
    async fn current_all(&self, resources: &[String]) -> Result<Vec<LeaseRecord>, StoreError> {
        for resource in resources {
            validate_resource(resource)?;
        }
        let mut records = Vec::with_capacity(resources.len());
        for resource in resources {
            records.extend(self.current(resource).await?);
        }
        Ok(records)
    }

    /// Release notifications, for stores that can push them: each message names a resource
    /// whose lease was just released, so followers try at once instead of at their next poll.
    /// `None` (the default) means followers only poll. Messages can be lost (a dropped
    /// listener connection, a lagging receiver); polling stays the fallback.
    fn release_events(&self) -> Option<ReleaseEvents> {
        None
    }

    /// Whether this store can work at all, decided without touching the database: `Err` with
    /// the error every call would fail with (e.g. [`StoreError::UnsupportedBackend`] for a
    /// connection to a backend this build was compiled without). [`ElectorBuilder::build`](crate::ElectorBuilder::build)
    /// calls it, so a misconfigured elector fails at build time instead of retrying forever.
    /// The default is `Ok(())`.
    fn validate(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// The [`SeaOrmLeaseStore`](crate::SeaOrmLeaseStore) behind this store, if it is one (or
    /// forwards to one): the store an elector's or shard set's terms fence SeaORM transactions
    /// with. The default is `None`; a wrapper that forwards to a SeaORM store should forward
    /// this too.
    fn sea_orm_store(&self) -> Option<&crate::backend::SeaOrmLeaseStore> {
        None
    }

    /// The membership store that goes with this store, if it has one: where a ranked elector
    /// ([`ElectorBuilder::rank`](crate::ElectorBuilder::rank)) heartbeats its candidacy. The
    /// default is `None`; a wrapper should forward this too.
    fn membership(&self) -> Option<std::sync::Arc<dyn crate::MembershipStore>> {
        None
    }
}

/// A subscription to a store's release notifications (see [`LeaseStore::release_events`]).
pub type ReleaseEvents = tokio::sync::broadcast::Receiver<std::sync::Arc<str>>;

#[async_trait]
impl<S: LeaseStore + ?Sized> LeaseStore for std::sync::Arc<S> {
    async fn acquire_or_renew(
        &self,
        resource: &str,
        candidate: &str,
        lease: Duration,
    ) -> Result<LeaseOutcome, StoreError> {
        (**self).acquire_or_renew(resource, candidate, lease).await
    }

    async fn acquire_or_renew_with(
        &self,
        resource: &str,
        candidate: &str,
        lease: Duration,
        payload: Option<&str>,
    ) -> Result<LeaseOutcome, StoreError> {
        (**self)
            .acquire_or_renew_with(resource, candidate, lease, payload)
            .await
    }

    async fn release(&self, resource: &str, candidate: &str) -> Result<bool, StoreError> {
        (**self).release(resource, candidate).await
    }

    async fn release_lease(&self, lease: &Lease) -> Result<bool, StoreError> {
        (**self).release_lease(lease).await
    }

    async fn current(&self, resource: &str) -> Result<Option<LeaseRecord>, StoreError> {
        (**self).current(resource).await
    }

    async fn offer(&self, lease: &Lease, to: &str, within: Duration) -> Result<bool, StoreError> {
        (**self).offer(lease, to, within).await
    }

    async fn take_offer(
        &self,
        resource: &str,
        candidate: &str,
        token: FencingToken,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        (**self).take_offer(resource, candidate, token, lease).await
    }

    async fn renew_all(&self, held: &[Lease], lease: Duration) -> Result<Renewals, StoreError> {
        (**self).renew_all(held, lease).await
    }

    async fn current_all(&self, resources: &[String]) -> Result<Vec<LeaseRecord>, StoreError> {
        (**self).current_all(resources).await
    }

    fn release_events(&self) -> Option<ReleaseEvents> {
        (**self).release_events()
    }

    fn validate(&self) -> Result<(), StoreError> {
        (**self).validate()
    }

    fn sea_orm_store(&self) -> Option<&crate::backend::SeaOrmLeaseStore> {
        (**self).sea_orm_store()
    }

    fn membership(&self) -> Option<std::sync::Arc<dyn crate::MembershipStore>> {
        (**self).membership()
    }
}

#[cfg(test)]
mod tests;
