use std::sync::atomic::AtomicUsize;

use super::*;
use crate::{lease::LeaseOutcome, lease::LeaseRecord, memory::InMemoryLeaseStore};

/// The in-memory store, counting batched renews; `unanswered` answers every lease of them
/// as unanswered (as a store that put its errors there would).
#[derive(Default)]
struct Counting {
    inner: InMemoryLeaseStore,
    renews: AtomicUsize,
    unanswered: AtomicBool,
}

#[async_trait::async_trait]
impl LeaseStore for Counting {
    async fn acquire_or_renew(
        &self,
        resource: &str,
        candidate: &str,
        lease: Duration,
    ) -> Result<LeaseOutcome, StoreError> {
        self.inner
            .acquire_or_renew(resource, candidate, lease)
            .await
    }
    async fn release(&self, resource: &str, candidate: &str) -> Result<bool, StoreError> {
        self.inner.release(resource, candidate).await
    }
    async fn release_lease(&self, lease: &Lease) -> Result<bool, StoreError> {
        self.inner.release_lease(lease).await
    }
    async fn current(&self, resource: &str) -> Result<Option<LeaseRecord>, StoreError> {
        self.inner.current(resource).await
    }
    async fn renew_all(&self, held: &[Lease], lease: Duration) -> Result<Renewals, StoreError> {
        self.renews.fetch_add(1, Ordering::SeqCst);
        if self.unanswered.load(Ordering::SeqCst) {
            return Ok(Renewals {
                unanswered: held.to_vec(),
                ..Renewals::default()
            });
        }
        self.inner.renew_all(held, lease).await
    }
}

const LEASE: Duration = Duration::from_secs(10);
const TIMING: (Duration, Duration) = (LEASE, Duration::from_secs(3));

async fn setup() -> (Arc<Counting>, Arc<dyn LeaseStore>, Vec<Lease>) {
    let counting = Arc::new(Counting::default());
    let store: Arc<dyn LeaseStore> = counting.clone();
    let mut leases = Vec::new();
    for r in ["a", "b"] {
        match store.acquire_or_renew(r, "me", LEASE).await.unwrap() {
            LeaseOutcome::Acquired(lease) => leases.push(lease),
            other => panic!("{other:?}"),
        }
    }
    (counting, store, leases)
}

#[tokio::test]
async fn holds_of_one_timing_renew_in_one_statement() {
    let (counting, store, leases) = setup().await;
    let renewer = Renewer::default();
    let deadline = crate::clock::now() + Duration::from_secs(5);
    let renewals = renewer
        .renew_now(&store, &leases, TIMING, deadline)
        .await
        .unwrap()
        .expect("answered");
    assert_eq!(renewals.renewed.len(), 2);
    assert_eq!(counting.renews.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn nothing_is_sent_past_the_deadline() {
    let (counting, store, leases) = setup().await;
    let renewer = Renewer::default();
    let answer = renewer
        .renew_now(&store, &leases, TIMING, crate::clock::now())
        .await
        .unwrap();
    assert!(answer.is_none(), "{answer:?}");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(counting.renews.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_renew_that_renewed_nothing_and_lost_nothing_is_no_answer() {
    let (counting, store, leases) = setup().await;
    counting.unanswered.store(true, Ordering::SeqCst);
    let renewer = Renewer::default();
    let deadline = crate::clock::now() + Duration::from_secs(5);
    let answer = renewer
        .renew_now(&store, &leases, TIMING, deadline)
        .await
        .unwrap();
    assert!(answer.is_none(), "{answer:?}");
}

/// A leader's term renews in a batch only with other holds: alone, it is answered `Alone`
/// (its elector renews with its own statement) and nothing is sent.
#[tokio::test]
async fn a_leader_alone_renews_on_its_own_and_with_others_in_the_batch() {
    let (counting, store, leases) = setup().await;
    let renewer = Renewer::default();
    let now = crate::clock::now();
    let deadline = now + Duration::from_secs(5);
    let mut ticket = renewer
        .enter(&store, leases[0].clone(), TIMING, now, deadline, true)
        .expect("a batch");
    let departure = ticket.departed().await.expect("it left");
    assert!(matches!(departure.reply().await, Reply::Alone));
    assert_eq!(counting.renews.load(Ordering::SeqCst), 0);

    let now = crate::clock::now();
    let mut ticket = renewer
        .enter(&store, leases[0].clone(), TIMING, now, deadline, true)
        .expect("a batch");
    let renewals = renewer
        .renew_now(&store, &leases[1..], TIMING, deadline)
        .await
        .unwrap()
        .expect("answered");
    assert_eq!(renewals.renewed.len(), 1);
    let departure = ticket.departed().await.expect("it left");
    assert!(matches!(departure.reply().await, Reply::Renewed(_)));
    assert_eq!(counting.renews.load(Ordering::SeqCst), 1);
}

/// A batch whose task is never run (its runtime is not driven) holds nobody up: after a
/// moment the leases renew alone, and batches pause.
#[test]
fn a_batch_held_up_is_left_after_a_moment() {
    let stuck = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let driven = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (counting, store, leases) = driven.block_on(setup());
    let renewer = Renewer::default();
    // An entry of the stuck runtime starts the batch task there.
    let first = {
        let _in = stuck.enter();
        let deadline = crate::clock::now() + Duration::from_secs(5);
        renewer.enter(
            &store,
            leases[0].clone(),
            TIMING,
            crate::clock::now(),
            deadline,
            false,
        )
    };
    assert!(first.is_some());
    let renewals = driven.block_on(async {
        let started = crate::clock::now();
        let deadline = started + Duration::from_secs(5);
        let renewals = renewer
            .renew_now(&store, &leases[1..], TIMING, deadline)
            .await
            .unwrap()
            .expect("answered");
        assert!(started.elapsed() < Duration::from_secs(1));
        renewals
    });
    assert_eq!(renewals.renewed.len(), 1);
    assert_eq!(counting.renews.load(Ordering::SeqCst), 1);
    let now = crate::clock::now();
    assert!(
        lock(&renewer.batches.paused).until.is_some_and(|u| u > now),
        "batches pause"
    );
}
