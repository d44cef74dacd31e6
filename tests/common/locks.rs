//! Locks and semaphores, as tests generic over any store: mutual exclusion, a token per hold,
//! waiting and timeouts, release on drop, lost holds, one renew statement per round, bad input
//! refused before any SQL. Every store runs them through `lock_suite!`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use orion_beacon::locks::{LockError, Locks, MAX_PERMITS};
use orion_beacon::{
    store::async_trait, store::LeaseOutcome, store::Renewals, ConfigError, ErrorKind, LeaseRecord,
    LeaseStore, MembershipStore, StoreError,
};
use tokio::time::Instant;

use super::conformance::Harness;
use super::double::{Double, Intercept};
use super::unique;

/// The lease of every hold in these tests: long enough for a loaded machine's statements,
/// short enough that a renew that stopped shows within a test.
const LEASE: Duration = Duration::from_millis(1_500);
const RENEW: Duration = Duration::from_millis(300);

/// Counts the statements a store is sent, and can fail every batched renew.
#[derive(Clone, Default)]
pub struct Counting(Arc<Counts>);

#[derive(Default)]
pub struct Counts {
    pub acquires: AtomicUsize,
    pub renews: AtomicUsize,
    pub others: AtomicUsize,
    pub fail_renews: AtomicBool,
    /// Each acquire waits this long before it is sent.
    pub acquire_delay_ms: std::sync::atomic::AtomicU64,
    /// Each batched renew commits (a lease four times as long), then its answer is held back
    /// for this long.
    pub renew_answer_delay_ms: std::sync::atomic::AtomicU64,
    /// The next batched renew waits 400 ms, then is refused for good (a refusal no retry
    /// changes); the ones after it are sent as usual.
    pub refuse_next_renew: AtomicBool,
    /// The next answers of batched renews leave this resource out, this many times.
    pub omit_from_renews: std::sync::Mutex<Option<(String, usize)>>,
    /// Each release waits this long before it is sent.
    pub release_delay_ms: std::sync::atomic::AtomicU64,
    /// Each acquire is written, then answered with an error (a reply lost after the commit).
    pub fail_acquires_after_write: AtomicBool,
}

impl std::ops::Deref for Counting {
    type Target = Counts;
    fn deref(&self) -> &Counts {
        &self.0
    }
}

impl Counts {
    pub fn sent(&self) -> usize {
        self.acquires.load(Ordering::SeqCst)
            + self.renews.load(Ordering::SeqCst)
            + self.others.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl<S: LeaseStore + MembershipStore + 'static> Intercept<S> for Counting {
    async fn acquire_or_renew(
        &self,
        inner: &S,
        resource: &str,
        candidate: &str,
        lease: Duration,
    ) -> Result<LeaseOutcome, StoreError> {
        self.acquires.fetch_add(1, Ordering::SeqCst);
        let delay = self.acquire_delay_ms.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let answer = inner.acquire_or_renew(resource, candidate, lease).await;
        if self.fail_acquires_after_write.load(Ordering::SeqCst) {
            answer?;
            return Err(StoreError::Database(
                sea_orm::DbErr::Custom("the reply was lost in this test".to_owned()).into(),
            ));
        }
        answer
    }

    async fn renew_all(
        &self,
        inner: &S,
        held: &[orion_beacon::Lease],
        lease: Duration,
    ) -> Result<Renewals, StoreError> {
        self.renews.fetch_add(1, Ordering::SeqCst);
        if self.fail_renews.load(Ordering::SeqCst) {
            return Err(StoreError::Database(
                sea_orm::DbErr::Custom("renews fail in this test".to_owned()).into(),
            ));
        }
        if self.refuse_next_renew.swap(false, Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(400)).await;
            return Err(StoreError::InvalidResource {
                name: "renews".to_owned(),
                reason: "are refused for good in this test",
            });
        }
        let omit = {
            let mut omit = self.omit_from_renews.lock().unwrap();
            let name = omit.as_ref().map(|(name, _)| name.clone());
            if let Some((_, left)) = omit.as_mut() {
                *left -= 1;
                if *left == 0 {
                    *omit = None;
                }
            }
            name
        };
        if let Some(name) = omit {
            let mut answer = inner.renew_all(held, lease).await?;
            answer.renewed.retain(|l| l.resource != name);
            answer.lost.retain(|l| l.resource != name);
            return Ok(answer);
        }
        let delay = self.renew_answer_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            // The lost answer's write outlasts the hold by far: only a release that ends it
            // frees the lock before it lapses.
            let answer = inner.renew_all(held, lease * 4).await;
            tokio::time::sleep(Duration::from_millis(delay)).await;
            return answer;
        }
        inner.renew_all(held, lease).await
    }

    async fn release(
        &self,
        inner: &S,
        resource: &str,
        candidate: &str,
    ) -> Result<bool, StoreError> {
        self.others.fetch_add(1, Ordering::SeqCst);
        let delay = self.release_delay_ms.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        inner.release(resource, candidate).await
    }

    async fn release_lease(
        &self,
        inner: &S,
        lease: &orion_beacon::Lease,
    ) -> Result<bool, StoreError> {
        self.others.fetch_add(1, Ordering::SeqCst);
        inner.release_lease(lease).await
    }

    async fn current_all(
        &self,
        inner: &S,
        resources: &[String],
    ) -> Result<Vec<LeaseRecord>, StoreError> {
        self.others.fetch_add(1, Ordering::SeqCst);
        inner.current_all(resources).await
    }
}

fn locks<S: LeaseStore + 'static>(store: S, owner: &str) -> Locks {
    Locks::builder(store)
        .owner(owner)
        .lease_duration(LEASE)
        .renew_interval(RENEW)
        .retry_interval(Duration::from_millis(100))
        .build()
        .unwrap()
}

/// Locks whose holds would outlast any test (a 30 s lease): a lock freed within the test was
/// released, not left to lapse.
fn long_locks<S: LeaseStore + 'static>(store: S, owner: &str) -> Locks {
    Locks::builder(store)
        .owner(owner)
        .lease_duration(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// One holder at a time, also within one process (no re-entrancy), and every hold's token
/// above every earlier hold's.
pub async fn a_lock_has_one_holder_and_each_hold_a_higher_token<H: Harness>(h: &H) {
    let a = locks(h.store(), "node-a");
    let b = locks(h.separate_store().await, "node-b");
    let name = unique("lock");
    let (lock_a, lock_b) = (a.lock(&name).unwrap(), b.lock(&name).unwrap());
    let first = lock_a.try_acquire().await.unwrap().expect("free");
    assert!(first.is_held());
    assert_eq!((first.name(), first.resource()), (&*name, &*name));
    assert!(lock_b.try_acquire().await.unwrap().is_none(), "held by a");
    assert!(
        lock_a.try_acquire().await.unwrap().is_none(),
        "a second acquire in the holding process waits like anyone's"
    );
    let mut last = first.token();
    assert!(first.release().await.unwrap(), "released in the store");
    for lock in [&lock_b, &lock_a, &lock_b] {
        let guard = lock.try_acquire().await.unwrap().expect("free again");
        assert!(guard.token() > last, "{:?} after {last:?}", guard.token());
        last = guard.token();
        assert!(guard.release().await.unwrap());
    }
    assert_eq!(a.held() + b.held(), 0);
}

/// `acquire` waits for a release and returns soon after it; with nobody releasing, it gives
/// up at its timeout with a typed error naming the holder.
pub async fn acquire_waits_for_a_release_and_times_out<H: Harness>(h: &H) {
    let a = locks(h.store(), "node-a");
    let b = locks(h.separate_store().await, "node-b");
    let name = unique("lock");
    let held = a.lock(&name).unwrap().try_acquire().await.unwrap().unwrap();
    let lock_b = b.lock(&name).unwrap();
    let asked = Instant::now();
    let err = lock_b
        .acquire(Duration::from_millis(400))
        .await
        .unwrap_err();
    let waited = asked.elapsed();
    assert!(
        waited + super::SUSPEND_SLACK >= Duration::from_millis(400)
            && waited < Duration::from_millis(2_400),
        "{waited:?}"
    );
    match &err {
        LockError::Timeout { holder, .. } => {
            assert!(
                holder.as_deref().is_none_or(|h| h.starts_with("node-a/")),
                "{err:?}"
            )
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    // A release wakes the waiter (by notification, or its next retry 100 ms later).
    let waiter = tokio::spawn(async move {
        let guard = lock_b.acquire(Duration::from_secs(20)).await.unwrap();
        (Instant::now(), guard)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let token = held.token();
    let released = Instant::now();
    assert!(held.release().await.unwrap());
    let (granted, guard) = waiter.await.unwrap();
    assert!(guard.token() > token);
    let after = granted.saturating_duration_since(released);
    assert!(
        after < Duration::from_millis(1_000),
        "{after:?} after the release"
    );
}

/// Dropping a guard releases the lock at once, not after its lease.
pub async fn a_dropped_guard_releases_at_once<H: Harness>(h: &H) {
    let a = long_locks(h.store(), "node-a");
    let b = locks(h.separate_store().await, "node-b");
    let name = unique("lock");
    let guard = a.lock(&name).unwrap().try_acquire().await.unwrap().unwrap();
    let term = guard.term().clone();
    drop(guard);
    assert!(!term.is_current(), "the hold ends with the drop");
    let asked = Instant::now();
    let next = b
        .lock(&name)
        .unwrap()
        .acquire(Duration::from_secs(10))
        .await
        .unwrap();
    assert!(next.token() > term.token());
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "{:?}",
        asked.elapsed()
    );
    // Held locks of a dropped `Locks` are released the same way.
    let c = locks(h.store(), "node-c");
    let name = unique("lock");
    let guard = c.lock(&name).unwrap().try_acquire().await.unwrap().unwrap();
    drop(c);
    drop(guard);
    let asked = Instant::now();
    let _held = b
        .lock(&name)
        .unwrap()
        .acquire(Duration::from_secs(10))
        .await
        .unwrap();
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "{:?}",
        asked.elapsed()
    );
}

/// Many holds of one process live past their lease on one batched renew per round (no
/// per-lock statement), and the rivals are refused all along.
pub async fn holds_are_renewed_with_one_statement_per_round<H: Harness>(h: &H)
where
    H::Store: MembershipStore,
{
    let counting = Counting::default();
    let store = Double::over(h.store(), counting.clone());
    let a = locks(store, "node-a");
    let b = locks(h.separate_store().await, "node-b");
    let names: Vec<String> = (0..20).map(|i| unique(&format!("lock{i}"))).collect();
    let mut guards = Vec::new();
    for name in &names {
        guards.push(a.lock(name).unwrap().try_acquire().await.unwrap().unwrap());
    }
    assert_eq!(a.held(), 20);
    let start = Instant::now();
    tokio::time::sleep(LEASE * 2).await;
    let slept = start.elapsed();
    for (guard, name) in guards.iter().zip(&names) {
        assert!(guard.is_held(), "{name} held past its lease");
        assert!(b.lock(name).unwrap().try_acquire().await.unwrap().is_none());
    }
    let renews = counting.renews.load(Ordering::SeqCst);
    let rounds = slept.as_millis() / RENEW.as_millis();
    assert!(
        renews >= 3 && renews as u128 <= rounds + 2,
        "{renews} batched renews in {slept:?} ({rounds} rounds of {RENEW:?})"
    );
    assert_eq!(
        counting.acquires.load(Ordering::SeqCst),
        20,
        "no renew one by one"
    );
}

/// A hold whose renews stop ends at its local deadline (before the lease lapses in the
/// store), and one taken away in the store ends at the next renew; `lost()` fires and the
/// scoped form drops its work.
pub async fn a_lost_hold_says_so_and_its_work_is_dropped<H: Harness>(h: &H)
where
    H::Store: MembershipStore,
{
    let counting = Counting::default();
    let a = locks(Double::over(h.store(), counting.clone()), "node-a");
    let name = unique("lock");
    let guard = a.lock(&name).unwrap().try_acquire().await.unwrap().unwrap();
    counting.fail_renews.store(true, Ordering::SeqCst);
    let granted = Instant::now();
    tokio::time::timeout(LEASE, guard.lost())
        .await
        .expect("lost within the lease");
    assert!(!guard.is_held());
    assert_eq!(
        guard.term().loss_reason(),
        Some(orion_beacon::LossReason::Deadline)
    );
    // Before the store let anyone else have it: the lease was still live there.
    let left = LEASE.saturating_sub(granted.elapsed());
    assert!(left > Duration::ZERO, "ended only after the lease");
    counting.fail_renews.store(false, Ordering::SeqCst);

    // Taken away in the store (a release under the hold's own candidate id, as an operator's
    // revoke would): the next batched renew reports it lost.
    let name = unique("lock");
    let lock = a.lock(&name).unwrap();
    let store = h.store();
    let work = lock.with_lock(Duration::from_secs(5), |term| async move {
        let (resource, candidate) = (term.resource().to_owned(), term.candidate().to_owned());
        assert!(store.release(&resource, &candidate).await.unwrap());
        std::future::pending::<()>().await;
    });
    let err = tokio::time::timeout(Duration::from_secs(5), work)
        .await
        .expect("the work is dropped when the hold is lost")
        .unwrap_err();
    assert!(matches!(err, LockError::Lost { .. }), "{err:?}");
    assert_eq!(err.kind(), ErrorKind::Lost);
    assert_eq!(a.held(), 0);
    // What returns in time is the closure's answer, and the lock is released after it.
    let lock = a.lock(unique("lock")).unwrap();
    let answer = lock
        .with_lock(Duration::from_secs(5), |term| async move { term.token() })
        .await
        .unwrap();
    let next = lock.try_acquire().await.unwrap().expect("released");
    assert!(next.token() > answer);
}

/// An acquire given up on while its statement is on the way leaves nothing held: what it was
/// granted is released, not left to lapse.
pub async fn an_acquire_given_up_on_leaves_nothing_held<H: Harness>(h: &H)
where
    H::Store: MembershipStore,
{
    let counting = Counting::default();
    counting.acquire_delay_ms.store(300, Ordering::SeqCst);
    let a = long_locks(Double::over(h.store(), counting.clone()), "node-a");
    let b = locks(h.separate_store().await, "node-b");
    let name = unique("lock");
    let lock = a.lock(&name).unwrap();
    let gave_up = tokio::time::timeout(Duration::from_millis(50), lock.try_acquire()).await;
    assert!(gave_up.is_err(), "given up before the answer");
    // A timeout on acquire itself, too.
    let name2 = unique("lock");
    let err = a
        .lock(&name2)
        .unwrap()
        .acquire(Duration::from_millis(50))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    assert_eq!(a.held(), 0);
    // Both reach the store after they were given up on: a store that queues its attempts
    // sends neither (their caller is gone), another sends them and they are granted...
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(counting.acquires.load(Ordering::SeqCst), 2);
    // ...and whatever was granted is released, not left to lapse (30 s).
    for name in [&name, &name2] {
        let asked = Instant::now();
        let _got = b
            .lock(name)
            .unwrap()
            .acquire(Duration::from_secs(5))
            .await
            .unwrap();
        assert!(
            asked.elapsed() < Duration::from_secs(3),
            "{name}: {:?}: released, not left to lapse (30 s)",
            asked.elapsed()
        );
    }
}

/// A renew that committed but whose answer never came: the hold ends at its deadline, and its
/// release (by the hold's own id) still ends the lease in the store, so a rival gets the lock
/// at once instead of a lease later.
pub async fn a_renew_answered_too_late_still_leaves_nothing_held<H: Harness>(h: &H)
where
    H::Store: MembershipStore,
{
    let counting = Counting::default();
    let a = locks(Double::over(h.store(), counting.clone()), "node-a");
    let b = locks(h.separate_store().await, "node-b");
    let name = unique("lock");
    let guard = a.lock(&name).unwrap().try_acquire().await.unwrap().unwrap();
    counting
        .renew_answer_delay_ms
        .store(LEASE.as_millis() as u64 * 3, Ordering::SeqCst);
    tokio::time::timeout(LEASE * 2, guard.lost())
        .await
        .expect("the hold ends at its deadline");
    let ended = Instant::now();
    let got = b
        .lock(&name)
        .unwrap()
        .acquire(Duration::from_secs(10))
        .await
        .unwrap();
    assert!(got.token() > guard.token());
    let after = ended.elapsed();
    assert!(
        after < Duration::from_millis(1_000),
        "{after:?}: the renewed lease was released, not left to lapse"
    );
}

/// A batched renew the store refuses for good ends the holds it was asked for, at once and
/// with the reason `Failed` (not at their deadline, as a passing failure would); a hold
/// granted while that renew was on the way was not asked about and lives on.
pub async fn a_renew_refused_for_good_ends_the_holds_it_asked_for<H: Harness>(h: &H)
where
    H::Store: MembershipStore,
{
    let counting = Counting::default();
    let a = locks(Double::over(h.store(), counting.clone()), "node-a");
    let take = |lock: &orion_beacon::locks::Lock| {
        let lock = lock.clone();
        async move { lock.try_acquire().await.unwrap().expect("free") }
    };
    let guard = take(&a.lock(unique("lock")).unwrap()).await;
    let again = a.lock(unique("lock")).unwrap();
    let before = take(&again).await;
    let granted = Instant::now();
    counting.refuse_next_renew.store(true, Ordering::SeqCst);
    // The refused renew is on the way (it answers after 400 ms): holds granted now are not in
    // its batch, one of a lock it names (released and taken again) and one of another lock.
    let asked = Instant::now();
    while counting.refuse_next_renew.load(Ordering::SeqCst) {
        assert!(asked.elapsed() < LEASE, "no renew was sent");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(before.release().await.unwrap());
    let retaken = take(&again).await;
    let later = take(&a.lock(unique("lock")).unwrap()).await;
    tokio::time::timeout(LEASE, guard.lost())
        .await
        .expect("ended by the refusal");
    assert_eq!(
        guard.term().loss_reason(),
        Some(orion_beacon::LossReason::Failed)
    );
    let ended = granted.elapsed();
    assert!(
        ended < LEASE - LEASE / 10,
        "{ended:?}: ended by the refusal, not at the deadline"
    );
    tokio::time::sleep(LEASE * 2).await;
    assert!(
        later.is_held(),
        "a hold the refused renew did not name lives on"
    );
    assert!(
        retaken.is_held(),
        "a new hold of a lock the refused renew named (by its old token) lives on"
    );
    assert_eq!(a.held(), 2);
}

/// A batched renew whose answer leaves a hold out (neither renewed nor lost) is asked again
/// soon for it: the hold lives on, past its lease.
pub async fn a_renew_answer_that_leaves_a_hold_out_is_asked_again<H: Harness>(h: &H)
where
    H::Store: MembershipStore,
{
    let counting = Counting::default();
    let a = locks(Double::over(h.store(), counting.clone()), "node-a");
    let (left_out, other) = (unique("lock"), unique("lock"));
    let g1 = a
        .lock(&left_out)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    let g2 = a
        .lock(&other)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    *counting.omit_from_renews.lock().unwrap() = Some((left_out.clone(), 3));
    tokio::time::sleep(LEASE * 2).await;
    assert!(
        counting.omit_from_renews.lock().unwrap().is_none(),
        "left out three times"
    );
    assert!(
        g1.is_held(),
        "the hold left out of three answers is renewed after them"
    );
    assert!(g2.is_held());
    assert_eq!(a.held(), 2);
}

/// A release whose caller stops waiting for it (a timeout around `release()`) still reaches
/// the store: the lock is free at once, not a lease later.
pub async fn a_release_given_up_on_still_releases<H: Harness>(h: &H)
where
    H::Store: MembershipStore,
{
    let counting = Counting::default();
    counting.release_delay_ms.store(300, Ordering::SeqCst);
    let a = long_locks(Double::over(h.store(), counting.clone()), "node-a");
    let b = locks(h.separate_store().await, "node-b");
    let name = unique("lock");
    let guard = a.lock(&name).unwrap().try_acquire().await.unwrap().unwrap();
    let token = guard.token();
    let gave_up = tokio::time::timeout(Duration::from_millis(20), guard.release()).await;
    assert!(gave_up.is_err(), "given up before the release answered");
    assert_eq!(a.held(), 0);
    let asked = Instant::now();
    let got = b
        .lock(&name)
        .unwrap()
        .acquire(Duration::from_secs(10))
        .await
        .unwrap();
    assert!(got.token() > token);
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "{:?}: released, not left to lapse (30 s)",
        asked.elapsed()
    );
}

/// An acquire answered with an error after its write committed (a reply lost) may hide a
/// grant: it is released under the attempt's own id, so the lock is free at once, whether the
/// caller read the error or had stopped waiting for it.
pub async fn an_error_that_may_hide_a_grant_is_released<H: Harness>(h: &H)
where
    H::Store: MembershipStore,
{
    let counting = Counting::default();
    counting
        .fail_acquires_after_write
        .store(true, Ordering::SeqCst);
    let a = long_locks(Double::over(h.store(), counting.clone()), "node-a");
    let b = locks(h.separate_store().await, "node-b");
    let (read, unread) = (unique("lock"), unique("lock"));
    let err = a.lock(&read).unwrap().try_acquire().await.unwrap_err();
    assert!(matches!(err, LockError::Store(_)), "{err:?}");
    counting.acquire_delay_ms.store(300, Ordering::SeqCst);
    let gave_up = tokio::time::timeout(
        Duration::from_millis(50),
        a.lock(&unread).unwrap().try_acquire(),
    )
    .await;
    assert!(gave_up.is_err(), "given up before the answer");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        counting.acquires.load(Ordering::SeqCst),
        2,
        "both were written"
    );
    assert_eq!(a.held(), 0);
    for name in [&read, &unread] {
        let asked = Instant::now();
        let got = b
            .lock(name)
            .unwrap()
            .acquire(Duration::from_secs(10))
            .await
            .unwrap();
        // The second was given up on before it was sent where the store queues attempts.
        let hidden = if name == &read { 2 } else { 1 };
        assert!(
            got.token().get() >= hidden,
            "{name}: after the hidden grant"
        );
        assert!(
            asked.elapsed() < Duration::from_secs(3),
            "{name}: {:?}: released, not left to lapse (30 s)",
            asked.elapsed()
        );
    }
}

/// A semaphore of three: three holders at once, each on its own permit with its own token, a
/// fourth waits for a permit to come free.
pub async fn a_semaphore_has_at_most_n_holders<H: Harness>(h: &H) {
    let name = unique("sem");
    let mut clients = Vec::new();
    for i in 0..5 {
        let store = if i % 2 == 0 {
            h.store()
        } else {
            h.separate_store().await
        };
        clients.push(locks(store, &format!("node-{i}")));
    }
    let mut held = Vec::new();
    for c in &clients {
        let sem = c.semaphore(&name, 3).unwrap();
        assert_eq!(sem.permits(), 3);
        if let Some(permit) = sem.try_acquire().await.unwrap() {
            held.push(permit);
        }
    }
    assert_eq!(held.len(), 3, "three permits");
    let mut permits: Vec<u32> = held.iter().map(|g| g.permit().unwrap()).collect();
    permits.sort_unstable();
    assert_eq!(permits, [0, 1, 2]);
    for g in &held {
        assert_eq!(g.resource(), format!("{name}#{}", g.permit().unwrap()));
        assert_eq!(g.name(), name);
    }
    // A waiter gets the permit that is released, with a higher token than its last holder's.
    let sem = clients[4].semaphore(&name, 3).unwrap();
    let waiter = tokio::spawn(async move { sem.acquire(Duration::from_secs(20)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let freed = held.remove(1);
    let (permit, token) = (freed.permit(), freed.token());
    assert!(freed.release().await.unwrap());
    let got = waiter.await.unwrap().unwrap();
    assert_eq!(got.permit(), permit);
    assert!(got.token() > token);
    // All permits held again: a fifth times out.
    let err = clients[3]
        .semaphore(&name, 3)
        .unwrap()
        .acquire(Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
}

/// Steady contention: six clients, two permits, each taking one, holding it a moment, letting
/// go and asking again at once. There is no queue, so fairness comes from the waiters' wake-ups
/// (a release notification, the holder's lease end, the retry interval) and the random permit
/// order: every client gets permits, none waits past a bound, and the figures are printed.
pub async fn a_semaphore_under_steady_contention_starves_no_waiter<H: Harness>(h: &H) {
    const CLIENTS: usize = 6;
    const RUN: Duration = Duration::from_secs(6);
    let name = unique("fair");
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let store = if i % 2 == 0 {
            h.store()
        } else {
            h.separate_store().await
        };
        let sem = locks(store, &format!("node-{i}"))
            .semaphore(&name, 2)
            .unwrap();
        tasks.push(tokio::spawn(async move {
            let (mut grants, mut longest) = (0usize, Duration::ZERO);
            while start.elapsed() < RUN {
                let asked = Instant::now();
                let permit = sem.acquire(Duration::from_secs(20)).await.unwrap();
                longest = longest.max(asked.elapsed());
                grants += 1;
                tokio::time::sleep(Duration::from_millis(40 + fastrand::u64(0..40))).await;
                assert!(permit.release().await.unwrap());
                tokio::time::sleep(Duration::from_millis(fastrand::u64(0..20))).await;
            }
            (grants, longest)
        }));
    }
    let mut figures = Vec::new();
    for t in tasks {
        figures.push(t.await.unwrap());
    }
    let total: usize = figures.iter().map(|f| f.0).sum();
    let fewest = figures.iter().map(|f| f.0).min().unwrap_or(0);
    let longest = figures.iter().map(|f| f.1).max().unwrap_or_default();
    eprintln!(
        "fairness: {total} grants over {CLIENTS} clients and 2 permits in {RUN:?}: per client {:?}, longest wait {longest:?}",
        figures.iter().map(|f| f.0).collect::<Vec<_>>()
    );
    assert!(total >= 20, "{total} grants in {RUN:?}");
    // Nobody starves: every client gets at least a quarter of an even share, and no wait is
    // longer than half the run.
    assert!(
        fewest * CLIENTS * 4 >= total,
        "a client got {fewest} of {total} grants"
    );
    assert!(longest < RUN / 2, "a wait of {longest:?}");
}

/// A holder that had to wait yields after it lets go, but never at the cost of an acquire's
/// only attempt: with the lock free, an acquire whose timeout is shorter than the yield asks at
/// once and gets it (not a timeout). One with time to spare waits the yield out first.
pub async fn a_yield_never_costs_an_acquire_its_only_attempt<H: Harness>(h: &H) {
    let a = locks(h.store(), "node-a");
    // A yield of one second, far from the statements' own times on a loaded machine.
    let b = Locks::builder(h.separate_store().await)
        .owner("node-b")
        .lease_duration(LEASE)
        .renew_interval(RENEW)
        .retry_interval(Duration::from_secs(1))
        .build()
        .unwrap();
    let name = unique("lock");
    let held = a.lock(&name).unwrap().try_acquire().await.unwrap().unwrap();
    let lock = b.lock(&name).unwrap();
    let waiter = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.acquire(Duration::from_secs(10)).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(held.release().await.unwrap());
    // b waited for a's hold: letting go of it, b yields one retry interval (1 s).
    let contended = waiter.await.unwrap().unwrap();
    assert!(contended.release().await.unwrap());
    let quick = lock
        .acquire(Duration::from_millis(50))
        .await
        .expect("a free lock, asked for once, not a timeout");
    assert!(quick.release().await.unwrap());
    // Once the yield is over, a hold that waited for nobody yields nothing after it.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let uncontended = lock.acquire(Duration::from_secs(5)).await.unwrap();
    assert!(uncontended.release().await.unwrap());
    let asked = Instant::now();
    let again = lock.acquire(Duration::from_secs(5)).await.unwrap();
    assert!(
        asked.elapsed() < Duration::from_millis(600),
        "{:?}: an uncontended hold yields nothing",
        asked.elapsed()
    );
    drop(again);
}

/// Bad names, permits, durations and timeouts are typed errors, and no statement is sent.
pub async fn bad_input_is_refused_before_sql<H: Harness>(h: &H)
where
    H::Store: MembershipStore,
{
    let counting = Counting::default();
    let a = locks(Double::over(h.store(), counting.clone()), "node-a");
    for bad in ["", " x", "x\n", &"x".repeat(256)] {
        let err = a.lock(bad).unwrap_err();
        assert!(
            matches!(err, LockError::Store(StoreError::InvalidResource { .. })),
            "{bad:?}: {err:?}"
        );
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
    }
    for permits in [0, MAX_PERMITS + 1] {
        let err = a.semaphore("s", permits).unwrap_err();
        assert!(matches!(err, LockError::Permits { .. }), "{err:?}");
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
    }
    // The permits' own names must fit too: `name#1023`.
    let err = a.semaphore("x".repeat(251), MAX_PERMITS).unwrap_err();
    assert!(
        matches!(err, LockError::Store(StoreError::InvalidResource { .. })),
        "{err:?}"
    );
    let lock = a.lock("fine").unwrap();
    let err = lock
        .acquire(Duration::from_secs(400 * 24 * 3600))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::TimeoutTooLong { .. }), "{err:?}");
    let zero = Locks::builder(h.store())
        .lease_duration(Duration::ZERO)
        .build()
        .unwrap_err();
    assert!(matches!(zero, ConfigError::Zero { .. }), "{zero:?}");
    let slow = Locks::builder(h.store())
        .lease_duration(Duration::from_secs(10))
        .renew_interval(Duration::from_secs(5))
        .build()
        .unwrap_err();
    assert!(matches!(slow, ConfigError::RenewTooSlow { .. }), "{slow:?}");
    let owner = Locks::builder(h.store())
        .owner("x".repeat(201))
        .build()
        .unwrap_err();
    assert!(matches!(owner, ConfigError::Invalid(_)), "{owner:?}");
    assert_eq!(counting.sent(), 0, "nothing reached the store");
}

/// A hold carries its process's payload, written by the grant and kept by the batch renews:
/// a waiter that times out is told the holder and its payload (a lock's and a permit's), and
/// an over-long payload is refused when the locks are built.
pub async fn a_waiter_that_times_out_is_told_the_holders_payload<H: Harness>(h: &H) {
    let a = Locks::builder(h.store())
        .owner("node-a")
        .payload("http://node-a:8080")
        .lease_duration(LEASE)
        .renew_interval(RENEW)
        .retry_interval(Duration::from_millis(100))
        .build()
        .unwrap();
    let b = locks(h.separate_store().await, "node-b");
    let name = unique("lock");
    let held = a.lock(&name).unwrap().try_acquire().await.unwrap().unwrap();
    // Past a few batch renews: the payload stays with the hold.
    tokio::time::sleep(RENEW * 3).await;
    assert!(held.is_held());
    let timed_out = |err: &LockError| match err {
        LockError::Timeout {
            holder: Some(holder),
            payload,
            ..
        } => holder.starts_with("node-a/") && payload.as_deref() == Some("http://node-a:8080"),
        _ => false,
    };
    let err = b
        .lock(&name)
        .unwrap()
        .acquire(Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(timed_out(&err), "{err:?}");
    let rec = h.store().current(&name).await.unwrap().unwrap();
    assert_eq!(rec.payload.as_deref(), Some("http://node-a:8080"));
    // A semaphore's waiter reads its permits together (`current_all`): the payload too.
    let sem = unique("sem");
    let semaphore = a.semaphore(&sem, 2).unwrap();
    let first = semaphore.try_acquire().await.unwrap().expect("free");
    let second = semaphore.try_acquire().await.unwrap().expect("free");
    let err = b
        .semaphore(&sem, 2)
        .unwrap()
        .acquire(Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(timed_out(&err), "{err:?}");
    assert!(first.release().await.unwrap());
    assert!(second.release().await.unwrap());
    assert!(held.release().await.unwrap());
    let err = Locks::builder(h.store())
        .payload("x".repeat(orion_beacon::store::MAX_PAYLOAD_LEN + 1))
        .build()
        .unwrap_err();
    assert!(
        matches!(err, ConfigError::Invalid(StoreError::InvalidPayload { .. })),
        "{err:?}"
    );
}

/// Readers share a reader-writer lock up to its read slots, a writer holds it alone, and every
/// write hold's token exceeds every earlier read and write hold's.
pub async fn a_rw_lock_has_readers_together_or_one_writer<H: Harness>(h: &H) {
    let a = locks(h.store(), "node-a");
    let b = locks(h.separate_store().await, "node-b");
    let name = unique("rw");
    let (rw_a, rw_b) = (a.rw_lock(&name, 2).unwrap(), b.rw_lock(&name, 2).unwrap());
    assert_eq!(rw_a.read_slots(), 2);
    let r1 = rw_a.try_read().await.unwrap().expect("free");
    let r2 = rw_b
        .try_read()
        .await
        .unwrap()
        .expect("a second reader shares it");
    assert_ne!(r1.resource(), r2.resource());
    assert_eq!(r1.name(), name);
    assert!(r1.resource().starts_with(&format!("{name}#r")));
    assert!(
        rw_a.try_read().await.unwrap().is_none(),
        "both read slots held"
    );
    assert!(rw_b.try_write().await.unwrap().is_none(), "readers hold it");
    assert!(rw_a.try_read().await.unwrap().is_none());
    let mut earlier = vec![r1.token(), r2.token()];
    assert!(r1.release().await.unwrap());
    assert!(
        rw_b.try_write().await.unwrap().is_none(),
        "one reader still holds it"
    );
    assert!(r2.release().await.unwrap());
    let w = rw_b.try_write().await.unwrap().expect("free");
    assert!(w.is_held());
    assert_eq!(w.terms().count(), 2);
    assert!(
        earlier.iter().all(|t| w.token() > *t),
        "{:?} after {earlier:?}",
        w.token()
    );
    assert!(
        rw_a.try_read().await.unwrap().is_none(),
        "a writer holds it"
    );
    assert!(
        rw_a.try_write().await.unwrap().is_none(),
        "one writer at a time"
    );
    earlier.push(w.token());
    assert!(w.release().await.unwrap(), "every row released");
    let r3 = rw_a.try_read().await.unwrap().expect("free again");
    earlier.push(r3.token());
    drop(r3);
    let w2 = rw_a.write(Duration::from_secs(10)).await.unwrap();
    assert!(
        earlier.iter().all(|t| w2.token() > *t),
        "{:?} after {earlier:?}",
        w2.token()
    );
    assert!(w2.release().await.unwrap());
    assert_eq!(a.held() + b.held(), 0);
    assert!(matches!(
        a.rw_lock(&name, 0),
        Err(LockError::Permits { .. })
    ));
    assert!(matches!(
        a.rw_lock(&name, MAX_PERMITS + 1),
        Err(LockError::Permits { .. })
    ));
}

/// A writer that cannot have the lock in time gives up with a typed error and leaves nothing
/// held: its gate no longer keeps readers out. A dropped write guard frees every row at once.
pub async fn a_rw_writer_that_times_out_leaves_nothing_held<H: Harness>(h: &H) {
    let a = long_locks(h.store(), "node-a");
    let b = long_locks(h.separate_store().await, "node-b");
    let name = unique("rw");
    let (rw_a, rw_b) = (a.rw_lock(&name, 3).unwrap(), b.rw_lock(&name, 3).unwrap());
    let reader = rw_a.try_read().await.unwrap().expect("free");
    let asked = Instant::now();
    let err = rw_b.write(Duration::from_millis(400)).await.unwrap_err();
    assert!(
        asked.elapsed() + super::SUSPEND_SLACK >= Duration::from_millis(400),
        "{:?}",
        asked.elapsed()
    );
    assert!(
        asked.elapsed() < Duration::from_millis(2_400),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(err.kind(), ErrorKind::TimedOut, "{err:?}");
    assert_eq!(b.held(), 0, "the gate and the slots taken are let go");
    let second = rw_b
        .read(Duration::from_secs(5))
        .await
        .expect("readers get in again");
    drop((reader, second));
    let w = rw_b.write(Duration::from_secs(10)).await.unwrap();
    let dropped = Instant::now();
    drop(w);
    let again = rw_a.read(Duration::from_secs(10)).await.unwrap();
    assert!(
        dropped.elapsed() < Duration::from_secs(5),
        "freed by the drop, not its 30 s lease: {:?}",
        dropped.elapsed()
    );
    drop(again);
}

/// Readers that keep the lock busy (four clients, three read slots, each holding 40-80 ms and
/// asking again at once) do not starve a writer: once it holds the gate no new reader gets in,
/// and it waits for the readers holding then. Each writer's wait is printed.
pub async fn a_steady_stream_of_rw_readers_does_not_starve_a_writer<H: Harness>(h: &H) {
    const READERS: usize = 4;
    let name = unique("rwfair");
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..READERS {
        let store = if i % 2 == 0 {
            h.store()
        } else {
            h.separate_store().await
        };
        let rw = locks(store, &format!("reader-{i}"))
            .rw_lock(&name, 3)
            .unwrap();
        let (stop, reads) = (stop.clone(), reads.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                if let Ok(guard) = rw.read(Duration::from_secs(20)).await {
                    reads.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(40 + fastrand::u64(0..40))).await;
                    let _ = guard.release().await;
                }
            }
        }));
    }
    let writer = locks(h.separate_store().await, "writer")
        .rw_lock(&name, 3)
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut waits = Vec::new();
    for _ in 0..3 {
        let asked = Instant::now();
        let w = writer.write(Duration::from_secs(20)).await.unwrap();
        waits.push(asked.elapsed());
        assert!(w.is_held());
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(w.release().await.unwrap());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    let reads = reads.load(Ordering::SeqCst);
    eprintln!("writer waits under {READERS} readers on 3 slots: {waits:?}; {reads} reads");
    assert!(reads >= 10, "the readers kept it busy: {reads} reads");
    // The readers holding when the gate is taken let go within 80 ms; the writer then asks
    // for each slot, woken by the release or its 100 ms retry. Room for a loaded machine.
    for wait in &waits {
        assert!(
            *wait < Duration::from_secs(5),
            "a writer waited {wait:?}: {waits:?}"
        );
    }
}

/// A writer of many slots (more than it asks for at once) with readers on two of them takes
/// the free ones, waits for both readers, and holds every slot in slot order with a token
/// above both readers'.
pub async fn a_rw_writer_of_many_slots_waits_for_each_reader<H: Harness>(h: &H) {
    const SLOTS: u32 = 9;
    let a = long_locks(h.store(), "node-a");
    let b = long_locks(h.separate_store().await, "node-b");
    let name = unique("rw");
    let (rw_a, rw_b) = (
        a.rw_lock(&name, SLOTS).unwrap(),
        b.rw_lock(&name, SLOTS).unwrap(),
    );
    let mut reads = Vec::new();
    for _ in 0..SLOTS {
        reads.push(rw_a.try_read().await.unwrap().expect("free"));
    }
    let mut kept = Vec::new();
    for r in reads {
        if matches!(r.permit(), Some(1) | Some(6)) {
            kept.push(r);
        } else {
            assert!(r.release().await.unwrap());
        }
    }
    let writer = tokio::spawn(async move { rw_b.write(Duration::from_secs(20)).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!writer.is_finished(), "two readers hold slots");
    let tokens: Vec<_> = kept.iter().map(|r| r.token()).collect();
    for r in kept {
        assert!(r.release().await.unwrap());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let w = writer.await.unwrap().unwrap();
    assert!(w.is_held());
    let slots: Vec<String> = w.terms().map(|t| t.resource().to_owned()).collect();
    let expected: Vec<String> = (0..SLOTS).map(|i| format!("{name}#r{i}")).collect();
    assert_eq!(slots, expected, "every slot, in slot order");
    assert!(
        tokens.iter().all(|t| w.token() > *t),
        "{:?} after {tokens:?}",
        w.token()
    );
    assert!(w.release().await.unwrap());
}

/// A writer waiting for a reader keeps every new reader out, though read slots are free: its
/// gate is held from the moment it asks. It gets the lock once that one reader lets go.
pub async fn a_waiting_rw_writer_keeps_new_readers_out<H: Harness>(h: &H) {
    let a = long_locks(h.store(), "node-a");
    let b = long_locks(h.separate_store().await, "node-b");
    let name = unique("rw");
    let (rw_a, rw_b) = (a.rw_lock(&name, 3).unwrap(), b.rw_lock(&name, 3).unwrap());
    // One read hold, of the first slot: the writer takes the gate and the two free slots,
    // then waits for that one.
    let mut reads = Vec::new();
    for _ in 0..3 {
        reads.push(rw_a.try_read().await.unwrap().expect("free"));
    }
    let first = reads.iter().position(|r| r.permit() == Some(0)).unwrap();
    let reader = reads.swap_remove(first);
    for r in reads {
        assert!(r.release().await.unwrap());
    }
    let writer = tokio::spawn(async move { rw_b.write(Duration::from_secs(20)).await });
    let gate = format!("{name}#w");
    let asked = Instant::now();
    loop {
        let record = h.store().current(&gate).await.unwrap();
        if record.is_some_and(|r| r.live) {
            break;
        }
        assert!(
            asked.elapsed() < Duration::from_secs(10),
            "the writer never took its gate"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        rw_a.try_read().await.unwrap().is_none(),
        "two slots are free, but a writer waits"
    );
    let err = rw_a.read(Duration::from_millis(300)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut, "{err:?}");
    assert!(!writer.is_finished(), "the reader still holds its slot");
    let token = reader.token();
    assert!(reader.release().await.unwrap());
    let w = writer.await.unwrap().unwrap();
    assert!(w.token() > token);
    assert!(w.release().await.unwrap());
}

#[macro_export]
macro_rules! lock_suite {
    // `#[ignore = "why"]` first: for a backend that needs a server this machine may not have.
    (#[ignore = $why:literal] $setup:expr) => {
        $crate::lock_suite!(@all [ignore = $why] $setup);
    };
    ($setup:expr) => {
        $crate::lock_suite!(@all [cfg(all())] $setup);
    };
    (@all $attr:tt $setup:expr) => {
        $crate::lock_suite!(@cases $attr $setup;
            a_lock_has_one_holder_and_each_hold_a_higher_token,
            acquire_waits_for_a_release_and_times_out,
            a_dropped_guard_releases_at_once,
            holds_are_renewed_with_one_statement_per_round,
            a_lost_hold_says_so_and_its_work_is_dropped,
            an_acquire_given_up_on_leaves_nothing_held,
            a_renew_answered_too_late_still_leaves_nothing_held,
            a_semaphore_has_at_most_n_holders,
            bad_input_is_refused_before_sql,
            a_renew_refused_for_good_ends_the_holds_it_asked_for,
            a_renew_answer_that_leaves_a_hold_out_is_asked_again,
            a_release_given_up_on_still_releases,
            an_error_that_may_hide_a_grant_is_released,
            a_semaphore_under_steady_contention_starves_no_waiter,
            a_yield_never_costs_an_acquire_its_only_attempt,
            a_waiter_that_times_out_is_told_the_holders_payload,
            a_rw_lock_has_readers_together_or_one_writer,
            a_rw_writer_that_times_out_leaves_nothing_held,
            a_steady_stream_of_rw_readers_does_not_starve_a_writer,
            a_waiting_rw_writer_keeps_new_readers_out,
            a_rw_writer_of_many_slots_waits_for_each_reader,
        );
    };
    (@cases $attr:tt $setup:expr; $($case:ident),* $(,)?) => {
        mod locks {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #$attr
                async fn $case() {
                    #[allow(unused_imports)]
                    use $crate::common::conformance::Harness as _;
                    if let Some(h) = $setup.await {
                        $crate::common::locks::$case(&h).await;
                        h.teardown().await;
                    }
                }
            )*
        }
    };
}

/// A lock held in one "process" (`a`) and waited for in another (`b`), whose waiter polls only
/// every 10 s: the release must wake it at once (`backend` names the mechanism in the output);
/// then, with notifications off on `b`, the waiter only polls and times out. Returns the time
/// from the release to the grant.
pub async fn a_release_wakes_a_lock_waiter(
    a: &orion_beacon::SeaOrmLeaseStore,
    b: &orion_beacon::SeaOrmLeaseStore,
    backend: &str,
) -> Duration {
    const POLL: Duration = Duration::from_secs(10);
    const WELL_UNDER: Duration = Duration::from_secs(2);
    let locks = |store: &orion_beacon::SeaOrmLeaseStore, owner: &str| {
        Locks::builder(store.clone())
            .owner(owner)
            .retry_interval(POLL)
            .build()
            .unwrap()
    };
    let name = unique("invoices");
    let (la, lb) = (locks(a, "a"), locks(b, "b"));
    let held = la
        .lock(&name)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    let waited = name.clone();
    let waiter = tokio::spawn(async move {
        let guard = lb
            .lock(&waited)
            .unwrap()
            .acquire(Duration::from_secs(20))
            .await
            .unwrap();
        (Instant::now(), guard)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the waiter waits for the held lock");
    let released = Instant::now();
    assert!(held.release().await.unwrap());
    let (granted, guard) = waiter.await.unwrap();
    let after = granted.saturating_duration_since(released);
    eprintln!("{backend} lock release to grant in {after:?}");
    assert!(after < WELL_UNDER, "{after:?} after the release");
    assert!(guard.release().await.unwrap());

    // Off: the waiter only polls.
    let quiet = b.clone().with_release_notifications(false);
    let lq = locks(&quiet, "q");
    let name = unique("quiet");
    let held = la
        .lock(&name)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    let waiter = tokio::spawn(async move {
        lq.lock(&name)
            .unwrap()
            .acquire(Duration::from_millis(1_500))
            .await
            .map(|_| ())
    });
    // Time for its first attempt (denied) before the release.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(held.release().await.unwrap());
    assert!(
        waiter.await.unwrap().is_err(),
        "without wake-ups the waiter polls (every 10 s) and times out"
    );
    after
}
