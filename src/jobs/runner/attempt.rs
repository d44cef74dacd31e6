//! One attempt of a slot: its task started (the closure called inside it, so a panic is the
//! attempt's failure), and its end written (finished, failed, retried or given up).

use super::*;

/// Runs one claimed attempt in its own task (a panic fails the attempt, whether it comes from
/// the closure or from its future), then ends it.
pub(super) fn start(
    shared: &Arc<Shared>,
    term: &LeaderTerm,
    (i, slot, key, permit): (usize, i64, Option<Arc<str>>, Option<LockGuard>),
    attempt: i32,
    lateness: Duration,
    here: &mut Here,
) -> tokio::task::Id {
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
    tracing::info!(job = %reg.name, slot, key = run.key(), attempt, token = %term.token(), permit = permit.as_ref().map(|p| p.resource()), lateness_ms = lateness.as_millis() as u64, "job run starts");
    let work = reg.job.work.clone();
    let max_attempts = reg.policy.max_attempts;
    let returned = here.returned_tx.clone();
    let shared = shared.clone();
    here.set
        .spawn(async move {
            // The closure is called inside the work's own task, so that a panic in it (before
            // its future exists) fails this attempt like a panic inside the future; aborted
            // when this task is (the term ended).
            let closure_run = run.clone();
            let mut handle = tokio::spawn(async move { (work)(closure_run).await });
            let guard = AbortOnDrop(handle.abort_handle());
            // A capped run stops when its permit is lost, as every run does with its term: its
            // closure is cancelled and waited for (it ends at its next await), so that no next
            // attempt starts beside it.
            let permit_lost = permit.as_ref().map(LockGuard::lost);
            let result = match permit_lost {
                Some(lost) => tokio::select! {
                    // A closure that returned as the permit was lost keeps its result.
                    biased;
                    result = &mut handle => Some(result),
                    () = lost => {
                        handle.abort();
                        let _ = handle.await;
                        None
                    }
                },
                None => Some(handle.await),
            };
            drop(guard);
            // The job may start its next slot now; this attempt's end follows.
            let _ = returned.send(tokio::task::id());
            let error = match result {
                Some(Ok(Ok(()))) => None,
                Some(Ok(Err(e))) => Some(e.to_string()),
                Some(Err(e)) if e.is_panic() => Some(panic_text(e.into_panic())),
                Some(Err(_)) => Some("the job was cancelled".to_owned()),
                None => Some("the run's cap permit was lost; the job was stopped".to_owned()),
            };
            if finish(&run, error, max_attempts).await {
                shared.freshness.finished(i);
            }
            // The permit goes back once the attempt's end is written (that end is fenced by it).
            if let Some(permit) = permit {
                if let Err(e) = permit.release().await {
                    tracing::debug!(error = %e, "releasing a cap's permit failed; it lapses");
                }
            }
        })
        .id()
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
