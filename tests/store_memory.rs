//! The store contract on `InMemoryLeaseStore`.

mod common;

use async_trait::async_trait;
use common::conformance::Harness;
use orion_beacon::InMemoryLeaseStore;

struct Memory(InMemoryLeaseStore);

#[async_trait]
impl Harness for Memory {
    type Store = InMemoryLeaseStore;
    fn store(&self) -> InMemoryLeaseStore {
        self.0.clone()
    }
    async fn separate_store(&self) -> InMemoryLeaseStore {
        self.0.clone()
    }
    async fn teardown(self) {}
}

conformance_suite!(async { Some(Memory(InMemoryLeaseStore::new())) });

shard_suite!(async { Some(Memory(InMemoryLeaseStore::new())) });

/// Expiry follows tokio's clock, so it can be tested with paused time.
#[tokio::test(start_paused = true)]
async fn expiry_follows_paused_tokio_time() {
    use orion_beacon::{LeaseOutcome, LeaseStore};
    use std::time::Duration;
    let store = InMemoryLeaseStore::new();
    let lease = Duration::from_secs(15);
    assert!(matches!(
        store.acquire_or_renew("r", "a", lease).await.unwrap(),
        LeaseOutcome::Acquired(_)
    ));
    tokio::time::advance(Duration::from_millis(14_999)).await;
    let LeaseOutcome::Denied(d) = store.acquire_or_renew("r", "b", lease).await.unwrap() else {
        panic!()
    };
    assert_eq!(d.remaining, Duration::from_millis(1));
    tokio::time::advance(Duration::from_millis(1)).await;
    let out = store.acquire_or_renew("r", "b", lease).await.unwrap();
    assert!(
        matches!(out, LeaseOutcome::Acquired(ref l) if l.token.get() == 2),
        "{out:?}"
    );
}
