//! The elector's rules, on the in-memory store under paused tokio time (deterministic).

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::double::{Double, Intercept};
use orion_beacon::{
    store::LeaseOutcome, store::ReleaseEvents, ConfigError, Elector, InMemoryLeaseStore,
    Leadership, Lease, LeaseRecord, LeaseStore, LossReason, StoreError,
};
use tokio::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Normal,
    Fail,
    Hang,
    /// The statement runs at once, its answer arrives this much later.
    SlowReply(Duration),
    /// Grants say only this much of the lease is left (then the mode goes back to normal).
    ShortGrant(Duration),
}

/// The in-memory store, with a switch to make it fail or hang, and a log of what happened.
#[derive(Clone)]
struct Scripted {
    mode: Arc<Mutex<Mode>>,
    log: Arc<Mutex<Vec<(Instant, String)>>>,
}

impl Scripted {
    fn new() -> Double<Self> {
        Double::new(Self {
            mode: Arc::new(Mutex::new(Mode::Normal)),
            log: Arc::default(),
        })
    }
    fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }
    fn note(&self, what: impl Into<String>) {
        self.log.lock().unwrap().push((Instant::now(), what.into()));
    }
    fn events(&self) -> Vec<(Instant, String)> {
        self.log.lock().unwrap().clone()
    }
    fn count(&self, prefix: &str) -> usize {
        self.events()
            .iter()
            .filter(|(_, e)| e.starts_with(prefix))
            .count()
    }
    async fn gate(&self) -> Result<(), StoreError> {
        let mode = *self.mode.lock().unwrap();
        match mode {
            Mode::Normal | Mode::SlowReply(_) | Mode::ShortGrant(_) => Ok(()),
            Mode::Fail => Err(StoreError::Database(
                sea_orm::DbErr::Custom("injected".into()).into(),
            )),
            Mode::Hang => std::future::pending().await,
        }
    }
}

#[async_trait]
impl Intercept for Scripted {
    async fn acquire_or_renew(
        &self,
        inner: &InMemoryLeaseStore,
        r: &str,
        c: &str,
        lease: Duration,
    ) -> Result<LeaseOutcome, StoreError> {
        self.note(format!("acquire {c}"));
        let mode = *self.mode.lock().unwrap();
        self.gate().await?;
        let mut out = inner.acquire_or_renew(r, c, lease).await?;
        if let Mode::SlowReply(delay) = mode {
            tokio::time::sleep(delay).await;
        }
        if let Mode::ShortGrant(left) = mode {
            if let LeaseOutcome::Acquired(l) | LeaseOutcome::Renewed(l) = &mut out {
                l.remaining = left;
            }
            self.set(Mode::Normal);
        }
        self.note(format!(
            "outcome {c} {}",
            match &out {
                LeaseOutcome::Acquired(l) => format!("acquired {}", l.token),
                LeaseOutcome::Renewed(l) => format!("renewed {}", l.token),
                LeaseOutcome::Denied(_) => "denied".to_owned(),
            }
        ));
        Ok(out)
    }
    async fn release(
        &self,
        inner: &InMemoryLeaseStore,
        r: &str,
        c: &str,
    ) -> Result<bool, StoreError> {
        self.gate().await?;
        let released = inner.release(r, c).await?;
        self.note(format!("release {c} {released}"));
        Ok(released)
    }
    async fn release_lease(
        &self,
        inner: &InMemoryLeaseStore,
        lease: &Lease,
    ) -> Result<bool, StoreError> {
        self.gate().await?;
        let released = inner.release_lease(lease).await?;
        self.note(format!("release {} {released}", lease.holder));
        Ok(released)
    }
}

const LEASE: Duration = Duration::from_secs(15);
const RENEW: Duration = Duration::from_secs(5);

fn elector(store: &Double<Scripted>, id: &str) -> Elector {
    Elector::builder(store.clone())
        .resource("job")
        .candidate_id(id)
        .lease_duration(LEASE)
        .renew_interval(RENEW)
        .retry_interval(Duration::from_secs(2))
        .jitter(0.0)
        .build()
        .unwrap()
}

async fn wait_leader(rx: &mut orion_beacon::Watch<Leadership>) -> orion_beacon::LeaderTerm {
    let state = rx
        .wait_for(|s| matches!(s, Leadership::Leader(_)))
        .await
        .unwrap();
    state.term().unwrap().clone()
}

async fn wait_not_leader(rx: &mut orion_beacon::Watch<Leadership>) {
    rx.wait_for(|s| !matches!(s, Leadership::Leader(_)))
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn leader_renews_at_its_interval() {
    let store = Scripted::new();
    let handle = elector(&store, "a").start();
    let term = wait_leader(&mut handle.watch()).await;
    assert_eq!(term.token().get(), 1);
    tokio::time::sleep(Duration::from_secs(60) + Duration::from_millis(1)).await;
    // One acquire at t=0, then a renew every 5 s: t=5..60.
    assert_eq!(store.count("acquire a"), 13, "{:?}", store.events());
    assert_eq!(store.count("outcome a renewed 1"), 12);
    assert!(handle.is_leader());
    assert_eq!(handle.token().map(|t| t.get()), Some(1));
    handle.shutdown().await;
}

/// If no renew succeeds, the leader steps down at `t_sent + lease - margin`, before the store's
/// lease can expire, whether the store fails fast or hangs.
#[tokio::test(start_paused = true)]
async fn steps_down_before_the_lease_can_expire() {
    for mode in [Mode::Fail, Mode::Hang] {
        let store = Scripted::new();
        let handle = elector(&store, "a").start();
        let mut rx = handle.watch();
        let term = wait_leader(&mut rx).await;
        let start = Instant::now();
        tokio::time::sleep(Duration::from_secs(7)).await; // one renew went through at t=5
        store.set(mode);
        let last_ok = start + RENEW;
        term.lost().await;
        let lost_at = Instant::now();
        let margin = LEASE / 10;
        assert_eq!(
            lost_at,
            last_ok + LEASE - margin,
            "{mode:?}: step-down instant"
        );
        assert_eq!(term.loss_reason(), Some(LossReason::Deadline));
        assert!(!handle.is_leader());
        assert!(!term.is_current());
        assert!(matches!(
            handle.leadership(),
            Leadership::Follower { leader: None, .. }
        ));
        // The store's lease is still live at that moment: the step-down came first.
        let rec = store.inner.current("job").await.unwrap().unwrap();
        assert!(rec.live && rec.remaining >= margin, "{mode:?}: {rec:?}");
        store.set(Mode::Normal);
        handle.abort().await;
    }
}

/// The local deadline counts from when the request was *sent*, not from when the answer came:
/// with an answer 4 s late, a leader whose renews then stop steps down while the store's lease
/// is still live, after an acquire and after a renew alike.
#[tokio::test(start_paused = true)]
async fn deadline_counts_from_the_send_not_the_answer() {
    let slow = Duration::from_secs(4);
    let margin = LEASE / 10;
    for renew_is_slow in [false, true] {
        let store = Scripted::new();
        let t0 = Instant::now();
        if !renew_is_slow {
            store.set(Mode::SlowReply(slow));
        }
        let handle = elector(&store, "a").start();
        let term = wait_leader(&mut handle.watch()).await;
        let sent = if renew_is_slow {
            // The first renew (sent at t0 + RENEW) answers late; nothing after it answers.
            store.set(Mode::SlowReply(slow));
            tokio::time::sleep(RENEW + Duration::from_millis(1)).await;
            store.set(Mode::Hang);
            t0 + RENEW
        } else {
            store.set(Mode::Hang);
            t0
        };
        term.lost().await;
        assert_eq!(term.loss_reason(), Some(LossReason::Deadline));
        assert_eq!(
            Instant::now(),
            sent + LEASE - margin,
            "renew slow: {renew_is_slow}"
        );
        let rec = store.inner.current("job").await.unwrap().unwrap();
        assert!(
            rec.live && rec.remaining >= margin,
            "the store's lease outlives the local term (renew slow: {renew_is_slow}): {rec:?}"
        );
        handle.abort().await;
    }
}

/// A renew answered with a *new* term (the old one lapsed in the store): the old term ends
/// `Superseded` and its work is dropped, the new term begins and the work runs again.
#[tokio::test(start_paused = true)]
async fn a_renew_answered_with_a_new_term_supersedes_the_old_one() {
    let store = Scripted::new();
    let handle = elector(&store, "a").start();
    let runs = Arc::new(Mutex::new(Vec::new()));
    let runs2 = runs.clone();
    let _work = handle.run_as_leader(move |term| {
        let runs = runs2.clone();
        async move {
            runs.lock().unwrap().push(term.token().get());
            std::future::pending::<()>().await;
        }
    });
    let mut rx = handle.watch();
    let first = wait_leader(&mut rx).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The lease ends in the store behind a's back; a's next renew makes a new term there.
    assert!(store.inner.release("job", "a").await.unwrap());
    first.lost().await;
    assert_eq!(first.loss_reason(), Some(LossReason::Superseded));
    let second = wait_leader(&mut rx).await;
    assert_eq!(second.token().get(), 2);
    assert!(second.is_current());
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        *runs.lock().unwrap(),
        vec![1, 2],
        "the work ran once per term"
    );
    handle.shutdown().await;
}

/// A grant with less lease left than the step-down margin is not trusted: no leader state is
/// published for it, the candidate releases that write and asks again at once (and is then
/// granted a new term in full: a renew of the short grant would begin no term).
#[tokio::test(start_paused = true)]
async fn a_grant_with_too_little_lease_left_is_not_a_term() {
    let store = Scripted::new();
    store.set(Mode::ShortGrant(LEASE / 20)); // under the margin (LEASE / 10)
    let handle = elector(&store, "a").start();
    let mut rx = handle.watch();
    let mut seen = Vec::new();
    let term = loop {
        rx.changed().await.unwrap();
        let state = rx.borrow_and_update().clone();
        seen.push(format!("{state:?}"));
        if let Leadership::Leader(term) = state {
            break term;
        }
    };
    assert_eq!(store.count("acquire a"), 2, "{:?}", store.events());
    assert_eq!(store.count("release a true"), 1, "{:?}", store.events());
    assert_eq!(
        term.token().get(),
        2,
        "the short grant is released, the second call begins a new term"
    );
    assert_eq!(
        seen.iter().filter(|s| s.starts_with("Leader")).count(),
        1,
        "{seen:?}"
    );
    let events = store.events();
    assert_eq!(
        events[0].0,
        events[events.len() - 1].0,
        "asked again at once"
    );
    handle.shutdown().await;
}

/// A denied renew ends the term at once; the candidate keeps contending and wins again later
/// with a higher token; the work runs once per term.
#[tokio::test(start_paused = true)]
async fn denied_renew_steps_down_and_candidate_is_re_elected() {
    let store = Scripted::new();
    let handle = elector(&store, "a").start();
    let runs = Arc::new(Mutex::new(Vec::new()));
    let runs2 = runs.clone();
    let _work = handle.run_as_leader(move |term| {
        let runs = runs2.clone();
        async move {
            runs.lock().unwrap().push(term.token().get());
            term.lost().await;
        }
    });
    let mut rx = handle.watch();
    let first = wait_leader(&mut rx).await;
    // Someone else takes the lease behind a's back (as after a long pause).
    tokio::time::sleep(Duration::from_secs(1)).await;
    store.inner.release("job", "a").await.unwrap();
    assert!(store
        .inner
        .acquire_or_renew_with(
            "job",
            "intruder",
            Duration::from_secs(6),
            Some("its address")
        )
        .await
        .unwrap()
        .is_held());
    first.lost().await;
    assert_eq!(first.loss_reason(), Some(LossReason::Denied));
    // The step-down publishes the new leader with its payload at once.
    assert!(
        matches!(
            handle.leadership(),
            Leadership::Follower { leader: Some(ref l), payload: Some(ref p) }
                if l == "intruder" && p == "its address"
        ),
        "{:?}",
        handle.leadership()
    );
    // The intruder never renews; a wins a new term right after its lease ends.
    let second = wait_leader(&mut rx).await;
    assert_eq!(second.token().get(), first.token().get() + 2);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        *runs.lock().unwrap(),
        vec![1, 3],
        "the work ran once per term"
    );
    handle.shutdown().await;
}

/// A follower retries right after a denial's lease ends instead of waiting a full retry
/// interval: a crashed leader is replaced one lease after its last renew.
#[tokio::test(start_paused = true)]
async fn follower_retries_right_after_expiry() {
    let store = Scripted::new();
    let t0 = Instant::now();
    // A leader that will never renew (crashed right after acquiring).
    assert!(store
        .inner
        .acquire_or_renew("job", "dead", LEASE)
        .await
        .unwrap()
        .is_held());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let b = Elector::builder(store.clone())
        .resource("job")
        .candidate_id("b")
        .retry_interval(Duration::from_secs(10))
        .jitter(0.0)
        .build()
        .unwrap()
        .start();
    let term = wait_leader(&mut b.watch()).await;
    let took = Instant::now() - t0;
    // Denied at t=1 (14 s left), retried at t=11 (4 s left), then right after expiry.
    assert!(
        took >= LEASE && took <= LEASE + Duration::from_millis(50),
        "elected after {took:?}"
    );
    assert_eq!(term.token().get(), 2);
    assert_eq!(store.count("acquire b"), 3, "{:?}", store.events());
    b.shutdown().await;
}

/// Shutdown ends the term's work first (waiting for it), then releases, then stops; a
/// follower takes over at its next attempt.
#[tokio::test(start_paused = true)]
async fn shutdown_ends_work_then_releases() {
    let store = Scripted::new();
    let a = elector(&store, "a").start();
    let s2 = store.clone();
    let _work = a.run_as_leader(move |term| {
        let store = s2.clone();
        async move {
            term.lost().await;
            tokio::time::sleep(Duration::from_secs(1)).await; // cleanup within the grace period
            store.note("work finished");
        }
    });
    let term = wait_leader(&mut a.watch()).await;
    let b = elector(&store, "b").start();
    let mut brx = b.watch();
    brx.wait_for(|s| {
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
    tokio::time::sleep(Duration::from_secs(3)).await;
    let started = Instant::now();
    a.shutdown().await;
    assert_eq!(term.loss_reason(), Some(LossReason::Shutdown));
    let events: Vec<String> = store.events().into_iter().map(|(_, e)| e).collect();
    let work = events
        .iter()
        .position(|e| e == "work finished")
        .expect("work finished");
    let release = events
        .iter()
        .position(|e| e == "release a true")
        .expect("released");
    assert!(
        work < release,
        "work must end before the release: {events:?}"
    );
    let b_term = wait_leader(&mut brx).await;
    assert_eq!(b_term.token().get(), 2);
    let handover = Instant::now() - started;
    assert!(
        handover <= Duration::from_secs(1) + Duration::from_secs(2) + Duration::from_millis(10),
        "{handover:?}"
    );
    b.shutdown().await;
}

/// Records when it is dropped (work that ignores `lost`).
struct Dropped(Arc<Mutex<Option<Instant>>>);
impl Drop for Dropped {
    fn drop(&mut self) {
        *self.0.lock().unwrap() = Some(Instant::now());
    }
}

/// Leader work that ignores `lost` and never returns; the instant it was dropped is recorded.
fn stubborn_work(
    handle: &orion_beacon::ElectorHandle,
) -> (tokio::task::JoinHandle<()>, Arc<Mutex<Option<Instant>>>) {
    let dropped_at = Arc::new(Mutex::new(None));
    let d2 = dropped_at.clone();
    let work = handle.run_as_leader(move |_term| {
        let guard = Dropped(d2.clone());
        async move {
            let _guard = guard;
            std::future::pending::<()>().await;
        }
    });
    (work, dropped_at)
}

/// When a term is lost at its deadline, the lease no longer covers the work: it is dropped at
/// that instant, not after the grace period.
#[tokio::test(start_paused = true)]
async fn lost_term_work_is_dropped_at_once() {
    let store = Scripted::new();
    let a = Elector::builder(store.clone())
        .resource("job")
        .candidate_id("a")
        .grace_period(Duration::from_secs(2))
        .build()
        .unwrap()
        .start();
    let (work, dropped_at) = stubborn_work(&a);
    let term = wait_leader(&mut a.watch()).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    store.set(Mode::Fail); // the term will end at its deadline
    term.lost().await;
    let lost_at = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let dropped = dropped_at.lock().unwrap().expect("work dropped");
    assert_eq!(dropped, lost_at, "dropped when the term was lost");
    // The store's lease was still live then: the work never outlived it.
    store.set(Mode::Normal);
    a.shutdown().await;
    tokio::time::timeout(Duration::from_secs(1), work)
        .await
        .expect("work task ends with the elector")
        .unwrap();
}

/// A lease shorter than the grace period: on shutdown the elector keeps renewing while the work
/// winds down (3 s, longer than the 2 s lease), releases only after the work returned, and no
/// other candidate leads before that.
#[tokio::test(start_paused = true)]
async fn shutdown_keeps_the_lease_while_work_winds_down() {
    let store = Scripted::new();
    let short = |id: &str| {
        Elector::builder(store.clone())
            .resource("job")
            .candidate_id(id)
            .lease_duration(Duration::from_secs(2))
            .renew_interval(Duration::from_millis(500))
            .retry_interval(Duration::from_millis(200))
            .grace_period(Duration::from_secs(5))
            .jitter(0.0)
            .build()
            .unwrap()
            .start()
    };
    let a = short("a");
    let s2 = store.clone();
    let _work = a.run_as_leader(move |term| {
        let store = s2.clone();
        async move {
            term.lost().await;
            tokio::time::sleep(Duration::from_secs(3)).await; // cleanup, within the grace
            store.note("work finished");
        }
    });
    wait_leader(&mut a.watch()).await;
    let b = short("b");
    let mut brx = b.watch();
    brx.wait_for(|s| {
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
    let renews_before = store.count("outcome a renewed");
    let shutdown = tokio::spawn(a.shutdown());
    let b_term = wait_leader(&mut brx).await;
    let events: Vec<String> = store.events().into_iter().map(|(_, e)| e).collect();
    let finished = events
        .iter()
        .position(|e| e == "work finished")
        .expect("the work finished before anyone else led");
    let released = events
        .iter()
        .position(|e| e == "release a true")
        .expect("a released its lease");
    let b_acquired = events
        .iter()
        .position(|e| e == "outcome b acquired 2")
        .expect("b acquired");
    assert!(finished < released && released < b_acquired, "{events:?}");
    assert!(
        store.count("outcome a renewed") >= renews_before + 5,
        "a renewed while its work wound down: {events:?}"
    );
    assert_eq!(b_term.token().get(), 2);
    shutdown.await.unwrap();
    b.shutdown().await;
}

/// Work that ignores `lost` is dropped when the grace period ends; the lease is kept until
/// then and released after.
#[tokio::test(start_paused = true)]
async fn shutdown_drops_stubborn_work_after_grace_then_releases() {
    let store = Scripted::new();
    let a = Elector::builder(store.clone())
        .resource("job")
        .candidate_id("a")
        .lease_duration(Duration::from_secs(2))
        .renew_interval(Duration::from_millis(500))
        .grace_period(Duration::from_secs(4))
        .build()
        .unwrap()
        .start();
    let (_work, dropped_at) = stubborn_work(&a);
    wait_leader(&mut a.watch()).await;
    let t0 = Instant::now();
    a.shutdown().await;
    let dropped = dropped_at.lock().unwrap().expect("work dropped");
    assert_eq!(dropped - t0, Duration::from_secs(4));
    let events = store.events();
    let (released_at, _) = events
        .iter()
        .find(|(_, e)| e == "release a true")
        .expect("released after the work was dropped, the lease still held");
    assert!(*released_at >= dropped, "{events:?}");
}

/// If the lease is lost while shutdown waits for the work, the work is dropped then, not at
/// the end of the grace period.
#[tokio::test(start_paused = true)]
async fn shutdown_drops_work_when_the_lease_is_lost_meanwhile() {
    let store = Scripted::new();
    let a = Elector::builder(store.clone())
        .resource("job")
        .candidate_id("a")
        .lease_duration(Duration::from_secs(2))
        .renew_interval(Duration::from_millis(500))
        .grace_period(Duration::from_secs(10))
        .build()
        .unwrap()
        .start();
    let (_work, dropped_at) = stubborn_work(&a);
    let term = wait_leader(&mut a.watch()).await;
    store.set(Mode::Fail);
    let deadline = term.deadline();
    a.shutdown().await;
    let dropped = dropped_at.lock().unwrap().expect("work dropped");
    assert!(
        dropped <= deadline,
        "dropped at {:?} after the local deadline",
        dropped - deadline
    );
    assert_eq!(
        store.count("release"),
        0,
        "nothing to release: the renews failed"
    );
}

/// `run_as_leader` never starts work on a term whose deadline has already passed (a process
/// that was paused between the grant and the start of the work).
#[tokio::test(flavor = "current_thread")]
async fn work_never_starts_on_a_term_past_its_deadline() {
    let store = Scripted::new();
    let a = Elector::builder(store.clone())
        .resource("job")
        .candidate_id("a")
        .lease_duration(Duration::from_millis(400))
        .renew_interval(Duration::from_millis(100))
        .build()
        .unwrap()
        .start();
    let term = wait_leader(&mut a.watch()).await;
    store.set(Mode::Hang); // no renew will come back
    let started = Arc::new(Mutex::new(Vec::new()));
    let s2 = started.clone();
    let work = a.run_as_leader(move |term| {
        s2.lock().unwrap().push(term.token().get());
        async {}
    });
    // The whole runtime stalls past the deadline (a GC pause, SIGSTOP): the work task is queued
    // before the elector's timer can end the term.
    std::thread::sleep(Duration::from_millis(500));
    assert!(!term.is_current());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        started.lock().unwrap().is_empty(),
        "work started on a term past its deadline"
    );
    a.abort().await;
    work.await.unwrap();
}

/// A denial that names the candidate itself (a stale report) is never published as "the
/// leader is me".
#[tokio::test(start_paused = true)]
async fn a_denial_naming_ourselves_is_not_a_leader() {
    #[derive(Clone)]
    struct SelfDenying;
    #[async_trait]
    impl LeaseStore for SelfDenying {
        async fn acquire_or_renew(
            &self,
            r: &str,
            c: &str,
            _lease: Duration,
        ) -> Result<LeaseOutcome, StoreError> {
            let mut denial = orion_beacon::store::Denial::new(r);
            denial.holder = Some(c.to_owned());
            denial.token = Some(orion_beacon::FencingToken::new(4));
            denial.remaining = Duration::from_secs(1);
            Ok(LeaseOutcome::Denied(denial))
        }
        async fn release(&self, _r: &str, _c: &str) -> Result<bool, StoreError> {
            Ok(false)
        }
        async fn release_lease(&self, _lease: &Lease) -> Result<bool, StoreError> {
            Ok(false)
        }
        async fn current(&self, _r: &str) -> Result<Option<LeaseRecord>, StoreError> {
            Ok(None)
        }
    }
    let a = Elector::builder(SelfDenying)
        .resource("job")
        .candidate_id("a")
        .build()
        .unwrap()
        .start();
    let mut rx = a.watch();
    rx.wait_for(|s| matches!(s, Leadership::Follower { .. }))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        a.leadership(),
        Leadership::Follower {
            leader: None,
            payload: None
        }
    );
    a.shutdown().await;
}

/// Store errors never end the loop: it backs off and keeps contending.
#[tokio::test(start_paused = true)]
async fn store_errors_are_retried_with_backoff() {
    let store = Scripted::new();
    store.set(Mode::Fail);
    let a = elector(&store, "a").start();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(matches!(
        a.leadership(),
        Leadership::Follower { leader: None, .. }
    ));
    // At t = 0, then after 50, 100, 200, 400, 800 ms and 2 s (the cap) each: t = 0, 0.05,
    // 0.15, 0.35, 0.75, 1.55, 3.55, 5.55, 7.55, 9.55 s: exactly 10 attempts, not a hot loop.
    let attempts = store.count("acquire a");
    assert_eq!(attempts, 10, "{:?}", store.events());
    store.set(Mode::Normal);
    let term = wait_leader(&mut a.watch()).await;
    assert_eq!(term.token().get(), 1);
    a.shutdown().await;
}

/// Dropping the handle stops the elector and releases; no task is left behind.
#[tokio::test(start_paused = true)]
async fn dropping_the_handle_stops_and_releases() {
    let store = Scripted::new();
    let a = elector(&store, "a").start();
    let mut rx = a.watch();
    let work = a.run_as_leader(|term| async move { term.lost().await });
    let term = wait_leader(&mut rx).await;
    drop(a);
    term.lost().await;
    wait_not_leader(&mut rx).await;
    assert!(
        rx.changed().await.is_err(),
        "the loop ended and dropped its sender"
    );
    work.await.unwrap();
    assert_eq!(store.count("release a true"), 1);
}

#[tokio::test]
async fn bad_options_are_errors() {
    let e = Elector::builder(InMemoryLeaseStore::new())
        .build()
        .unwrap_err();
    assert!(matches!(e, ConfigError::MissingResource));
    let e = Elector::builder_in_memory()
        .resource("r")
        .lease_duration(Duration::from_secs(1))
        .renew_interval(Duration::from_secs(1))
        .build()
        .unwrap_err();
    assert!(matches!(e, ConfigError::RenewTooSlow { .. }), "{e}");
    assert!(e.to_string().contains("renew_interval"));
    let e = Elector::builder_in_memory()
        .resource("r")
        .candidate_id("")
        .build()
        .unwrap_err();
    assert!(matches!(
        e,
        ConfigError::Invalid(StoreError::InvalidCandidate { .. })
    ));
}

/// Two electors in one process on the default in-memory store: one leader.
#[tokio::test(start_paused = true)]
async fn in_memory_default_store_is_shared_in_process() {
    let mk = |id: &str| {
        Elector::builder_in_memory()
            .resource("shared-in-process")
            .candidate_id(id)
            .build()
            .unwrap()
            .start()
    };
    let a = mk("a");
    let b = mk("b");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(u8::from(a.is_leader()) + u8::from(b.is_leader()), 1);
    a.shutdown().await;
    b.shutdown().await;
}

/// A release wakes the followers at once (the store pushes release notifications), instead of
/// at their next poll.
#[tokio::test(start_paused = true)]
async fn release_wakes_followers_at_once() {
    let store = Scripted::new();
    let a = elector(&store, "a").start();
    wait_leader(&mut a.watch()).await;
    let b = Elector::builder(store.clone())
        .resource("job")
        .candidate_id("b")
        .retry_interval(Duration::from_secs(10))
        .jitter(0.0)
        .build()
        .unwrap()
        .start();
    let mut brx = b.watch();
    brx.wait_for(|s| {
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
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t0 = Instant::now();
    a.shutdown().await;
    let term = wait_leader(&mut brx).await;
    assert_eq!(term.token().get(), 2);
    assert!(
        Instant::now() - t0 < Duration::from_millis(10),
        "took {:?}",
        Instant::now() - t0
    );
    b.shutdown().await;
}

/// A store whose first release reaches the database only `delay` after it was sent (the
/// statement waited in the network or for a row lock; its sender may be long gone); later
/// ones at once.
#[derive(Clone)]
struct LateRelease {
    delay: Duration,
    released: Arc<Mutex<u32>>,
}

impl LateRelease {
    async fn wait(&self) {
        let first = {
            let mut released = self.released.lock().unwrap();
            *released += 1;
            *released == 1
        };
        if first {
            tokio::time::sleep(self.delay).await;
        }
    }
}

#[async_trait]
impl Intercept for LateRelease {
    async fn release(
        &self,
        inner: &InMemoryLeaseStore,
        r: &str,
        c: &str,
    ) -> Result<bool, StoreError> {
        self.wait().await;
        inner.release(r, c).await
    }
    async fn release_lease(
        &self,
        inner: &InMemoryLeaseStore,
        lease: &Lease,
    ) -> Result<bool, StoreError> {
        self.wait().await;
        inner.release_lease(lease).await
    }
    /// No release notifications: followers poll.
    fn release_events(&self, _inner: &InMemoryLeaseStore) -> Option<ReleaseEvents> {
        None
    }
}

/// A stopped elector's release that arrives after a new elector with the same candidate id
/// (a pod name, a fixed node id) took the lease up again must not end the new elector's lease:
/// another candidate would take over while the new one believes it leads. The release names
/// the exact write it ends, so it does nothing once that write was renewed. (The new elector
/// finds its predecessor's lease live, releases that write itself and leads with a new token.)
#[tokio::test(start_paused = true)]
async fn a_late_release_never_ends_the_lease_of_a_new_elector_with_the_same_id() {
    let store = Double::new(LateRelease {
        delay: Duration::from_secs(3),
        released: Arc::default(),
    });
    let start = |id: &str| {
        Elector::builder(store.clone())
            .resource("job")
            .candidate_id(id)
            .lease_duration(LEASE)
            .renew_interval(RENEW)
            .jitter(0.0)
            .build()
            .unwrap()
            .start()
    };
    let old = start("node-a");
    let first = wait_leader(&mut old.watch()).await;
    let stopping = tokio::spawn(async move { old.shutdown().await });
    tokio::time::sleep(Duration::from_secs(1)).await;

    let new = start("node-a");
    let term = wait_leader(&mut new.watch()).await;
    assert!(
        term.token() > first.token(),
        "the same id leads with a new token"
    );
    stopping.await.unwrap();

    // The old release has reached the store by now.
    let row = store.inner.current("job").await.unwrap().unwrap();
    assert!(
        row.live && row.holder == "node-a",
        "a late release ended the new elector's lease: {row:?}"
    );
    assert!(new.is_leader());
    let rival = store
        .inner
        .acquire_or_renew("job", "b", LEASE)
        .await
        .unwrap();
    assert!(
        matches!(rival, LeaseOutcome::Denied(_)),
        "a rival took over while the new elector leads: {rival:?}"
    );
    new.shutdown().await;
    // The new elector's own release still works (it names its own last write).
    assert!(!store.inner.current("job").await.unwrap().unwrap().live);
}

/// A follower whose store never answers gives up on each attempt after one lease and backs
/// off longer each time: attempts at 0, 15.05, 30.15 and 45.35 s (50, 100, 200 ms of back-off
/// after each 15 s wait), not a fixed retry.
#[tokio::test(start_paused = true)]
async fn unanswered_attempts_back_off_more_each_time() {
    let store = Scripted::new();
    store.set(Mode::Hang);
    let t0 = Instant::now();
    let a = elector(&store, "a").start();
    tokio::time::sleep(Duration::from_secs(50)).await;
    let at: Vec<u128> = store
        .events()
        .iter()
        .filter(|(_, e)| e == "acquire a")
        .map(|(t, _)| (*t - t0).as_millis())
        .collect();
    assert_eq!(at, vec![0, 15_050, 30_150, 45_350]);
    a.abort().await;
}

/// A leader whose renews fail backs off (50 ms, doubling, capped at the renew interval) until
/// its deadline, then steps down: exactly these attempts, not a hot loop.
#[tokio::test(start_paused = true)]
async fn failing_renews_back_off_until_the_deadline() {
    let store = Scripted::new();
    let t0 = Instant::now();
    let a = elector(&store, "a").start();
    let term = wait_leader(&mut a.watch()).await;
    tokio::time::sleep(Duration::from_secs(6)).await; // renewed at 5 s
    store.set(Mode::Fail);
    term.lost().await;
    assert_eq!(term.loss_reason(), Some(LossReason::Deadline));
    // Deadline: the renew sent at 5 s + 15 s - 1.5 s margin = 18.5 s.
    assert_eq!((Instant::now() - t0).as_millis(), 18_500);
    let at: Vec<u128> = store
        .events()
        .iter()
        // Renews of the term (after the loss at 18.5 s the follower asks again at once).
        .filter(|(t, e)| {
            e == "acquire a"
                && *t - t0 > Duration::from_secs(6)
                && *t - t0 < Duration::from_millis(18_500)
        })
        .map(|(t, _)| (*t - t0).as_millis())
        .collect();
    assert_eq!(
        at,
        vec![10_000, 10_050, 10_150, 10_350, 10_750, 11_550, 13_150, 16_350]
    );
    a.abort().await;
}

/// A store that answers the second renew of a term with `Renewed` under a new token.
#[derive(Clone)]
struct RenewsIntoNewToken {
    calls: Arc<Mutex<u32>>,
}

#[async_trait]
impl Intercept for RenewsIntoNewToken {
    async fn acquire_or_renew(
        &self,
        inner: &InMemoryLeaseStore,
        r: &str,
        c: &str,
        lease: Duration,
    ) -> Result<LeaseOutcome, StoreError> {
        let out = inner.acquire_or_renew(r, c, lease).await?;
        let call = {
            let mut calls = self.calls.lock().unwrap();
            *calls += 1;
            *calls
        };
        Ok(match out {
            LeaseOutcome::Renewed(mut l) if call == 2 => {
                l.token = orion_beacon::FencingToken::new(l.token.get() + 1);
                LeaseOutcome::Renewed(l)
            }
            other => other,
        })
    }
    /// No release notifications: followers poll.
    fn release_events(&self, _inner: &InMemoryLeaseStore) -> Option<ReleaseEvents> {
        None
    }
}

/// A "renew" that comes back with another token is no renew, whatever the store calls it: the
/// old term ends `Superseded`, that write is released, and the next term has the next token.
#[tokio::test(start_paused = true)]
async fn a_renew_with_another_token_is_a_new_term() {
    let store = Double::new(RenewsIntoNewToken {
        calls: Arc::default(),
    });
    let a = Elector::builder(store)
        .resource("job")
        .candidate_id("a")
        .lease_duration(LEASE)
        .renew_interval(RENEW)
        .jitter(0.0)
        .build()
        .unwrap()
        .start();
    let mut rx = a.watch();
    let first = wait_leader(&mut rx).await;
    tokio::time::timeout(Duration::from_secs(60), first.lost())
        .await
        .expect("the term with the old token ends");
    assert_eq!(first.loss_reason(), Some(LossReason::Superseded));
    let second = wait_leader(&mut rx).await;
    assert_eq!(second.token().get(), first.token().get() + 1);
    a.abort().await;
}

/// With `release_on_shutdown(false)` a shutdown leaves the lease to lapse in the store.
#[tokio::test(start_paused = true)]
async fn shutdown_without_release_leaves_the_lease() {
    let store = Scripted::new();
    let a = Elector::builder(store.clone())
        .resource("job")
        .candidate_id("a")
        .release_on_shutdown(false)
        .build()
        .unwrap()
        .start();
    wait_leader(&mut a.watch()).await;
    a.shutdown().await;
    let row = store.inner.current("job").await.unwrap().unwrap();
    assert!(row.live && row.holder == "a", "{row:?}");
    assert_eq!(store.count("release"), 0, "{:?}", store.events());
}

/// Release notifications of *another* resource do not wake a follower: it waits for its own
/// retry.
#[tokio::test(start_paused = true)]
async fn a_release_of_another_resource_does_not_wake_a_follower() {
    let store = Scripted::new();
    let a = elector(&store, "a").start();
    wait_leader(&mut a.watch()).await;
    let other = Elector::builder(store.clone())
        .resource("other")
        .candidate_id("c")
        .build()
        .unwrap()
        .start();
    wait_leader(&mut other.watch()).await;
    let b = Elector::builder(store.clone())
        .resource("job")
        .candidate_id("b")
        .retry_interval(Duration::from_secs(10))
        .jitter(0.0)
        .build()
        .unwrap()
        .start();
    let mut brx = b.watch();
    brx.wait_for(|s| {
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
    let before = store.count("acquire b");
    tokio::time::sleep(Duration::from_secs(1)).await;
    other.shutdown().await; // releases "other"
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        store.count("acquire b"),
        before,
        "woken by another resource's release: {:?}",
        store.events()
    );
    a.abort().await;
    b.abort().await;
}

/// Work that winds down for 3 s after `lost`, noting when it finished or was dropped.
fn winding_down_work(
    handle: &orion_beacon::ElectorHandle,
    store: &Double<Scripted>,
) -> (tokio::task::JoinHandle<()>, Arc<Mutex<Option<Instant>>>) {
    let dropped_at = Arc::new(Mutex::new(None));
    let d2 = dropped_at.clone();
    let s2 = store.clone();
    let work = handle.run_as_leader(move |term| {
        let guard = Dropped(d2.clone());
        let store = s2.clone();
        async move {
            term.lost().await;
            tokio::time::sleep(Duration::from_secs(3)).await;
            store.note("work finished");
            std::mem::forget(guard);
        }
    });
    (work, dropped_at)
}

fn short_lease(store: &Double<Scripted>) -> orion_beacon::ElectorHandle {
    Elector::builder(store.clone())
        .resource("job")
        .candidate_id("a")
        .lease_duration(Duration::from_secs(2))
        .renew_interval(Duration::from_millis(500))
        .grace_period(Duration::from_secs(5))
        .jitter(0.0)
        .build()
        .unwrap()
        .start()
}

/// A store error while the work winds down is retried (the lease is not lost yet): the work
/// finishes and the lease is released after it.
#[tokio::test(start_paused = true)]
async fn a_store_error_while_winding_down_is_retried() {
    let store = Scripted::new();
    let a = short_lease(&store);
    let (_work, dropped_at) = winding_down_work(&a, &store);
    wait_leader(&mut a.watch()).await;
    let t0 = Instant::now();
    let shutdown = tokio::spawn(a.shutdown());
    tokio::time::sleep(Duration::from_millis(100)).await;
    store.set(Mode::Fail); // the next renew (at 0.5 s) and its first retries fail
    tokio::time::sleep(Duration::from_millis(600)).await;
    store.set(Mode::Normal);
    shutdown.await.unwrap();
    assert!(dropped_at.lock().unwrap().is_none(), "the work was dropped");
    // The renew due at 0.5 s failed, then retries after 50 and 100 ms of back-off failed too;
    // the next, 200 ms later, found the store back.
    let failing: Vec<u128> = store
        .events()
        .iter()
        .filter(|(t, e)| {
            e == "acquire a"
                && *t - t0 > Duration::from_millis(100)
                && *t - t0 < Duration::from_millis(700)
        })
        .map(|(t, _)| (*t - t0).as_millis())
        .collect();
    assert_eq!(failing, vec![500, 550, 650]);
    let events: Vec<String> = store.events().into_iter().map(|(_, e)| e).collect();
    let finished = events.iter().position(|e| e == "work finished");
    let released = events.iter().position(|e| e == "release a true");
    assert!(
        matches!((finished, released), (Some(f), Some(r)) if f < r),
        "{events:?}"
    );
}

/// While the work winds down, a renew answered with another token means the term is gone: the
/// work is cut off at once and nothing is released.
#[tokio::test(start_paused = true)]
async fn a_new_token_while_winding_down_cuts_the_work_off() {
    let store = Double::new(RenewsIntoNewToken {
        calls: Arc::default(),
    });
    let a = Elector::builder(store.clone())
        .resource("job")
        .candidate_id("a")
        .lease_duration(Duration::from_secs(2))
        .renew_interval(Duration::from_millis(500))
        .grace_period(Duration::from_secs(5))
        .jitter(0.0)
        .build()
        .unwrap()
        .start();
    let finished = Arc::new(Mutex::new(false));
    let f2 = finished.clone();
    let _work = a.run_as_leader(move |term| {
        let finished = f2.clone();
        async move {
            term.lost().await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            *finished.lock().unwrap() = true;
        }
    });
    wait_leader(&mut a.watch()).await;
    let t0 = Instant::now();
    a.shutdown().await; // the drain's first renew (call 2) comes back with a new token
    assert!(
        !*finished.lock().unwrap(),
        "the work ran on after its term was gone"
    );
    assert!(
        Instant::now() - t0 < Duration::from_secs(1),
        "{:?}",
        Instant::now() - t0
    );
}

/// The handle can be shared (say, in an axum state): shutdown through an `Arc`, awaited in
/// another task, returns once the elector stopped and released.
#[tokio::test(start_paused = true)]
async fn shutdown_through_a_shared_handle() {
    let store = Scripted::new();
    let a = Arc::new(elector(&store, "a").start());
    wait_leader(&mut a.watch()).await;
    let shared = a.clone();
    tokio::spawn(async move { shared.shutdown().await })
        .await
        .unwrap();
    assert!(!a.is_leader());
    assert_eq!(store.count("release a true"), 1, "{:?}", store.events());
    // Asking again is harmless.
    a.shutdown().await;
}

/// What a term says about itself, before and after it ends: names, equality, the loss, and the
/// deadline as an exclusive bound (at the deadline instant the term is no longer current).
#[tokio::test(start_paused = true)]
async fn a_term_describes_itself() {
    let store = Scripted::new();
    let a = elector(&store, "a").start();
    let mut rx = a.watch();
    let term = wait_leader(&mut rx).await;
    assert_eq!((term.resource(), term.candidate()), ("job", "a"));
    assert_eq!(term, term.clone());
    assert_eq!(a.leadership(), Leadership::Leader(term.clone()));
    assert_ne!(a.leadership(), Leadership::Starting);
    assert_eq!(Leadership::Starting, Leadership::Starting);
    assert!(!term.is_lost() && term.is_current());
    let token = term.cancellation_token();
    assert!(!token.is_cancelled());

    // At the deadline instant exactly, the term is not current any more.
    store.set(Mode::Hang);
    tokio::time::sleep_until(term.deadline()).await;
    assert!(!term.is_current(), "current at its deadline");
    term.lost().await;
    assert!(term.is_lost());
    assert!(
        token.is_cancelled(),
        "the cancellation token fires with the loss"
    );
    assert_eq!(term.loss_reason(), Some(LossReason::Deadline));
    assert_eq!(LossReason::Deadline.to_string(), "deadline");
    assert_eq!(
        [
            LossReason::Denied,
            LossReason::Superseded,
            LossReason::Shutdown,
            LossReason::Aborted
        ]
        .map(|r| r.to_string()),
        ["denied", "superseded", "shutdown", "aborted"]
    );
    a.abort().await;
}

/// The in-memory store behind the lease row's lock, as a fenced transaction holds it: every
/// statement waits for the lock, and runs in the "database" (a task of its own), so one whose
/// caller gave up still commits once the lock is free.
#[derive(Clone)]
struct RowLocked {
    lock: Arc<tokio::sync::Mutex<()>>,
    log: Arc<Mutex<Vec<String>>>,
}

impl RowLocked {
    fn new() -> Double<Self> {
        Double::new(Self {
            lock: Arc::default(),
            log: Arc::default(),
        })
    }
    fn note(&self, what: String) {
        self.log.lock().unwrap().push(what);
    }
}

#[async_trait]
impl Intercept for RowLocked {
    async fn acquire_or_renew(
        &self,
        inner: &InMemoryLeaseStore,
        r: &str,
        c: &str,
        lease: Duration,
    ) -> Result<LeaseOutcome, StoreError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (store, inner, r, c) = (self.clone(), inner.clone(), r.to_owned(), c.to_owned());
        tokio::spawn(async move {
            let _row = store.lock.lock().await;
            let out = inner.acquire_or_renew(&r, &c, lease).await;
            store.note(match &out {
                Ok(LeaseOutcome::Acquired(l)) => format!("acquired {}", l.token),
                Ok(LeaseOutcome::Renewed(l)) => format!("renewed {}", l.token),
                Ok(LeaseOutcome::Denied(_)) => "denied".into(),
                Err(e) => format!("error {e}"),
            });
            let _ = tx.send(out);
        });
        rx.await.unwrap_or_else(|_| {
            Err(StoreError::Database(
                sea_orm::DbErr::Custom("gone".into()).into(),
            ))
        })
    }
    async fn release(
        &self,
        inner: &InMemoryLeaseStore,
        r: &str,
        c: &str,
    ) -> Result<bool, StoreError> {
        let _row = self.lock.lock().await;
        inner.release(r, c).await
    }
    async fn release_lease(
        &self,
        inner: &InMemoryLeaseStore,
        lease: &Lease,
    ) -> Result<bool, StoreError> {
        let _row = self.lock.lock().await;
        let released = inner.release_lease(lease).await?;
        self.note(format!("release {} {released}", lease.token));
        Ok(released)
    }
    /// No release notifications: followers poll.
    fn release_events(&self, _inner: &InMemoryLeaseStore) -> Option<ReleaseEvents> {
        None
    }
}

/// Every term an elector publishes, in order (a term counts once, however often it is seen).
fn record_terms(handle: &orion_beacon::ElectorHandle) -> Arc<Mutex<Vec<orion_beacon::LeaderTerm>>> {
    let terms: Arc<Mutex<Vec<orion_beacon::LeaderTerm>>> = Arc::default();
    let seen = terms.clone();
    let mut rx = handle.watch();
    tokio::spawn(async move {
        loop {
            if let Some(term) = rx.borrow_and_update().term() {
                let mut seen = seen.lock().unwrap();
                if seen.last() != Some(term) {
                    seen.push(term.clone());
                }
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    });
    terms
}

/// (token, loss reason) of each term, and whether every term's token exceeds every earlier
/// term's.
fn tokens_strictly_increase(terms: &[orion_beacon::LeaderTerm]) -> (Vec<String>, bool) {
    let listed = terms
        .iter()
        .enumerate()
        .map(|(i, t)| {
            format!(
                "term #{} token {} ({:?})",
                i + 1,
                t.token(),
                t.loss_reason()
            )
        })
        .collect();
    let increasing = terms.windows(2).all(|w| w[1].token() > w[0].token());
    (listed, increasing)
}

/// A leader whose renew is held up by its own work's fenced transaction (which holds the lease
/// row's lock) loses its term at its local deadline, and its work is dropped, which frees the
/// lock; the held-up renew and the next acquire then commit while the store's lease is still
/// live and come back `Renewed` with the old token. No new term may begin on that token: a
/// term's token must exceed every earlier term's, or fencing (`last <= token`) would admit the
/// dropped term's late writes after the new term's. The elector releases that exact write and
/// leads again at once with the next token.
#[tokio::test(start_paused = true)]
async fn a_renew_held_up_past_the_deadline_never_restarts_the_old_token() {
    let store = RowLocked::new();
    let handle = elector_on(store.clone(), "a");
    let terms = record_terms(&handle);
    let lock = store.lock.clone();
    let first_term = Arc::new(Mutex::new(true));
    let _work = handle.run_as_leader(move |term| {
        let lock = lock.clone();
        let first = std::mem::replace(&mut *first_term.lock().unwrap(), false);
        async move {
            // The first term's work opens a fenced transaction and never finishes it: the
            // row stays locked until the work is dropped.
            let _txn = if first {
                Some(lock.lock_owned().await)
            } else {
                None
            };
            term.lost().await;
        }
    });
    let first = wait_leader(&mut handle.watch()).await;
    let t0 = Instant::now();
    first.lost().await;
    assert_eq!(first.loss_reason(), Some(LossReason::Deadline));
    assert_eq!(
        Instant::now(),
        t0 + LEASE - LEASE / 10,
        "lost at its deadline"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (listed, increasing) = tokens_strictly_increase(&terms.lock().unwrap());
    let log = store.log.lock().unwrap().clone();
    assert!(
        increasing,
        "a term began with a token not above an earlier term's: {listed:?}; store: {log:?}"
    );
    assert!(
        handle.is_leader(),
        "leads again at once: {listed:?}; store: {log:?}"
    );
    assert!(
        log.iter().any(|e| e == "release 1 true"),
        "the old token's write was released: {log:?}"
    );
    handle.abort().await;
}

/// A new elector that reuses the candidate id of one that died (aborted: no release) finds the
/// old lease live and `Renewed`. It must not lead on its predecessor's token: a late fenced
/// write of the dead process would pass the fence (same holder, same token). It releases that
/// write and leads with a new token.
#[tokio::test(start_paused = true)]
async fn a_restart_with_the_same_id_leads_with_a_new_token() {
    let store = RowLocked::new();
    let old = elector_on(store.clone(), "a");
    let first = wait_leader(&mut old.watch()).await;
    old.abort().await;
    let new = elector_on(store.clone(), "a");
    let terms = record_terms(&new);
    let second = wait_leader(&mut new.watch()).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    let log = store.log.lock().unwrap().clone();
    assert!(
        second.token() > first.token(),
        "the restarted elector led with its predecessor's token {}: {:?}; store: {log:?}",
        first.token(),
        tokens_strictly_increase(&terms.lock().unwrap()).0
    );
    assert!(second.is_current());
    new.abort().await;
}

fn elector_on(store: impl LeaseStore + 'static, id: &str) -> orion_beacon::ElectorHandle {
    Elector::builder(store)
        .resource("job")
        .candidate_id(id)
        .lease_duration(LEASE)
        .renew_interval(RENEW)
        .retry_interval(Duration::from_secs(2))
        .jitter(0.0)
        .build()
        .unwrap()
        .start()
}

/// A store whose `release_lease` fails (`fail`) or never finds the write it names (as a store
/// whose expiries do not round-trip would), counting acquire-or-renew calls.
#[derive(Clone)]
struct Unreleasable {
    fail: bool,
    calls: Arc<Mutex<Vec<Instant>>>,
}

#[async_trait]
impl Intercept for Unreleasable {
    async fn acquire_or_renew(
        &self,
        inner: &InMemoryLeaseStore,
        r: &str,
        c: &str,
        lease: Duration,
    ) -> Result<LeaseOutcome, StoreError> {
        self.calls.lock().unwrap().push(Instant::now());
        inner.acquire_or_renew(r, c, lease).await
    }
    async fn release_lease(
        &self,
        _inner: &InMemoryLeaseStore,
        _lease: &Lease,
    ) -> Result<bool, StoreError> {
        if self.fail {
            Err(StoreError::Database(
                sea_orm::DbErr::Custom("injected".into()).into(),
            ))
        } else {
            Ok(false)
        }
    }
    /// No release notifications: followers poll.
    fn release_events(&self, _inner: &InMemoryLeaseStore) -> Option<ReleaseEvents> {
        None
    }
}

/// A live lease of the elector's own id that it cannot release never makes a hot loop, and is
/// never led: a failed release waits for the lease to lapse (the next attempt then begins a new
/// term, token 2); a release that keeps finding its write gone is tried again at once only
/// once, then after a retry interval each time.
#[tokio::test(start_paused = true)]
async fn a_lease_that_cannot_be_released_is_never_led_nor_hammered() {
    for fail in [true, false] {
        let store = Double::new(Unreleasable {
            fail,
            calls: Arc::default(),
        });
        // A predecessor with the same id left its lease live.
        let held = store
            .inner
            .acquire_or_renew("job", "a", LEASE)
            .await
            .unwrap();
        assert_eq!(held.token().map(|t| t.get()), Some(1));
        let t0 = Instant::now();
        let a = elector_on(store.clone(), "a");
        let terms = record_terms(&a);
        tokio::time::sleep(Duration::from_secs(9)).await;
        let calls: Vec<u128> = store
            .calls
            .lock()
            .unwrap()
            .iter()
            .map(|t| (*t - t0).as_millis())
            .collect();
        let led: Vec<i64> = terms
            .lock()
            .unwrap()
            .iter()
            .map(|t| t.token().get())
            .collect();
        if fail {
            // Renewed at 0 (the lease now ends at 15 s); nothing more until it has lapsed.
            assert_eq!(calls, vec![0], "fail: {calls:?}");
            assert!(led.is_empty(), "{led:?}");
            tokio::time::sleep(Duration::from_secs(7)).await;
            let term = wait_leader(&mut a.watch()).await;
            assert_eq!(term.token().get(), 2);
            assert_eq!(
                store.calls.lock().unwrap().len(),
                2,
                "asked again once the lease lapsed"
            );
        } else {
            // Every acquire renews it, so it never lapses: once at once, then every 2 s.
            assert_eq!(calls, vec![0, 0, 2_000, 4_000, 6_000, 8_000], "{calls:?}");
            assert!(led.is_empty(), "led a lease it could not release: {led:?}");
        }
        a.abort().await;
    }
}

/// How a term ended, for the cleanup test below.
#[derive(Debug, Clone, Copy)]
enum End {
    /// The work returned on its own.
    Returned,
    /// `shutdown()`; the work returns when `lost()` fires.
    Shutdown,
    /// `shutdown()`; the work ignores `lost()` and is dropped after the grace period.
    ShutdownStubborn,
    /// The handle is dropped.
    HandleDropped,
    /// Another candidate took the lease: the renew is denied.
    Denied,
    /// Every renew fails until the deadline.
    Deadline,
    /// Every renew hangs until the deadline.
    Hung,
    /// `abort()`.
    Aborted,
}

/// The cleanup pattern the docs show: a value whose `Drop` does the cleanup, made first thing in
/// the work. It runs however the term ends (the work returns, or is dropped when the term is
/// lost), where a `select!` branch on `lost()` runs only when the work is let finish.
struct Cleanup {
    term: orion_beacon::LeaderTerm,
    done: Cleaned,
    end: End,
}

/// Each cleanup that ran: for which kind of end, and the term's loss reason then.
type Cleaned = Arc<Mutex<Vec<(End, Option<LossReason>)>>>;

impl Drop for Cleanup {
    fn drop(&mut self) {
        self.done
            .lock()
            .unwrap()
            .push((self.end, self.term.loss_reason()));
    }
}

/// And code after `term.lost().await` runs only where the work is let finish (a shutdown, the
/// handle dropped): on a denial, a deadline or an abort the work is dropped at once.
#[tokio::test(start_paused = true)]
async fn a_cleanup_in_a_drop_guard_runs_on_every_kind_of_term_end() {
    let done: Cleaned = Arc::default();
    let after_lost: Arc<Mutex<Vec<String>>> = Arc::default();
    for end in [
        End::Returned,
        End::Shutdown,
        End::ShutdownStubborn,
        End::HandleDropped,
        End::Denied,
        End::Deadline,
        End::Hung,
        End::Aborted,
    ] {
        let before = done.lock().unwrap().len();
        let store = Scripted::new();
        let handle = Elector::builder(store.clone())
            .resource("job")
            .candidate_id("a")
            .grace_period(Duration::from_secs(2))
            .build()
            .unwrap()
            .start();
        let cleanups = done.clone();
        let after = after_lost.clone();
        let _work = handle.run_as_leader(move |term| {
            let after = after.clone();
            let cleanup = Cleanup {
                term: term.clone(),
                done: cleanups.clone(),
                end,
            };
            async move {
                let _cleanup = cleanup;
                match end {
                    End::Returned => {}
                    End::ShutdownStubborn => std::future::pending().await,
                    _ => {
                        term.lost().await;
                        after.lock().unwrap().push(format!("{end:?}"));
                    }
                }
            }
        });
        let term = wait_leader(&mut handle.watch()).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        match end {
            End::Returned => {}
            End::Shutdown | End::ShutdownStubborn => handle.shutdown().await,
            End::HandleDropped => drop(handle),
            End::Denied => {
                store.inner.release("job", "a").await.unwrap();
                store
                    .inner
                    .acquire_or_renew("job", "intruder", LEASE)
                    .await
                    .unwrap();
                term.lost().await;
            }
            End::Deadline => {
                store.set(Mode::Fail);
                term.lost().await;
            }
            End::Hung => {
                store.set(Mode::Hang);
                term.lost().await;
            }
            End::Aborted => handle.abort().await,
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        let ran: Vec<_> = done.lock().unwrap()[before..].to_vec();
        assert!(
            ran.iter().any(|(e, _)| matches!((e, end), (a, b) if std::mem::discriminant(a) == std::mem::discriminant(&b))),
            "{end:?}: the cleanup did not run ({ran:?})"
        );
        eprintln!(
            "{end:?}: cleanup ran, the term's loss reason then: {:?}",
            ran[0].1
        );
    }
    assert_eq!(
        *after_lost.lock().unwrap(),
        vec!["Shutdown", "HandleDropped"],
        "code after lost() ran only where the work was let finish"
    );
}

/// A step-down answers even when nothing takes it up any more: after the elector stopped, at
/// once with `false`; and while a shutdown drains, `false` once it is done.
#[tokio::test(start_paused = true)]
async fn a_step_down_of_a_stopped_elector_answers_false() {
    let handle = Elector::builder_in_memory()
        .resource("stopped")
        .build()
        .unwrap()
        .start();
    handle.watch().wait_for(|l| l.is_leader()).await.unwrap();
    handle.shutdown().await;
    let answer = tokio::time::timeout(
        Duration::from_secs(1),
        handle.step_down(Duration::from_secs(1)),
    )
    .await
    .expect("answered, not left waiting");
    assert!(!answer.unwrap());
}

/// Staying out after a step-down is no store outage: the health stays good all along (no
/// round trip is due), the candidate does not lead, and after the stay-out it leads again.
#[tokio::test(start_paused = true)]
async fn staying_out_after_a_step_down_is_healthy() {
    let handle = Elector::builder_in_memory()
        .resource("resting")
        .build()
        .unwrap()
        .start();
    handle.watch().wait_for(|l| l.is_leader()).await.unwrap();
    let first = handle.token().unwrap();
    assert!(handle.step_down(Duration::from_secs(60)).await.unwrap());
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(!handle.is_leader(), "staying out");
        let health = handle.health();
        assert!(health.healthy, "{health:?}");
        // The real last round trip is shown, not the stay-out.
        assert!(
            health.last_round_trip >= Some(Duration::from_secs(9)),
            "{health:?}"
        );
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(handle.is_leader(), "back after the stay-out");
    assert!(handle.token().unwrap() > first);
    handle.shutdown().await;
}

/// A store whose take of an offer commits but answers with an error (the answer lost), or that
/// cannot offer at all (a wrapper that does not pass `offer` on).
#[derive(Clone, Default)]
struct Handovers {
    lose_take_answers: bool,
    no_offers: bool,
    takes: Arc<Mutex<u32>>,
}

#[async_trait]
impl Intercept for Handovers {
    async fn offer(
        &self,
        inner: &InMemoryLeaseStore,
        lease: &Lease,
        to: &str,
        within: Duration,
    ) -> Result<bool, StoreError> {
        if self.no_offers {
            return Err(StoreError::Unsupported { operation: "offer" });
        }
        inner.offer(lease, to, within).await
    }
    async fn take_offer(
        &self,
        inner: &InMemoryLeaseStore,
        resource: &str,
        candidate: &str,
        token: orion_beacon::FencingToken,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        *self.takes.lock().unwrap() += 1;
        let taken = inner.take_offer(resource, candidate, token, lease).await;
        if self.lose_take_answers {
            return Err(StoreError::Database(
                sea_orm::DbErr::Custom("the answer was lost".into()).into(),
            ));
        }
        taken
    }
}

/// Electors `a` (leading: its term is returned) and `b` (following it) on `store`.
async fn handover_electors(
    store: &Double<Handovers>,
) -> (
    orion_beacon::ElectorHandle,
    orion_beacon::ElectorHandle,
    orion_beacon::LeaderTerm,
) {
    let start = |id: &str| {
        Elector::builder(store.clone())
            .resource("job")
            .candidate_id(id)
            .lease_duration(LEASE)
            .renew_interval(RENEW)
            .retry_interval(Duration::from_secs(1))
            .jitter(0.0)
            .build()
            .unwrap()
            .start()
    };
    let (a, b) = (start("a"), start("b"));
    let term = wait_leader(&mut a.watch()).await;
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
    (a, b, term)
}

/// The successor's take commits but its answer is lost: the successor does not lead on it,
/// finds the offered term as its own at its next attempt, releases exactly that write and leads
/// with a higher token; never two leaders, and the old leader's answer is `Taken` (the store
/// shows the successor holding it) or `NotTaken`, never a hang.
#[tokio::test(start_paused = true)]
async fn a_take_whose_answer_is_lost_leads_later_with_a_higher_token() {
    let store = Double::new(Handovers {
        lose_take_answers: true,
        ..Handovers::default()
    });
    let (a, b, first) = handover_electors(&store).await;
    let answer = a.hand_over_to("b", Duration::from_secs(5)).await.unwrap();
    assert!(
        matches!(
            answer,
            orion_beacon::Handover::Taken { .. } | orion_beacon::Handover::NotTaken
        ),
        "{answer:?}"
    );
    assert!(
        *store.takes.lock().unwrap() >= 1,
        "the successor took the offer"
    );
    let term = wait_leader(&mut b.watch()).await;
    assert!(
        term.token().get() > first.token().get() + 1,
        "not on the taken token ({}), whose answer it never saw",
        first.token().get() + 1
    );
    assert!(!a.is_leader());
    a.shutdown().await;
    b.shutdown().await;
}

/// A store that cannot make offers: the handover releases the lease instead (`Ended`), so the
/// resource does not wait a lease for a leader.
#[tokio::test(start_paused = true)]
async fn a_store_without_offers_releases_instead() {
    let store = Double::new(Handovers {
        no_offers: true,
        ..Handovers::default()
    });
    let (a, b, _) = handover_electors(&store).await;
    let asked = Instant::now();
    assert_eq!(
        a.hand_over_to("b", Duration::from_secs(5)).await.unwrap(),
        orion_beacon::Handover::Ended
    );
    wait_leader(&mut b.watch()).await;
    assert!(
        asked.elapsed() < LEASE / 2,
        "led {:?} after the handover, not at its next retry",
        asked.elapsed()
    );
    a.shutdown().await;
    b.shutdown().await;
}
