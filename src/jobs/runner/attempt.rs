//! One attempt of a slot: its task started (the closure called inside it, so a panic is the
//! attempt's failure), and its end written (finished, failed, retried or given up).

use super::*;

/// What one attempt runs with: the job (by index), the slot, a keyed job's key, the cap's
/// permit, and with spread runs the run's own hold (its term is the run's term: it fences the
/// run's writes and its end, and is released once the end is written).
pub(crate) struct Launch {
    pub job: usize,
    pub slot: i64,
    pub key: Option<Arc<str>>,
    pub permit: Option<LockGuard>,
    pub hold: Option<LockGuard>,
    pub attempt: i32,
    pub lateness: Duration,
}

/// Runs one claimed attempt in its own task of `set` (a panic fails the attempt, whether it
/// comes from the closure or from its future), then ends it; `term` fences it. `returned`
/// hears the task's id as soon as the closure has returned.
pub(crate) fn start(
    shared: &Arc<Shared>,
    term: &LeaderTerm,
    launch: Launch,
    set: &mut JoinSet<()>,
    returned: Option<mpsc::UnboundedSender<tokio::task::Id>>,
) -> tokio::task::Id {
    let Launch {
        job: i,
        slot,
        key,
        permit,
        hold,
        attempt,
        lateness,
    } = launch;
    let reg = &shared.jobs[i];
    let run = JobRun {
        inner: Arc::new(RunState {
            job: reg.name.clone(),
            slot,
            key,
            attempt,
            term: term.clone(),
            permit: permit.as_ref().map(|p| p.term().clone()),
            store: shared.store.clone(),
            table: shared.table.clone(),
            started: Instant::now(),
            lateness,
            committed: AtomicBool::new(false),
            began: AtomicBool::new(false),
            sealed: AtomicBool::new(false),
        }),
    };
    crate::jobs::metrics_hook::lateness(&reg.name, lateness);
    tracing::info!(job = %reg.name, slot, key = run.key(), attempt, token = %term.token(), permit = permit.as_ref().map(|p| p.resource()), hold = hold.as_ref().map(|h| h.resource()), lateness_ms = lateness.as_millis() as u64, "job run starts");
    let work = reg.job.work.clone();
    let max_attempts = reg.policy.max_attempts;
    let shared = shared.clone();
    // Made before the task, so that a task aborted before it first ran lets them lapse too.
    let lost = lost_of(permit.as_ref(), hold.as_ref());
    let mut guards = Guards {
        held: [permit, hold].into_iter().flatten().collect(),
        shared: shared.clone(),
    };
    set.spawn(async move {
        // The closure is called inside the work's own task, so that a panic in it (before
        // its future exists) fails this attempt like a panic inside the future; aborted
        // when this task is (the term ended, the runner stopped).
        let closure_run = run.clone();
        let mut handle = tokio::spawn(async move { (work)(closure_run).await });
        let guard = AbortOnDrop(handle.abort_handle());
        // A run stops when its cap's permit or its own hold is lost, as a leader's run does
        // with its term: its closure is cancelled and waited for (it ends at its next await),
        // so that no next attempt starts beside it.

        let result = tokio::select! {
            // A closure that returned as a hold was lost keeps its result.
            biased;
            result = &mut handle => Ok(result),
            what = lost => {
                handle.abort();
                let _ = handle.await;
                Err(what)
            }
        };
        drop(guard);
        // The job may start its next slot now; this attempt's end follows.
        if let Some(returned) = returned {
            let _ = returned.send(tokio::task::id());
        }
        let error = match result {
            Ok(Ok(Ok(()))) => None,
            Ok(Ok(Err(e))) => Some(e.to_string()),
            Ok(Err(e)) if e.is_panic() => Some(panic_text(e.into_panic())),
            Ok(Err(_)) => Some("the job was cancelled".to_owned()),
            Err(what) => Some(format!("{what} was lost; the job was stopped")),
        };
        if finish(&run, error, max_attempts).await {
            shared.freshness.finished(i);
        }
        // The permit and the hold go back once the attempt's end is written (it is fenced by
        // both).
        for guard in std::mem::take(&mut guards.held) {
            release(Some(guard)).await;
        }
    })
    .id()
}

/// Gives back a run's cap permit or hold (one that failed to go back lapses).
pub(crate) async fn release(guard: Option<LockGuard>) {
    if let Some(guard) = guard {
        if let Err(e) = guard.release().await {
            tracing::debug!(error = %e, "releasing a run's permit or hold failed; it lapses");
        }
    }
}

/// A run's cap permit and hold while it runs: dropped with the run (its term ended, the
/// runner stopped), each is released by its own drop, except after `abort`, when they lapse as
/// a crashed process's would.
struct Guards {
    held: Vec<LockGuard>,
    shared: Arc<Shared>,
}

impl Drop for Guards {
    fn drop(&mut self) {
        if self
            .shared
            .aborted
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            for guard in self.held.drain(..) {
                guard.abandon();
            }
        }
    }
}

/// Resolves when the first of the run's permit and hold is lost, naming it; never without
/// either.
fn lost_of(
    permit: Option<&LockGuard>,
    hold: Option<&LockGuard>,
) -> impl std::future::Future<Output = &'static str> + Send + 'static {
    let permit = permit.map(LockGuard::lost);
    let hold = hold.map(LockGuard::lost);
    async move {
        let permit = async move {
            match permit {
                Some(lost) => lost.await,
                None => std::future::pending().await,
            }
        };
        let hold = async move {
            match hold {
                Some(lost) => lost.await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = permit => "the run's cap permit",
            () = hold => "the run's hold",
        }
    }
}

/// What a panic said, as the record keeps it.
fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned());
    match message {
        Some(m) => format!("the job panicked: {m}"),
        None => "the job panicked".to_owned(),
    }
}

/// Ends an attempt after its closure returned; whether its slot is finished.
pub(super) async fn finish(run: &JobRun, error: Option<String>, max_attempts: i32) -> bool {
    let job = run.job().to_owned();
    let slot = run.slot_millis();
    let duration = run.inner.started.elapsed();
    // From here on the closure's `begin` is refused.
    let began = run.seal();
    if run.committed() {
        if let Some(e) = &error {
            tracing::warn!(%job, slot, error = %e, "the job failed after its commit: the slot stays finished");
        }
        crate::jobs::metrics_hook::finished(&job, "finished", duration);
        return true;
    }
    // Writes begun in the run's transaction and never committed were rolled back: the slot
    // is not done.
    let error = match error {
        None if began => {
            Some("the job began its fenced transaction but did not commit it".to_owned())
        }
        other => other,
    };
    let (state, outcome) = match &error {
        None => (State::Finished, "finished"),
        Some(_) if run.inner.attempt >= max_attempts => (State::GivenUp, "given_up"),
        Some(_) => (State::Failed, "failed"),
    };
    match run.end(state, error.as_deref()).await {
        Ok(()) => {
            let done = state == State::Finished;
            crate::jobs::metrics_hook::finished(&job, outcome, duration);
            match &error {
                None => {
                    tracing::info!(%job, slot, ms = duration.as_millis() as u64, "job run finished")
                }
                Some(e) => {
                    tracing::warn!(%job, slot, attempt = run.attempt(), error = %e, outcome, "job run failed")
                }
            }
            done
        }
        Err(e) => {
            let (outcome, next) = match e.kind() {
                crate::error::ErrorKind::Lost => {
                    ("superseded", "the leader of the time claims the slot again")
                }
                crate::error::ErrorKind::Conflict => (
                    "unmarked",
                    "its record no longer names this attempt (given up or marked meanwhile)",
                ),
                _ => (
                    "unmarked",
                    "the slot is claimed again by the leader of the time",
                ),
            };
            crate::jobs::metrics_hook::finished(&job, outcome, duration);
            tracing::warn!(%job, slot, error = %e, "job run could not be marked; {next}");
            false
        }
    }
}

struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
