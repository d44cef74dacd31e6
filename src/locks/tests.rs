//! What the store-generic lock suite cannot reach: calls outside any runtime, and holds that
//! outlive the runtime that took them.

use std::time::Duration;

use super::{LockError, Locks};
use crate::{error::ErrorKind, memory::InMemoryLeaseStore, store::LeaseStore};

fn locks() -> Locks {
    Locks::builder(InMemoryLeaseStore::new())
        .owner("node-a")
        .lease_duration(Duration::from_millis(1_500))
        .renew_interval(Duration::from_millis(300))
        .build()
        .unwrap()
}

#[test]
fn an_acquire_outside_a_runtime_is_refused_before_any_statement() {
    let locks = locks();
    let lock = locks.lock("x").unwrap();
    let sem = locks.semaphore("s", 2).unwrap();
    let answers = [
        futures::executor::block_on(lock.try_acquire()).map(|_| ()),
        futures::executor::block_on(lock.acquire(Duration::from_secs(1))).map(|_| ()),
        futures::executor::block_on(sem.try_acquire()).map(|_| ()),
        futures::executor::block_on(sem.acquire(Duration::from_secs(1))).map(|_| ()),
    ];
    for answer in answers {
        let err = answer.unwrap_err();
        assert!(matches!(err, LockError::NoRuntime), "{err:?}");
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
    }
    assert_eq!(locks.held(), 0);
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn holds_outlive_the_runtime_that_took_them() {
    let locks = locks();
    let lock = locks.lock("x").unwrap();
    let first = runtime();
    let guard = first.block_on(lock.try_acquire()).unwrap().unwrap();
    // The renewer was a task of this runtime: it ends with it.
    drop(first);
    runtime().block_on(async {
        assert!(guard.is_held(), "looked at here, it is renewed here");
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(
            guard.is_held(),
            "renewed past two leases on the second runtime"
        );
        assert!(lock.try_acquire().await.unwrap().is_none());
        assert!(guard.release().await.unwrap());
    });
}

#[test]
fn lost_completes_for_a_hold_whose_runtime_is_gone() {
    let store = InMemoryLeaseStore::new();
    let locks = Locks::builder(store.clone())
        .owner("node-a")
        .lease_duration(Duration::from_millis(1_500))
        .renew_interval(Duration::from_millis(300))
        .build()
        .unwrap();
    let first = runtime();
    let guard = first
        .block_on(locks.lock("x").unwrap().try_acquire())
        .unwrap()
        .unwrap();
    drop(first);
    runtime().block_on(async {
        // Taken away in the store: only a renew finds out, so lost() needs a renewer.
        assert!(store
            .release(guard.resource(), guard.term().candidate())
            .await
            .unwrap());
        tokio::time::timeout(Duration::from_secs(2), guard.lost())
            .await
            .expect("lost() completes on the caller's runtime");
        assert!(!guard.is_held());
    });
}

/// A wrapper store written as the `LeaseStore` docs show: the four required methods forwarded,
/// the batch ones left to their defaults.
struct Wrapper(InMemoryLeaseStore);

#[async_trait::async_trait]
impl LeaseStore for Wrapper {
    async fn acquire_or_renew(
        &self,
        resource: &str,
        candidate: &str,
        lease: Duration,
    ) -> Result<crate::lease::LeaseOutcome, crate::error::StoreError> {
        self.0.acquire_or_renew(resource, candidate, lease).await
    }
    async fn release(
        &self,
        resource: &str,
        candidate: &str,
    ) -> Result<bool, crate::error::StoreError> {
        self.0.release(resource, candidate).await
    }
    async fn release_lease(
        &self,
        lease: &crate::lease::Lease,
    ) -> Result<bool, crate::error::StoreError> {
        self.0.release_lease(lease).await
    }
    async fn current(
        &self,
        resource: &str,
    ) -> Result<Option<crate::lease::LeaseRecord>, crate::error::StoreError> {
        self.0.current(resource).await
    }
}

// A lock on the documented wrapper is kept past several leases (the default batch renew
// renews lease by lease); it was lost 200 ms after its grant while the default refused.
#[tokio::test]
async fn a_lock_on_a_documented_wrapper_store_is_kept() {
    let locks = Locks::builder(Wrapper(InMemoryLeaseStore::new()))
        .owner("node-a")
        .lease_duration(Duration::from_millis(300))
        .renew_interval(Duration::from_millis(80))
        .build()
        .unwrap();
    let lock = locks.lock("x").unwrap();
    let guard = lock.try_acquire().await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert!(guard.is_held(), "held past four leases");
    assert!(lock.try_acquire().await.unwrap().is_none());
    assert!(guard.release().await.unwrap());
}
