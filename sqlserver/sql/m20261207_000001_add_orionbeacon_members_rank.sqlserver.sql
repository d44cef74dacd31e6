-- orion-beacon candidate rank for SQL Server (2016 or later, Azure SQL).
--
-- Version m20261207_000001_add_orionbeacon_members_rank: the same migration as the SeaORM one
-- in migration/src/m20261207_000001_add_member_rank.rs. It adds one nullable column to an
-- existing membership table in place and is idempotent: running it again changes nothing.
-- `SqlServerLeaseStore::migrate_members()` sends exactly this text after the members' counts
-- migration (the crate includes this file), with the bracket-quoted table name changed when the
-- store uses a custom table.
--
-- candidate_rank is the rank a ranked election's candidate heartbeats with
-- (`ElectorBuilder::rank`); shard-set members leave it NULL. Only ranked electors need it:
-- without it their candidacy is refused, while shard sets go on as before.
IF COL_LENGTH(N'[orionbeacon_members]', N'candidate_rank') IS NULL
ALTER TABLE [orionbeacon_members] ADD candidate_rank bigint NULL;
-- Down (by hand; nothing runs it for you):
-- ALTER TABLE [orionbeacon_members] DROP COLUMN candidate_rank;
