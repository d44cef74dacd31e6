//! SQL Server's rate-limit decision, in T-SQL, and the versioned migration of its table.

use async_trait::async_trait;
use orion_beacon::rate_limit::{Quota, RateLimitStore, RateOutcome};
use orion_beacon::StoreError;
use orion_beacon_entity::DEFAULT_RATE_LIMIT_TABLE;

use super::exec::{column, Reply, Want};
use super::names::check_resource;
use super::tsql::quoted;
use super::SqlServerLeaseStore;

/// The version name of the rate-limit table's migration, the same as the SeaORM migration's
/// (`CreateRateLimitTable::NAME`).
pub const RATE_LIMIT_MIGRATION_NAME: &str = "m20261206_000001_create_orionbeacon_rate_limits";

/// The versioned, idempotent T-SQL that creates the default rate-limit table (the file
/// `sql/m20261206_000001_create_orionbeacon_rate_limits.sqlserver.sql` of this crate).
/// [`SqlServerLeaseStore::rate_limit_migration_sql`] gives it for the store's own table.
pub const RATE_LIMIT_MIGRATION_SQL: &str =
    include_str!("../sql/m20261206_000001_create_orionbeacon_rate_limits.sqlserver.sql");

/// [`RATE_LIMIT_MIGRATION_SQL`] for `table`.
pub(super) fn rate_limit_migration_sql(table: &str) -> String {
    RATE_LIMIT_MIGRATION_SQL
        .replace(&quoted(DEFAULT_RATE_LIMIT_TABLE), &quoted(table))
        .replace(
            &quoted(&format!("PK_{DEFAULT_RATE_LIMIT_TABLE}")),
            &quoted(&format!("PK_{table}")),
        )
}

/// One decision, at one reading of the database clock (`@now`, whole µs since the Unix epoch):
/// `MERGE ... WITH (HOLDLOCK)` keyed on `limit_key` (two first calls of a key cannot both
/// insert), every assignment reading the row as it was (T-SQL's `SET` does), and the row it
/// left in `OUTPUT`. Parameters: `@P1` the key, `@P2` the quota's spacing and `@P3` its burst's
/// span (µs, `bigint`), `@P4` the caller's random number, written with the decision.
pub(super) fn take_permit_sql(table: &str) -> String {
    let t = quoted(table);
    let due = "t.tat_us <= @now + @P3";
    format!(
        "DECLARE @now bigint = DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()); \
         MERGE {t} WITH (HOLDLOCK) AS t \
         USING (SELECT @P1 AS limit_key) AS s \
         ON t.limit_key = s.limit_key \
         WHEN MATCHED THEN UPDATE SET \
         t.granted = CASE WHEN {due} THEN 1 ELSE 0 END, \
         t.permits = CASE WHEN {due} THEN t.permits + 1 ELSE t.permits END, \
         t.decided_us = @now, \
         t.decision_id = @P4, \
         t.tat_us = CASE WHEN {due} THEN (CASE WHEN t.tat_us > @now THEN t.tat_us ELSE @now END) + @P2 ELSE t.tat_us END \
         WHEN NOT MATCHED THEN INSERT (limit_key, tat_us, permits, granted, decided_us, decision_id) \
         VALUES (s.limit_key, @now + @P2, 1, 1, @now, @P4) \
         OUTPUT inserted.granted, inserted.permits, inserted.tat_us - inserted.decided_us AS ahead_us, inserted.decided_us, inserted.decision_id;"
    )
}

impl SqlServerLeaseStore {
    /// The versioned T-SQL that creates this store's rate-limit table
    /// ([`RATE_LIMIT_MIGRATION_SQL`], migration [`RATE_LIMIT_MIGRATION_NAME`]).
    pub fn rate_limit_migration_sql(&self) -> String {
        rate_limit_migration_sql(&self.rate_table)
    }

    /// Creates the rate-limit table if it does not exist: idempotent, and safe to run from
    /// several processes at once.
    pub async fn migrate_rate_limits(&self) -> Result<(), StoreError> {
        self.create(&self.rate_limit_migration_sql())
            .await
            .map_err(|err| self.classify_migration(&self.rate_table, err))
    }
}

/// Rate-limit keys in the store's rate-limit table
/// ([`with_rate_limit_table`](SqlServerLeaseStore::with_rate_limit_table), created by
/// [`migrate_rate_limits`](SqlServerLeaseStore::migrate_rate_limits)): one `MERGE` per
/// decision (see the crate docs).
#[async_trait]
impl RateLimitStore for SqlServerLeaseStore {
    async fn take_permit(&self, key: &str, quota: &Quota) -> Result<RateOutcome, StoreError> {
        check_resource(key)?;
        let sql = take_permit_sql(&self.rate_table);
        let (emission, tolerance) = (quota.emission_us(), quota.tolerance_us());
        let id = orion_beacon::rate_limit::decision_id();
        let rows = match self
            .run(Want::Rows, &sql, &[&key, &emission, &tolerance, &id])
            .await
        {
            Ok(Reply::Rows(rows)) => rows,
            Ok(Reply::RowsAffected(_)) => Vec::new(),
            Err(err) => return Err(self.classify_rates(err)),
        };
        let decode = |source| StoreError::Decode {
            table: self.rate_table.to_string(),
            source,
        };
        let [row] = rows.as_slice() else {
            return Err(decode(sea_orm::DbErr::Custom(format!(
                "the rate-limit decision returned {} rows, not 1",
                rows.len()
            ))));
        };
        let granted = column::<bool>(row, 0, "granted").map_err(decode)?;
        let permits = column::<i64>(row, 1, "permits").map_err(decode)?;
        let ahead = column::<i64>(row, 2, "ahead_us").map_err(decode)?;
        let now = column::<i64>(row, 3, "decided_us").map_err(decode)?;
        // `OUTPUT` of a single MERGE: always this caller's row; checked all the same.
        if column::<i64>(row, 4, "decision_id").map_err(decode)? != id {
            return Err(StoreError::Conflict {
                source: orion_beacon::BackendError::from(sea_orm::DbErr::Custom(format!(
                    "the rate-limit row of {key:?} is another caller's decision"
                ))),
            });
        }
        RateOutcome::decided(key, quota, granted, permits, ahead, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decision_is_one_merge_at_one_clock_reading() {
        assert_eq!(
            take_permit_sql("orionbeacon_rate_limits"),
            "DECLARE @now bigint = DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()); \
             MERGE [orionbeacon_rate_limits] WITH (HOLDLOCK) AS t \
             USING (SELECT @P1 AS limit_key) AS s ON t.limit_key = s.limit_key \
             WHEN MATCHED THEN UPDATE SET \
             t.granted = CASE WHEN t.tat_us <= @now + @P3 THEN 1 ELSE 0 END, \
             t.permits = CASE WHEN t.tat_us <= @now + @P3 THEN t.permits + 1 ELSE t.permits END, \
             t.decided_us = @now, \
             t.decision_id = @P4, \
             t.tat_us = CASE WHEN t.tat_us <= @now + @P3 THEN (CASE WHEN t.tat_us > @now THEN t.tat_us ELSE @now END) + @P2 ELSE t.tat_us END \
             WHEN NOT MATCHED THEN INSERT (limit_key, tat_us, permits, granted, decided_us, decision_id) \
             VALUES (s.limit_key, @now + @P2, 1, 1, @now, @P4) \
             OUTPUT inserted.granted, inserted.permits, inserted.tat_us - inserted.decided_us AS ahead_us, inserted.decided_us, inserted.decision_id;"
        );
    }

    #[test]
    fn the_migration_names_its_table() {
        let sql = rate_limit_migration_sql("api_limits");
        assert!(
            sql.contains("IF OBJECT_ID(N'[api_limits]', N'U') IS NULL"),
            "{sql}"
        );
        assert!(sql.contains("CREATE TABLE [api_limits] ("), "{sql}");
        assert!(sql.contains("CONSTRAINT [PK_api_limits] PRIMARY KEY CLUSTERED (limit_key)"));
        assert!(!sql.contains("[orionbeacon_rate_limits]"), "{sql}");
        assert!(RATE_LIMIT_MIGRATION_SQL.contains(RATE_LIMIT_MIGRATION_NAME));
    }
}
