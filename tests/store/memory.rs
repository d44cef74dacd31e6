//! The store contract on `InMemoryLeaseStore`.

use crate::common;

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

lock_suite!(async { Some(Memory(InMemoryLeaseStore::new())) });

rate_suite!(async { Some(Memory(InMemoryLeaseStore::new())) });

/// Expiry follows tokio's clock, so it can be tested with paused time.
#[tokio::test(start_paused = true)]
async fn expiry_follows_paused_tokio_time() {
    use orion_beacon::{store::LeaseOutcome, LeaseStore};
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

/// Two handles of one store with one candidate id renew one term at the same instant (paused
/// time), or a renew with a shorter lease ends exactly where an earlier write ended: a late
/// `release_lease` of the earlier write must not end the later one, and a third candidate must
/// stay denied. Each renew's remaining time is its new expiry's.
#[tokio::test(start_paused = true)]
async fn a_late_release_never_ends_a_renew_at_the_same_instant() {
    use orion_beacon::{store::LeaseOutcome, Lease, LeaseStore};
    use std::time::Duration;
    let grant = |out: LeaseOutcome| -> Lease {
        match out {
            LeaseOutcome::Acquired(l) | LeaseOutcome::Renewed(l) => l,
            LeaseOutcome::Denied(d) => panic!("the holder was denied: {d:?}"),
        }
    };
    let p1 = InMemoryLeaseStore::new();
    let p2 = p1.clone();
    let lease = Duration::from_secs(10);
    // After each later write, the late release of the write before it.
    let late_release_changes_nothing = |earlier: Lease, later: Lease| {
        let (p1, p2) = (p1.clone(), p2.clone());
        async move {
            assert!(
                !p1.release_lease(&earlier).await.unwrap(),
                "a late release of {earlier:?} ended the later write {later:?}"
            );
            let third = p1.acquire_or_renew("job", "third", lease).await.unwrap();
            assert!(
                matches!(third, LeaseOutcome::Denied(_)),
                "a third candidate was granted while the term was live: {third:?}"
            );
            let row = p2.current("job").await.unwrap().unwrap();
            assert!(row.live && row.expires_at == later.expires_at, "{row:?}");
            assert!(
                later.expires_at > earlier.expires_at,
                "a write of the term reused or undercut an earlier expiry: {earlier:?} then {later:?}"
            );
        }
    };
    let first = grant(p1.acquire_or_renew("job", "app", lease).await.unwrap());
    // The same instant, the same lease.
    let same = grant(p2.acquire_or_renew("job", "app", lease).await.unwrap());
    late_release_changes_nothing(first, same.clone()).await;
    // 4 s later a 6 s lease: it would end where the write before it ended.
    tokio::time::advance(Duration::from_secs(4)).await;
    let six = Duration::from_secs(6);
    let shorter = grant(p2.acquire_or_renew("job", "app", six).await.unwrap());
    late_release_changes_nothing(same, shorter.clone()).await;
    // The batch renew at the same instant.
    let out = p2
        .renew_all(std::slice::from_ref(&shorter), six)
        .await
        .unwrap();
    let batch = out.renewed[0].clone();
    late_release_changes_nothing(shorter.clone(), batch.clone()).await;
    for w in [&shorter, &batch] {
        assert!(w.remaining > six, "the new expiry's remaining time: {w:?}");
    }
    assert!(p1.release_lease(&batch).await.unwrap());
    let third = grant(p1.acquire_or_renew("job", "third", lease).await.unwrap());
    assert_eq!(third.token.get(), 2);
}
