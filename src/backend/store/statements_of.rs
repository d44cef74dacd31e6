//! The statements the store would send, for inspection and tests (no SQL runs).

use super::*;

impl SeaOrmLeaseStore {
    /// The exact statement [`acquire_or_renew`](LeaseStore::acquire_or_renew) sends for these
    /// arguments on this connection's backend (PostgreSQL, SQLite, MariaDB; the MySQL
    /// transaction form sends this upsert and then a read): for `EXPLAIN`, audits and
    /// benchmarks. The values are bound parameters.
    pub fn acquire_statement(
        &self,
        resource: &str,
        candidate: &str,
        lease: Duration,
    ) -> Result<sea_orm::Statement, StoreError> {
        let millis = validate_request(resource, candidate, lease)?;
        let engine = self.engine()?;
        Ok(engine.acquire_prepared()?.bind(resource, candidate, millis))
    }

    /// The statements a rate-limit decision ([`RateLimitStore::take_permit`]) sends for `key`
    /// under `quota` on this connection's backend, in order: for `EXPLAIN`, audits and
    /// benchmarks. One upsert with `RETURNING` on PostgreSQL, SQLite and MariaDB; where the
    /// server is known to have no `RETURNING` (MySQL 8), the upsert and the read of the row it
    /// left, in one transaction. The values are bound parameters.
    ///
    /// [`RateLimitStore::take_permit`]: crate::RateLimitStore::take_permit
    pub fn rate_limit_statements(
        &self,
        key: &str,
        quota: &crate::Quota,
    ) -> Result<Vec<sea_orm::Statement>, StoreError> {
        crate::rate_limit::validate_key(key)?;
        let engine = self.engine()?;
        let decision = super::super::rate_limits::RateDecision::new(&engine.cx, key, quota);
        engine.backend.rate_statements(&engine.cx, &decision)
    }

    /// The statements [`renew_all`](LeaseStore::renew_all) sends for a batch of `held`, in
    /// order, on this connection's backend: for `EXPLAIN`, audits and tests. One statement on
    /// PostgreSQL and SQLite; on MySQL/MariaDB the locking read, the update and the read of
    /// what it renewed, in one transaction (the update sent names only the rows the locking
    /// read returned). Not included: the renews of leases the batch left out, each alone.
    /// The values are bound parameters.
    pub fn renew_all_statements(
        &self,
        held: &[Lease],
        lease: Duration,
    ) -> Result<Vec<sea_orm::Statement>, StoreError> {
        let millis = validate_batch(held, lease)?;
        let engine = self.engine()?;
        engine
            .backend
            .renew_statements(&engine.cx, statements::held_json(held), millis)
            .map_err(|e| StoreError::Database(e.into()))
    }

    /// The exact statement [`release`](LeaseStore::release) sends for these arguments on this
    /// connection's backend (on PostgreSQL it also notifies followers): for `EXPLAIN`, audits
    /// and tests. The values are bound parameters.
    pub fn release_statement(
        &self,
        resource: &str,
        candidate: &str,
    ) -> Result<sea_orm::Statement, StoreError> {
        validate_resource(resource)?;
        validate_candidate(candidate)?;
        Ok(self
            .engine()?
            .release_prepared()?
            .bind(resource, candidate, 0))
    }

    /// The exact statement [`release_lease`](LeaseStore::release_lease) sends for `lease` on
    /// this connection's backend (on PostgreSQL it also notifies followers), or `None` when
    /// `lease` carries no expiry and so names no write (it then releases nothing). The values
    /// are bound parameters.
    pub fn release_lease_statement(
        &self,
        lease: &Lease,
    ) -> Result<Option<sea_orm::Statement>, StoreError> {
        validate_resource(&lease.resource)?;
        validate_candidate(&lease.holder)?;
        let engine = self.engine()?;
        let cx = &engine.cx;
        let Some(update) = statements::release_write(cx.dialect, &cx.table_iden(), lease) else {
            return Ok(None);
        };
        Ok(Some(engine.backend.release_lease_statement(cx, update)))
    }
}
