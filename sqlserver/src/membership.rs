//! The [`MembershipStore`] operations: a member's heartbeat, its leave and the read of a shard
//! set's members, the same for a ranked election's candidates, with the rows they decode.

use std::time::Duration;

use async_trait::async_trait;
use sea_orm::DbErr;
use tiberius::ToSql;

use super::exec::{column, split_lease, Reply, Want};
use super::names::{check_candidate, check_shard_set, check_stored_candidates, check_stored_set};
use super::SqlServerLeaseStore;
use orion_beacon::membership::{
    set_of_stored, stored_candidates, stored_set, validate_candidate_heartbeat, validate_heartbeat,
    Candidate, Holding, Member, MembershipStore,
};
use orion_beacon::StoreError;

impl SqlServerLeaseStore {
    /// The name this store keeps `shard_set`'s members under ([`stored_set`]), checked to fit
    /// `nvarchar(255)`.
    fn stored_set(&self, shard_set: &str) -> Result<String, StoreError> {
        check_shard_set(shard_set)?;
        let stored = stored_set(shard_set, &self.table)?;
        check_stored_set(shard_set, &stored)?;
        Ok(stored)
    }

    /// A heartbeat with `holding` in the count columns (`None`: `NULL`s).
    async fn beat(
        &self,
        shard_set: &str,
        member: &str,
        ttl: Duration,
        draining: bool,
        holding: Option<Holding>,
    ) -> Result<Vec<Member>, StoreError> {
        let millis = validate_heartbeat(shard_set, member, ttl)?;
        let stored = self.stored_set(shard_set)?;
        check_candidate(member)?;
        let (seconds, rest_ms) = split_lease(millis, ttl)?;
        // Kept scoped to this store's lease table (see `Holding::scoped`).
        let stored_counts = holding.map(|h| h.scoped(&self.table).stored());
        let (leases, hash) = (stored_counts.map(|c| c.0), stored_counts.map(|c| c.1));
        self.member_rows(
            &self.member_sql.heartbeat,
            &[
                &stored.as_str(),
                &member,
                &seconds,
                &rest_ms,
                &draining,
                &leases,
                &hash,
            ],
        )
        .await
    }

    /// Runs a membership read (or the heartbeat, which ends with one) and decodes its members,
    /// in byte order of their ids whatever the server's collation says.
    async fn member_rows(
        &self,
        sql: &str,
        params: &[&dyn ToSql],
    ) -> Result<Vec<Member>, StoreError> {
        self.members_ready().await?;
        let rows = match self.run(Want::Rows, sql, params).await {
            Ok(Reply::Rows(rows)) => rows,
            Ok(Reply::RowsAffected(_)) => Vec::new(),
            Err(err) => return Err(self.classify_members(err)),
        };
        let mut members = rows
            .iter()
            .map(|row| {
                let mut member = decode_member(row)?;
                member.holding = member.holding.map(|h| h.scoped(&self.table));
                // Another lease table's members (`stored_set`) are none of this store's.
                Ok::<_, DbErr>(set_of_stored(&member.shard_set, &self.table).map(|set| {
                    member.shard_set = set;
                    member
                }))
            })
            .filter_map(Result::transpose)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| StoreError::Decode {
                table: self.member_table.to_string(),
                source,
            })?;
        members.sort_by(|a, b| (&a.shard_set, &a.member).cmp(&(&b.shard_set, &b.member)));
        Ok(members)
    }

    /// The name this store keeps the candidates of `resource`'s ranked election under
    /// ([`stored_candidates`]: this store's lease table and the resource), checked to fit
    /// `nvarchar(255)`.
    fn stored_candidates(&self, resource: &str) -> Result<String, StoreError> {
        let stored = stored_candidates(resource, &self.table)?;
        check_stored_candidates(resource, &stored)?;
        Ok(stored)
    }

    /// Runs a candidate read (or the candidate heartbeat, which ends with one) once the table
    /// is known to have the rank, and decodes its candidates in byte order of their ids.
    async fn candidate_rows(
        &self,
        sql: &str,
        params: &[&dyn ToSql],
    ) -> Result<Vec<Candidate>, StoreError> {
        // Only the rank: the counts (`members_ready`) are no part of a candidate's statements.
        self.candidates_ready().await?;
        let rows = match self.run(Want::Rows, sql, params).await {
            Ok(Reply::Rows(rows)) => rows,
            Ok(Reply::RowsAffected(_)) => Vec::new(),
            Err(err) => return Err(self.classify_candidates(err)),
        };
        let mut candidates = rows
            .iter()
            .map(decode_candidate)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| StoreError::Decode {
                table: self.member_table.to_string(),
                source,
            })?;
        candidates.sort_by(|a, b| a.candidate.cmp(&b.candidate));
        Ok(candidates)
    }

    /// Deletes the live row of `member` under the stored name `stored`, then the lapsed rows
    /// under it: whether the live row was there. A shard set's leave and a candidate's.
    async fn remove(&self, stored: &str, member: &str) -> Result<bool, StoreError> {
        self.members_ready().await?;
        let rows = match self
            .run(Want::Rows, &self.member_sql.leave, &[&stored, &member])
            .await
        {
            Ok(Reply::Rows(rows)) => rows,
            Ok(Reply::RowsAffected(_)) => Vec::new(),
            Err(err) => return Err(self.classify_members(err)),
        };
        let removed = match rows.first() {
            Some(row) => column::<i32>(row, 0, "removed").map_err(|source| StoreError::Decode {
                table: self.member_table.to_string(),
                source,
            })?,
            None => 0,
        };
        Ok(removed > 0)
    }
}

/// Decodes `shard_set, member, draining, joined_at, heartbeat_at, remaining_ms, leases_held,
/// set_hash`.
fn decode_member(row: &tiberius::Row) -> Result<Member, DbErr> {
    let time = |idx, name| column::<chrono::NaiveDateTime>(row, idx, name).map(|t| t.and_utc());
    let remaining = column::<i64>(row, 5, "remaining_ms")?;
    let mut member = Member::new(
        column::<&str>(row, 0, "shard_set")?,
        column::<&str>(row, 1, "member")?,
        Duration::from_millis(u64::try_from(remaining).unwrap_or(0)),
    );
    member.draining = column::<bool>(row, 2, "draining")?;
    member.joined_at = Some(time(3, "joined_at")?);
    member.heartbeat_at = Some(time(4, "heartbeat_at")?);
    let nullable = |idx: usize, name: &str| {
        row.try_get::<i64, _>(idx)
            .map_err(|e| DbErr::Type(format!("SQL Server column {name}: {e}")))
    };
    member.holding = Holding::from_stored(nullable(6, "leases_held")?, nullable(7, "set_hash")?);
    Ok(member)
}

/// Decodes `member, candidate_rank, live_for_ms, remaining_ms` (a negative time, from clocks
/// of concurrent batches, as zero).
fn decode_candidate(row: &tiberius::Row) -> Result<Candidate, DbErr> {
    let millis = |ms: i64| Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    Ok(Candidate::new(
        column::<&str>(row, 0, "member")?,
        column::<i64>(row, 1, "candidate_rank")?,
        millis(column::<i64>(row, 2, "live_for_ms")?),
        millis(column::<i64>(row, 3, "remaining_ms")?),
    ))
}

/// The membership of shard sets, and the candidacy of ranked electors, in the store's
/// membership table ([`with_member_table`](SqlServerLeaseStore::with_member_table), created by
/// [`migrate_members`](SqlServerLeaseStore::migrate_members)); the statements are described in
/// the [module docs](super).
#[async_trait]
impl MembershipStore for SqlServerLeaseStore {
    async fn heartbeat(
        &self,
        shard_set: &str,
        member: &str,
        ttl: Duration,
        draining: bool,
    ) -> Result<Vec<Member>, StoreError> {
        self.beat(shard_set, member, ttl, draining, None).await
    }

    /// Writes `holding` with the heartbeat (see
    /// [`migrate_members`](SqlServerLeaseStore::migrate_members)).
    async fn heartbeat_holding(
        &self,
        shard_set: &str,
        member: &str,
        ttl: Duration,
        draining: bool,
        holding: Holding,
    ) -> Result<Vec<Member>, StoreError> {
        self.beat(shard_set, member, ttl, draining, Some(holding))
            .await
    }

    fn check_election(&self, resource: &str) -> Result<(), StoreError> {
        self.stored_candidates(resource).map(drop)
    }

    async fn leave(&self, shard_set: &str, member: &str) -> Result<bool, StoreError> {
        let stored = self.stored_set(shard_set)?;
        check_candidate(member)?;
        self.remove(&stored, member).await
    }

    async fn members(&self, shard_set: &str) -> Result<Vec<Member>, StoreError> {
        let stored = self.stored_set(shard_set)?;
        let shard_set = stored.as_str();
        self.member_rows(&self.member_sql.members, &[&shard_set])
            .await
    }

    /// One batch (see the [module docs](super)); a membership table without the rank
    /// ([`migrate_members`](SqlServerLeaseStore::migrate_members)) refuses it with
    /// [`StoreError::OutdatedSchema`] naming `AddMemberRank`.
    async fn candidate_heartbeat(
        &self,
        resource: &str,
        candidate: &str,
        ttl: Duration,
        rank: i64,
    ) -> Result<Vec<Candidate>, StoreError> {
        let (election, millis) =
            validate_candidate_heartbeat(resource, candidate, ttl, &self.table)?;
        check_stored_candidates(resource, &election)?;
        check_candidate(candidate)?;
        let (seconds, rest_ms) = split_lease(millis, ttl)?;
        self.candidate_rows(
            &self.member_sql.candidate_heartbeat,
            &[&election.as_str(), &candidate, &seconds, &rest_ms, &rank],
        )
        .await
    }

    /// The member leave's batch, on the election's rows (it needs no rank).
    async fn candidate_leave(&self, resource: &str, candidate: &str) -> Result<bool, StoreError> {
        let election = self.stored_candidates(resource)?;
        check_candidate(candidate)?;
        self.remove(&election, candidate).await
    }

    async fn candidates(&self, resource: &str) -> Result<Vec<Candidate>, StoreError> {
        let election = self.stored_candidates(resource)?;
        let election = election.as_str();
        self.candidate_rows(&self.member_sql.candidates, &[&election])
            .await
    }
}
