-- orion-beacon lease table for SQL Server (2016 or later, Azure SQL).
--
-- Version m20261129_000001_create_orionbeacon_leases: the same migration as the SeaORM one in
-- migration/src/m20261129_000001_create_leases.rs, which sea-orm-migration cannot run on SQL
-- Server. It is idempotent: running it again changes nothing. `SqlServerLeaseStore::migrate()`
-- sends exactly this text (the crate includes this file), with the bracket-quoted table name
-- and its key's name changed when the store uses a custom table.
--
-- resource and holder compare byte for byte (BIN2 collation), as on the other backends: the
-- default collations ignore case. Times are datetime2(7) in UTC, written only from the
-- database clock (SYSUTCDATETIME()).
IF OBJECT_ID(N'[orionbeacon_leases]', N'U') IS NULL
CREATE TABLE [orionbeacon_leases] (
    resource nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL,
    holder nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL,
    fencing_token bigint NOT NULL,
    expires_at datetime2(7) NOT NULL,
    acquired_at datetime2(7) NOT NULL,
    renewed_at datetime2(7) NOT NULL,
    CONSTRAINT [PK_orionbeacon_leases] PRIMARY KEY CLUSTERED (resource)
);
-- Down (by hand; nothing runs it for you): DROP TABLE IF EXISTS [orionbeacon_leases];
