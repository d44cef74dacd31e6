//! The renewer's sending task: the batches taken from the queue, one statement per chunk, and
//! each answer sent to its holder.

use super::*;

/// Sends `batch` each time its first entry is due, while entries wait.
pub(super) async fn send_batches(
    mut running: Running,
    renewer: Renewer,
    store: Arc<dyn LeaseStore>,
) {
    let batch = Arc::clone(&running.batch);
    loop {
        let due = {
            let mut pending = lock(&batch.pending);
            match pending.entries.iter().map(|e| e.due).min() {
                Some(due) => {
                    pending.leaves_at = Some(due);
                    due
                }
                None => {
                    pending.running = false;
                    pending.leaves_at = None;
                    running.ended = true;
                    return;
                }
            }
        };
        tokio::select! {
            () = crate::clock::sleep_until(due) => {}
            // An entry came: perhaps due sooner.
            () = batch.entered.notified() => continue,
        }
        let taken = std::mem::take(&mut lock(&batch.pending).entries);
        send(&batch, &renewer, &store, taken);
    }
}

/// Clears the batch's running flag if its task is dropped (its runtime shut down): the entries
/// waiting then are dropped too, and their electors ask on their own.
pub(super) struct Running {
    pub(super) batch: Arc<Batch>,
    pub(super) ended: bool,
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.ended {
            let mut pending = lock(&self.batch.pending);
            pending.running = false;
            pending.leaves_at = None;
            pending.entries.clear();
        }
    }
}

/// Sends one batch: every entry is told it left (with the instant taken before any statement
/// goes out), then one statement per [`MAX_PER_STATEMENT`] entries, each on a task of its own,
/// so no entry waits behind another's statement.
pub(super) fn send(
    batch: &Batch,
    renewer: &Renewer,
    store: &Arc<dyn LeaseStore>,
    taken: Vec<Entry>,
) {
    // A resource given twice (two electors of this process that both think they lead it, a
    // moment apart): the later entries ask on their own.
    let mut seen = HashSet::with_capacity(taken.len());
    let sent = crate::clock::now();
    let mut out = Vec::with_capacity(taken.len());
    for e in taken {
        let (tx, answer) = oneshot::channel();
        // An elector that is gone by now is left out; so is a lease past its deadline (its
        // term is over: renewing it would leave a live lease nobody leads).
        if e.departed.send(Departure { sent, answer }).is_ok()
            && e.deadline > sent
            && seen.insert(e.lease.resource.clone())
        {
            out.push(Out {
                lease: e.lease,
                deadline: e.deadline,
                leader: e.leader,
                answer: tx,
            });
        }
    }
    // A leader with nothing to go with renews on its own: its acquire-or-renew is one
    // statement, a batch of one up to three (the batch, the read, the single renew).
    if out.len() == 1 && out[0].leader {
        if let Some(only) = out.pop() {
            let _ = only.answer.send(Reply::Alone);
        }
        return;
    }
    while !out.is_empty() {
        let rest = if out.len() > MAX_PER_STATEMENT {
            out.split_off(MAX_PER_STATEMENT)
        } else {
            Vec::new()
        };
        let chunk = std::mem::replace(&mut out, rest);
        tokio::spawn(renew_chunk(
            Arc::clone(&renewer.batches),
            store.clone(),
            batch.lease,
            sent,
            chunk,
        ));
    }
}

/// An entry on its way: the answer goes to its elector.
struct Out {
    lease: Lease,
    deadline: Instant,
    leader: bool,
    answer: oneshot::Sender<Reply>,
}

/// One statement for `chunk`, given up at the first deadline in it (every holder in it then
/// renews on its own). It never waits for a row another transaction holds (a holder's own
/// fenced transaction, say): that lease is renewed alone with a single renew's bound, and
/// answered as busy if that does not answer either. A busy lease's renew delays the answers
/// of the others in its statement by at most that bound.
async fn renew_chunk(
    batches: Arc<Batches>,
    store: Arc<dyn LeaseStore>,
    lease: Duration,
    sent: Instant,
    chunk: Vec<Out>,
) {
    let Some(first) = chunk.iter().map(|o| o.deadline).min() else {
        return;
    };
    let held: Vec<Lease> = chunk.iter().map(|o| o.lease.clone()).collect();
    // The leases a batch left out are asked about in time for the first holder's deadline.
    let renew = crate::store::ANSWER_BY.scope(first, store.renew_all(&held, lease));
    // Given up at the first deadline: a holder that gave up on its answer then must not have
    // its lease renewed unseen (a release naming its last write would no longer match).
    let answer = crate::clock::timeout_at(first, renew).await;
    let (mut renewed, lost, unanswered): (HashMap<(String, String), Lease>, _, _) = match answer {
        Ok(Ok(renewals)) => {
            batches.answered();
            let renewed = renewals
                .renewed
                .into_iter()
                .map(|l| ((l.resource.clone(), l.holder.clone()), l))
                .collect();
            (renewed, renewals.lost, renewals.unanswered)
        }
        Ok(Err(error)) => {
            batches.failed(&error, sent);
            let what = format!("a batched renew failed: {error}");
            let refused = error.is_permanent().then(|| Arc::new(error));
            let reply = || match &refused {
                Some(error) => Reply::Refused(Arc::clone(error)),
                None => Reply::Failed(what.clone()),
            };
            for o in chunk {
                let _ = o.answer.send(reply());
            }
            return;
        }
        // Every elector in it gave up at its deadline by now; leaders renew on their own for a
        // while.
        Err(_) => {
            batches.failed(
                &StoreError::Database(
                    sea_orm::DbErr::Custom("a batched renew did not answer in time".into()).into(),
                ),
                sent,
            );
            return;
        }
    };
    for o in chunk {
        let reply = match renewed.remove(&(o.lease.resource.clone(), o.lease.holder.clone())) {
            Some(l) if l.token == o.lease.token => Reply::Renewed(l),
            Some(_) => Reply::Lost,
            // Its row was busy (its own fenced transaction, say): no news. An elector renews
            // on its own at once; other holds ask again as after a failed renew.
            None if unanswered.contains(&o.lease) => Reply::Busy,
            None if lost.contains(&o.lease) => Reply::Lost,
            // An answer that says nothing of it (a store that left it out): its holder asks
            // on its own.
            None => Reply::Alone,
        };
        let _ = o.answer.send(reply);
    }
}
