//! A leader's way out: the term's work wound down within the grace period, then the lease
//! released exactly (or left to lapse where releasing it would not be safe).

use super::*;

impl Runner {
    /// Shutdown of a leader: keeps renewing the lease while the term's work winds down, for
    /// at most the grace period, then cuts the work off. Returns whether the lease is still
    /// ours and the work has stopped, i.e. whether releasing it is safe.
    ///
    /// The work never runs past the lease: if a renew is refused or the local deadline comes,
    /// the work is cut off at once; if the work does not stop when cut off, the lease is left
    /// to lapse on its own rather than released under it.
    pub(super) async fn drain(&self, active: &mut Active, failures: &mut u32) -> bool {
        let grace_end = later(crate::clock::now(), self.config.timing.grace_period);
        loop {
            let deadline = active.term.local_deadline();
            if crate::clock::now() >= deadline {
                active.term.cut_off();
                warn!("the lease ran out while leader work was winding down; work dropped");
                return false;
            }
            tokio::select! {
                biased;
                _ = self.stop.abort.cancelled() => {
                    active.term.cut_off();
                    return false;
                }
                _ = self.work_gate.write() => return true,
                _ = sleep_until(grace_end) => {
                    active.term.cut_off();
                    warn!(grace = ?self.config.timing.grace_period, "leader work did not finish within the grace period; dropped");
                    // A dropped future lets go at once; give it a moment to unwind.
                    if timeout(UNWIND, self.work_gate.write()).await.is_ok() {
                        return true;
                    }
                    warn!("leader work did not stop when dropped; not releasing, the lease will lapse");
                    return false;
                }
                _ = sleep_until(active.next_renew.min(deadline)) => {}
            }
            if crate::clock::now() >= deadline {
                continue;
            }
            let sent = crate::clock::now();
            let result = match self.ask_store(deadline).await {
                Ok(result) => result,
                Err(_) => {
                    active.term.cut_off();
                    return false;
                }
            };
            self.probe.store_call(true, sent, &result);
            match result {
                Ok(Ok(LeaseOutcome::Renewed(lease))) if lease.token == active.term.token() => {
                    *failures = 0;
                    active
                        .term
                        .extend(local_deadline(&lease, sent, &self.config));
                    active.next_renew = later(sent, self.config.timing.renew_interval);
                    debug!(token = %lease.token, "renewed while leader work winds down");
                    active.granted = lease;
                }
                Ok(Err(err)) => {
                    *failures += 1;
                    let wait = backoff(*failures, self.config.timing.renew_interval);
                    log_store_error(&err, *failures, wait, "store error while renewing");
                    active.next_renew = later(crate::clock::now(), wait);
                }
                // Denied, a new term, or no answer before the deadline: the lease is gone.
                _ => {
                    active.term.cut_off();
                    warn!("the lease was lost while leader work was winding down; work dropped");
                    return false;
                }
            }
        }
    }

    /// Releases a live lease of ours that no term may begin on (see [`Next::Release`]): exactly
    /// that write, so it can never end a later one; bounded by `lapsed`, when the lease runs out
    /// anyway. Returns when to contend again, and whether the store no longer held that write:
    ///
    /// - released: at once;
    /// - no longer held (renewed since, say by a renew still in flight): at once the first
    ///   time, after a retry interval (or at `lapsed`, if sooner) when the last release found
    ///   its write gone too (`gone_before`), so a store that never matches makes no hot loop;
    /// - the release failed: at `lapsed`, since asking earlier would only renew the lease again.
    pub(super) async fn release_unled(
        &self,
        lease: &Lease,
        lapsed: Instant,
        gone_before: bool,
    ) -> Result<(Instant, bool), Stopped> {
        info!(
            token = %lease.token,
            "the store granted a lease no new term may begin on (an earlier term's token, or \
             too little left); releasing that write to contend for a new token"
        );
        let call = self.store.release_lease(lease);
        let now = crate::clock::now;
        Ok(match self.abortable(timeout_at(lapsed, call)).await? {
            Ok(Ok(true)) => {
                debug!("released");
                (now(), false)
            }
            Ok(Ok(false)) if !gone_before => {
                debug!("not released: the store no longer holds that write");
                (now(), true)
            }
            Ok(Ok(false)) => {
                debug!("not released again: the store no longer holds that write");
                let retry = jittered(self.config.retry_interval, self.config.jitter);
                (later(now(), retry).min(lapsed.max(now())), true)
            }
            Ok(Err(err)) => {
                warn!(error = %err, "release failed; contending again once the lease has lapsed");
                (lapsed.max(now()), false)
            }
            Err(_) => {
                warn!("release timed out; contending again once the lease has lapsed");
                (lapsed.max(now()), false)
            }
        })
    }

    /// Releases the write `granted` came from, and nothing later: a release that is delayed
    /// can never end a renew made since, even by a new elector that reuses our candidate id.
    /// Whether the store released it.
    pub(super) async fn release(&self, granted: &Lease) -> bool {
        let call = self.store.release_lease(granted);
        match timeout(self.config.timing.lease, call).await {
            Ok(Ok(true)) => {
                info!("released the lease");
                return true;
            }
            // The row no longer holds our last known write: renewed since (by a new elector
            // with our id, or by a renew whose answer we never got), taken, or expired.
            Ok(Ok(false)) => info!(
                "not released: the store no longer holds the last write this elector saw; \
                 the lease lapses on its own"
            ),
            Ok(Err(err)) => warn!(error = %err, "release failed; the lease will lapse on its own"),
            Err(_) => warn!("release timed out; the lease will lapse on its own"),
        }
        false
    }
}
