//! The trait's default methods.
use super::*;

/// A store that keeps the trait's defaults, forwarding the required methods; with
/// `stale_reads`, its reads always show the lease as live (a read just before it lapsed).
struct Plain(crate::memory::InMemoryLeaseStore, bool);

impl Plain {
    fn new() -> Self {
        Self(crate::memory::InMemoryLeaseStore::new(), false)
    }

    fn with_stale_reads() -> Self {
        Self(crate::memory::InMemoryLeaseStore::new(), true)
    }
}

#[async_trait]
impl LeaseStore for Plain {
    async fn acquire_or_renew(
        &self,
        resource: &str,
        candidate: &str,
        lease: Duration,
    ) -> Result<LeaseOutcome, StoreError> {
        self.0.acquire_or_renew(resource, candidate, lease).await
    }
    async fn release(&self, resource: &str, candidate: &str) -> Result<bool, StoreError> {
        self.0.release(resource, candidate).await
    }
    async fn release_lease(&self, lease: &Lease) -> Result<bool, StoreError> {
        self.0.release_lease(lease).await
    }
    async fn current(&self, resource: &str) -> Result<Option<LeaseRecord>, StoreError> {
        Ok(self.0.current(resource).await?.map(|mut record| {
            record.live |= self.1;
            record
        }))
    }
}

fn acquired(outcome: Result<LeaseOutcome, StoreError>) -> Lease {
    match outcome {
        Ok(LeaseOutcome::Acquired(lease)) => lease,
        other => panic!("a fresh lease is acquired: {other:?}"),
    }
}

// The default renews lease by lease, each only as given: the same holder and token, live.
#[tokio::test]
async fn the_default_batch_renew_renews_each_lease_only_as_given() {
    let store = Plain::new();
    let secs = Duration::from_secs(5);
    let a = acquired(store.acquire_or_renew("a", "me", secs).await);
    let b = acquired(store.acquire_or_renew("b", "me", secs).await);
    let c = acquired(store.acquire_or_renew("c", "me", secs).await);
    assert!(store.release_lease(&b).await.unwrap());
    let mut other_term = c.clone();
    other_term.token = FencingToken::new(c.token.get() + 1);
    let renewals = store
        .renew_all(&[a.clone(), b.clone(), other_term.clone()], secs)
        .await
        .unwrap();
    assert_eq!(renewals.renewed.len(), 1, "{renewals:?}");
    assert_eq!(renewals.renewed[0].token, a.token);
    assert_eq!(renewals.lost, [b.clone(), other_term]);
    assert!(renewals.unanswered.is_empty());
    // Nothing started a term: b stays released, c keeps its token.
    assert!(!store.current("b").await.unwrap().unwrap().live);
    assert_eq!(store.current("c").await.unwrap().unwrap().token, c.token);
    let err = store.renew_all(&[a.clone(), a], secs).await.unwrap_err();
    assert!(matches!(err, StoreError::InvalidResource { .. }), "{err:?}");
}

// A lease that lapses between the read and the renew comes back as a new term: released at
// once, the lease reported lost.
#[tokio::test]
async fn the_default_batch_renew_releases_a_term_it_started_by_accident() {
    let store = Plain::with_stale_reads();
    let a = acquired(
        store
            .acquire_or_renew("a", "me", Duration::from_millis(20))
            .await,
    );
    tokio::time::sleep(Duration::from_millis(60)).await;
    let renewals = store
        .renew_all(std::slice::from_ref(&a), Duration::from_secs(5))
        .await
        .unwrap();
    assert!(renewals.renewed.is_empty(), "{renewals:?}");
    assert_eq!(renewals.lost, [a]);
    let record = store.0.current("a").await.unwrap().unwrap();
    assert!(!record.live, "the accidental term was released: {record:?}");
}

#[test]
fn names() {
    assert!(validate_resource("nightly-report").is_ok());
    assert!(validate_resource(&"é".repeat(255)).is_ok());
    for bad in ["", " a", "a ", "a\nb", "a\0b", "\t"] {
        assert!(
            matches!(
                validate_resource(bad),
                Err(StoreError::InvalidResource { .. })
            ),
            "{bad:?}"
        );
        assert!(
            matches!(
                validate_candidate(bad),
                Err(StoreError::InvalidCandidate { .. })
            ),
            "{bad:?}"
        );
    }
    assert!(validate_resource(&"x".repeat(256)).is_err());
}

#[test]
fn leases() {
    assert_eq!(lease_millis(Duration::from_millis(1)).unwrap(), 1);
    assert_eq!(lease_millis(Duration::from_micros(1500)).unwrap(), 1);
    assert_eq!(lease_millis(Duration::from_secs(15)).unwrap(), 15_000);
    for bad in [
        Duration::ZERO,
        Duration::from_micros(999),
        MAX_LEASE + Duration::from_millis(1),
        Duration::MAX,
    ] {
        assert!(
            matches!(
                lease_millis(bad),
                Err(StoreError::InvalidLeaseDuration { .. })
            ),
            "{bad:?}"
        );
    }
}
