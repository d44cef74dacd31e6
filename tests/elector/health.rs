//! `ElectorHandle::health()`: unhealthy when no store round trip completed within the window,
//! leader or not; healthy again once the store answers. Paused tokio time (deterministic).

use crate::common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::double::{Double, Intercept};
use orion_beacon::{
    store::LeaseOutcome, store::ReleaseEvents, ConfigError, Elector, ElectorHandle,
    InMemoryLeaseStore, Leadership, LeaseStore, StoreError,
};
use tokio::time::{sleep, sleep_until, Instant};

/// The in-memory store, with candidates whose calls fail at once or never return.
#[derive(Clone, Default)]
struct Wedgeable {
    hanging: Arc<Mutex<HashSet<String>>>,
    failing: Arc<Mutex<HashSet<String>>>,
    /// Candidates whose calls fail with an error of the program's configuration.
    broken: Arc<Mutex<HashSet<String>>>,
    /// Candidates whose calls fail because the lease table is missing.
    tableless: Arc<Mutex<HashSet<String>>>,
    /// Calls per candidate.
    calls: Arc<Mutex<std::collections::HashMap<String, u32>>>,
}

impl Wedgeable {
    fn hang(&self, candidate: &str, on: bool) {
        let mut set = self.hanging.lock().unwrap();
        if on {
            set.insert(candidate.to_owned());
        } else {
            set.remove(candidate);
        }
    }
    fn fail(&self, candidate: &str, on: bool) {
        let mut set = self.failing.lock().unwrap();
        if on {
            set.insert(candidate.to_owned());
        } else {
            set.remove(candidate);
        }
    }
    fn calls(&self, candidate: &str) -> u32 {
        self.calls
            .lock()
            .unwrap()
            .get(candidate)
            .copied()
            .unwrap_or(0)
    }
    async fn gate(&self, candidate: &str) -> Result<(), StoreError> {
        *self
            .calls
            .lock()
            .unwrap()
            .entry(candidate.to_owned())
            .or_default() += 1;
        if self.broken.lock().unwrap().contains(candidate) {
            return Err(StoreError::UnsupportedBackend {
                backend: "PostgreSQL",
                feature: "postgres",
            });
        }
        if self.tableless.lock().unwrap().contains(candidate) {
            return Err(StoreError::MissingTable {
                table: "orionbeacon_leases".into(),
                source: sea_orm::DbErr::Custom("no such table: orionbeacon_leases".into()).into(),
            });
        }
        if self.failing.lock().unwrap().contains(candidate) {
            return Err(StoreError::Database(
                sea_orm::DbErr::Custom("injected".into()).into(),
            ));
        }
        let hangs = self.hanging.lock().unwrap().contains(candidate);
        if hangs {
            // A wedged connection: this call never returns.
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

#[async_trait]
impl Intercept for Wedgeable {
    async fn acquire_or_renew(
        &self,
        inner: &InMemoryLeaseStore,
        r: &str,
        c: &str,
        lease: Duration,
    ) -> Result<LeaseOutcome, StoreError> {
        self.gate(c).await?;
        inner.acquire_or_renew(r, c, lease).await
    }
    async fn release(
        &self,
        inner: &InMemoryLeaseStore,
        r: &str,
        c: &str,
    ) -> Result<bool, StoreError> {
        self.gate(c).await?;
        inner.release(r, c).await
    }
    async fn release_lease(
        &self,
        inner: &InMemoryLeaseStore,
        lease: &orion_beacon::Lease,
    ) -> Result<bool, StoreError> {
        self.gate(&lease.holder).await?;
        inner.release_lease(lease).await
    }
    /// No release notifications: followers poll.
    fn release_events(&self, _inner: &InMemoryLeaseStore) -> Option<ReleaseEvents> {
        None
    }
}

const LEASE: Duration = Duration::from_secs(15);
const RENEW: Duration = Duration::from_secs(5);
const RETRY: Duration = Duration::from_secs(2);
/// The default window: 3 × max(renew, retry).
const WINDOW: Duration = Duration::from_secs(15);

fn start(store: &Double<Wedgeable>, id: &str) -> ElectorHandle {
    Elector::builder(store.clone())
        .resource("job")
        .candidate_id(id)
        .lease_duration(LEASE)
        .renew_interval(RENEW)
        .retry_interval(RETRY)
        .jitter(0.0)
        .build()
        .unwrap()
        .start()
}

async fn wait_leader(handle: &ElectorHandle) {
    handle
        .watch()
        .wait_for(|s| matches!(s, Leadership::Leader(_)))
        .await
        .unwrap();
}

/// Polls every 100 ms until `health().healthy == want`; returns when (paused time).
async fn wait_health(handle: &ElectorHandle, want: bool, limit: Duration) -> Instant {
    let give_up = Instant::now() + limit;
    loop {
        if handle.health().healthy == want {
            return Instant::now();
        }
        assert!(
            Instant::now() < give_up,
            "health never became {want}: {}",
            handle.health()
        );
        sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn leader_turns_unhealthy_when_the_store_hangs_and_healthy_when_it_answers() {
    let store = Double::new(Wedgeable::default());
    let handle = start(&store, "a");
    wait_leader(&handle).await;
    let t0 = Instant::now();
    let h = handle.health();
    assert!(h.healthy && h.leader, "{h}");
    assert_eq!(h.window, WINDOW);
    assert_eq!(h.last_round_trip, Some(Duration::ZERO));

    // Renews at t0+5 and t0+10 go through; from t0+11 every call hangs.
    sleep_until(t0 + Duration::from_secs(11)).await;
    let last_ok = t0 + 2 * RENEW;
    assert_eq!(
        handle.health().last_round_trip,
        Some(Duration::from_secs(1))
    );
    store.hang("a", true);

    // Healthy up to the end of the window after the last answer...
    sleep_until(last_ok + WINDOW - Duration::from_millis(1)).await;
    let h = handle.health();
    assert!(h.healthy, "{h}");
    // ...by then the leader has stepped down (deadline: last_ok + lease - margin), but it is
    // still healthy: health is about the store answering, not about leading.
    assert!(!h.leader, "{h}");
    // ...and unhealthy once the window has passed without an answer.
    sleep_until(last_ok + WINDOW + Duration::from_millis(1)).await;
    let h = handle.health();
    assert!(!h.healthy, "{h}");
    assert!(!h.leader);
    assert!(h.last_round_trip.unwrap() > WINDOW);
    assert!(h.to_string().starts_with("UNHEALTHY: follower"), "{h}");

    // The store answers again: the hung call times out (after one lease), the next attempt is
    // answered and the elector is healthy again (and leads again, with a new token).
    store.hang("a", false);
    let healthy_at = wait_health(&handle, true, Duration::from_secs(60)).await;
    let stepped_down = last_ok + LEASE - LEASE / 10;
    assert!(
        healthy_at <= stepped_down + LEASE + Duration::from_secs(1),
        "healthy again {:?} after the step-down",
        healthy_at - stepped_down
    );
    wait_leader(&handle).await;
    let h = handle.health();
    assert!(h.healthy && h.leader, "{h}");
    assert_eq!(handle.token().map(|t| t.get()), Some(2));
    handle.abort().await;
}

#[tokio::test(start_paused = true)]
async fn a_wedged_follower_is_unhealthy_while_the_leader_is_fine() {
    let store = Double::new(Wedgeable::default());
    let a = start(&store, "a");
    wait_leader(&a).await;
    let b = start(&store, "b");
    b.watch()
        .wait_for(|s| {
            matches!(
                s,
                Leadership::Follower {
                    leader: Some(_),
                    ..
                }
            )
        })
        .await
        .unwrap();
    assert!(b.health().healthy);
    assert!(!b.health().leader);

    sleep(Duration::from_secs(1)).await;
    store.hang("b", true);
    let wedged = Instant::now();
    let unhealthy_at = wait_health(&b, false, Duration::from_secs(60)).await;
    // b's last answer was at most one retry interval before it wedged.
    assert!(unhealthy_at - wedged <= WINDOW + Duration::from_millis(100));
    assert!(unhealthy_at - wedged >= WINDOW - RETRY);
    let h = a.health();
    assert!(h.healthy && h.leader, "the leader is unaffected: {h}");

    store.hang("b", false);
    wait_health(&b, true, Duration::from_secs(60)).await;
    assert!(!b.health().leader);
    a.abort().await;
    b.abort().await;
}

#[tokio::test(start_paused = true)]
async fn errors_do_not_count_as_round_trips() {
    let store = Double::new(Wedgeable::default());
    store.fail("a", true);
    let handle = start(&store, "a");
    // Calls fail fast (and are retried with back-off): no answer, so healthy only within the
    // window counted from the start.
    let h = handle.health();
    assert!(h.healthy, "{h}");
    assert_eq!(h.last_round_trip, None);
    assert!(h.to_string().contains("no store answer yet"), "{h}");
    sleep(WINDOW - Duration::from_millis(1)).await;
    assert!(handle.health().healthy);
    sleep(Duration::from_millis(2)).await;
    let h = handle.health();
    assert!(!h.healthy, "{h}");
    assert_eq!(h.last_round_trip, None);

    store.fail("a", false);
    wait_health(&handle, true, Duration::from_secs(5)).await;
    wait_leader(&handle).await;
    handle.abort().await;
}

#[tokio::test(start_paused = true)]
async fn a_store_hanging_from_the_start_turns_unhealthy_after_one_window() {
    let store = Double::new(Wedgeable::default());
    store.hang("a", true);
    let started = Instant::now();
    let handle = start(&store, "a");
    let at = wait_health(&handle, false, Duration::from_secs(60)).await;
    assert!(at - started > WINDOW && at - started <= WINDOW + Duration::from_millis(100));
    assert!(matches!(
        handle.leadership(),
        Leadership::Starting | Leadership::Follower { leader: None, .. }
    ));
    handle.abort().await;
}

#[tokio::test(start_paused = true)]
async fn health_window_option() {
    let store = Double::new(Wedgeable::default());
    let err = Elector::builder(store.clone())
        .resource("job")
        .health_window(Duration::ZERO)
        .build()
        .unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::Zero {
                option: "health_window"
            }
        ),
        "{err:?}"
    );

    // Default: 3 × the longer of the renew and retry intervals.
    let handle = Elector::builder(store.clone())
        .resource("job")
        .candidate_id("a")
        .renew_interval(Duration::from_secs(1))
        .retry_interval(Duration::from_secs(4))
        .build()
        .unwrap()
        .start();
    assert_eq!(handle.health().window, Duration::from_secs(12));
    handle.abort().await;

    // Custom.
    store.hang("b", true);
    let handle = Elector::builder(store.clone())
        .resource("job")
        .candidate_id("b")
        .health_window(Duration::from_secs(3))
        .build()
        .unwrap()
        .start();
    assert_eq!(handle.health().window, Duration::from_secs(3));
    sleep(Duration::from_millis(3001)).await;
    assert!(!handle.health().healthy);
    handle.abort().await;
}

/// The store refuses the elector's configuration: the follower stops after that one call
/// (no retry loop), publishes `Failed`, logs it, and health says why.
#[tokio::test(start_paused = true)]
async fn a_follower_stops_when_the_store_refuses_its_configuration() {
    let store = Double::new(Wedgeable::default());
    store.broken.lock().unwrap().insert("a".into());
    let handle = start(&store, "a");
    let mut rx = handle.watch();
    let state = tokio::time::timeout(
        Duration::from_secs(1),
        rx.wait_for(|s| matches!(s, Leadership::Failed(_))),
    )
    .await
    .expect("Failed within the first attempt")
    .unwrap()
    .clone();
    let Leadership::Failed(err) = state else {
        unreachable!()
    };
    assert!(
        matches!(*err, StoreError::UnsupportedBackend { .. }),
        "{err:?}"
    );
    // Ten retry intervals later: still that one call, no retry loop.
    sleep(10 * RETRY).await;
    assert_eq!(store.calls("a"), 1, "a permanent error was retried");
    let h = handle.health();
    assert!(!h.healthy, "{h}");
    let failure = h.failure.clone().expect("health names the failure");
    assert!(failure.contains("not supported by this build"), "{failure}");
    assert!(h.to_string().starts_with("UNHEALTHY: stopped: "), "{h}");
    // The elector's task has ended: shutdown returns at once.
    tokio::time::timeout(Duration::from_millis(1), handle.shutdown())
        .await
        .expect("stopped already");
}

/// A leader whose renew fails that way loses its term at once (reason `Failed`, its work cut
/// off, the lease left to lapse) and stops; it does not hold on to its deadline.
#[tokio::test(start_paused = true)]
async fn a_leader_stops_when_the_store_refuses_its_configuration() {
    let store = Double::new(Wedgeable::default());
    let handle = start(&store, "a");
    wait_leader(&handle).await;
    let term = handle.leadership().term().cloned().unwrap();
    let t0 = Instant::now();
    store.broken.lock().unwrap().insert("a".into());
    let mut rx = handle.watch();
    tokio::time::timeout(LEASE, rx.wait_for(|s| matches!(s, Leadership::Failed(_))))
        .await
        .expect("Failed within the lease")
        .unwrap();
    assert_eq!(
        Instant::now() - t0,
        RENEW,
        "stopped at the first failed renew"
    );
    assert!(term.is_lost());
    assert_eq!(term.loss_reason(), Some(orion_beacon::LossReason::Failed));
    assert!(!handle.is_leader());
    assert!(!handle.health().healthy);
    // Its work was cut off, and nothing released the lease: it lapses on its own.
    let work = handle.run_as_leader(|_| async {});
    tokio::time::timeout(Duration::from_secs(1), work)
        .await
        .expect("run_as_leader ends with the elector")
        .unwrap();
    assert!(store.inner.current("job").await.unwrap().unwrap().live);
}

/// A missing lease table is retried (a migration may still be running): logged at error level,
/// never `Failed`, and the elector leads once the table is there.
#[tokio::test(start_paused = true)]
async fn a_missing_table_is_retried_until_it_appears() {
    let store = Double::new(Wedgeable::default());
    store.tableless.lock().unwrap().insert("a".into());
    let handle = start(&store, "a");
    sleep(10 * RETRY).await;
    assert!(store.calls("a") > 3, "calls: {}", store.calls("a"));
    assert!(matches!(handle.leadership(), Leadership::Follower { .. }));
    store.tableless.lock().unwrap().clear();
    wait_leader(&handle).await;
}

/// An ordinary store error is retried as before (the rule above is only for permanent ones).
#[tokio::test(start_paused = true)]
async fn transient_errors_are_still_retried() {
    let store = Double::new(Wedgeable::default());
    store.fail("a", true);
    let handle = start(&store, "a");
    sleep(10 * RETRY).await;
    assert!(store.calls("a") > 5, "calls: {}", store.calls("a"));
    assert!(!matches!(handle.leadership(), Leadership::Failed(_)));
    store.fail("a", false);
    wait_leader(&handle).await;
}
