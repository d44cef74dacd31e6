//! The batch renew that skips rows another transaction holds, and the renews of the leases
//! it left out, each on its own with a short wait.

use super::*;

impl SeaOrmLeaseStore {
    /// [`renew_all`](LeaseStore::renew_all): one batch that skips rows other transactions hold
    /// locked; then one read of the leases it did not renew, and those it shows live as
    /// given (their rows were busy) each renewed on its own, its wait for the row bounded as
    /// a single renew's is, all within [`solo_budget`]. A lease the read shows lapsed or taken
    /// is lost; one whose own renew waited out its bound, failed or was not reached in time is
    /// unanswered.
    pub(super) async fn renew_all_skipping(
        &self,
        held: &[Lease],
        lease: Duration,
    ) -> Result<Renewals, StoreError> {
        let millis = validate_batch(held, lease)?;
        let engine = self.engine()?;
        if held.is_empty() {
            return Ok(Renewals::default());
        }
        let json = statements::held_json(held);
        engine.ready().await?;
        let rows = engine.backend.renew_all(&engine.cx, json, millis).await;
        let rows = engine.lease_table(rows)?;
        let fresh =
            crate::backend::row::renewed_leases(&rows).map_err(|e| engine.cx.decode_error(e))?;
        let batch = Renewals::sort(held, fresh);
        let mut renewals = Renewals {
            renewed: batch.renewed,
            ..Renewals::default()
        };
        if !batch.lost.is_empty() {
            self.renew_left_out(engine, batch.lost, millis, &mut renewals)
                .await;
        }
        for lease in &renewals.renewed {
            engine.holding(&lease.resource, &lease.holder, lease.remaining);
        }
        for lease in &renewals.lost {
            engine.ended(&lease.resource, &lease.holder);
        }
        Ok(renewals)
    }

    /// The leases a batch left out, sorted into `renewals`: read once (a plain read, which
    /// waits for no lock), lost where the read shows them lapsed or another term's (MySQL
    /// locks a row before it checks the term, so a row another term's transaction holds would
    /// otherwise look busy), and renewed one by one where it shows them live as given.
    pub(super) async fn renew_left_out(
        &self,
        engine: &Engine,
        left: Vec<Lease>,
        millis: i64,
        renewals: &mut Renewals,
    ) {
        let started = crate::clock::now();
        let budget = solo_budget(engine.backend.solo_wait(millis), millis);
        let mut until = started.checked_add(budget).unwrap_or(started);
        if let Ok(answer_by) = crate::store::ANSWER_BY.try_with(|at| *at) {
            // Time left for the answer to reach a caller that gives up then.
            let spare = answer_by.saturating_duration_since(started) / 4;
            let spare = spare.min(Duration::from_millis(50));
            until = until.min(answer_by.checked_sub(spare).unwrap_or(answer_by));
        }
        let resources: Vec<String> = left.iter().map(|l| l.resource.clone()).collect();
        let read = crate::clock::timeout_at(until, self.read_leases(&resources)).await;
        let records = match read {
            Ok(Ok(records)) => records,
            Ok(Err(error)) => {
                tracing::debug!(%error, leases = left.len(), "the leases a batch renew left out could not be read; asking again next time");
                renewals.unanswered.extend(left);
                return;
            }
            Err(_) => {
                renewals.unanswered.extend(left);
                return;
            }
        };
        for given in left {
            let live_as_given = records.iter().any(|r| {
                r.resource == given.resource
                    && r.live
                    && r.holder == given.holder
                    && r.token == given.token
            });
            if !live_as_given {
                renewals.lost.push(given);
                continue;
            }
            if crate::clock::now() >= until {
                renewals.unanswered.push(given);
                continue;
            }
            let json = statements::held_json(std::slice::from_ref(&given));
            // Dropped at the budget's end: its connection is closed, never handed back
            // mid-transaction.
            let alone = crate::clock::timeout_at(
                until,
                engine.backend.renew_bounded(&engine.cx, json, millis),
            )
            .await;
            let fresh = match alone {
                Ok(rows) => engine.lease_table(rows).and_then(|rows| {
                    crate::backend::row::renewed_leases(&rows)
                        .map_err(|e| engine.cx.decode_error(e))
                }),
                Err(_) => {
                    renewals.unanswered.push(given);
                    continue;
                }
            };
            match fresh {
                Ok(fresh) => {
                    let one = Renewals::sort(std::slice::from_ref(&given), fresh);
                    renewals.renewed.extend(one.renewed);
                    // Live as given at the read, and not renewed now: lapsed or taken since.
                    renewals.lost.extend(one.lost);
                }
                Err(error) => {
                    tracing::debug!(resource = %given.resource, %error, "a lease the batch left out could not be renewed on its own; asking again next time");
                    renewals.unanswered.push(given);
                }
            }
        }
    }
}
