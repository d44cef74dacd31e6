-- orion-beacon lease payload columns for SQL Server (2016 or later, Azure SQL).
--
-- Version m20261203_000001_add_orionbeacon_leases_payload: the same migration as the SeaORM one
-- in migration/src/m20261203_000001_add_lease_payload.rs. It adds two nullable columns to an
-- existing lease table in place (every row and token stays) and is idempotent: running it again
-- changes nothing. `SqlServerLeaseStore::migrate()` sends exactly this text after the lease
-- table's migration (the crate includes this file), with the bracket-quoted table name changed
-- when the store uses a custom table.
--
-- payload is what a holder writes with its grant or renew (at most 1,024 bytes of UTF-8, so at
-- most 1,024 UTF-16 code units); payload_token is the token of the term that wrote it, and a
-- payload counts only while that equals fencing_token.
IF COL_LENGTH(N'[orionbeacon_leases]', N'payload') IS NULL
ALTER TABLE [orionbeacon_leases] ADD payload nvarchar(1024) NULL, payload_token bigint NULL;
-- Down (by hand; nothing runs it for you):
-- ALTER TABLE [orionbeacon_leases] DROP COLUMN payload, payload_token;
