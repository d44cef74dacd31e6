//! The elector's metrics (feature `metrics`), captured by a small test recorder installed for
//! this thread (the paused-time runtime runs every task on it).
#![cfg(feature = "metrics")]

use crate::common;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::double::{Double, Intercept};
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use orion_beacon::elector::metrics::{
    IS_LEADER, RENEW_DURATION, SHARDS_LED, SHARD_SHARE, SINCE_RENEW, STORE_ERRORS, TERM_CHANGES,
};
use orion_beacon::{
    store::LeaseOutcome, store::ReleaseEvents, Elector, ElectorHandle, InMemoryLeaseStore,
    Leadership, LeaseStore, StoreError,
};
use tokio::time::sleep;

#[derive(Debug, Clone)]
enum Value {
    Counter(u64),
    Gauge(f64),
    Histogram(Vec<f64>),
}

type Values = Arc<Mutex<BTreeMap<String, Value>>>;

/// Records every metric under `name{label=value,...}` (labels sorted).
#[derive(Default)]
struct TestRecorder {
    values: Values,
    described: Mutex<Vec<String>>,
}

struct Handle {
    key: String,
    values: Values,
}

impl Handle {
    fn update(&self, f: impl FnOnce(Option<Value>) -> Value) {
        let mut values = self.values.lock().unwrap();
        let old = values.remove(&self.key);
        values.insert(self.key.clone(), f(old));
    }
}

impl CounterFn for Handle {
    fn increment(&self, value: u64) {
        self.update(|old| match old {
            Some(Value::Counter(n)) => Value::Counter(n + value),
            _ => Value::Counter(value),
        })
    }
    fn absolute(&self, value: u64) {
        self.update(|_| Value::Counter(value))
    }
}

impl GaugeFn for Handle {
    fn increment(&self, value: f64) {
        self.update(|old| match old {
            Some(Value::Gauge(g)) => Value::Gauge(g + value),
            _ => Value::Gauge(value),
        })
    }
    fn decrement(&self, value: f64) {
        GaugeFn::increment(self, -value)
    }
    fn set(&self, value: f64) {
        self.update(|_| Value::Gauge(value))
    }
}

impl HistogramFn for Handle {
    fn record(&self, value: f64) {
        self.update(|old| match old {
            Some(Value::Histogram(mut v)) => {
                v.push(value);
                Value::Histogram(v)
            }
            _ => Value::Histogram(vec![value]),
        })
    }
}

impl TestRecorder {
    fn handle(&self, key: &Key) -> Arc<Handle> {
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        Arc::new(Handle {
            key: format!("{}{{{}}}", key.name(), labels.join(",")),
            values: self.values.clone(),
        })
    }
    fn get(&self, key: &str) -> Option<Value> {
        self.values.lock().unwrap().get(key).cloned()
    }
    fn counter(&self, key: &str) -> u64 {
        match self.get(key) {
            Some(Value::Counter(n)) => n,
            None => 0,
            other => panic!("{key} is not a counter: {other:?}"),
        }
    }
    fn gauge(&self, key: &str) -> f64 {
        match self.get(key) {
            Some(Value::Gauge(g)) => g,
            other => panic!(
                "{key} is not a recorded gauge: {other:?}\n{:?}",
                self.keys()
            ),
        }
    }
    fn histogram(&self, key: &str) -> Vec<f64> {
        match self.get(key) {
            Some(Value::Histogram(v)) => v,
            None => Vec::new(),
            other => panic!("{key} is not a histogram: {other:?}"),
        }
    }
    fn keys(&self) -> Vec<String> {
        self.values.lock().unwrap().keys().cloned().collect()
    }
}

impl Recorder for TestRecorder {
    fn describe_counter(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
        self.described.lock().unwrap().push(key.as_str().to_owned());
    }
    fn describe_gauge(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
        self.described.lock().unwrap().push(key.as_str().to_owned());
    }
    fn describe_histogram(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
        self.described.lock().unwrap().push(key.as_str().to_owned());
    }
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.handle(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.handle(key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.handle(key))
    }
}

/// The in-memory store with a per-candidate switch: fail at once, refuse the configuration,
/// or hang.
#[derive(Clone, Default)]
struct Switched {
    failing: Arc<Mutex<HashSet<String>>>,
    refusing: Arc<Mutex<HashSet<String>>>,
    hanging: Arc<Mutex<HashSet<String>>>,
}

#[async_trait]
impl Intercept for Switched {
    async fn acquire_or_renew(
        &self,
        inner: &InMemoryLeaseStore,
        r: &str,
        c: &str,
        lease: Duration,
    ) -> Result<LeaseOutcome, StoreError> {
        if self.failing.lock().unwrap().contains(c) {
            return Err(StoreError::Database(
                sea_orm::DbErr::Custom("injected".into()).into(),
            ));
        }
        if self.refusing.lock().unwrap().contains(c) {
            return Err(StoreError::UnsupportedBackend {
                backend: "PostgreSQL",
                feature: "postgres",
            });
        }
        let hangs = self.hanging.lock().unwrap().contains(c);
        if hangs {
            std::future::pending::<()>().await;
        }
        inner.acquire_or_renew(r, c, lease).await
    }
    /// No release notifications: followers poll.
    fn release_events(&self, _inner: &InMemoryLeaseStore) -> Option<ReleaseEvents> {
        None
    }
}

fn start(store: &Double<Switched>, id: &str) -> ElectorHandle {
    Elector::builder(store.clone())
        .resource("job")
        .candidate_id(id)
        .lease_duration(Duration::from_secs(15))
        .renew_interval(Duration::from_secs(5))
        .retry_interval(Duration::from_secs(2))
        .jitter(0.0)
        .build()
        .unwrap()
        .start()
}

fn key(name: &str, candidate: &str, extra: &[(&str, &str)]) -> String {
    let mut labels = vec![format!("candidate={candidate}"), "resource=job".to_owned()];
    labels.extend(extra.iter().map(|(k, v)| format!("{k}={v}")));
    labels.sort();
    format!("{name}{{{}}}", labels.join(","))
}

#[tokio::test(start_paused = true)]
async fn leadership_renews_errors_and_staleness_are_recorded() {
    let recorder = TestRecorder::default();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let store = Double::new(Switched::default());

    let a = start(&store, "a");
    a.watch()
        .wait_for(|s| matches!(s, Leadership::Leader(_)))
        .await
        .unwrap();
    let b = start(&store, "b");
    sleep(Duration::from_secs(21)).await; // renews at 5, 10, 15, 20

    for name in [
        IS_LEADER,
        TERM_CHANGES,
        RENEW_DURATION,
        STORE_ERRORS,
        SINCE_RENEW,
    ] {
        assert!(
            recorder.described.lock().unwrap().iter().any(|d| d == name),
            "{name} is described"
        );
    }
    assert_eq!(recorder.gauge(&key(IS_LEADER, "a", &[])), 1.0);
    assert_eq!(recorder.gauge(&key(IS_LEADER, "b", &[])), 0.0);
    assert_eq!(
        recorder.counter(&key(TERM_CHANGES, "a", &[("change", "elected")])),
        1
    );
    assert_eq!(
        recorder.counter(&key(TERM_CHANGES, "b", &[("change", "elected")])),
        0
    );
    let renews = recorder.histogram(&key(RENEW_DURATION, "a", &[]));
    assert_eq!(renews.len(), 4, "{renews:?}");
    assert!(renews.iter().all(|s| *s == 0.0), "{renews:?}"); // paused time: instant answers
    assert!(recorder
        .histogram(&key(RENEW_DURATION, "b", &[]))
        .is_empty());
    // Both answered within the last second (the gauge is refreshed every second).
    assert!(recorder.gauge(&key(SINCE_RENEW, "a", &[])) <= 1.0);
    assert!(recorder.gauge(&key(SINCE_RENEW, "b", &[])) <= 2.0);

    // a's renews fail: errors by kind, and the time since the last renew grows.
    store.failing.lock().unwrap().insert("a".into());
    sleep(Duration::from_secs(5)).await; // t = 26
    let errors = recorder.counter(&key(STORE_ERRORS, "a", &[("kind", "database")]));
    assert!(errors >= 2, "{errors}");
    let since = recorder.gauge(&key(SINCE_RENEW, "a", &[]));
    assert!((5.0..=7.0).contains(&since), "{since}");
    assert_eq!(recorder.gauge(&key(IS_LEADER, "a", &[])), 1.0); // not yet at its deadline

    // Then they hang: the leader steps down at its deadline (20 + 15 - 1.5 = 33.5); the hung
    // renew counts as a timeout; b takes over once the lease lapses in the store (t = 35).
    store.failing.lock().unwrap().clear();
    store.hanging.lock().unwrap().insert("a".into());
    sleep(Duration::from_secs(10)).await; // t = 36
    assert_eq!(recorder.gauge(&key(IS_LEADER, "a", &[])), 0.0);
    assert_eq!(
        recorder.counter(&key(TERM_CHANGES, "a", &[("change", "deadline")])),
        1
    );
    assert_eq!(
        recorder.counter(&key(STORE_ERRORS, "a", &[("kind", "timeout")])),
        1
    );
    let since = recorder.gauge(&key(SINCE_RENEW, "a", &[]));
    assert!(since >= 15.0, "{since}");
    assert_eq!(recorder.gauge(&key(IS_LEADER, "b", &[])), 1.0);
    assert_eq!(
        recorder.counter(&key(TERM_CHANGES, "b", &[("change", "elected")])),
        1
    );

    b.shutdown().await;
    assert_eq!(recorder.gauge(&key(IS_LEADER, "b", &[])), 0.0);
    assert_eq!(
        recorder.counter(&key(TERM_CHANGES, "b", &[("change", "shutdown")])),
        1
    );
    a.abort().await;
}

/// An elector stopped by its configuration reports an infinite time since its last round trip,
/// so an alert on staleness fires, and counts the loss of its term as `failed`.
#[tokio::test(start_paused = true)]
async fn a_failed_elector_reads_as_stale_forever() {
    let recorder = TestRecorder::default();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let store = Double::new(Switched::default());
    let a = start(&store, "a");
    a.watch().wait_for(|s| s.is_leader()).await.unwrap();
    store.refusing.lock().unwrap().insert("a".into());
    a.watch()
        .wait_for(|s| matches!(s, Leadership::Failed(_)))
        .await
        .unwrap();
    assert_eq!(recorder.gauge(&key(SINCE_RENEW, "a", &[])), f64::INFINITY);
    assert_eq!(recorder.gauge(&key(IS_LEADER, "a", &[])), 0.0);
    assert_eq!(
        recorder.counter(&key(TERM_CHANGES, "a", &[("change", "failed")])),
        1
    );
}

/// Shard set nodes report how many resources they lead and their share.
#[tokio::test(start_paused = true)]
async fn shard_set_nodes_report_resources_led() {
    let recorder = TestRecorder::default();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let store = InMemoryLeaseStore::new();
    let node = |id: &str| {
        orion_beacon::ShardSet::builder(store.clone())
            .name("set")
            .resources((0..6).map(|i| format!("s{i}")))
            .member_id(id)
            .slack(0)
            .build()
            .unwrap()
            .start()
    };
    let a = node("a");
    sleep(Duration::from_secs(3)).await;
    let key = |name: &str, member: &str| format!("{name}{{member={member},shard_set=set}}");
    assert_eq!(recorder.gauge(&key(SHARDS_LED, "a")), 6.0);
    let b = node("b");
    sleep(Duration::from_secs(10)).await;
    for id in ["a", "b"] {
        assert_eq!(recorder.gauge(&key(SHARDS_LED, id)), 3.0, "{id}");
        assert_eq!(recorder.gauge(&key(SHARD_SHARE, id)), 3.0, "{id}");
    }
    for name in [SHARDS_LED, SHARD_SHARE] {
        assert!(
            recorder.described.lock().unwrap().iter().any(|d| d == name),
            "{name} is described"
        );
    }
    a.shutdown().await;
    assert_eq!(recorder.gauge(&key(SHARDS_LED, "a")), 0.0);
    b.shutdown().await;
}

/// Scheduled jobs: each ended attempt is counted by outcome, and each start's lateness and each
/// attempt's duration are recorded, per job.
#[cfg(all(feature = "sqlite", feature = "jobs"))]
#[tokio::test(flavor = "current_thread")]
async fn job_runs_are_counted_with_their_lateness_and_duration() {
    use orion_beacon::jobs::metrics::{DURATION, LAST_FINISHED_AGE, LATENESS, RUNS};
    use orion_beacon::jobs::{Job, Jobs, Schedule};
    use orion_beacon::SeaOrmLeaseStore;
    use orion_beacon_migration::{Migrator, MigratorTrait};

    let recorder = TestRecorder::default();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("jobs.db").display());
    let db = sea_orm::Database::connect(orion_beacon::backend::sqlite::connect_options(url))
        .await
        .unwrap();
    Migrator::up(&db, None).await.unwrap();
    let second = Duration::from_secs(1);
    let ok = Job::new("ok", Schedule::every(second).unwrap(), |_run| async {
        Ok(())
    });
    let bad = Job::new("bad", Schedule::every(second).unwrap(), |_run| async {
        Err(std::io::Error::other("boom").into())
    })
    .max_attempts(1);
    let jobs = Jobs::builder(SeaOrmLeaseStore::new(db))
        .candidate_id("a")
        .lease_duration(second)
        .renew_interval(Duration::from_millis(200))
        .poll_interval(Duration::from_millis(100))
        .job(ok)
        .job(bad)
        .build()
        .unwrap()
        .start();
    let finished = format!("{RUNS}{{job=ok,outcome=finished}}");
    let given_up = format!("{RUNS}{{job=bad,outcome=given_up}}");
    let deadline = std::time::Instant::now() + Duration::from_secs(8);
    while recorder.counter(&finished) < 2 || recorder.counter(&given_up) < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "runs not counted: {:?}",
            recorder.keys()
        );
        sleep(Duration::from_millis(50)).await;
    }
    // The leader's view of "nothing ran", 2.5 s on: "ok" finished within about a second, "bad"
    // never (its age counts from the leader's first look, 2.5 s ago or more).
    sleep(Duration::from_millis(2_500)).await;
    let (ok_age, bad_age) = (
        recorder.gauge(&format!("{LAST_FINISHED_AGE}{{job=ok}}")),
        recorder.gauge(&format!("{LAST_FINISHED_AGE}{{job=bad}}")),
    );
    assert!(
        ok_age < 1.5 && bad_age > 2.3,
        "ok {ok_age} s, bad {bad_age} s"
    );
    jobs.shutdown().await;
    let lateness = recorder.histogram(&format!("{LATENESS}{{job=ok}}"));
    assert!(
        !lateness.is_empty() && lateness.iter().all(|s| (0.0..2.0).contains(s)),
        "{lateness:?}"
    );
    assert!(!recorder
        .histogram(&format!("{DURATION}{{job=bad}}"))
        .is_empty());
    assert_eq!(
        recorder.counter(&format!("{RUNS}{{job=ok,outcome=failed}}")),
        0
    );
    let described = recorder.described.lock().unwrap().clone();
    for name in [RUNS, LATENESS, DURATION, LAST_FINISHED_AGE] {
        assert!(described.iter().any(|d| d == name), "{name} described");
    }
}

/// Two leaders of one process on PostgreSQL renewing together; one of them runs fenced
/// transactions back to back, each holding its lease row 260-350 ms: longer than the batch
/// waits for a row it left out (200 ms), shorter than a renew of its own waits for it. A leader
/// the batch answers busy renews at once on its own, so none of its renews fails
/// (`STORE_ERRORS` stays 0) and its term goes on. (Taking the batch's busy answer as a failed
/// renew counted 3-5 errors in each of 5 runs.)
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "current_thread")]
async fn a_leader_busy_in_its_fenced_transactions_renews_on_its_own() {
    use crate::common::conformance::Harness as _;
    use sea_orm::TransactionTrait;

    let recorder = TestRecorder::default();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let Some(h) = common::sql::SqlHarness::server(common::Server::Postgres).await else {
        return;
    };
    let store = h.configure(orion_beacon::SeaOrmLeaseStore::new(
        h.connect_again(4).await,
    ));
    let resources = [
        common::unique("busy_together"),
        common::unique("busy_together"),
    ];
    let handles: Vec<ElectorHandle> = resources
        .iter()
        .map(|r| {
            Elector::builder(store.clone())
                .resource(r)
                .candidate_id("node")
                .lease_duration(Duration::from_secs(3))
                .renew_interval(Duration::from_millis(300))
                .retry_interval(Duration::from_millis(200))
                .renew_together(true)
                .build()
                .unwrap()
                .start()
        })
        .collect();
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while !handles.iter().all(|h| h.is_leader()) {
        assert!(std::time::Instant::now() < until, "both lead");
        sleep(Duration::from_millis(20)).await;
    }
    let token = handles[0].token();
    let term = handles[0].watch().borrow().term().cloned().unwrap();
    let before = store.current(&resources[0]).await.unwrap().unwrap();
    let started = std::time::Instant::now();
    let mut committed = 0;
    // Lengths that vary, so the renews do not fall into step with the transactions.
    let lengths = [350, 280, 330, 260, 340, 300, 320];
    while started.elapsed() < Duration::from_secs(6) {
        let txn = h.db().begin().await.unwrap();
        term.fence(&txn)
            .await
            .expect("the term goes on through its fenced transactions");
        sleep(Duration::from_millis(lengths[committed % lengths.len()])).await;
        txn.commit().await.unwrap();
        committed += 1;
    }
    assert!(committed >= 10, "{committed} fenced transactions");
    assert_eq!(handles[0].token(), token, "the busy leader's term went on");
    let after = store.current(&resources[0]).await.unwrap().unwrap();
    assert!(
        after.renewed_at > before.renewed_at,
        "renewed through its transactions"
    );
    let label = format!("resource={}}}", resources[0]);
    let errors: Vec<(String, u64)> = recorder
        .keys()
        .into_iter()
        .filter(|k| k.starts_with(STORE_ERRORS) && k.contains(&label))
        .map(|k| {
            let n = recorder.counter(&k);
            (k, n)
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    assert!(errors.is_empty(), "renews that failed: {errors:?}");
    for h in handles {
        h.shutdown().await;
    }
    h.teardown().await;
}
