-- orion-beacon membership table of shard sets for SQL Server (2016 or later, Azure SQL).
--
-- Version m20261201_000001_create_orionbeacon_members: the same migration as the SeaORM one in
-- migration/src/m20261201_000001_create_members.rs, which sea-orm-migration cannot run on SQL
-- Server. It is idempotent: running it again changes nothing. `SqlServerLeaseStore::migrate_members()`
-- sends exactly this text (the crate includes this file), with the bracket-quoted table name
-- and its key's name changed when the store uses a custom membership table.
--
-- shard_set and member compare byte for byte (BIN2 collation), as in the lease table and on the
-- other backends. Times are datetime2(7) in UTC, written only from the database clock
-- (SYSUTCDATETIME()). `member` is bracket-quoted: it is an ISO keyword (MEMBER OF).
IF OBJECT_ID(N'[orionbeacon_members]', N'U') IS NULL
CREATE TABLE [orionbeacon_members] (
    shard_set nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL,
    [member] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL,
    draining bit NOT NULL,
    joined_at datetime2(7) NOT NULL,
    heartbeat_at datetime2(7) NOT NULL,
    expires_at datetime2(7) NOT NULL,
    CONSTRAINT [PK_orionbeacon_members] PRIMARY KEY CLUSTERED (shard_set, [member])
);
-- Down (by hand; nothing runs it for you): DROP TABLE IF EXISTS [orionbeacon_members];
