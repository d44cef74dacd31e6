//! SQL Server's membership statements, in T-SQL: the heartbeat, the read and the leave of a
//! shard set's members, and the versioned migration of the membership table.

use orion_beacon_entity::DEFAULT_MEMBER_TABLE;

use super::tsql::{quoted, remaining_ms};

/// The version name of the membership-table migration, the same as the SeaORM migration's
/// (`CreateMemberTable::NAME`).
pub const MEMBER_MIGRATION_NAME: &str = "m20261201_000001_create_orionbeacon_members";

/// The versioned, idempotent T-SQL that creates the default membership table of shard sets (the
/// file `sql/m20261201_000001_create_orionbeacon_members.sqlserver.sql` of this crate, for those
/// who apply it by hand).
/// [`SqlServerLeaseStore::member_migration_sql`](super::SqlServerLeaseStore::member_migration_sql)
/// gives it for the store's own membership table.
pub const MEMBER_MIGRATION_SQL: &str =
    include_str!("../../../sql/m20261201_000001_create_orionbeacon_members.sqlserver.sql");

/// [`MEMBER_MIGRATION_SQL`] for `table`, changed as
/// [`migration_sql`](super::tsql::migration_sql) changes the lease table's.
pub(super) fn member_migration_sql(table: &str) -> String {
    MEMBER_MIGRATION_SQL
        .replace(&quoted(DEFAULT_MEMBER_TABLE), &quoted(table))
        .replace(
            &quoted(&format!("PK_{DEFAULT_MEMBER_TABLE}")),
            &quoted(&format!("PK_{table}")),
        )
}

/// The live members of the shard set `@P1` at `@now`, with their remaining time. `member` is
/// bracket-quoted everywhere (an ISO keyword, `MEMBER OF`).
fn live_members_sql(t: &str) -> String {
    format!(
        "SELECT shard_set, [member], draining, joined_at, heartbeat_at, {remaining} AS remaining_ms \
         FROM {t} WHERE shard_set = @P1 AND expires_at > @now;",
        remaining = remaining_ms("expires_at"),
    )
}

/// A member's heartbeat, then the set's live members: one `MERGE ... WITH (HOLDLOCK)` keyed on
/// `(shard_set, member)` (two first heartbeats of one member cannot both insert), then the read,
/// both at one reading of the database clock (`@now`), so the caller is always among the
/// members read. `joined_at` restarts when the row had lapsed (a member that comes back is a new
/// membership). Parameters: `@P1` the shard set, `@P2` the member, `@P3` whole seconds and `@P4`
/// the remaining milliseconds of the time to live, `@P5` draining (`bit`).
pub(super) fn heartbeat_sql(table: &str) -> String {
    let t = quoted(table);
    let expiry = "DATEADD(MILLISECOND, @P4, DATEADD(SECOND, @P3, @now))";
    format!(
        "DECLARE @now datetime2(7) = SYSUTCDATETIME(); \
         MERGE {t} WITH (HOLDLOCK) AS t \
         USING (SELECT @P1 AS shard_set, @P2 AS [member]) AS s \
         ON t.shard_set = s.shard_set AND t.[member] = s.[member] \
         WHEN MATCHED THEN UPDATE SET \
         t.joined_at = CASE WHEN t.expires_at <= @now THEN @now ELSE t.joined_at END, \
         t.draining = @P5, \
         t.heartbeat_at = @now, \
         t.expires_at = {expiry} \
         WHEN NOT MATCHED THEN INSERT (shard_set, [member], draining, joined_at, heartbeat_at, expires_at) \
         VALUES (s.shard_set, s.[member], @P5, @now, @now, {expiry}); \
         {live}",
        live = live_members_sql(&t),
    )
}

/// The live members of a shard set. Parameter: `@P1` the shard set.
pub(super) fn members_sql(table: &str) -> String {
    format!(
        "DECLARE @now datetime2(7) = SYSUTCDATETIME(); {live}",
        live = live_members_sql(&quoted(table)),
    )
}

/// A member leaves: its live row is deleted, then the set's lapsed rows (members that died
/// without leaving), and one row says how many live rows the first `DELETE` removed (0 or 1).
/// Parameters: `@P1` the shard set, `@P2` the member.
pub(super) fn leave_sql(table: &str) -> String {
    format!(
        "DECLARE @now datetime2(7) = SYSUTCDATETIME(); \
         DECLARE @removed int; \
         DELETE FROM {t} WHERE shard_set = @P1 AND [member] = @P2 AND expires_at > @now; \
         SET @removed = @@ROWCOUNT; \
         DELETE FROM {t} WHERE shard_set = @P1 AND expires_at <= @now; \
         SELECT @removed AS removed;",
        t = quoted(table),
    )
}

/// The membership statements of one table.
#[derive(Debug)]
pub(super) struct MemberStatements {
    pub(super) heartbeat: String,
    pub(super) members: String,
    pub(super) leave: String,
}

impl MemberStatements {
    pub(super) fn new(table: &str) -> Self {
        Self {
            heartbeat: heartbeat_sql(table),
            members: members_sql(table),
            leave: leave_sql(table),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sqlserver::tsql::tests::params;
    use crate::backend::sqlserver::tsql::MIGRATION_SQL;

    #[test]
    fn heartbeat_is_one_merge_keyed_on_set_and_member_then_the_live_members() {
        assert_eq!(
            heartbeat_sql(DEFAULT_MEMBER_TABLE),
            concat!(
                "DECLARE @now datetime2(7) = SYSUTCDATETIME(); ",
                "MERGE [orionbeacon_members] WITH (HOLDLOCK) AS t ",
                "USING (SELECT @P1 AS shard_set, @P2 AS [member]) AS s ",
                "ON t.shard_set = s.shard_set AND t.[member] = s.[member] ",
                "WHEN MATCHED THEN UPDATE SET ",
                "t.joined_at = CASE WHEN t.expires_at <= @now THEN @now ELSE t.joined_at END, ",
                "t.draining = @P5, ",
                "t.heartbeat_at = @now, ",
                "t.expires_at = DATEADD(MILLISECOND, @P4, DATEADD(SECOND, @P3, @now)) ",
                "WHEN NOT MATCHED THEN INSERT (shard_set, [member], draining, joined_at, heartbeat_at, expires_at) ",
                "VALUES (s.shard_set, s.[member], @P5, @now, @now, DATEADD(MILLISECOND, @P4, DATEADD(SECOND, @P3, @now))); ",
                "SELECT shard_set, [member], draining, joined_at, heartbeat_at, ",
                "DATEDIFF_BIG(NANOSECOND, @now, expires_at) / 1000000 AS remaining_ms ",
                "FROM [orionbeacon_members] WHERE shard_set = @P1 AND expires_at > @now;",
            )
        );
        let sql = heartbeat_sql(DEFAULT_MEMBER_TABLE);
        // One MERGE, serializable on the key range; the key is in ON and nothing else is.
        assert_eq!(sql.matches("MERGE ").count(), 1);
        let on = &sql[sql.find(" ON ").unwrap()..sql.find(" WHEN MATCHED").unwrap()];
        assert_eq!(
            on,
            " ON t.shard_set = s.shard_set AND t.[member] = s.[member]"
        );
        // One reading of the database clock for the write and the read.
        assert_eq!(sql.matches("SYSUTCDATETIME()").count(), 1);
        assert!(sql.find("MERGE ").unwrap() < sql.find("SELECT shard_set").unwrap());
    }

    #[test]
    fn members_and_leave_text() {
        assert_eq!(
            members_sql(DEFAULT_MEMBER_TABLE),
            "DECLARE @now datetime2(7) = SYSUTCDATETIME(); \
             SELECT shard_set, [member], draining, joined_at, heartbeat_at, \
             DATEDIFF_BIG(NANOSECOND, @now, expires_at) / 1000000 AS remaining_ms \
             FROM [orionbeacon_members] WHERE shard_set = @P1 AND expires_at > @now;"
        );
        assert_eq!(
            leave_sql(DEFAULT_MEMBER_TABLE),
            "DECLARE @now datetime2(7) = SYSUTCDATETIME(); \
             DECLARE @removed int; \
             DELETE FROM [orionbeacon_members] WHERE shard_set = @P1 AND [member] = @P2 AND expires_at > @now; \
             SET @removed = @@ROWCOUNT; \
             DELETE FROM [orionbeacon_members] WHERE shard_set = @P1 AND expires_at <= @now; \
             SELECT @removed AS removed;"
        );
    }

    #[test]
    fn membership_values_are_parameters_only() {
        let sql = MemberStatements::new(DEFAULT_MEMBER_TABLE);
        for (sql, expected) in [
            (&sql.heartbeat, vec!["@P1", "@P2", "@P3", "@P4", "@P5"]),
            (&sql.members, vec!["@P1"]),
            (&sql.leave, vec!["@P1", "@P2"]),
        ] {
            assert_eq!(params(sql), expected, "{sql}");
            assert!(!sql.contains('\''), "no string literals: {sql}");
            assert!(
                !sql.contains('"'),
                "no quoted identifiers or literals: {sql}"
            );
            assert!(sql.ends_with(';'), "{sql}");
        }
        let custom = MemberStatements::new("shard_members");
        for sql in [&custom.heartbeat, &custom.members, &custom.leave] {
            assert!(sql.contains("[shard_members]"), "{sql}");
            assert!(!sql.contains(DEFAULT_MEMBER_TABLE), "{sql}");
        }
    }

    #[test]
    fn member_migration_is_the_shipped_file() {
        assert!(MEMBER_MIGRATION_SQL.contains(MEMBER_MIGRATION_NAME));
        assert!(MEMBER_MIGRATION_SQL.contains(
            "IF OBJECT_ID(N'[orionbeacon_members]', N'U') IS NULL\nCREATE TABLE [orionbeacon_members] ("
        ));
        for column in [
            "shard_set nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL",
            "[member] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL",
            "draining bit NOT NULL",
            "joined_at datetime2(7) NOT NULL",
            "heartbeat_at datetime2(7) NOT NULL",
            "expires_at datetime2(7) NOT NULL",
            "CONSTRAINT [PK_orionbeacon_members] PRIMARY KEY CLUSTERED (shard_set, [member])",
        ] {
            assert!(MEMBER_MIGRATION_SQL.contains(column), "{column}");
        }
        assert!(!MEMBER_MIGRATION_SQL.contains("\nGO"), "one batch");
        assert_eq!(
            member_migration_sql(DEFAULT_MEMBER_TABLE),
            MEMBER_MIGRATION_SQL
        );
        let custom = member_migration_sql("shard_members");
        assert!(custom.contains(
            "IF OBJECT_ID(N'[shard_members]', N'U') IS NULL\nCREATE TABLE [shard_members] ("
        ));
        assert!(custom
            .contains("CONSTRAINT [PK_shard_members] PRIMARY KEY CLUSTERED (shard_set, [member])"));
        assert!(!custom.contains("[orionbeacon_members]"));
        assert!(!custom.contains("[PK_orionbeacon_members]"));
        // The lease table's migration is untouched by the member table's.
        assert!(!MIGRATION_SQL.contains("orionbeacon_members"));
    }
}
