-- orion-beacon rate-limit table for SQL Server (2016 or later, Azure SQL).
--
-- Version m20261206_000001_create_orionbeacon_rate_limits: the same migration as the SeaORM one
-- in migration/src/m20261206_000001_create_rate_limits.rs, which sea-orm-migration cannot run on
-- SQL Server. It is idempotent: running it again changes nothing.
-- `SqlServerLeaseStore::migrate_rate_limits()` sends exactly this text (the crate includes this
-- file), with the bracket-quoted table name and its key's name changed when the store uses a
-- custom rate-limit table.
--
-- limit_key compares byte for byte (BIN2 collation), as the lease table's names do. Times are
-- whole microseconds since the Unix epoch (bigint), written only from the database clock
-- (SYSUTCDATETIME()), the same on every backend.
IF OBJECT_ID(N'[orionbeacon_rate_limits]', N'U') IS NULL
CREATE TABLE [orionbeacon_rate_limits] (
    limit_key nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL,
    tat_us bigint NOT NULL,
    permits bigint NOT NULL,
    granted bit NOT NULL,
    decided_us bigint NOT NULL,
    decision_id bigint NOT NULL,
    CONSTRAINT [PK_orionbeacon_rate_limits] PRIMARY KEY CLUSTERED (limit_key)
);
-- Down (by hand; nothing runs it for you): DROP TABLE IF EXISTS [orionbeacon_rate_limits];
