//! A round's rebalance: the plan from the live members and the leases, then its acquires,
//! handovers and releases within the round's budget.

use super::*;

impl Runner {
    /// Looks at which resources are free, plans, hands over, acquires. The look is skipped
    /// when this round's heartbeat `answered` and the members' counts say no resource can be
    /// free (see [`nothing_free`]), and no acquire of this node awaits its answer.
    pub(super) async fn rebalance(
        &self,
        st: &mut State,
        draining: bool,
        answered: bool,
        started: Instant,
        lost: &Arc<Notify>,
    ) {
        if self.over_budget(st, started) {
            // The renew and the heartbeat took the round's time: a slow database. No look,
            // so nothing becomes "abandoned" by the gap, and nothing taken soon after says
            // anything about the other members.
            st.free_since.forget();
            st.troubled_at = Some(crate::clock::now());
            return;
        }
        let looked = crate::clock::now();
        let announced = std::mem::take(&mut st.look_next);
        let skip = answered
            && !announced
            && st.uncertain.is_empty()
            && nothing_free(
                &st.members,
                &self.config.member,
                self.config.set_hash,
                self.config.resources.len(),
                self.config.timing.lease,
                self.config.interval(),
            );
        let (records, free) = if skip {
            // As a look that found every resource led.
            (Vec::new(), HashSet::new())
        } else {
            let resources: Vec<String> = self
                .config
                .resources
                .iter()
                .map(|r| r.to_string())
                .collect();
            let records = match self.bounded(self.store.current_all(&resources)).await {
                Ok(records) => records,
                Err(err) => {
                    st.look_next |= announced; // still owed
                    let Some(err) = self.transient(st, err) else {
                        return;
                    };
                    warn!(error = %err, "could not read the shard set's leases; no rebalancing this round");
                    st.free_since.forget();
                    return;
                }
            };
            let live: HashSet<&str> = records
                .iter()
                .filter(|r| r.live)
                .map(|r| r.resource.as_str())
                .collect();
            let free: HashSet<Arc<str>> = self
                .config
                .resources
                .iter()
                .filter(|r| !live.contains(&***r))
                .cloned()
                .collect();
            (records, free)
        };
        let Free {
            free,
            orphans,
            abandoned,
        } = st.free_since.look(
            free,
            looked,
            self.config.interval(),
            self.config.timing.lease,
        );
        self.release_strays(st, &records, looked).await;
        let p = st.plan_round(&self.config, &free, &orphans, &abandoned, looked, draining);
        st.share = p.target;
        for r in &p.release {
            if let Some(h) = st.held.remove(r) {
                info!(resource = %r, token = %h.term.token(), share = p.target, "handing over");
                self.hand_over(st, h, LossReason::HandedOver, true);
            }
        }
        self.publish(st);
        let mut spare = p.spare.into_iter();
        let mut queue: std::collections::VecDeque<Arc<str>> = p.acquire.into();
        while let Some(r) = queue.pop_front() {
            if self.over_budget(st, started) {
                debug!("round budget spent; acquiring the rest next round");
                return;
            }
            let sent = crate::clock::now();
            let acquire =
                self.store
                    .acquire_or_renew(&r, &self.config.member, self.config.timing.lease);
            match self.bounded(acquire).await {
                Ok(LeaseOutcome::Acquired(lease)) => {
                    let deadline = self.deadline(&lease, sent);
                    if deadline <= crate::clock::now() {
                        continue; // too little of it left to lead on; it lapses
                    }
                    info!(resource = %r, token = %lease.token, "leading");
                    let term = LeaderTerm::new(
                        lease.token,
                        r.clone(),
                        self.config.member.clone(),
                        deadline,
                        self.fence.clone(),
                    );
                    tokio::spawn(watchdog(term.clone(), lost.clone()));
                    st.uncertain.remove(&r);
                    // An older handover of this resource: the store granted a newer term, so
                    // that lease is gone; its work stops now, and it leaves the renew batch.
                    st.handing.retain(|h| {
                        let old = *h.lease.resource == *r;
                        if old {
                            h.term.cut_off();
                        }
                        !old
                    });
                    if abandoned.contains(&r) {
                        let may_keep = st.telling(&self.config.member, &r, Duration::ZERO, sent);
                        st.keeps.taken(
                            r.clone(),
                            crate::clock::now(),
                            self.config.timing.lease,
                            may_keep,
                        );
                    }
                    st.held.insert(r, Held { term, lease });
                    self.publish(st);
                }
                Ok(LeaseOutcome::Renewed(lease)) if st.uncertain.remove(&r).is_some() => {
                    // This node's own earlier acquire, granted after it stopped waiting.
                    warn!(resource = %r, token = %lease.token,
                        "an acquire that got no answer in time was granted after all; releasing that lease");
                    if let Err(err) = self.bounded(self.store.release_lease(&lease)).await {
                        warn!(resource = %r, error = %err, "release failed; the lease lapses instead");
                    }
                }
                Ok(LeaseOutcome::Renewed(lease)) => {
                    // A live lease of this member id that this node does not hold: another
                    // process with the same id (or this node's own term that outlived its
                    // deadline). Never lead it twice: leave it to lapse.
                    error!(resource = %r, token = %lease.token, member = %self.config.member,
                        "this member id already holds a live lease this node does not lead: \
                         is another process running with the same member id? Not leading it");
                }
                Ok(LeaseOutcome::Denied(d)) => {
                    debug!(resource = %r, holder = ?d.holder, "taken by another member first");
                    // Below the share still: try another free resource in its place.
                    if st.held.len() < st.share {
                        queue.extend(spare.next());
                    }
                }
                Err(err) => {
                    let Some(err) = self.transient(st, err) else {
                        return;
                    };
                    if matches!(err, Bounded::Timeout(_)) {
                        st.uncertain.insert(r.clone(), sent);
                    }
                    warn!(resource = %r, error = %err, "acquire failed; trying again next round");
                    return;
                }
            }
        }
    }
}
