//! The migrations: the versioned T-SQL of the lease and the membership tables for this store's
//! table names, and `migrate`/`migrate_members`, which send it (a table another process created
//! meanwhile is no error).

use tiberius::error::Error as TdsError;

use super::exec::{code, Want};
use super::member_tsql::{holding_migration_sql, member_migration_sql, rank_migration_sql};
use super::tsql::{migration_sql, payload_migration_sql};
use super::SqlServerLeaseStore;
use orion_beacon::StoreError;

impl SqlServerLeaseStore {
    /// The versioned T-SQL ([`MIGRATION_SQL`](super::MIGRATION_SQL), migration
    /// [`MIGRATION_NAME`](super::MIGRATION_NAME)) for this store's table: what
    /// [`migrate`](Self::migrate) sends, for those who apply schema changes with their own tools.
    pub fn migration_sql(&self) -> String {
        migration_sql(&self.table)
    }

    /// The versioned T-SQL of the membership table
    /// ([`MEMBER_MIGRATION_SQL`](super::MEMBER_MIGRATION_SQL), migration
    /// [`MEMBER_MIGRATION_NAME`](super::MEMBER_MIGRATION_NAME)) for this store's membership
    /// table: what [`migrate_members`](Self::migrate_members) sends.
    pub fn member_migration_sql(&self) -> String {
        member_migration_sql(&self.member_table)
    }

    /// The versioned T-SQL that adds the payload columns to this store's table
    /// ([`PAYLOAD_MIGRATION_SQL`](super::PAYLOAD_MIGRATION_SQL), migration
    /// [`PAYLOAD_MIGRATION_NAME`](super::PAYLOAD_MIGRATION_NAME)): what [`migrate`](Self::migrate)
    /// sends after [`migration_sql`](Self::migration_sql).
    pub fn payload_migration_sql(&self) -> String {
        payload_migration_sql(&self.table)
    }

    /// Creates the lease table if it does not exist (`IF OBJECT_ID(...) IS NULL CREATE TABLE
    /// ...`), then adds the payload columns if they are missing (`IF COL_LENGTH(...) IS NULL
    /// ALTER TABLE ... ADD ...`): idempotent, and safe to run from several processes at once.
    /// An existing table keeps its rows and tokens.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.create(&self.migration_sql())
            .await
            .map_err(|err| self.classify_migration(&self.table, err))?;
        self.create(&self.payload_migration_sql())
            .await
            .map_err(|err| self.classify_migration(&self.table, err))?;
        Ok(())
    }

    /// The versioned T-SQL that adds the members' counts to this store's membership table
    /// ([`HOLDING_MIGRATION_SQL`](super::HOLDING_MIGRATION_SQL), migration
    /// [`HOLDING_MIGRATION_NAME`](super::HOLDING_MIGRATION_NAME)): what
    /// [`migrate_members`](Self::migrate_members) sends after
    /// [`member_migration_sql`](Self::member_migration_sql).
    pub fn holding_migration_sql(&self) -> String {
        holding_migration_sql(&self.member_table)
    }

    /// The versioned T-SQL that adds the candidate rank to this store's membership table
    /// ([`RANK_MIGRATION_SQL`](super::RANK_MIGRATION_SQL), migration
    /// [`RANK_MIGRATION_NAME`](super::RANK_MIGRATION_NAME)): what
    /// [`migrate_members`](Self::migrate_members) sends after
    /// [`holding_migration_sql`](Self::holding_migration_sql).
    pub fn rank_migration_sql(&self) -> String {
        rank_migration_sql(&self.member_table)
    }

    /// Creates the membership table of shard sets if it does not exist, as
    /// [`migrate`](Self::migrate) does the lease table (idempotent, safe to run from several
    /// processes at once), then adds the members' counts and the candidate rank if they are
    /// missing: only needed for [`MembershipStore`](orion_beacon::MembershipStore) (shard sets,
    /// and ranked electors' candidates).
    pub async fn migrate_members(&self) -> Result<(), StoreError> {
        self.create(&self.member_migration_sql())
            .await
            .map_err(|err| self.classify_migration(&self.member_table, err))?;
        self.create(&self.holding_migration_sql())
            .await
            .map_err(|err| self.classify_migration(&self.member_table, err))?;
        self.create(&self.rank_migration_sql())
            .await
            .map_err(|err| self.classify_migration(&self.member_table, err))?;
        Ok(())
    }

    /// Sends an idempotent `IF OBJECT_ID(...) IS NULL CREATE TABLE` (or `IF COL_LENGTH(...)
    /// IS NULL ALTER TABLE`) batch.
    pub(super) async fn create(&self, sql: &str) -> Result<(), TdsError> {
        match self.run(Want::RowsAffected, sql, &[]).await {
            Ok(_) => Ok(()),
            // Another process created it between our check and our CREATE.
            Err(err) if err.code() == Some(code::OBJECT_EXISTS) => Ok(()),
            // Another process added the column between our check and our ALTER.
            Err(err) if err.code() == Some(code::COLUMN_EXISTS) => Ok(()),
            Err(err) => Err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::SEED;
    use crate::{MIGRATION_NAME, MIGRATION_SQL, PAYLOAD_MIGRATION_NAME, PAYLOAD_MIGRATION_SQL};

    #[test]
    fn the_payload_migration_is_the_shipped_file_and_idempotent() {
        let store = SqlServerLeaseStore::new(SEED).unwrap();
        assert_eq!(store.payload_migration_sql(), PAYLOAD_MIGRATION_SQL);
        assert!(PAYLOAD_MIGRATION_SQL.contains(PAYLOAD_MIGRATION_NAME));
        assert!(PAYLOAD_MIGRATION_SQL.contains(
            "IF COL_LENGTH(N'[orionbeacon_leases]', N'payload') IS NULL\n\
             ALTER TABLE [orionbeacon_leases] ADD payload nvarchar(1024) NULL, payload_token bigint NULL;"
        ));
        assert!(!PAYLOAD_MIGRATION_SQL.contains("\nGO"));
        let custom = store
            .with_table("shard_leases")
            .unwrap()
            .payload_migration_sql();
        assert!(custom.contains(
            "IF COL_LENGTH(N'[shard_leases]', N'payload') IS NULL\n\
             ALTER TABLE [shard_leases] ADD payload"
        ));
        assert!(!custom.contains("[orionbeacon_leases]"));
    }

    #[test]
    fn migration_is_the_shipped_file_and_idempotent() {
        let store = SqlServerLeaseStore::new(SEED).unwrap();
        assert_eq!(store.migration_sql(), MIGRATION_SQL);
        assert!(MIGRATION_SQL.contains(MIGRATION_NAME));
        assert!(MIGRATION_SQL
            .contains("IF OBJECT_ID(N'[orionbeacon_leases]', N'U') IS NULL\nCREATE TABLE [orionbeacon_leases] ("));
        for column in [
            "resource nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL",
            "holder nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL",
            "fencing_token bigint NOT NULL",
            "expires_at datetime2(7) NOT NULL",
            "acquired_at datetime2(7) NOT NULL",
            "renewed_at datetime2(7) NOT NULL",
            "CONSTRAINT [PK_orionbeacon_leases] PRIMARY KEY CLUSTERED (resource)",
        ] {
            assert!(MIGRATION_SQL.contains(column), "{column}");
        }
        assert!(
            !MIGRATION_SQL.contains("\nGO"),
            "one batch, no client separators"
        );

        let custom = store.with_table("shard_leases").unwrap().migration_sql();
        assert!(custom.contains(
            "IF OBJECT_ID(N'[shard_leases]', N'U') IS NULL\nCREATE TABLE [shard_leases] ("
        ));
        assert!(custom.contains("CONSTRAINT [PK_shard_leases] PRIMARY KEY CLUSTERED (resource)"));
        assert!(!custom.contains("[orionbeacon_leases]"));
        assert!(!custom.contains("[PK_orionbeacon_leases]"));
    }
}
