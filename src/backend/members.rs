//! The membership table of shard sets on the SeaORM backends, and the batched read of lease
//! rows a shard set looks at.
//!
//! A heartbeat is one upsert (`INSERT ... ON CONFLICT (shard_set, member) DO UPDATE`, MySQL's
//! `ON DUPLICATE KEY UPDATE`), its times from the database clock, then one read of the set's
//! live members. Membership decides no grant (the leases do), but a heartbeat, a leave and the
//! read of the members decide a shard set's share, so they run like every statement of the
//! store: on PostgreSQL and MariaDB on a pooled connection checked to be outside any abandoned
//! transaction (`sessions`; behind a transaction-pooling proxy, unnamed in a transaction of
//! their own), with the store's retry.

use async_trait::async_trait;
use orion_beacon_entity::lease;
use orion_beacon_entity::member::Column;
use sea_orm::sea_query::{
    Alias, DeleteStatement, Expr, ExprTrait, InsertStatement, OnConflict, Query, SelectStatement,
};
use sea_orm::{DbErr, QueryResult};

use super::dialect::Dialect;
use super::row::{Decode as _, Row};
use super::statements::{returned_row, with_payload};
use super::store::SeaOrmLeaseStore;
use crate::membership::{
    set_of_stored, stored_candidates, stored_set, validate_candidate_heartbeat, validate_heartbeat,
    Candidate, Holding, Member, MembershipStore,
};
use crate::store::validate_candidate;
use crate::{error::StoreError, lease::LeaseRecord};

/// Resources read by one statement of [`current_all`](crate::LeaseStore::current_all): far
/// below every backend's limit on bound parameters.
pub(crate) const READ_CHUNK: usize = 1000;

/// The heartbeat of `member`: its row, live for `millis` from the write, with its draining
/// flag and what it leads (`None` writes NULLs); `joined_at` as [`joined_at_update`] has it.
pub(crate) fn heartbeat(
    d: &dyn Dialect,
    table: &Alias,
    shard_set: &str,
    member: &str,
    millis: i64,
    draining: bool,
    holding: Option<Holding>,
) -> Result<InsertStatement, DbErr> {
    let mut updates = vec![
        (Column::JoinedAt, joined_at_update(d, table)),
        (Column::Draining, Expr::val(draining)),
        (Column::HeartbeatAt, d.now()),
        (Column::ExpiresAt, d.lease_end(millis)),
    ];
    let mut columns = vec![
        Column::ShardSet,
        Column::Member,
        Column::Draining,
        Column::JoinedAt,
        Column::HeartbeatAt,
        Column::ExpiresAt,
    ];
    let mut values = vec![
        Expr::val(shard_set),
        Expr::val(member),
        Expr::val(draining),
        d.now(),
        d.now(),
        d.lease_end(millis),
    ];
    // Stored as the signed bigints of the columns; read back the same way. `counted_at` takes
    // the heartbeat's own time, so that a later heartbeat without counts (an older version's)
    // leaves them stale, and unread.
    let stored = holding.map(Holding::stored);
    let (leases, hash) = (stored.map(|s| s.0), stored.map(|s| s.1));
    let at = if holding.is_some() {
        d.now()
    } else {
        Expr::cust("NULL")
    };
    for (column, value) in [
        (Column::LeasesHeld, Expr::val(leases)),
        (Column::SetHash, Expr::val(hash)),
        (Column::CountedAt, at),
    ] {
        columns.push(column);
        values.push(value.clone());
        updates.push((column, value));
    }
    let on_conflict = OnConflict::columns([Column::ShardSet, Column::Member])
        .values(updates)
        .to_owned();
    let mut stmt = Query::insert();
    stmt.into_table(table.clone())
        .columns(columns)
        .values(values)
        .map_err(|e| DbErr::Custom(e.to_string()))?
        .on_conflict(on_conflict);
    Ok(stmt)
}

/// An upsert's new `joined_at`: now if the row had lapsed (a member or candidate that comes
/// back is a new membership), else the old one. Assign it first: MySQL assigns in order and
/// must read the old expiry.
fn joined_at_update(d: &dyn Dialect, table: &Alias) -> Expr {
    let old = |c: Column| Expr::col((table.clone(), c));
    Expr::case(old(Column::ExpiresAt).lte(d.now()), d.now())
        .finally(old(Column::JoinedAt))
        .into()
}

/// The heartbeat of `candidate` of a ranked election (kept under the stored name `election`):
/// its row, live for `millis` from the write, with its rank. `joined_at` restarts when the row
/// had lapsed, as a member's does; the count columns stay NULL.
pub(crate) fn candidate_heartbeat(
    d: &dyn Dialect,
    table: &Alias,
    election: &str,
    candidate: &str,
    millis: i64,
    rank: i64,
) -> Result<InsertStatement, DbErr> {
    let updates = vec![
        (Column::JoinedAt, joined_at_update(d, table)),
        (Column::HeartbeatAt, d.now()),
        (Column::ExpiresAt, d.lease_end(millis)),
        (Column::CandidateRank, Expr::val(rank)),
    ];
    let on_conflict = OnConflict::columns([Column::ShardSet, Column::Member])
        .values(updates)
        .to_owned();
    let mut stmt = Query::insert();
    stmt.into_table(table.clone())
        .columns([
            Column::ShardSet,
            Column::Member,
            Column::Draining,
            Column::JoinedAt,
            Column::HeartbeatAt,
            Column::ExpiresAt,
            Column::CandidateRank,
        ])
        .values([
            Expr::val(election),
            Expr::val(candidate),
            Expr::val(false),
            d.now(),
            d.now(),
            d.lease_end(millis),
            Expr::val(rank),
        ])
        .map_err(|e| DbErr::Custom(e.to_string()))?
        .on_conflict(on_conflict);
    Ok(stmt)
}

/// The live candidates of a ranked election (its stored name), with their rank, how long they
/// have been live (negated: the time from now back to `joined_at`) and their remaining time.
pub(crate) fn live_candidates(d: &dyn Dialect, table: &Alias, election: &str) -> SelectStatement {
    Query::select()
        .column(Column::Member)
        .column(Column::CandidateRank)
        .expr(d.remaining_millis(Expr::col(Column::JoinedAt)))
        .expr(d.remaining_millis(Expr::col(Column::ExpiresAt)))
        .from(table.clone())
        .and_where(Expr::col(Column::ShardSet).eq(election))
        .and_where(Expr::col(Column::ExpiresAt).gt(d.now()))
        .and_where(Expr::col(Column::CandidateRank).is_not_null())
        .to_owned()
}

/// The live members of `shard_set` (all sets for `None`), with their remaining time and what
/// they lead.
pub(crate) fn live(d: &dyn Dialect, table: &Alias, shard_set: Option<&str>) -> SelectStatement {
    let mut select = Query::select();
    select
        .columns([
            Column::ShardSet,
            Column::Member,
            Column::Draining,
            Column::JoinedAt,
            Column::HeartbeatAt,
        ])
        .expr(d.remaining_millis(Expr::col(Column::ExpiresAt)))
        .from(table.clone())
        .and_where(Expr::col(Column::ExpiresAt).gt(d.now()));
    // The counts of the member's last heartbeat only. The names are not quoted: SQLite takes a
    // quoted name that is no column for a string, and a table without them would read as one
    // whose counts were never written instead of failing.
    select.exprs([
        Expr::cust("CASE WHEN counted_at = heartbeat_at THEN leases_held END"),
        Expr::cust("CASE WHEN counted_at = heartbeat_at THEN set_hash END"),
    ]);
    if let Some(set) = shard_set {
        select.and_where(Expr::col(Column::ShardSet).eq(set));
    }
    select
}

/// The row of `member`, if it is live.
pub(crate) fn leave(
    d: &dyn Dialect,
    table: &Alias,
    shard_set: &str,
    member: &str,
) -> DeleteStatement {
    Query::delete()
        .from_table(table.clone())
        .and_where(Expr::col(Column::ShardSet).eq(shard_set))
        .and_where(Expr::col(Column::Member).eq(member))
        .and_where(Expr::col(Column::ExpiresAt).gt(d.now()))
        .to_owned()
}

/// The lapsed rows of `shard_set` (members that died without leaving).
pub(crate) fn prune(d: &dyn Dialect, table: &Alias, shard_set: &str) -> DeleteStatement {
    Query::delete()
        .from_table(table.clone())
        .and_where(Expr::col(Column::ShardSet).eq(shard_set))
        .and_where(Expr::col(Column::ExpiresAt).lte(d.now()))
        .to_owned()
}

/// The lease rows of `resources`, with the resource last (as the operator's list has it).
pub(crate) fn leases_of(d: &dyn Dialect, table: &Alias, resources: &[String]) -> SelectStatement {
    let mut exprs = returned_row(d);
    exprs.push(Expr::col(lease::Column::Resource));
    let exprs = with_payload(exprs);
    Query::select()
        .exprs(exprs)
        .from(table.clone())
        .and_where(Expr::col(lease::Column::Resource).is_in(resources.iter().map(String::as_str)))
        .to_owned()
}

fn decode_member(row: &QueryResult) -> Result<Member, DbErr> {
    let remaining: i64 = row.try_get_by_index(5)?;
    let mut member = Member::new(
        row.try_get_by_index::<String>(0)?,
        row.try_get_by_index::<String>(1)?,
        std::time::Duration::from_millis(u64::try_from(remaining).unwrap_or(0)),
    );
    member.draining = row.try_get_by_index(2)?;
    member.joined_at = Some(row.try_get_by_index(3)?);
    member.heartbeat_at = Some(row.try_get_by_index(4)?);
    member.holding = Holding::from_stored(row.try_get_by_index(6)?, row.try_get_by_index(7)?);
    Ok(member)
}

fn decode_candidate(row: &QueryResult) -> Result<Candidate, DbErr> {
    let millis = |ms: i64| std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    let since: i64 = row.try_get_by_index(2)?;
    let remaining: i64 = row.try_get_by_index(3)?;
    Ok(Candidate::new(
        row.try_get_by_index::<String>(0)?,
        row.try_get_by_index::<i64>(1)?,
        millis(since.saturating_neg()),
        millis(remaining),
    ))
}

impl SeaOrmLeaseStore {
    /// Every live member of every shard set of this store's lease table (another lease table's
    /// groups on the same membership table are left out), ordered by shard set and member id:
    /// the operator's view.
    pub async fn list_members(&self) -> Result<Vec<Member>, StoreError> {
        self.read_members(None).await
    }

    /// Checks, once per store, that the membership table has every column this version's
    /// migrations give it (see `Engine::ready`; its last step is `AddMemberHolding`).
    async fn members_ready(&self) -> Result<(), StoreError> {
        let engine = self.engine()?;
        let cx = &engine.cx;
        cx.member_schema_checked
            .get_or_try_init(|| async {
                let probe = Query::select()
                    .expr(Expr::cust("leases_held, set_hash, counted_at"))
                    .from(Alias::new(&*cx.member_table))
                    .limit(0)
                    .to_owned();
                let found = engine.plain(cx.build(&probe)).await;
                found.map(|_| ()).map_err(|e| self.member_table_error(e))
            })
            .await
            .copied()
    }

    /// A heartbeat with `holding` in the count columns (`None`: NULLs).
    async fn beat(
        &self,
        shard_set: &str,
        member: &str,
        ttl: std::time::Duration,
        draining: bool,
        holding: Option<Holding>,
    ) -> Result<Vec<Member>, StoreError> {
        let millis = validate_heartbeat(shard_set, member, ttl)?;
        let engine = self.engine()?;
        let cx = &engine.cx;
        let shard_set = &stored_set(shard_set, cx.table())?;
        let table = Alias::new(&*cx.member_table);
        // Kept scoped to this store's lease table (see `Holding::scoped`).
        let holding = holding.map(|h| h.scoped(cx.table()));
        let upsert = heartbeat(
            cx.dialect, &table, shard_set, member, millis, draining, holding,
        )
        .map_err(|e| StoreError::Database(e.into()))?;
        self.members_plain(cx.build(&upsert)).await?;
        self.read_members(Some(shard_set)).await
    }

    async fn read_members(&self, shard_set: Option<&str>) -> Result<Vec<Member>, StoreError> {
        // `shard_set` is the stored name (`stored_set`).
        let cx = &self.engine()?.cx;
        let table = Alias::new(&*cx.member_table);
        let stmt = cx.build(&live(cx.dialect, &table, shard_set));
        let rows = self.members_plain(stmt).await?;
        self.decoded_members(rows)
    }

    fn decoded_members(&self, rows: Vec<QueryResult>) -> Result<Vec<Member>, StoreError> {
        let lease_table = self.engine()?.cx.table.clone();
        let mut members = rows
            .iter()
            .map(|row| {
                let mut member = decode_member(row)?;
                member.holding = member.holding.map(|h| h.scoped(&lease_table));
                // Another lease table's members (`stored_set`) are none of this store's.
                Ok(set_of_stored(&member.shard_set, &lease_table).map(|set| {
                    member.shard_set = set;
                    member
                }))
            })
            .filter_map(Result::transpose)
            .collect::<Result<Vec<_>, DbErr>>()
            .map_err(|source| StoreError::Decode {
                table: self.member_table().to_string(),
                source,
            })?;
        // Byte order, whatever the database's collation: every member must see the same order.
        members.sort_by(|a, b| (&a.shard_set, &a.member).cmp(&(&b.shard_set, &b.member)));
        Ok(members)
    }

    /// A membership statement, with the membership table named in its errors, once the table
    /// is known to have this version's columns.
    async fn members_plain(
        &self,
        stmt: sea_orm::Statement,
    ) -> Result<Vec<QueryResult>, StoreError> {
        self.members_ready().await?;
        self.engine()?
            .plain(stmt)
            .await
            .map_err(|e| self.member_table_error(e))
    }

    /// `err` of a membership statement: a missing table is the membership table, and an
    /// unknown column means the table lacks its last migration step's columns.
    fn member_table_error(&self, err: StoreError) -> StoreError {
        match err {
            StoreError::MissingTable { source, .. } => StoreError::MissingTable {
                table: self.member_table().to_string(),
                source,
            },
            StoreError::Database(source)
                if self.engine().is_ok_and(|e| e.unknown_column_in(&source)) =>
            {
                tracing::warn!(
                    table = %self.member_table(),
                    error = %source,
                    "the membership table lacks columns this version needs"
                );
                StoreError::OutdatedSchema {
                    table: self.member_table().to_string(),
                    migration: super::engine::MEMBER_TABLE_LAST_STEP,
                    source,
                }
            }
            other => other,
        }
    }

    /// Checks, once per store, that the membership table has the candidate rank
    /// (`AddMemberRank`), which only ranked electors need.
    async fn candidates_ready(&self) -> Result<(), StoreError> {
        let engine = self.engine()?;
        let cx = &engine.cx;
        cx.candidate_schema_checked
            .get_or_try_init(|| async {
                let probe = Query::select()
                    .expr(Expr::cust("candidate_rank"))
                    .from(Alias::new(&*cx.member_table))
                    .limit(0)
                    .to_owned();
                let found = engine.plain(cx.build(&probe)).await;
                found
                    .map(|_| ())
                    .map_err(|e| self.rank_table_error(self.member_table_error(e)))
            })
            .await
            .copied()
    }

    /// `err` of a candidate statement: an outdated table lacks `AddMemberRank`'s column.
    fn rank_table_error(&self, err: StoreError) -> StoreError {
        match err {
            StoreError::OutdatedSchema { table, source, .. } => StoreError::OutdatedSchema {
                table,
                migration: super::engine::MEMBER_RANK_STEP,
                source,
            },
            other => other,
        }
    }

    /// A candidate statement (the membership table checked for the rank first).
    async fn candidates_plain(
        &self,
        stmt: sea_orm::Statement,
    ) -> Result<Vec<QueryResult>, StoreError> {
        self.candidates_ready().await?;
        self.members_plain(stmt)
            .await
            .map_err(|e| self.rank_table_error(e))
    }

    async fn read_candidates(&self, election: &str) -> Result<Vec<Candidate>, StoreError> {
        let cx = &self.engine()?.cx;
        let table = Alias::new(&*cx.member_table);
        let rows = self
            .candidates_plain(cx.build(&live_candidates(cx.dialect, &table, election)))
            .await?;
        let mut candidates = rows
            .iter()
            .map(decode_candidate)
            .collect::<Result<Vec<_>, DbErr>>()
            .map_err(|source| StoreError::Decode {
                table: self.member_table().to_string(),
                source,
            })?;
        // Byte order, whatever the database's collation (as for members).
        candidates.sort_by(|a, b| a.candidate.cmp(&b.candidate));
        Ok(candidates)
    }

    /// Deletes the live row of `member` under the stored name `stored` (a shard set's or an
    /// election's), then the lapsed rows under it: whether the live row was there.
    async fn remove(&self, stored: &str, member: &str) -> Result<bool, StoreError> {
        let cx = &self.engine()?.cx;
        let table = Alias::new(&*cx.member_table);
        let left = self
            .members_execute(cx.build(&leave(cx.dialect, &table, stored, member)))
            .await?;
        self.members_execute(cx.build(&prune(cx.dialect, &table, stored)))
            .await?;
        Ok(left > 0)
    }

    /// A membership statement that changes rows: how many it changed.
    async fn members_execute(&self, stmt: sea_orm::Statement) -> Result<u64, StoreError> {
        self.members_ready().await?;
        self.engine()?
            .counted(stmt)
            .await
            .map_err(|e| self.member_table_error(e))
    }

    /// The lease rows of `resources`, one statement per [`READ_CHUNK`] resources.
    pub(crate) async fn read_leases(
        &self,
        resources: &[String],
    ) -> Result<Vec<LeaseRecord>, StoreError> {
        let engine = self.engine()?;
        let cx = &engine.cx;
        let table = cx.table_iden();
        let mut records = Vec::with_capacity(resources.len());
        for chunk in resources.chunks(READ_CHUNK) {
            let stmt = cx.build(&leases_of(cx.dialect, &table, chunk));
            for r in engine.lease_rows(stmt).await? {
                let decoded = Row::decode(&r).and_then(|row| {
                    let resource: String = r.try_get_by_index(6)?;
                    Ok(row.record(&resource))
                });
                records.push(decoded.map_err(|source| cx.decode_error(source))?);
            }
        }
        Ok(records)
    }
}

#[async_trait]
impl MembershipStore for SeaOrmLeaseStore {
    async fn heartbeat(
        &self,
        shard_set: &str,
        member: &str,
        ttl: std::time::Duration,
        draining: bool,
    ) -> Result<Vec<Member>, StoreError> {
        self.beat(shard_set, member, ttl, draining, None).await
    }

    /// Writes `holding` into the count columns (see `AddMemberHolding`).
    async fn heartbeat_holding(
        &self,
        shard_set: &str,
        member: &str,
        ttl: std::time::Duration,
        draining: bool,
        holding: Holding,
    ) -> Result<Vec<Member>, StoreError> {
        self.beat(shard_set, member, ttl, draining, Some(holding))
            .await
    }

    async fn leave(&self, shard_set: &str, member: &str) -> Result<bool, StoreError> {
        validate_candidate(member)?;
        let stored = stored_set(shard_set, self.engine()?.cx.table())?;
        self.remove(&stored, member).await
    }

    async fn members(&self, shard_set: &str) -> Result<Vec<Member>, StoreError> {
        let stored = stored_set(shard_set, self.engine()?.cx.table())?;
        self.read_members(Some(&stored)).await
    }

    async fn candidate_heartbeat(
        &self,
        resource: &str,
        candidate: &str,
        ttl: std::time::Duration,
        rank: i64,
    ) -> Result<Vec<Candidate>, StoreError> {
        let cx = &self.engine()?.cx;
        let (election, millis) =
            validate_candidate_heartbeat(resource, candidate, ttl, cx.table())?;
        let table = Alias::new(&*cx.member_table);
        let upsert = candidate_heartbeat(cx.dialect, &table, &election, candidate, millis, rank)
            .map_err(|e| StoreError::Database(e.into()))?;
        self.candidates_plain(cx.build(&upsert)).await?;
        self.read_candidates(&election).await
    }

    async fn candidate_leave(&self, resource: &str, candidate: &str) -> Result<bool, StoreError> {
        let election = stored_candidates(resource, self.engine()?.cx.table())?;
        validate_candidate(candidate)?;
        self.remove(&election, candidate).await
    }

    async fn candidates(&self, resource: &str) -> Result<Vec<Candidate>, StoreError> {
        let election = stored_candidates(resource, self.engine()?.cx.table())?;
        self.read_candidates(&election).await
    }

    fn check_election(&self, resource: &str) -> Result<(), StoreError> {
        stored_candidates(resource, self.table()).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{mysql::MySql, postgres::Postgres, sqlite::Sqlite};
    use sea_orm::sea_query::{MysqlQueryBuilder, PostgresQueryBuilder, SqliteQueryBuilder};

    fn table() -> Alias {
        Alias::new("orionbeacon_members")
    }

    #[test]
    fn candidate_statements_per_backend() {
        let election = " =orionbeacon_leases/report";
        let upsert = |d: &dyn Dialect| {
            candidate_heartbeat(d, &table(), election, "node-a", 15_000, 7).unwrap()
        };
        let read = |d: &dyn Dialect| live_candidates(d, &table(), election);
        let rendered = [
            (
                upsert(&Postgres).build(PostgresQueryBuilder),
                read(&Postgres).build(PostgresQueryBuilder),
            ),
            (
                upsert(&MySql).build(MysqlQueryBuilder),
                read(&MySql).build(MysqlQueryBuilder),
            ),
            (
                upsert(&Sqlite).build(SqliteQueryBuilder),
                read(&Sqlite).build(SqliteQueryBuilder),
            ),
        ];
        let expected = [
            (
                r#"INSERT INTO "orionbeacon_members" ("shard_set", "member", "draining", "joined_at", "heartbeat_at", "expires_at", "candidate_rank") VALUES ($1, $2, $3, statement_timestamp(), statement_timestamp(), clock_timestamp() + $4 * INTERVAL '1 millisecond', $5) ON CONFLICT ("shard_set", "member") DO UPDATE SET "joined_at" = (CASE WHEN ("orionbeacon_members"."expires_at" <= (statement_timestamp())) THEN statement_timestamp() ELSE "orionbeacon_members"."joined_at" END), "heartbeat_at" = statement_timestamp(), "expires_at" = clock_timestamp() + $6 * INTERVAL '1 millisecond', "candidate_rank" = $7"#,
                r#"SELECT "member", "candidate_rank", CAST(FLOOR(EXTRACT(EPOCH FROM ("joined_at" - statement_timestamp())) * 1000) AS BIGINT), CAST(FLOOR(EXTRACT(EPOCH FROM ("expires_at" - statement_timestamp())) * 1000) AS BIGINT) FROM "orionbeacon_members" WHERE "shard_set" = $1 AND "expires_at" > (statement_timestamp()) AND "candidate_rank" IS NOT NULL"#,
            ),
            (
                r#"INSERT INTO `orionbeacon_members` (`shard_set`, `member`, `draining`, `joined_at`, `heartbeat_at`, `expires_at`, `candidate_rank`) VALUES (?, ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), SYSDATE(6) + INTERVAL TIMESTAMPDIFF(MICROSECOND, NOW(6), UTC_TIMESTAMP(6)) MICROSECOND + INTERVAL ? MICROSECOND, ?) ON DUPLICATE KEY UPDATE `joined_at` = (CASE WHEN (`orionbeacon_members`.`expires_at` <= (UTC_TIMESTAMP(6))) THEN UTC_TIMESTAMP(6) ELSE `orionbeacon_members`.`joined_at` END), `heartbeat_at` = UTC_TIMESTAMP(6), `expires_at` = SYSDATE(6) + INTERVAL TIMESTAMPDIFF(MICROSECOND, NOW(6), UTC_TIMESTAMP(6)) MICROSECOND + INTERVAL ? MICROSECOND, `candidate_rank` = ?"#,
                r#"SELECT `member`, `candidate_rank`, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), `joined_at`) DIV 1000, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), `expires_at`) DIV 1000 FROM `orionbeacon_members` WHERE `shard_set` = ? AND `expires_at` > (UTC_TIMESTAMP(6)) AND `candidate_rank` IS NOT NULL"#,
            ),
            (
                r#"INSERT INTO "orionbeacon_members" ("shard_set", "member", "draining", "joined_at", "heartbeat_at", "expires_at", "candidate_rank") VALUES (?, ?, ?, strftime('%Y-%m-%d %H:%M:%f', 'now'), strftime('%Y-%m-%d %H:%M:%f', 'now'), strftime('%Y-%m-%d %H:%M:%f', 'now', ?), ?) ON CONFLICT ("shard_set", "member") DO UPDATE SET "joined_at" = (CASE WHEN ("orionbeacon_members"."expires_at" <= (strftime('%Y-%m-%d %H:%M:%f', 'now'))) THEN strftime('%Y-%m-%d %H:%M:%f', 'now') ELSE "orionbeacon_members"."joined_at" END), "heartbeat_at" = strftime('%Y-%m-%d %H:%M:%f', 'now'), "expires_at" = strftime('%Y-%m-%d %H:%M:%f', 'now', ?), "candidate_rank" = ?"#,
                r#"SELECT "member", "candidate_rank", CAST(ROUND((julianday("joined_at") - julianday('now')) * 86400000.0) AS INTEGER), CAST(ROUND((julianday("expires_at") - julianday('now')) * 86400000.0) AS INTEGER) FROM "orionbeacon_members" WHERE "shard_set" = ? AND "expires_at" > (strftime('%Y-%m-%d %H:%M:%f', 'now')) AND "candidate_rank" IS NOT NULL"#,
            ),
        ];
        for (((up, up_values), (sel, sel_values)), (want_up, want_sel)) in
            rendered.into_iter().zip(expected)
        {
            assert_eq!(up, want_up);
            assert_eq!(sel, want_sel);
            // The rank bound in the insert and in the update; the election in the read.
            let rank = sea_orm::Value::from(7i64);
            assert_eq!(up_values.0.iter().filter(|v| **v == rank).count(), 2);
            assert!(sel_values.0.contains(&sea_orm::Value::from(election)));
        }
    }

    // sea-query drops clauses a backend lacks without a word: pin the exact SQL.
    #[test]
    fn heartbeat_is_one_upsert_per_backend() {
        let (sql, values) = heartbeat(&Postgres, &table(), "orders", "node-a", 15_000, false, None)
            .unwrap()
            .build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            r#"INSERT INTO "orionbeacon_members" ("shard_set", "member", "draining", "joined_at", "heartbeat_at", "expires_at", "leases_held", "set_hash", "counted_at") VALUES ($1, $2, $3, statement_timestamp(), statement_timestamp(), clock_timestamp() + $4 * INTERVAL '1 millisecond', $5, $6, NULL) ON CONFLICT ("shard_set", "member") DO UPDATE SET "joined_at" = (CASE WHEN ("orionbeacon_members"."expires_at" <= (statement_timestamp())) THEN statement_timestamp() ELSE "orionbeacon_members"."joined_at" END), "draining" = $7, "heartbeat_at" = statement_timestamp(), "expires_at" = clock_timestamp() + $8 * INTERVAL '1 millisecond', "leases_held" = $9, "set_hash" = $10, "counted_at" = NULL"#
        );
        assert_eq!(values.0.len(), 10, "{values:?}");

        let (sql, _) = heartbeat(&Sqlite, &table(), "orders", "node-a", 15_000, true, None)
            .unwrap()
            .build(SqliteQueryBuilder);
        assert_eq!(
            sql,
            r#"INSERT INTO "orionbeacon_members" ("shard_set", "member", "draining", "joined_at", "heartbeat_at", "expires_at", "leases_held", "set_hash", "counted_at") VALUES (?, ?, ?, strftime('%Y-%m-%d %H:%M:%f', 'now'), strftime('%Y-%m-%d %H:%M:%f', 'now'), strftime('%Y-%m-%d %H:%M:%f', 'now', ?), ?, ?, NULL) ON CONFLICT ("shard_set", "member") DO UPDATE SET "joined_at" = (CASE WHEN ("orionbeacon_members"."expires_at" <= (strftime('%Y-%m-%d %H:%M:%f', 'now'))) THEN strftime('%Y-%m-%d %H:%M:%f', 'now') ELSE "orionbeacon_members"."joined_at" END), "draining" = ?, "heartbeat_at" = strftime('%Y-%m-%d %H:%M:%f', 'now'), "expires_at" = strftime('%Y-%m-%d %H:%M:%f', 'now', ?), "leases_held" = ?, "set_hash" = ?, "counted_at" = NULL"#
        );

        let (sql, _) = heartbeat(&MySql, &table(), "orders", "node-a", 15_000, false, None)
            .unwrap()
            .build(MysqlQueryBuilder);
        assert_eq!(
            sql,
            r#"INSERT INTO `orionbeacon_members` (`shard_set`, `member`, `draining`, `joined_at`, `heartbeat_at`, `expires_at`, `leases_held`, `set_hash`, `counted_at`) VALUES (?, ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), SYSDATE(6) + INTERVAL TIMESTAMPDIFF(MICROSECOND, NOW(6), UTC_TIMESTAMP(6)) MICROSECOND + INTERVAL ? MICROSECOND, ?, ?, NULL) ON DUPLICATE KEY UPDATE `joined_at` = (CASE WHEN (`orionbeacon_members`.`expires_at` <= (UTC_TIMESTAMP(6))) THEN UTC_TIMESTAMP(6) ELSE `orionbeacon_members`.`joined_at` END), `draining` = ?, `heartbeat_at` = UTC_TIMESTAMP(6), `expires_at` = SYSDATE(6) + INTERVAL TIMESTAMPDIFF(MICROSECOND, NOW(6), UTC_TIMESTAMP(6)) MICROSECOND + INTERVAL ? MICROSECOND, `leases_held` = ?, `set_hash` = ?, `counted_at` = NULL"#
        );
    }

    // The counts ride on the same upsert: two more columns, bound, set on insert and update.
    #[test]
    fn a_counted_heartbeat_writes_and_reads_the_counts() {
        let holding = Holding::new(3, &["a", "b", "c", "d"]);
        let (sql, values) = heartbeat(
            &Postgres,
            &table(),
            "orders",
            "node-a",
            15_000,
            false,
            Some(holding),
        )
        .unwrap()
        .build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            concat!(
                r#"INSERT INTO "orionbeacon_members" ("shard_set", "member", "draining", "joined_at", "heartbeat_at", "expires_at", "leases_held", "set_hash", "counted_at") "#,
                r#"VALUES ($1, $2, $3, statement_timestamp(), statement_timestamp(), clock_timestamp() + $4 * INTERVAL '1 millisecond', $5, $6, statement_timestamp()) "#,
                r#"ON CONFLICT ("shard_set", "member") DO UPDATE SET "#,
                r#""joined_at" = (CASE WHEN ("orionbeacon_members"."expires_at" <= (statement_timestamp())) THEN statement_timestamp() ELSE "orionbeacon_members"."joined_at" END), "#,
                r#""draining" = $7, "heartbeat_at" = statement_timestamp(), "expires_at" = clock_timestamp() + $8 * INTERVAL '1 millisecond', "leases_held" = $9, "set_hash" = $10, "counted_at" = statement_timestamp()"#,
            )
        );
        let hash = i64::from_ne_bytes(holding.set_hash.to_ne_bytes());
        assert_eq!(values.0[4], 3i64.into());
        assert_eq!(values.0[5], hash.into());
        assert_eq!(values.0[8], 3i64.into());
        assert_eq!(values.0[9], hash.into());
        // A plain heartbeat on a counted table clears them.
        let (sql, values) = heartbeat(&MySql, &table(), "orders", "node-a", 15_000, false, None)
            .unwrap()
            .build(MysqlQueryBuilder);
        assert!(
            sql.ends_with("MICROSECOND, `leases_held` = ?, `set_hash` = ?, `counted_at` = NULL"),
            "{sql}"
        );
        assert_eq!(values.0[9], sea_orm::Value::BigInt(None));
        // The counts of the last heartbeat only: one without them leaves them stale, unread.
        let (sql, _) = live(&Sqlite, &table(), Some("orders")).build(SqliteQueryBuilder);
        assert!(
            sql.starts_with(
                r#"SELECT "shard_set", "member", "draining", "joined_at", "heartbeat_at", "#
            ) && sql.contains(r#", CASE WHEN counted_at = heartbeat_at THEN leases_held END, CASE WHEN counted_at = heartbeat_at THEN set_hash END FROM "orionbeacon_members" WHERE"#),
            "{sql}"
        );
    }

    #[test]
    fn fingerprints_ignore_order_and_repeats() {
        let a = Holding::fingerprint(&["x", "y", "z"]);
        assert_eq!(a, Holding::fingerprint(&["z", "x", "y", "x"]));
        assert_ne!(a, Holding::fingerprint(&["x", "y"]));
        // Names never run together.
        assert_ne!(
            Holding::fingerprint(&["ab", "c"]),
            Holding::fingerprint(&["a", "bc"])
        );
    }

    #[test]
    fn reads_and_deletes_are_guarded_and_bound() {
        let (sql, values) = live(&Postgres, &table(), Some("orders")).build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            r#"SELECT "shard_set", "member", "draining", "joined_at", "heartbeat_at", CAST(FLOOR(EXTRACT(EPOCH FROM ("expires_at" - statement_timestamp())) * 1000) AS BIGINT), CASE WHEN counted_at = heartbeat_at THEN leases_held END, CASE WHEN counted_at = heartbeat_at THEN set_hash END FROM "orionbeacon_members" WHERE "expires_at" > (statement_timestamp()) AND "shard_set" = $1"#
        );
        assert_eq!(values.0.len(), 1);
        let (sql, values) = leave(&MySql, &table(), "orders", "node-a").build(MysqlQueryBuilder);
        assert_eq!(
            sql,
            "DELETE FROM `orionbeacon_members` WHERE `shard_set` = ? AND `member` = ? AND `expires_at` > (UTC_TIMESTAMP(6))"
        );
        assert_eq!(values.0.len(), 2);
        let (sql, _) = prune(&Sqlite, &table(), "orders").build(SqliteQueryBuilder);
        assert_eq!(
            sql,
            r#"DELETE FROM "orionbeacon_members" WHERE "shard_set" = ? AND "expires_at" <= (strftime('%Y-%m-%d %H:%M:%f', 'now'))"#
        );
        let resources = vec!["a".to_owned(), "b".to_owned()];
        let (sql, values) = leases_of(&Postgres, &Alias::new("orionbeacon_leases"), &resources)
            .build(PostgresQueryBuilder);
        assert_eq!(
            sql,
            r#"SELECT "holder", "fencing_token", "expires_at", "acquired_at", "renewed_at", CAST(FLOOR(EXTRACT(EPOCH FROM ("expires_at" - statement_timestamp())) * 1000) AS BIGINT), "resource", CASE WHEN payload_token = fencing_token THEN payload END AS current_payload FROM "orionbeacon_leases" WHERE "resource" IN ($1, $2)"#
        );
        assert_eq!(values.0.len(), 2);
    }
}
