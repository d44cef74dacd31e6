-- orion-beacon members' counts for SQL Server (2016 or later, Azure SQL).
--
-- Version m20261205_000001_add_orionbeacon_members_holding: the same migration as the SeaORM one
-- in migration/src/m20261205_000001_add_member_holding.rs. It adds three nullable columns to an
-- existing membership table in place and is idempotent: running it again changes nothing.
-- `SqlServerLeaseStore::migrate_members()` sends exactly this text after the membership table's
-- migration (the crate includes this file), with the bracket-quoted table name changed when the
-- store uses a custom table.
--
-- leases_held is how many of the set's leases the node leads at its heartbeat, set_hash the
-- fingerprint of its list of resources, counted_at the heartbeat that wrote them: they count
-- only while it equals heartbeat_at.
IF COL_LENGTH(N'[orionbeacon_members]', N'leases_held') IS NULL
ALTER TABLE [orionbeacon_members] ADD leases_held bigint NULL, set_hash bigint NULL, counted_at datetime2(7) NULL;
-- Down (by hand; nothing runs it for you):
-- ALTER TABLE [orionbeacon_members] DROP COLUMN leases_held, set_hash, counted_at;
