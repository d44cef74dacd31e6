//! Ranked electors on the in-memory store: the options `build` refuses, and a candidacy
//! heartbeat that hangs never costs the leader its term.

use std::sync::Arc;
use std::time::Duration;

use orion_beacon::{
    store::async_trait, ConfigError, Elector, InMemoryLeaseStore, Member, MembershipStore,
    StoreError,
};

use crate::common::double::{Double, Intercept};
use crate::common::unique;

#[test]
fn options_a_ranked_elector_cannot_have_are_refused() {
    let builder = || Elector::builder(InMemoryLeaseStore::new()).resource("r");
    let refused = |result: Result<Elector, ConfigError>| match result {
        Err(ConfigError::Rank { reason }) => reason,
        other => panic!("expected ConfigError::Rank: {other:?}"),
    };
    refused(builder().rank(1).campaign(false).build());
    refused(builder().prefer_after(Duration::from_secs(1)).build());
    assert!(matches!(
        builder()
            .rank(1)
            .prefer_after(orion_beacon::elector::MAX_INTERVAL + Duration::from_secs(1))
            .build(),
        Err(ConfigError::TooLong {
            option: "prefer_after",
            ..
        })
    ));
    // Zero: preferred as soon as seen.
    assert!(builder()
        .rank(1)
        .prefer_after(Duration::ZERO)
        .build()
        .is_ok());
    // An id no offer can name, and a resource whose candidates' name would not fit.
    assert!(matches!(
        builder().rank(1).candidate_id("x".repeat(255)).build(),
        Err(ConfigError::Invalid(StoreError::InvalidCandidate { .. }))
    ));
    assert!(matches!(
        Elector::builder(InMemoryLeaseStore::new())
            .resource("x".repeat(253))
            .rank(1)
            .build(),
        Err(ConfigError::Invalid(StoreError::InvalidResource { .. }))
    ));
    // A store that keeps no candidates.
    refused(
        Elector::builder(Double::new(NoCandidates))
            .resource("r")
            .rank(1)
            .build(),
    );
}

#[derive(Clone)]
struct NoCandidates;

#[async_trait]
impl Intercept for NoCandidates {
    fn membership(&self, _: &InMemoryLeaseStore) -> Option<Arc<dyn MembershipStore>> {
        None
    }
}

/// A candidacy whose heartbeats hang (a membership table locked by someone else, say).
#[derive(Clone)]
struct Hanging;

#[async_trait]
impl Intercept for Hanging {
    fn membership(&self, inner: &InMemoryLeaseStore) -> Option<Arc<dyn MembershipStore>> {
        Some(Arc::new(HangingMembers(inner.clone())))
    }
}

struct HangingMembers(InMemoryLeaseStore);

#[async_trait]
impl MembershipStore for HangingMembers {
    async fn heartbeat(
        &self,
        shard_set: &str,
        member: &str,
        ttl: Duration,
        draining: bool,
    ) -> Result<Vec<Member>, StoreError> {
        self.0.heartbeat(shard_set, member, ttl, draining).await
    }

    async fn leave(&self, shard_set: &str, member: &str) -> Result<bool, StoreError> {
        self.0.leave(shard_set, member).await
    }

    async fn members(&self, shard_set: &str) -> Result<Vec<Member>, StoreError> {
        self.0.members(shard_set).await
    }

    async fn candidate_leave(&self, _: &str, _: &str) -> Result<bool, StoreError> {
        Ok(false)
    }

    async fn candidate_heartbeat(
        &self,
        _: &str,
        _: &str,
        _: Duration,
        _: i64,
    ) -> Result<Vec<orion_beacon::Candidate>, StoreError> {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Ok(Vec::new())
    }
}

/// The leader's heartbeat runs in the time before its next renew and is cut short there: a
/// heartbeat that never answers costs the leader nothing (one term, renewed all along), and
/// the candidacy reports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_candidacy_heartbeat_never_costs_the_leader_its_term() {
    let handle = Elector::builder(Double::new(Hanging))
        .resource(unique("hanging"))
        .candidate_id("a")
        .lease_duration(Duration::from_millis(600))
        .renew_interval(Duration::from_millis(150))
        .retry_interval(Duration::from_millis(100))
        .rank(1)
        .build()
        .unwrap()
        .start();
    tokio::time::timeout(
        Duration::from_secs(10),
        handle.watch().wait_for(|l| l.is_leader()),
    )
    .await
    .expect("it leads")
    .unwrap();
    let token = handle.token();
    // Eight leases: a heartbeat held past a deadline would have ended the term.
    for _ in 0..240 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(handle.token(), token, "the term went on");
    }
    let view = handle.candidacy().unwrap();
    assert!(view.error.is_some(), "{view:?}");
    handle.shutdown().await;
}
