//! Running a batch: one pooled connection per try, tried again (after a short backoff) while SQL
//! Server reports a deadlock (1205) or a duplicate key (2627), and SQL Server's errors sorted into
//! [`StoreError`]s; with the conversions every operation shares (the lease's `DATEADD`
//! parameters, a column of a row).

use std::time::Duration;

use sea_orm::DbErr;
use tiberius::error::Error as TdsError;
use tiberius::{FromSql, ToSql};

use super::pool::{keeps_connection, Connection};
use super::SqlServerLeaseStore;
use orion_beacon::StoreError;

/// How often a statement is tried when SQL Server picks it as a deadlock victim (1205) or
/// reports a duplicate key (2627). Either way the statement had no effect.
const ATTEMPTS: u32 = 5;

/// SQL Server error numbers the store treats specially.
pub(super) mod code {
    /// Invalid object name: the lease table does not exist.
    pub const INVALID_OBJECT: u32 = 208;
    /// Chosen as the deadlock victim; the transaction was rolled back.
    pub const DEADLOCK: u32 = 1205;
    /// Violation of a primary key constraint.
    pub const DUPLICATE_KEY: u32 = 2627;
    /// There is already an object of that name (a concurrent `migrate`).
    pub const OBJECT_EXISTS: u32 = 2714;
    /// Column names in each table must be unique (a concurrent `migrate` added the column).
    pub const COLUMN_EXISTS: u32 = 2705;
    /// Invalid column name: the table has no payload columns.
    pub const INVALID_COLUMN: u32 = 207;
}

/// Whether `code` means the statement lost a race and had no effect.
fn is_conflict(code: Option<u32>) -> bool {
    matches!(code, Some(code::DEADLOCK | code::DUPLICATE_KEY))
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Want {
    Rows,
    RowsAffected,
}

pub(super) enum Reply {
    Rows(Vec<tiberius::Row>),
    RowsAffected(u64),
}

async fn send(
    client: &mut Connection,
    want: Want,
    sql: &str,
    params: &[&dyn ToSql],
) -> Result<Reply, TdsError> {
    match want {
        Want::Rows => {
            // Drains the whole response, so the connection is clean for the next operation.
            let results = client.query(sql, params).await?.into_results().await?;
            Ok(Reply::Rows(results.into_iter().flatten().collect()))
        }
        Want::RowsAffected => Ok(Reply::RowsAffected(
            client.execute(sql, params).await?.total(),
        )),
    }
}

impl SqlServerLeaseStore {
    /// Sends one batch on a pooled connection, again while SQL Server reports a deadlock or a
    /// duplicate key, at most [`ATTEMPTS`] times.
    pub(super) async fn run(
        &self,
        want: Want,
        sql: &str,
        params: &[&dyn ToSql],
    ) -> Result<Reply, TdsError> {
        let mut attempt = 1;
        loop {
            let mut conn = self.pool.get().await?;
            match send(conn.client()?, want, sql, params).await {
                Ok(reply) => {
                    conn.give_back();
                    return Ok(reply);
                }
                Err(err) => {
                    if keeps_connection(&err) {
                        conn.give_back();
                    } else {
                        tracing::debug!(table = %self.table, error = %err, "closing a SQL Server connection that failed");
                        drop(conn);
                    }
                    if attempt < ATTEMPTS && is_conflict(err.code()) {
                        tracing::debug!(table = %self.table, attempt, error = %err, "lease statement conflicted; retrying");
                        tokio::time::sleep(backoff(attempt)).await;
                        attempt += 1;
                        continue;
                    }
                    return Err(err);
                }
            }
        }
    }

    /// An error of a rate-limit statement.
    pub(super) fn classify_rates(&self, err: TdsError) -> StoreError {
        classify_in(&self.rate_table, None, err)
    }

    /// An error of a lease statement.
    pub(super) fn classify(&self, err: TdsError) -> StoreError {
        classify_in(&self.table, Some(LEASE_TABLE_LAST_STEP), err)
    }

    /// An error of a membership statement: a missing table is the membership table.
    pub(super) fn classify_members(&self, err: TdsError) -> StoreError {
        classify_in(&self.member_table, Some(MEMBER_TABLE_LAST_STEP), err)
    }

    /// An error of a candidate statement: an unknown column there is the candidate rank.
    pub(super) fn classify_candidates(&self, err: TdsError) -> StoreError {
        classify_in(&self.member_table, Some(MEMBER_RANK_STEP), err)
    }

    /// An error of a migration's own batch on `table` (an unknown column there is no table of
    /// an earlier version, but the batch's own error).
    pub(super) fn classify_migration(&self, table: &str, err: TdsError) -> StoreError {
        classify_in(table, None, err)
    }

    /// Checks, once per store and table, that the lease table has every column this version's
    /// migrations give it (a `TOP 0` read that names the last step's columns): a table made
    /// by an earlier version is refused with [`StoreError::OutdatedSchema`] before anything
    /// else is sent. A refusal is not remembered: the next call looks again.
    pub(super) async fn ready(&self) -> Result<(), StoreError> {
        self.probed(
            &self.schema_checked,
            &self.sql.payload_probe,
            Self::classify,
        )
        .await
    }

    /// The same for the membership table.
    pub(super) async fn members_ready(&self) -> Result<(), StoreError> {
        self.probed(
            &self.member_schema_checked,
            &self.member_sql.probe,
            Self::classify_members,
        )
        .await
    }

    /// The same for the candidate rank, checked apart (only ranked electors need it): a table
    /// without it refuses candidate statements while shard sets' members go on.
    pub(super) async fn candidates_ready(&self) -> Result<(), StoreError> {
        self.probed(
            &self.candidate_schema_checked,
            &self.member_sql.rank_probe,
            Self::classify_candidates,
        )
        .await
    }

    /// Sends `probe` until it succeeds once, which `cell` keeps; its errors by `classify`.
    async fn probed(
        &self,
        cell: &tokio::sync::OnceCell<()>,
        probe: &str,
        classify: fn(&Self, TdsError) -> StoreError,
    ) -> Result<(), StoreError> {
        cell.get_or_try_init(|| async {
            self.run(Want::Rows, probe, &[])
                .await
                .map(|_| ())
                .map_err(|err| classify(self, err))
        })
        .await
        .copied()
    }
}

/// The migration step that gave the lease table its last columns (`payload`,
/// `payload_token`; on SQL Server, [`PAYLOAD_MIGRATION_SQL`](crate::PAYLOAD_MIGRATION_SQL)).
const LEASE_TABLE_LAST_STEP: &str = "AddLeasePayload";
/// The same for the membership table (the counts; [`HOLDING_MIGRATION_SQL`](crate::HOLDING_MIGRATION_SQL)).
const MEMBER_TABLE_LAST_STEP: &str = "AddMemberHolding";
/// The step that gives the membership table its candidate rank, which only ranked electors
/// need ([`RANK_MIGRATION_SQL`](crate::RANK_MIGRATION_SQL)).
const MEMBER_RANK_STEP: &str = "AddMemberRank";

/// A SQL Server error of a statement on `table`, whose last migration step is `step` (`None`
/// for the migrations' own batches).
fn classify_in(table: &str, step: Option<&'static str>, err: TdsError) -> StoreError {
    match (err.code(), step) {
        (Some(code::INVALID_OBJECT), _) => StoreError::MissingTable {
            table: table.to_owned(),
            source: driver_error(err),
        },
        (Some(code::INVALID_COLUMN), Some(step)) => {
            tracing::warn!(%table, error = %err, "the table lacks columns this version needs");
            StoreError::OutdatedSchema {
                table: table.to_owned(),
                migration: step,
                source: driver_error(err),
            }
        }
        (code, _) if is_conflict(code) => StoreError::Conflict {
            source: driver_error(err),
        },
        _ => StoreError::Database(driver_error(err)),
    }
}

/// A lease in whole seconds and the milliseconds left over (`DATEADD` takes an `int`, and 366
/// days of milliseconds do not fit one).
pub(super) fn split_lease(millis: i64, lease: Duration) -> Result<(i32, i32), StoreError> {
    let too_long = || StoreError::InvalidLeaseDuration {
        duration: lease,
        reason: "must be at most 366 days",
    };
    let seconds = i32::try_from(millis / 1000).map_err(|_| too_long())?;
    let rest_ms = i32::try_from(millis % 1000).map_err(|_| too_long())?;
    Ok((seconds, rest_ms))
}

/// 5 ms, 10 ms, ... plus up to 5 ms of jitter, so racers that collided do not collide again.
fn backoff(attempt: u32) -> Duration {
    let jitter = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::from(d.subsec_nanos() % 5_000))
        .unwrap_or(0);
    Duration::from_millis(5 * u64::from(attempt)) + Duration::from_micros(jitter)
}

pub(super) fn column<'a, T: FromSql<'a>>(
    row: &'a tiberius::Row,
    idx: usize,
    name: &str,
) -> Result<T, DbErr> {
    match row.try_get::<T, _>(idx) {
        Ok(Some(value)) => Ok(value),
        Ok(None) => Err(DbErr::Type(format!("SQL Server column {name} is NULL"))),
        Err(e) => Err(DbErr::Type(format!("SQL Server column {name}: {e}"))),
    }
}

/// tiberius' error as the store reports it, naming how the tables are made.
pub(crate) fn driver_error(err: TdsError) -> orion_beacon::BackendError {
    orion_beacon::BackendError::Driver {
        driver: "tiberius",
        migration: "`SqlServerLeaseStore::migrate()` (`migrate_members()` for the membership \
                    table), or the T-SQL in `orion_beacon_sqlserver::MIGRATION_SQL` \
                    (`MEMBER_MIGRATION_SQL`)",
        source: Box::new(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::timed_out;

    #[test]
    fn only_intact_connections_go_back_to_the_pool() {
        assert!(!keeps_connection(&TdsError::Io {
            kind: std::io::ErrorKind::ConnectionReset,
            message: "reset".into(),
        }));
        assert!(!keeps_connection(&TdsError::Protocol("desync".into())));
        assert!(!keeps_connection(&TdsError::Tls("bad cert".into())));
        assert!(!keeps_connection(&timed_out("x")));
        assert!(is_conflict(Some(1205)) && is_conflict(Some(2627)));
        assert!(!is_conflict(Some(208)) && !is_conflict(None));
    }

    #[test]
    fn backoff_is_bounded() {
        for attempt in 1..ATTEMPTS {
            let d = backoff(attempt);
            assert!(d >= Duration::from_millis(5 * u64::from(attempt)));
            assert!(d < Duration::from_millis(5 * u64::from(attempt) + 5));
        }
    }
}
