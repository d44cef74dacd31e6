//! The elector's builder: its options, checked once at `build`.

use super::*;

/// Builds an [`Elector`]: `Elector::builder(store).resource("nightly-report").build()?`.
#[must_use]
pub struct ElectorBuilder {
    pub(super) store: Arc<dyn LeaseStore>,
    pub(super) fence: Option<crate::backend::SeaOrmLeaseStore>,
    pub(super) renewer: Option<crate::hold::renewer::Renewer>,
    pub(super) options: Options,
    pub(super) health_window: Option<Duration>,
}

impl ElectorBuilder {
    /// The resource to elect a leader for (required).
    pub fn resource(mut self, resource: impl Into<String>) -> Self {
        self.options.resource = Some(resource.into());
        self
    }

    /// This candidate's id. Default: host name, process id and a random suffix, unique per
    /// elector. Two electors with the same id are the *same* candidate to the store.
    pub fn candidate_id(mut self, id: impl Into<String>) -> Self {
        self.options.candidate = Some(id.into());
        self
    }

    /// A payload written into the lease by every acquire and renew of this candidate (its
    /// address, a version; at most [`MAX_PAYLOAD_LEN`](crate::store::MAX_PAYLOAD_LEN) bytes,
    /// checked by [`build`](Self::build)): the other candidates see it as the leader's in
    /// [`Leadership::Follower`]. Default: none.
    pub fn payload(mut self, payload: impl Into<String>) -> Self {
        self.options.payload = Some(payload.into());
        self
    }

    timing_setter!(
        /// How long a granted lease lasts without a renew. Default 15 s.
        lease_duration(lease) => options.timing.lease
    );

    timing_setter!(
        /// How often the leader renews. Default 5 s; twice it must fit in the lease minus the
        /// step-down margin, so one failed renew can be retried in time.
        renew_interval(interval) => options.timing.renew_interval
    );

    /// How often a follower tries to acquire. Default 2 s. A follower told that the lease ends
    /// sooner tries right after it ends instead.
    pub fn retry_interval(mut self, interval: Duration) -> Self {
        self.options.retry_interval = Some(interval);
        self
    }

    timing_setter!(
        /// How long before its last grant would run out (counted from when that request was sent)
        /// the leader steps down if it could not renew. Default: a tenth of the lease.
        ///
        /// The margin must cover how much the database's clock can gain on the host's monotonic
        /// clock over one lease (the host's clock running slow makes the deadline come later), plus
        /// the time between a `is_leader()` check and the action it guards. At least [`min_step_down_margin`] (`lease / 1000`, and 1 ms), less
        /// than half the lease.
        step_down_margin(margin) => options.timing.step_down_margin
    );

    timing_setter!(
        /// How long leader work ([`ElectorHandle::run_as_leader`]) may take to return after a
        /// shutdown is requested, while the elector keeps renewing the lease; then it is dropped and
        /// the lease released. Work of a term that was lost (not shut down) is dropped at once,
        /// since the lease no longer covers it. Default 5 s, at most [`MAX_INTERVAL`].
        grace_period(grace) => options.timing.grace_period
    );

    /// Random spread of follower retries, as a fraction (0.0 to 0.5). Default 0.1 (±10 %).
    pub fn jitter(mut self, jitter: f64) -> Self {
        self.options.jitter = Some(jitter);
        self
    }

    /// Whether shutdown releases the lease (so a follower takes over at its next attempt
    /// instead of waiting for the lease to lapse). Default true.
    pub fn release_on_shutdown(mut self, release: bool) -> Self {
        self.options.release_on_shutdown = Some(release);
        self
    }

    /// Whether this elector's renews go out together with those of the other leaders of this
    /// process whose electors share its [`SeaOrmLeaseStore`](crate::SeaOrmLeaseStore) (clones
    /// of one store) and lease duration: one [`renew_all`](LeaseStore::renew_all) statement
    /// per round for up to 1,000 of them, instead of one each. A batch goes out when its first
    /// leader is due and takes every leader waiting then, so a leader may renew before its
    /// renew interval is up, never after; its deadline counts from the instant the shared
    /// statement was sent, as for a renew of its own. A lease the batch finds lost, and every
    /// lease of a batch that failed, is asked about by its elector on its own at once.
    /// PostgreSQL and SQLite only: on MySQL/MariaDB, with other stores or wrappers, and in
    /// handovers and shutdowns leaders renew lease by lease.
    ///
    /// Default true. A leader with nothing to go with (no other hold of the store due then)
    /// renews with its own statement. A batch never waits for a row another transaction holds
    /// (a leader's own fenced transaction): it leaves that lease out, reads it, and tries it
    /// once more on its own with a short wait; a leader still answered busy then renews at once
    /// with its own acquire-or-renew, which waits for the row as a renew alone does, so
    /// renewing together never answers a leader busy where renewing alone would have renewed
    /// it. Such a round costs the batch a read and a renew of that row, and holds back the
    /// answers of the others in it by the short wait (up to about 400 ms); set false for a
    /// leader whose fenced transactions hold its row through most of its renews.
    pub fn renew_together(mut self, together: bool) -> Self {
        self.options.renew_together = Some(together);
        self
    }

    /// Whether this candidate campaigns (default true). With `false` it only watches: it reads
    /// the lease at its retry interval (sooner when a release notification names the resource
    /// or the leader's lease ends first) and follows whoever holds it live, with their payload
    /// ([`Leadership::Follower`]), but never asks for the lease: it never leads, never takes an
    /// offer (a leader's [`ElectorHandle::hand_over_to`] naming it answers
    /// [`Handover::NotTaken`] once the offer lapses), and its
    /// [`Health`] is a follower's. A node that must not lead (a canary, a node being drained, a
    /// read replica's process) keeps its view of the leader this way.
    pub fn campaign(mut self, campaign: bool) -> Self {
        self.options.campaign = Some(campaign);
        self
    }

    /// This candidate's rank: of the live candidates of the resource, the one ranking highest
    /// is preferred as leader. A leader that sees a live candidate ranking strictly higher
    /// (the highest such, the smallest id among equals) hands over to it with a named handover
    /// ([`ElectorHandle::hand_over_to`]), once that candidate has been live for
    /// [`prefer_after`](Self::prefer_after); the offer stands for two retry intervals (with
    /// their jitter), at most a lease. Each automatic handover moves leadership strictly up
    /// the ranks, so it never loops; a successor that does not take the offer is not offered
    /// the lease again for the larger of `prefer_after` and the lease, then twice that, and so
    /// on (at most 64 times it).
    ///
    /// A ranked candidate heartbeats its rank into the membership table every renew interval
    /// (live for the lease minus the step-down margin, a leader's never past its term), leaves
    /// it on shutdown before the release and for a step-down's stay-out, and begins afresh
    /// after a lost term; the
    /// candidates and their ranks show in [`ElectorHandle::candidacy`], [`Health`] and the
    /// command line's `candidates`. The store must keep candidates
    /// ([`LeaseStore::membership`]: the SeaORM, SQL Server and in-memory stores do; on a
    /// database, the membership table with the `AddMemberRank` migration); [`build`](Self::build) refuses a
    /// store that keeps none, and a candidate that does not campaign. Give every candidate of
    /// the resource a rank: an unranked leader never hands over, and an unranked candidate is
    /// never handed to. Leases decide who leads; ranks only steer a handover, so a wrong or
    /// stale view of the candidates can delay or misplace leadership, never grant it twice.
    pub fn rank(mut self, rank: i64) -> Self {
        self.options.rank = Some(rank);
        self
    }

    /// How long a candidate ranking higher than the leader must have been live (by the
    /// database clock, without a lapse of its heartbeats) before the leader hands over to it.
    /// Default: the lease duration; zero hands over as soon as the leader sees it. At most
    /// [`MAX_INTERVAL`]. Only with a [`rank`](Self::rank).
    pub fn prefer_after(mut self, after: Duration) -> Self {
        self.options.prefer_after = Some(after);
        self
    }

    /// Validates the options, and asks the store whether it can work at all (see
    /// [`LeaseStore::validate`]): a connection to a backend this build does not support fails
    /// here, not later in a retry loop.
    pub fn build(self) -> Result<Elector, ConfigError> {
        let config = self.options.validate()?;
        self.store.validate()?;
        let health_window = health::window(self.health_window, &config)?;
        let members = match config.rank {
            None => None,
            Some(_) => {
                let Some(members) = self.store.membership() else {
                    return Err(ConfigError::Rank {
                        reason: "this store keeps no candidates (LeaseStore::membership is \
                                 None; a wrapper store should forward it)",
                    });
                };
                // What every heartbeat would refuse, refused here: the candidates' stored
                // name must fit, and the id must be one an offer can name.
                members.check_election(&config.resource)?;
                crate::store::validate_offer_target(&config.candidate)?;
                Some(members)
            }
        };
        Ok(Elector {
            store: self.store,
            fence: self.fence,
            renewer: self.renewer,
            config: Arc::new(config),
            health_window,
            members,
        })
    }
}
